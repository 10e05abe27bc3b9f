"""clmf.parallel.shared_blocks: the same-host transport of the Dask fit's blocks, apart from
Dask (segments made, mapped by handle, reused, released; probes that fail; a full /dev/shm)."""
from __future__ import annotations

import os

import numpy as np
import pytest

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
