"""argparse types shared by the command line (:mod:`clmf.cli`) and the benchmark's parser
(:mod:`clmf.bench.runner`): a bad value is a usage error (exit 2) naming the option."""
from __future__ import annotations

import argparse
import math

__all__ = ["positive_int", "positive_float"]


def positive_int(text):
    """argparse type: an integer ≥ 1 (else a usage error naming the option)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer ≥ 1, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer ≥ 1, not {text!r}")
    return value


def positive_float(text):
    """argparse type: a finite number > 0 (else a usage error naming the option)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, not {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text!r}")
    return value
