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

from ..protocol import spec
from ..protocol.enums import Magic
from ..protocol.fields import BYTES, INT, TEXT, Field, Group, Variant
from ..protocol.flatbuf import build_table
from ..protocol.upr import UPR_BODIES, UPR_HEADER_STRUCT
from .dissect import select_variant
from .framing import encode_frame_infos, encode_leb128

__all__ = ["EncodeError", "encode"]


class EncodeError(ValueError):
    """The arguments do not describe a frame the table can build (local misuse)."""


#: (framing extras?, response?) -> the magic a frame gets unless one is given
_MAGICS = {
    (False, False): Magic.CLIENT_REQUEST,
    (False, True): Magic.CLIENT_RESPONSE,
    (True, False): Magic.ALT_CLIENT_REQUEST,
    (True, True): Magic.ALT_CLIENT_RESPONSE,
}


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


def _pick(variants: tuple[Variant, ...], name: str | None, response: bool, status: int, extras: Any) -> Variant | None:
    """The variant to build: by name, else the one the dissector will read the frame as (a request: the first, if none)."""
    if name is not None:
        for v in variants:
            if v.name == name:
                return v
        raise EncodeError(f"no variant {name!r}; have {[v.name for v in variants]}")
    given = bytes(extras) if isinstance(extras, (bytes, bytearray)) else extras if isinstance(extras, Mapping) else None
    chosen = select_variant(variants, given, status if response else None)
    return chosen if chosen is not None or response or not variants else variants[0]


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
    framing = _framing(frame_infos, stream_id)
    if magic is None:
        magic = _MAGICS[bool(framing), response]
    variants = () if cmd is None else (cmd.response if response else cmd.request)
    v = _pick(variants, variant, response, status, extras) if variants else None
    if isinstance(extras, (bytes, bytearray)):
        ext = bytes(extras)
    elif v is not None and v.extras:
        ext = _pack_fields(v.extras, extras or {}, v.selector_values)
    elif extras:
        raise EncodeError(f"{spec.opcode_name(op)} takes no extras fields")
    else:
        ext = b""
    k = key.encode() if isinstance(key, str) else bytes(key)
    if cid is not None:
        try:
            k = encode_leb128(cid) + k
        except ValueError as exc:
            raise EncodeError(str(exc)) from None
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
    return _header(fields, overrides, alt) + framing + ext + k + val


def _framing(frame_infos: Iterable[tuple[int, bytes]], stream_id: int | None) -> bytes:
    """The flexible framing extras: the frame infos given, then the stream id's."""
    infos = list(frame_infos)
    if stream_id is not None:
        infos.append((spec.FRAME_INFO_STREAM_ID, struct.pack(">H", stream_id)))
    try:
        return encode_frame_infos(infos)
    except ValueError as exc:
        raise EncodeError(str(exc)) from None


def _header(fields: dict[str, int], overrides: Mapping[str, int] | None, alt: bool) -> bytes:
    """The 24 header bytes from the derived fields, then the ``overrides`` (any value, cut to its width)."""
    for given, over in (overrides or {}).items():
        name = "vbucket" if given == "status" else given
        if name not in fields:
            raise EncodeError(f"cannot override {given!r}; fields are {sorted(fields)}")
        fields[name] = over
    keyfield = (fields["framing_extras_length"] << 8 | fields["key_length"]) if alt else fields["key_length"]
    return spec.HEADER.pack(
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


def _encode_upr(opcode: int, value: Any, request_id: int, overrides: Mapping[str, int] | None) -> bytes:
    variants = UPR_BODIES.get(opcode)
    if variants is None:
        raise EncodeError(f"unknown UPR opcode {opcode}")
    if isinstance(value, (bytes, bytearray)):
        body = bytes(value)
    else:
        values = dict(value or {})
        btype = values.get("type")
        chosen = next((v for v in variants if v.applies(0, None, None, {"type": btype})), variants[0])
        body = _pack_fields(chosen.value, {**chosen.selector_values, **values}) if isinstance(chosen.value, tuple) else b""
    fields = {"opcode": opcode, "request_id": request_id, "length": len(body)}
    for name, over in (overrides or {}).items():
        if name not in fields:
            raise EncodeError(f"cannot override {name!r}; fields are {sorted(fields)}")
        fields[name] = over
    return UPR_HEADER_STRUCT.pack(fields["opcode"], b"\0\0\0", fields["request_id"], fields["length"]) + body
