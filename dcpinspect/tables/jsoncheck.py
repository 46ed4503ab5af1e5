r"""Which documents flagged JSON may be invalid, decided in bulk (edge: numpy, pyarrow).

:func:`json_suspects` takes many values at once (slices of one byte buffer)
and marks the ones that may not be valid JSON.  A value it does *not* mark is
one ``json.loads`` accepts, exactly as :func:`~dcpinspect.wire.dissect.dissect`
judges it (``json.loads(value)`` on the bytes, ``ValueError`` and
``RecursionError`` meaning invalid).  A mark costs only time: the row is
dissected one by one, and the dissector says what is wrong.

Theory of operation.  Arrow's JSON reader (RapidJSON underneath) parses
newline-delimited objects at C speed; Python's ``json`` is about ten times
slower.  So the values that look like objects are joined, ``\n`` between
them, into one buffer (a gather done by Arrow: a ``binary_view`` array over
the caller's buffer, cast to ``binary``), and read once with an empty schema.
Where Arrow is more lenient than Python, numpy scans of the same buffer mark
the values; where Arrow is stricter, a value is only marked (or rescued by
``json.loads``).  The rules:

1. *Only objects go to Arrow.*  A value whose first byte other than JSON
   whitespace is not ``{`` or whose last is not ``}`` is marked.  (Arrays,
   scalars, a UTF-8 or UTF-16 byte order mark: ``json.loads`` may accept them;
   they are rare, and the dissector decides.)  Leading and trailing whitespace
   (space, tab, CR, LF, the only whitespace both parsers know) is dropped.
2. *One object per value, proven by the count.*  If Arrow reads the joined
   buffer without error as exactly as many rows as values, every value is one
   object.  No object can straddle a separator: the ``\n`` cannot be inside a
   string (both parsers reject a raw control byte there, and a backslash
   before it is an invalid escape), and outside strings it would follow the
   value's closing ``}`` and precede the next value's ``{`` - which RapidJSON
   rejects inside a container (it wants ``,`` or a closing bracket).  So each
   value holds at least one whole top-level value, and the count makes it one.
   (Arrow's own "same number of rows" is not enough without rule 1: the old
   check passed ``{"a":`` when another value held two objects.)
3. *Where Arrow accepts what Python rejects, a scan marks the value:*
   ``Inf``, ``-Inf``, ``-NaN`` (RapidJSON's NaN/Inf extension takes them,
   Python only ``NaN``, ``Infinity``, ``-Infinity``): any ``Inf`` not followed
   by ``inity``, any ``-NaN``; a run of :data:`DIGIT_RUN` or more digits
   (Python refuses ints of more than 640 digits at its strictest setting; a
   run that long covers a whole aligned block, found by sampling a few bytes
   of each); more than :func:`max_depth` ``{``/``[`` (Python's decoder
   recurses, RapidJSON's does not); bytes that are not strict UTF-8 (Arrow's
   reader does not check them; Arrow's validator does).  Control bytes, NUL
   (which would make ``json.loads`` read UTF-16), comments, trailing commas,
   single quotes, leading zeros: both parsers reject them (the tests prove it).
4. *Where Arrow rejects what Python accepts* (``1e400``, a lone surrogate
   escape ``"\ud800"``), or on any invalid value, the read fails.  Arrow
   names the row: that value is judged by ``json.loads`` and the reading goes
   on after it.  The row number is only a hint: what Arrow read before it
   failed is read again (a value holding two objects would shift the count),
   all of it at once at the end.  After a read that failed soon, the next
   values (more after each such read in a row) go to ``json.loads``.  Ranges of at most :data:`LOADS_MAX` values,
   a failure without a row (bisected), and everything once the reading budget
   (three times the batch) is spent go to ``json.loads``.
5. Values are processed in batches of about :data:`BATCH_BYTES` (memory stays
   bounded; each Arrow read is one block, so its row numbers are exact).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

__all__ = ["BATCH_BYTES", "DIGIT_RUN", "LOADS_MAX", "json_suspects", "loads_ok", "max_depth"]

#: values are checked in batches of about this many bytes
BATCH_BYTES = 8 << 20
#: ranges of at most this many values are judged by ``json.loads`` (an Arrow read costs ~0.1 ms)
LOADS_MAX = 8
#: a digit run this long may be an int Python refuses to read (rule 3)
DIGIT_RUN = sys.int_info.str_digits_check_threshold + 1
#: the aligned block every run of DIGIT_RUN digits covers whole
_DIGIT_BLOCK = (DIGIT_RUN + 1) // 2
#: Arrow read cost of one call, in bytes parsed (for the re-reading budget)
_CALL_BYTES = 64 << 10
#: after a read that failed within this many values, as many (twice as many after each such read in a row, up to
#: 32 times) go to json.loads before the next read
_DENSE = 32

_PARSE = pajson.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore")
_ROW = re.compile(r"in row (\d+)")
_WS = b" \t\n\r"
_OPEN, _CLOSE, _NL = ord("{"), ord("}"), ord("\n")
_I, _N = ord("I"), ord("N")
_SCAN_BLOCK = 1 << 17  # numpy scans run block by block, in cache
_VIEW_INLINE = 12  # binary_view: values up to 12 bytes live in the view itself
_REGION = 1 << 30  # binary_view offsets are int32: the buffer is seen through 1 GiB-aligned windows


def max_depth() -> int:
    """How many ``{``/``[`` a value may hold and still be trusted (Python's ``json`` recurses once per level)."""
    return min(256, sys.getrecursionlimit() // 4)


def loads_ok(value: bytes | memoryview) -> bool:
    """Whether ``json.loads`` accepts ``value`` (as the dissector calls it), with the nesting of :func:`max_depth`."""
    b = bytes(value)
    if b.count(b"{") + b.count(b"[") > max_depth():
        return False
    try:
        json.loads(b)
    except (ValueError, RecursionError):
        return False
    return True


def json_suspects(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Which values ``buf[starts[i] : starts[i] + lens[i]]`` may not be valid JSON (bool per value).

    A value not marked is one ``json.loads`` accepts (see the module's rules).
    """
    buf = np.ascontiguousarray(buf, np.uint8).reshape(-1)
    starts = np.asarray(starts, np.int64).reshape(-1)
    lens = np.asarray(lens, np.int64).reshape(-1)
    n = len(starts)
    bad = np.ones(n, bool)
    if n <= LOADS_MAX:
        for i in range(n):
            a, k = int(starts[i]), int(lens[i])
            bad[i] = k <= 0 or a < 0 or a + k > len(buf) or not loads_ok(buf[a : a + k].data)
        return bad
    s, e, obj = _objects(buf, starts, lens)
    idx = np.flatnonzero(obj)
    if not len(idx):
        return bad
    ends = np.cumsum(e[idx] - s[idx] + 1)
    for lo, hi in _batches(ends):
        sel = idx[lo:hi]
        bad[sel] = _batch(buf, starts[sel], lens[sel], s[sel], e[sel] - s[sel])
    return bad


def _batches(ends: np.ndarray) -> list[tuple[int, int]]:
    """Index ranges of about :data:`BATCH_BYTES` each (``ends``: cumulative sizes)."""
    out = []
    lo = 0
    while lo < len(ends):
        base = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, base + BATCH_BYTES, "right")))
        out.append((lo, hi))
        lo = hi
    return out


def _objects(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rule 1: each value's bounds without surrounding whitespace, and whether it runs from ``{`` to ``}``."""
    s = starts.copy()
    e = starts + lens
    obj = (lens >= 2) & (lens < _REGION) & (starts >= 0) & (e <= len(buf))
    if not obj.any():
        return s, e, obj
    first = buf[np.where(obj, s, 0)]
    last = buf[np.where(obj, e - 1, 0)]
    shaped = obj & (first == _OPEN) & (last == _CLOSE)
    for i in np.flatnonzero(obj & ~shaped).tolist():  # rare: whitespace around, or not an object
        v = bytes(buf[s[i] : e[i]])
        core = v.strip(_WS)
        shaped[i] = core[:1] == b"{" and core[-1:] == b"}"
        s[i] += len(v) - len(v.lstrip(_WS))
        e[i] = s[i] + len(core)
    return s, e, shaped


def _batch(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray, s: np.ndarray, ln: np.ndarray) -> np.ndarray:
    """Rules 2-4 for one batch of object-shaped values (``s``, ``ln``: without whitespace)."""
    data = _join(buf, s, ln)
    offs = np.zeros(len(s), np.int64)
    np.cumsum(ln[:-1] + 1, out=offs[1:])
    arr = np.frombuffer(data, np.uint8)
    bad = _lenient(arr, offs, ln) | _not_utf8(data, offs, ln)

    def loads(j: int) -> bool:
        return loads_ok(buf[starts[j] : starts[j] + lens[j]].data)

    return bad | _unread(data, offs, ln, loads, 3 * (len(arr) + 16 * _CALL_BYTES))


def _join(buf: np.ndarray, s: np.ndarray, ln: np.ndarray) -> pa.Buffer:
    r"""The values joined by ``\n``, gathered by Arrow (a ``binary_view`` array cast to ``binary``)."""
    m = len(s)
    try:
        views = np.zeros((2 * m - 1, 16), np.uint8)
        v32 = views.view("<i4")
        docs, dv = views[0::2], v32[0::2]
        dv[:, 0] = ln
        long = ln > _VIEW_INLINE
        sl = s[long]
        docs[long, 4:8] = buf[sl[:, None] + np.arange(4)]
        dv[long, 2] = sl // _REGION
        dv[long, 3] = sl % _REGION
        short = ~long
        if short.any():
            k = np.arange(_VIEW_INLINE)
            src = s[short][:, None] + k
            inline = buf[np.minimum(src, len(buf) - 1)]
            inline[k >= ln[short][:, None]] = 0
            docs[short, 4:] = inline
        views[1::2, 0] = 1  # the separators: one inline byte each
        views[1::2, 4] = _NL
        regions = [pa.py_buffer(buf[r : r + 2 * _REGION - 1]) for r in range(0, max(len(buf), 1), _REGION)]
        out = pa.Array.from_buffers(pa.binary_view(), 2 * m - 1, [None, pa.py_buffer(views), *regions]).cast(pa.large_binary())
        total = int(ln.sum()) + m - 1
        return out.buffers()[2].slice(0, total)
    except (AttributeError, NotImplementedError, pa.ArrowNotImplementedError):  # an Arrow without binary_view
        mv = buf.data
        return pa.py_buffer(b"\n".join(map(mv.__getitem__, map(slice, s.tolist(), (s + ln).tolist()))))


def _doc_of(offs: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The value holding each joined-buffer position."""
    return np.searchsorted(offs, pos, "right") - 1


def _lenient(arr: np.ndarray, offs: np.ndarray, ln: np.ndarray) -> np.ndarray:
    """Rule 3's scans: Inf/-Inf/-NaN, deep nesting, long digit runs."""
    bad = np.zeros(len(offs), bool)
    pos = _candidates(arr)
    if len(pos):
        c = arr[pos]
        opens = pos[(c != _I) & (c != _N)]
        per_doc = np.diff(np.searchsorted(opens, offs), append=len(opens))  # no '{' or '[' on a separator
        bad |= per_doc > max_depth()
        inf = _followed(arr, pos[c == _I], b"Inf")  # RapidJSON: Inf, -Inf, Infinity, -Infinity
        bad[_doc_of(offs, inf[~_followed_mask(arr, inf, b"Infinity")])] = True
        nan = _followed(arr, pos[(c == _N) & (pos > 0)] - 1, b"-NaN")
        bad[_doc_of(offs, nan)] = True
    bad[_doc_of(offs, _digit_runs(arr))] = True
    return bad


def _followed_mask(arr: np.ndarray, pos: np.ndarray, word: bytes) -> np.ndarray:
    """Whether ``arr[p : p + len(word)] == word`` for each ``p`` (a byte at a time: most fail at once)."""
    ok = np.ones(len(pos), bool)
    live = np.arange(len(pos))
    last = len(arr) - 1
    for k, ch in enumerate(word):
        at = pos[live] + k
        hit = (at <= last) & (arr[np.minimum(at, last)] == ch)
        ok[live[~hit]] = False
        live = live[hit]
    return ok


def _followed(arr: np.ndarray, pos: np.ndarray, word: bytes) -> np.ndarray:
    """The positions ``p`` where ``arr[p : p + len(word)] == word``."""
    return pos[_followed_mask(arr, pos, word)]


def _candidates(arr: np.ndarray) -> np.ndarray:
    """Positions of ``I``, ``N``, ``{`` and ``[`` (one pass, block by block)."""
    out = []
    b = _SCAN_BLOCK
    m, m2, t = np.empty(b, bool), np.empty(b, bool), np.empty(b, np.uint8)
    for off in range(0, len(arr), b):
        x = arr[off : off + b]
        k = len(x)
        mk, mk2, tk = m[:k], m2[:k], t[:k]
        np.equal(x, _I, out=mk)
        np.equal(x, _N, out=mk2)
        mk |= mk2
        np.bitwise_or(x, 0x20, out=tk)  # '[' | 0x20 == '{'
        np.equal(tk, _OPEN, out=mk2)
        mk |= mk2
        out.append(np.flatnonzero(mk) + off)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _digit_runs(arr: np.ndarray) -> np.ndarray:
    """Starts of aligned blocks of :data:`_DIGIT_BLOCK` digits (every run of :data:`DIGIT_RUN` covers one)."""
    b = _DIGIT_BLOCK
    nblk = len(arr) // b
    if not nblk:
        return np.zeros(0, np.int64)
    blocks = np.arange(nblk)
    for probe in range(0, b, 64):  # a few sampled bytes rule out almost every block
        x = arr[probe : nblk * b : b][blocks] - np.uint8(ord("0"))
        blocks = blocks[x < 10]
        if not len(blocks):
            return np.zeros(0, np.int64)
    full = arr[(blocks * b)[:, None] + np.arange(b)] - np.uint8(ord("0"))
    return blocks[(full < 10).all(1)] * b


def _not_utf8(data: pa.Buffer, offs: np.ndarray, ln: np.ndarray) -> np.ndarray:
    """Rule 3: the values that are not strict UTF-8 (Arrow's validator, bisecting down to the values)."""
    m = len(offs)
    bad = np.zeros(m, bool)
    bounds = np.append(offs, offs[-1] + ln[-1])  # value j and the separator after it
    strings = pa.Array.from_buffers(pa.large_string(), m, [None, pa.py_buffer(bounds), data])
    todo = [(0, m)]
    while todo:
        lo, hi = todo.pop()
        try:
            strings.slice(lo, hi - lo).validate(full=True)
        except pa.ArrowInvalid:
            if hi - lo == 1:
                bad[lo] = True
            else:
                mid = (lo + hi) // 2
                todo += [(mid, hi), (lo, mid)]
    return bad


def _read(data: pa.Buffer, a: int, b: int, rows: int) -> tuple[bool, int | None]:
    """Whether Arrow reads ``data[a:b]`` as exactly ``rows`` objects; else the row it failed at, if it says."""
    try:
        t = pajson.read_json(
            pa.BufferReader(data.slice(a, b - a)),
            parse_options=_PARSE,
            read_options=pajson.ReadOptions(use_threads=False, block_size=b - a + 1),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        m = _ROW.search(str(exc))
        return False, int(m.group(1)) if m else None
    return t.num_rows == rows, None


def _unread(data: pa.Buffer, offs: np.ndarray, ln: np.ndarray, loads: Callable[[int], bool], budget: int) -> np.ndarray:
    """Rules 2 and 4: the values Arrow does not read as one object each and ``json.loads`` rejects.

    ``loads(j)`` judges value ``j`` with ``json.loads``; Arrow may read
    ``budget`` bytes in all (a read costs :data:`_CALL_BYTES` more).  What
    Arrow read before a failure is gathered again and read again, until
    nothing is left.
    """
    bad = np.zeros(len(offs), bool)
    ids = np.arange(len(offs))  # the values still to settle, as indices of the first read's
    left = [budget]
    while True:
        found, again = _settle(data, offs, ln, partial(_judge, loads, ids), left)
        bad[ids] = found
        if not len(again):
            return bad
        ids, ln = ids[again], ln[again]
        data = _join(np.frombuffer(data, np.uint8), offs[again], ln)
        offs = np.zeros(len(again), np.int64)
        np.cumsum(ln[:-1] + 1, out=offs[1:])


def _judge(loads: Callable[[int], bool], ids: np.ndarray, j: int) -> bool:
    """``loads`` of value ``j`` of a re-read, by its index in the first read."""
    return loads(int(ids[j]))


def _settle(
    data: pa.Buffer, offs: np.ndarray, ln: np.ndarray, loads: Callable[[int], bool], left: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """One pass of :func:`_unread`: the values found bad, and those Arrow read before a failure (to read again)."""
    m = len(offs)
    bad = np.zeros(m, bool)
    todo = [(0, m)]
    read_before: list[tuple[int, int]] = []
    streak = 0  # reads in a row that failed within _DENSE values
    while todo:
        lo, hi = todo.pop()
        if hi <= lo:
            continue
        a, b = int(offs[lo]), int(offs[hi - 1] + ln[hi - 1])
        if hi - lo <= LOADS_MAX or left[0] <= 0:
            for j in range(lo, hi):
                bad[j] = not loads(j)
            continue
        ok, row = _read(data, a, b, hi - lo)
        if ok:
            left[0] -= b - a + _CALL_BYTES
            streak = 0
            continue
        if row is None or row >= hi - lo:
            left[0] -= b - a + _CALL_BYTES
            mid = (lo + hi) // 2
            todo += [(mid, hi), (lo, mid)]
            continue
        # the row Arrow names is the bad value, unless a value before it held two objects: those are read again
        f = lo + row
        left[0] -= int(offs[f] + ln[f]) - a + _CALL_BYTES  # Arrow stopped in value f or before
        bad[f] = not loads(f)
        g = f + 1
        streak = streak + 1 if f - lo < _DENSE else 0
        if streak:  # failures close together: json.loads is cheaper than a read per value
            g = min(hi, g + (_DENSE << min(streak, 5)))
            for j in range(f + 1, g):
                bad[j] = not loads(j)
        todo.append((g, hi))
        if f > lo:
            read_before.append((lo, f))
        if not todo and len(read_before) == 1:  # one range: read it again from the same buffer
            todo, read_before = read_before, []
    again = np.concatenate([np.arange(lo, hi) for lo, hi in read_before]) if read_before else np.zeros(0, np.int64)
    return bad, again
