"""benchmarks/ncu_replay.py (Nsight Compute for the OpenCL kernels) on a CPU device: a capture
holds everything a replay needs — the kernel launched again with the captured buffers and
scalars (rebuilt from the captured program binary) writes the captured results bit for bit —
and the PTX's environment registers (NVIDIA's global offsets) read as 0 in the replayed PTX. The
replay itself (CUDA) runs on the GPU machine only."""
import json

import numpy as np
import pytest
from conftest import DEVICES, repo_script


def test_patched_ptx_reads_no_environment_registers():
    """Every %envregN read becomes 0; the rest of the PTX is kept."""
    mod = repo_script("benchmarks/ncu_replay.py")
    ptx = b"mov.b32 \t%r65, %envreg0;\n\tmov.b32 %r17, %envreg3;\n\tadd.s32 %r66, %r65, %r64;"
    out = mod.patched_ptx(ptx)
    assert b"envreg" not in out and out.count(b", 0;") == 2 and b"%r64" in out


@pytest.mark.skipif(not DEVICES, reason="no OpenCL device")
@pytest.mark.parametrize("cell,kernel", [
    ("implicit:8:batch+vec4:solver=fusedcg,fused_dims=1,solve_wg=8,nnz_batch=4", "s3_fcg"),
    ("explicit:6:batch+vec4+syrk:bx=4,ks=2,nnz_batch=5,solver=cg", "s1_hermitian")])
def test_capture_holds_a_whole_launch(tmp_path, cell, kernel):
    """Each side's capture, launched again from its files alone, writes its captured results."""
    import pyopencl as cl

    from clmf.engine.device import select_devices
    mod = repo_script("benchmarks/ncu_replay.py")
    mod.main(["capture", "--device", "cpu", "--data", "movielens-100k", "--scale", "0.3",
              "--cells", cell, "--kernels", kernel, "--out", str(tmp_path)])
    mode, f = cell.split(":")[:2]
    for side in ("users", "items"):
        d = tmp_path / f"{mode}{f}-{kernel}-{side}"
        meta = json.loads((d / "launch.json").read_text())
        assert meta["kernel"] == kernel and meta["side"] == side and meta["cl_seconds"] > 0
        written = [i for i, a in enumerate(meta["args"]) if a.get("written")]
        assert written                                   # the solutions (or hermitians)
        dev = select_devices("cpu")[0]
        ctx = cl.Context([dev])
        q = cl.CommandQueue(ctx)
        prg = cl.Program(ctx, [dev], [(d / "kernel.ptx").read_bytes()]).build()
        k = getattr(prg, kernel)
        args, bufs = [], {}
        for i, a in enumerate(meta["args"]):
            if a["kind"] == "buffer":
                h = np.load(d / f"arg{i}_pre.npy")
                bufs[i] = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                                    hostbuf=h)
                args.append(bufs[i])
            else:
                args.append(np.array(a["value"], dtype=np.dtype(a["dtype"])))
        k(q, tuple(meta["gsize"]), tuple(meta["lsize"]), *args).wait()
        for i in written:
            got = np.empty(meta["args"][i]["bytes"], np.uint8)
            cl.enqueue_copy(q, got, bufs[i])
            np.testing.assert_array_equal(got, np.load(d / f"arg{i}_post.npy"))


def test_summary_of_a_raw_report():
    """``summary``'s text from Nsight's raw CSV (a header row, a units row, one row a kernel):
    the key counters, the SMs' active share of the elapsed cycles, the largest stalls first."""
    mod = repo_script("benchmarks/ncu_replay.py")
    head = ["Kernel Name", "gpu__time_duration.sum", "sm__cycles_active.avg",
            "sm__cycles_elapsed.avg", "smsp__pcsamp_warps_issue_stalled_wait",
            "smsp__pcsamp_warps_issue_stalled_long_scoreboard",
            "smsp__pcsamp_warps_issue_stalled_misc"]
    units = ["", "ms", "cycle", "cycle", "", "", ""]
    row = ["s3_fcg", "26.28", "22,289,261.86", "42,175,284", "16463", "45,465", "0"]
    text = "\n".join(mod.summarize("\n".join(",".join(f'"{x}"' for x in r)
                                             for r in (head, units, row))))
    assert "== s3_fcg" in text and "gpu__time_duration.sum = 26.28 ms" in text
    assert "SMs active 52.8% of the elapsed cycles" in text
    assert text.index("long_scoreboard = 45465") < text.index("wait = 16463")
    assert "stalled_misc" not in text                                  # zero: left out
