"""Build frames from the protocol table: every length derived, malformation explicit.

>>> from dcpinspect import encode, decode
>>> raw = encode("DCP_STREAM_REQ", opaque=0x1000, extras={"start_seqno": 0xffeedd, "end_seqno": 2**64 - 1})
>>> decode(raw)[0].name
'DCP_STREAM_REQ'

``overrides`` sets header fields after the lengths were derived, so tests and
a faulty-peer simulation can build deliberately malformed frames:
``encode("DCP_NOOP", overrides={"body_length": 3})``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from . import spec
from .fields import BYTES, INT, TEXT, Field, Group, Variant
from .flatbuf import build_table
from .spec_upr import UPR_BODIES, UPR_HEADER_STRUCT

__all__ = ["EncodeError", "encode", "encode_frame_infos", "encode_leb128"]


class EncodeError(ValueError):
    """The arguments do not describe a frame the table can build (local misuse)."""


def encode_leb128(value: int) -> bytes:
    """Unsigned LEB128 (the canonical, shortest form)."""
    if value < 0:
        raise EncodeError("LEB128 values are unsigned")
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_frame_infos(infos: Iterable[tuple[int, bytes]]) -> bytes:
    """Flexible framing extras from ``(id, payload)`` pairs (both nibble escapes)."""
    out = bytearray()
    for fid, payload in infos:
        if fid < 0 or fid > 15 + 255 or len(payload) > 15 + 255:
            raise EncodeError(f"frame info id {fid} / length {len(payload)} cannot be encoded")
        idn = min(fid, 15)
        ln = min(len(payload), 15)
        out.append(idn << 4 | ln)
        if idn == 15:
            out.append(fid - 15)
        if ln == 15:
            out.append(len(payload) - 15)
        out += payload
    return bytes(out)


def _pack_fields(fields: tuple[Field | Group, ...], values: Mapping[str, Any], defaults: Mapping[str, int] | None = None) -> bytes:
    unknown = set(values) - {f.name for f in fields}
    if unknown:
        raise EncodeError(f"unknown field(s) {sorted(unknown)}; expected {[f.name for f in fields]}")
    out = bytearray()
    for f in fields:
        if isinstance(f, Group):
            for entry in values.get(f.name, ()):
                named = entry if isinstance(entry, Mapping) else dict(zip([g.name for g in f.fields], entry, strict=True))
                out += _pack_fields(f.fields, named)
            continue
        v = values.get(f.name, (defaults or {}).get(f.name, b"" if f.kind in (BYTES, TEXT) else 0))
        if f.kind in (BYTES, TEXT):
            b = v.encode() if isinstance(v, str) else bytes(v)
            if f.size is not None:
                if len(b) > f.size:
                    raise EncodeError(f"{f.name}: {len(b)} bytes do not fit in {f.size}")
                b = b.ljust(f.size, b"\0")
            out += b
        else:
            size = f.size or 0
            try:
                out += int(v).to_bytes(size, "big", signed=f.kind == INT)
            except OverflowError as exc:
                raise EncodeError(f"{f.name}={v} does not fit in {size} bytes") from exc
    return bytes(out)


def _pick(variants: tuple[Variant, ...], name: str | None, response: bool, status: int, extras: Any, value: Any) -> Variant | None:
    if name is not None:
        for v in variants:
            if v.name == name:
                return v
        raise EncodeError(f"no variant {name!r}; have {[v.name for v in variants]}")
    for v in variants:
        conds = dict(v.when)
        if response and conds.get("status", 0) != status:
            continue
        if isinstance(extras, Mapping):
            names = {f.name for f in v.extras}
            if not set(extras) <= names:
                continue
            if any(k in extras and extras[k] != want for k, want in conds.items() if k in names):
                continue
        elif isinstance(extras, (bytes, bytearray)) and "extlen" in conds and conds["extlen"] != len(extras):
            continue
        elif extras is None and v.extras and any(k in conds for k in (f.name for f in v.extras)) and v is not variants[0]:
            continue  # variants selected by an extras field need that field given
        return v
    return variants[0] if variants and not response else None


def _value_bytes(variant: Variant | None, value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    kind = variant.value if variant is not None else "any"
    if isinstance(kind, tuple):
        if isinstance(value, Mapping):
            return _pack_fields(kind, value)
        if isinstance(value, list) and len(kind) == 1 and isinstance(kind[0], Group):
            return _pack_fields(kind, {kind[0].name: value})
        raise EncodeError(f"value for this variant must be a mapping of {[f.name for f in kind]}")
    if isinstance(kind, str) and kind.startswith("flatbuffers:") and isinstance(value, Mapping):
        return build_table(dict(value), spec.FLATBUFFER_TABLES[kind.split(":", 1)[1]])
    if isinstance(value, (Mapping, list, int, float, bool)):
        return json.dumps(value, separators=(",", ":")).encode()
    raise EncodeError(f"cannot encode a value of type {type(value).__name__}")


def encode(
    opcode: int | str,
    *,
    response: bool = False,
    magic: int | None = None,
    variant: str | None = None,
    extras: Mapping[str, Any] | bytes | None = None,
    key: bytes | str = b"",
    cid: int | None = None,
    value: Any = None,
    vbucket: int = 0,
    status: int = 0,
    opaque: int = 0,
    cas: int = 0,
    datatype: int = 0,
    frame_infos: Iterable[tuple[int, bytes]] = (),
    stream_id: int | None = None,
    overrides: Mapping[str, int] | None = None,
    dialect: str = "mcbp",
) -> bytes:
    """Build one frame from the table.

    ``extras`` and a structured ``value`` are mappings of field names (missing
    fields are 0; fields a variant is selected by are filled in); a failover
    log may be given as a list of ``(uuid, seqno)``; JSON values as dicts.
    ``cid`` prefixes the key with its LEB128 collection id.  ``stream_id`` adds
    the ``0x22 hi lo`` frame info (and switches to the alt magic).  Raises
    :class:`EncodeError` on arguments that make no frame.
    """
    if dialect == "upr":
        return _encode_upr(int(opcode) if not isinstance(opcode, str) else 1, value, opaque, overrides)
    if isinstance(opcode, str):
        if opcode not in spec.OPCODES:
            raise EncodeError(f"unknown command name {opcode!r}")
        op = spec.OPCODES[opcode]
    else:
        op = opcode
    if not 0 <= op <= 0xFF:
        raise EncodeError(f"opcode {op} out of range")
    cmd = spec.COMMANDS.get(op)
    infos = list(frame_infos)
    if stream_id is not None:
        infos.append((spec.FRAME_INFO_STREAM_ID, struct.pack(">H", stream_id)))
    framing = encode_frame_infos(infos)
    if magic is None:
        magic = (0x18 if response else 0x08) if framing else (0x81 if response else 0x80)
    variants = () if cmd is None else (cmd.response if response else cmd.request)
    v = _pick(variants, variant, response, status, extras, value) if variants else None
    if isinstance(extras, (bytes, bytearray)):
        ext = bytes(extras)
    elif v is not None and v.extras:
        defaults = {k: want for k, want in v.when if k not in ("extlen", "status", "vlen")}
        ext = _pack_fields(v.extras, extras or {}, defaults)
    elif extras:
        raise EncodeError(f"{spec.opcode_name(op)} takes no extras fields")
    else:
        ext = b""
    k = key.encode() if isinstance(key, str) else bytes(key)
    if cid is not None:
        k = encode_leb128(cid) + k
    val = _value_bytes(v, value)
    alt = magic in spec.ALT_MAGICS
    if alt and (len(k) > 0xFF or len(framing) > 0xFF):
        raise EncodeError("alt (flexible framing) frames hold at most 255 bytes of key and of framing extras")
    if not alt and framing:
        raise EncodeError(f"magic 0x{magic:02x} cannot carry framing extras")
    if len(k) > 0xFFFF or len(ext) > 0xFF:
        raise EncodeError("key or extras too long")
    fields = {
        "magic": magic,
        "opcode": op,
        "framing_extras_length": len(framing),
        "key_length": len(k),
        "extras_length": len(ext),
        "datatype": datatype,
        "vbucket": status if response else vbucket,
        "body_length": len(framing) + len(ext) + len(k) + len(val),
        "opaque": opaque,
        "cas": cas,
    }
    for given, over in (overrides or {}).items():
        name = "vbucket" if given == "status" else given
        if name not in fields:
            raise EncodeError(f"cannot override {given!r}; fields are {sorted(fields)}")
        fields[name] = over
    keyfield = (fields["framing_extras_length"] << 8 | fields["key_length"]) if alt else fields["key_length"]
    header = spec.HEADER.pack(
        fields["magic"],
        fields["opcode"],
        keyfield & 0xFFFF,
        fields["extras_length"] & 0xFF,
        fields["datatype"] & 0xFF,
        fields["vbucket"] & 0xFFFF,
        fields["body_length"] & 0xFFFFFFFF,
        fields["opaque"] & 0xFFFFFFFF,
        fields["cas"] & 0xFFFFFFFFFFFFFFFF,
    )
    return header + framing + ext + k + val


def _encode_upr(opcode: int, value: Any, request_id: int, overrides: Mapping[str, int] | None) -> bytes:
    variants = UPR_BODIES.get(opcode)
    if variants is None:
        raise EncodeError(f"unknown UPR opcode {opcode}")
    if isinstance(value, (bytes, bytearray)):
        body = bytes(value)
    else:
        values = dict(value or {})
        btype = values.get("type")
        chosen = next((v for v in variants if all(btype == want for _, want in v.when)), variants[0])
        if not isinstance(chosen.value, tuple):
            body = b""
        else:
            defaults = {k: want for k, want in chosen.when}
            body = _pack_fields(chosen.value, {**defaults, **values})
    fields = {"opcode": opcode, "request_id": request_id, "length": len(body)}
    for name, over in (overrides or {}).items():
        if name not in fields:
            raise EncodeError(f"cannot override {name!r}; fields are {sorted(fields)}")
        fields[name] = over
    return UPR_HEADER_STRUCT.pack(fields["opcode"], b"\0\0\0", fields["request_id"], fields["length"]) + body
