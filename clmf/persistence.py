"""Saving and loading fitted models (``.npz``, ``allow_pickle=False``)."""
from __future__ import annotations
