"""The kernel configuration of each side of a fit on one device: the tuning lookup's choice
(``variant="auto"``) or the caller's variant as given (:func:`resolve`)."""
from __future__ import annotations

import re

from ..engine.config import KernelConfig
from ..errors import InvalidConfigError
from .lookup import choose
from .schema import MODE_DEFAULT_SOLVER, SIDES, Choice

__all__ = ["resolve", "given_config"]


def resolve(spec, device, stats):
    """``{side: Choice}`` of a fit of ``spec`` (a :class:`clmf.tuning.FitSpec`) on ``device`` (a
    ``pyopencl.Device`` or its :class:`clmf.engine.device.DeviceInfo`) for data of ``stats``
    (``{side: clmf.tuning.side_stats(...)}``): per side, the tuning lookup's choice
    (:func:`clmf.tuning.choose`, tunings of the fit's mode first) where the variant is
    ``"auto"``, else the caller's variant as given (:func:`given_config`)."""
    info = _info(device)
    out = {}
    for side, v in zip(SIDES, spec.variant):
        if isinstance(v, str) and v == "auto":
            out[side] = choose(info, spec.f, side, stats[side], spec.storage or "float32",
                               spec.lookup_solver, mode=spec.mode)
        else:
            out[side] = given_config(spec, v)
    return out


def _info(device):
    """The :class:`DeviceInfo` of a device (or the info itself)."""
    from ..engine.device import DeviceInfo, device_info
    return device if isinstance(device, DeviceInfo) else device_info(device)


def given_config(spec, v):
    """The caller's variant ``v`` as a :class:`Choice` (rule ``explicit``), used as given:
    a solver or storage it names is kept, and one that contradicts the ``solver`` /
    ``storage`` parameter is refused (:class:`InvalidConfigError`, reason ``"conflict"``),
    never replaced. What it leaves open is filled in and said in the reason: the ``solver``
    parameter, else the mode's untuned default (:data:`clmf.tuning.MODE_DEFAULT_SOLVER`:
    the fused CG for implicit feedback, Cholesky otherwise); the ``storage`` parameter."""
    mode = spec.mode
    cfg = KernelConfig.parse(v)
    text = v if isinstance(v, str) else None           # a KernelConfig names every field

    def names(k):           # whether the variant names parameter k
        return text is None or re.search(rf"[:,]\s*{k}\s*=", text) is not None
    notes = []
    given = spec.solver
    if names("solver"):
        if given is not None and given != cfg.solver:
            raise InvalidConfigError(
                f"variant {str(v)!r} names solver={cfg.solver} but solver={given!r} was "
                "given: drop one of them (a given variant is used as is, never changed)",
                "conflict")
    else:
        s = given or MODE_DEFAULT_SOLVER.get(mode, KernelConfig.solver)
        if s != cfg.solver:
            cfg = cfg.replace(solver=s)
        notes.append(f"solver={s} (" + ("the solver parameter" if given else
                                        f"the {mode} default: the variant names none") + ")")
    if spec.storage is not None and cfg.storage != spec.storage:
        if names("storage"):
            raise InvalidConfigError(
                f"variant {str(v)!r} names storage={cfg.storage} but storage="
                f"{spec.storage!r} was given: drop one of them", "conflict")
        cfg = cfg.replace(storage=spec.storage)
        notes.append(f"storage={spec.storage} (the storage parameter)")
    return Choice(cfg, "explicit", "variant given by the caller"
                  + ("; " + ", ".join(notes) if notes else ""))
