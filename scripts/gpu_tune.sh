# Sourced by the one-off H100 tuning commands (scripts/gpu_x1_session38d.sh, 39a, 39b): the
# shared starts and `tune LIMIT F MODE-ARGS... -- STARTS...`, one bounded `clmf tune` of the
# Netflix shape at f = F (sampled, --max-wall 45) into $OUT/$TUNE_DB, stopped with SIGABRT
# (Python's fault handler prints where it was) when it sits past LIMIT seconds.
F="batch+vec4:solver=fusedcg,fused_dims=1"
MMA="batch+vec4+mma:tx=4,ks=2,solver=cg,precision=tf32"
GEMM="batch+vec4+gemm:bx=64,nnz_batch=8,solver=cg"
export PYTHONFAULTHANDLER=1
T0=$SECONDS
tune() {  # tune LIMIT F MODE-ARGS... -- STARTS...
    local limit=$1 f=$2; shift 2
    local args=() starts=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
    shift
    for s in "$@"; do starts+=(--start "$s"); done
    timeout -s ABRT "$limit" python3 -m clmf -v tune --preset netflix --factors "$f" --device gpu \
        --budget 10 --max-wall 45 --sample auto "${args[@]}" "${starts[@]}" \
        --db "$OUT/$TUNE_DB" --no-progress 2>&1 | grep -v "CompilerWarning\|lambda: self" \
        | tail -30
    echo "tune f=$f ${args[*]}: exit ${PIPESTATUS[0]} at $((SECONDS - T0)) s"
}
