"""Saving and loading models: round trip, no pickle, atomic writes, clear errors on bad files."""
import io
import json
import logging
import os
import zipfile

import numpy as np
import pytest
from conftest import random_ratings

import clmf
from clmf.data import Ratings
from clmf.model import persistence


@pytest.fixture(scope="module")
def fitted():
    """A small real fit with string user ids (device chosen as usual)."""
    rng = np.random.default_rng(0)
    users = rng.choice([f"user-{k}" for k in range(40)], 400)
    items = rng.integers(100, 160, 400)
    r = Ratings.from_triples(users, items, rng.integers(1, 6, 400).astype(float),
                             duplicates="last")
    m = clmf.ALS(factors=5, regularization=0.07, iterations=3, random_state=3,
                 variant="batch:tx=4,ty=4")
    return m.fit(r, show_progress=True, validation=None), r


def assert_same_model(a, b):
    for attr in ("user_factors_", "item_factors_", "user_counts_", "item_counts_"):
        np.testing.assert_array_equal(getattr(a, attr), getattr(b, attr))
    assert a.global_mean_ == b.global_mean_
    for attr in ("user_ids_", "item_ids_"):
        x, y = getattr(a, attr), getattr(b, attr)
        assert (x is None) == (y is None)
        if x is not None:
            assert x.tolist() == y.tolist() and x.dtype.kind == y.dtype.kind
    pa, pb = a.get_params(), b.get_params()
    pa["device"] = persistence._device_str(pa["device"])
    pa["variant"] = persistence._variant_str(pa["variant"])
    pb["variant"] = persistence._variant_str(pb["variant"])
    assert pa == pb
    assert a.history_ == b.history_ and a.best_iteration_ == b.best_iteration_
    assert a.device_ == b.device_
    assert set(a.config_) == set(b.config_)
    for side in a.config_:
        assert str(a.config_[side]) == str(b.config_[side])
        assert a.config_[side].config == b.config_[side].config


def test_roundtrip_real_fit(fitted, tmp_path):
    m, r = fitted
    path = tmp_path / "model.npz"
    assert m.save(path) == str(path)
    assert sorted(os.listdir(tmp_path)) == ["model.npz"]          # no temp file left
    m2 = clmf.load(path)
    assert type(m2) is clmf.ALS and clmf.load is persistence.load
    assert_same_model(m, m2)
    assert m2.user_ids_.dtype.kind == "U" and m2.item_ids_.dtype.kind == "i"
    a = m.recommend_raw("user-3", r, N=5)
    b = m2.recommend_raw("user-3", r, N=5)
    assert a[0].tolist() == b[0].tolist() and np.array_equal(a[1], b[1])
    np.testing.assert_array_equal(m.predict([0, 1], [2, 3]), m2.predict([0, 1], [2, 3]))
    # every member loads without pickle; the marker and the version are there
    with np.load(path, allow_pickle=False) as z:
        assert str(z["clmf_format"]) == persistence.FORMAT
        assert int(z["format_version"]) == persistence.FORMAT_VERSION
        meta = json.loads(str(z["meta"]))
        for k in z.files:
            z[k]
    assert meta["clmf_version"] == clmf.__version__
    assert meta["params"]["dtype"] == "float32" and isinstance(meta["params"]["device"], str)
    assert set(meta["config"]["users"]) >= {"config", "rule", "reason"}
    # saving the loaded model again gives the same model
    m2.save(tmp_path / "again.npz")
    assert_same_model(m2, clmf.load(tmp_path / "again.npz"))


def test_roundtrip_matrix_model_and_odd_params(cl_device, tmp_path, caplog):
    R = random_ratings(20, 12, 0.4, seed=1)
    cfg = clmf.KernelConfig.parse("batch:tx=2,ty=2")
    m = clmf.ALS(factors=3, iterations=2, device=cl_device, variant=(cfg, "batch"),
                 random_state=np.random.default_rng(0)).fit(R, show_progress=False)
    with caplog.at_level(logging.WARNING, logger="clmf.model.persistence"):
        m.save(tmp_path / "m")                            # written exactly there, no suffix
    assert "random_state" in caplog.text
    m2 = clmf.load(tmp_path / "m")
    assert m2.user_ids_ is None and m2.item_ids_ is None
    assert m2.random_state is None
    assert isinstance(m2.device, str) and cl_device.name.strip() in m2.device
    assert isinstance(m2.variant, tuple) and clmf.KernelConfig.parse(m2.variant[0]) == cfg
    np.testing.assert_array_equal(m.user_factors_, m2.user_factors_)
    # a loaded model can be refitted with its saved parameters (device string selects again)
    m2.set_params(device=cl_device).fit(R, show_progress=False)
    # ... and grows by fold-in, and saves the grown model
    m2.partial_fit_users([25], random_ratings(1, 12, 0.5))
    m2.save(tmp_path / "grown.npz")
    assert clmf.load(tmp_path / "grown.npz").user_factors_.shape == (26, 3)


def test_failing_save_leaves_nothing(fitted, tmp_path, monkeypatch):
    m, _ = fitted
    target = tmp_path / "model.npz"

    def boom(fh, **arrays):
        fh.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", boom)
    with pytest.raises(OSError, match="disk full"):
        m.save(target)
    assert os.listdir(tmp_path) == []
    # an existing model survives a failed overwrite untouched
    monkeypatch.undo()
    m.save(target)
    before = target.read_bytes()
    monkeypatch.setattr(np, "savez_compressed", boom)
    with pytest.raises(OSError):
        m.save(target)
    assert target.read_bytes() == before and os.listdir(tmp_path) == ["model.npz"]
    monkeypatch.undo()
    with pytest.raises(clmf.NotFittedError, match="not fitted"):
        clmf.ALS().save(tmp_path / "unfitted.npz")
    with pytest.raises(OSError):
        m.save(tmp_path / "no" / "such" / "dir.npz")
    assert os.listdir(tmp_path) == ["model.npz"]


def test_load_errors_name_the_file(fitted, tmp_path):
    m, _ = fitted
    good = tmp_path / "good.npz"
    m.save(good)
    cases = {}
    with pytest.raises(FileNotFoundError, match="no such") as e:
        clmf.load(tmp_path / "missing.npz")
    assert e.value.filename == str(tmp_path / "missing.npz")
    text = tmp_path / "text.npz"
    text.write_text("user,item,rating\n1,2,3\n")
    cases["text"] = text
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.ones(3))
    cases["foreign"] = foreign
    npy = tmp_path / "array.npy"
    np.save(npy, np.ones(3))
    cases["npy"] = npy
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    cases["truncated"] = truncated
    cases["directory"] = tmp_path
    expected = {"text": "not a clmf model file",
                "foreign": "format marker", "npy": "not a clmf model file",
                "truncated": "clmf model file", "directory": "directory"}
    for name, path in cases.items():
        with pytest.raises(ValueError, match=expected[name]) as e:
            clmf.load(path)
        assert str(path) in str(e.value), name


def test_load_of_a_buffer_at_its_end_says_rewind(fitted):
    """A buffer just written is at its end: the error says to seek(0), not 'EOFError'."""
    m, _ = fitted
    buf = io.BytesIO()
    m.save(buf)
    with pytest.raises(ValueError, match=r"at its end \(position \d+ of \d+ bytes\).*seek\(0\)"):
        clmf.load(buf)
    assert buf.tell() == len(buf.getvalue())          # the position is left as it was
    with pytest.raises(ValueError, match="empty"):
        clmf.load(io.BytesIO())
    buf.seek(0)
    np.testing.assert_array_equal(clmf.load(buf).user_factors_, m.user_factors_)


def rewrite(src, dst, change):
    """Copy a model archive, changing members with ``change(dict) -> dict``."""
    with np.load(src, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    np.savez(dst, **change(members))
    return dst


def test_newer_format_and_inconsistent_members(fitted, tmp_path):
    m, _ = fitted
    good = tmp_path / "good.npz"
    m.save(good)
    newer = rewrite(good, tmp_path / "newer.npz",
                    lambda d: {**d, "format_version": np.array(persistence.FORMAT_VERSION + 1)})
    with pytest.raises(ValueError, match="newer") as e:
        clmf.load(newer)
    assert str(newer) in str(e.value)
    shapes = rewrite(good, tmp_path / "shapes.npz",
                     lambda d: {**d, "item_factors": d["item_factors"][:, :2]})
    with pytest.raises(ValueError, match="corrupted"):
        clmf.load(shapes)
    no_meta = rewrite(good, tmp_path / "nometa.npz",
                      lambda d: {k: v for k, v in d.items() if k != "meta"})
    with pytest.raises(ValueError, match="missing members"):
        clmf.load(no_meta)
    bad_json = rewrite(good, tmp_path / "badjson.npz", lambda d: {**d, "meta": np.array("{")})
    with pytest.raises(ValueError, match="corrupted"):
        clmf.load(bad_json)
    # a damaged member (CRC mismatch) inside an intact zip directory
    damaged = tmp_path / "damaged.npz"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(damaged, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(info, data)
    raw = bytearray(damaged.read_bytes())
    start = raw.find(b"user_factors.npy")
    raw[start + 200: start + 260] = bytes(60)
    damaged.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="clmf model file") as e:
        clmf.load(damaged)
    assert str(damaged) in str(e.value)
