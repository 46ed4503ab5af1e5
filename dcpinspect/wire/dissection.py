"""What a dissection produces: the context it is read in, its fields, its problems.

:func:`~dcpinspect.wire.dissect.dissect` fills a :class:`Dissection` with
values by name (``extras``, ``body``, ``key``, ``document`` ...) and with a
compact record of where every field is: a list of :class:`Leaf` (one field)
and :class:`Block` (a run of table fields read at once) tuples.  The
:class:`FieldValue` list a renderer or an export needs is expanded from that
record only when asked for (:attr:`Dissection.fields`), because most frames
are never drawn.

The same bytes mean different things on different connections (collection-id
key prefixes, delete-time deletions, stream-ids), so a dissection is read in
a :class:`DissectContext`.  A field of the context left at ``None`` means "not
known" (a capture that starts mid-connection): then nothing is guessed and no
context rule is checked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..protocol import spec
from ..protocol.enums import Feature, OpenFlag
from ..protocol.fields import HEX, TEXT, Field
from .events import Frame, render_html, render_text

__all__ = [
    "DEFAULT_CONTEXT",
    "INT_KINDS",
    "Block",
    "DissectContext",
    "Dissection",
    "FieldValue",
    "Leaf",
    "Problem",
    "leaf",
    "text",
]

#: field kinds rendered as zero-padded hex integers
INT_KINDS = frozenset(("uint", "int", "flags", "enum", HEX, "leb128"))

_tnew = tuple.__new__
_NO_SECRETS: list[tuple[int, int]] = []  # shared, never appended to (see Dissection.add_secret)


def text(b: bytes) -> str:
    """Wire bytes as text, undecodable bytes escaped."""
    return b.decode("utf-8", "backslashreplace")


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
            collections=Feature.COLLECTIONS in fs,
            xattr=Feature.XATTR in fs,
            snappy=Feature.SNAPPY in fs,
            json=Feature.JSON in fs,
        )

    def with_open_flags(self, flags: int) -> DissectContext:
        """This context updated with DCP_OPEN flags."""
        return replace(
            self,
            delete_times=bool(flags & OpenFlag.INCLUDE_DELETE_TIMES),
            include_xattrs=bool(flags & OpenFlag.INCLUDE_XATTRS),
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


# ---------------------------------------------------------------------------
# the compact record of a dissection's fields


class Leaf(NamedTuple):
    """One field, as the dissector found it (expanded into a :class:`FieldValue` on demand).

    ``value`` may still be bytes for a ``text`` field (decoded on expansion);
    a ``meaning`` of ``None`` is asked of ``field`` (the table field, if any).
    """

    path: str
    label: str
    offset: int
    length: int
    value: Any
    depth: int = 0
    meaning: str | None = None
    kind: str = TEXT
    secret: bool = False
    field: Field | None = None


class Block(NamedTuple):
    """A run of table fields read at once from ``offset`` (extras, the UPR header)."""

    fields: tuple[Field, ...]
    offset: int
    values: tuple[Any, ...]
    prefix: str
    depth: int


def leaf(
    path: str,
    label: str,
    offset: int,
    length: int,
    value: Any,
    depth: int = 0,
    meaning: str | None = None,
    kind: str = TEXT,
    secret: bool = False,
    field: Field | None = None,
) -> Leaf:
    """A :class:`Leaf` (as fast as a plain tuple; the hot paths build them with ``tuple.__new__`` directly)."""
    return _tnew(Leaf, (path, label, offset, length, value, depth, meaning, kind, secret, field))


class Dissection:
    """The result of :func:`~dcpinspect.wire.dissect.dissect`.

    Attributes:
        frame: the dissected frame.
        name: command name (``DCP_MUTATION``, ``unknown 0xNN``).
        title: name and role word (``DCP_MUTATION command``).
        role: ``"request"`` / ``"response"``.
        variant: the table variant that applied (``"v2.2"``, ``"rollback"``, ``""``).
        extras: extras field values by name.
        body: structured value field values by name (groups as lists of dicts).
        key: key bytes without the collection-id prefix.
        cid: collection id split from the key (``None`` if not split).
        stream_id: DCP stream id from the flexible framing extras.
        document: the decoded document (JSON object, text) where one applies.
        problems: protocol violations found, with byte ranges.
        secrets: ``(offset, length)`` of the bytes that are masked secrets.
        missing: how many bytes of the frame were not captured (0: all of it;
            :func:`~dcpinspect.wire.dissect.dissect_truncated` dissects the rest).
        items: the compact record the fields are expanded from (:class:`Leaf`, :class:`Block`),
            in frame order after the header; the dissector appends to it.
        context: the context used.
    """

    __slots__ = (
        "_fields",
        "body",
        "cid",
        "context",
        "document",
        "extras",
        "frame",
        "items",
        "key",
        "missing",
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
        self.items: list[Leaf | Block] = []
        self.missing = 0  # bytes of the frame the capture did not hold (a truncated frame's dissection)
        self._fields: list[FieldValue] | None = None

    @property
    def header(self) -> dict[str, Any]:
        """Header field values by name."""
        return {fv.path.split(".", 1)[1]: fv.value for fv in self.fields if fv.path.startswith("header.")}

    @property
    def fields(self) -> list[FieldValue]:
        """Every field, in frame order (built on first access)."""
        if self._fields is None:
            fields = _expand(self)
            if self.missing:  # a truncated frame: only the fields that start in the bytes captured
                fields = [f for f in fields if f.offset < len(self.frame.raw)]
            self._fields = fields
        return self._fields

    @property
    def key_text(self) -> str:
        """The key as text (undecodable bytes escaped)."""
        return text(self.key)

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

    def add_secret(self, offset: int, length: int) -> None:
        """Mark ``length`` bytes at ``offset`` as a secret (masked in every rendering)."""
        if self.secrets is _NO_SECRETS:
            self.secrets = []
        self.secrets.append((offset, length))

    def span_of(self, name: str) -> tuple[int, int]:
        """Offset and length of the field called ``name`` found so far (``(0, 0)`` if none): where a problem with it points."""
        if self.frame[2] == "mcbp":
            layout, _alt = _HEADER_LAYOUTS[self.frame[1][0]]
            off = 0
            for f in layout:
                if f.name == name:
                    return off, f.size or 0
                off += f.size or 0
        suffix = "." + name
        for it in self.items:
            if isinstance(it, Block):
                off = it.offset
                for f in it.fields:
                    if (it.prefix + f.name).endswith(suffix):
                        return off, f.size or 0
                    off += f.size or 0
            elif it.path.endswith(suffix):
                return it.offset, it.length
        return 0, 0

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
        p.text(render_text(self))

    def _repr_html_(self) -> str:
        return render_html(self)


# ---------------------------------------------------------------------------
# expansion into FieldValues (lazy: only renderers and exports need them)

#: magic -> the layout of its header, its 16-bit key length split in two for the alt magics
_HEADER_LAYOUTS = {m: (spec.HEADER_LAYOUTS[(m in spec.ALT_MAGICS, m in spec.RESPONSE_MAGICS)], m in spec.ALT_MAGICS) for m in spec.MAGICS}


def _expand(d: Dissection) -> list[FieldValue]:
    frame = d.frame
    raw = frame[1]
    out: list[FieldValue] = []
    if frame[2] == "mcbp":
        h = spec.HEADER.unpack_from(raw)
        layout, alt = _HEADER_LAYOUTS[h[0]]
        values = (h[0], h[1], h[2] >> 8, h[2] & 0xFF, *h[3:]) if alt else h
        _expand_block(out, raw, layout, 0, values, "header.", 0)
    secrets = d.secrets
    block = Block
    for it in d.items:
        if isinstance(it, block):
            _expand_block(out, raw, *it)
            continue
        path, label, off, length, value, depth, meaning, kind, secret, f = it
        if meaning is None and f is not None and f.explained:
            meaning = f.meaning(value)
        if kind == TEXT and isinstance(value, bytes):
            value = text(value)
        if not secret and secrets and any(s < off + length and off < s + n for s, n in secrets):
            secret = True
        out.append(FieldValue(path, label, off, length, raw[off : off + length], value, meaning, depth, kind, secret))
    return out


def _expand_block(
    out: list[FieldValue], raw: bytes, fields: tuple[Field, ...], off: int, values: tuple[Any, ...], prefix: str, depth: int
) -> None:
    for f, v in zip(fields, values, strict=True):
        size = f.size or 0
        value = text(v) if f.kind == TEXT and isinstance(v, bytes) else v
        meaning = f.meaning(value) if f.explained else None
        out.append(FieldValue(prefix + f.name, f.label, off, size, raw[off : off + size], value, meaning, depth, f.kind, False))
        off += size
