"""What a tuning run tunes (:class:`Case`: a device, a data set, f, storage and mode) and where
its journals live by default; the runs themselves are in :mod:`clmf.autotune.strategies`."""
from __future__ import annotations

import dataclasses

from clmf import tuning
from clmf.cache import cache_dir

__all__ = ["Case", "default_state_dir"]


@dataclasses.dataclass
class Case:
    """What is tuned: a device, a data set (users × items CSR), f and the storage dtype."""
    device: object
    R: object
    f: int
    dataset: str = "data"
    storage: str = "float32"
    mode: str = "explicit"
    alpha: float = 1.0

    def __post_init__(self):
        import scipy.sparse as sp

        from clmf.engine.device import device_info
        if self.mode not in tuning.MODES:
            raise ValueError(f"unknown tuning mode {self.mode!r}; choose from {tuning.MODES}")
        if self.mode == "implicit" and not self.alpha > 0:
            raise ValueError(f"implicit feedback needs alpha > 0, not {self.alpha!r}")
        self.R = sp.csr_matrix(self.R)
        self.R.sort_indices()
        if self.mode == "implicit" and self.R.nnz and self.R.data.min() < 0:
            raise ValueError("implicit feedback needs non-negative strengths")
        self.alpha = float(self.alpha)
        self.info = device_info(self.device)
        self.key = tuning.device_record(self.info)
        self.dataset_class = tuning.dataset_class(self.R)

    @property
    def kf(self):
        """Unknowns per system the kernels solve (f, or f + 1 with biases)."""
        return tuning.kernel_factors(self.f, self.mode)

    @property
    def width(self):
        """Width of a factor row on the device (f, or f + 2 with biases)."""
        return tuning.factor_width(self.f, self.mode)

    def mode_fields(self):
        """The mode keys of this case's records."""
        return {"mode": self.mode, **({"alpha": self.alpha} if self.mode == "implicit" else {})}

    def default_solver(self, cfg):
        """``cfg`` with the solver an untuned fit of this mode uses."""
        s = tuning.MODE_DEFAULT_SOLVER.get(self.mode)
        return cfg.replace(solver=s) if s else cfg

    def side_class(self, side):
        """The data-set class oriented to ``side`` (rows = the side's rows)."""
        c = dict(self.dataset_class)
        if side == "items":
            for a, b in (("row_mean", "col_mean"), ("row_max", "col_max"),
                         ("skew_rows", "skew_cols")):
                c[a], c[b] = c[b], c[a]
        c["rows"], c["cols"] = (c["m"], c["n"]) if side == "users" else (c["n"], c["m"])
        c["name"] = self.dataset
        return c


def default_state_dir():
    """Where tuning journals live by default: ``tune-state`` in clmf's cache directory."""
    return cache_dir() / "tune-state"
