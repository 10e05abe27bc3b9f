"""clmf.parallel.shared_blocks: the same-host transport of the Dask fit's blocks, apart from
Dask (segments made, mapped by handle, reused, released; probes that fail; a full /dev/shm)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from clmf.parallel import dask_board as BD
from clmf.parallel import dask_tasks as T
from clmf.parallel import shared_blocks as shm

pytestmark = pytest.mark.skipif(not os.path.isdir(shm.SHM_DIR), reason="no /dev/shm")


def _names(prefix):
    return sorted(n for n in os.listdir(shm.SHM_DIR) if n.startswith(prefix))


def test_a_block_round_trips_through_its_handle_and_is_unlinked_on_close():
    seg = shm.Segments("clmf-test-rt")
    arr, block = seg.array("solve-users", (5, 3), np.float16)
    arr[:] = np.arange(15, dtype=np.float16).reshape(5, 3)
    att = shm.Attached()
    got = shm.resolve((2, [block]), att)
    np.testing.assert_array_equal(got[1][0], arr)
    assert got[0] == 2 and got[1][0].dtype == np.float16
    # reused while large enough: same segment, a new view
    arr2, block2 = seg.array("solve-users", (4, 3), np.float16)
    assert block2.name == block.name
    assert len(_names("clmf-test-rt")) == 1
    del got, arr, arr2
    att.close()
    seg.close()
    assert _names("clmf-test-rt") == []


def test_row_handles_of_the_partials_address_their_rows():
    seg = shm.Segments("clmf-test-rows")
    try:
        A, out = seg.array("partials-A", (6, 2, 2), np.float32)
        A[:] = np.arange(24, dtype=np.float32).reshape(6, 2, 2)
        sub = T._rows_of(out, A, 2, 5)
        att = shm.Attached()
        np.testing.assert_array_equal(att.array(sub), A[2:5])
        att.close()
        # without shared memory the rows themselves travel, as a copy
        plain = np.arange(8, dtype=np.float32).reshape(4, 2)
        cp = T._rows_of(plain, plain, 1, 3)
        assert not np.shares_memory(cp, plain) and np.array_equal(cp, plain[1:3])
    finally:
        seg.close()


def test_probes_agree_only_when_every_segment_maps_with_its_token():
    a, b = shm.Segments("clmf-test-pa"), shm.Segments("clmf-test-pb")
    try:
        pa, pb = shm.probe_create(a), shm.probe_create(b)
        att = shm.Attached()
        assert shm.probe_check(att, [pa, pb])
        assert not shm.probe_check(att, [pa, None])              # a worker without it
        assert not shm.probe_check(att, [(pa[0], b"x" * 16)])    # another host's same name
        gone = shm.SharedBlock("clmf-test-no-such-segment", 0, (16,), "|u1")
        assert not shm.probe_check(att, [(gone, pa[1])])
        att.close()
    finally:
        a.close()
        b.close()


def test_the_switch_and_a_full_tmpfs_fall_back_to_the_comms(monkeypatch):
    monkeypatch.setenv(shm.ENV, "0")
    assert not shm.enabled() and shm.probe_create(shm.Segments("clmf-test-off")) is None
    monkeypatch.delenv(shm.ENV)
    monkeypatch.setattr(shm, "_free_bytes", lambda: 1000)       # room for less than twice
    seg = shm.Segments("clmf-test-full")
    assert seg.array("solve-items", (100, 4), np.float32) is None
    st = {"shm": True, "segments": seg}
    arr, out = T._out_buffer(st, "solve-items", (100, 4), np.float32)
    assert out is arr and arr.shape == (100, 4)                 # the array itself travels
    assert _names("clmf-test-full") == []


def test_a_release_unlinks_what_a_lost_worker_left():
    lost = shm.Segments("clmf-testfit0000-1")          # a dead worker's, never closed
    lost.array("solve-users", (3, 4), np.float32)
    other = shm.Segments("clmf-testfit00001-0")        # another fit's: kept
    other.array("solve-users", (3, 4), np.float32)
    try:
        assert shm.unlink_fit("clmf-testfit0000") == 1
        assert _names("clmf-testfit0000-") == [] and len(_names("clmf-testfit00001-")) == 1
    finally:
        lost.owned.clear()                             # its name is gone already
        other.close()


# ----- the boards of the workers' own loop ---------------------------------------------------
def _boards(prefix, bounds, ldf=3, abort=None):
    """Two workers' boards of one fit in this process: ``(segments, attached, boards)``."""
    segs = [shm.Segments(f"{prefix}-{d}") for d in range(2)]
    handles = [BD.board_create(segs[d], bounds, d, ldf, np.float32) for d in range(2)]
    atts = [shm.Attached() for _ in range(2)]
    boards = [BD.Board(atts[d], d, handles, bounds, abort=abort) for d in range(2)]
    return segs, atts, boards


def _close(segs, atts):
    """Unmap the boards' views and unlink their segments."""
    for a in atts:
        a.close()
    for s in segs:
        s.close()


def _drain(ex, d):
    """Every chunk ``ex.take`` hands worker ``d`` until the peers are done."""
    got = []
    while True:
        new, _seen, done = ex.take(d, 0)
        got += new
        if done:
            return got


def _drain_until(ex, d):
    """The first chunks ``ex.take`` hands worker ``d``."""
    while True:
        new, _seen, done = ex.take(d, 0)
        if new or done:
            return new


def test_rows_published_on_a_board_reach_the_peer_in_order_half_step_after_half_step():
    bounds = {"users": np.array([0, 4, 10]), "items": np.array([0, 2, 5])}
    segs, atts, (b0, b1) = _boards("clmf-test-board", bounds)
    try:
        for k, side in enumerate(["users", "items", "users"], start=1):
            e0, e1 = b0.exchange(side), b1.exchange(side)
            assert e0.k == e1.k == k
            rows = bounds[side]
            # worker 1 writes its rows into its segment through the shared host, then publishes
            e1.host[rows[1]:rows[2]][:] = k
            e1.publish(1, rows[1], rows[1] + 1)
            e1.publish(1, rows[1] + 1, rows[2])
            new, _, done = e0.take(0, 0)          # what is there, before worker 1 finished
            assert new == [(1, rows[1], rows[1] + 1), (1, rows[1] + 1, rows[2])] and not done
            e1.finish(1)
            e0.finish(0)
            assert e0.take(0, 0) == ([], 0, True)
            assert _drain(e1, 1) == []                       # worker 0 published nothing
            # the peer's rows, read through worker 0's view of the shared host
            assert (e0.host[rows[1]:rows[2]] == k).all()
        with pytest.raises(IndexError, match="cross"):
            e0.host[3:6]
    finally:
        _close(segs, atts)
    assert _names("clmf-test-board") == []


def test_chunks_past_the_records_capacity_are_announced_as_one_span(monkeypatch):
    monkeypatch.setattr(BD, "_CAPACITY", 3)
    monkeypatch.setattr(BD, "_BANK", 1 + 3 * 3)
    bounds = {"users": np.array([0, 5, 20]), "items": np.array([0, 1, 2])}
    segs, atts, (b0, b1) = _boards("clmf-test-cap", bounds)
    try:
        e0, e1 = b0.exchange("users"), b1.exchange("users")
        for r in range(5, 20, 3):
            e1.publish(1, r, min(r + 3, 20))
        e1.finish(1)
        assert _drain(e0, 0) == [(1, 5, 8), (1, 8, 11), (1, 11, 20)]
    finally:
        _close(segs, atts)


def test_a_failed_dead_or_called_off_peer_ends_the_wait(monkeypatch):
    import subprocess
    import sys
    bounds = {"users": np.array([0, 2, 4]), "items": np.array([0, 1, 2])}
    called_off = []
    segs, atts, (b0, b1) = _boards("clmf-test-dead", bounds, abort=lambda: bool(called_off))
    try:
        b1.exchange("users").fail(RuntimeError("boom"))        # a failed half-step
        with pytest.raises(BD.PeerLostError, match="worker 1 of the fit failed"):
            _drain(b0.exchange("users"), 0)
        b1.controls[1][BD._FAILED] = 0
        # a peer process that is gone (pid of a finished child), noticed within a second
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        b0.controls[1][BD._PID] = child.pid
        with pytest.raises(BD.PeerLostError, match=f"pid {child.pid}"):
            _drain(b0.exchange("items"), 0)
        # the client calls the fit off, and no news at all ends in the time limit
        b0.controls[1][BD._PID] = os.getpid()
        called_off.append(1)
        with pytest.raises(BD.PeerLostError, match="called off"):
            _drain(b0.exchange("users"), 0)
        called_off.clear()
        monkeypatch.setenv(BD.ENV_TIMEOUT, "0.5")
        with pytest.raises(BD.PeerLostError, match="no rows from the other workers"):
            _drain(b0.exchange("items"), 0)
    finally:
        _close(segs, atts)


@pytest.mark.parametrize("threads", [1, 3], ids=["copies-in-turn", "copy-threads"])
@pytest.mark.parametrize("limit", [1 << 30, 8, "env-0"], ids=["mirror", "own-rows-only",
                                                              "own-rows-only-env"])
def test_staged_rows_go_through_page_locked_arrays_both_ways(monkeypatch, limit, threads):
    """With staging (page-locked arrays, on GPUs) the engine's copies of its own rows land in
    them and publishing copies them on into the row segment the peers read; the peers' rows are
    copied from their segments into the side's mirror before the device uploads them (a side
    over the pinning limit, or ``CLMF_DASK_PIN_LIMIT``, stages only this worker's rows)."""
    if limit == "env-0":
        monkeypatch.setenv("CLMF_DASK_PIN_LIMIT", "0")
        limit = 0
    else:
        monkeypatch.setattr(BD, "PIN_LIMIT", limit)
    monkeypatch.setattr(BD, "copy_threads", lambda workers: threads)
    monkeypatch.setattr(BD, "COPY_PART", 8)           # (rows of 8 bytes: a part each)
    bounds = {"users": np.array([0, 3, 6]), "items": np.array([0, 1, 2])}
    segs = [shm.Segments(f"clmf-test-stage-{d}") for d in range(2)]
    handles = [BD.board_create(segs[d], bounds, d, 2, np.float32) for d in range(2)]
    atts = [shm.Attached() for _ in range(2)]
    made = []

    def staging(shape, dtype):
        """A plain array standing for a page-locked one."""
        made.append(np.zeros(shape, dtype))
        return made[-1]
    b0 = BD.Board(atts[0], 0, handles, bounds)
    b1 = BD.Board(atts[1], 1, handles, bounds, staging=staging)
    try:
        assert b1.mirrored == (["users", "items"] if limit > 8 else [])
        e0, e1 = b0.exchange("users"), b1.exchange("users")
        e1.host[3:6][:] = 7.0                      # the device's copy, into the staging array
        assert np.shares_memory(e1.host[3:6], made[0]) and (e0.host[3:6] == 0).all()
        e1.publish(1, 3, 5)
        assert (e0.host[3:5] == 7).all() and (e0.host[5:6] == 0).all()
        e1.finish(1)
        assert _drain(e0, 0) == [(1, 3, 5)]
        e0.host[0:2][:] = 5.0                      # worker 0's rows, in its segment
        e0.publish(0, 0, 2)
        assert _drain_until(e1, 1) == [(0, 0, 2)]  # handed out once copied in
        up = e1.host[0:2]                          # what worker 1's device uploads
        assert (up == 5).all()
        assert np.shares_memory(up, made[0]) == (limit > 8)
        e0.host[2:3][:] = 6.0
        e0.publish(0, 2, 3)
        e0.finish(0)
        assert _drain(e1, 1) == [(0, 2, 3)] and (e1.host[2:3] == 6).all()
        assert b1.times["take"] > 0
    finally:
        b1.close()
        _close(segs, atts)


def test_rows_published_by_a_device_read_and_the_tails_marked(monkeypatch):
    """With a ``reader`` (``CLMF_DASK_PUBLISH=device``) a staged worker's published rows are
    those its reader copies off the device into its row segment (not its staging array's);
    the exchange marks when the last rows were published, seen and handed out, which
    :func:`tail_parts` turns into the tail's parts."""
    bounds = {"users": np.array([0, 3, 6]), "items": np.array([0, 1, 2])}
    segs = [shm.Segments(f"clmf-test-read-{d}") for d in range(2)]
    handles = [BD.board_create(segs[d], bounds, d, 2, np.float32) for d in range(2)]
    atts = [shm.Attached() for _ in range(2)]
    reads = []

    def reader(side, dst, r0, r1):
        """The device's rows: 9."""
        reads.append((side, r0, r1))
        dst[...] = 9.0
    b0 = BD.Board(atts[0], 0, handles, bounds)
    b1 = BD.Board(atts[1], 1, handles, bounds, staging=lambda shape, dt: np.zeros(shape, dt),
                   reader=reader)
    assert BD.Board(atts[0], 0, handles, bounds, reader=reader).reader is None   # unstaged
    try:
        e0, e1 = b0.exchange("users"), b1.exchange("users")
        e1.host[3:6][:] = 7.0                      # the engine's copy into its staging array
        e1.publish(1, 3, 6)
        e1.finish(1)
        assert reads == [("users", 3, 6)] and (e0.host[3:6] == 9).all()
        t = time.perf_counter()
        assert _drain(e0, 0) == [(1, 3, 6)]
        assert e1.marks["published"] <= t <= e0.marks["seen"] <= e0.marks["ready"]
    finally:
        b1.close()
        _close(segs, atts)
    parts = BD.tail_parts({"published": 3.0, "seen": 2.5, "ready": 4.0}, 2.0, 4.5)
    assert parts == pytest.approx({"publish_tail": 1.0, "peers_tail": 0.5, "fetch_tail": 1.5,
                                   "upload_tail": 0.5})
    # rows seen before this worker's kernels ended: no peers' tail; nothing marked: no tail
    assert BD.tail_parts({"seen": 1.0, "ready": 1.5}, 2.0, 2.5)["peers_tail"] == 0
    assert BD.tail_parts({}, 2.0, 2.0) == {"publish_tail": 0.0, "peers_tail": 0.0,
                                            "fetch_tail": 0.0, "upload_tail": 0.0}
    monkeypatch.setenv("CLMF_DASK_PIN_LIMIT", "4G")
    with pytest.raises(ValueError, match="CLMF_DASK_PIN_LIMIT must be a number of bytes"):
        BD.pin_limit()
    monkeypatch.delenv("CLMF_DASK_PUBLISH", raising=False)
    assert BD.publish_mode() == BD.PUBLISH == "dma"
    import types
    nvidia = types.SimpleNamespace(type="GPU", platform="NVIDIA CUDA", name="H100")
    other = types.SimpleNamespace(type="GPU", platform="AMD Accelerated Parallel Processing",
                                  name="NVIDIA-like name")
    assert BD.publish_mode(nvidia) == "register" and BD.publish_mode(other) == "dma"
    monkeypatch.setenv("CLMF_DASK_PUBLISH", "copy")
    assert BD.publish_mode(nvidia) == "copy"
    monkeypatch.setenv("CLMF_DASK_PUBLISH", "gpu")
    with pytest.raises(ValueError,
                       match="CLMF_DASK_PUBLISH must be one of copy, device, dma, register"):
        BD.publish_mode()


def test_copy_threads_are_a_workers_share_of_the_cores_or_as_set(monkeypatch):
    monkeypatch.delenv(BD.ENV_COPY_THREADS, raising=False)
    cores = len(os.sched_getaffinity(0))
    assert BD.copy_threads(1) == max(1, min(BD.COPY_THREADS, cores))
    assert BD.copy_threads(10 * cores) == 1
    monkeypatch.setenv(BD.ENV_COPY_THREADS, "3")
    assert BD.copy_threads(10 * cores) == 3


def test_a_full_shared_memory_is_the_comms_not_a_crash(monkeypatch):
    """Workers that saw the same free space race for it: a new segment's pages are allocated
    at once, and ENOSPC there sends the arrays through the comms (never SIGBUS on a write)."""
    import errno

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    assert shm.share_arrays("clmf-test-full2", [((4,), np.float32)], lambda v: None) is None
    seg = shm.Segments("clmf-test-full3")
    assert seg.array("solve-users", (4, 2), np.float32) is None
    assert _names("clmf-test-full2") == [] and _names("clmf-test-full3") == []


def test_board_takes_the_page_locked_arrays_made_during_the_build(cl_device, monkeypatch):
    """The build starts making a worker's staging arrays on its device's context (and measuring
    its copy rates) in a thread before its blocks are merged
    (:func:`~clmf.parallel.dask_tasks._stage_ahead`); the board takes those arrays instead of
    making its own, one per side as :func:`staging_specs` lists them, and the engine adopts
    their buffers (freed with it); arrays no board took are freed (:func:`_free_ahead`: a
    set-up that failed first). No staging: nothing made ahead."""
    import types

    import pyopencl as cl

    from clmf.engine.device import device_info
    made, adopted = [], []

    class Plan(dict):
        devices = 2

    def pinned_array(shape, dtype):
        """A plain array standing for a page-locked one (a row at least, as the engine's)."""
        made.append(np.zeros(tuple(max(1, x) for x in shape), dtype))
        return made[-1]
    bounds = {"users": np.array([0, 3, 6]), "items": np.array([0, 1, 2])}
    plan = Plan({s: types.SimpleNamespace(mode="replicate", bounds=b) for s, b in bounds.items()})
    setup = {"plan": plan, "ldf": 2, "store": np.float32}
    w = types.SimpleNamespace(pinned=True, pinned_array=pinned_array,
                              adopt_staging=adopted.extend, info=device_info(cl_device))
    segs = [shm.Segments(f"clmf-test-ahead-{d}") for d in range(2)]
    handles = [BD.board_create(segs[d], bounds, d, 2, np.float32) for d in range(2)]
    st = {"plan": plan, "worker": w, "shm": True, "d": 1, "ldf": 2, "store": np.float32,
          "attached": shm.Attached()}
    monkeypatch.setitem(T._STATE, "clmf-test-ahead", st)
    monkeypatch.delenv("CLMF_DASK_WORKER_LOOP", raising=False)
    monkeypatch.setenv("CLMF_DASK_PINNED_STAGING", "1")        # (a CPU device: forced on)
    try:
        st["ahead"] = T._stage_ahead(cl_device, setup, 1, True)
        ahead = list(st["ahead"].result()[0])       # (the board takes them off the list)
        assert [a.shape for a in ahead] == [(6, 2), (2, 2)]
        got = T.board_connect("clmf-test-ahead", "clmf-test-ahead-abort", *handles)
        assert got["staged"] and got["copy_gbs"]["pageable"] > 0 and got["ahead_wait_s"] >= 0
        board = st.pop("board")
        assert board.host["users"].mirror is ahead[0] and board.host["items"].mirror is ahead[1]
        assert made == []                           # nothing made by the engine
        assert len(adopted) == 3                    # the two mirrors and the rates' array
        assert adopted[0][1] is ahead[0] and adopted[1][1] is ahead[1]
        board.close()
        for buf, arr in adopted:
            arr.base.release()
            buf.release()
        unused = T._stage_ahead(cl_device, setup, 1, True)      # a set-up that failed first
        pairs = unused.result()[2]
        T._free_ahead(unused)                                   # unmapped and freed here
        with pytest.raises(cl.LogicError):
            pairs[0][0].release()
        T._free_ahead(None)
        assert T._stage_ahead(cl_device, setup, 1, False) is None       # no shared memory
        monkeypatch.setenv("CLMF_DASK_PUBLISH", "register")
        assert T._stage_ahead(cl_device, setup, 1, True) is None        # rows registered
        monkeypatch.delenv("CLMF_DASK_PUBLISH")
        monkeypatch.setenv("CLMF_DASK_PINNED_STAGING", "0")
        assert T._stage_ahead(cl_device, setup, 1, True) is None        # no staging
    finally:
        st["attached"].close()
        _close(segs, [])
