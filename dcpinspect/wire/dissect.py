"""Dissection: a frame's bytes -> named fields with offsets, values and meanings.

Everything is driven by the protocol table (``protocol/spec.py``,
``protocol/upr.py``); there is no per-opcode parser here, only an interpreter
of the table's sections, conditions and rules.  :func:`select_variant` picks
the variant a frame is (the encoder and the vectorised frames table use it
too); the value readers are in :mod:`.values`, the result types in
:mod:`.dissection`.  Dissection is total: it never raises on a frame that came
from the decoder; everything wrong becomes a :class:`~.dissection.Problem` with
the offending byte range.

A frame the capture cut short (a :class:`~.events.Truncated` event whose
24-byte header was captured) is dissected as far as its bytes go by
:func:`dissect_truncated`: the header says how long the frame is, every
section (framing extras, extras, key, value) that was captured whole is read
as usual, the section the cut falls in is shown as far as it goes, and the
missing part is one problem, ``… 1,234 bytes not captured``
(:func:`not_captured`); problems that only the missing bytes caused (a
short extras section, a value that is not valid JSON because it stops
halfway) are not reported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..protocol import spec
from ..protocol.enums import Magic, Opcode, Status
from ..protocol.fields import BYTES, TEXT, ExtrasLength, Field, FieldIs, Rule, StatusIs, Variant
from ..protocol.upr import UPR_BODIES, UPR_HEADER, UPR_HEADER_SIZE
from .dissection import DEFAULT_CONTEXT, Block, DissectContext, Dissection, Leaf, Problem, leaf, text
from .events import Frame, Truncated
from .framing import decode_leb128, parse_frame_infos
from .values import PACKED_DATATYPES, VALUE_READERS, field_problems, read_fields, read_plain_doc

__all__ = ["GENERIC", "command_names", "dissect", "dissect_truncated", "not_captured", "select_variant"]

#: what a frame is read as when the table has nothing better: any extras, key and value
GENERIC = Variant("generic", any_extras=True, key="any", value="any")

_tnew = tuple.__new__
_HEADER_UNPACK = spec.HEADER.unpack_from
_HEADER_SIZE = spec.HEADER_SIZE
_UNKNOWN_DATATYPE = ~spec.DATATYPE_MASK
_SUCCESS = int(Status.SUCCESS)
_DCP_CONTROL = int(Opcode.DCP_CONTROL)
#: magic -> (alt layout?, response?, role)
_MAGIC_INFO = {
    m: (m in spec.ALT_MAGICS, m in spec.RESPONSE_MAGICS, "response" if m in spec.RESPONSE_MAGICS else "request") for m in spec.MAGICS
}
#: magics with their own opcode space (the server's requests to a client)
_SERVER_MAGICS = frozenset((Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE))
_DOC_KEYS = frozenset(("doc", "doc?"))
_KEY_REQUIRED = frozenset(("doc", "text", "agent"))
_FIRST_USER_COLLECTION = 8  # collection ids below it are reserved (kv_engine docs/Collections.md)
_DURABILITY = "DurabilityRequirement"  # the request frame info whose timeout may be left out


def select_variant(
    variants: tuple[Variant, ...],
    extras: bytes | Mapping[str, Any] | None,
    status: int | None = None,
    vlen: int | None = None,
) -> Variant | None:
    """The first of ``variants`` whose conditions hold for a frame (``None`` if none does).

    ``status`` is ``None`` for a request (a response variant that names no
    status applies to successes only); ``vlen`` is ``None`` when the value is
    not built yet.  ``extras`` are the frame's extras bytes (the dissector), or
    the extras fields by name (the encoder: a field not given holds what the
    variant needs), or ``None`` (no extras given).
    """
    if status is None and len(variants) == 1 and not variants[0].conditions:
        return variants[0]
    if isinstance(extras, bytes):
        key = (id(variants), len(extras), status)
        hit = _SELECTED.get(key)
        if hit is not None and hit[0] is variants:
            return hit[1]
        chosen = _select_by_extras(variants, extras, status, vlen)
        if _by_length(variants, len(extras)):  # the choice depends on the extras length and the status only: remember it
            if len(_SELECTED) > 4096:  # hostile captures: many odd statuses
                _SELECTED.clear()
            _SELECTED[key] = (variants, chosen)
        return chosen
    given = extras or {}
    for v in variants:
        if given.keys() <= set(v.extras_names) and v.applies(v.extras_len, status, vlen, {**v.selector_values, **given}):
            return v
    return None


def _select_by_extras(variants: tuple[Variant, ...], ext: bytes, status: int | None, vlen: int | None) -> Variant | None:
    extlen = len(ext)
    for v in variants:
        fields = None
        if v.selector_values and extlen == v.extras_len and v.extras_struct is not None:
            fields = dict(zip(v.extras_names, v.extras_struct.unpack(ext), strict=True))
        if v.applies(extlen, status, vlen, fields):
            return v
    return None


def _by_length(variants: tuple[Variant, ...], extlen: int) -> bool:
    """Whether only the extras length and the status choose among the variants that can have this extras length."""
    key = (id(variants), extlen)
    known = _BY_LENGTH.get(key)
    if known is None or known[0] is not variants:
        candidates = [v for v in variants if all(c.length == extlen for c in v.conditions if isinstance(c, ExtrasLength))]
        simple = all(isinstance(c, (ExtrasLength, StatusIs)) for v in candidates for c in v.conditions)
        known = _BY_LENGTH[key] = (variants, simple)
    return known[1]


_BY_LENGTH: dict[tuple[int, int], tuple[tuple[Variant, ...], bool]] = {}
#: (id of a variants tuple, extras length, status) -> (the tuple, the variant chosen)
_SELECTED: dict[tuple[int, int, int | None], tuple[tuple[Variant, ...], Variant | None]] = {}


def dissect(frame: Frame, context: DissectContext | None = None) -> Dissection:
    """Dissect a frame into fields, values, meanings and problems (never raises on a frame)."""
    if not isinstance(frame, Frame):
        raise TypeError(f"dissect() takes a Frame, not {type(frame).__name__}")
    ctx = context or DEFAULT_CONTEXT
    if frame[2] == "upr":
        return _dissect_upr(frame, ctx)
    raw = frame[1]
    h = _HEADER_UNPACK(raw)
    magic = h[0]
    alt, response, role = _MAGIC_INFO[magic]
    d = Dissection(frame, ctx, role)
    found = _COMMANDS.get((h[1], magic))
    if found is None:
        found = _COMMANDS[(h[1], magic)] = _command(h[1], magic)
    cmd, d.name, d.title, sole = found
    fl = h[2] >> 8 if alt else 0
    e0 = _HEADER_SIZE + fl
    k0 = e0 + h[3]
    v0 = k0 + (h[2] & 0xFF if alt else h[2])
    end = len(raw)
    if h[4] & _UNKNOWN_DATATYPE:
        d.problems.append(Problem(f"unknown datatype bits 0x{h[4] & _UNKNOWN_DATATYPE:02x}", 5, 1))
    if fl:
        _framing(d, raw, _HEADER_SIZE, e0, response, cmd)
    elif cmd is not None and cmd.sid == "stream" and ctx.stream_ids and not response:
        d.problems.append(Problem("stream id missing: stream-ids are enabled on this connection", 0, 1))
    ext = raw[e0:k0]
    variant = sole or _variant(d, cmd, ext, h[5] if response else None, end - v0, e0)
    d.variant = variant.name
    early = _extras(d, variant, raw, ext, e0)
    key_kind = variant.key
    if key_kind in _DOC_KEYS and v0 > k0 and not ctx.collections:  # the common case, without the call
        d.key = key = raw[k0:v0]
        d.items.append(_tnew(Leaf, ("key", variant.key_label, k0, v0 - k0, key, 0, None, TEXT, False, None)))
    else:
        _key(d, variant, raw, k0, v0, cmd)
    if v0 < end and variant.value_kind == "doc" and not h[4] & PACKED_DATATYPES:  # the common case, without the dispatch
        read_plain_doc(d, raw, v0, end, h[4])
    elif v0 < end:
        VALUE_READERS[variant.value_kind](d, variant, raw, v0, end, h[4], cmd)
    elif variant.value_required or variant.value_kind == "fields":
        _no_value(d, variant)
    rules = variant.value_rules if early else variant.rules
    if rules or variant.cas is not None or variant.datatypes is not None:
        _late_rules(d, variant, h, rules)
    return d


def not_captured(missing: int, total: int) -> str:
    """The line that marks a truncated frame's missing part: ``… 1,234 bytes not captured (the frame is 1,318 bytes)``."""
    return f"… {missing:,} byte{'' if missing == 1 else 's'} not captured (the frame is {total:,} bytes)"


def dissect_truncated(event: Truncated, context: DissectContext | None = None) -> Dissection | None:
    """A truncated frame dissected as far as its bytes go (``None``: not even a plausible mcbp header was captured).

    The result's frame holds the captured bytes only (never zero-filled);
    ``missing`` says how many the header promised beyond them, and the last
    problem marks them (:func:`not_captured`).  Problems are kept only where
    they concern sections captured whole (the header's own ones when the
    extras were captured whole).
    """
    data = bytes(event.data)
    if len(data) < _HEADER_SIZE or data[0] not in _MAGIC_INFO:
        return None
    h = _HEADER_UNPACK(data)
    alt = _MAGIC_INFO[data[0]][0]
    total = _HEADER_SIZE + h[6]
    if total <= len(data):  # not short after all (the decoder cut it for another reason): the whole frame
        return dissect(Frame(event.offset, data[:total]), context)
    d = dissect(Frame(event.offset, data), context)
    fl = h[2] >> 8 if alt else 0
    bounds = [_HEADER_SIZE, _HEADER_SIZE + fl]
    bounds.append(bounds[-1] + h[3])  # extras end
    bounds.append(bounds[-1] + (h[2] & 0xFF if alt else h[2]))  # key end
    whole = max((b for b in bounds if b <= len(data)), default=_HEADER_SIZE)  # the end of the last section captured whole
    extras_whole = bounds[2] <= len(data)
    d.problems = [p for p in d.problems if p.offset + p.length <= whole and (p.offset >= _HEADER_SIZE or extras_whole) and p.offset < whole]
    d.missing = total - len(data)
    d.problems.append(Problem(not_captured(d.missing, total), len(data), 0))
    return d


def command_names(opcode: int, magic: int) -> tuple[spec.Command | None, str, str]:
    """(table entry, name, title) of an opcode under a magic (the server magics have their own opcode space)."""
    server = magic in _SERVER_MAGICS
    cmd = None if server else spec.COMMANDS.get(opcode)
    name = f"server opcode 0x{opcode:02x}" if server else (cmd.name if cmd else f"unknown 0x{opcode:02x}")
    return cmd, name, f"{name} {spec.MAGIC_ROLE_WORD[magic]}"


def _command(opcode: int, magic: int) -> tuple[spec.Command | None, str, str, Variant | None]:
    """:func:`command_names`, and the variant every frame of them is (a request with one unconditional, current variant)."""
    cmd, name, title = command_names(opcode, magic)
    sole = None
    if cmd is not None and not _MAGIC_INFO[magic][1] and len(cmd.request) == 1 and not cmd.request[0].conditions and not cmd.obsolete:
        sole = cmd.request[0]
    return cmd, name, title, sole


#: (opcode, magic) -> what :func:`_command` says (looked up once per frame)
_COMMANDS: dict[tuple[int, int], tuple[spec.Command | None, str, str, Variant | None]] = {}
_LAYOUTS: dict[tuple[int, int], Variant | None] = {}


def _variant(d: Dissection, cmd: spec.Command | None, ext: bytes, status: int | None, vlen: int, e0: int) -> Variant:
    """The variant the frame is read as (the table's, or the closest one with a problem saying why)."""
    response = status is not None
    if cmd is None:
        return spec.ERROR if response and status != _SUCCESS else GENERIC
    variants = cmd.response if response else cmd.request
    hit = _SELECTED.get((id(variants), len(ext), status))  # select_variant's memory, without the call
    chosen = hit[1] if hit is not None and hit[0] is variants else select_variant(variants, ext, status, vlen)
    if chosen is None:
        chosen = _fallback(d, cmd, variants, ext, status, e0)
    if cmd.obsolete and not response:
        d.problems.append(Problem(cmd.obsolete, 1, 1))
    return chosen


def _fallback(d: Dissection, cmd: spec.Command, variants: tuple[Variant, ...], ext: bytes, status: int | None, e0: int) -> Variant:
    """No variant of the table fits: an error, a bare status, the extras layout alone, or the generic reading."""
    el = len(ext)
    if status is not None and status != _SUCCESS:
        return spec.ERROR
    if status is not None and not cmd.response:
        return spec.STATUS_ONLY
    layout = _layout_for(variants, el)
    if layout is not None:
        # the extras have a known layout, but the value of a field that picks the
        # layout (event id, version) has none: decode them and say which value
        vals = layout.extras_struct.unpack(ext) if layout.extras_struct is not None else ()
        picked = dict(zip(layout.extras_names, vals, strict=True))
        sel = ", ".join(f"{c.name}={picked[c.name]}" for c in layout.conditions if isinstance(c, FieldIs) and c.name in picked)
        d.problems.append(Problem(f"no {d.name} layout for {sel}: body shown raw", e0, el))
        return layout
    lens = sorted({v.extras_len for v in variants if not v.any_extras})
    d.problems.append(Problem(f"unexpected extras length {el} for {d.title} (expected {' or '.join(map(str, lens))})", e0, el))
    return GENERIC


def _layout_for(variants: tuple[Variant, ...], extlen: int) -> Variant | None:
    """A raw-body variant with the extras layout of the variants selected by an extras field."""
    key = (id(variants), extlen)
    if key not in _LAYOUTS:
        base = next((v for v in variants if v.extras and v.extras_len == extlen and v.selector_values), None)
        _LAYOUTS[key] = None if base is None else Variant("unknown layout", base.when, extras=base.extras, key="any", value="any")
    return _LAYOUTS[key]


def _extras(d: Dissection, variant: Variant, raw: bytes, ext: bytes, e0: int) -> bool:
    """Read the extras; whether their zero/non-zero rules were checked here (the layout fitted)."""
    el = len(ext)
    if not el:
        if variant.extras and not variant.any_extras:
            d.problems.append(Problem(f"{d.title} must have {variant.extras_len} bytes of extras", 4, 1))
        return False
    st = variant.extras_struct
    if st is not None and el == variant.extras_len:
        vals = st.unpack(ext)
        d.extras = dict(zip(variant.extras_names, vals))  # noqa: B905 - same length by construction
        d.items.append(_tnew(Block, (variant.extras, e0, vals, "extras.", 1)))
        for i, off, f in variant.extras_checked:
            field_problems(f, vals[i], e0 + off, d)
        for i, must_be_zero, rule in variant.extras_screen:  # rule.violated(values), without a call per frame
            if (vals[i] != 0) is must_be_zero:
                _report(d, rule)
        return True
    if variant.extras:
        d.problems.append(Problem(f"unexpected extras length {el} for {d.title} (expected {variant.extras_len})", e0, el))
        read_fields(d, variant.extras, raw, e0, e0 + el, "extras.", 1, d.extras, quiet=True)
    else:
        if not variant.any_extras:
            d.problems.append(Problem(f"{d.title} must not have extras ({el} bytes)", e0, el))
        d.items.append(leaf("extras", "Extras", e0, el, ext, 1, None, BYTES))
    return False


def _report(d: Dissection, rule: Rule) -> None:
    """A broken rule as a problem, pointing at its field (a context rule: at the header's extras length)."""
    where = (4, 1) if rule.field is None else d.span_of(rule.field)
    d.problems.append(Problem(rule.message, *where))


def _late_rules(d: Dissection, variant: Variant, h: tuple[Any, ...], rules: tuple[Rule, ...]) -> None:
    """The variant's CAS and datatype rules, then its table rules (those not checked with the extras)."""
    if variant.cas == "zero" and h[8] != 0:
        d.problems.append(Problem("CAS must be 0", 16, 8))
    elif variant.cas == "nonzero" and h[8] == 0:
        d.problems.append(Problem("CAS must not be 0", 16, 8))
    if variant.datatypes is not None and h[4] not in variant.datatypes:
        d.problems.append(Problem(f"datatype 0x{h[4]:02x} is not valid for {d.title}", 5, 1))
    values = d.extras if not d.body else {**d.body, **d.extras}
    for rule in rules:
        if rule.violated(values, d.context):
            _report(d, rule)


def _framing(d: Dissection, raw: bytes, start: int, end: int, response: bool, cmd: spec.Command | None) -> None:
    """The flexible framing extras: each frame info, the stream id, and the stream-id rules."""
    infos, problem = parse_frame_infos(raw[start:end])
    table = spec.RESPONSE_FRAME_INFOS if response else spec.REQUEST_FRAME_INFOS
    if problem is not None:
        a = start + problem.offset
        d.problems.append(Problem(problem.message, a, problem.length))
        d.items.append(leaf("framing.invalid", "frame info", a, problem.length, raw[a : a + problem.length], 1, None, BYTES))
    for i, (fid, payload, off, hlen) in enumerate(infos):
        name, layout = table.get(fid, (f"unknown frame info {fid}", None))
        a = start + off
        d.items.append(leaf(f"framing[{i}].id", "frame info", a, hlen, raw[a], 1, f"{name}, {len(payload)} bytes", "uint"))
        p0 = a + hlen
        if fid not in table:
            d.problems.append(Problem(f"unknown frame info id {fid}", a, hlen + len(payload)))
        if layout is None:
            if payload:
                d.items.append(leaf(f"framing[{i}].data", name, p0, len(payload), text(payload), 1))
        elif layout and sum(f.size or 0 for f in layout) >= len(payload):
            fields = layout[:1] if name == _DURABILITY and not response and len(payload) == 1 else layout
            vals: dict[str, Any] = {}
            read_fields(d, fields, raw, p0, p0 + len(payload), f"framing[{i}].", 1, vals)
            if fid == spec.FRAME_INFO_STREAM_ID and not response and "stream_id" in vals:
                d.stream_id = vals["stream_id"]
        elif payload:
            size = sum(f.size or 0 for f in layout)
            d.problems.append(Problem(f"frame info {name} has {len(payload)} bytes, expected {size}", a, hlen + len(payload)))
    if response:
        return
    if d.stream_id is not None:
        if cmd is not None and cmd.sid == "never":
            d.problems.append(
                Problem(f"{cmd.name} must never carry a stream id (stream-ids and sync writes are exclusive)", start, end - start)
            )
        elif d.context.stream_ids is False:
            d.problems.append(Problem("stream id sent but enable_stream_id was not negotiated", start, end - start))
    elif cmd is not None and cmd.sid == "stream" and d.context.stream_ids:
        d.problems.append(Problem("stream id missing: stream-ids are enabled on this connection", start, end - start))


def _key(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, cmd: spec.Command | None) -> None:
    """The key, as its kind says: a document key (collection id split off), text, the HELLO agent, or none."""
    kind = variant.key
    n = end - start
    label = variant.key_label
    if n == 0:
        if kind in _KEY_REQUIRED:
            d.problems.append(Problem(f"{d.title} must have a key", 2, 2))
        return
    key = raw[start:end]
    if kind == "none":
        d.problems.append(Problem(f"{d.title} must not have a key", start, n))
        d.key = key
        d.items.append(leaf("key", label, start, n, text(key)))
        return
    if kind in _DOC_KEYS and d.context.collections:
        cid, clen, problem = decode_leb128(raw, start, end)
        if problem:
            d.problems.append(Problem(problem, start, clen))
        if cid is not None:
            d.cid = cid
            meaning = "_default" if cid == 0 else ("reserved" if cid < _FIRST_USER_COLLECTION else None)
            d.items.append(leaf("key.cid", "Collection ID", start, clen, cid, 0, meaning, "leb128"))
            start += clen
            key = raw[start:end]
            if not key:
                d.problems.append(Problem("key holds only a collection id", start - clen, clen))
                return
    d.key = key
    if kind == "agent" and key[:1] == b"{":
        _agent(d, label, key, start)
        return
    meaning = None
    if cmd is not None and cmd.opcode == _DCP_CONTROL:
        meaning = spec.CONTROL_KEYS.get(text(key))
        if meaning is None:
            d.problems.append(Problem(f"unknown control key {text(key)!r} (the producer answers Einval)", start, len(key)))
    d.items.append(leaf("key", label, start, len(key), key, 0, meaning))  # decoded on expansion


def _agent(d: Dissection, label: str, key: bytes, start: int) -> None:
    """A HELLO key that is a JSON object: the agent name and the connection id."""
    d.items.append(leaf("key", label, start, len(key), text(key)))
    try:
        obj = json.loads(key)
    except ValueError as exc:
        d.problems.append(Problem(f"agent name starts with '{{' but is not JSON: {exc}", start, len(key)))
        return
    if isinstance(obj, dict):
        for jk, lbl in (("a", "agent"), ("i", "connection id")):
            if jk in obj:
                d.items.append(leaf(f"key.{jk}", lbl, start, len(key), str(obj[jk]), 1))


def _no_value(d: Dissection, variant: Variant) -> None:
    """A frame without a value: a problem if its variant needs one; an empty repeated group otherwise."""
    if variant.value_required:
        d.problems.append(Problem(f"{d.title} must have a value", 8, 4))
    elif isinstance(variant.value, tuple) and variant.value:  # only groups: none repeated
        d.body[variant.value[0].name] = []


def _dissect_upr(frame: Frame, ctx: DissectContext) -> Dissection:
    """A frame of the UPR draft: its header, then the body its type selects."""
    d = Dissection(frame, ctx, frame.role)
    raw = frame.raw
    h = frame.header
    d.name = d.title = frame.name
    d.items.append(Block(UPR_HEADER, 0, (h[0], h[1], h[2], h[3]), "header.", 0))
    field_problems(UPR_HEADER[0], h[0], 0, d)
    if h[1] != b"\0\0\0":
        d.problems.append(Problem("reserved bytes are not zero", 1, 3))
    start = UPR_HEADER_SIZE
    end = len(raw)
    btype = raw[start] if end > start else None
    chosen = next((v for v in UPR_BODIES.get(h[0], ()) if v.applies(0, None, None, {"type": btype})), None)
    if chosen is None:
        if end > start:
            d.problems.append(Problem(f"unknown body type {btype} for {d.name}", start, 1))
            d.items.append(leaf("body", "Body", start, end - start, raw[start:end], 1, None, BYTES))
        return d
    d.variant = chosen.name
    if not isinstance(chosen.value, tuple):
        if end > start:
            d.items.append(leaf("body", "Body", start, end - start, raw[start:end], 1, None, BYTES))
        return d
    if any(isinstance(f, Field) and f.label == "Key+Value" for f in chosen.value):
        d.problems.append(Problem("the UPR draft's mutation has no key length: key/value boundary unspecified", start, end - start))
    if chosen.value:
        read_fields(d, chosen.value, raw, start, end, "body.", 1, d.body)
    elif end > start:
        d.problems.append(Problem(f"{d.name} has no body", start, end - start))
    return d
