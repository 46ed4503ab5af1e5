"""The frames table as Arrow record batches, built a column at a time (edge: numpy, pyarrow).

:func:`chunk_batch` turns a :class:`~dcpinspect.flows.records.RecordChunk` into one
``pyarrow.RecordBatch`` with the columns of :data:`~dcpinspect.tables.columns.FRAME_COLUMNS`,
equal row for row to what :class:`~dcpinspect.tables.columns.FrameColumns` builds by
dissecting every frame - only faster:

* the 24-byte headers of all frames are read at once into numpy arrays;
* frames are grouped by (magic, opcode, extras length, status, context); for
  each group the protocol table picks the layout once (the same
  :func:`~dcpinspect.wire.dissect.select_variant`
  :func:`~dcpinspect.wire.dissect.dissect` uses), and the extras are read for the
  whole group through a numpy dtype made from the layout's struct;
* every rule :func:`~dcpinspect.wire.dissect.dissect` could break for that layout
  (the table's typed rules - zero/non-zero, order, flag combinations - the flag
  and enum values, CAS and datatype
  rules, key and value presence, LEB128 collection ids, JSON documents) is
  *tested* on the arrays; a row that may break one - and every row of a layout
  this module does not vectorise (stream ids, system events, FlatBuffers,
  xattrs, snappy, the session commands, the UPR draft, garbage and gaps) - is
  dissected one by one, exactly as before.

So problem messages come only from ``dissect``: this module decides which
rows are provably clean, never what their problems are.  JSON documents are
validated in bulk by :func:`~dcpinspect.tables.jsoncheck.json_suspects` (Arrow's
JSON parser behind guards that leave every case where Arrow and Python's
``json`` could disagree to ``json.loads``), unless the caller turns the check
off: the ``json_check`` column then says ``not checked``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from ..flows.reassembly import TS_MAX, TS_UNKNOWN
from ..flows.records import RecordChunk, gc_paused
from ..protocol import spec
from ..protocol.enums import Datatype, Magic, Status
from ..protocol.fields import (
    ENUM,
    FLAGS,
    ContextIs,
    Exclusive,
    ExtrasLength,
    FieldIs,
    NonZero,
    OnlyWith,
    Order,
    Requires,
    Rule,
    ValueLength,
    Variant,
    Zero,
)
from ..wire.dissect import GENERIC, command_names, select_variant
from ..wire.dissection import DissectContext
from ..wire.events import Frame
from .columns import DCP_COLUMNS, FRAME_COLUMNS, FRAME_VALUE_COLUMNS, JSON_NOT_CHECKED, JSON_VALID, FrameColumns, dcp_values
from .jsoncheck import json_suspects

__all__ = [
    "HEADER_DTYPE",
    "SCHEMA",
    "VECTOR_RULES",
    "FrameRows",
    "arrow_schema",
    "chunk_batch",
    "chunk_rows",
    "header_array",
    "record_batches",
    "set_columns",
    "ts_array",
    "value_columns",
]

_TYPES = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "timestamp[ns]": pa.timestamp("ns", tz="UTC"),
    "list<string>": pa.list_(pa.string()),
}
_NUMPY = {"uint8": "u1", "uint16": "u2", "uint32": "u4", "uint64": "u8", "int32": "i4", "int64": "i8"}


def arrow_schema() -> pa.Schema:
    """The frames table's Arrow schema (from :data:`~dcpinspect.tables.columns.FRAME_COLUMNS`)."""
    return pa.schema([pa.field(name, _TYPES[typ], metadata={"description": desc}) for name, typ, desc in FRAME_COLUMNS])


SCHEMA = arrow_schema()


_STRUCT_CHARS = {"B": "u1", "H": ">u2", "I": ">u4", "Q": ">u8", "b": "i1", "h": ">i2", "i": ">i4", "q": ">i8"}


def _header_dtype() -> np.dtype:
    """The protocol table's header struct (``spec.HEADER``) as a numpy record, one field per struct letter."""
    names = ("magic", "opcode", "keylen", "extlen", "datatype", "vbs", "bodylen", "opaque", "cas")
    chars = spec.HEADER.format.lstrip(">")
    return np.dtype([(n, _STRUCT_CHARS[c]) for n, c in zip(names, chars, strict=True)])


#: a frame's 24-byte header as numpy reads it (from ``spec.HEADER``): magic, opcode, keylen, extlen, datatype, vbs, bodylen, opaque, cas
HEADER_DTYPE = _header_dtype()
_ROW = np.arange(spec.HEADER_SIZE)
_JSON = int(Datatype.JSON)
_PACKED = int(Datatype.SNAPPY | Datatype.XATTR)  # a document that only dissect reads (compressed, or xattrs first)
_CLASSIC = (Magic.CLIENT_REQUEST, Magic.CLIENT_RESPONSE)  # the alt magics carry framing extras (stream ids, durability)
_RESPONSE_MAGICS = tuple(int(m) for m in (Magic.CLIENT_RESPONSE, Magic.ALT_CLIENT_RESPONSE, Magic.SERVER_RESPONSE))


@dataclass(frozen=True)
class _Plan:
    """How a group of frames is read without dissecting each (None: dissect each)."""

    name: str
    role: str
    variant: Variant
    dtype: np.dtype[Any] | None
    key_kind: str  # "doc" (cid may be split), "must" (key required), "none" (must be empty), "any"
    split_cid: bool
    value_kind: str  # "doc" (document; may be empty), "doc!" (must not be empty), "empty", "any"
    status_name: str | None


_PLANS: dict[tuple[int, int, int, int, DissectContext], _Plan | None] = {}


def _dtype(v: Variant) -> np.dtype[Any] | None:
    st = v.extras_struct
    if st is None:
        return None
    chars = st.format.lstrip(">")
    if any(ch not in _STRUCT_CHARS for ch in chars):
        return None
    dt = np.dtype([(name, _STRUCT_CHARS[ch]) for name, ch in zip(v.extras_names, chars, strict=True)])
    return dt if dt.itemsize == v.extras_len else None


def _plan(magic: int, opcode: int, extlen: int, status: int, ctx: DissectContext, rep: Frame) -> _Plan | None:
    """The group's layout, if every frame of the group can be read from arrays (see the module doc)."""
    if magic not in _CLASSIC:  # framing extras (stream ids, durability): dissect
        return None
    response = magic == Magic.CLIENT_RESPONSE
    if response and status != Status.SUCCESS:
        return None
    cmd, name, _title = command_names(opcode, magic)
    if cmd is None or (cmd.obsolete and not response):
        return None
    if cmd.sid == "stream" and ctx.stream_ids and not response:
        return None  # "stream id missing"
    variants = cmd.response if response else cmd.request
    if any(_per_frame_layout(v, extlen) for v in variants):
        return None
    chosen = select_variant(variants, rep[1][24 : 24 + extlen], status if response else None)
    if chosen is None or chosen is GENERIC:
        return None
    dt: np.dtype[Any] | None = None
    if extlen:
        if not chosen.extras or extlen != chosen.extras_len:
            return None
        dt = _dtype(chosen)
        if dt is None:
            return None
    elif chosen.extras and not chosen.any_extras:
        return None
    if any(isinstance(r, ContextIs) and r.violated({}, ctx) for r in chosen.rules):
        return None
    kk = chosen.key
    if kk in ("doc", "doc?"):
        key_kind = "must" if kk == "doc" else "any"
    elif kk in ("none", "any"):
        key_kind = kk
    else:
        return None
    split = kk in ("doc", "doc?") and bool(ctx.collections)
    vk = chosen.value_kind
    if vk == "fields":
        if chosen.value:
            return None
        value_kind = "empty"
    elif vk == "doc":
        value_kind = "doc!" if chosen.value_required else "doc"
    elif vk == "none":
        value_kind = "empty"
    elif vk == "any":
        value_kind = "any"
    else:
        return None
    status_name = spec.STATUS.get(status, f"unknown 0x{status:04x}") if response else None
    return _Plan(name, "response" if response else "request", chosen, dt, key_kind, split, value_kind, status_name)


def _per_frame_layout(v: Variant, extlen: int) -> bool:
    """Whether frames with this extras length may or may not be of ``v`` depending on more than the length (a field, the value length)."""
    if not all(c.holds(extlen, None, None, None) for c in v.conditions if isinstance(c, ExtrasLength)):
        return False
    others = [c for c in v.conditions if isinstance(c, (FieldIs, ValueLength))]
    return bool(others) and not (any(isinstance(c, FieldIs) for c in others) and v.extras_len != extlen)


def _suspect_extras(plan: _Plan, ext: np.ndarray | None, cas: np.ndarray, datatype: np.ndarray) -> np.ndarray:
    """Rows of one group that may break one of the layout's rules (they are dissected)."""
    v = plan.variant
    bad = np.zeros(len(cas), bool)
    if v.cas == "zero":
        bad |= cas != 0
    elif v.cas == "nonzero":
        bad |= cas == 0
    if v.datatypes is not None:
        bad |= ~np.isin(datatype, np.fromiter(v.datatypes, np.int64))
    if ext is None:
        return bad
    names = v.extras_names
    for i, _off, f in v.extras_checked:
        col = ext[names[i]].astype(np.uint64)
        if f.invalid:
            if f.kind == FLAGS:
                bits = 0
                for bit in f.invalid:
                    bits |= bit
                bad |= (col & np.uint64(bits)) != 0
            else:
                bad |= np.isin(col, np.array(list(f.invalid), np.uint64))
        if f.strict and f.names is not None:
            if f.kind == FLAGS:
                known = 0
                for bit in f.names:
                    known |= bit
                bad |= (col & ~np.uint64(known)) != 0
            elif f.kind == ENUM:
                ok = list(f.names) + list(f.invalid or ())
                bad |= ~np.isin(col, np.array(ok, np.uint64))
    for rule in v.rules:
        if isinstance(rule, ContextIs):
            continue  # settled per group (see _plan)
        test = VECTOR_RULES.get(type(rule))
        if test is None or rule.field not in names or (isinstance(rule, Order) and rule.high not in names):
            bad[:] = True  # a rule this module does not know, or on a field of the value: dissect
        else:
            bad |= test(rule, ext)
    return bad


def _flag_column(ext: np.ndarray, name: str) -> np.ndarray:
    return ext[name].astype(np.uint64)


def _has(col: np.ndarray, bits: int) -> np.ndarray:
    return (col & np.uint64(bits)) != 0


#: the vectorised twin of each rule's ``violated``: rule, extras columns -> rows that break it
VECTOR_RULES: dict[type[Rule], Callable[[Any, np.ndarray], np.ndarray]] = {
    Zero: lambda r, ext: ext[r.field] != 0,
    NonZero: lambda r, ext: ext[r.field] == 0,
    Order: lambda r, ext: ext[r.field] > ext[r.high],
    Exclusive: lambda r, ext: _has(_flag_column(ext, r.field), r.bit) & _has(_flag_column(ext, r.field), r.other),
    Requires: lambda r, ext: _has(_flag_column(ext, r.field), r.bit) & ~_has(_flag_column(ext, r.field), r.needs),
    OnlyWith: lambda r, ext: _has(_flag_column(ext, r.field), r.bit) & ((_flag_column(ext, r.field) & ~np.uint64(r.allowed)) != 0),
}


def _gather(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length slices of ``buf`` as (int32 offsets, bytes) for an Arrow binary array."""
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        idx = np.repeat(starts - offsets[:-1], lens) + np.arange(total)
        data = buf[idx]
    else:
        data = np.zeros(0, np.uint8)
    return offsets.astype(np.int32), data


@dataclass
class FrameRows:
    """The rows of one batch, in order, as the column builder takes them.

    ``frame_rows`` are the rows that are mcbp frames, read from arrays: frame
    ``j`` (row ``frame_rows[j]``) is ``joined[starts[j] : starts[j] + lens[j]]``,
    at ``offsets[j]`` in its byte stream, dissected in ``contexts[ctx_codes[j]]``.
    Every other row (garbage, gaps, truncated frames, the UPR draft), and every
    frame not proven clean, comes from ``dissect_rows(rows)``: a
    :class:`~dcpinspect.tables.columns.FrameColumns` holding exactly those rows,
    in that (ascending) order.  ``json_check`` off leaves documents flagged JSON
    unchecked (their ``json_check`` column says so).
    """

    n: int
    frame_rows: np.ndarray
    joined: bytes
    starts: np.ndarray
    lens: np.ndarray
    offsets: np.ndarray
    ctx_codes: np.ndarray
    contexts: list[DissectContext]
    dissect_rows: Callable[[np.ndarray], FrameColumns]
    json_check: bool = True


@dataclass
class _Arrays:
    """The mcbp frames of a batch as arrays: their bytes and header fields."""

    rows: FrameRows
    buf: np.ndarray
    h: np.ndarray  # the headers (HEADER_DTYPE records)
    vbs: np.ndarray
    bodylen: np.ndarray
    opaque: np.ndarray
    cas: np.ndarray
    keylen: np.ndarray
    response: np.ndarray

    def frame(self, j: int) -> Frame:
        """Frame ``j`` as an event (a group's representative, for the layout's choice)."""
        r = self.rows
        s = int(r.starts[j])
        return Frame(int(r.offsets[j]), r.joined[s : s + int(r.lens[j])])


@dataclass
class _Groups:
    """What the groups' plans found: names per group, the rows to dissect, keys, collection ids, DCP columns."""

    names: list[str]
    roles: list[str]
    status_names: list[str | None]
    ginv: np.ndarray  # row -> group
    slow: np.ndarray  # rows not proven clean
    key_start: np.ndarray
    key_len: np.ndarray
    cid: np.ndarray
    has_cid: np.ndarray
    extras_cols: dict[str, tuple[np.ndarray, np.ndarray]]  # column -> (values, set?)
    json: np.ndarray  # per frame: 0 no document flagged JSON, 1 checked (valid), 2 not checked


def value_columns(rows: FrameRows) -> dict[str, pa.Array]:
    """The columns a frame fills (``type``, ``offset``, ``length`` and :data:`~dcpinspect.tables.columns.FRAME_VALUE_COLUMNS`) of ``rows``."""
    a = _header_arrays(rows)
    g = _group_plans(a)
    fast = np.zeros(rows.n, bool)
    fast[rows.frame_rows] = True
    # the rows dissected one by one: garbage, gaps, truncated, and every frame not proven clean
    sidx = np.sort(np.concatenate((np.flatnonzero(~fast), rows.frame_rows[g.slow])))
    slow_cols = rows.dissect_rows(sidx) if len(sidx) else FrameColumns()
    return _frame_columns(a, g, sidx, slow_cols)


def chunk_batch(chunk: RecordChunk, *, json_check: bool = True) -> pa.RecordBatch:
    """One :class:`RecordChunk` as an Arrow record batch of the frames table."""
    cols = value_columns(chunk_rows(chunk, json_check=json_check))
    cols.update(_record_columns(chunk))
    return pa.RecordBatch.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)


def chunk_rows(chunk: RecordChunk, *, json_check: bool = True) -> FrameRows:
    """The rows of a chunk for :func:`value_columns`."""
    n = len(chunk)
    events = chunk.events
    if set(map(type, events)) == {Frame} and set(map(_DIALECT, events)) == {"mcbp"}:  # the common case, at C speed
        fidx = np.arange(n)
        fevents = events
        contexts = chunk.context
    else:
        fidx = np.flatnonzero(np.fromiter((e.__class__ is Frame and e[2] == "mcbp" for e in events), bool, n))
        fevents = [events[i] for i in fidx]
        contexts = [chunk.context[i] for i in fidx]
    raws: list[bytes] = list(map(_RAW, fevents))
    m = len(raws)
    lens = np.fromiter(map(len, raws), np.int64, m)
    starts = np.zeros(m, np.int64)
    if m:
        np.cumsum(lens[:-1], out=starts[1:])
    ctx_ids = np.fromiter(map(id, contexts), np.int64, m)
    uniq, first, codes = np.unique(ctx_ids, return_index=True, return_inverse=True)
    ctx_list = [contexts[i] for i in first.tolist()]

    def dissect_rows(rows: np.ndarray) -> FrameColumns:
        want = set(rows.tolist())
        cols = FrameColumns()
        for rec in chunk.records():
            if rec.number - chunk.first_number in want:
                cols.add(rec)
        return cols

    del uniq
    return FrameRows(
        n,
        fidx,
        b"".join(raws),
        starts,
        lens,
        np.fromiter(map(_OFFSET, fevents), np.int64, m),
        codes.reshape(-1).astype(np.int64),
        ctx_list,
        dissect_rows,
        json_check,
    )


def header_array(buf: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The headers of the frames at ``starts`` in ``buf`` (bytes as uint8), read at once: records of :data:`HEADER_DTYPE`."""
    if not len(starts):
        return np.zeros(0, HEADER_DTYPE)
    return buf[starts[:, None] + _ROW].view(HEADER_DTYPE).reshape(-1)


def _header_arrays(rows: FrameRows) -> _Arrays:
    """The 24-byte headers of every mcbp frame, read at once."""
    buf = np.frombuffer(rows.joined, np.uint8)
    h = header_array(buf, rows.starts)
    vbs, bodylen, opaque, cas = (h[f].astype(h[f].dtype.newbyteorder("=")) for f in ("vbs", "bodylen", "opaque", "cas"))
    keylen = h["keylen"].astype(np.int64)
    response = np.isin(h["magic"], _RESPONSE_MAGICS)
    return _Arrays(rows, buf, h, vbs, bodylen, opaque, cas, keylen, response)


def _group_plans(a: _Arrays) -> _Groups:
    """Group the frames by (context, magic, opcode, extras length, status of a response); read each group by its plan."""
    rows = a.rows
    m = len(rows.starts)
    h = a.h
    magic, opcode, extlen, datatype = h["magic"], h["opcode"], h["extlen"], h["datatype"]
    ctx_inv = rows.ctx_codes
    gkey = (
        (ctx_inv.astype(np.int64) << 40)
        | (magic.astype(np.int64) << 32)
        | (opcode.astype(np.int64) << 24)
        | (extlen.astype(np.int64) << 16)
        | np.where(a.response, a.vbs, 0).astype(np.int64)
    )
    gkeys, gfirst, ginv = _groups_of(gkey)
    slow = (datatype & ~np.uint8(spec.DATATYPE_MASK)) != 0
    key_start = rows.starts + 24 + extlen
    g = _Groups([], [], [], ginv, slow, key_start, a.keylen.copy(), np.zeros(m, np.uint32), np.zeros(m, bool), {}, np.zeros(m, np.int8))
    v0 = key_start + a.keylen
    ends = rows.starts + rows.lens
    json_rows: list[np.ndarray] = []
    for i, first in enumerate(gfirst.tolist()):
        k = int(gkeys[i])
        plan_key = (k >> 32 & 0xFF, k >> 24 & 0xFF, k >> 16 & 0xFF, k & 0xFFFF, rows.contexts[int(ctx_inv[first])])
        plan = _PLANS.get(plan_key, ...)
        if plan is ...:
            if len(_PLANS) > 4096:  # hostile captures: many odd groups
                _PLANS.clear()
            plan = _PLANS[plan_key] = _plan(*plan_key, a.frame(first))
        g.names.append(plan.name if plan else "")
        g.roles.append(plan.role if plan else "")
        g.status_names.append(plan.status_name if plan else None)
        grows = np.flatnonzero(ginv == i)
        if plan is None:
            slow[grows] = True
        else:
            jr = _read_group(plan, int(k >> 24 & 0xFF), grows, a, g, ends - v0)
            if len(jr):
                json_rows.append(jr)
    if json_rows:
        jr = np.concatenate(json_rows)
        if rows.json_check:
            slow[jr[json_suspects(a.buf, v0[jr], (ends - v0)[jr])]] = True
            g.json[jr] = 1
        else:
            g.json[jr] = 2
    return g


def _groups_of(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(keys, return_index=True, return_inverse=True)`` for many rows of few distinct keys (hashed, not sorted)."""
    uniq = np.sort(np.unique(keys))  # numpy hashes integers when no index is asked for
    inv = np.searchsorted(uniq, keys)
    first = np.empty(len(uniq), np.int64)
    first[inv[::-1]] = np.arange(len(keys) - 1, -1, -1)  # the last write wins: each group's first row
    return uniq, first, inv


def _read_group(plan: _Plan, opcode: int, rows: np.ndarray, a: _Arrays, g: _Groups, vlen: np.ndarray) -> np.ndarray:
    """Read one group's rows by its plan: mark those that may break a rule slow; the JSON documents to validate."""
    buf = a.buf
    datatype = a.h["datatype"]
    starts = a.rows.starts
    ext = None
    if plan.dtype is not None:
        el = plan.dtype.itemsize
        ext = buf[(starts[rows] + 24)[:, None] + np.arange(el)].view(plan.dtype).reshape(-1)
        ext = ext.astype(plan.dtype.newbyteorder("="))
    bad = _suspect_extras(plan, ext, a.cas[rows], datatype[rows])
    kl = a.keylen[rows]
    vl = vlen[rows]
    if plan.key_kind == "must":
        bad |= kl == 0
    elif plan.key_kind == "none":
        bad |= kl != 0
    if plan.split_cid:
        first_byte = buf[np.minimum(g.key_start[rows], len(buf) - 1)]
        bad |= (kl > 0) & (((first_byte & 0x80) != 0) | (kl == 1))  # a one-byte LEB128 id (no continuation bit) and a key after it
        withkey = kl > 0
        g.cid[rows] = np.where(withkey, first_byte, 0)
        g.has_cid[rows] = withkey
        g.key_start[rows] += withkey
        g.key_len[rows] -= withkey
    json_rows = np.zeros(0, np.int64)
    dt = datatype[rows]
    flagged = (vl > 0) & ((dt & _JSON) != 0)
    if plan.value_kind == "empty":
        bad |= vl != 0
    elif plan.value_kind in ("doc", "doc!"):
        if plan.value_kind == "doc!":
            bad |= vl == 0
        bad |= (vl > 0) & ((dt & _PACKED) != 0)
        json_rows = rows[flagged & ~bad]
    else:
        bad |= flagged  # a value flagged JSON that is not a document: dissect says what it is
    g.slow[rows[bad]] = True
    if ext is not None:
        m = len(starts)
        for col, values in dcp_values(opcode, plan.role == "response", {nm: ext[nm] for nm in ext.dtype.names or ()}, {}).items():
            if col not in g.extras_cols:
                g.extras_cols[col] = (np.zeros(m, np.dtype(_NUMPY[_COLTYPE[col]])), np.zeros(m, bool))
            arr, isset = g.extras_cols[col]
            arr[rows] = values
            isset[rows] = True
    return json_rows


_JSON_CHECK = pa.array(np.array([None, JSON_VALID, JSON_NOT_CHECKED], object), pa.string())  # not from a list: that imports pandas


def _frame_columns(a: _Arrays, g: _Groups, sidx: np.ndarray, slow_cols: FrameColumns) -> dict[str, pa.Array]:
    """The columns a frame fills: the clean rows from the arrays, the others from ``slow_cols``, in row order."""
    h = a.h
    rows = a.rows
    ok = ~g.slow
    fi = rows.frame_rows[ok]
    n = rows.n
    order = np.concatenate((fi, sidx))
    take = np.empty(n, np.int64)
    take[order] = np.arange(n)
    take_arr = pa.array(take) if len(sidx) else None
    gi = pa.array(g.ginv[ok])
    resp_ok = a.response[ok]
    fast_cols: dict[str, Any] = {
        "type": pa.repeat(pa.scalar("frame"), len(fi)),
        "offset": rows.offsets[ok],
        "length": rows.lens[ok],
        "magic": h["magic"][ok],
        "opcode": h["opcode"][ok],
        "name": pa.array(g.names, pa.string()).take(gi),
        "role": pa.array(g.roles, pa.string()).take(gi),
        "vbucket": pa.array(a.vbs[ok], mask=resp_ok),
        "status": pa.array(a.vbs[ok], mask=~resp_ok),
        "status_name": pa.array(g.status_names, pa.string()).take(gi),
        "opaque": a.opaque[ok],
        "cas": a.cas[ok],
        "datatype": h["datatype"][ok],
        "cid": pa.array(g.cid[ok], mask=~g.has_cid[ok]),
        "body_length": a.bodylen[ok],
        "value_length": (a.bodylen.astype(np.int64) - h["extlen"] - a.keylen)[ok],
        "key": _keys(a.buf, g.key_start[ok], g.key_len[ok]),
        "json_check": _JSON_CHECK.take(pa.array(g.json[ok])),
    }
    for col, (arr, isset) in g.extras_cols.items():
        fast_cols[col] = pa.array(arr[ok], mask=~isset[ok])
    fast_cols["problems"] = pa.ListArray.from_arrays(pa.array(np.zeros(len(fi) + 1, np.int32)), pa.array([], pa.string()))
    cols: dict[str, pa.Array] = {}
    for f in SCHEMA:
        name = f.name
        if name in FRAME_VALUE_COLUMNS or name in ("type", "offset", "length"):
            fa = fast_cols.get(name)
            fa = pa.nulls(len(fi), f.type) if fa is None else pa.array(fa, f.type) if not isinstance(fa, pa.Array) else fa.cast(f.type)
            if take_arr is None:
                cols[name] = fa
            else:
                cols[name] = pa.concat_arrays([fa, pa.array(slow_cols.cols[name], f.type)]).take(take_arr)
    return cols


def _keys(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> pa.Array:
    """The keys as a string column (null when empty; escaped as dissect does when not UTF-8)."""
    koffs, kdata = _gather(buf, starts, lens)
    valid = pa.py_buffer(np.packbits(lens > 0, bitorder="little").tobytes())
    keys = pa.Array.from_buffers(pa.binary(), len(lens), [valid, pa.py_buffer(koffs), pa.py_buffer(kdata.tobytes())])
    try:
        return keys.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if k is None else k.decode("utf-8", "backslashreplace") for k in keys.to_pylist()], pa.string())


def _record_columns(chunk: RecordChunk) -> dict[str, pa.Array]:
    """The columns every row takes from its record: file, numbering, connection, direction, times, packets."""
    n = len(chunk)
    cols: dict[str, pa.Array] = {}
    counts = np.array(chunk.counts, np.int64)
    cols["file"] = _repeat_strings(chunk.file, counts)
    cols["frame"] = pa.array(np.arange(chunk.first_number, chunk.first_number + n, dtype=np.int64))
    cols.update(set_columns(chunk.capture_set, chunk.first_number - chunk.set_base, n))
    conn = np.repeat(np.array(chunk.conn, np.int32), counts)
    cols["conn_id"] = pa.array(conn)
    label_ids = np.array(sorted(chunk.labels), np.int32)
    cols["conn"] = pa.array([chunk.labels[c] for c in label_ids.tolist()], pa.string()).take(pa.array(np.searchsorted(label_ids, conn)))
    cols["dir"] = _repeat_strings(chunk.direction, counts)
    ts = np.repeat(_times(chunk.ts), counts)
    packet = np.repeat(np.array(chunk.packet, np.int64), counts)
    ts_first, packet_first = ts.copy(), packet.copy()
    if chunk.heads:
        at = np.fromiter(chunk.heads, np.int64, len(chunk.heads))
        hv = list(chunk.heads.values())
        ts_first[at], ts[at] = _times([h[0] for h in hv]), _times([h[1] for h in hv])
        packet_first[at], packet[at] = (np.array([h[i] for h in hv], np.int64) for i in (2, 3))
    tstype = SCHEMA.field("ts").type
    cols["ts"] = ts_array(ts, tstype)
    cols["ts_first"] = ts_array(ts_first, tstype)
    cols["packet"] = pa.array(packet)
    cols["packet_first"] = pa.array(packet_first)
    return cols


def set_columns(capture_set: int, first_set_frame: int, n: int) -> dict[str, pa.Array]:
    """``capture_set`` and ``set_frame`` of ``n`` rows of one capture set, numbered within it from ``first_set_frame``."""
    return {
        "capture_set": pa.array(np.full(n, capture_set, np.int32)),
        "set_frame": pa.array(np.arange(first_set_frame, first_set_frame + n, dtype=np.int64)),
    }


def _times(values: list[int]) -> np.ndarray:
    """Packet times (ns) as int64; one no ``timestamp[ns]`` can hold becomes :data:`~dcpinspect.flows.reassembly.TS_UNKNOWN`."""
    try:
        return np.array(values, np.int64)
    except (OverflowError, TypeError):  # not from a capture file (its reader has already done this)
        return np.array([t if isinstance(t, int) and TS_UNKNOWN < t <= TS_MAX else TS_UNKNOWN for t in values], np.int64)


def ts_array(ts: np.ndarray, tstype: pa.DataType) -> pa.Array:
    """int64 ns as the timestamp column: :data:`~dcpinspect.flows.reassembly.TS_UNKNOWN` is null."""
    unknown = ts == TS_UNKNOWN
    return pa.array(ts, mask=unknown if unknown.any() else None).cast(tstype)


def _repeat_strings(values: list[str], counts: np.ndarray) -> pa.Array:
    """``values[i]`` repeated ``counts[i]`` times, as an Arrow string array."""
    uniq = sorted(set(values))
    codes = np.searchsorted(np.array(uniq, object), np.array(values, object)) if len(uniq) > 1 else np.zeros(len(values), np.int64)
    return pa.array(uniq, pa.string()).take(pa.array(np.repeat(codes, counts)))


_RAW: Callable[[Any], bytes] = itemgetter(1)
_OFFSET: Callable[[Any], int] = itemgetter(0)
_DIALECT: Callable[[Any], str] = itemgetter(2)
_COLTYPE = {name: typ for name, typ, _ in FRAME_COLUMNS}
assert set(DCP_COLUMNS) <= set(_COLTYPE)


def record_batches(chunks: Iterable[RecordChunk]) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the frames table, one per chunk.

    Python's cyclic garbage collector is paused while they are built: the
    decoder allocates one small object per frame and none of them form
    cycles, while each full collection would walk every frame still held.
    """

    def made() -> Iterator[pa.RecordBatch]:
        for chunk in chunks:
            batch = chunk_batch(chunk)
            del chunk  # not held while the caller uses the batch
            yield batch

    return gc_paused(made())
