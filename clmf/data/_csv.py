"""The one reader of delimited rating files: pyarrow's CSV reader, for every loader.

A file's bytes (gunzipped; a large plain file memory-mapped; a UTF-8 mark skipped; latin-1 where
they are not UTF-8) go to pyarrow without a copy, and only the columns a loader asks for are
converted, by pyarrow, on its threads:

- **by fields** (:func:`read_columns`'s first way): a file with a one-character separator is read
  as CSV, numbers straight into int64 / float64 and ids as dictionary-encoded text (each distinct
  id text parsed once, :func:`parse_ids`); a comma-separated file with ``"`` is read with CSV
  quoting. Whitespace-only lines count as blank.
- **by lines** (the one fallback): a file whose fields pyarrow's CSV reader cannot separate — a
  separator of several characters (``::``), runs of whitespace, lines with extra fields where a
  loader takes them — is read as one text column of lines (every physical line a row), split by
  pyarrow (``split_pattern``, ``utf8_split_whitespace``) and converted as above.

The rules of a field, whichever way it was read (:class:`Converter`): an integer is what pyarrow
reads as int64 (ASCII digits with an optional ``-``, surrounding whitespace ignored) but not a
hexadecimal ``0x..`` (which pyarrow would read); a rating is a finite float; an id column holds
integers where every distinct id text is a canonical ASCII integer (no ``+``, no leading zeros),
else the stripped texts; a timestamp is an integer, float seconds or an ISO date / date-time.
A field that breaks its rule, a line with too few (or, where counted exactly, too many) fields,
raise a ``ValueError`` naming the file and the 1-based line (blank lines counted), computed only
then, from the lines.
"""
from __future__ import annotations

import codecs
import gzip
import logging
import mmap
import os
import re
import zlib
from pathlib import Path

import numpy as np

from ._ids import factorize, take
from .scan import _map, _pool, value_range

logger = logging.getLogger(__name__)

__all__ = ["Source", "read_columns", "parse_ids", "first_record", "split_line", "Converter"]

_BOM = b"\xef\xbb\xbf"
_UTF8_PIECE = 1 << 24          # bytes per step of the UTF-8 check of non-ASCII files
# files of at least this many bytes are memory-mapped, not copied (as with any memory map, a file
# truncated by another process while it is being read ends the reading process with SIGBUS)
_MAP_FROM = 1 << 24
_HEAD = 1 << 16                # characters of the head: the separator sniffer's, the first record's


def _gunzip(path: Path, data: bytes) -> bytes:
    """Decompress gzip ``data`` read from ``path``; a truncated or corrupt stream is a
    ``ValueError`` naming the file (not a bare ``EOFError``/``zlib.error``)."""
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as e:
        raise ValueError(f"{path}: truncated or corrupt gzip file ({type(e).__name__}: {e})") \
            from None


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


def text_lines(text: str) -> list[str]:
    """Split on LF / CRLF / CR only (never on the Unicode breaks str.splitlines knows)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _blank(line: str) -> bool:
    """Whether a line holds no field (empty or whitespace only)."""
    return not line or line.isspace()


class Source:
    """A delimited file's bytes as pyarrow reads them: ``data`` (bytes, or a read-only memory map
    of a large plain file; gzip decompressed), where the text starts (after a UTF-8 mark) and
    whether it is UTF-8 (else latin-1). Its lines (:meth:`lines`) are read on first use."""

    def __init__(self, path: Path, data):
        """Wrap the (decompressed) bytes or memory map ``data`` of ``path``."""
        self.path = Path(path)
        self.data = data
        self.start = 3 if data[:3] == _BOM else 0
        self.utf8 = _is_ascii(data) or _is_utf8(memoryview(data)[self.start:])
        self._lines = None

    @classmethod
    def open(cls, path) -> "Source":
        """Read ``path`` (``FileNotFoundError`` when missing; a corrupt gzip stream is a
        ``ValueError`` naming the file)."""
        path = Path(path)
        with open(path, "rb") as fh:
            magic = fh.read(2)
            if magic == b"\x1f\x8b":
                data = _gunzip(path, magic + fh.read())
            elif os.fstat(fh.fileno()).st_size >= max(_MAP_FROM, 1):
                data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            else:
                data = magic + fh.read()
        return cls(path, data)

    @property
    def encoding(self) -> str:
        """The text's encoding as pyarrow names it."""
        return "utf8" if self.utf8 else "latin1"

    def decode(self, raw: bytes) -> str:
        """Text of some whole characters of the file (a UTF-8 character cut at the end is left
        out)."""
        return raw.decode("utf-8", errors="ignore") if self.utf8 else raw.decode("latin-1")

    def head(self, nchars: int = _HEAD) -> str:
        """The first ``nchars`` characters of the text."""
        return self.decode(self.data[self.start:self.start + 4 * nchars])[:nchars]

    def has(self, *needles: bytes, after: int = 0) -> bool:
        """Whether any of ``needles`` occurs in the text from byte ``after`` of it on."""
        return any(self.data.find(n, self.start + after) >= 0 for n in needles)

    def buffer(self):
        """The text's bytes as a pyarrow buffer (no copy)."""
        import pyarrow as pa
        buf = pa.py_buffer(self.data)
        return buf.slice(self.start) if self.start else buf

    def lines(self):
        """Every physical line of the text (LF, CRLF or CR ended) as a pyarrow string column:
        row k is line k + 1, blank lines included."""
        if self._lines is None:
            import pyarrow as pa
            import pyarrow.csv as pacsv
            free = next((c for c in ("\x1e", "\x1f", "\x1d", "\x1c", "\x01", "\x02")
                         if not self.has(c.encode())), None)
            if free is None:      # every candidate byte occurs: no column separator is free
                raise ValueError(f"{self.path}: cannot read its lines (control characters "
                                 "\\x01, \\x02 and \\x1c-\\x1f all occur in it)")
            table = pacsv.read_csv(
                pa.BufferReader(self.buffer()),
                read_options=pacsv.ReadOptions(column_names=["line"], encoding=self.encoding,
                                               use_threads=True,
                                               block_size=_block_size(len(self.data))),
                parse_options=pacsv.ParseOptions(delimiter=free, quote_char=False,
                                                 double_quote=False, escape_char=False,
                                                 newlines_in_values=False,
                                                 ignore_empty_lines=False),
                convert_options=pacsv.ConvertOptions(column_types={"line": pa.string()},
                                                     strings_can_be_null=False,
                                                     quoted_strings_can_be_null=False,
                                                     null_values=[], check_utf8=False))
            self._lines = table.column(0)
        return self._lines

    def blank_lines(self) -> np.ndarray:
        """Whether each line is blank (empty or whitespace only)."""
        import pyarrow.compute as pc
        lines = self.lines()
        blank = pc.or_(pc.equal(pc.utf8_length(lines), 0), pc.utf8_is_space(lines))
        return blank.to_numpy(zero_copy_only=False).astype(bool)

    def data_linenos(self, after: int) -> np.ndarray:
        """The 1-based numbers of the non-blank lines after line ``after`` (the data rows of a
        file read by fields, in order)."""
        nos = np.flatnonzero(~self.blank_lines()) + 1
        return nos[nos > after]


def split_line(line: str, sep: str | None) -> list[str]:
    """The fields of one line (``sep`` None: runs of whitespace)."""
    return line.split(sep) if sep is not None else line.split()


def first_record(src: Source) -> tuple[int, str] | None:
    """``(line number, text)`` of the first non-blank line, or None for a file without one."""
    lines = text_lines(src.head())
    whole = len(src.data) - src.start <= _HEAD          # the head holds every line
    for k, line in enumerate(lines if whole else lines[:-1]):
        if not _blank(line):
            return k + 1, line
    if whole:
        return None
    nonblank = np.flatnonzero(~src.blank_lines())       # a long blank head: all the lines
    if not nonblank.size:
        return None
    return int(nonblank[0]) + 1, src.lines()[int(nonblank[0])].as_py()


def _block_size(nbytes: int) -> int:
    """pyarrow's block size: a few blocks per core, 1 to 64 MiB (fewer chunks, fewer per-chunk
    dictionaries to unify)."""
    per = nbytes // (4 * (os.cpu_count() or 1))
    return int(min(64 << 20, max(1 << 20, per)))


# ----- the rules of a field --------------------------------------------------------------------
# int() also reads "１" (full-width and other Unicode digits) and "1_0" (underscores): as ids those
# would merge distinct users ("1", "１" and "1_0" all read 1 or 10). Integer ids are ASCII digits
# only and canonical (no "+", no leading zeros: distinct texts, distinct ints).
_NONCANONICAL = re.compile(r"(?:^|\x00)[ \t]*(?:\+|-0|0[0-9])")


def _canonical_integers(values: list[str]) -> bool:
    """Whether every value is a canonical integer of ASCII digits (see :func:`parse_ids`)."""
    joined = "\x00".join(values)
    return joined.isascii() and "_" not in joined and not _NONCANONICAL.search(joined)


def parse_ids(values: list[str]) -> np.ndarray:
    """Distinct id texts as ids: integers when every text is a canonical ASCII integer (within
    int64), else the texts stripped of whitespace and quotes (distinct texts stay distinct ids)."""
    if _canonical_integers(values):
        try:
            return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
        except (ValueError, OverflowError):
            pass
    return np.array([v.strip().strip('"') for v in values], dtype=str)


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


def _map_chunks(fn, chunks):
    """``fn`` over pyarrow chunks on the scan threads, in order."""
    chunks = list(chunks)
    return list(_pool().map(fn, chunks)) if len(chunks) > 1 else [fn(c) for c in chunks]


class Converter:
    """The rules of a field (module docstring) applied to text columns (pyarrow string arrays)
    of one file; ``where(k)`` names the file and line of row ``k`` in an error."""

    def __init__(self, where):
        """Keep the row → ``"file: line N"`` function."""
        self.where = where

    def _fail(self, col, k, what, why):
        """The ``ValueError`` of row ``k``'s field."""
        text = col[k].as_py()
        if why == "is not an integer" and (not text.isascii() or "_" in text):
            why += " (ASCII digits only)"
        return ValueError(f"{self.where(k)}: {what} {text!r} {why}")

    @staticmethod
    def _first_refused(col, convert):
        """The first row of ``col`` that ``convert`` (a pyarrow cast) refuses, found by halving
        (``convert(col)`` refuses some row)."""
        import pyarrow as pa
        lo, hi = 0, len(col)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                convert(col.slice(lo, mid - lo))
                lo = mid
            except pa.ArrowInvalid:
                hi = mid
        return lo

    def _cast(self, col, type_, what, why):
        """``col`` (whitespace trimmed) cast to ``type_`` by pyarrow, as NumPy, or the error of
        the first field it refuses."""
        import pyarrow as pa
        import pyarrow.compute as pc
        trimmed = pc.utf8_trim_whitespace(col)
        try:
            out = pc.cast(trimmed, type_)
        except pa.ArrowInvalid:
            k = self._first_refused(trimmed, lambda c: pc.cast(c, type_))
            raise self._fail(col, k, what, why) from None
        return out.to_numpy()

    def _no_hex(self, col, what, why):
        """Refuse a hexadecimal ``0x..`` field (which pyarrow would read as an integer)."""
        import pyarrow.compute as pc
        hexes = pc.match_substring_regex(col, r"^\s*[+-]?0[xX]")
        if pc.any(hexes).as_py():
            k = int(np.argmax(hexes.to_numpy(zero_copy_only=False)))
            raise self._fail(col, k, what, why)

    def ints(self, col, what):
        """int64 of integer fields (a leading ``+`` allowed, as Python's ``int`` reads it)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        self._no_hex(col, what, "is not an integer")
        unsigned = pc.replace_substring_regex(col, r"^(\s*)\+([0-9])", r"\1\2")
        try:
            return self._cast(unsigned, pa.int64(), what, "is not an integer")
        except ValueError:
            k = self._first_refused(pc.utf8_trim_whitespace(unsigned),
                                    lambda c: pc.cast(c, pa.int64()))
            raise self._fail(col, k, what, "is not an integer") from None

    def floats(self, col, what):
        """float64 of finite number fields."""
        import pyarrow as pa
        out = self._cast(col, pa.float64(), what, "is not a number")
        return self.finite(out, col, what)

    def finite(self, values, col, what):
        """``values`` when all finite, else the error of the first (naming the count)."""
        lo, hi = value_range(values)
        if np.isfinite(lo) and np.isfinite(hi):
            return values
        bad = ~np.isfinite(values)
        raise self._fail(col, int(np.argmax(bad)), what,
                         f"is not finite ({int(bad.sum())} non-finite value(s) in total)")

    def ids(self, col, what):
        """``(ids, int32 index of each row)`` of an id column (text or dictionary-encoded)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        if not pa.types.is_dictionary(col.type):
            col = pa.chunked_array(_map_chunks(pc.dictionary_encode, col.chunks),
                                   pa.dictionary(pa.int32(), pa.string()))
        values, index = _dictionary_column(col)
        uniques, codes = factorize(parse_ids(values), np.int32)
        return uniques, take(codes, index)

    def times(self, col, what):
        """int64 unix seconds of timestamp fields: integers, float seconds or ISO dates."""
        import pyarrow as pa
        import pyarrow.compute as pc
        trimmed = pc.utf8_trim_whitespace(pc.utf8_trim(col, '"'))
        hexes = pc.any(pc.match_substring_regex(trimmed, r"^[+-]?0[xX]")).as_py()
        for type_ in ((pa.int64(),) if not hexes else ()) + (pa.float64(),):
            try:
                out = pc.cast(trimmed, type_).to_numpy()
            except pa.ArrowInvalid:
                continue
            if out.dtype.kind == "f":
                lo, hi = value_range(out)
                if not (np.isfinite(lo) and np.isfinite(hi)):
                    continue
            return out.astype(np.int64)
        stamp = pa.timestamp("s")
        try:
            return pc.cast(pc.cast(trimmed, stamp), pa.int64()).to_numpy()
        except pa.ArrowInvalid:
            pass

        def readable(v):
            """Whether one field is a number or an ISO date (the error's search)."""
            try:
                float(v)
                return "x" not in v.lower()
            except ValueError:
                try:
                    pc.cast(pa.array([v]), stamp)
                    return True
                except pa.ArrowInvalid:
                    return False
        for s0 in range(0, len(trimmed), 1 << 16):
            part = trimmed.slice(s0, 1 << 16).to_pylist()
            k = next((j for j, v in enumerate(part) if not readable(v)), None)
            if k is not None:
                raise self._fail(col, s0 + k, what, "is neither a unix time nor an ISO date")
        k = self._first_refused(trimmed, lambda c: pc.cast(c, stamp))   # numbers and dates
        raise self._fail(col, k, what, "is neither a unix time nor an ISO date (numbers and "
                         "dates mixed)")

    def convert(self, col, kind, what):
        """The column converted by its kind: "int", "float", "id" or "time"."""
        return getattr(self, {"int": "ints", "float": "floats", "id": "ids",
                              "time": "times"}[kind])(col, what)


# ----- reading ---------------------------------------------------------------------------------
def _sep_name(sep):
    """How an error names the separator."""
    return "whitespace" if sep is None else repr(sep)


def _fields_error(path, lineno, text, want, found, sep, count):
    """The ``ValueError`` of a line with a wrong number of fields."""
    return ValueError(
        f"{path}: line {lineno}: expected {want} fields separated by {_sep_name(sep)}, found "
        f"{found}: {text[:200]!r}" + (f" ({count} malformed line(s) in total)" if count > 1
                                      else ""))


def read_columns(src: Source, sep: str | None, *, header_line: int, ncols: int, exact: bool,
                 wanted: list) -> list:
    """Columns of the data rows of ``src``: one result per ``(position, kind, name)`` of
    ``wanted`` (kind "int", "float", "id" or "time", see :class:`Converter`; the name is the
    field's in errors). ``header_line`` is the header's line number (0: none); the first record
    has ``ncols`` fields; with ``exact`` every data line must have ``ncols`` fields, else at
    least as many as the columns wanted need (extra fields ignored). Raises ``ValueError``
    (file and line) for a malformed line or field and for a file without data rows."""
    out = None
    if sep is not None and len(sep) == 1 and sep not in "\r\n\"":
        out = _by_fields(src, sep, header_line, ncols, exact, wanted)
    if out is None:
        out = _by_lines(src, sep, header_line, ncols, exact, wanted)
    return out


def _no_rows(path):
    """The ``ValueError`` of a file without data rows."""
    return ValueError(f"{path}: no ratings found (file is empty or has only a header)")


def _by_fields(src, sep, header_line, ncols, exact, wanted):
    """:func:`read_columns` through pyarrow's CSV reader (numbers typed where that can only
    agree with :class:`Converter`), or None where it cannot read the file by fields (lines with
    extra fields where those are allowed)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    need = max(pos for pos, _, _ in wanted) + 1
    if need > ncols:
        return None                                   # the first record is short: by lines
    quoted = sep == "," and src.has(b'"')
    names = [f"c{k}" for k in range(ncols)]
    after = 0
    if header_line == 1:                              # an 'x' of the header is no hex number
        after = max(0, src.data.find(b"\n", src.start) - src.start)
    hex_possible = src.has(b"x", b"X", after=after)
    # integers (and timestamps, mostly integers) typed by pyarrow unless a hexadecimal number
    # may be among them; a timestamp column of floats or dates makes the read fail, and the
    # fields are read again as text
    whole = pa.string() if hex_possible else pa.int64()
    typed = {"int": whole, "float": pa.float64(), "id": pa.dictionary(pa.int32(), pa.string()),
             "time": whole}
    kinds = {}
    for pos, kind, _ in wanted:                      # a column wanted as two kinds: its text
        kinds[pos] = kind if kinds.get(pos, kind) == kind else "text"
    typed["text"] = pa.string()
    invalid = []

    def on_invalid(row):
        """Skip whitespace-only lines; note the others."""
        if row.text.strip():
            invalid.append((row.actual_columns, row.text))
        return "skip"

    def read(types):
        """The wanted columns, of ``types`` (by kind)."""
        return pacsv.read_csv(
            pa.BufferReader(src.buffer()),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=header_line,
                                           encoding=src.encoding, use_threads=True,
                                           block_size=_block_size(len(src.data))),
            parse_options=pacsv.ParseOptions(delimiter=sep, quote_char='"' if quoted else False,
                                             double_quote=quoted, escape_char=False,
                                             newlines_in_values=False, ignore_empty_lines=True,
                                             invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(
                column_types={names[k]: types[kind] for k, kind in kinds.items()},
                include_columns=[names[k] for k in sorted(kinds)], null_values=[],
                true_values=[], false_values=[], strings_can_be_null=False,
                quoted_strings_can_be_null=False, check_utf8=src.utf8))
    as_text = {kind: (t if kind == "id" else pa.string()) for kind, t in typed.items()}
    try:
        table = read(typed)
    except pa.ArrowInvalid as exc:                    # a field pyarrow refuses: name its line
        logger.debug("%s: %s; reading the fields as text", src.path, exc)
        invalid.clear()
        try:
            table = read(as_text)
        except pa.ArrowInvalid as exc2:
            raise ValueError(f"{src.path}: not a delimited text pyarrow reads ({exc2})") \
                from None
    if invalid:
        bad = [k for k, (n, _) in enumerate(invalid)
               if n < need or ((exact or quoted) and n != ncols)]
        if not bad:
            return None                               # only extra fields: by lines
        n, text = invalid[bad[0]]
        lineno = int(pc.index(src.lines(), text).as_py()) + 1
        raise _fields_error(src.path, lineno, text,
                            ncols if exact or quoted else f"at least {need}", n, sep, len(bad))
    if table.num_rows == 0:
        raise _no_rows(src.path)
    linenos = []

    def where(k):
        """``"file: line N"`` of data row ``k``."""
        if not linenos:
            linenos.append(src.data_linenos(header_line))
        return f"{src.path}: line {int(linenos[0][k])}"
    conv = Converter(where)
    out = []
    texts = {}
    for pos, kind, what in wanted:
        col = table.column(names[pos])
        if kind == "float" and pa.types.is_floating(col.type):
            values = col.to_numpy()
            lo, hi = value_range(values)
            if not (np.isfinite(lo) and np.isfinite(hi)):   # the texts, for the error
                if not texts:
                    texts.update({"t": read(as_text)})
                conv.finite(values, texts["t"].column(names[pos]), what)
            out.append(values)
        elif kind in ("int", "time") and pa.types.is_integer(col.type):
            out.append(col.to_numpy())
        else:
            out.append(conv.convert(col, kind, what))
    return out


def _by_lines(src, sep, header_line, ncols, exact, wanted):
    """:func:`read_columns` from the file's lines, split by pyarrow."""
    import pyarrow as pa
    import pyarrow.compute as pc
    need = max(pos for pos, _, _ in wanted) + 1
    lines = src.lines()
    keep = ~src.blank_lines()
    if header_line:
        keep[header_line - 1] = False
    linenos = np.flatnonzero(keep) + 1
    rows = lines.filter(pa.array(keep))
    if len(rows) == 0:
        raise _no_rows(src.path)
    if sep is None:                                   # as str.split(): no empty edge fields
        fields = pc.utf8_split_whitespace(pc.utf8_trim_whitespace(rows))
    else:
        fields = pc.split_pattern(rows, sep)
    counts = pc.list_value_length(fields).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(counts != ncols) if exact else np.flatnonzero(counts < need)
    if bad.size:
        k = int(bad[0])
        raise _fields_error(src.path, int(linenos[k]), rows[k].as_py(),
                            ncols if exact else f"at least {need}", int(counts[k]), sep,
                            bad.size)
    conv = Converter(lambda k: f"{src.path}: line {int(linenos[k])}")
    return [conv.convert(pc.list_element(fields, pos), kind, what) for pos, kind, what in wanted]
