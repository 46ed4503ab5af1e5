"""Field kinds the protocol table is written in.

A :class:`Field` is one named, labelled slice of a frame section; a
:class:`Group` is a run of fields repeated until its section ends (failover-log
entries, HELLO features, vbucket seqnos).  A :class:`Variant` says what one
opcode's body looks like in one situation (role, status, extras length, a value
of an extras field) and which protocol rules apply to it.

A variant's ``when`` and ``checks`` are written in the table as plain tuples;
:class:`Variant` turns them into typed *conditions* (:class:`ExtrasLength`,
:class:`StatusIs`, :class:`ValueLength`, :class:`FieldIs`: when it applies)
and *rules* (:class:`Zero`, :class:`NonZero`, :class:`Order`,
:class:`Exclusive`, :class:`Requires`, :class:`OnlyWith`, :class:`ContextIs`:
what a frame of it must obey).  Each condition has a scalar ``holds(...)`` and
each rule a scalar ``violated(...)``; the dissector and the encoder call them,
and the vectorised frames table dispatches on their types.

This module holds only the *vocabulary*; ``spec.py`` and ``upr.py`` hold
the data.  The same declarations are interpreted by the wire layer's
dissector (decode), encoder (build) and renderer (labels), and by
``reference.py`` (docs).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .enums import Status

__all__ = [
    "BYTES",
    "ENUM",
    "FLAGS",
    "HEX",
    "INT",
    "TEXT",
    "UINT",
    "Command",
    "Condition",
    "ContextIs",
    "Exclusive",
    "ExtrasLength",
    "Field",
    "FieldIs",
    "Group",
    "NonZero",
    "OnlyWith",
    "Order",
    "Requires",
    "Rule",
    "StatusIs",
    "ValueLength",
    "Variant",
    "Zero",
    "compile_struct",
    "flag_names",
]

# Field kinds (how a fixed-size field's bytes are read and explained).
UINT = "uint"  # big-endian unsigned integer
INT = "int"  # big-endian signed integer
FLAGS = "flags"  # bit set, meaning lists the bit names
ENUM = "enum"  # integer with named values
HEX = "hex"  # integer shown without a meaning (opaque item flags ...)
BYTES = "bytes"  # raw bytes (fixed size or rest of section)
TEXT = "text"  # text (rest of section)

_INT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a section.

    ``size`` is the width in bytes, or ``None`` for "the rest of the section"
    (only allowed last).  ``names`` maps enum values or flag bits to their
    meaning; ``clear`` maps flag bits to the meaning of the bit being *clear*
    (DCP_OPEN's producer bit: clear means consumer).  ``invalid`` lists flag
    bits or enum values whose presence is a protocol violation, with the
    reason.  ``quiet`` values have no meaning printed (Status 0x0000, as the
    docs draw it).
    """

    name: str
    label: str
    size: int | None
    kind: str = UINT
    names: Mapping[int, str] | None = None
    clear: Mapping[int, str] | None = None
    invalid: Mapping[int, str] | None = None
    quiet: frozenset[int] = frozenset()
    strict: bool = True
    doc: str = ""
    #: whether :meth:`meaning` can say anything (an enum or flags with names); if not, it is always ``None``
    explained: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "explained", self.kind in (ENUM, FLAGS) and self.names is not None)

    def meaning(self, value: object) -> str | None:
        """Human meaning of ``value`` (flag names, enum name), or ``None``."""
        if not isinstance(value, int) or value in self.quiet:
            return None
        if self.kind == ENUM and self.names is not None:
            name = self.names.get(value)
            return name if name is not None else f"unknown 0x{value:0{2 * (self.size or 1)}x}"
        if self.kind == FLAGS and self.names is not None:
            return flag_names(value, self.names, self.clear, self.size or 4)
        return None


@dataclass(frozen=True, slots=True)
class Group:
    """Fields repeated until the section ends (``min``/``max`` bound the count)."""

    name: str
    label: str
    fields: tuple[Field, ...]
    doc: str = ""

    @property
    def size(self) -> int:
        """Bytes per repetition."""
        return sum(f.size or 0 for f in self.fields)


# ---------------------------------------------------------------------------
# when a variant applies (``Variant.when``, typed)
#
# ``holds(extlen, status, vlen, fields)``: ``status`` is ``None`` for a request;
# ``vlen`` is ``None`` when not known (the encoder, before the value is built);
# ``fields`` maps the variant's extras fields to their values, or is ``None``
# when the extras do not have the variant's layout.


@dataclass(frozen=True, slots=True)
class ExtrasLength:
    """The extras are ``length`` bytes long."""

    length: int

    def holds(self, extlen: int, status: int | None, vlen: int | None, fields: Mapping[str, object] | None) -> bool:
        """Whether a frame with these facts meets the condition."""
        return extlen == self.length


@dataclass(frozen=True, slots=True)
class StatusIs:
    """A response with this status."""

    status: int

    def holds(self, extlen: int, status: int | None, vlen: int | None, fields: Mapping[str, object] | None) -> bool:
        """Whether a frame with these facts meets the condition."""
        return status == self.status


@dataclass(frozen=True, slots=True)
class ValueLength:
    """The value is ``length`` bytes long."""

    length: int

    def holds(self, extlen: int, status: int | None, vlen: int | None, fields: Mapping[str, object] | None) -> bool:
        """Whether a frame with these facts meets the condition."""
        return vlen is None or vlen == self.length


@dataclass(frozen=True, slots=True)
class FieldIs:
    """The extras field ``name`` (the body's ``type`` in the UPR draft) holds ``value``."""

    name: str
    value: int

    def holds(self, extlen: int, status: int | None, vlen: int | None, fields: Mapping[str, object] | None) -> bool:
        """Whether a frame with these facts meets the condition."""
        return fields is not None and fields.get(self.name) == self.value


Condition = ExtrasLength | StatusIs | ValueLength | FieldIs
_CONDITIONS: dict[str, type[ExtrasLength] | type[StatusIs] | type[ValueLength]] = {
    "extlen": ExtrasLength,
    "status": StatusIs,
    "vlen": ValueLength,
}


def _condition(attr: str, want: int) -> Condition:
    kind = _CONDITIONS.get(attr)
    return FieldIs(attr, want) if kind is None else kind(want)


# ---------------------------------------------------------------------------
# what a frame of a variant must obey (``Variant.checks``, typed)
#
# ``violated(values, context)``: ``values`` maps field names to decoded values
# (a field that is absent or not an integer breaks no rule); ``context`` is the
# connection context (a ``DissectContext``; an attribute of ``None`` is unknown).
# ``field`` names the field a problem points at (``None``: the header).


@dataclass(frozen=True, slots=True)
class Zero:
    """The field must be 0."""

    field: str
    message: str
    #: broken when ``(value != 0) is must_be_zero`` (the dissector's fast path tests the unpacked extras so)
    must_be_zero: ClassVar[bool] = True

    def violated(self, values: Mapping[str, Any], context: object = None) -> bool:
        """Whether these values break the rule."""
        v = values.get(self.field)
        return isinstance(v, int) and (v != 0) is self.must_be_zero


@dataclass(frozen=True, slots=True)
class NonZero:
    """The field must not be 0."""

    field: str
    message: str
    #: broken when ``(value != 0) is must_be_zero``
    must_be_zero: ClassVar[bool] = False

    def violated(self, values: Mapping[str, Any], context: object = None) -> bool:
        """Whether these values break the rule."""
        v = values.get(self.field)
        return isinstance(v, int) and (v != 0) is self.must_be_zero


@dataclass(frozen=True, slots=True)
class Order:
    """``field`` must not be above ``high`` (seqno ranges)."""

    field: str
    high: str
    message: str

    def violated(self, values: Mapping[str, Any], context: object = None) -> bool:
        """Whether these values break the rule."""
        lo = values.get(self.field)
        hi = values.get(self.high)
        return isinstance(lo, int) and isinstance(hi, int) and lo > hi


@dataclass(frozen=True, slots=True)
class Exclusive:
    """The flag bits ``bit`` and ``other`` of ``field`` must not both be set."""

    field: str
    bit: int
    other: int
    message: str

    def violated(self, values: Mapping[str, Any], context: object = None) -> bool:
        """Whether these values break the rule."""
        v = values.get(self.field)
        return isinstance(v, int) and bool(v & self.bit) and bool(v & self.other)


@dataclass(frozen=True, slots=True)
class Requires:
    """The flag bit ``bit`` of ``field`` needs the bit ``needs`` set too."""

    field: str
    bit: int
    needs: int
    message: str

    def violated(self, values: Mapping[str, Any], context: object = None) -> bool:
        """Whether these values break the rule."""
        v = values.get(self.field)
        return isinstance(v, int) and bool(v & self.bit) and not v & self.needs


@dataclass(frozen=True, slots=True)
class OnlyWith:
    """With the flag bit ``bit`` of ``field`` set, no bit outside ``allowed`` may be."""

    field: str
    bit: int
    allowed: int
    message: str

    def violated(self, values: Mapping[str, Any], context: object = None) -> bool:
        """Whether these values break the rule."""
        v = values.get(self.field)
        return isinstance(v, int) and bool(v & self.bit) and bool(v & ~self.allowed)


@dataclass(frozen=True, slots=True)
class ContextIs:
    """The connection negotiated ``attr`` as ``value`` (an unknown context breaks nothing)."""

    attr: str
    value: bool
    message: str
    field: None = None

    def violated(self, values: Mapping[str, Any], context: object = None) -> bool:
        """Whether this connection context breaks the rule."""
        have = getattr(context, self.attr, None)
        return have is not None and have is not self.value


Rule = Zero | NonZero | Order | Exclusive | Requires | OnlyWith | ContextIs
#: the table's check names -> rule classes (``("zero", field, message)`` -> ``Zero(field, message)``)
_RULES: dict[str, type[Rule]] = {
    "zero": Zero,
    "nonzero": NonZero,
    "order": Order,
    "exclusive": Exclusive,
    "requires": Requires,
    "cache_transfer_only_with": OnlyWith,
    "context": ContextIs,
}


def _rule(check: tuple[object, ...]) -> Rule:
    kind = _RULES.get(str(check[0]))
    if kind is None:
        raise ValueError(f"unknown check {check[0]!r} in the table")
    return kind(*check[1:])  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Variant:
    """The body layout of one opcode in one situation, plus its rules.

    ``when`` holds (attribute, value) pairs that must all hold for the variant
    to apply: ``extlen``, ``status``, ``vlen`` or the name of an extras field.
    ``key`` is a key kind: ``none``, ``doc`` / ``doc?`` (document key, collection
    id prefixed when collections are negotiated), ``text`` / ``text?``,
    ``agent`` (HELLO), ``any``.  ``value`` is a tuple of fields/groups or a value
    kind: ``none``, ``any``, ``doc``, ``doc?``, ``text``, ``text?``, ``json``,
    ``json?``, ``error``, ``sasl``, ``flatbuffers:<Table>``, ``cache_records``.
    """

    name: str = ""
    when: tuple[tuple[str, int], ...] = ()
    extras: tuple[Field, ...] = ()
    any_extras: bool = False
    key: str = "none"
    key_label: str = "Key"
    value: tuple[Field | Group, ...] | str = "none"
    value_label: str = "Value"
    json_keys: Mapping[str, str] | None = None
    cas: str | None = None  # "zero" | "nonzero"
    datatypes: frozenset[int] | None = None
    checks: tuple[tuple[object, ...], ...] = ()
    doc: str = ""
    extras_len: int = field(init=False)
    extras_struct: struct.Struct | None = field(init=False)
    extras_names: tuple[str, ...] = field(init=False)
    #: (index, offset, field) of the extras fields with value rules (enum/flags/invalid)
    extras_checked: tuple[tuple[int, int, Field], ...] = field(init=False)
    #: ``when``, typed: every condition must hold for the variant to apply
    conditions: tuple[Condition, ...] = field(init=False, repr=False, compare=False)
    #: the extras values a frame of this variant has (the :class:`FieldIs` conditions), by name
    selector_values: Mapping[str, int] = field(init=False, repr=False, compare=False)
    #: ``checks``, typed
    rules: tuple[Rule, ...] = field(init=False, repr=False, compare=False)
    #: the zero/non-zero rules on extras fields, checked as soon as the extras are read, on the unpacked
    #: extras: (index of the field, ``must_be_zero``, rule); broken when ``(value != 0) is must_be_zero``
    extras_screen: tuple[tuple[int, bool, Zero | NonZero], ...] = field(init=False, repr=False, compare=False)
    #: the other rules (checked after the key and the value)
    value_rules: tuple[Rule, ...] = field(init=False, repr=False, compare=False)
    #: whether the variant names the status it applies to (else it applies to successes only)
    by_status: bool = field(init=False, repr=False, compare=False)
    #: ``value`` when it is a kind: its name without ``?`` or ``:<argument>`` (``"fields"`` for a tuple of fields)
    value_kind: str = field(init=False, repr=False, compare=False)
    #: the ``<argument>`` of a ``kind:<argument>`` value (the FlatBuffers table), else ``""``
    value_argument: str = field(init=False, repr=False, compare=False)
    #: whether a frame of this variant must carry a value
    value_required: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "extras_len", sum(f.size or 0 for f in self.extras))
        setattr_(self, "extras_struct", compile_struct(self.extras))
        names = tuple(f.name for f in self.extras)
        setattr_(self, "extras_names", names)
        checked = []
        off = 0
        for i, f in enumerate(self.extras):
            if f.invalid or (f.strict and f.names is not None and f.kind in (FLAGS, ENUM)):
                checked.append((i, off, f))
            off += f.size or 0
        setattr_(self, "extras_checked", tuple(checked))
        conditions = tuple(_condition(attr, want) for attr, want in self.when)
        setattr_(self, "conditions", conditions)
        setattr_(self, "selector_values", {c.name: c.value for c in conditions if isinstance(c, FieldIs)})
        setattr_(self, "by_status", any(isinstance(c, StatusIs) for c in conditions))
        rules = tuple(_rule(c) for c in self.checks)
        setattr_(self, "rules", rules)
        screen = tuple((names.index(r.field), r.must_be_zero, r) for r in rules if isinstance(r, (Zero, NonZero)) and r.field in names)
        setattr_(self, "extras_screen", screen)
        setattr_(self, "value_rules", tuple(r for r in rules if not any(r is z for _, _, z in screen)))
        if isinstance(self.value, tuple):  # required unless empty, or only groups (which may repeat 0 times)
            kind, argument = "fields", ""
            required = any(isinstance(f, Field) for f in self.value)
        else:
            kind, _, argument = self.value.partition(":")
            required = kind in _REQUIRED_VALUES  # their ``kind?`` forms may be empty
            kind = kind.rstrip("?")
        setattr_(self, "value_kind", kind)
        setattr_(self, "value_argument", argument)
        setattr_(self, "value_required", required)

    def applies(self, extlen: int, status: int | None, vlen: int | None, fields: Mapping[str, object] | None) -> bool:
        """Whether a frame with these facts is of this variant (see the conditions' ``holds``).

        A response variant that names no status applies to successes only.
        """
        if status is not None and status != _SUCCESS and not self.by_status:
            return False
        for c in self.conditions:  # noqa: SIM110 - a loop is faster than all() here (once per frame)
            if not c.holds(extlen, status, vlen, fields):
                return False
        return True


#: value kinds a frame must carry a value of (their ``kind?`` forms may be empty)
_REQUIRED_VALUES = frozenset(("doc", "text", "json", "cache_records", "flatbuffers"))
_SUCCESS = int(Status.SUCCESS)


@dataclass(frozen=True, slots=True)
class Command:
    """One opcode: its name, request and response variants, stream role.

    ``sid`` says how the DCP stream-id frame info (kv_engine docs/dcp/documentation/stream-id.md) applies:
    ``stream`` - carried when stream-ids are enabled (and required then);
    ``never`` - must never carry one (prepare/commit/abort, sync writes);
    ``None`` - not a stream message (connection-level).
    ``obsolete`` explains why sending it at all is a problem.
    """

    opcode: int
    name: str
    request: tuple[Variant, ...]
    response: tuple[Variant, ...] = ()
    sid: str | None = None
    group: str = "kv"
    obsolete: str = ""
    doc: str = ""


def compile_struct(fields: tuple[Field, ...]) -> struct.Struct | None:
    """One precompiled big-endian struct for a run of fixed-size fields (dpkt's trick)."""
    if not fields:
        return None
    fmt = [">"]
    for f in fields:
        if f.size is None:
            return None
        if f.kind in (BYTES, TEXT):
            fmt.append(f"{f.size}s")
        elif f.size in _INT_CODES:
            code = _INT_CODES[f.size]
            fmt.append(code.lower() if f.kind == INT else code)
        else:
            fmt.append(f"{f.size}s")
    return struct.Struct("".join(fmt))


def flag_names(
    value: int,
    names: Mapping[int, str],
    clear: Mapping[int, str] | None = None,
    size: int = 4,
) -> str | None:
    """Comma-separated names of the bits in ``value`` (and of cleared named bits)."""
    parts: list[str] = []
    if clear:
        parts.extend(name for bit, name in clear.items() if not value & bit)
    known = 0
    for bit, name in names.items():
        known |= bit
        if value & bit:
            parts.append(name)
    rest = value & ~known
    if rest:
        parts.append(f"unknown 0x{rest:0{2 * size}x}")
    return ", ".join(parts) if parts else None
