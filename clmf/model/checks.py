"""What every fit backend (one device, several, Dask) derives from the ratings' counts and range
(a side's statistics for the tuning lookup are :func:`clmf.tuning.side_stats`): the refusal of
unregularized singular systems before any device work, and the diagnosis of a failed or
non-finite fit explained by the ratings' magnitude (:class:`clmf.errors.RatingRangeError`)."""
from __future__ import annotations

import numpy as np

from ..data.scan import count_columns
from ..errors import SingularSystemError

__all__ = ["range_error"]


def _csr_range(R):
    """``(largest ratings per user/item, largest |rating|)`` of a CSR, for :func:`range_error`."""
    counts = max(int(np.diff(R.indptr).max(initial=0)),
                 int(count_columns(R.indices, R.shape[1]).max(initial=0)), 1)
    return counts, float(np.abs(R.data).max(initial=0.0))


def range_error(engine, counts, rmax, f, storage, regularization):
    """A :class:`RatingRangeError` when a failed or non-finite fit is explained by the ratings'
    magnitude — float overflow of the normal equations (or of float16 factors), or a
    regularization below float32 precision — else None (the original error stands). ``counts``
    is the largest number of ratings of a user or item, ``rmax`` the largest |rating|; every
    backend (one device, several, Dask) diagnoses with this one rule."""
    from ..data.validation import overflow_limit, precision_limit
    from ..errors import RatingRangeError
    counts, rmax = max(int(counts), 1), float(rmax)
    big = 0.0
    try:
        for M in (engine.get_factors("users"), engine.get_factors("items")):
            with np.errstate(all="ignore"):
                a = np.abs(M.astype(np.float64))
            big = max(big, float(a.max(initial=0.0))) if np.isfinite(a).all() else np.inf
    except Exception:  # noqa: BLE001 - the diagnosis must not hide the original error
        pass
    fmax = float(np.finfo(np.float32).max)
    limit = overflow_limit(f, counts, storage)
    scale = 10.0 ** np.ceil(np.log10(max(rmax, 1e-30) / limit)) if rmax > limit else None
    if rmax > limit or big == np.inf or big * big * counts * max(f, 1) >= 0.01 * fmax:
        what = "float16 factor storage" if storage == "float16" else "float32"
        fix = (f"scale the ratings into that range (e.g. divide them by {scale:.0e}, and "
               "multiply predictions back)" if scale else "scale the ratings down")
        if storage == "float16":
            fix += (f", or use storage='float32' (ratings up to about "
                    f"{overflow_limit(f, counts):.1e})")
        return RatingRangeError(
            f"the normal equations overflowed the {what} range (largest |rating| {rmax:.3g}, "
            f"factors reached {big:.3g}): ratings up to about {limit:.1e} work at factors={f} "
            f"with up to {counts} ratings per user/item; {fix}")
    plimit = precision_limit(regularization)
    if plimit is not None and rmax > plimit:
        scale = 10.0 ** np.ceil(np.log10(rmax / plimit))
        return RatingRangeError(
            f"ratings up to |r| = {rmax:.3g} make the normal equations' entries so large that "
            f"regularization={regularization} falls below float32 precision (users/items with "
            f"fewer ratings than factors then have singular systems): ratings up to about "
            f"{plimit:.1e} work at this regularization; divide the ratings by {scale:.0e} (and "
            "multiply predictions back), or raise regularization in proportion to the scale")
    return None


def _check_unregularized(user_counts, item_counts, f):
    """Raise :class:`SingularSystemError` when, without regularization, a user or item with
    ratings has fewer of them than factors (its normal equations are singular)."""
    for side, counts in (("user", user_counts), ("item", item_counts)):
        bad = np.nonzero((counts > 0) & (counts < f))[0]
        if bad.size:
            raise SingularSystemError(
                f"regularization=0 with {bad.size} {side}(s) having fewer ratings than "
                f"factors={f} (first: {side} {int(bad[0])} with {int(counts[bad[0]])}): "
                "their normal equations are singular; use regularization > 0")
