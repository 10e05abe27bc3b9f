"""Reliability cases of issue 33: no code from a cache file, no crash on Ctrl-C, no hang or
followed link on a special file in the cache directory, no special file replaced by a save, no
raw MemoryError from a fold-in's id. Each case failed before the fix it guards."""
from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DEVICES, SHARED_DATA, random_ratings

import clmf
from clmf import cache
from clmf.tuning import fallback, index

HERE = os.path.dirname(os.path.abspath(__file__))


def _child_env(cache_dir):
    """This process's environment with clmf's cache directory at ``cache_dir``."""
    return dict(os.environ, CLMF_CACHE_DIR=str(cache_dir))


# ----- the template cache runs no code ----------------------------------------------------------
class _Plant:
    """Unpickled, creates the directory ``path`` (a harmless stand-in for os.system)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _jinja_cache_files(directory):
    """The files Jinja's FileSystemBytecodeCache in ``directory`` would read for clmf's
    templates (their names as that cache derives them)."""
    import jinja2
    env = jinja2.Environment(loader=jinja2.PackageLoader("clmf.cl_kernels", "."))
    bcc = jinja2.FileSystemBytecodeCache(str(directory))
    out = []
    for name in env.loader.list_templates():
        if name.endswith(".j2"):
            filename = env.loader.get_source(env, name)[1]
            out.append(directory / (bcc.pattern % bcc.get_cache_key(name, filename)))
    return out


@pytest.mark.parametrize("payload", ["pickle", "truncated"])
def test_template_cache_files_are_never_loaded(tmp_path, payload):
    """A pickle planted where Jinja's bytecode cache lived ($CLMF_CACHE_DIR/jinja) is not run,
    and a truncated one does not fail rendering (before: the pickle ran, the truncated file
    raised in every fit)."""
    import jinja2.bccache
    marker = tmp_path / "pwned"
    d = tmp_path / "cache" / "jinja"
    d.mkdir(parents=True)
    body = (jinja2.bccache.bc_magic + pickle.dumps(_Plant(str(marker))) if payload == "pickle"
            else jinja2.bccache.bc_magic + b"\x80")
    files = _jinja_cache_files(d)
    assert len(files) > 5
    for f in files:
        f.write_bytes(body)
    code = ("from clmf.engine import kernels as K\nfrom clmf.engine.config import KernelConfig\n"
            "for c in ('batch', 'batch+reg+local+vec4:tx=16,ty=2,solve_wg=1', "
            "'batch+gemm:tx=10,ty=10,solver=cg'):\n"
            "    assert '__kernel' in K.render_als(KernelConfig.parse(c), 16)\n"
            "K.render_metrics(16)\nprint('rendered')\n")
    res = subprocess.run([sys.executable, "-c", code], env=_child_env(tmp_path / "cache"),
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0 and "rendered" in res.stdout, res.stderr[-2000:]
    assert not marker.exists(), "a pickle in the cache directory was executed"
    assert all(f.read_bytes() == body for f in files)        # nor rewritten


# ----- the cache module's reads and writes ------------------------------------------------------
def _fifo(path):
    os.mkfifo(path)
    return path


def _unblock(paths):
    """Open each FIFO for writing and close it: a reader blocked in open() sees end of file."""
    for p in paths:
        try:
            fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass


def _within(fn, seconds=20, fifos=()):
    """``fn()``'s result, failing the test when it takes longer than ``seconds`` (a reader
    hung on one of ``fifos`` is then released, so that the thread ends)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        _unblock(fifos)
        t.join(5)
        pytest.fail(f"hung for more than {seconds} s on a special file in the cache")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_cache_reads_refuse_special_files(tmp_path):
    """A FIFO, a symlink (even to a good file), a device, a directory and an oversized file are
    refused with a CacheWarning; a regular file is read."""
    good = tmp_path / "good.json"
    good.write_text('{"a": 1}')
    fifo = _fifo(tmp_path / "fifo.json")
    link = tmp_path / "link.json"
    link.symlink_to(good)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    (tmp_path / "dir.json").mkdir()
    assert cache.read_json(good) == {"a": 1}
    assert cache.read_json(tmp_path / "missing.json") is None
    for p in (fifo, link, zero, tmp_path / "dir.json", "/dev/null"):
        with pytest.warns(cache.CacheWarning, match="refused"):
            assert _within(lambda p=p: cache.read_json(p), fifos=[fifo]) is None
    with pytest.warns(cache.CacheWarning, match="larger than 4 bytes"):
        assert cache.read_bytes(good, limit=4) is None
    fifos = [_fifo(tmp_path / "fifo2"), _fifo(tmp_path / "fifo3")]
    with pytest.warns(cache.CacheWarning):
        assert _within(lambda: cache.open_lines(fifos[0]), fifos=fifos) is None
        assert _within(lambda: cache.open_append(fifos[1]), fifos=fifos) is None
        fh = cache.open_append(tmp_path / "link2.json")                       # a new file
        assert fh is not None
        fh.close()
    (tmp_path / "link3.json").symlink_to(tmp_path / "link2.json")
    with pytest.warns(cache.CacheWarning, match="symbolic link"):
        assert cache.open_append(tmp_path / "link3.json") is None
    with warnings.catch_warnings(record=True) as seen:          # warned once per file
        warnings.simplefilter("always")
        assert cache.read_json(link) is None
    assert not seen


def test_cache_writes_follow_no_link_and_leave_no_temp(tmp_path):
    """write_atomic never writes through a symlink or over a FIFO, and leaves no temp file."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    d = tmp_path / "c"
    d.mkdir()
    (d / "link.json").symlink_to(victim)
    _fifo(d / "fifo.json")
    with pytest.warns(cache.CacheWarning):
        assert not cache.write_atomic(d / "link.json", "x")
        assert not cache.write_atomic(d / "fifo.json", "x")
        assert not cache.open_append(d / "link.json")
    assert victim.read_text() == "precious"
    assert stat.S_ISFIFO(os.lstat(d / "fifo.json").st_mode)
    assert cache.write_atomic(d / "new.json", '{"b": 2}')
    assert cache.read_json(d / "new.json") == {"b": 2}
    assert sorted(p.name for p in d.iterdir()) == ["fifo.json", "link.json", "new.json"]
    # an unwritable cache (here: the directory is a file) is skipped, not raised
    assert not cache.write_atomic(victim / "x.json", "{}")


# ----- the tuning index -------------------------------------------------------------------------
@pytest.fixture
def db(tmp_path, monkeypatch):
    """A small tuning database of two records the index keeps ("topk"), clmf's cache under
    tmp_path."""
    from clmf.tuning.schema import SCHEMA_VERSION
    monkeypatch.setenv("CLMF_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "db.jsonl"
    recs = [{"schema_version": SCHEMA_VERSION, "kind": "topk", "side": s}
            for s in ("users", "items")]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _index_paths(db):
    return index._paths(db, index._stamp(db))[:2]


def test_index_fifo_does_not_hang(db):
    """A FIFO at the index path (before: the lookup hung forever) is refused and bypassed."""
    b_idx, m_idx = _index_paths(db)
    b_idx.parent.mkdir(parents=True)
    _fifo(b_idx)
    with pytest.warns(cache.CacheWarning, match="named pipe"):
        recs = _within(lambda: index.best_records(db), fifos=[b_idx])
    assert [r["side"] for r in recs] == ["users", "items"]
    assert stat.S_ISFIFO(os.lstat(b_idx).st_mode)         # left as it was, not written


def test_index_symlink_is_not_followed(db, tmp_path):
    """An index path that links to a forged index is refused (before: its records were
    taken), and a symlink planted at the old predictable temp name is not written through."""
    b_idx, m_idx = _index_paths(db)
    b_idx.parent.mkdir(parents=True)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({"path": str(db.resolve()), "stamp": list(index._stamp(db)),
                                  "records": [{"kind": "best", "side": "forged"}]}))
    b_idx.symlink_to(forged)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for p in (b_idx, m_idx):
        p.with_suffix(f".{os.getpid()}.tmp").symlink_to(victim)
    with pytest.warns(cache.CacheWarning, match="symbolic link"):
        recs = index.best_records(db)
    assert [r["side"] for r in recs] == ["users", "items"]
    assert victim.read_text() == "precious"
    assert os.path.islink(b_idx)


def test_index_link_to_dev_zero_is_refused(db, tmp_path):
    """An index linked to /dev/zero (before: memory grew without bound) is refused; run in a
    child whose address space is capped, so that the old behaviour fails fast."""
    b_idx, _ = _index_paths(db)
    b_idx.parent.mkdir(parents=True)
    b_idx.symlink_to("/dev/zero")
    code = ("import resource, sys, warnings\n"
            "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "from clmf.tuning import index\n"
            "warnings.simplefilter('error')\n"
            "try:\n    index.best_records(sys.argv[1])\n"
            "except Warning as w:\n    print('refused:', w)\n")
    res = subprocess.run([sys.executable, "-c", code, str(db)], env=_child_env(tmp_path / "cache"),
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and "refused:" in res.stdout and "symbolic link" in res.stdout, \
        res.stdout + res.stderr[-2000:]


# ----- the probe verdicts and the tune journal --------------------------------------------------
def test_probe_cache_and_tune_journal_honour_clmf_cache_dir(tmp_path, monkeypatch):
    """Both live in $CLMF_CACHE_DIR like the tuning index (before: the user's cache dir)."""
    from clmf.autotune import strategies
    monkeypatch.setenv("CLMF_CACHE_DIR", str(tmp_path))
    assert fallback.probe_cache_path() == tmp_path / "config-probes.json"
    assert strategies.default_state_dir() == tmp_path / "tune-state"


def test_probe_cache_refuses_special_files(tmp_path):
    """A FIFO at config-probes.json (before: the fit hung) reads as empty and is not replaced;
    a symlink there is neither read nor written through."""
    fifo = _fifo(tmp_path / "config-probes.json")
    with pytest.warns(cache.CacheWarning):
        assert _within(lambda: fallback._read_cache(fifo), fifos=[fifo]) == {}
        _within(lambda: fallback._write_cache(fifo, "k", {"ok": True}), fifos=[fifo])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"k": {"ok": False, "reason": "forged"}}))
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    with pytest.warns(cache.CacheWarning, match="symbolic link"):
        assert fallback._read_cache(link) == {}
        fallback._write_cache(link, "k2", {"ok": True})
    assert json.loads(victim.read_text()) == {"k": {"ok": False, "reason": "forged"}}
    fallback._write_cache(tmp_path / "p.json", "k", {"ok": True})
    assert fallback._read_cache(tmp_path / "p.json") == {"k": {"ok": True}}


def test_tune_journal_refuses_special_files(tmp_path):
    """A FIFO as the journal (before: a resumed run hung reading it) reads as empty; a symlink
    is neither read nor appended through."""
    from clmf.autotune import incumbent, journal, strategies
    fifo = _fifo(tmp_path / "run.jsonl")
    with pytest.warns(cache.CacheWarning):
        assert _within(lambda: journal.read(fifo, dict), fifos=[fifo]) == (None, {}, [])

        class _S:
            journal = fifo
        assert _within(lambda: incumbent._replayed(_S, {}), fifos=[fifo]) is None
        _within(lambda: strategies.Session._jwrite(_S, {"event": "x"}), fifos=[fifo])
    victim = tmp_path / "victim"
    victim.write_text('{"event": "header", "forged": true}\n')

    class _L:
        journal = tmp_path / "link.jsonl"
    _L.journal.symlink_to(victim)
    with pytest.warns(cache.CacheWarning, match="symbolic link"):
        assert journal.read(_L.journal, dict)[0] is None
        strategies.Session._jwrite(_L, {"event": "start"})
    assert victim.read_text() == '{"event": "header", "forged": true}\n'

    class _R:
        journal = tmp_path / "sub" / "ok.jsonl"
    strategies.Session._jwrite(_R, {"event": "header", "n": 1})
    assert journal.read(_R.journal, dict)[0] == {"event": "header", "n": 1}


# ----- save and fold-in -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_model():
    """A small fitted model (first device)."""
    if not DEVICES:
        pytest.skip("no OpenCL device")
    R = random_ratings(40, 30, 0.3, seed=1)
    return clmf.ALS(factors=4, iterations=2, device=DEVICES[0], random_state=0).fit(
        R, show_progress=False), R


def test_save_refuses_special_files(small_model, tmp_path):
    """Saving to a FIFO or a device node (before: swapped for a regular file) or a directory
    raises a clear OSError and leaves it as it was; a regular file is still replaced."""
    m, _ = small_model
    fifo = _fifo(tmp_path / "pipe.npz")
    with pytest.raises(FileExistsError, match="named pipe"):
        m.save(fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "dir.npz").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        m.save(tmp_path / "dir.npz")
    try:
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        pass                                    # not root: no device node to try
    else:
        with pytest.raises(FileExistsError, match="character device"):
            m.save(tmp_path / "null")
        assert stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []
    (tmp_path / "m.npz").write_bytes(b"old")
    m.save(tmp_path / "m.npz")
    assert np.array_equal(clmf.load(tmp_path / "m.npz").user_factors_, m.user_factors_)


@pytest.mark.parametrize("uid", [2 ** 40, 2 ** 31, 10 ** 8])
def test_partial_fit_refuses_huge_ids(small_model, uid):
    """An id that would grow the model to far more users than ratings is refused as fit
    refuses it, naming the id (before: a raw MemoryError for 16 TiB); the model is unchanged."""
    m, R = small_model
    row = sp.csr_matrix(([4.0, 2.0], ([0, 0], [3, 7])), shape=(1, R.shape[1]))
    X = m.user_factors_
    with pytest.raises(ValueError, match=f"user {uid} folded in.*largest user index is {uid}"):
        m.partial_fit_users([uid], row)
    assert m.user_factors_ is X and X.shape[0] == R.shape[0]


def test_partial_fit_still_grows_by_next_ids(small_model):
    """The refusal leaves ordinary growth alone (the next free indices)."""
    m, R = small_model
    m2 = clmf.ALS(factors=4, iterations=2, device=DEVICES[0], random_state=0).fit(
        R, show_progress=False)
    row = sp.csr_matrix(([4.0, 2.0], ([0, 1], [3, 7])), shape=(2, R.shape[1]))
    m2.partial_fit_users([R.shape[0], R.shape[0] + 1], row)
    assert m2.user_factors_.shape[0] == R.shape[0] + 2 and m is not m2


# ----- Ctrl-C at random points ------------------------------------------------------------------
def _spec(d):
    """The clmf device spec ("P:D") of a pyopencl device, for a child process."""
    import pyopencl as cl
    plats = cl.get_platforms()
    p = next(i for i, pl in enumerate(plats) if pl.int_ptr == d.platform.int_ptr)
    k = next(i for i, dv in enumerate(plats[p].get_devices()) if dv.int_ptr == d.int_ptr)
    return f"{p}:{k}"


def _interrupts(cl_device, tmp_path, rounds, data="synthetic"):
    """Run tests/interrupt_check.py for fit, save and recommend: exit 0 (not a crash), every
    kind interrupted, nothing left beside the saved model."""
    res = subprocess.run([sys.executable, os.path.join(HERE, "interrupt_check.py"),
                          _spec(cl_device), "fit,save,recommend", str(rounds), "7", data],
                         env=_child_env(tmp_path / "cache"), capture_output=True, text=True,
                         timeout=3000)
    assert res.returncode == 0, (f"exit status {res.returncode} (-11/139: a segfault)\n"
                                 + res.stdout[-2000:] + res.stderr[-3000:])
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert [r["kind"] for r in rows] == ["fit", "save", "recommend"], res.stdout
    for r in rows:
        assert r["interrupted"] >= rounds // 2, r
        assert r["left_behind"] == ["model.npz"], r
    return rows


def test_ctrl_c_fit_save_recommend(cl_device, tmp_path):
    """20 interrupts of each of a fit, a save and a recommend at random points (before: a
    segfault within them on PoCL, in most runs on Intel): no crash, the model intact. About 8 s
    a device: a child process (a crash must not kill pytest) that fits once and times each
    operation first."""
    _interrupts(cl_device, tmp_path, 20)


@pytest.mark.slow
def test_ctrl_c_200_times(cl_device, tmp_path):
    """The issue's 200 interrupts in a row per device, on ML-100K when it is available."""
    data = SHARED_DATA / "ml-100k" / "u.data"
    rows = _interrupts(cl_device, tmp_path, 200, str(data) if data.exists() else "synthetic")
    warnings.warn(f"interrupts on {_spec(cl_device)}: {rows}", stacklevel=1)
