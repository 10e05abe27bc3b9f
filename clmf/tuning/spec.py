"""The fit specification: every fact of a fit that the estimator's parameters fix and that the
layers below read — the mode (explicit, biased, implicit), the unknowns per system (f, or f + 1
with biases), the factor rows' width (f, or f + 2: ``[factors | 1 | bias]``), the leading
dimension of the rows on a device, the storage, the weighted-λ rule and implicit feedback's
confidence — in one home (issue 32).

:class:`FitSpec` is built once per fit (:meth:`FitSpec.of` the estimator's parameters) and passed
down; the functions below are the rules themselves, for the layers (engine, parallel, inference)
that are handed ``f`` and ``biased`` rather than a spec. Nothing else in clmf computes a width, a
leading dimension, the weighted-λ default or the confidence shift
(``tests/test_architecture.py`` checks the sources). This module imports nothing of clmf at
module level, so the engine may import it without an import cycle.
"""
from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["FitSpec", "fit_mode", "kernel_factors", "factor_width", "unknowns", "row_width",
           "system_row_width", "leading_dim", "common_ldf", "weighted_rule", "kernel_alpha",
           "confidence_shift", "kernel_ratings", "side_stats", "CONFIDENCES"]

# implicit feedback's confidence of a stored entry r: Hu, Koren & Volinsky's (and Spark's), or
# the implicit library's
CONFIDENCES = ("1+alpha*r", "alpha*r")


# ----- the rules -------------------------------------------------------------------------------
def fit_mode(feedback="explicit", biases=False):
    """The tuning mode of a fit: ``implicit``, ``biased`` or ``explicit``."""
    if feedback == "implicit":
        return "implicit"
    return "biased" if biases else "explicit"


def kernel_factors(f, mode="explicit"):
    """Unknowns per system the kernels are built for: f, or f + 1 with biases."""
    return f + 1 if mode == "biased" else f


def factor_width(f, mode="explicit"):
    """Width of a factor row on the device: f, or f + 2 ([factors | 1 | bias]) with biases."""
    return f + 2 if mode == "biased" else f


def unknowns(f, biased):
    """Unknowns per system of a fit of ``f`` factors: f, or f + 1 (the row's bias) with biases."""
    return kernel_factors(f, "biased" if biased else "explicit")


def row_width(f, biased):
    """Width of a factor row of a fit of ``f`` factors: f, or f + 2 with biases."""
    return factor_width(f, "biased" if biased else "explicit")


def system_row_width(fs, biased):
    """Width of a factor row for systems of ``fs`` unknowns (``fs`` = :func:`unknowns`)."""
    return row_width(fs - 1, True) if biased else fs


def leading_dim(width, multiple):
    """Leading dimension of rows of ``width`` values: ``width`` rounded up to a multiple of
    ``multiple`` (a vector width or a tile; 0 or None: 1)."""
    w = int(multiple or 1)
    return -(-int(width) // w) * w


def common_ldf(configs, width):
    """One leading dimension for every device's factor rows: the largest of the configurations'
    own (``configs``: one pair per device; vector widths are powers of two, so it is a multiple
    of each)."""
    return max(c.ldf(width) for pair in configs for c in pair)


def weighted_rule(weighted_regularization, feedback="explicit"):
    """Whether λ is weighted by each row's count (λ·n·I, ALS-WR): the parameter, or where it is
    None, True for explicit feedback and False for implicit (as the implicit library does)."""
    if weighted_regularization is None:
        return feedback != "implicit"
    return bool(weighted_regularization)


def kernel_alpha(feedback, alpha):
    """The alpha the kernels weight implicit entries with (None: explicit feedback)."""
    return float(alpha) if feedback == "implicit" else None


def confidence_shift(feedback, confidence, alpha):
    """What the kernels' view of a rating adds to it: the kernels weight an implicit entry by
    ``1 + alpha·r``, so ``confidence="alpha*r"`` passes ``r − 1/alpha`` (``1 + alpha·(r −
    1/alpha) = alpha·r``); 0 otherwise."""
    if feedback != "implicit" or confidence != "alpha*r":
        return 0.0
    return -1.0 / float(alpha)


def kernel_ratings(R, feedback, confidence, alpha):
    """The CSR ``R`` as the kernels and the reference read it: where :func:`confidence_shift`
    is not 0, a CSR sharing ``R``'s indices and row pointers whose values are shifted by it in
    float64 and rounded once to the kernels' float32 (over the scan threads); else ``R``
    itself."""
    shift = confidence_shift(feedback, confidence, alpha)
    if not shift:
        return R
    import scipy.sparse as sp

    from ..data.scan import shifted_float32
    R = sp.csr_matrix(R)
    return sp.csr_matrix((shifted_float32(R.data, shift), R.indices, R.indptr), shape=R.shape,
                         copy=False)


def side_stats(counts, other):
    """A side's statistics for the tuning lookup (:func:`clmf.tuning.choose`): its rows, the
    other side's count, its ratings, the mean ratings of a rated row and the most of a row."""
    counts = np.asarray(counts)
    nz = counts[counts > 0]
    return {"rows": int(counts.size), "cols": int(other), "nnz": int(counts.sum()),
            "mean": float(nz.mean()) if nz.size else 0.0,
            "max": int(counts.max()) if counts.size else 0}


# ----- the specification of one fit ----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FitSpec:
    """What a fit's parameters fix, built once (:meth:`of`) and passed down.

    ``solver`` is the solver parameter (None: ``"auto"``), ``storage`` the storage parameter
    (None: the variant's own), ``variant`` the (users, items) variants as given.
    """

    f: int
    feedback: str = "explicit"
    biases: bool = False
    regularization: float = 0.1
    weighted: bool = True
    alpha: float = 1.0
    confidence: str = "1+alpha*r"
    storage: str | None = None
    solver: str | None = None
    variant: tuple = ("auto", "auto")

    @classmethod
    def of(cls, params):
        """The spec of an estimator's parameters (an estimator, or a dict of its parameters)."""
        get = params.get if isinstance(params, dict) else (
            lambda k, d=None: getattr(params, k, d))
        feedback = get("feedback", "explicit")
        variant = get("variant", "auto")
        if isinstance(variant, (tuple, list)):
            if len(variant) != 2:
                raise ValueError("variant as a pair must be (users_variant, items_variant)")
            pair = tuple(variant)
        else:
            pair = (variant, variant)
        solver = get("solver", "auto")
        return cls(f=int(get("factors", 64)), feedback=feedback, biases=bool(get("biases", False)),
                   regularization=float(get("regularization", 0.1)),
                   weighted=weighted_rule(get("weighted_regularization", None), feedback),
                   alpha=float(get("alpha", 1.0)),
                   confidence=get("confidence", "1+alpha*r"), storage=get("storage", None),
                   solver=None if solver == "auto" else solver, variant=pair)

    @property
    def mode(self):
        """The tuning mode: ``explicit``, ``biased`` or ``implicit``."""
        return fit_mode(self.feedback, self.biases)

    @property
    def implicit(self):
        """Whether the fit is of implicit feedback."""
        return self.feedback == "implicit"

    @property
    def biased(self):
        """Whether the systems carry the rows' biases."""
        return bool(self.biases) and not self.implicit

    @property
    def unknowns(self):
        """Unknowns per system: f, or f + 1 with biases."""
        return kernel_factors(self.f, self.mode)

    @property
    def width(self):
        """Width of a factor row: f, or f + 2 with biases."""
        return factor_width(self.f, self.mode)

    @property
    def kernel_alpha(self):
        """The alpha the kernels weight implicit entries with (None: explicit feedback)."""
        return kernel_alpha(self.feedback, self.alpha)

    @property
    def shift(self):
        """What the kernels' view of a rating adds to it (:func:`confidence_shift`)."""
        return confidence_shift(self.feedback, self.confidence, self.alpha)

    @property
    def lookup_solver(self):
        """The solver the tuning lookup is held to: the parameter, else Cholesky for an
        unregularized explicit fit (its systems may be singular, which only the Cholesky solve
        detects: a CG returns some solution of a singular system), else None (the tuning's)."""
        if self.solver is None and self.regularization == 0 and not self.implicit:
            return "cholesky"
        return self.solver

    def ldf(self, configs):
        """The factor rows' leading dimension under ``configs``: one (users, items) pair, or a
        list of pairs (several devices share one row layout)."""
        pairs = [configs] if not isinstance(configs[0], (tuple, list)) else configs
        return common_ldf(pairs, self.width)

    def kernel_ratings(self, R):
        """The CSR ``R`` as the kernels read it (:func:`kernel_ratings`)."""
        return kernel_ratings(R, self.feedback, self.confidence, self.alpha)
