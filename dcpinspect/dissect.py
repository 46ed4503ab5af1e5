"""Dissection: a frame's bytes -> named fields with offsets, values and meanings.

Everything is driven by the protocol table (``spec.py``, ``spec_upr.py``);
there is no per-opcode parser here, only interpreters for the table's field
and section kinds.  Dissection is total: it never raises on a frame that came
from the decoder; everything wrong becomes a :class:`Problem` with the
offending byte range.

The same bytes mean different things on different connections (collection-id
key prefixes, delete-time deletions, stream-ids), so :func:`dissect` takes a
:class:`DissectContext`.  A field of the context left at ``None`` means
"not known" (e.g. a capture that starts mid-connection): then nothing is
guessed and no context rule is checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from . import spec
from .decoder import Frame
from .fields import BYTES, ENUM, FLAGS, HEX, INT, TEXT, Field, Group, Variant
from .flatbuf import read_table
from .spec_upr import UPR_BODIES, UPR_HEADER, UPR_HEADER_SIZE

__all__ = [
    "DEFAULT_CONTEXT",
    "INT_KINDS",
    "DissectContext",
    "Dissection",
    "FieldValue",
    "Problem",
    "decode_leb128",
    "dissect",
    "parse_frame_infos",
]

MAX_INFLATED = 64 * 1024 * 1024
_NO_SECRETS: list[tuple[int, int]] = []  # shared, never appended to (see _secret)
_HEADER_UNPACK = spec.HEADER.unpack_from  # refuse to inflate snappy values claiming more than this


@dataclass(frozen=True, slots=True)
class DissectContext:
    """What was negotiated on the connection a frame travelled on.

    ``None`` means unknown (nothing guessed, no context rule checked).
    ``collections``/``xattr``/``snappy``/``json`` come from HELLO; the
    ``delete_times`` (IncludeDeleteTimes) and ``include_xattrs`` from the
    DCP_OPEN flags; ``stream_ids`` from ``DCP_CONTROL enable_stream_id``.
    ``reveal_secrets`` shows SASL passwords and proofs instead of masking them.
    """

    collections: bool | None = None
    xattr: bool | None = None
    snappy: bool | None = None
    json: bool | None = None
    delete_times: bool | None = None
    include_xattrs: bool | None = None
    stream_ids: bool | None = None
    reveal_secrets: bool = False

    def with_features(self, features: Iterable[int]) -> DissectContext:
        """This context updated with the HELLO features a server accepted."""
        fs = set(features)
        return replace(
            self,
            collections=spec.FEATURE_COLLECTIONS in fs,
            xattr=spec.FEATURE_XATTR in fs,
            snappy=spec.FEATURE_SNAPPY in fs,
            json=spec.FEATURE_JSON in fs,
        )

    def with_open_flags(self, flags: int) -> DissectContext:
        """This context updated with DCP_OPEN flags."""
        return replace(
            self,
            delete_times=bool(flags & spec.OPEN_INCLUDE_DELETE_TIMES),
            include_xattrs=bool(flags & spec.OPEN_INCLUDE_XATTRS),
        )


DEFAULT_CONTEXT = DissectContext()


@dataclass(frozen=True, slots=True)
class Problem:
    """A protocol rule violation (or undecodable part) and the bytes it concerns."""

    message: str
    offset: int = 0
    length: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"message": self.message, "offset": self.offset, "length": self.length}


@dataclass(frozen=True, slots=True)
class FieldValue:
    """One dissected field: where it is in the frame, its bytes, value and meaning."""

    path: str
    label: str
    offset: int
    length: int
    raw: bytes
    value: Any
    meaning: str | None = None
    depth: int = 0
    kind: str = "uint"
    secret: bool = False

    @property
    def hex(self) -> str:
        """The field's bytes as hex (``**`` per byte when the field is a masked secret)."""
        return "**" * self.length if self.secret else self.raw.hex()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``value`` is an int, string, list or ``None``)."""
        v = self.value
        if isinstance(v, bytes):
            v = None
        return {
            "name": self.label.strip(),
            "path": self.path,
            "offset": self.offset,
            "length": self.length,
            "value": v,
            "hex": self.hex,
            "meaning": self.meaning,
        }


# items are kept compact while dissecting and expanded into FieldValues on demand:
#   ("block", fields, offset, values, prefix, depth)
#   ("leaf", spec_or_None, path, label, offset, length, value, depth, meaning, kind, secret)
_Item = tuple[Any, ...]


class Dissection:
    """The result of :func:`dissect`.

    Attributes:
        frame: the dissected frame.
        name: command name (``DCP_MUTATION``, ``unknown 0xNN``).
        role: ``"request"`` / ``"response"``.
        variant: the table variant that applied (``"v2.2"``, ``"rollback"``, ``""``).
        extras: extras field values by name.
        body: structured value field values by name (groups as lists of dicts).
        key: key bytes without the collection-id prefix.
        cid: collection id split from the key (``None`` if not split).
        stream_id: DCP stream id from the flexible framing extras.
        document: the decoded document (JSON object, text) where one applies.
        problems: protocol violations found, with byte ranges.
        context: the context used.
    """

    __slots__ = (
        "_fields",
        "_items",
        "body",
        "cid",
        "context",
        "document",
        "extras",
        "frame",
        "key",
        "name",
        "problems",
        "role",
        "secrets",
        "stream_id",
        "title",
        "variant",
    )

    def __init__(self, frame: Frame, context: DissectContext, role: str) -> None:
        self.frame = frame
        self.context = context
        self.name = ""
        self.title = ""
        self.role = role
        self.variant = ""
        self.extras: dict[str, Any] = {}
        self.body: dict[str, Any] = {}
        self.key = b""
        self.cid: int | None = None
        self.stream_id: int | None = None
        self.document: Any = None
        self.problems: list[Problem] = []
        self.secrets: list[tuple[int, int]] = _NO_SECRETS  # replaced by a list when one is found
        self._items: list[_Item] = []
        self._fields: list[FieldValue] | None = None

    @property
    def header(self) -> dict[str, Any]:
        """Header field values by name."""
        return {fv.path.split(".", 1)[1]: fv.value for fv in self.fields if fv.path.startswith("header.")}

    @property
    def fields(self) -> list[FieldValue]:
        """Every field, in frame order (built on first access)."""
        if self._fields is None:
            self._fields = _expand(self)
        return self._fields

    @property
    def key_text(self) -> str:
        """The key as text (undecodable bytes escaped)."""
        return _text(self.key)

    def get(self, name: str, default: Any = None) -> Any:
        """A value by field name: extras first, then structured value, then header."""
        if name in self.extras:
            return self.extras[name]
        if name in self.body:
            return self.body[name]
        return self.header.get(name, default)

    def add_problem(self, message: str, offset: int = 0, length: int = 0) -> None:
        """Attach a problem (used for corrections found outside the frame, e.g. seed errata)."""
        self.problems.append(Problem(message, offset, length))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form: name, role, fields, problems."""
        return {
            "name": self.name,
            "role": self.role,
            "variant": self.variant,
            "fields": [f.as_dict() for f in self.fields],
            "problems": [p.as_dict() for p in self.problems],
        }

    def __repr__(self) -> str:
        return f"<Dissection {self.title} problems={len(self.problems)}>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        from .render import annotate

        p.text(annotate(self))

    def _repr_html_(self) -> str:
        from .render import annotate_html

        return annotate_html(self)


# ---------------------------------------------------------------------------
# small decoders


def _text(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


def decode_leb128(buf: bytes, pos: int = 0, limit: int | None = None) -> tuple[int | None, int, str | None]:
    """Unsigned LEB128 collection id at ``buf[pos:]`` (FACTS §5).

    Returns ``(value, length, problem)``; ``value`` is ``None`` when no
    complete encoding fits (max 5 bytes).  Non-canonical (over-long)
    encodings and values above 32 bits decode but come with a problem.
    """
    end = len(buf) if limit is None else min(limit, len(buf))
    value = 0
    shift = 0
    i = pos
    while i < end and i - pos < 5:
        b = buf[i]
        value |= (b & 0x7F) << shift
        shift += 7
        i += 1
        if not b & 0x80:
            n = i - pos
            problem = None
            if n > 1 and b == 0:
                problem = f"non-canonical (over-long) LEB128 collection id ({n} bytes for 0x{value:x})"
            elif value > 0xFFFFFFFF:
                problem = f"LEB128 collection id 0x{value:x} exceeds 32 bits"
            return value, n, problem
    if i - pos >= 5:
        return None, i - pos, "LEB128 collection id longer than 5 bytes"
    return None, i - pos, "key ends inside its LEB128 collection id"


def parse_frame_infos(framing: bytes, *, response: bool = False) -> tuple[list[tuple[int, bytes, int, int]], list[Problem]]:
    """Flexible framing extras -> ``[(id, payload, offset, header_len)]`` (offsets within ``framing``).

    Nibble encoding with both escapes (FACTS §1.3): id 15 -> 15 + next byte;
    length 15 -> 15 + next byte (after any id escape byte).  The encoding is the
    same both ways; ``response`` only documents which id table applies.
    """
    out: list[tuple[int, bytes, int, int]] = []
    problems: list[Problem] = []
    pos = 0
    n = len(framing)
    while pos < n:
        start = pos
        b = framing[pos]
        pos += 1
        fid = b >> 4
        flen = b & 0x0F
        if fid == 15:
            if pos >= n:
                problems.append(Problem("frame info id escape byte missing", start, n - start))
                break
            fid = 15 + framing[pos]
            pos += 1
        if flen == 15:
            if pos >= n:
                problems.append(Problem("frame info length escape byte missing", start, n - start))
                break
            flen = 15 + framing[pos]
            pos += 1
        if pos + flen > n:
            problems.append(Problem(f"frame info {fid} ({flen} bytes) overruns the framing extras", start, n - start))
            break
        out.append((fid, framing[pos : pos + flen], start, pos - start))
        pos += flen
    del response
    return out, problems


def _field_value(f: Field, raw: bytes) -> Any:
    k = f.kind
    if k == TEXT:
        return _text(raw)
    if k == BYTES:
        return raw
    return int.from_bytes(raw, "big", signed=k == INT)


def _field_problems(f: Field, value: Any, offset: int, d: Dissection) -> None:
    if not isinstance(value, int):
        return
    if f.invalid:
        if f.kind == FLAGS:
            for bit, why in f.invalid.items():
                if value & bit:
                    d.problems.append(Problem(why, offset, f.size or 0))
        elif value in f.invalid:
            d.problems.append(Problem(f.invalid[value], offset, f.size or 0))
    if not f.strict or f.names is None:
        return
    if f.kind == FLAGS:
        known = 0
        for bit in f.names:
            known |= bit
        if value & ~known:
            d.problems.append(Problem(f"unknown {f.label} bits 0x{value & ~known:0{2 * (f.size or 1)}x}", offset, f.size or 0))
    elif f.kind == ENUM and value not in f.names and not (f.invalid and value in f.invalid):
        d.problems.append(Problem(f"unknown {f.label} 0x{value:0{2 * (f.size or 1)}x}", offset, f.size or 0))


def _decode_fields(
    d: Dissection,
    fields: tuple[Field | Group, ...],
    raw: bytes,
    start: int,
    end: int,
    prefix: str,
    depth: int,
    out: dict[str, Any],
    *,
    quiet: bool = False,
) -> None:
    """Interpret a run of table fields over ``raw[start:end]`` into items and ``out``.

    ``quiet``: the section's length is already reported wrong; do not add
    "ends inside"/"trailing bytes" problems of its own.
    """
    pos = start
    items = d._items
    for f in fields:
        if isinstance(f, Group):
            gsize = f.size
            entries: list[dict[str, Any]] = []
            i = 0
            while gsize and pos + gsize <= end:
                vals: dict[str, Any] = {}
                _decode_fields(d, f.fields, raw, pos, pos + gsize, f"{prefix}{f.name}[{i}].", depth, vals)
                entries.append(vals)
                pos += gsize
                i += 1
            out[f.name] = entries
            continue
        size = end - pos if f.size is None else f.size
        if pos + size > end:
            have = end - pos
            if not quiet:
                d.problems.append(Problem(f"section ends inside {f.label} ({have} of {size} bytes)", pos, have))
            items.append(("leaf", None, prefix + f.name, f.label, pos, have, raw[pos:end], depth, "truncated", BYTES, False))
            pos = end
            break
        b = raw[pos : pos + size]
        value = _field_value(f, b)
        out[f.name] = value
        items.append(("leaf", f, prefix + f.name, f.label, pos, size, value, depth, None, f.kind, False))
        _field_problems(f, value, pos, d)
        pos += size
    if pos < end:
        if not quiet:
            d.problems.append(Problem(f"{end - pos} unexpected trailing bytes", pos, end - pos))
        items.append(("leaf", None, prefix + "trailing", "trailing bytes", pos, end - pos, raw[pos:end], depth, None, BYTES, False))


# ---------------------------------------------------------------------------
# mcbp


def _select(variants: tuple[Variant, ...], frame: Frame, ext: bytes, vlen: int, response: bool) -> Variant | None:
    if not response and len(variants) == 1 and not variants[0].when:
        return variants[0]
    extlen = len(ext)
    status = frame.header[5] if response else None
    for v in variants:
        ok = True
        has_status = False
        for attr, want in v.when:
            if attr == "extlen":
                ok = extlen == want
            elif attr == "status":
                has_status = True
                ok = status == want
            elif attr == "vlen":
                ok = vlen == want
            else:  # an extras field of this variant
                st = v.extras_struct
                if st is None or extlen != v.extras_len:
                    ok = False
                else:
                    names = [f.name for f in v.extras]
                    ok = st.unpack(ext)[names.index(attr)] == want
            if not ok:
                break
        if ok and response and not has_status and status != spec.SUCCESS:
            ok = False
        if ok:
            return v
    return None


def dissect(frame: Frame, context: DissectContext | None = None) -> Dissection:
    """Dissect a frame into fields, values, meanings and problems (never raises)."""
    if not isinstance(frame, Frame):
        raise TypeError(f"dissect() takes a Frame, not {type(frame).__name__}")
    ctx = context or DEFAULT_CONTEXT
    if frame[2] == "upr":
        return _dissect_upr(frame, ctx)
    raw = frame[1]
    h = _HEADER_UNPACK(raw)
    magic = h[0]
    opcode = h[1]
    alt, response, role, layout = _MAGIC_INFO[magic]
    d = Dissection(frame, ctx, role)
    names = _NAMES.get((opcode, magic))
    if names is None:
        names = _NAMES[(opcode, magic)] = _names(opcode, magic)
    cmd, d.name, d.title = names
    d._items.append(("header", layout, h, alt))
    hs = spec.HEADER_SIZE
    fl = h[2] >> 8 if alt else 0
    kl = h[2] & 0xFF if alt else h[2]
    el = h[3]
    end = len(raw)
    e0 = hs + fl
    k0 = e0 + el
    v0 = k0 + kl
    if h[4] & ~spec.DATATYPE_MASK:
        d.problems.append(Problem(f"unknown datatype bits 0x{h[4] & ~spec.DATATYPE_MASK:02x}", 5, 1))

    if fl:
        _framing(d, raw, hs, e0, response, cmd)
    elif cmd is not None and cmd.sid == "stream" and ctx.stream_ids and not response:
        d.problems.append(Problem("stream id missing: stream-ids are enabled on this connection", 0, 1))

    ext = raw[e0:k0]
    if cmd is None:
        chosen: Variant | None = spec.ERROR if response and h[5] != spec.SUCCESS else _GENERIC
    else:
        chosen = _select(cmd.response if response else cmd.request, frame, ext, end - v0, response)
        if chosen is None:
            if response and h[5] != spec.SUCCESS:
                chosen = spec.ERROR
            elif response and not cmd.response:
                chosen = spec.STATUS_ONLY
            elif (layout_of := _layout_for(cmd.response if response else cmd.request, el)) is not None:
                # the extras have a known layout, but the value of a field that picks the
                # layout (event id, version) has none: decode them and say which value
                chosen = layout_of
                vals = layout_of.extras_struct.unpack(ext) if layout_of.extras_struct is not None else ()
                picked = dict(zip(layout_of.extras_names, vals, strict=True))
                sel = ", ".join(f"{a}={picked[a]}" for a, _ in layout_of.when if a in picked)
                d.problems.append(Problem(f"no {d.name} layout for {sel}: body shown raw", e0, el))
            else:
                variants = cmd.response if response else cmd.request
                lens = sorted({v.extras_len for v in variants if not v.any_extras})
                d.problems.append(
                    Problem(
                        f"unexpected extras length {el} for {d.title} (expected {' or '.join(map(str, lens))})",
                        e0,
                        el,
                    )
                )
                chosen = _GENERIC
        if cmd.obsolete and not response:
            d.problems.append(Problem(cmd.obsolete, 1, 1))
    variant: Variant = chosen if chosen is not None else _GENERIC
    d.variant = variant.name

    # extras
    zero_done = False  # the zero/non-zero rules on extras ran on the fast path
    if el:
        if variant.extras and el == variant.extras_len and variant.extras_struct is not None:
            vals = variant.extras_struct.unpack(ext)
            d.extras = dict(zip(variant.extras_names, vals))  # noqa: B905 - same length by construction
            d._items.append(("block", variant.extras, e0, vals, "extras.", 1))
            for i, off, f in variant.extras_checked:
                _field_problems(f, vals[i], e0 + off, d)
            for i, zero, msg in variant.zero_checks:
                if (vals[i] != 0) is zero:
                    d.problems.append(Problem(msg, *_where(d, variant.extras_names[i])))
            zero_done = True
        elif variant.extras:
            d.problems.append(Problem(f"unexpected extras length {el} for {d.title} (expected {variant.extras_len})", e0, el))
            _decode_fields(d, variant.extras, raw, e0, k0, "extras.", 1, d.extras, quiet=True)
        else:
            if not variant.any_extras:
                d.problems.append(Problem(f"{d.title} must not have extras ({el} bytes)", e0, el))
            d._items.append(("leaf", None, "extras", "Extras", e0, el, ext, 1, None, BYTES, False))
    elif variant.extras and not variant.any_extras:
        d.problems.append(Problem(f"{d.title} must have {variant.extras_len} bytes of extras", 4, 1))

    # key
    _key(d, variant, raw, k0, v0, cmd)
    # value
    if v0 < end and variant.value.__class__ is str and variant.value in _DOC_KINDS:  # the common case, without the dispatch
        _doc_value(d, raw, v0, end, h[4])
    else:
        _value(d, variant, raw, v0, end, h[4], cmd)

    # variant rules
    if variant.cas == "zero" and h[8] != 0:
        d.problems.append(Problem("CAS must be 0", 16, 8))
    elif variant.cas == "nonzero" and h[8] == 0:
        d.problems.append(Problem("CAS must not be 0", 16, 8))
    if variant.datatypes is not None and h[4] not in variant.datatypes:
        d.problems.append(Problem(f"datatype 0x{h[4]:02x} is not valid for {d.title}", 5, 1))
    for check in variant.other_checks if zero_done else variant.checks:
        _check(d, check)
    return d


_GENERIC = Variant("generic", any_extras=True, key="any", value="any")
_DOC_KINDS = frozenset(("doc", "doc?"))
#: magic -> (alt layout?, response?, role, header layout)
_MAGIC_INFO = {
    m: (
        m in spec.ALT_MAGICS,
        m in spec.RESPONSE_MAGICS,
        "response" if m in spec.RESPONSE_MAGICS else "request",
        spec.HEADER_LAYOUTS[(m in spec.ALT_MAGICS, m in spec.RESPONSE_MAGICS)],
    )
    for m in spec.MAGICS
}
_NAMES: dict[tuple[int, int], tuple[spec.Command | None, str, str]] = {}


def _names(opcode: int, magic: int) -> tuple[spec.Command | None, str, str]:
    """(table entry, name, title) of an opcode under a magic (0x82/0x83 have their own opcode space)."""
    server = magic in (0x82, 0x83)
    cmd = None if server else spec.COMMANDS.get(opcode)
    name = f"server opcode 0x{opcode:02x}" if server else (cmd.name if cmd else f"unknown 0x{opcode:02x}")
    return cmd, name, f"{name} {spec.MAGIC_ROLE_WORD[magic]}"


_LAYOUTS: dict[int, Variant | None] = {}


def _layout_for(variants: tuple[Variant, ...], extlen: int) -> Variant | None:
    """A raw-body variant with the extras layout of the variants selected by an extras field."""
    key = hash((id(variants), extlen))
    if key not in _LAYOUTS:
        base = next(
            (v for v in variants if v.extras and v.extras_len == extlen and any(a not in ("extlen", "status", "vlen") for a, _ in v.when)),
            None,
        )
        _LAYOUTS[key] = None if base is None else Variant("unknown layout", base.when, extras=base.extras, key="any", value="any")
    return _LAYOUTS[key]


def _where(d: Dissection, name: object) -> tuple[int, int]:
    """Offset and length of the extras/value field called ``name`` (for a problem)."""
    suffix = "." + str(name)
    for it in d.fields:
        if it.path.endswith(suffix):
            return it.offset, it.length
    return 0, 0


def _check(d: Dissection, check: tuple[Any, ...]) -> None:
    """Apply one of a variant's declarative rules (see ``Variant.checks``)."""
    kind = check[0]
    ext = d.extras
    body = d.body
    if kind == "context":
        have = getattr(d.context, check[1])
        if have is not None and have is not check[2]:
            d.problems.append(Problem(check[3], 4, 1))
        return
    name = check[1]
    v = ext[name] if name in ext else body.get(name)
    if not isinstance(v, int):
        return
    if kind in {"nonzero", "zero"}:
        bad: Any = (v != 0) == (kind == "zero")
        msg = check[2]
    elif kind == "order":
        hi = ext[check[2]] if check[2] in ext else body.get(check[2])
        bad = isinstance(hi, int) and v > hi
        msg = check[3]
    else:
        a, b, msg = check[2], check[3], check[4]
        if kind == "exclusive":
            bad = v & a and v & b
        elif kind == "requires":
            bad = v & a and not v & b
        else:  # only combined with the bits in b
            bad = v & a and v & ~b
    if bad:
        d.problems.append(Problem(msg, *_where(d, name)))


def _framing(d: Dissection, raw: bytes, start: int, end: int, response: bool, cmd: spec.Command | None) -> None:
    infos, problems = parse_frame_infos(raw[start:end], response=response)
    table = spec.RESPONSE_FRAME_INFOS if response else spec.REQUEST_FRAME_INFOS
    for p in problems:
        d.problems.append(Problem(p.message, start + p.offset, p.length))
        d._items.append(
            (
                "leaf",
                None,
                "framing.invalid",
                "frame info",
                start + p.offset,
                p.length,
                raw[start + p.offset : start + p.offset + p.length],
                1,
                None,
                BYTES,
                False,
            )
        )
    for i, (fid, payload, off, hlen) in enumerate(infos):
        name, layout = table.get(fid, (f"unknown frame info {fid}", None))
        a = start + off
        d._items.append(
            ("leaf", None, f"framing[{i}].id", "frame info", a, hlen, raw[a], 1, f"{name}, {len(payload)} bytes", "uint", False)
        )
        p0 = a + hlen
        if fid not in table:
            d.problems.append(Problem(f"unknown frame info id {fid}", a, hlen + len(payload)))
        if layout is None:
            if payload:
                d._items.append(("leaf", None, f"framing[{i}].data", name, p0, len(payload), _text(payload), 1, None, TEXT, False))
        elif layout and sum(f.size or 0 for f in layout) >= len(payload):
            fields = layout if not (fid == 1 and not response and len(payload) == 1) else layout[:1]
            vals: dict[str, Any] = {}
            _decode_fields(d, fields, raw, p0, p0 + len(payload), f"framing[{i}].", 1, vals)
            if fid == spec.FRAME_INFO_STREAM_ID and not response and "stream_id" in vals:
                d.stream_id = vals["stream_id"]
        elif payload:
            d.problems.append(
                Problem(f"frame info {name} has {len(payload)} bytes, expected {sum(f.size or 0 for f in layout)}", a, hlen + len(payload))
            )
    if d.stream_id is not None and not response:
        if cmd is not None and cmd.sid == "never":
            d.problems.append(
                Problem(f"{cmd.name} must never carry a stream id (stream-ids and sync writes are exclusive)", start, end - start)
            )
        elif d.context.stream_ids is False:
            d.problems.append(Problem("stream id sent but enable_stream_id was not negotiated", start, end - start))
    elif cmd is not None and cmd.sid == "stream" and d.context.stream_ids and not response:
        d.problems.append(Problem("stream id missing: stream-ids are enabled on this connection", start, end - start))


def _key(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, cmd: spec.Command | None) -> None:
    kind = variant.key
    n = end - start
    label = variant.key_label
    if n == 0:
        if kind in ("doc", "text", "agent"):
            d.problems.append(Problem(f"{d.title} must have a key", 2, 2))
        return
    key = raw[start:end]
    if kind == "none":
        d.problems.append(Problem(f"{d.title} must not have a key", start, n))
        d.key = key
        d._items.append(("leaf", None, "key", label, start, n, _text(key), 0, None, TEXT, False))
        return
    if kind in ("doc", "doc?") and d.context.collections:
        cid, clen, problem = decode_leb128(raw, start, end)
        if problem:
            d.problems.append(Problem(problem, start, clen))
        if cid is not None:
            d.cid = cid
            meaning = "_default" if cid == 0 else ("reserved" if cid < 8 else None)
            d._items.append(("leaf", None, "key.cid", "Collection ID", start, clen, cid, 0, meaning, "leb128", False))
            start += clen
            key = raw[start:end]
            if not key:
                d.problems.append(Problem("key holds only a collection id", start - clen, clen))
                return
    d.key = key
    if kind == "agent" and key[:1] == b"{":
        text = _text(key)
        d._items.append(("leaf", None, "key", label, start, len(key), text, 0, None, TEXT, False))
        try:
            obj = json.loads(key)
        except ValueError as exc:
            d.problems.append(Problem(f"agent name starts with '{{' but is not JSON: {exc}", start, len(key)))
            return
        if isinstance(obj, dict):
            for jk, lbl in (("a", "agent"), ("i", "connection id")):
                if jk in obj:
                    d._items.append(("leaf", None, f"key.{jk}", lbl, start, len(key), str(obj[jk]), 1, None, TEXT, False))
        return
    meaning = None
    if cmd is not None and cmd.opcode == 0x5E:  # DCP_CONTROL key
        text = _text(key)
        meaning = spec.CONTROL_KEYS.get(text)
        if meaning is None:
            d.problems.append(Problem(f"unknown control key {text!r} (the producer answers Einval)", start, len(key)))
    d._items.append(("leaf", None, "key", label, start, len(key), key, 0, meaning, TEXT, False))  # decoded in _expand


def _value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: spec.Command | None) -> None:
    n = end - start
    kind = variant.value
    label = variant.value_label
    if isinstance(kind, tuple):
        if n == 0 and not kind:
            return
        if n == 0 and all(isinstance(f, Group) for f in kind):
            d.body[kind[0].name] = []
            return
        if n == 0:
            d.problems.append(Problem(f"{d.title} must have a value", 8, 4))
            return
        _decode_fields(d, kind, raw, start, end, "value.", 1, d.body)
        return
    if n == 0:
        if (kind in ("doc", "text", "json", "sasl", "cache_records") or kind.startswith("flatbuffers")) and kind != "sasl":
            d.problems.append(Problem(f"{d.title} must have a value", 8, 4))
        return
    value = raw[start:end]
    if kind == "none":
        d.problems.append(Problem(f"{d.title} must not have a value", start, n))
        d._items.append(("leaf", None, "value", label, start, n, value, 0, None, BYTES, False))
    elif kind in ("doc", "doc?"):
        _doc_value(d, raw, start, end, datatype)
    elif kind in ("json", "json?"):
        _json_value(d, variant, raw, start, end, datatype, cmd)
    elif kind in ("text", "text?"):
        d.document = _text(value)
        d._items.append(("leaf", None, "value", label, start, n, d.document, 0, None, TEXT, False))
    elif kind == "error":
        _error_value(d, raw, start, end)
    elif kind == "sasl":
        _sasl_value(d, raw, start, end)
    elif kind.startswith("flatbuffers:"):
        _flatbuffers_value(d, kind.split(":", 1)[1], raw, start, end)
    elif kind == "cache_records":
        _cache_records(d, raw, start, end)
    else:  # any
        d._items.append(("leaf", None, "value", label, start, n, value, 0, None, BYTES, False))


def _doc_value(d: Dissection, raw: bytes, start: int, end: int, datatype: int) -> None:
    value = raw[start:end]
    n = end - start
    if not datatype & 0x06:  # the common case: a plain (or JSON) document, no xattrs, not compressed
        try:
            text: str | None = value.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if datatype & 0x01:
            try:
                d.document = json.loads(value)
            except (ValueError, RecursionError) as exc:
                d.problems.append(Problem(f"datatype says JSON but the document is not valid JSON: {str(exc)[:80]}", start, n))
                d.document = _text(value)
            d._items.append(("leaf", None, "value", "Value", start, n, text if text is not None else _text(value), 0, None, TEXT, False))
            return
        if text is not None and (text.isprintable() or _printable_ws(text)):
            d.document = text
            d._items.append(("leaf", None, "value", "Value", start, n, text, 0, None, TEXT, False))
        else:
            d.document = value
            d._items.append(("leaf", None, "value", "Value", start, n, value, 0, None, BYTES, False))
        return
    body = value
    base = start  # frame offset of body[0] (None-like -1 once inflated)
    if datatype & 0x02:
        d._items.append(("leaf", None, "value", "Value (snappy)", start, n, value, 0, None, BYTES, False))
        inflated, problem = _snappy(value)
        if problem is not None:
            d.problems.append(Problem(problem, start, n))
            return
        assert inflated is not None
        body = inflated
        base = -1
        d._items.append(("leaf", None, "value.inflated_length", "inflated length", start, n, len(inflated), 1, None, "uint", False))
    if datatype & 0x04:
        if len(body) < 4:
            d.problems.append(Problem("xattr datatype but value shorter than the 4-byte xattr length", start, n))
            return
        xlen = int.from_bytes(body[:4], "big")
        where = (lambda a, b: (base + a, b)) if base >= 0 else (lambda a, b: (start, n))
        d._items.append(("leaf", None, "value.xattr_length", "xattr length", *where(0, 4), xlen, 1, None, "uint", False))
        if xlen + 4 > len(body):
            d.problems.append(Problem(f"xattr length {xlen} overruns the value ({len(body) - 4} bytes)", *where(0, 4)))
            return
        pos = 4
        i = 0
        xattrs: dict[str, str] = {}
        while pos < 4 + xlen:
            if pos + 4 > 4 + xlen:
                d.problems.append(Problem("xattr section ends inside a pair length", *where(pos, 4 + xlen - pos)))
                break
            plen = int.from_bytes(body[pos : pos + 4], "big")
            pair = body[pos + 4 : pos + 4 + plen]
            if pos + 4 + plen > 4 + xlen or pair.count(b"\0") != 2 or not pair.endswith(b"\0"):
                d.problems.append(Problem(f"malformed xattr pair {i}", *where(pos, min(4 + plen, 4 + xlen - pos))))
                break
            k, v, _ = pair.split(b"\0")
            xattrs[_text(k)] = _text(v)
            d._items.append(
                ("leaf", None, f"value.xattrs[{i}]", "xattr", *where(pos, 4 + plen), f"{_text(k)}={_text(v)}", 1, None, TEXT, False)
            )
            pos += 4 + plen
            i += 1
        body = body[4 + xlen :]
        if base >= 0:
            base += 4 + xlen
    doc: Any = body
    textual = _is_text(body)
    if datatype & 0x01:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as exc:
            d.problems.append(
                Problem(
                    f"datatype says JSON but the document is not valid JSON: {str(exc)[:80]}",
                    *((base, len(body)) if base >= 0 else (start, n)),
                )
            )
            doc = _text(body)
    elif textual:
        doc = _text(body)
    d.document = doc
    shown: Any = _text(body) if textual or datatype & 0x01 else body
    if base >= 0:
        if body or not (datatype & 0x06):
            lbl = "Value" if not datatype & 0x04 else "document"
            d._items.append(
                (
                    "leaf",
                    None,
                    "value" if lbl == "Value" else "value.document",
                    lbl,
                    base,
                    len(body),
                    shown,
                    0 if lbl == "Value" else 1,
                    None,
                    TEXT if textual or datatype & 0x01 else BYTES,
                    False,
                )
            )
    else:
        d._items.append(
            ("leaf", None, "value.document", "document (inflated)", start, n, shown, 1, None, TEXT if textual else BYTES, False)
        )


def _printable_ws(s: str) -> bool:
    return all(c.isprintable() or c in "\r\n\t" for c in s)


def _is_text(b: bytes) -> bool:
    if not b:
        return True
    try:
        s = b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return s.isprintable() or all(c.isprintable() or c in "\r\n\t" for c in s)


def _snappy(data: bytes) -> tuple[bytes | None, str | None]:
    # snappy raw format: varint uncompressed length first; refuse bombs before inflating
    length, _used, _ = decode_leb128(data, 0)
    if length is None:
        return None, "snappy value has no valid length prefix"
    if length > MAX_INFLATED:
        return None, f"snappy value claims {length} inflated bytes (above {MAX_INFLATED})"
    if length > 22 * len(data) + 64:  # a snappy copy op expands at most ~21x: refuse before allocating
        return None, f"snappy value claims {length} inflated bytes from only {len(data)} (impossible)"
    try:
        import cramjam
    except ImportError:  # pragma: no cover - cramjam is a dependency
        return None, "snappy value not inflated: cramjam is not installed"
    try:
        out = bytes(cramjam.snappy.decompress_raw(data))
    except Exception as exc:
        return None, f"bad snappy value: {str(exc)[:80]}"
    if len(out) != length:
        return None, f"snappy value inflated to {len(out)} bytes, header said {length}"
    return out, None


def _json_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: spec.Command | None) -> None:
    value = raw[start:end]
    n = end - start
    text = _text(value)
    d._items.append(("leaf", None, "value", variant.value_label, start, n, text, 0, None, TEXT, False))
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError) as exc:
        d.problems.append(Problem(f"value is not valid JSON: {str(exc)[:80]}", start, n))
        d.document = text
        return
    d.document = obj
    if cmd is None or variant.json_keys is None:
        return
    if cmd.opcode == 0x50 and not datatype & 0x01:
        d.problems.append(Problem("DCP_OPEN value must have datatype JSON", 5, 1))
    if not isinstance(obj, dict):
        d.problems.append(Problem(f"{cmd.name} value must be a JSON object", start, n))
        return
    for k, v in obj.items():
        a, ln = _json_member_span(text, k, start, n)
        meaning = variant.json_keys.get(k)
        if meaning is None:
            meaning = "unknown key (ignored by the server)" if cmd.opcode == 0x53 else None
            if cmd.opcode == 0x50:
                d.problems.append(Problem(f"unknown DCP_OPEN value key {k!r} (only consumer_name is allowed)", a, ln))
        shown = v if isinstance(v, (int, str)) and not isinstance(v, bool) else json.dumps(v)
        d._items.append(("leaf", None, f"value.{k}", k, a, ln, shown, 1, meaning, TEXT, False))
    if cmd.opcode == 0x53:
        _stream_req_json(d, obj, start, n, text)
    if cmd.opcode == 0x50 and "consumer_name" in obj and d.extras.get("flags", 0) & spec.OPEN_PRODUCER:
        d.problems.append(Problem("consumer_name is only valid on consumer connections", start, n))


def _json_member_span(text: str, key: str, start: int, n: int) -> tuple[int, int]:
    token = json.dumps(key)
    i = text.find(token)
    if i < 0 or not text.isascii():
        return start, n
    j = text.find(":", i + len(token))
    if j < 0:
        return start + i, len(token)
    k = j + 1
    while k < len(text) and text[k] in " \t\r\n":
        k += 1
    try:
        _, e = json.JSONDecoder().raw_decode(text, k)
    except ValueError:
        return start + i, len(token)
    return start + i, e - i


def _stream_req_json(d: Dissection, obj: dict[str, Any], start: int, n: int, text: str) -> None:
    def span(k: str) -> tuple[int, int]:
        return _json_member_span(text, k, start, n)

    if d.context.collections is False:
        d.problems.append(Problem("stream-request value is only accepted when collections were negotiated", start, n))
    if "uid" in obj and not isinstance(obj["uid"], str):
        d.problems.append(Problem("uid must be a JSON string", *span("uid")))
    if "sid" in obj:
        sid = obj["sid"]
        if not isinstance(sid, int) or isinstance(sid, bool):
            d.problems.append(Problem("sid must be a JSON integer", *span("sid")))
        elif not 1 <= sid <= 0xFFFF:
            d.problems.append(Problem(f"sid {sid} out of range 1..65535", *span("sid")))
        if d.context.stream_ids is False:
            d.problems.append(Problem("sid given but enable_stream_id was not negotiated (DcpStreamIdInvalid)", *span("sid")))
    elif d.context.stream_ids:
        d.problems.append(Problem("sid required: stream-ids are enabled (DcpStreamIdInvalid)", start, n))
    if "collections" in obj:
        c = obj["collections"]
        if not isinstance(c, list) or not all(isinstance(x, str) and _is_hex(x) for x in c):
            d.problems.append(Problem("collections must be an array of hex strings", *span("collections")))
    if "scope" in obj and not (isinstance(obj["scope"], str) and _is_hex(obj["scope"])):
        d.problems.append(Problem("scope must be a hex string", *span("scope")))
    if "collections" in obj and "scope" in obj:
        d.problems.append(Problem("collections and scope together are invalid (Einval)", start, n))
    if "purge_seqno" in obj and not (isinstance(obj["purge_seqno"], str) and obj["purge_seqno"].isdigit()):
        d.problems.append(Problem("purge_seqno must be a decimal string", *span("purge_seqno")))


def _is_hex(s: str) -> bool:
    return bool(s) and all(c in "0123456789abcdefABCDEF" for c in s)


def _error_value(d: Dissection, raw: bytes, start: int, end: int) -> None:
    value = raw[start:end]
    text = _text(value)
    try:
        d.document = json.loads(value)
    except (ValueError, RecursionError):
        d.document = text
    d._items.append(
        (
            "leaf",
            None,
            "value",
            "Error",
            start,
            end - start,
            text if _is_text(value) else value,
            0,
            None,
            TEXT if _is_text(value) else BYTES,
            False,
        )
    )


def _secret(d: Dissection, span: tuple[int, int]) -> None:
    if d.secrets is _NO_SECRETS:
        d.secrets = []
    d.secrets.append(span)


#: SCRAM mechanisms whose messages are parsed (attributes shown, proofs masked); any other mechanism is masked whole
_SCRAM_MECHANISMS = frozenset(("SCRAM-SHA1", "SCRAM-SHA256", "SCRAM-SHA512"))
#: SCRAM attributes that hold no secret (RFC 5802 §5.1): user, nonce, salt, iterations, channel binding, authzid
_SCRAM_SAFE = frozenset("nrsica")
_SCRAM_LABELS = {"n": "user", "r": "nonce", "s": "salt", "i": "iterations", "c": "channel binding", "p": "proof", "v": "verifier"}


def _scram_attrs(value: bytes) -> list[bytes] | None:
    """A SCRAM message's comma-separated parts when it is well-formed (printable ASCII, ``x=...`` attributes), else ``None``.

    A client-first message starts with its GS2 header (``n,,`` / ``y,,`` /
    ``p=...,`` then an optional ``a=authzid``): those two parts are kept as they are.
    """
    if not value or any(b < 0x21 or b > 0x7E for b in value):
        return None
    parts = value.split(b",")
    body = parts
    if parts[0] in (b"n", b"y") or parts[0].startswith(b"p="):
        if len(parts) < 3 or not (parts[1] == b"" or parts[1].startswith(b"a=")):
            return None
        # p=cb-name[,a=authzid] are attributes too (checked below)
        body = parts[2:] if parts[0] in (b"n", b"y") else parts[1:] if parts[1] else parts[2:]
    for attr in body:
        if len(attr) < 2 or attr[1:2] != b"=" or not attr[:1].isalpha():
            return None
    return parts


def _sasl_masked(d: Dissection, start: int, n: int) -> None:
    """The whole SASL payload as one masked field (it is not positively known to be safe)."""
    d._items.append(("leaf", None, "value", "Value", start, n, "*" * n, 0, "masked", TEXT, True))
    _secret(d, (start, n))


def _sasl_value(d: Dissection, raw: bytes, start: int, end: int) -> None:
    r"""SASL data: every request payload is masked unless positively known to be safe.

    Shown: a PLAIN request's authzid and user (its password masked) and
    well-formed SCRAM messages (proofs and verifiers masked).  Masked whole:
    any other mechanism (CRAM-MD5, ``PLAIN `` or ``PLAIN\0``, an unknown one),
    a PLAIN payload that is not ``authzid\0user\0password``, a SCRAM message
    that is not well-formed (one non-printable byte is enough).  Responses
    (server challenges, errors) are shown, their ``v=`` verifier masked.
    ``reveal_secrets`` shows everything.
    """
    value = raw[start:end]
    n = end - start
    items = d._items
    reveal = d.context.reveal_secrets
    request = d.role == "request"
    mech = d.key_text.upper() if request else ""
    if request and mech == "PLAIN":
        parts = value.split(b"\0")
        if len(parts) != 3:
            d.problems.append(Problem("PLAIN auth data is not authzid\\0user\\0password", start, n))
            if reveal:
                items.append(("leaf", None, "value", "Value", start, n, _text(value), 0, None, TEXT, False))
            else:
                _sasl_masked(d, start, n)
            return
        pos = start
        for name, part in zip(("authzid", "user", "password"), parts, strict=True):
            secret = name == "password" and not reveal
            if part or name != "authzid":
                shown = "********" if secret else _text(part)
                items.append(("leaf", None, f"value.{name}", name, pos, len(part), shown, 1, "masked" if secret else None, TEXT, secret))
            if secret and part:
                _secret(d, (pos, len(part)))
            pos += len(part) + 1
        return
    attrs = _scram_attrs(value)
    if attrs is None or (request and mech not in _SCRAM_MECHANISMS and not reveal):
        if not reveal and (request or b"v=" in value or b"p=" in value):
            _sasl_masked(d, start, n)
            return
        text = _is_text(value)
        items.append(("leaf", None, "value", "Value", start, n, _text(value) if text else value, 0, None, TEXT if text else BYTES, False))
        return
    gs2 = 2 if attrs[0] in (b"n", b"y") or attrs[0].startswith(b"p=") else 0
    pos = start
    for i, attr in enumerate(attrs):
        name = _text(attr[:1])
        secret = i >= gs2 and name not in _SCRAM_SAFE and not (name == "e" and not request) and not reveal  # e=: a server's error
        shown = f"{name}=********" if secret else _text(attr)
        label = _SCRAM_LABELS.get(name, "attribute") if i >= gs2 else "GS2 header"
        items.append(("leaf", None, f"value.{name}", label, pos, len(attr), shown, 1, "masked" if secret else None, TEXT, secret))
        if secret:
            _secret(d, (pos + 2, len(attr) - 2))
        pos += len(attr) + 1


def _flatbuffers_value(d: Dissection, table: str, raw: bytes, start: int, end: int) -> None:
    value = raw[start:end]
    d._items.append(("leaf", None, "value", "Value (FlatBuffers)", start, end - start, value, 0, table, BYTES, False))
    fields, problem = read_table(value, spec.FLATBUFFER_TABLES[table])
    if problem:
        d.problems.append(Problem(problem, start, end - start))
    for name, typ, off, size, v in fields:
        d.body[name] = v
        if off >= 0:
            d._items.append(
                ("leaf", None, f"value.{name}", name, start + off, size, v, 1, None, TEXT if typ == "string" else "uint", False)
            )
        else:
            d._items.append(
                ("leaf", None, f"value.{name}", name, start, 0, v, 1, "absent (default)", TEXT if typ == "string" else "uint", False)
            )


def _cache_records(d: Dissection, raw: bytes, start: int, end: int) -> None:
    pos = start
    records: list[dict[str, Any]] = []
    hdr = spec.CACHE_RECORD_HEADER
    hsize = sum(f.size or 0 for f in hdr)
    i = 0
    while pos < end:
        if pos + hsize > end:
            d.problems.append(Problem(f"cache transfer record {i} header truncated ({end - pos} of {hsize} bytes)", pos, end - pos))
            d._items.append(("leaf", None, f"value.records[{i}]", "truncated record", pos, end - pos, raw[pos:end], 1, None, BYTES, False))
            break
        vals: dict[str, Any] = {}
        _decode_fields(d, hdr, raw, pos, pos + hsize, f"value.records[{i}].", 1, vals)
        k0 = pos + hsize
        k1 = k0 + vals["key_len"]
        v1 = k1 + vals["value_len"]
        if v1 > end:
            d.problems.append(Problem(f"cache transfer record {i} key/value overrun the value", pos, end - pos))
            break
        key = raw[k0:k1]
        if d.context.collections is not False and key:
            cid, clen, problem = decode_leb128(raw, k0, k1)
            if problem:
                d.problems.append(Problem(problem, k0, clen))
            if cid is not None:
                vals["cid"] = cid
                d._items.append(("leaf", None, f"value.records[{i}].cid", "collection id", k0, clen, cid, 1, None, "leb128", False))
                key = raw[k0 + clen : k1]
                k0 += clen
        vals["key"] = _text(key)
        d._items.append(("leaf", None, f"value.records[{i}].key", "key", k0, k1 - k0, vals["key"], 1, None, TEXT, False))
        if v1 > k1:
            v = raw[k1:v1]
            d._items.append(
                (
                    "leaf",
                    None,
                    f"value.records[{i}].value",
                    "value",
                    k1,
                    v1 - k1,
                    _text(v) if _is_text(v) else v,
                    1,
                    None,
                    TEXT if _is_text(v) else BYTES,
                    False,
                )
            )
        records.append(vals)
        pos = v1
        i += 1
    if not records and pos == start == end:
        d.problems.append(Problem("cache transfer must carry at least one record", 8, 4))
    d.body["records"] = records


# ---------------------------------------------------------------------------
# upr


def _dissect_upr(frame: Frame, ctx: DissectContext) -> Dissection:
    d = Dissection(frame, ctx, frame.role)
    raw = frame.raw
    h = frame.header
    d.name = frame.name
    d.title = d.name
    hvals = (h[0], h[1], h[2], h[3])
    d._items.append(("block", UPR_HEADER, 0, hvals, "header.", 0))
    _field_problems(UPR_HEADER[0], h[0], 0, d)
    if h[1] != b"\0\0\0":
        d.problems.append(Problem("reserved bytes are not zero", 1, 3))
    variants = UPR_BODIES.get(h[0], ())
    start = UPR_HEADER_SIZE
    end = len(raw)
    btype = raw[start] if end > start else None
    chosen = None
    for v in variants:
        if all(attr == "type" and btype == want for attr, want in v.when):
            chosen = v
            break
    if chosen is None:
        if end > start:
            d.problems.append(Problem(f"unknown body type {btype} for {d.name}", start, 1))
            d._items.append(("leaf", None, "body", "Body", start, end - start, raw[start:end], 1, None, BYTES, False))
        return d
    d.variant = chosen.name
    if "Key+Value" in {f.label for f in chosen.value if isinstance(f, Field)} if isinstance(chosen.value, tuple) else False:
        d.problems.append(Problem("the UPR draft's mutation has no key length: key/value boundary unspecified", start, end - start))
    if isinstance(chosen.value, tuple):
        if chosen.value:
            _decode_fields(d, chosen.value, raw, start, end, "body.", 1, d.body)
        elif end > start:
            d.problems.append(Problem(f"{d.name} has no body", start, end - start))
    elif end > start:
        d._items.append(("leaf", None, "body", "Body", start, end - start, raw[start:end], 1, None, BYTES, False))
    return d


# ---------------------------------------------------------------------------
# expansion into FieldValues (lazy: only renderers and exports need them)


def _expand(d: Dissection) -> list[FieldValue]:
    raw = d.frame.raw
    out: list[FieldValue] = []
    secrets = d.secrets
    for it in d._items:
        tag = it[0]
        if tag == "header":
            _, layout, h, alt = it
            if alt:
                values: tuple[Any, ...] = (h[0], h[1], h[2] >> 8, h[2] & 0xFF, *h[3:])
            else:
                values = tuple(h)
            _expand_block(out, raw, layout, 0, values, "header.", 0)
        elif tag == "block":
            _, fields, off, values, prefix, depth = it
            _expand_block(out, raw, fields, off, values, prefix, depth)
        else:
            _, f, path, label, off, length, value, depth, meaning, kind, secret = it
            if meaning is None and f is not None:
                meaning = f.meaning(value)
            if kind == TEXT and isinstance(value, bytes):
                value = _text(value)
            rawb = raw[off : off + length]
            if not secret and secrets and any(s < off + length and off < s + n for s, n in secrets):
                secret = True
            out.append(FieldValue(path, label, off, length, rawb, value, meaning, depth, kind, secret))
    return out


def _expand_block(
    out: list[FieldValue], raw: bytes, fields: tuple[Field, ...], off: int, values: tuple[Any, ...], prefix: str, depth: int
) -> None:
    for f, v in zip(fields, values, strict=True):
        size = f.size or 0
        value = _text(v) if f.kind == TEXT and isinstance(v, bytes) else v
        out.append(FieldValue(prefix + f.name, f.label, off, size, raw[off : off + size], value, f.meaning(value), depth, f.kind, False))
        off += size


#: field kinds rendered as zero-padded hex integers
INT_KINDS = frozenset(("uint", "int", "flags", "enum", HEX, "leb128"))
