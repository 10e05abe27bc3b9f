"""Device top-k (cl_kernels/topk.cl.j2, clmf.inference.topk) against NumPy brute force."""
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import model_of

import clmf
from clmf.engine.device import device_info
from clmf.inference import topk as T
from clmf.inference.host import host_rank


def brute(Q, Y, N, cand=None, excl=None):
    """Exact lists in float64 (integer factors: exact in float32 too): score desc, index asc."""
    n = Y.shape[0]
    cand = np.arange(n) if cand is None else np.asarray(cand)
    k = min(N, cand.size)
    ids = np.full((Q.shape[0], k), -1, np.int64)
    sc = np.full((Q.shape[0], k), -np.inf, np.float32)
    S = Q.astype(np.float64) @ Y.astype(np.float64).T
    for r in range(Q.shape[0]):
        drop = set() if excl is None else set(excl[r].indices.tolist())
        keep = [int(j) for j in cand if int(j) not in drop]
        order = sorted(keep, key=lambda j: (-S[r, j], j))[:k]
        ids[r, :len(order)] = order
        sc[r, :len(order)] = S[r, order]
    return ids, sc


def int_problem(b, n, f, seed=0, density=0.2):
    rng = np.random.default_rng(seed)
    Q = rng.integers(-2, 3, (b, f)).astype(np.float32)
    Y = rng.integers(-2, 3, (n, f)).astype(np.float32)
    R = sp.random(b, n, density=density, random_state=seed, format="csr")
    return Q, Y, R


def configs_for(dev):
    """The device's default, another item layout, a scalar one, and the transposed layout with a
    one-entry buffer (the overflow rounds run on every tile): every layout on every device."""
    info = device_info(dev)
    d = T.default_config(info)
    small = dict(wx=4, wy=2, rm=2, rnv=1)
    return [d,
            T.TopKConfig(**small, v=4, tk=8, cap=16, qres=False, yt=0 if d.yt else 2),
            T.TopKConfig(**small, v=1, tk=8, cap=16, qres=True, yt=0),
            T.TopKConfig(**small, v=4, tk=8, cap=1, qres=False, yt=1)]


@pytest.mark.parametrize("f,which", [(1, 0), (17, 0), (40, 0), (5, 1), (5, 2), (5, 3)])
def test_topk_matches_brute_force(cl_device, f, which):
    """Ties (small-integer factors), seen items, candidate subsets, N beyond a tile; f not a
    multiple of the vector width; each configuration kind (see :func:`configs_for`)."""
    Q, Y, R = int_problem(37, 150, f, seed=f)
    rng = np.random.default_rng(f)
    cand = np.sort(rng.choice(150, 60, replace=False))
    for cfg in configs_for(cl_device)[which:which + 1]:
        dtk = T.DeviceTopK(Y, cl_device, config=cfg)
        for N in ((1, 7, 64) if which == 0 else (7, 64)):
            for c, e in ((None, None), (None, R), (cand, None), (cand, R)):
                ids, sc = dtk.query(Q, N, candidates=c, exclude=e)
                bid, bsc = brute(Q, Y, N, c, e)
                np.testing.assert_array_equal(ids, bid, err_msg=f"{cfg} N={N}")
                np.testing.assert_array_equal(sc, bsc, err_msg=f"{cfg} N={N}")


def test_topk_edges(cl_device):
    Q, Y, R = int_problem(9, 20, 5, seed=3)
    dtk = T.DeviceTopK(Y, cl_device)
    # N larger than the candidates: k = len(candidates)
    ids, sc = dtk.query(Q, 50, candidates=[2, 5, 7])
    assert ids.shape == (9, 3)
    np.testing.assert_array_equal(ids, brute(Q, Y, 50, [2, 5, 7])[0])
    # an empty candidate list: (b, 0)
    ids, sc = dtk.query(Q, 10, candidates=np.zeros(0, np.int64))
    assert ids.shape == sc.shape == (9, 0)
    # every item seen: padded rows
    allseen = sp.csr_matrix(np.ones((9, 20), np.float32))
    ids, sc = dtk.query(Q, 4, exclude=allseen)
    assert (ids == -1).all() and np.isneginf(sc).all()
    # all but two seen: two results, then padding
    most = allseen.tolil()
    most[:, [3, 11]] = 0
    most = sp.csr_matrix(most)
    most.eliminate_zeros()
    ids, sc = dtk.query(Q, 4, exclude=most)
    np.testing.assert_array_equal(ids, brute(Q, Y, 4, None, most)[0])
    assert (ids[:, 2:] == -1).all() and np.isfinite(sc[:, :2]).all()
    # N = 0 and no queries
    assert dtk.query(Q, 0)[0].shape == (9, 0)
    assert dtk.query(Q[:0], 5)[0].shape == (0, 5)
    # every score equal: ties by lower index
    ids, _ = T.DeviceTopK(np.ones((30, 3), np.float32), cl_device).query(np.ones((2, 3)), 6)
    assert ids.tolist() == [list(range(6))] * 2


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
def test_topk_batches_splits_and_resident(cl_device, staged, monkeypatch):
    """Many queries (several work-groups), forced small batches, resident queries/exclusion;
    ``staged``: the GPUs' uploads (page-locked staging buffers, chunked) on a CPU device."""
    if staged:
        from clmf.engine import upload as U
        monkeypatch.setattr(U, "zero_copy", lambda info: False)
        monkeypatch.setattr(U, "_SMALL", 0)
        monkeypatch.setattr(U, "STAGE_BYTES", 4096)
    Q, Y, R = int_problem(300, 700, 13, seed=5, density=0.05)
    dtk = T.DeviceTopK(Y, cl_device)
    bid, bsc = brute(Q, Y, 12, None, R)
    ids, sc = dtk.query(Q, 12, exclude=R)
    np.testing.assert_array_equal(ids, bid)
    parts = list(dtk.iter_query(Q, 12, exclude=R, batch_rows=64))
    assert len(parts) > 1
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), bid)
    dtk.set_queries(Q).set_exclude(R)
    ids, sc = dtk.query_rows(40, 251, 12, exclude="resident")
    np.testing.assert_array_equal(ids, bid[40:251])
    np.testing.assert_array_equal(sc, bsc[40:251])
    ids, _ = dtk.query_rows(7, 300, 12, exclude=R[7:300])
    np.testing.assert_array_equal(ids, bid[7:])


def test_batches_in_flight_do_not_block_the_host(cl_device, monkeypatch):
    """Every copy a query enqueues stays referenced until it completes: pyopencl waits for a
    dropped copy's event holding the GIL, which blocked the host for each batch's kernel and
    kept the other devices' threads from enqueueing theirs (issue 29: four GPUs gave 1.2×)."""
    import pyopencl as cl
    dropped, real = [], cl.enqueue_copy

    class Held:
        """The copy's event; notes a drop before the copy completed."""

        def __init__(self, ev):
            self.ev = ev

        def __getattr__(self, name):
            return getattr(self.ev, name)

        def __del__(self):
            if self.ev.command_execution_status != cl.command_execution_status.COMPLETE:
                dropped.append(self.ev)

    def enqueue_copy(*a, **kw):
        ev = real(*a, **kw)
        return ev if kw.get("is_blocking", True) else Held(ev)

    rng = np.random.default_rng(2)                      # f, N as above: one build
    Q = rng.integers(-2, 3, (2048, 13)).astype(np.float32)
    Y = rng.integers(-2, 3, (8000, 13)).astype(np.float32)
    dtk = T.DeviceTopK(Y, cl_device).set_queries(Q)
    monkeypatch.setattr(cl, "enqueue_copy", enqueue_copy)
    parts = list(dtk.iter_query(None, 12, rows=(0, 2048), batch_rows=1024))
    monkeypatch.undo()
    assert len(parts) == 2 and not dropped, f"{len(dropped)} copies dropped while in flight"
    # integer scores: score · 2¹⁴ − item orders by score, then the lower item, without ties
    key = (Q.astype(np.int64) @ Y.T.astype(np.int64)) * 16384 - np.arange(Y.shape[0])
    top = np.argpartition(-key, 12, axis=1)[:, :12]
    want = np.take_along_axis(top, np.argsort(-np.take_along_axis(key, top, 1), axis=1), 1)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), want)
    tr = dtk.last_trace.summary()
    assert tr["rows"] == 2048 and tr["batches"] == 2 and tr["kernel_s"] > 0


def test_lists_written_into_the_callers_arrays(cl_device):
    """``out``: the batches' lists land in the caller's arrays (int32 ids too), candidates and
    padding as in fresh arrays; a wrong shape is refused before anything runs."""
    Q, Y, R = int_problem(300, 700, 13, seed=6, density=0.05)
    R = R.tolil()
    R[5, :] = 1                                          # a user who has seen every item
    R = R.tocsr()
    cand = np.arange(0, 700, 3)
    dtk = T.DeviceTopK(Y, cl_device).set_queries(Q)
    for c in (None, cand):
        want = dtk.query(Q, 12, c, R)
        out = (np.full((300, 12), 7, np.int32), np.zeros((300, 12), np.float32))
        parts = list(dtk.iter_query(None, 12, c, R, rows=(0, 300), batch_rows=128, out=out))
        assert len(parts) >= 2 and all(np.shares_memory(p[1], out[0]) for p in parts)
        np.testing.assert_array_equal(out[0], want[0])
        np.testing.assert_array_equal(out[1], want[1])
        assert (out[0][5] == -1).all() and np.isneginf(out[1][5]).all()
    with pytest.raises(ValueError, match="out must hold"):
        next(dtk.iter_query(None, 12, rows=(0, 300), out=(out[0][:10], out[1][:10])))


@pytest.mark.parametrize("which", [0, 1, 2, 3])
def test_set_factors_rewrites_the_resident_items(cl_device, which):
    """New factors written into the uploaded buffer (every item layout) rank as a fresh upload;
    a candidate gather of the old factors is not reused; another shape is refused."""
    Q, Y, R = int_problem(29, 170, 11, seed=9)
    Y2 = np.roll(Y, 3, axis=1) - 1
    cand = np.arange(0, 170, 3)
    dtk = T.DeviceTopK(Y, cl_device, config=configs_for(cl_device)[which])
    dtk.query(Q, 9, candidates=cand)
    dtk.set_queries(Q).set_exclude(R)
    buf = dtk.factors_buf
    dtk.set_factors(Y2)
    assert dtk.factors_buf is buf
    np.testing.assert_array_equal(dtk.query(Q, 9, exclude=R)[0], brute(Q, Y2, 9, None, R)[0])
    np.testing.assert_array_equal(dtk.query(Q, 9, candidates=cand)[0], brute(Q, Y2, 9, cand)[0])
    np.testing.assert_array_equal(dtk.query_rows(0, 29, 9, exclude="resident")[0],
                                  brute(Q, Y2, 9, None, R)[0])
    with pytest.raises(ValueError, match="shape"):
        dtk.set_factors(Y2[:-1])


def test_topk_continuous_scores_agree_with_host(cl_device):
    rng = np.random.default_rng(2)
    Q = rng.standard_normal((50, 37)).astype(np.float32)
    Y = rng.standard_normal((900, 37)).astype(np.float32)
    R = sp.random(50, 900, density=0.05, random_state=1, format="csr")
    ids, sc = T.DeviceTopK(Y, cl_device).query(Q, 10, exclude=R)
    hid, hsc = host_rank(Q, Y, None, R, 10)
    np.testing.assert_allclose(sc, hsc, rtol=1e-5, atol=1e-5)
    exact = Q.astype(np.float64) @ Y.T.astype(np.float64)
    np.testing.assert_allclose(sc, np.take_along_axis(exact, ids, 1), rtol=1e-5, atol=1e-5)


def test_topk_bad_input(cl_device):
    dtk = T.DeviceTopK(np.ones((5, 3), np.float32), cl_device)
    with pytest.raises(ValueError):
        dtk.query(np.ones((2, 4)), 3)
    with pytest.raises(IndexError):
        dtk.query(np.ones((2, 3)), 3, candidates=[1, 9])
    with pytest.raises(ValueError):
        dtk.query(np.ones((2, 3)), 3, exclude=sp.csr_matrix((3, 5)))
    with pytest.raises(ValueError):
        T.DeviceTopK(np.full((2, 2), np.nan), cl_device)
    with pytest.raises(clmf.InvalidConfigError):
        T.validate(T.TopKConfig(rm=8, rnv=4, v=4), 10, 10, None)


def test_config_roundtrip_and_validation(cl_device):
    info = device_info(cl_device)
    cfg = T.TopKConfig(wx=2, wy=4, rm=2, rnv=1, v=8, tk=8, cap=4, qres=True, yt=2)
    assert T.TopKConfig.parse(str(cfg)) == cfg == T.TopKConfig.from_dict(cfg.to_dict())
    huge = T.TopKConfig(wx=16, wy=64, rm=8, rnv=1, v=4, tk=32, cap=64, qres=True)
    with pytest.raises(clmf.InvalidConfigError):
        T.validate(huge, 100, 512, info)
    fitted = T._shrink_to_fit(huge, 100, 10, info)
    assert T.validate(fitted, 100, 10, info)


def make_model(X, Y, **attrs):
    return model_of(X, Y, global_mean=3.0, **attrs)


def test_model_biased_and_cosine_on_device(cl_device):
    rng = np.random.default_rng(4)
    X = rng.integers(-2, 3, (20, 6)).astype(np.float32)
    Y = rng.integers(-2, 3, (70, 6)).astype(np.float32)
    bu = rng.integers(-2, 3, 20).astype(np.float32)
    bi = rng.integers(-2, 3, 70).astype(np.float32)
    R = sp.random(20, 70, density=0.2, random_state=3, format="csr")
    m = make_model(X, Y, user_biases_=bu, item_biases_=bi)
    with T.inference_options(enabled=False):
        host = m.recommend(np.arange(20), R, N=9)
        hsim = m.similar_items(np.arange(70), N=5)
        husr = m.similar_users(np.arange(20), N=4, filter_users=[3])
    with T.inference_options(device=cl_device, min_work=0):
        dev = m.recommend(np.arange(20), R, N=9)
        dsim = m.similar_items(np.arange(70), N=5)
        dusr = m.similar_users(np.arange(20), N=4, filter_users=[3])
        assert "resident" in m._topk_cache and "items_cosine" in m._topk_cache
    np.testing.assert_array_equal(dev[0], host[0])
    np.testing.assert_array_equal(dev[1], host[1])
    full = 3.0 + bu[:, None] + bi[None, :] + X @ Y.T
    np.testing.assert_array_equal(dev[1], np.take_along_axis(full, dev[0], 1))
    for d, h, F in ((dsim, hsim, Y), (dusr, husr, X)):
        np.testing.assert_allclose(d[1], h[1], atol=1e-6)
        Fn = F / np.maximum(np.linalg.norm(F.astype(np.float64), axis=1), 1e-300)[:, None]
        cos = np.take_along_axis(Fn @ Fn.T, d[0], 1)
        cos[np.arange(len(F)), 0] = np.where(d[0][:, 0] == np.arange(len(F)), 1.0,
                                             cos[np.arange(len(F)), 0])
        np.testing.assert_allclose(cos, d[1], atol=1e-6)     # ids carry their scores


def test_model_cache_follows_fold_in(cl_device):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((8, 4)).astype(np.float32)
    Y = rng.standard_normal((30, 4)).astype(np.float32)
    R = sp.random(8, 30, density=0.3, random_state=2, format="csr", dtype=np.float32)
    R.data = np.ceil(R.data * 5)
    RT = R.T.tocsr()
    m = make_model(X, Y)
    ALL = {"filter_already_liked_items": False}     # no user_items: rank every item
    with T.inference_options(device=cl_device, min_work=0):
        before = m.recommend(0, N=5, **ALL)
        cached = m._topk_cache["resident"][1]
        assert m.recommend(1, N=5, **ALL) is not None and m._topk_cache["resident"][1] is cached
        m.partial_fit_items(np.arange(30), RT)        # refits every item in place
        assert "_topk_cache" not in m.__dict__
        after = m.recommend(0, N=5, **ALL)
    with T.inference_options(enabled=False):
        np.testing.assert_array_equal(after[0], m.recommend(0, N=5, **ALL)[0])
    assert not np.array_equal(before[1], after[1])


def test_host_threshold_is_measured(cl_device):
    rng = np.random.default_rng(0)
    dtk = T.DeviceTopK(rng.standard_normal((3000, 16)).astype(np.float32), cl_device)
    thr, detail = T.calibrate(dtk, sizes=(1, 8, 32))
    assert thr >= 0 and len(detail["host_s"]) == len(detail["device_s"]) == 3
    assert all(t > 0 for t in detail["host_s"] + detail["device_s"])
    with T.inference_options(min_work=123.0):
        assert dtk.host_threshold() == 123.0


def test_recommend_all_and_cli_stream(cl_device, tmp_path, monkeypatch):
    """``recommend_all`` equals a batched ``recommend``; ``clmf recommend --all --out`` writes
    the same lists in raw ids to .csv and .parquet, and nothing when it fails."""
    import pandas as pd

    from clmf.cli import main
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(1, 41), 6)
    items = np.concatenate([rng.choice(np.arange(101, 131), 6, replace=False) for _ in range(40)])
    data = tmp_path / "ratings.csv"
    data.write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{r},0\n" for u, i, r in zip(users, items, rng.integers(1, 6, users.size))))
    train = clmf.data.load(str(data))
    model = clmf.ALS(factors=3, iterations=2, device=cl_device, random_state=0).fit(
        train, show_progress=False)
    R = train.to_csr()
    with T.inference_options(device=cl_device, min_work=0):
        ids, sc = model.recommend_all(4, R, batch_size=16)
        bid, bsc = model.recommend(np.arange(R.shape[0]), R, N=4)
    np.testing.assert_array_equal(ids, bid)
    np.testing.assert_array_equal(sc, bsc)
    path = tmp_path / "model.npz"
    model.save(str(path))
    monkeypatch.setenv("CLMF_DEVICE", f"{cl_device.platform.name} | {cl_device.name}")
    for ext in ("csv", "parquet"):
        out = tmp_path / f"recs.{ext}"
        with T.inference_options(device=cl_device, min_work=0):
            assert main(["recommend", str(path), "--all", "--out", str(out), "-n", "4",
                         "--train", str(data), "--batch-size", "7"]) == 0
        df = pd.read_csv(out) if ext == "csv" else pd.read_parquet(out)
        assert list(df.columns) == ["user", "rank", "item", "score"]
        for u in (0, 17, 39):
            got = df[df.user == model.user_ids_[u]].sort_values("rank")
            assert got["item"].tolist() == model.item_ids_[ids[u][ids[u] >= 0]].tolist()
            np.testing.assert_allclose(got["score"], sc[u][ids[u] >= 0], rtol=1e-5)
    # a run failing midway leaves no file (and no temporary) behind
    bad = tmp_path / "bad.csv"
    real = clmf.ALS.iter_recommend_all

    def failing(self, *a, **k):
        """The first batch, then a failure."""
        yield next(real(self, *a, **k))
        raise RuntimeError("the device went away")

    monkeypatch.setattr(clmf.ALS, "iter_recommend_all", failing)
    assert main(["recommend", str(path), "--all", "--out", str(bad), "-n", "4",
                 "--batch-size", "7"]) == 1
    assert not bad.exists() and not list(tmp_path.glob(".bad.csv.*"))
    with pytest.raises(SystemExit) as e:                 # -n -3: a usage error, nothing written
        main(["recommend", str(path), "--all", "--out", str(bad), "-n", "-3"])
    assert e.value.code == 2 and not bad.exists()
    assert main(["recommend", str(path), "--all", "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["recommend", str(path), "--all", "--user", "1"]) == 2


def test_topk_records_are_found_and_ignored_by_the_als_lookup(cl_device, tmp_path, monkeypatch):
    from clmf import tuning
    from clmf.tuning import Database, base_record
    info = device_info(cl_device)
    db = tmp_path / "db.jsonl"
    db.write_text("")
    monkeypatch.setenv("CLMF_TUNING_DB", str(db))
    before = tuning.choose(info, 10, "users")
    assert T.lookup_config(info, 10)[2] == "default" or T.lookup_config(info, 10)[2] != "given"
    cfg = T.TopKConfig(wx=2, wy=8, rm=2, rnv=1, v=4, tk=8, cap=8)
    Database(db).append(base_record("topk", device=tuning.device_record(info), f=12,
                                    config=cfg.to_dict(), host_threshold=5e6))
    assert T.lookup_config(info, 10)[:2] == (cfg, 5e6)
    dtk = T.DeviceTopK(np.ones((4, 10), np.float32), cl_device)
    assert dtk.config == cfg and dtk.host_threshold() == 5e6
    after = tuning.choose(info, 10, "users")      # the ALS lookup does not see the record
    assert (after.config, after.rule) == (before.config, before.rule)


def test_an_untuned_device_calibrates_its_host_threshold_without_deadlock(cl_device):
    """host_threshold measures the device under the ranker's lock and the measurement's queries
    take that lock again (a plain Lock hung the first recommend on PyPI's untuned PoCL)."""
    import threading

    from clmf.inference import topk
    Y = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    t = topk.DeviceTopK(Y, device=cl_device)
    t._tuned_threshold = None
    got = []
    th = threading.Thread(target=lambda: got.append(t.host_threshold()), daemon=True)
    th.start()
    th.join(120)
    assert not th.is_alive(), "host_threshold deadlocked"
    assert got and got[0] >= 0


def test_a_batch_just_under_the_target_is_not_split(cl_device):
    """Items are split over work-groups only where that brings the query groups nearer the
    device's target (rounded, not up): 489 groups of a 62,500-query batch against an H100's
    528 ran split in two, 8 % slower (issue 29's 1M × 1M); far fewer groups still split."""
    dtk = T.DeviceTopK(np.ones((4096, 8), np.float32), cl_device)
    cfg, target = dtk.config, dtk.info.compute_units * (4 if dtk.info.type != "CPU" else 2)
    C = 4096 * cfg.tn
    almost = max(1, target - target // 8) * cfg.tm      # just under the target's groups
    assert dtk._splits(almost, C, cfg)[0] == 1
    assert dtk._splits(cfg.tm, C, cfg)[0] == target      # one group: split to the target
