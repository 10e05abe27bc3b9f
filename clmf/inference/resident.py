"""A model's ranking state kept on its devices: factors in the ranker's layout and the seen items.

:class:`ResidentRanker` holds, per device of the model, a :class:`~clmf.inference.topk.DeviceTopK`
with every item's ranking vector (``y``, or ``[y, b_i]`` with biases) and the ranking vectors of a
contiguous range of users (``x``, or ``[x, 1]``): the users are split over the devices, so
``recommend_all`` and a batched ``recommend`` of a range of users run on all of them at once.
The factors are uploaded once per model (when it is fitted, or on first use after ``load``,
unpickling or a device change) and dropped when the factors change (refit, fold-in).

:class:`SeenItems` is the seen-items matrix (``user_items``) in the kernel's form (sorted
candidate positions, int64 row pointers), prepared and uploaded once per ``(model, user_items,
candidates)``. Whether a later call's ``user_items`` is the same is decided by its fingerprint:

* cheap, checked first: the object (``id``), its shape, ``nnz``, the addresses of its ``indptr``
  and ``indices`` buffers, and ``indptr`` itself (compared in full: O(rows));
* then the content of ``indices``: sums of its 64-bit words in chunks of 4,096 words (8,192
  int32 indices), compared in full. This runs in a host thread while the devices already rank
  (about 25 ms per 10⁸ entries), and a mismatch discards those results and ranks again on a
  freshly uploaded matrix.

So a different matrix, a matrix that grew or shrank (``R[u, i] = 1`` on a new entry,
``eliminate_zeros``), any changed row length and any change of an index value are detected.
Values (``R.data``) do not matter (stored entries count as seen, whatever their value). What
is not detected: an in-place rewrite of ``R.indices`` that keeps every row's length and the
sum of every chunk (e.g. two items exchanged between two rows of the same chunk by direct
writes); after such a write pass a copy, or call ``model.clear_device_cache()``.

:class:`PreparedSeen` prepares the seen items of a fit's training CSR in a host thread while
the fit iterates; the ranker built after the fit adopts and uploads them
(:meth:`ResidentRanker.adopt_seen`), so ``model.fit(R); model.recommend_all(user_items=R)``
finds ``R`` prepared and uploaded (its cheap fingerprint matches, its content is verified while
the devices rank, as for any later call).
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import numpy as np
import scipy.sparse as sp

log = logging.getLogger(__name__)

__all__ = ["ResidentRanker", "SeenItems", "PreparedSeen", "split_rows", "contiguous_range"]

_CHUNK_WORDS = 4096        # 64-bit words per checksum chunk of the seen items' indices
_SPLIT_ROWS = 1024         # queries per device from which a query call splits over the devices


def split_rows(m, weights):
    """Contiguous ``[(r0, r1), ...]`` of ``m`` rows, one per weight, sized in proportion."""
    w = np.asarray(weights, np.float64)
    edges = np.round(np.concatenate([[0.0], np.cumsum(w)]) / w.sum() * m).astype(np.int64)
    edges[-1] = m
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def contiguous_range(ids):
    """``(r0, r1)`` when the ids are ``r0, r0 + 1, ..., r1 - 1`` (at least one), else None."""
    if ids.size == 0:
        return None
    r0 = int(ids[0])
    if int(ids[-1]) - r0 != ids.size - 1:
        return None
    if ids.size > 1 and not np.all(np.diff(ids) == 1):
        return None
    return r0, r0 + ids.size


def _address(a):
    """The data address of a NumPy array."""
    return a.__array_interface__["data"][0]


def _chunk_sums(indices):
    """Sums of the 64-bit words of ``indices`` in chunks of :data:`_CHUNK_WORDS` (the tail and
    an odd last int32 summed apart): the content part of the fingerprint."""
    a = np.ascontiguousarray(indices)
    raw = a.view(np.uint8)
    nw = raw.size // 8
    words = raw[:nw * 8].view(np.uint64)
    full = nw // _CHUNK_WORDS * _CHUNK_WORDS
    head = words[:full].reshape(-1, _CHUNK_WORDS).sum(axis=1) if full else np.zeros(0, np.uint64)
    tail = [int(words[full:].sum()), int(raw[nw * 8:].astype(np.uint64).sum())]
    return np.concatenate([head, np.asarray(tail, np.uint64)])


def _cheap_key(M):
    """The fingerprint's cheap part: object, shape, nnz, buffer addresses."""
    return (id(M), M.shape, int(M.nnz), _address(M.indptr), _address(M.indices),
            M.indptr.dtype.str, M.indices.dtype.str)


class SeenItems:
    """A CSR ``user_items`` in the top-k kernel's form (see the module docstring for the
    fingerprint that decides whether a later matrix is the same one).

    ``row0`` is the user of the matrix's first row (the matrix is indexed by user id: 0; a
    row-aligned slice of users ``r0..r1``: ``r0``); ``candidates`` the sorted candidate items
    (None: all). ``indptr`` (int64) and ``indices`` (int32 candidate positions, sorted in each
    row) are the arrays the devices get."""

    def __init__(self, M, n_items, row0=0, candidates=None):
        """Check ``M`` (a CSR of ``n_items`` columns) and prepare its rows for the kernel."""
        from ..data.validation import check_sparse_structure
        if M.shape[1] != n_items:
            raise ValueError(f"user_items has {M.shape[1]} columns but the model has {n_items} "
                             "items: pass a matrix with one column per model id")
        self.key = _cheap_key(M)
        self.n = int(n_items)
        self.row0 = int(row0)
        self.rows = int(M.shape[0])
        self.candidates = None if candidates is None else np.asarray(candidates, np.int64)
        # three passes over the entries, in threads (NumPy and SciPy release the GIL): the
        # structure check, the fingerprint's sums, the kernel's form
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            check = pool.submit(check_sparse_structure, M, "user_items")
            sums = pool.submit(_chunk_sums, M.indices)
            check.result()                     # a malformed matrix is refused first
            self.indptr_copy = np.array(M.indptr, copy=True)
            self.indptr, self.indices = seen_positions(M, self.candidates, n_items)
            self.sums = sums.result()

    def same(self, M, row0, candidates):
        """The fingerprint's cheap part and the call's row offset and candidates match."""
        if self.row0 != int(row0) or _cheap_key(M) != self.key:
            return False
        c = self.candidates
        if (c is None) != (candidates is None) or (
                c is not None and not np.array_equal(c, candidates)):
            return False
        return np.array_equal(M.indptr, self.indptr_copy)

    def same_content(self, M):
        """The chunk sums of ``M.indices`` are the prepared ones (O(nnz), GIL released)."""
        return np.array_equal(_chunk_sums(M.indices), self.sums)

    def covers(self, r0, r1):
        """Whether users ``r0..r1`` have rows here."""
        return self.row0 <= r0 and r1 <= self.row0 + self.rows


class PreparedSeen:
    """The :class:`SeenItems` of a CSR (all users from 0, all candidates) prepared in a host
    thread: :meth:`start` begins, :meth:`result` waits and gives it (None when it failed),
    :meth:`close` waits and drops everything (no thread is left running)."""

    def __init__(self, M):
        """Keep the CSR ``M`` to prepare; nothing runs before :meth:`start`."""
        self._M = M
        self._thread = None
        self._seen = None

    def start(self):
        """Begin the preparation in a thread (once; later calls do nothing)."""
        if self._thread is None and self._M is not None:
            self._thread = threading.Thread(target=self._run, name="clmf-seen-items",
                                            daemon=True)
            self._thread.start()

    def _run(self):
        """The thread: prepare, keeping None on any failure (the caller prepares on use)."""
        try:
            self._seen = SeenItems(self._M, self._M.shape[1])
        except Exception as e:
            log.debug("preparing the training matrix's seen items failed (%s); prepared on "
                      "first use", e)

    def result(self):
        """The prepared :class:`SeenItems` (after waiting for the thread), or None when the
        preparation failed or never started."""
        if self._thread is None:
            return None
        self._thread.join()
        return self._seen

    def close(self):
        """Wait for the thread, then drop the matrix and the result."""
        if self._thread is not None:
            self._thread.join()
        self._M = self._seen = None


def seen_positions(M, candidates, n):
    """``(indptr int64, indices int32)`` of the CSR ``M`` with columns as candidate positions
    (others dropped), sorted in each row: no copy of ``indices`` when ``M`` already is that
    (int32, sorted, all candidates)."""
    if candidates is None:
        # a fresh wrapper (no copy): SciPy caches has_sorted_indices on the object, which an
        # in-place change of M.indices would leave stale
        M = sp.csr_matrix((M.data, M.indices, M.indptr), shape=M.shape, copy=False)
        indices = M.indices
        if not M.has_sorted_indices:
            M = M.copy()
            M.sort_indices()
            indices = M.indices
        if indices.dtype != np.int32:
            indices = indices.astype(np.int32)
        return M.indptr.astype(np.int64, copy=False), indices
    from .topk import _to_positions
    P = _to_positions(sp.csr_matrix(M), candidates, n)
    return P.indptr.astype(np.int64, copy=False), P.indices.astype(np.int32, copy=False)


class ResidentRanker:
    """The ranking vectors of a model on its devices (see the module docstring).

    ``Xq`` (users) and ``Yq`` (items) are the ranking vectors; ``devices`` the model's
    devices; the users are split over them in proportion to their compute units."""

    def __init__(self, Xq, Yq, devices, handed=None):
        """Upload the items to every device and each device's range of users (the devices
        at once, a thread each). ``handed``: a one-device fit's factor buffers
        (:func:`clmf.engine.factors.hand_over`), kept instead of uploads where they fit."""
        from ..engine.device import device_info
        from .topk import DeviceTopK
        self.m, self.n = Xq.shape[0], Yq.shape[0]
        self.f = Yq.shape[1]
        weights = [max(1, device_info(d).compute_units) for d in devices]
        spans = split_rows(self.m, weights)

        def part(d, r0, r1):
            """One device's items and users."""
            h = handed if handed is not None and len(devices) == 1 else {}
            return {"dtk": DeviceTopK(Yq, d, handed=h.get("items")).set_queries(
                        Xq[r0:r1], handed=h.get("users")),
                    "rows": (r0, r1), "seen": None}
        self.parts = _each(part, [(d, r0, r1) for d, (r0, r1) in zip(devices, spans)])
        self.seen = None                   # the SeenItems last prepared
        self.last_split = []               # per device: the last iter_rank's records
        log.debug("resident ranker: %d users × %d items (f %d) on %d device(s)", self.m,
                  self.n, self.f, len(self.parts))

    @property
    def first(self):
        """The first device's :class:`DeviceTopK` (the one small calls use)."""
        return self.parts[0]["dtk"]

    def query(self, Q, N, candidates=None, exclude=None):
        """:meth:`DeviceTopK.query <clmf.inference.topk.DeviceTopK.query>` of the query vectors
        ``Q`` (any users: a batched ``recommend`` of ids that are not a range) against the
        items, their rows split over the devices in proportion to their compute units (a
        thread each) when every device gets at least :data:`_SPLIT_ROWS`; ``exclude`` is a
        CSR with one row per query."""
        b = Q.shape[0]
        if len(self.parts) == 1 or b < _SPLIT_ROWS * len(self.parts):
            return self.first.query(Q, N, candidates, exclude)
        from ..engine.device import device_info
        spans = split_rows(b, [max(1, device_info(p["dtk"].device).compute_units)
                               for p in self.parts])
        ex = None if exclude is None else sp.csr_matrix(exclude)
        got = _each(lambda p, a, z: p["dtk"].query(Q[a:z], N, candidates,
                                                   None if ex is None else ex[a:z]),
                    [(p, a, z) for p, (a, z) in zip(self.parts, spans)])
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])

    def host_threshold(self):
        """The first device's measured host threshold (see :meth:`DeviceTopK.host_threshold
        <clmf.inference.topk.DeviceTopK.host_threshold>`)."""
        return self.first.host_threshold()

    def seen_for(self, M, row0, candidates):
        """``(SeenItems, reused)`` for ``M``: the prepared one when its cheap fingerprint
        matches (``reused``: its content is still to be verified), else a new one."""
        s = self.seen
        if s is not None and s.same(M, row0, candidates):
            return s, True
        self.forget_seen()                 # the old arrays go before the new are built
        s = self.seen = SeenItems(M, self.n, row0, candidates)
        return s, False

    def forget_seen(self):
        """Drop the prepared seen items (host and devices; a query running in another thread
        keeps its own until it ends)."""
        self.seen = None
        for p in self.parts:
            p["seen"] = None

    def adopt_seen(self, seen):
        """Make ``seen`` (a :class:`SeenItems` of every user, all candidates) the prepared seen
        items and upload it to every device, as a first call would: a later call whose
        ``user_items`` matches its fingerprint uses it as it is. On a failure (e.g. the
        devices' allocation limit) nothing is kept and the error is raised."""
        if (seen.row0, seen.rows, seen.n) != (0, self.m, self.n) or seen.candidates is not None:
            raise ValueError(f"seen items of rows {seen.row0}..{seen.row0 + seen.rows} and "
                             f"{seen.n} items for a ranker of {self.m} users × {self.n} items")
        self.forget_seen()
        try:
            _each(self._upload_seen, [(p, seen) for p in self.parts])
        except BaseException:
            self.forget_seen()
            raise
        self.seen = seen

    def _upload_seen(self, part, seen):
        """``(Exclusion, user of its first row)``: the rows of ``seen`` for the part's users on
        its device, uploaded once per prepared matrix."""
        got = part["seen"]
        if got is not None and got[0] is seen:
            return got[1], got[2]
        r0, r1 = part["rows"]
        a = max(r0, seen.row0) - seen.row0
        b = max(a, min(r1, seen.row0 + seen.rows) - seen.row0)
        part["seen"] = None                # the old one's memory goes first
        ex = part["dtk"].upload_exclude(seen.indptr[a:b + 1], seen.indices, seen.candidates)
        part["seen"] = (seen, ex, seen.row0 + a)
        return ex, seen.row0 + a

    def iter_rank(self, r0, r1, N, candidates=None, seen=None, batch_rows=None, ordered=True,
                  out=None, max_batch=None):
        """Yield ``(user0, ids, scores)`` for users ``r0..r1``: top-``N`` of their resident
        vectors against the candidates, ``seen`` (a :class:`SeenItems` covering the users) left
        out. Several devices rank their users at once (a thread each) and hand over each batch
        as it is finished: ``ordered`` yields the batches in user order (a later device's wait
        until the earlier ones are out), else as they come. With ``out`` (ids and scores, a row
        per user ``r0..r1``) each device's thread writes its users' lists there (the batches
        yielded are views of it). Where each device's time went is kept as :attr:`last_split`
        (:meth:`split_summary`)."""
        jobs = [(p, max(r0, p["rows"][0]), min(r1, p["rows"][1])) for p in self.parts]
        jobs = [j for j in jobs if j[2] > j[1]]
        self.last_split = split = []
        if not jobs:
            return
        t0 = time.perf_counter()

        def stream(p, a, b, rec):
            """The part's batches for users a..b, as global users; its trace goes to ``rec``."""
            from .trace import QueryTrace
            dtk, q0 = p["dtk"], p["rows"][0]
            rec["trace"] = trace = QueryTrace()
            dst = None if out is None else (out[0][a - r0:b - r0], out[1][a - r0:b - r0])
            if seen is not None:
                ex, e_row0 = self._upload_seen(p, seen)
                gen = dtk.iter_query(None, N, candidates, ex, rows=(a - q0, b - q0),
                                     batch_rows=batch_rows, exclude_row0=a - e_row0,
                                     trace=trace, out=dst, max_batch=max_batch)
            else:
                gen = dtk.iter_query(None, N, candidates, None, rows=(a - q0, b - q0),
                                     batch_rows=batch_rows, trace=trace, out=dst,
                                     max_batch=max_batch)
            for b0, ids, sc in gen:
                yield a + b0, ids, sc

        for p, a, b in jobs:
            split.append({"device": p["dtk"].info.name, "users": (a, b), "t0": t0})
        if len(jobs) == 1:
            split[0]["start"] = time.perf_counter()
            try:
                yield from stream(*jobs[0], split[0])
            finally:
                split[0]["end"] = time.perf_counter()
            return
        yield from _merge_streams([lambda j=j, r=r: stream(*j, r) for j, r in zip(jobs, split)],
                                  split, ordered)

    def split_summary(self):
        """Per device of the last :meth:`iter_rank`: its users, its thread's start and end
        (seconds from the call's start) and its :meth:`QueryTrace.summary
        <clmf.inference.trace.QueryTrace.summary>`; plus ``"devices_overlap"``: the sum of the
        devices' busy seconds over the union of their busy intervals (1: one device at a
        time, up to the number of devices)."""
        from .trace import union_seconds
        out, spans = [], []
        for r in getattr(self, "last_split", []):
            tr = r.get("trace")
            d = {"device": r["device"], "users": list(r["users"]),
                 "thread_start_s": r.get("start", r["t0"]) - r["t0"],
                 "thread_end_s": r.get("end", r["t0"]) - r["t0"]}
            if tr is not None:
                d.update(tr.summary(r["t0"]))
                spans += tr.intervals
            out.append(d)
        u = union_seconds(spans)
        busy = sum(d.get("device_busy_s", 0.0) for d in out)
        return {"devices": out, "devices_overlap": busy / u if u > 0 else None}


def _each(fn, args):
    """``[fn(*a) for a in args]``, the calls in threads of their own when there are several
    (the devices' uploads release the GIL); the first failure is raised after all ended."""
    if len(args) < 2:
        return [fn(*a) for a in args]
    with concurrent.futures.ThreadPoolExecutor(len(args), thread_name_prefix="clmf-up") as pool:
        futs = [pool.submit(fn, *a) for a in args]
    return [f.result() for f in futs]


def _merge_streams(makers, records, ordered):
    """Run each generator that ``makers`` build in a thread of its own and yield their items:
    in the makers' order (``ordered``), else as they come. Each thread's start and end go to
    its record; a failure in one stops the others and is raised here; closing this generator
    stops them all (each ends its batch in flight) before it returns."""
    import queue
    q = queue.Queue()
    stop = threading.Event()
    done = object()

    def run(i):
        """Thread ``i``: its items into the queue, then ``done`` (or the exception)."""
        records[i]["start"] = time.perf_counter()
        gen = None
        try:
            gen = makers[i]()
            for item in gen:
                q.put((i, item))
                if stop.is_set():
                    break
            q.put((i, done))
        except BaseException as e:
            q.put((i, e))
        finally:
            if gen is not None:
                gen.close()
            records[i]["end"] = time.perf_counter()

    held = [[] for _ in makers]        # ordered: items of later streams, until their turn
    live = set(range(len(makers)))
    turn = 0
    with concurrent.futures.ThreadPoolExecutor(len(makers),
                                               thread_name_prefix="clmf-rank") as pool:
        for i in range(len(makers)):
            pool.submit(run, i)
        try:
            while live:
                i, item = q.get()
                if item is done:
                    live.discard(i)
                elif isinstance(item, BaseException):
                    raise item
                elif not ordered or i == turn:
                    yield item
                else:
                    held[i].append(item)
                while ordered and turn not in live and turn < len(makers):
                    turn += 1                  # the stream is finished: the next one's turn
                    if turn < len(makers):
                        yield from held[turn]
                        held[turn] = []
        finally:
            stop.set()
