"""The geometry of the top-k scan kernel (``cl_kernels/topk.cl.j2``): :class:`TopKConfig`, the
device type's default, the check against the template's constraints and the device's limits, and
the shrink of a configuration until its local memory fits. :mod:`clmf.inference.topk` re-exports
them."""
from __future__ import annotations

import dataclasses

from ..errors import InvalidConfigError

__all__ = ["MAX_K", "TopKConfig", "default_config", "validate"]

MAX_K = 1024                  # longer lists go to the host (local memory per query)


@dataclasses.dataclass(frozen=True)
class TopKConfig:
    """Geometry of the top-k scan kernel (see the template's header).

    wx, wy: work-items along items / queries; rm: queries per work-item; rnv × v: items per
    work-item in vectors of width v; tk: factors staged per step; cap: offered entries buffered
    per query and round; qres: stage the whole query block once (else TK factors per step);
    yt: read the items straight from global memory (no staged item tile; CPUs): 1 transposed
    (f × n), 2 packed in panels of tn items (each panel f × tn, contiguous).
    """
    wx: int = 16
    wy: int = 16
    rm: int = 8
    rnv: int = 2
    v: int = 4
    tk: int = 16
    cap: int = 16
    qres: bool = False
    yt: int = 0

    @property
    def tm(self):
        """Queries per work-group."""
        return self.wy * self.rm

    @property
    def tn(self):
        """Items per tile."""
        return self.wx * self.rnv * self.v

    def ldf(self, f):
        """Padded factor width: a multiple of tk."""
        from ..tuning.spec import leading_dim
        return max(self.tk, leading_dim(f, self.tk))

    def local_bytes(self, f, kp):
        """Local memory of the scan kernel for f factors and lists of kp."""
        tmp, tnp = self.tm + 1, self.tn + (1 if self.v == 1 else self.v)
        qk = self.ldf(f) if self.qres else (1 if self.yt else self.tk)
        mw = -(-self.tn // 32)
        return 4 * (qk * tmp + (0 if self.yt else self.tk * tnp) + 2 * self.tm * kp
                    + 2 * self.tm * self.cap
                    + self.tm + self.tm * mw + 2) + 8 * self.tm

    def __str__(self):
        """``topk:wx=..,wy=..,...`` (parsed back by :meth:`parse`)."""
        return ("topk:" + ",".join(f"{k}={int(getattr(self, k))}"
                                   for k in _FIELDS))

    def to_dict(self):
        """Plain dict (JSON) of the fields."""
        return {k: int(getattr(self, k)) for k in _FIELDS}

    @classmethod
    def from_dict(cls, d):
        """From :meth:`to_dict` output (unknown keys refused)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        bad = set(d) - fields
        if bad:
            raise InvalidConfigError(f"unknown topk config keys {sorted(bad)}", "geometry")
        kw = {k: (bool(v) if k == "qres" else int(v)) for k, v in d.items()}
        return cls(**kw)

    @classmethod
    def parse(cls, s):
        """From ``str(config)``: ``topk:wx=16,wy=16,...``."""
        body = s.split(":", 1)[1] if s.startswith("topk:") else s
        d = {}
        for part in filter(None, body.split(",")):
            k, _, v = part.partition("=")
            d[k.strip()] = int(v)
        return cls.from_dict(d)


_FIELDS = ("wx", "wy", "rm", "rnv", "v", "tk", "cap", "qres", "yt")


def default_config(info):
    """The untuned configuration for a device type (CPUs: small groups, wide vectors)."""
    if info is not None and info.type == "CPU":
        return TopKConfig(wx=1, wy=64, rm=4, rnv=2, v=8, tk=16, cap=16, qres=False, yt=2)
    return TopKConfig()


def validate(cfg: TopKConfig, f, kp, info):
    """Check ``cfg`` against the constraints of the template and the device's limits."""
    if cfg.yt not in (0, 1, 2):
        raise InvalidConfigError(f"yt must be 0, 1 or 2, not {cfg.yt}", "geometry")
    if cfg.v not in (1, 2, 4, 8, 16):
        raise InvalidConfigError(f"vector width {cfg.v} not in 1, 2, 4, 8, 16", "geometry")
    for name in ("wx", "wy", "rm", "rnv", "tk", "cap"):
        if getattr(cfg, name) < 1:
            raise InvalidConfigError(f"{name} must be ≥ 1", "geometry")
    if cfg.rm * cfg.rnv * cfg.v > 64:
        raise InvalidConfigError(f"{cfg.rm * cfg.rnv * cfg.v} scores per work-item > 64 (the "
                                 "pending mask is one 64-bit word)", "geometry")
    if kp < 1 or kp > MAX_K:
        raise InvalidConfigError(f"list length {kp} outside 1..{MAX_K}", "geometry")
    if info is not None:
        wg = cfg.wx * cfg.wy
        if wg > info.max_work_group_size:
            raise InvalidConfigError(f"work-group {wg} > device's {info.max_work_group_size}",
                                     "work_group_size")
        if cfg.wx > info.max_work_item_sizes[0] or cfg.wy > info.max_work_item_sizes[1]:
            raise InvalidConfigError("work-group edges exceed the device's work-item sizes",
                                     "work_item_sizes")
        lb = cfg.local_bytes(f, kp)
        if lb > info.local_mem:
            raise InvalidConfigError(f"topk needs {lb} B of local memory, the device has "
                                     f"{info.local_mem}", "local_memory")
    return True


def _shrink_to_fit(cfg, f, kp, info):
    """``cfg`` with fewer queries per group (then no staged query block) until it fits."""
    c = cfg
    while True:
        try:
            validate(c, f, kp, info)
            return c
        except InvalidConfigError as e:
            if e.reason != "local_memory":
                raise
            if c.qres:
                c = dataclasses.replace(c, qres=False)
            elif c.wy > 1:
                c = dataclasses.replace(c, wy=c.wy // 2)
            elif c.rm > 1:
                c = dataclasses.replace(c, rm=c.rm // 2)
            elif c.cap > 1:
                c = dataclasses.replace(c, cap=max(1, c.cap // 2))
            else:
                raise
