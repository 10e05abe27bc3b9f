"""Tests of clmf.metrics against hand-computed cases (the arithmetic is written out)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from clmf import metrics
from clmf.data import Ratings

L2 = math.log2

# Three users, top-4 lists (-1 pads), relevant sets; user 2 has no relevant item and is
# left out of every mean.
REC = np.array([[1, 2, 3, 4], [5, 6, -1, -1], [7, 8, 9, 10]])
REL = [{2, 4, 9}, {5}, set()]

# user 0 @4: hits 0 1 0 1, |R| = 3       user 1 @4: hits 1 0 0 0, |R| = 1
P4 = (2 / 4 + 1 / 4) / 2                                   # 0.375
R4 = (2 / 3 + 1 / 1) / 2                                   # 0.8333
AP4 = ((1 / 2 + 2 / 4) / min(4, 3) + (1 / 1) / 1) / 2      # (1/3 + 1) / 2
NDCG4_U0 = (1 / L2(3) + 1 / L2(5)) / (1 / L2(2) + 1 / L2(3) + 1 / L2(4))
NDCG4 = (NDCG4_U0 + 1.0) / 2
# @2: user 0 hits 0 1, user 1 hits 1 0
P2 = (1 / 2 + 1 / 2) / 2
R2 = (1 / 3 + 1) / 2
AP2 = ((1 / 2) / min(2, 3) + 1.0) / 2                      # (1/4 + 1) / 2
NDCG2 = ((1 / L2(3)) / (1 + 1 / L2(3)) + 1.0) / 2


class TestErrors:
    def test_rmse_mae_hand(self):
        y, p = [1, 2, 3, 4], [2, 2, 1, 4]
        # differences -1, 0, 2, 0: squares 1 + 0 + 4 + 0 = 5, / 4 = 1.25; abs 1 + 0 + 2 + 0 = 3
        assert metrics.rmse(y, p) == pytest.approx(math.sqrt(1.25))
        assert metrics.mae(y, p) == pytest.approx(0.75)
        assert metrics.rmse(np.float32([1.5]), np.float32([1.5])) == 0.0

    @pytest.mark.parametrize("fn", [metrics.rmse, metrics.mae])
    def test_validation(self, fn):
        with pytest.raises(ValueError, match="shape"):
            fn([1, 2], [1, 2, 3])
        with pytest.raises(ValueError, match="empty"):
            fn([], [])
        with pytest.raises(ValueError, match="non-finite"):
            fn([1, np.nan], [1, 2])
        with pytest.raises(ValueError, match="y_pred.*non-finite"):
            fn([1, 2], [1, np.inf])
        with pytest.raises(ValueError):
            fn(1.0, 1.0)


class TestRanking:
    def test_hand_case_k4(self):
        assert metrics.precision_at_k(REC, REL, 4) == pytest.approx(P4)
        assert metrics.recall_at_k(REC, REL, 4) == pytest.approx(R4)
        assert metrics.average_precision_at_k(REC, REL, 4) == pytest.approx(AP4)
        assert metrics.map_at_k(REC, REL, 4) == pytest.approx(2 / 3)
        assert metrics.ndcg_at_k(REC, REL, 4) == pytest.approx(NDCG4)
        # (0.630930 + 0.430677) / (1 + 0.630930 + 0.5) = 1.061606 / 2.130930 = 0.498189
        assert NDCG4_U0 == pytest.approx(0.498189, abs=1e-6)

    def test_hand_case_k2(self):
        assert metrics.precision_at_k(REC, REL, 2) == pytest.approx(P2)
        assert metrics.recall_at_k(REC, REL, 2) == pytest.approx(R2)
        assert metrics.map_at_k(REC, REL, 2) == pytest.approx(AP2)
        assert metrics.ndcg_at_k(REC, REL, 2) == pytest.approx(NDCG2)

    def test_perfect_and_empty_lists(self):
        rec = [[3, 1, 2]]
        assert metrics.ndcg_at_k(rec, [{1, 2, 3}], 3) == pytest.approx(1.0)
        assert metrics.map_at_k(rec, [{1, 2, 3}], 3) == pytest.approx(1.0)
        assert metrics.precision_at_k([[-1, -1]], [{1}], 2) == 0.0

    def test_more_relevant_than_k(self):
        # |R| = 5 > k = 2, both top items relevant: recall 2/5, AP and nDCG normalised by 2
        rec, rel = [[1, 2]], [{1, 2, 3, 4, 5}]
        assert metrics.recall_at_k(rec, rel, 2) == pytest.approx(2 / 5)
        assert metrics.map_at_k(rec, rel, 2) == pytest.approx(1.0)
        assert metrics.ndcg_at_k(rec, rel, 2) == pytest.approx(1.0)

    def test_repeated_item_counts_once(self):
        # [2, 2, 2] with R = {2}: one hit at rank 1 only -> precision 1/3, not 1
        assert metrics.precision_at_k([[2, 2, 2]], [{2}], 3) == pytest.approx(1 / 3)
        assert metrics.ndcg_at_k([[5, 2, 2]], [{2}], 3) == pytest.approx(1 / L2(3))

    def test_input_forms_agree(self):
        rel_csr = sp.csr_matrix(
            (np.ones(4), ([0, 0, 0, 1], [2, 4, 9, 5])), shape=(3, 12)
        )
        ragged = [np.array([1, 2, 3, 4]), [5, 6], np.array([7, 8, 9, 10, 11])]
        rel_arrays = [np.array([4, 2, 9, 2]), np.array([5]), np.array([], dtype=int)]
        want = metrics.evaluate_ranking(REC, REL, ks=(2, 4))
        for rec, rel in ((REC, rel_csr), (ragged, REL), (REC.astype(float), rel_arrays),
                         (list(REC), REL)):
            got = metrics.evaluate_ranking(rec, rel, ks=(2, 4))
            assert got == pytest.approx(want)

    def test_ratings_as_relevant(self):
        test = Ratings(users=[0, 0, 0, 1], items=[2, 4, 9, 5], ratings=[5, 1, 4, 3],
                       timestamps=None, user_ids=[10, 11, 12], item_ids=np.arange(12))
        assert metrics.precision_at_k(REC, test, 4) == pytest.approx(P4)
        # only ratings >= 4 relevant: user 0 R = {2, 9} -> @4 hits 0 1 0 0; user 1 has none
        res = metrics.evaluate_ranking(REC, test, ks=4, metrics=("precision", "recall"),
                                       relevance_threshold=4)
        assert res == pytest.approx({"precision@4": 1 / 4, "recall@4": 1 / 2})

    def test_evaluate_ranking_keys_and_values(self):
        res = metrics.evaluate_ranking(REC, REL, ks=(2, 4))
        assert list(res) == ["precision@2", "recall@2", "map@2", "ndcg@2",
                             "precision@4", "recall@4", "map@4", "ndcg@4"]
        assert res["precision@4"] == pytest.approx(P4)
        assert res["recall@2"] == pytest.approx(R2)
        assert res["map@4"] == pytest.approx(AP4)
        assert res["ndcg@2"] == pytest.approx(NDCG2)
        assert metrics.evaluate_ranking(REC, REL, ks=4, metrics="NDCG") == pytest.approx(
            {"ndcg@4": NDCG4})

    def test_no_relevant_users_is_nan(self):
        assert math.isnan(metrics.precision_at_k([[1, 2]], [set()], 2))

    def test_validation(self):
        with pytest.raises(ValueError, match="fewer than k"):
            metrics.precision_at_k(REC, REL, 5)
        with pytest.raises(ValueError, match="user row"):
            metrics.recall_at_k(REC, REL[:2], 2)
        with pytest.raises(ValueError, match="k must"):
            metrics.ndcg_at_k(REC, REL, 0)
        with pytest.raises(ValueError, match="integer"):
            metrics.map_at_k(np.array([[1.5, 2.0]]), [{1}], 1)
        with pytest.raises(ValueError, match="unknown metric"):
            metrics.evaluate_ranking(REC, REL, metrics=("auc",))
        with pytest.raises(ValueError, match="ks"):
            metrics.evaluate_ranking(REC, REL, ks=())
        with pytest.raises(ValueError, match="negative"):
            metrics.precision_at_k(REC, [{-2}, set(), set()], 2)
        with pytest.raises(ValueError, match="ambiguous"):
            metrics.precision_at_k(REC, np.ones((3, 4)), 2)

    def test_vectorised_matches_loop(self):
        rng = np.random.default_rng(0)
        n_users, n_items, k = 300, 50, 10
        rec = np.array([rng.permutation(n_items)[:k] for _ in range(n_users)])
        rel = [set(rng.choice(n_items, rng.integers(0, 8), replace=False).tolist())
               for _ in range(n_users)]
        p, r, ap, nd = [], [], [], []
        for row, rs in zip(rec, rel):
            if not rs:
                continue
            h = [int(x in rs) for x in row]
            p.append(sum(h) / k)
            r.append(sum(h) / len(rs))
            ap.append(sum(h[i] * sum(h[: i + 1]) / (i + 1) for i in range(k)) / min(k, len(rs)))
            dcg = sum(h[i] / L2(i + 2) for i in range(k))
            nd.append(dcg / sum(1 / L2(i + 2) for i in range(min(k, len(rs)))))
        res = metrics.evaluate_ranking(rec, rel, ks=k)
        assert res == pytest.approx({"precision@10": np.mean(p), "recall@10": np.mean(r),
                                     "map@10": np.mean(ap), "ndcg@10": np.mean(nd)})


class TestImplicitMetrics:
    """:func:`metrics.ranking_metrics`: the `implicit` library's definitions, written out on the
    module's hand case (10 items)."""

    def test_hand_case_k4(self):
        res = metrics.ranking_metrics(REC, REL, k=4, n_items=10)
        # implicit's precision: hits summed over users / Σ min(k, |R|) = (2 + 1) / (3 + 1)
        assert res["precision"] == pytest.approx(3 / 4)
        assert res["strict_precision"] == pytest.approx(P4)           # (2/4 + 1/4) / 2
        assert res["map"] == pytest.approx(AP4)
        assert res["ndcg"] == pytest.approx(NDCG4)
        # AUC, user 0: list 1 2 3 4 → miss (0 hits above), hit, miss (1 above), hit: 1;
        # |R| = 3, 7 negatives, 2 misses in the list: (1 + (2 + 3)/2 · (7 − 2)) / (3 · 7)
        # user 1: list 5 -1 -1 -1 → hit, then three misses with 1 hit above: 3;
        # |R| = 1, 9 negatives: (3 + (1 + 1)/2 · (9 − 3)) / 9
        auc0 = (1 + 2.5 * 5) / 21
        auc1 = (3 + 1.0 * 6) / 9
        assert res["auc"] == pytest.approx((auc0 + auc1) / 2)

    def test_precisions_differ_by_the_denominator(self):
        # two relevant items per user, k = 10: implicit's precision is 5× the strict one
        rec = np.arange(20).reshape(2, 10)
        res = metrics.ranking_metrics(rec, [{0, 50}, {10, 11}], k=10, n_items=60)
        assert res["precision"] == pytest.approx(3 / 4)
        assert res["strict_precision"] == pytest.approx(3 / 20)
        assert res["strict_precision"] == pytest.approx(metrics.precision_at_k(rec, [{0, 50},
                                                                               {10, 11}], 10))

    def test_no_relevant_user_is_nan(self):
        res = metrics.ranking_metrics(REC, [set(), set(), set()], k=2, n_items=12)
        assert set(res) == {"precision", "map", "ndcg", "auc", "strict_precision"}
        assert all(math.isnan(v) for v in res.values())
