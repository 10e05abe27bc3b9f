"""Ctrl-C at any point of a fit, a save or a recommend: what must finish is not cut short.

A ``KeyboardInterrupt`` lands wherever the main thread is. In the middle of a fit the device may
still be running kernels that read and write buffers and host arrays (CPU runtimes read the
ratings and write the factors in place); freeing those before the kernels end crashes the
process or overwrites memory it reuses. So every release first waits for the queues
(:func:`drain`), with Ctrl-C held back meanwhile (:func:`deferred_interrupts`) and raised once
the wait is over.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading

log = logging.getLogger(__name__)

__all__ = ["deferred_interrupts", "drain"]


@contextlib.contextmanager
def deferred_interrupts():
    """Hold SIGINT (Ctrl-C) back while the block runs, then deliver it as it would have been
    (a ``KeyboardInterrupt`` with Python's handler). Only the main thread of the main
    interpreter receives signals; elsewhere the block simply runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    try:
        old = signal.getsignal(signal.SIGINT)
        if old is None:              # a handler not installed from Python: left alone
            raise ValueError("SIGINT handler not set from Python")
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except (ValueError, TypeError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if held:
            if callable(old):
                old(signal.SIGINT, None)          # Python's handler raises KeyboardInterrupt
            elif old == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


def drain(*queues):
    """Wait for every command enqueued on ``queues`` (pyopencl command queues; None skipped),
    Ctrl-C held back until all have ended. A queue whose wait fails (a runtime error of an
    earlier command) is logged and the others are still waited for; the first such error is
    raised at the end."""
    first = None
    with deferred_interrupts():
        for q in queues:
            if q is None:
                continue
            try:
                q.finish()
            except Exception as e:  # noqa: BLE001 - the other queues must still be drained
                log.debug("waiting for a command queue failed: %s", e)
                first = first or e
    if first is not None:
        raise first
