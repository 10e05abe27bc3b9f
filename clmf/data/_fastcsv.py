"""Reading delimited files with pyarrow's multithreaded CSV reader (when pyarrow is installed),
column by column as the line-by-line parser of :mod:`._text` would read them.

The file is memory-mapped (a gzip file decompressed into memory), a UTF-8 mark skipped, and handed
to pyarrow without a copy. Numeric columns are read as int64 / float64; id columns as
dictionary-encoded text, so that the line parser's own functions read each distinct id text once
(same ids, same id maps, whatever the texts look like: ``01``, ``0x1f``, ``1e5``, ``１`` stay
what the line parser makes of them).
Whatever pyarrow would not read exactly as the line parser does gives None and the caller takes the
line-by-line path, which names the problem with its line number: a file that is not UTF-8, quotes
(with a comma separator), whitespace-only lines, a ragged line, a field that is not a plain number,
NaN or ±inf, a hexadecimal integer (pyarrow reads ``0x1f`` as 31, Python's ``int`` refuses it),
an empty result."""
from __future__ import annotations

import codecs
import logging
import mmap
import os
from pathlib import Path

import numpy as np

from ._text import _gunzip
from .scan import _map, _pool, value_range

logger = logging.getLogger(__name__)

__all__ = ["RawText", "read_raw", "read_columns"]

_BOM = b"\xef\xbb\xbf"
_UTF8_PIECE = 1 << 24          # bytes per step of the UTF-8 check of non-ASCII files
# files of at least this many bytes are memory-mapped, not copied (as with any memory map, a file
# truncated by another process while it is being read ends the reading process with SIGBUS)
_MAP_FROM = 1 << 24


def _is_ascii(data) -> bool:
    """Whether ``data`` (bytes, or a memory map checked in chunks over the scan threads) is
    ASCII."""
    if isinstance(data, bytes):
        return data.isascii()
    arr = np.frombuffer(data, np.uint8)
    return all(_map(lambda s, e: bool(arr[s:e].max(initial=0) < 0x80), len(arr)))


def _is_utf8(data: memoryview) -> bool:
    """Whether ``data`` decodes as UTF-8 (checked in pieces: no whole-file string is made)."""
    dec = codecs.getincrementaldecoder("utf-8")()
    try:
        for s in range(0, len(data), _UTF8_PIECE):
            dec.decode(data[s:s + _UTF8_PIECE])
        dec.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


class RawText:
    """A delimited file's bytes as the line parser sees them (gunzipped; ``data`` is bytes or a
    read-only memory map), where they start (after a UTF-8 mark), and whether they are UTF-8
    (else the line parser reads latin-1)."""

    def __init__(self, path: Path, data):
        """Wrap the (decompressed) bytes or memory map ``data`` of ``path``."""
        self.path = path
        self.data = data
        self.start = 3 if data[:3] == _BOM else 0
        self.utf8 = _is_ascii(data) or _is_utf8(memoryview(data)[self.start:])

    def _decode(self, raw: bytes) -> str:
        """Text of some whole characters of the file, decoded as the line parser decodes it."""
        return raw.decode("utf-8", errors="ignore") if self.utf8 else raw.decode("latin-1")

    def head(self, nchars: int = 65536) -> str:
        """The first ``nchars`` characters of the text (what the separator sniffer reads)."""
        return self._decode(self.data[self.start:self.start + 4 * nchars])[:nchars]

    def first_line(self) -> str | None:
        """The first line of the text, or None when it is blank or ends in a lone CR (then the
        line parser's idea of the first line is left to the line parser)."""
        end = self.data.find(b"\n", self.start)
        raw = self.data[self.start:] if end < 0 else self.data[self.start:end]
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        if b"\r" in raw:
            return None
        line = self._decode(raw)
        if not line or line.isspace():
            return None
        return line

    def has(self, *needles: bytes, after_first_line: bool = False) -> bool:
        """Whether any of ``needles`` occurs in the text (or in the text after its first line)."""
        start = self.start
        if after_first_line:
            start = self.data.find(b"\n", start)
            if start < 0:
                return False
        return any(self.data.find(n, start) >= 0 for n in needles)


def read_raw(path: Path) -> RawText | None:
    """The file's bytes (gzip-aware; a large plain file memory-mapped) as :class:`RawText`, or
    None when it cannot be read (the line parser then names the problem: a missing file, a
    truncated or corrupt gzip stream)."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
            if magic == b"\x1f\x8b":
                data = _gunzip(path, magic + fh.read())
            elif os.fstat(fh.fileno()).st_size >= max(_MAP_FROM, 1):
                data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            else:
                data = magic + fh.read()
    except (OSError, ValueError):
        return None
    return RawText(path, data)


def _block_size(nbytes: int) -> int:
    """pyarrow's block size: a few blocks per core, 1 to 64 MiB (fewer chunks, fewer per-chunk
    dictionaries to unify)."""
    per = nbytes // (4 * (os.cpu_count() or 1))
    return int(min(64 << 20, max(1 << 20, per)))


def _ints_from_text(col):
    """int64 values of a column read as text, or None when a value is not one pyarrow and Python's
    ``int`` both read the same way (hexadecimal, or anything pyarrow refuses); chunk by chunk over
    the scan threads."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def chunk_ints(chunk):
        """The chunk's int64 values, or None."""
        if pc.any(pc.match_substring(chunk, "x", ignore_case=True)).as_py():
            return None
        return pc.cast(chunk, pa.int64()).to_numpy(zero_copy_only=False)
    chunks = col.chunks
    parts = list(_pool().map(chunk_ints, chunks)) if len(chunks) > 1 else list(map(chunk_ints,
                                                                                   chunks))
    if any(p is None for p in parts):
        return None
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _dictionary_column(col):
    """``(distinct texts, int32 index of each row's text)`` of a dictionary-encoded column (the
    per-block dictionaries unified by pyarrow)."""
    import pyarrow as pa
    col = pa.table({"c": col}).unify_dictionaries().column(0)
    if col.num_chunks == 0:
        return [], np.empty(0, np.int32)
    values = col.chunk(0).dictionary.to_pylist()
    index = np.empty(len(col), np.int32)
    pos = 0
    for chunk in col.chunks:
        n = len(chunk)
        index[pos:pos + n] = chunk.indices.to_numpy(zero_copy_only=False)
        pos += n
    return values, index


def read_columns(raw: RawText, sep: str, ncols: int, header: bool, kinds: dict[int, str]):
    """Columns of a file of ``ncols`` fields per line, by position: ``kinds`` maps a position to
    ``"int"`` (int64 array), ``"float"`` (finite float64 array) or ``"id"`` (``(distinct texts,
    int32 index per row)``). None when the file is not one pyarrow reads exactly as the line
    parser does (see the module docstring)."""
    if len(sep) != 1 or sep in "\r\n" or not raw.utf8:
        return None
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:
        return None
    names = [f"c{k}" for k in range(ncols)]
    hex_possible = raw.has(b"x", b"X", after_first_line=header)
    kind_types = {"int": pa.string() if hex_possible else pa.int64(), "float": pa.float64(),
                  "id": pa.dictionary(pa.int32(), pa.string())}
    buf = pa.py_buffer(raw.data)
    if raw.start:
        buf = buf.slice(raw.start)
    try:
        table = pacsv.read_csv(
            pa.BufferReader(buf),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1 if header else 0,
                                           use_threads=True, block_size=_block_size(buf.size)),
            parse_options=pacsv.ParseOptions(delimiter=sep, quote_char=False, double_quote=False,
                                             escape_char=False, newlines_in_values=False,
                                             ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(
                column_types={names[k]: kind_types[t] for k, t in kinds.items()},
                include_columns=[names[k] for k in kinds], null_values=[], true_values=[],
                false_values=[], strings_can_be_null=False, quoted_strings_can_be_null=False,
                check_utf8=True))
        if table.num_rows == 0:
            return None
        out = {}
        for k, kind in kinds.items():
            col = table.column(names[k])
            if col.null_count:
                return None
            if kind == "id":
                out[k] = _dictionary_column(col)
            elif kind == "int" and hex_possible:
                out[k] = _ints_from_text(col)
                if out[k] is None:
                    return None
            else:
                out[k] = col.to_numpy()
                if kind == "float" and not _all_finite(out[k]):
                    return None
    except (pa.ArrowException, OSError, ValueError) as exc:
        logger.debug("%s: not read by pyarrow (%s); parsing line by line", raw.path, exc)
        return None
    return out


def _all_finite(values: np.ndarray) -> bool:
    """Whether every value is finite (min and max over the scan threads)."""
    lo, hi = value_range(values)
    return bool(np.isfinite(lo) and np.isfinite(hi))
