"""One fit over several devices, and over data larger than a device.

The pieces, bottom up (each usable on its own — the Dask backend runs the same workers in
worker processes and exchanges through Dask instead of host memory):

``partition`` — :func:`balanced_blocks` (row blocks of equal work: prefix sums of per-row
    ``n_r + f/3``, searchsorted, int64), :func:`make_plan` → :class:`Plan` (per side a
    :class:`SidePlan`: ``bounds`` — device ``d`` solves rows ``[bounds[d], bounds[d+1])`` — and
    ``mode``, ``"replicate"`` the fixed factor or ``"reduce"`` partial normal equations, chosen by
    :func:`choose_modes`, whose docstring has the rule), :func:`chunk_rows`.
``layout`` — :class:`Layout`: both sides of the ratings as CSR on the host (``users``: the CSR,
    ``items``: the CSC), int64 ``indptr``, int32 ``indices``, float32 ``data``, any array-likes
    (numpy arrays or memory maps); :func:`transpose_csr` (parallel counting sort).
``memory`` — the one memory planner is :func:`clmf.engine.memory.plan_device` →
    :class:`DevicePlan` (re-exported here): per side resident or streamed chunks, bytes per
    buffer, computed from shapes, configurations and the device's limits before any device
    work; raises :class:`clmf.DeviceMemoryError` with the bytes needed.
``worker`` — :func:`device_engine`: the one device engine, :class:`clmf.engine.Engine`, on a
    device's share of the plan (:func:`device_share`: the rows it solves, the factor rows it
    holds, its memory plan), built from ``(index, device, layout, plan, device_plan, f, ldf,
    {"users": cfg, "items": cfg}, implicit_alpha, biased, offset)``; it uploads its blocks (or
    streams them per half-step), holds the factor rows it needs, and offers

    - ``write_rows(side, host, r0, r1)`` / ``read_rows(side, host, r0, r1)``: factor rows
      (global numbering) between the device and a padded host array ``(rows, ldf)``;
    - ``half_step(side, regularization, weighted, exchange)``: solves its rows of ``side``; with
      ``exchange.needed`` it copies each solved batch into ``exchange.host`` and calls
      ``exchange.publish(index, r0, r1)``, and uploads every chunk other devices publish, as
      they arrive (an :class:`Exchange` per half-step; a Dask exchange implements the same
      ``publish`` / ``finish`` / ``take`` / ``fail`` / ``host``/``needed``);
    - reduce mode (the fixed factor partitioned), in process: :func:`clmf.engine.reduce.pipelined`
      computes the partial normal equations of every row of ``side`` over the device's block of
      the fixed side (its ``sources[side]``, from :func:`partial_layout`), packed (the
      hermitian's lower triangle and the right side), segment by segment; ``reducer`` —
      :class:`~clmf.parallel.reducer.Reducer` hands each segment to the device that solves it:
      by default (``MultiEngine(reduce_sum="device")``) that device keeps its own partials of
      the segment in its ring, uploads each other device's copy as it lands on the host and
      sums them as it unpacks; with ``reduce_sum="host"`` host threads sum the devices' copies
      and the owner uploads the sum. The owner unpacks (λ·n_r and the Gram matrix added) and solves
      the segment while the others still compute, then exchanges its rows like ``half_step``.
      The Dask backend runs the same pipeline in two phases (``pipelined(...,
      partials=False)`` for the second), the packed systems summed between its tasks
      (:class:`~clmf.parallel.reducer.PartialsPort`, :class:`~clmf.parallel.reducer.SummedPort`);
    - ``squared_error(key, users, items, ratings, offset)``, ``finish()``, ``release()``,
      ``times``.
``backend`` — :func:`make_backend` chooses: one device runs one :class:`clmf.engine.Engine` on
    every row (resident or streamed as its plan says), several a :class:`MultiEngine` (an
    engine per device, modes by :func:`fit_modes`); the object ``ALS.fit`` drives:
    ``set_factors``, ``iteration``, ``finish``, ``squared_error``, ``get_factors``,
    ``release``, ``memory``, ``time_split()`` (several devices).
:func:`select_devices` (from :mod:`clmf.engine.device`): ``ALS(device=[...])``, ``"gpu:all"``,
    ``"cpu:all"``.
``generate`` — :func:`synthetic_layout`: the Hugewiki / 4×-Netflix shapes built as a
    :class:`Layout` block by block in threads (no whole-set COO).
``scaling`` — ``timed_fit``, ``scaling_rows``, ``render_scaling`` (``clmf bench --scaling`` and
    ``benchmarks/scale_runs.py``; not imported by the package: it uses the estimator's tuning
    lookup, and the estimator imports this package).

A Dask backend runs one :class:`clmf.engine.Engine` per device in worker processes (each with the
layout blocks its plan assigns — only ``layout[side].entries(r0, r1)`` and ``counts()`` are
read), and passes an exchange object of its own whose ``publish``/``take`` move the chunks.
"""
from ..engine.device import select_devices
from ..engine.memory import DevicePlan, SideMemory, plan_device
from .backend import MultiEngine, common_ldf, fit_modes, make_backend, partial_layout, plan_fit
from .generate import synthetic_layout
from .layout import Layout, SideLayout, transpose_csr
from .partition import (
                        Plan,
                        SidePlan,
                        balanced_blocks,
                        choose_modes,
                        chunk_rows,
                        make_plan,
                        row_weights,
)
from .worker import Exchange, device_engine, device_share

__all__ = ["MultiEngine", "make_backend", "common_ldf", "partial_layout", "plan_fit",
           "synthetic_layout",
           "select_devices", "Layout",
           "SideLayout", "transpose_csr", "DevicePlan", "SideMemory", "plan_device", "Plan",
           "SidePlan", "balanced_blocks", "choose_modes", "chunk_rows", "make_plan",
           "row_weights", "Exchange", "device_engine", "device_share", "fit_modes"]
