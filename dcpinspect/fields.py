"""Field kinds the protocol table is written in.

A :class:`Field` is one named, labelled slice of a frame section; a
:class:`Group` is a run of fields repeated until its section ends (failover-log
entries, HELLO features, vbucket seqnos).  A :class:`Variant` says what one
opcode's body looks like in one situation (role, status, extras length, a value
of an extras field) and which protocol rules apply to it.

This module holds only the *vocabulary*; ``spec.py`` and ``spec_upr.py`` hold
the data.  The same declarations are interpreted by ``dissect.py`` (decode),
``encode.py`` (build), ``render.py`` (labels) and ``reference.py`` (docs).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "BYTES",
    "ENUM",
    "FLAGS",
    "HEX",
    "INT",
    "TEXT",
    "UINT",
    "Command",
    "Field",
    "Group",
    "Variant",
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
    #: (extras index, must be zero?, message): the zero/non-zero rules on extras fields
    zero_checks: tuple[tuple[int, bool, str], ...] = field(init=False)
    #: the remaining rules (need the decoded values by name)
    other_checks: tuple[tuple[object, ...], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extras_len", sum(f.size or 0 for f in self.extras))
        object.__setattr__(self, "extras_struct", compile_struct(self.extras))
        object.__setattr__(self, "extras_names", tuple(f.name for f in self.extras))
        checked = []
        off = 0
        for i, f in enumerate(self.extras):
            if f.invalid or (f.strict and f.names is not None and f.kind in (FLAGS, ENUM)):
                checked.append((i, off, f))
            off += f.size or 0
        object.__setattr__(self, "extras_checked", tuple(checked))
        names = [f.name for f in self.extras]
        zero_checks = tuple(
            (names.index(c[1]), c[0] == "zero", str(c[2])) for c in self.checks if c[0] in ("zero", "nonzero") and c[1] in names
        )
        object.__setattr__(self, "zero_checks", zero_checks)
        object.__setattr__(self, "other_checks", tuple(c for c in self.checks if not (c[0] in ("zero", "nonzero") and c[1] in names)))


@dataclass(frozen=True, slots=True)
class Command:
    """One opcode: its name, request and response variants, stream role.

    ``sid`` says how the DCP stream-id frame info (FACTS §7.1) applies:
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
