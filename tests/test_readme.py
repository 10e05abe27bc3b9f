"""Every code block of README.md runs as written, in order (issue 34): the ```python blocks in one
namespace, the ```bash blocks in a shell, all in one working directory beside a ``../shared``
that holds the shared data sets, as a reader with a checkout would run them.

Two marks, an HTML comment on the line above a block, say where a block runs instead:
``<!-- no-run: REASON -->`` (GPU, several GPUs, a cluster: hardware CI lacks) — the block is
compiled and every name it uses must be defined by itself or the blocks before it;
``<!-- ci: FILE -->`` (set-up commands that cannot run inside the test suite) — FILE, a step of
CI, runs them: ``.ci/run`` as ``step NAME COMMAND`` lines, ``scripts/pip_only_check.sh`` by
extracting the block under its mark. A block that reads ``../shared/data`` skips when the data
are missing, and fails under CI=true."""
from __future__ import annotations

import ast
import builtins
import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import REPO, SHARED_DATA, shared_data

README = REPO / "README.md"
MAX_LINES = 200
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
MARK = re.compile(r"<!--\s*(no-run|ci):\s*(.*?)\s*-->[ \t]*\n\Z")
SHARED = re.compile(r"\.\./shared/data/([\w.-]+)")
CI_FILES = (".ci/run", "scripts/pip_only_check.sh")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of the README: where it starts, its language, code and mark."""
    line: int
    lang: str
    code: str
    mark: str | None = None
    reason: str = ""

    @property
    def id(self):
        """A test id: the block's first line and language."""
        return f"L{self.line}-{self.lang}" + (f"-{self.mark}" if self.mark else "")


def readme_blocks(text):
    """The fenced blocks of ``text``, in order, with the mark on the line above each."""
    out = []
    for m in FENCE.finditer(text):
        mark = MARK.search(text[:m.start()])
        out.append(Block(line=text.count("\n", 0, m.start()) + 1, lang=m.group(1).strip(),
                         code=m.group(2), mark=mark and mark.group(1),
                         reason=mark.group(2) if mark else ""))
    return out


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
PYTHON = [b for b in BLOCKS if b.lang == "python"]


def _free_names(code):
    """Names ``code`` reads that it neither assigns, imports nor takes from builtins."""
    bound, loaded = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return {n for n in loaded - bound if not hasattr(builtins, n)}


def _needs_shared_data(block):
    """Skip (fail under CI=true) when a data set the block reads is missing."""
    for rel in sorted(set(SHARED.findall(block.code))):
        shared_data(rel)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """The reader's session: a working directory with ``../shared`` beside it, one namespace,
    the blocks run so far."""
    root = tmp_path_factory.mktemp("readme")
    work = root / "clmf"
    work.mkdir()
    if SHARED_DATA.parent.exists():
        (root / "shared").symlink_to(SHARED_DATA.parent, target_is_directory=True)
    yield {"cwd": work, "ns": {"__name__": "__readme__"}, "done": {}}


def _run_python(block, session):
    """Execute a python block in the session's namespace and directory."""
    _needs_shared_data(block)
    old = os.getcwd()
    os.chdir(session["cwd"])
    try:
        exec(compile(block.code, f"README.md:{block.line}", "exec"), session["ns"])
    finally:
        os.chdir(old)


def _run_shell(block, session):
    """Run a bash block with the installed ``clmf`` command on PATH; fail on any error."""
    _needs_shared_data(block)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=session["cwd"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (f"README.md:{block.line} exited {r.returncode}\n"
                               f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")


def _run_once(block, session):
    """Run a runnable block once; later blocks see whether it passed, skipped or failed."""
    state = session["done"].get(block.line)
    if state == "skipped":
        pytest.skip(f"README.md:{block.line}, run before this block, was skipped")
    if state == "failed":
        pytest.fail(f"README.md:{block.line}, run before this block, failed")
    if state == "ok":
        return
    session["done"][block.line] = "failed"
    try:
        (_run_python if block.lang == "python" else _run_shell)(block, session)
    except pytest.skip.Exception:
        session["done"][block.line] = "skipped"
        raise
    session["done"][block.line] = "ok"


def _run_upto(block, session):
    """Run every runnable block before ``block`` (so that one block can be selected alone)."""
    for b in BLOCKS:
        if b.line >= block.line:
            break
        if b.mark is None:
            _run_once(b, session)


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}; details go to docs/)"


def test_blocks_are_python_or_bash_and_marks_are_sparing():
    assert PYTHON, "README.md has no ```python block"
    for b in BLOCKS:
        assert b.lang in ("python", "bash"), \
            f"README.md:{b.line}: a ```{b.lang} block (only python and bash blocks, which run)"
        if b.mark == "no-run":
            assert b.lang == "python" and re.search(r"\bGPUs?\b|\bcluster\b", b.reason), \
                f"README.md:{b.line}: no-run is for GPU, multi-GPU and cluster blocks only"
        if b.mark == "ci":
            assert b.lang == "bash" and b.reason in CI_FILES, \
                f"README.md:{b.line}: a ci mark names one of {CI_FILES}"
    assert sum(b.mark == "no-run" for b in BLOCKS) <= len(BLOCKS) // 3, "no-run used too often"


def test_first_python_block_needs_no_data_set():
    # the pip-only CI step (scripts/pip_only_check.sh) runs it on a machine without ../shared
    assert PYTHON[0].mark is None and not SHARED.search(PYTHON[0].code)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mark == "ci"], ids=lambda b: b.id)
def test_ci_runs_marked_block(block):
    script = (REPO / block.reason).read_text(encoding="utf-8")
    if block.reason == ".ci/run":
        steps = {m.group(1).strip() for m in re.finditer(r"^step \S+ (.+)$", script, re.M)}
        for line in block.code.splitlines():
            cmd = line.split("#", 1)[0].strip()
            if cmd:
                assert cmd in steps, f"README.md:{block.line}: `{cmd}` is no step of .ci/run"
    else:       # the script extracts the block under its own mark and runs it
        assert f"<!-- ci: {block.reason} -->" in script and "README.md" in script


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mark != "ci"], ids=lambda b: b.id)
def test_block_runs(block, session):
    _run_upto(block, session)
    if block.mark == "no-run":
        compile(block.code, f"README.md:{block.line}", "exec")
        undefined = _free_names(block.code) - set(session["ns"])
        assert not undefined, (f"README.md:{block.line} uses {sorted(undefined)}, which neither "
                               "it nor the blocks before it define")
        return
    _run_once(block, session)
