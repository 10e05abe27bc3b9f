"""Tuning databases and choosing a kernel configuration for a device, side and data set.

:mod:`.spec` holds the fit specification (:class:`FitSpec`: widths, leading dimension, mode,
weighted-λ and confidence rules, in one home), :mod:`.schema` the record keys shared with the
tuner, :mod:`.database` reads and writes the
JSON Lines databases, :mod:`.lookup` applies the fallback chain (:func:`choose`), :mod:`.fallback`
rejects (once, with a :class:`TuningFallbackWarning`) and probes configurations that cannot run.
The search and measurement that produce tunings are :mod:`clmf.autotune`.
"""
from .database import (
                       Database,
                       base_record,
                       clmf_commit,
                       database_paths,
                       is_gzip,
                       now,
                       read_database,
                       records_bytes,
                       shipped_paths,
                       user_db_path,
)
from .fallback import TuningFallbackWarning
from .lookup import choose, class_distance, dataset_class, heuristic, incumbent
from .resolver import resolve
from .schema import (
                       BASELINE,
                       CLASS_TOL,
                       ENV_DB,
                       ENV_NO_SHIPPED,
                       MODE_DEFAULT_SOLVER,
                       MODES,
                       SCHEMA_VERSION,
                       SIDES,
                       Choice,
                       TuningDatabaseWarning,
                       device_record,
                       device_slug,
                       record_mode,
)
from .spec import FitSpec, factor_width, fit_mode, kernel_factors, side_stats

__all__ = ["Choice", "choose", "incumbent", "heuristic", "BASELINE", "SCHEMA_VERSION", "CLASS_TOL",
           "MODES",
           "MODE_DEFAULT_SOLVER", "fit_mode", "record_mode", "kernel_factors", "factor_width",
           "TuningDatabaseWarning", "dataset_class", "class_distance", "device_record",
           "device_slug", "database_paths", "user_db_path", "shipped_paths", "read_database",
           "records_bytes", "is_gzip",
           "Database", "base_record", "now", "clmf_commit", "ENV_DB", "ENV_NO_SHIPPED", "SIDES",
           "TuningFallbackWarning", "FitSpec", "side_stats", "resolve"]
