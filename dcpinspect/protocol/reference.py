"""The generated protocol reference: every opcode's layout, straight from the table.

``reference_rows()`` gives one plain dict per (command, role, variant, field)
with its section, offset and size, and for a DCP request whether its receiver
replies (``reply``, from :data:`~dcpinspect.protocol.rules.REPLIES`); ``reference_markdown()`` renders them as
the ``REFERENCE.md`` shipped with the project (a test keeps that file current);
``dcpinspect.tables.export.reference_frame()`` is the same rows as a DataFrame.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import spec
from .enums import Opcode
from .fields import ENUM, FLAGS, Field, Group, Variant
from .rules import REPLIES
from .upr import UPR_BODIES, UPR_HEADER, UPR_OPCODES

__all__ = ["reference_markdown", "reference_rows", "reply_of"]


def _row(section: str, field: str, label: str, offset: object, size: object, kind: str, values: str = "", doc: str = "") -> dict[str, Any]:
    """One reference row."""
    return {"section": section, "field": field, "label": label, "offset": offset, "size": size, "kind": kind, "values": values, "doc": doc}


def _names(f: Field) -> str:
    if f.names is None or f.kind not in (ENUM, FLAGS):
        return ""
    if f.names is spec.STATUS or f.names is spec.FEATURES:
        return "see table"
    fmt = "0x{:x}" if f.kind == FLAGS else "{}"
    return ", ".join(f"{fmt.format(k)} {v}" for k, v in f.names.items())


def _section_rows(section: str, fields: tuple[Field | Group, ...], start: int | str) -> Iterator[dict[str, Any]]:
    off: int | str = start
    for f in fields:
        if isinstance(f, Group):
            for g in f.fields:
                yield _row(section, f"{f.name}[].{g.name}", g.label, f"+{_group_off(f, g)} (repeated)", g.size, g.kind, _names(g), f.doc)
            off = "..."
            continue
        yield _row(section, f.name, f.label, off, f.size if f.size is not None else "rest", f.kind, _names(f), f.doc)
        off = off + f.size if isinstance(off, int) and f.size is not None else "..."


def _group_off(g: Group, target: Field) -> int:
    off = 0
    for f in g.fields:
        if f is target:
            return off
        off += f.size or 0
    return off


def _variant_rows(v: Variant) -> Iterator[dict[str, Any]]:
    yield from _section_rows("extras", v.extras, 0)
    if v.any_extras:
        yield _row("extras", "extras", "Extras", 0, "any", "bytes", "", "")
    if v.key != "none":
        yield _row(
            "key",
            "key",
            v.key_label,
            0,
            "key length",
            v.key,
            "",
            "document key (collection id prefixed when collections are negotiated)" if v.key.startswith("doc") else "",
        )
    if isinstance(v.value, tuple):
        yield from _section_rows("value", v.value, 0)
    elif v.value != "none":
        yield _row("value", "value", v.value_label, 0, "rest", v.value, ", ".join(v.json_keys) if v.json_keys else "", "")


def reply_of(op: int) -> str:
    """Whether the receiver of a DCP request answers it, in words (``""`` for an opcode outside DCP)."""
    try:
        return REPLIES.get(Opcode(op), "")
    except ValueError:  # not an opcode of the table
        return ""


def reference_rows() -> list[dict[str, Any]]:
    """One row per (command, role, variant, field) of the mcbp and upr tables; ``reply`` is set on DCP requests."""
    rows: list[dict[str, Any]] = []
    for op in sorted(spec.COMMANDS):
        cmd = spec.COMMANDS[op]
        for role, variants in (("request", cmd.request), ("response", cmd.response or (spec.STATUS_ONLY,))):
            reply = reply_of(op) if role == "request" else ""
            for v in variants:
                when = ", ".join(f"{k}={w}" for k, w in v.when)
                base = {"dialect": "mcbp", "opcode": f"0x{op:02x}", "name": cmd.name, "role": role, "variant": v.name, "when": when}
                base["reply"] = reply
                rules = []
                if v.cas:
                    rules.append(f"CAS {v.cas}")
                if cmd.sid and role == "request":
                    rules.append({"stream": "carries stream id when enabled", "never": "never carries a stream id"}[cmd.sid])
                if cmd.obsolete:
                    rules.append(cmd.obsolete)
                body = list(_variant_rows(v))
                if not body:
                    body = [_row("", "", "(no body)", "", 0, "", "", "")]
                for r in body:
                    rows.append({**base, **r, "rules": "; ".join(rules)})
    for op, variants in UPR_BODIES.items():
        for v in variants:
            base = {
                "dialect": "upr",
                "opcode": f"0x{op:02x}",
                "name": "UPR " + UPR_OPCODES[op],
                "role": "response" if op == 2 else "request",
                "variant": v.name,
                "when": ", ".join(f"{k}={w}" for k, w in v.when),
                "rules": "",
                "reply": "",
            }
            for r in (
                _section_rows("body", v.value, 12)
                if isinstance(v.value, tuple)
                else [_row("body", "body", "Body", 12, "rest", str(v.value), "", "")]
            ):
                rows.append({**base, **r})
    return rows


def _layout_table(fields: tuple[Field, ...]) -> list[str]:
    rows = []
    off = 0
    for f in fields:
        rows.append([str(off), str(f.size), f.label, f.name])
        off += f.size or 0
    return _md_table(["offset", "size", "label", "field"], rows)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def reference_markdown() -> str:
    """The protocol reference as Markdown (generated; do not edit REFERENCE.md by hand)."""
    lines = [
        "# dcpinspect protocol reference",
        "",
        "Generated from `dcpinspect/spec.py` and `dcpinspect/spec_upr.py` by",
        "`python -m dcpinspect reference > REFERENCE.md`; a test fails when it is stale.",
        "Offsets are relative to the start of each section (extras, key, value).",
        "",
        "## Header layouts",
        "",
    ]
    for (alt, resp), layout in spec.HEADER_LAYOUTS.items():
        magics = [f"0x{m:02x}" for m in spec.MAGICS if (m in spec.ALT_MAGICS) == alt and (m in spec.RESPONSE_MAGICS) == resp]
        lines.append(f"**{'alt' if alt else 'classic'} {'response' if resp else 'request'}** (magic {', '.join(magics)}):")
        lines += ["", *_layout_table(layout), ""]
    lines += ["**UPR draft header** (12 bytes):", "", *_layout_table(UPR_HEADER), ""]
    for title, table in (
        ("Magic bytes", {f"0x{k:02x}": v for k, v in spec.MAGICS.items()}),
        ("Datatype bits", {f"0x{k:02x}": v for k, v in spec.DATATYPE.items()}),
        ("Status codes", {f"0x{k:04x}": v for k, v in spec.STATUS.items()}),
        ("HELLO features", {f"0x{k:04x}": v for k, v in spec.FEATURES.items()}),
        ("Request frame infos", {str(k): v[0] for k, v in spec.REQUEST_FRAME_INFOS.items()}),
        ("Response frame infos", {str(k): v[0] for k, v in spec.RESPONSE_FRAME_INFOS.items()}),
        ("DCP_CONTROL keys", dict(spec.CONTROL_KEYS)),
    ):
        lines += [f"## {title}", "", *_md_table(["code", "name"], [[k, v] for k, v in table.items()]), ""]
    lines += [
        "## Does the receiver reply? (DCP)",
        "",
        "Whether the receiver of each DCP request answers it with a response: most of the",
        "producer's stream messages are never answered when all goes well.",
        "",
        *_md_table(["opcode", "name", "reply?"], [[f"0x{int(op):02x}", op.name, text] for op, text in sorted(REPLIES.items())]),
        "",
        "## Commands",
        "",
    ]
    current = None
    for r in reference_rows():
        head = (
            f"### {r['opcode']} {r['name']} {r['role']}"
            + (f" - {r['variant']}" if r["variant"] else "")
            + (f" ({r['when']})" if r["when"] else "")
        )
        if head != current:
            if current is not None:
                lines.append("")
            lines += [head, ""]
            if r["rules"]:
                lines += [f"Rules: {r['rules']}.", ""]
            if r["reply"]:
                lines += [f"Reply: {r['reply']}.", ""]
            lines += ["| section | offset | size | label | field | values |", "|---|---|---|---|---|---|"]
            current = head
        lines.append(
            "| " + " | ".join(str(r[k]).replace("|", "\\|") for k in ("section", "offset", "size", "label", "field", "values")) + " |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# the enums, generated into source (enums.py) so that type checkers see them

#: (class name, base, the table's dict, what it names)
_ENUM_SOURCES: tuple[tuple[str, str, str, str], ...] = (
    ("Magic", "IntEnum", "spec.MAGICS", "the first header byte"),
    ("Opcode", "IntEnum", "OPCODE_NAMES", "memcached binary protocol and DCP opcodes"),
    ("Status", "IntEnum", "spec.STATUS", "response status codes"),
    ("Feature", "IntEnum", "spec.FEATURES", "HELLO features"),
    ("Datatype", "IntFlag", "spec.DATATYPE", "datatype bits"),
    ("OpenFlag", "IntFlag", "spec.DCP_OPEN_FLAGS", "DCP_OPEN flags"),
    ("StreamReqFlag", "IntFlag", "spec.STREAM_REQ_FLAGS", "DCP_STREAM_REQ flags"),
    ("SnapshotFlag", "IntFlag", "spec.SNAPSHOT_FLAGS", "DCP_SNAPSHOT_MARKER flags"),
    ("StreamEndStatus", "IntEnum", "spec.STREAM_END_STATUS", "DCP_STREAM_END status"),
    ("VBucketState", "IntEnum", "spec.VBUCKET_STATES", "vbucket states"),
    ("SystemEvent", "IntEnum", "spec.SYSTEM_EVENTS", "DCP_SYSTEM_EVENT event ids"),
    ("DurabilityLevel", "IntEnum", "spec.DURABILITY_LEVELS", "sync-write durability levels"),
    ("OsoFlag", "IntFlag", "spec.OSO_FLAGS", "DCP_OSO_SNAPSHOT flags"),
    ("MarkerVersion", "IntEnum", "spec.MARKER_VERSIONS", "snapshot marker v2 versions"),
    ("UprOpcode", "IntEnum", "UPR_OPCODES", "UPR draft opcodes"),
)


def _member(label: str) -> str:
    """``"KeyEnoent"`` -> ``KEY_ENOENT``, ``"include xattrs"`` -> ``INCLUDE_XATTRS``, ``"v2.0"`` -> ``V2_0``."""
    import re

    text = re.sub(r"\s*\(.*?\)", "", label).strip() or label
    if " " not in text and not text.isupper():
        text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", text)
    name = re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_").upper()
    return name if name[:1].isalpha() else "V_" + name


def _enum_tables() -> dict[str, dict[int, str]]:
    return {
        "OPCODE_NAMES": {c.opcode: c.name for c in spec.COMMANDS.values()},
        "UPR_OPCODES": dict(UPR_OPCODES),
        **{f"spec.{n}": getattr(spec, n) for n in dir(spec) if n.isupper() and isinstance(getattr(spec, n), dict)},
    }


def enums_source() -> str:
    """The text of ``dcpinspect/protocol/enums.py``: one enum per table dict (a test keeps the file current)."""
    tables = _enum_tables()
    out = [
        '"""The protocol\'s numbers as enums, GENERATED from the table (:mod:`dcpinspect.protocol.spec`): do not edit.',
        "",
        "Regenerate with ``python -m dcpinspect.protocol.reference --enums > dcpinspect/protocol/enums.py``;",
        "``tests/protocol/test_enums.py`` fails when this file and the table disagree.",
        '"""',
        "",
        "from enum import IntEnum, IntFlag",
        "",
        "__all__ = [",
        *(f'    "{name}",' for name in sorted(n for n, *_ in _ENUM_SOURCES)),
        "]",
    ]
    for name, base, source, what in _ENUM_SOURCES:
        out += ["", "", f"class {name}({base}):", f'    """{what[0].upper() + what[1:]} (``{source}``)."""', ""]
        seen: set[str] = set()
        for value, label in sorted(tables[source].items()):
            member = _member(label)
            if member in seen:
                member = f"{member}_{value:X}"
            seen.add(member)
            number = f"0x{value:02X}" if base == "IntFlag" or name in ("Opcode", "Magic", "Status", "Feature") else str(value)
            out.append(f"    {member} = {number}" + (f"  # {label}" if "(" in label else ""))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--enums"]:
        sys.stdout.write(enums_source())
    else:
        sys.stdout.write(reference_markdown())
