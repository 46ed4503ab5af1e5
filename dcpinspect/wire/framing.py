r"""The two variable-length codes of a frame, both ways: LEB128 collection ids and flexible-framing frame infos.

Decoding never raises and reports what is wrong as a message with its place;
encoding raises :class:`ValueError` on values no encoding can hold
(:func:`~dcpinspect.wire.encode.encode` turns that into its ``EncodeError``).

>>> encode_leb128(0x555).hex()
'd50a'
>>> decode_leb128(bytes.fromhex("d50a"))
(1365, 2, None)
>>> encode_frame_infos([(2, b"\x12\x34")]).hex()
'221234'
>>> parse_frame_infos(bytes.fromhex("221234"))
([FrameInfo(id=2, payload=b'\x124', offset=0, header_length=1)], None)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "LEB128_MAX_BYTES",
    "FrameInfo",
    "FramingProblem",
    "decode_leb128",
    "encode_frame_infos",
    "encode_leb128",
    "parse_frame_infos",
]

#: a collection id is 32 bits: at most 5 LEB128 bytes
LEB128_MAX_BYTES = 5
_ESCAPE = 15  # a nibble of 15: the id or the length continues in the next byte (15 + that byte)
_MAX_ESCAPED = _ESCAPE + 255


def decode_leb128(buf: bytes, pos: int = 0, limit: int | None = None) -> tuple[int | None, int, str | None]:
    """Unsigned LEB128 collection id at ``buf[pos:limit]`` (the key prefix of kv_engine's ``docs/Collections.md``).

    Returns ``(value, length, problem)``; ``value`` is ``None`` when no
    complete encoding fits (max 5 bytes).  Non-canonical (over-long)
    encodings and values above 32 bits decode but come with a problem.
    """
    end = len(buf) if limit is None else min(limit, len(buf))
    value = 0
    shift = 0
    i = pos
    while i < end and i - pos < LEB128_MAX_BYTES:
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
    if i - pos >= LEB128_MAX_BYTES:
        return None, i - pos, "LEB128 collection id longer than 5 bytes"
    return None, i - pos, "key ends inside its LEB128 collection id"


def encode_leb128(value: int) -> bytes:
    """Unsigned LEB128 (the canonical, shortest form); :class:`ValueError` for a negative value."""
    if value < 0:
        raise ValueError("LEB128 values are unsigned")
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class FrameInfo(NamedTuple):
    """One frame info of the flexible framing extras."""

    id: int
    payload: bytes
    #: where its first byte is, within the framing extras
    offset: int
    #: bytes before the payload: the nibble byte and any escape bytes (1 to 3)
    header_length: int


class FramingProblem(NamedTuple):
    """Why the framing extras could not be read to their end, and the bytes concerned (within the framing extras)."""

    message: str
    offset: int
    length: int


def parse_frame_infos(framing: bytes) -> tuple[list[FrameInfo], FramingProblem | None]:
    """Flexible framing extras -> the frame infos, and the problem that stopped the reading, if any.

    Nibble encoding with both escapes (kv_engine ``docs/BinaryProtocol.md``,
    "Flexible Framing Extras"; REFERENCE.md lists the ids): id 15 -> 15 + next
    byte; length 15 -> 15 + next byte (after any id escape byte).  The encoding
    is the same in requests and responses; only the meaning of the ids differs.
    """
    out: list[FrameInfo] = []
    pos = 0
    n = len(framing)
    while pos < n:
        start = pos
        b = framing[pos]
        pos += 1
        fid = b >> 4
        flen = b & 0x0F
        if fid == _ESCAPE:
            if pos >= n:
                return out, FramingProblem("frame info id escape byte missing", start, n - start)
            fid = _ESCAPE + framing[pos]
            pos += 1
        if flen == _ESCAPE:
            if pos >= n:
                return out, FramingProblem("frame info length escape byte missing", start, n - start)
            flen = _ESCAPE + framing[pos]
            pos += 1
        if pos + flen > n:
            return out, FramingProblem(f"frame info {fid} ({flen} bytes) overruns the framing extras", start, n - start)
        out.append(FrameInfo(fid, framing[pos : pos + flen], start, pos - start))
        pos += flen
    return out, None


def encode_frame_infos(infos: Iterable[tuple[int, bytes]]) -> bytes:
    """Flexible framing extras from ``(id, payload)`` pairs (both nibble escapes); :class:`ValueError` if one cannot be encoded."""
    out = bytearray()
    for fid, payload in infos:
        if fid < 0 or fid > _MAX_ESCAPED or len(payload) > _MAX_ESCAPED:
            raise ValueError(f"frame info id {fid} / length {len(payload)} cannot be encoded")
        idn = min(fid, _ESCAPE)
        ln = min(len(payload), _ESCAPE)
        out.append(idn << 4 | ln)
        if idn == _ESCAPE:
            out.append(fid - _ESCAPE)
        if ln == _ESCAPE:
            out.append(len(payload) - _ESCAPE)
        out += payload
    return bytes(out)
