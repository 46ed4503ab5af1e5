"""Sans-IO framing: bytes in, events out.

Theory of operation
-------------------
:class:`FrameDecoder` turns one direction of a byte stream into events:

* :class:`Frame` - a complete frame (header + body) whose header is plausible;
* :class:`Garbage` - bytes skipped while looking for the next plausible header;
* :class:`Truncated` - the start of a frame that never completed (the stream
  closed, or a :meth:`FrameDecoder.feed_gap` interrupted it);
* :class:`Gap` - bytes the source knows are missing (capture loss).

Rules this module keeps:

1. It never raises on input bytes.  Only local misuse raises (feeding a
   closed decoder, a negative gap).
2. Every input byte lands in exactly one event, in order: the events of any
   input tile it (``offset``/``length`` are positions in the stream, gaps
   included).
3. The events do not depend on how the input was chunked: feeding byte by
   byte gives exactly what feeding everything at once gives.  (Garbage runs
   are cut at fixed ``garbage_chunk`` boundaries, never at chunk boundaries.)
4. Memory is bounded: a declared body above ``max_body`` is garbage, never
   buffered; pending garbage is flushed every ``garbage_chunk`` bytes.
5. It knows nothing of directions, roles or connections (``streams`` does).

A header is *plausible* when its magic is known, its section lengths fit in
its body, and the body is within ``max_body``.  While resynchronising (after
garbage or a gap) it must also have a known opcode and no unknown datatype
bits, so random bytes rarely pass for a frame.
"""

from __future__ import annotations

import gc
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from . import spec
from .spec_upr import UPR_HEADER_SIZE, UPR_HEADER_STRUCT, UPR_OPCODES

__all__ = [
    "DEFAULT_MAX_BODY",
    "Event",
    "Frame",
    "FrameDecoder",
    "Gap",
    "Garbage",
    "Truncated",
    "decode",
    "iter_decode",
]

#: 20 MiB document + 1 MiB xattrs + key/extras/framing headroom.
DEFAULT_MAX_BODY = 22 * 1024 * 1024
DEFAULT_GARBAGE_CHUNK = 64 * 1024
_GC_PAUSE_BYTES = 1 << 16  # inputs larger than this are framed with the cyclic GC paused

_tnew = tuple.__new__


class Frame(tuple):
    """One complete frame.

    A tuple ``(offset, raw, dialect)`` for speed (the framing loop makes
    millions of them); read it through the properties.  ``offset`` is the
    frame's position in its byte stream, ``raw`` its bytes; ``header`` is
    unpacked from ``raw`` when asked for.
    """

    __slots__ = ()
    type = "frame"

    def __new__(cls, offset: int, raw: bytes, dialect: str = "mcbp") -> Frame:
        """A frame from its bytes (the decoder makes them; use this for tests and tools)."""
        st = spec.HEADER if dialect == "mcbp" else UPR_HEADER_STRUCT
        if len(raw) < st.size:
            raise ValueError(f"a {dialect} frame is at least {st.size} bytes")
        return _tnew(cls, (offset, bytes(raw), dialect))

    offset: int = property(itemgetter(0))  # type: ignore[assignment]
    raw: bytes = property(itemgetter(1))  # type: ignore[assignment]
    dialect: str = property(itemgetter(2))  # type: ignore[assignment]

    @property
    def header(self) -> tuple[Any, ...]:
        """The unpacked header.

        mcbp: magic, opcode, key length field, extras length, datatype,
        vbucket/status, body length, opaque, cas; upr: opcode, reserved,
        request id, length.
        """
        return (spec.HEADER if self[2] == "mcbp" else UPR_HEADER_STRUCT).unpack_from(self[1], 0)

    @property
    def length(self) -> int:
        """Frame size in bytes (header + body)."""
        return len(self[1])

    # --- header fields (mcbp) -------------------------------------------------
    @property
    def magic(self) -> int:
        """Magic byte (mcbp) or the draft's opcode byte (upr)."""
        return self[1][0]

    @property
    def opcode(self) -> int:
        """Opcode (for upr: the header opcode, 1 request ... 7)."""
        h = self.header
        return int(h[1]) if self[2] == "mcbp" else int(h[0])

    @property
    def is_alt(self) -> bool:
        """True for flexible-framing magics 0x08/0x18."""
        return self[2] == "mcbp" and self[1][0] in spec.ALT_MAGICS

    @property
    def framing_extras_length(self) -> int:
        """Flexible framing extras length (0 for classic magics)."""
        return self.header[2] >> 8 if self.is_alt else 0

    @property
    def key_length(self) -> int:
        """Key length (byte 3 for alt magics, bytes 2-3 otherwise)."""
        if self[2] != "mcbp":
            return 0
        h = self.header
        return h[2] & 0xFF if self.is_alt else int(h[2])

    @property
    def extras_length(self) -> int:
        """Extras length."""
        return int(self.header[3]) if self[2] == "mcbp" else 0

    @property
    def datatype(self) -> int:
        """Datatype byte."""
        return int(self.header[4]) if self[2] == "mcbp" else 0

    @property
    def is_response(self) -> bool:
        """True for response magics (0x81, 0x18, 0x83; upr: opcode 2)."""
        if self[2] == "upr":
            return self[1][0] == 2
        return self[1][0] in spec.RESPONSE_MAGICS

    @property
    def role(self) -> str:
        """``"request"`` or ``"response"`` - from the magic, not the direction."""
        return "response" if self.is_response else "request"

    @property
    def vbucket(self) -> int | None:
        """Vbucket id of a request (``None`` for responses)."""
        return None if self.is_response or self[2] == "upr" else int(self.header[5])

    @property
    def status(self) -> int | None:
        """Status of a response (``None`` for requests)."""
        return int(self.header[5]) if self.is_response and self[2] == "mcbp" else None

    @property
    def body_length(self) -> int:
        """Declared total body length."""
        h = self.header
        return int(h[6]) if self[2] == "mcbp" else int(h[3])

    @property
    def opaque(self) -> int:
        """Opaque (mcbp) or request id (upr)."""
        h = self.header
        return int(h[7]) if self[2] == "mcbp" else int(h[2])

    @property
    def cas(self) -> int:
        """CAS."""
        return int(self.header[8]) if self[2] == "mcbp" else 0

    @property
    def name(self) -> str:
        """``DCP_STREAM_REQ``, ``unknown 0xNN``; upr: ``UPR Request`` ..."""
        if self[2] == "upr":
            op = self.header[0]
            return "UPR " + UPR_OPCODES.get(op, f"unknown 0x{op:02x}")
        return spec.opcode_name(self.header[1])

    # --- sections ------------------------------------------------------------
    def _bounds(self) -> tuple[int, int, int, int, int]:
        if self[2] != "mcbp":  # upr: the whole body is the value
            n = len(self[1])
            return UPR_HEADER_SIZE, UPR_HEADER_SIZE, UPR_HEADER_SIZE, UPR_HEADER_SIZE, n
        hs = spec.HEADER_SIZE
        fl = self.framing_extras_length
        el = self.extras_length
        kl = self.key_length
        end = hs + self.body_length
        return hs, hs + fl, hs + fl + el, hs + fl + el + kl, end

    @property
    def framing(self) -> bytes:
        """Flexible framing extras bytes."""
        a, b, _, _, _ = self._bounds()
        return self[1][a:b]

    @property
    def extras(self) -> bytes:
        """Extras bytes."""
        _, b, c, _, _ = self._bounds()
        return self[1][b:c]

    @property
    def key(self) -> bytes:
        """Key bytes (with the collection-id prefix, if any)."""
        _, _, c, d, _ = self._bounds()
        return self[1][c:d]

    @property
    def value(self) -> bytes:
        """Value bytes."""
        _, _, _, d, e = self._bounds()
        return self[1][d:e]

    @property
    def body(self) -> bytes:
        """Everything after the header."""
        return self[1][spec.HEADER_SIZE if self[2] == "mcbp" else UPR_HEADER_SIZE :]

    @property
    def stream_id(self) -> int | None:
        """The DCP stream id carried in a flexible-framing ``0x22 hi lo`` frame info."""
        if not self.is_alt or self.is_response:  # in responses frame-info id 2 is WriteUnits
            return None
        from .dissect import parse_frame_infos

        for fid, payload, _, _ in parse_frame_infos(self.framing, response=self.is_response)[0]:
            if fid == spec.FRAME_INFO_STREAM_ID and len(payload) == 2:
                return int.from_bytes(payload, "big")
        return None

    def __repr__(self) -> str:
        return f"Frame(offset={self[0]}, length={len(self[1])}, name={self.name!r}, role={self.role!r})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        from .render import annotate

        p.text(annotate(self))

    def _repr_html_(self) -> str:
        from .render import annotate_html

        return annotate_html(self)


@dataclass(frozen=True, slots=True)
class Garbage:
    """Bytes skipped while resynchronising, with why the first of them was rejected."""

    offset: int
    data: bytes
    reason: str
    type = "garbage"

    @property
    def length(self) -> int:
        """Number of bytes skipped."""
        return len(self.data)


@dataclass(frozen=True, slots=True)
class Truncated:
    """The start of a frame that never completed (end of stream, or a gap)."""

    offset: int
    data: bytes
    reason: str
    type = "truncated"

    @property
    def length(self) -> int:
        """Number of bytes of the incomplete frame that were seen."""
        return len(self.data)


@dataclass(frozen=True, slots=True)
class Gap:
    """Bytes known to be missing from the stream (never zero-filled)."""

    offset: int
    length: int
    type = "gap"


Event = Frame | Garbage | Truncated | Gap


# ---------------------------------------------------------------------------
# dialects: how to read a header and judge whether it is plausible


class _Dialect:
    __slots__ = ("body_index", "check", "header_size", "name", "search", "unpack_from")

    def __init__(self, name: str, st: struct.Struct, body_index: int, search: re.Pattern[bytes]) -> None:
        self.name = name
        self.header_size = st.size
        self.unpack_from = st.unpack_from
        self.body_index = body_index
        self.search = search.search


_MCBP = _Dialect("mcbp", spec.HEADER, 6, re.compile(b"[" + b"".join(re.escape(bytes([m])) for m in spec.MAGICS) + b"]"))
_UPR = _Dialect("upr", UPR_HEADER_STRUCT, 3, re.compile(b"[\x01-\x07]"))
_DIALECTS = {"mcbp": _MCBP, "upr": _UPR}
_MAGICS = frozenset(spec.MAGICS)
_ALT = spec.ALT_MAGICS
_LENGTHS = struct.Struct(">BxHBxxxI")  # magic, key length field, extras length, body length
_CLASSIC = frozenset(m for m in spec.MAGICS if m not in spec.ALT_MAGICS)
_KNOWN_OPS = frozenset(spec.COMMANDS)


def _implausible_mcbp(h: tuple[Any, ...], max_body: int, strict: bool) -> str | None:
    magic = h[0]
    if magic not in _MAGICS:
        return f"unknown magic 0x{magic:02x}"
    body = h[6]
    if body > max_body:
        return f"declared body length {body} above the maximum {max_body}"
    sections = (h[2] >> 8) + (h[2] & 255) + h[3] if magic in _ALT else h[2] + h[3]
    if sections > body:
        return f"framing+extras+key ({sections}) longer than the body ({body})"
    if strict:
        if h[1] not in _KNOWN_OPS:
            return f"unknown opcode 0x{h[1]:02x} while resynchronising"
        if h[4] & ~spec.DATATYPE_MASK:
            return f"unknown datatype bits 0x{h[4]:02x} while resynchronising"
    return None


def _implausible_upr(h: tuple[Any, ...], max_body: int, strict: bool) -> str | None:
    if h[0] not in UPR_OPCODES:
        return f"unknown UPR opcode 0x{h[0]:02x}"
    if h[3] > max_body:
        return f"declared length {h[3]} above the maximum {max_body}"
    if strict and h[1] != b"\0\0\0":
        return "reserved bytes not zero while resynchronising"
    return None


class FrameDecoder:
    """Incremental, sans-IO frame decoder for one direction of a byte stream.

    >>> d = FrameDecoder()
    >>> events = d.feed(bytes([0x80, 0x5C]) + bytes(22))  # a DCP_NOOP request
    >>> [e.type for e in events]
    ['frame']

    Args:
        dialect: ``"mcbp"`` (memcached binary protocol / DCP) or ``"upr"``
            (the 12-byte-header UPR draft).
        max_body: largest declared body accepted as a frame; anything
            larger is garbage and is never buffered.
        garbage_chunk: garbage runs longer than this are reported in pieces
            of exactly this size (bounded memory while skipping).
        aligned: the stream starts on a frame boundary (``False`` for a
            capture that starts mid-connection: look for a plausible header
            with the strict rules first).
    """

    def __init__(
        self,
        dialect: str = "mcbp",
        *,
        max_body: int = DEFAULT_MAX_BODY,
        garbage_chunk: int = DEFAULT_GARBAGE_CHUNK,
        aligned: bool = True,
    ) -> None:
        if dialect not in _DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r} (expected 'mcbp' or 'upr')")
        if max_body < 0 or garbage_chunk < 1:
            raise ValueError("max_body must be >= 0 and garbage_chunk >= 1")
        self.dialect = dialect
        self.max_body = max_body
        self.garbage_chunk = garbage_chunk
        self._d = _DIALECTS[dialect]
        self._implausible = _implausible_mcbp if dialect == "mcbp" else _implausible_upr
        self._buf = bytearray()  # start of an incomplete frame (or header candidate)
        self._buf_off = 0  # stream offset of _buf[0]
        self._need = 0  # total length of the frame in _buf once its header was judged plausible
        self._garbage = bytearray()
        self._garbage_off = 0
        self._garbage_reason = ""
        self._garbage_run = False
        self._strict = not aligned
        self._offset = 0  # stream offset after everything fed so far
        self._closed = False
        self._events: list[Event] = []

    # --- public API ------------------------------------------------------------
    @property
    def offset(self) -> int:
        """Stream offset after everything fed (gaps included)."""
        return self._offset

    @property
    def buffered(self) -> int:
        """Bytes held back: an incomplete frame plus pending garbage."""
        return len(self._buf) + len(self._garbage)

    @property
    def incomplete(self) -> tuple[int, bytes] | None:
        """The frame (or header candidate) held back for more bytes: its stream offset and its first bytes (at most a header)."""
        if not self._buf:
            return None
        return self._buf_off, bytes(self._buf[: self._d.header_size])

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def feed(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Feed the next bytes of the stream; return the events they complete."""
        if self._closed:
            raise RuntimeError("feed() after close()")
        if not data:
            return []
        if not isinstance(data, bytes):
            data = bytes(data)
        events: list[Event] = []
        self._events = events
        base = self._offset
        self._offset += len(data)
        if self._buf:
            buf = self._buf
            if self._need:  # a plausible header is waiting for its body
                missing = self._need - len(buf)
                if len(data) < missing:
                    buf += data
                    return events
                buf += data[:missing]
                events.append(_tnew(Frame, (self._buf_off, bytes(buf), self.dialect)))
                self._strict = False
                base += missing
                data = data[missing:]
                buf.clear()
                self._need = 0
                if not data:
                    return events
            else:  # fewer than header-size bytes held: rescan them with the new data
                base = self._buf_off
                data = bytes(buf) + data
                buf.clear()
        paused = len(data) > _GC_PAUSE_BYTES and gc.isenabled()
        if paused:
            gc.disable()
        try:
            self._scan(data, base)
        finally:
            if paused:
                gc.enable()
        return events

    def feed_gap(self, length: int) -> list[Event]:
        """Report ``length`` bytes the source knows are missing.

        An incomplete frame becomes :class:`Truncated`, then a :class:`Gap` is
        emitted and the decoder resynchronises on what follows.
        """
        if self._closed:
            raise RuntimeError("feed_gap() after close()")
        if length < 0:
            raise ValueError("gap length must be >= 0")
        if length == 0:
            return []
        events: list[Event] = []
        self._events = events
        self._flush_pending(f"gap of {length} bytes")
        events.append(Gap(self._offset, length))
        self._offset += length
        self._strict = True
        return events

    def close(self) -> list[Event]:
        """End of stream: flush pending garbage and report an incomplete frame."""
        if self._closed:
            return []
        events: list[Event] = []
        self._events = events
        self._flush_pending("end of stream")
        self._closed = True
        return events

    # --- internals -------------------------------------------------------------
    def _flush_pending(self, why: str) -> None:
        if self._buf and not self._need:
            # an incomplete header: bytes before the first possible start byte are garbage
            m = self._d.search(self._buf, 0)
            cut = m.start() if m is not None else len(self._buf)
            if cut:
                first = self._buf[0]
                self._add_garbage(
                    bytes(self._buf[:cut]), self._buf_off, f"unknown {'magic' if self.dialect == 'mcbp' else 'UPR opcode'} 0x{first:02x}"
                )
                del self._buf[:cut]
                self._buf_off += cut
        self._flush_garbage()
        if self._buf:
            have = len(self._buf)
            if self._need:
                reason = f"{why} after {have} of {self._need} bytes"
            else:
                reason = f"{why} inside a header ({have} of {self._d.header_size} bytes)"
            self._events.append(Truncated(self._buf_off, bytes(self._buf), reason))
            self._buf.clear()
            self._need = 0

    def _flush_garbage(self) -> None:
        """End the current garbage run (a frame starts, a gap, the end of stream)."""
        if self._garbage:
            self._events.append(Garbage(self._garbage_off, bytes(self._garbage), self._garbage_reason))
            self._garbage.clear()
        self._garbage_run = False

    def _add_garbage(self, data: bytes, off: int, reason: str) -> None:
        g = self._garbage
        if not self._garbage_run:  # a run's reason is its first byte's, in every piece of it
            self._garbage_run = True
            self._garbage_reason = reason
        if not g:
            self._garbage_off = off
        g += data
        chunk = self.garbage_chunk
        while len(g) >= chunk:
            self._events.append(Garbage(self._garbage_off, bytes(g[:chunk]), self._garbage_reason))
            del g[:chunk]
            self._garbage_off += chunk

    def _scan(self, buf: bytes, base: int) -> None:
        """Frame ``buf`` (whose first byte is at stream offset ``base``)."""
        d = self._d
        hs = d.header_size
        unpack_from = d.unpack_from
        bi = d.body_index
        implausible = self._implausible
        max_body = self.max_body
        dialect = self.dialect
        app = self._events.append
        n = len(buf)
        pos = 0
        while True:
            if self._strict or self._garbage:
                pos = self._resync(buf, pos, base)
                if pos < 0:
                    return
            if dialect == "mcbp":
                pos = self._run_mcbp(buf, pos, base)
                if pos < 0:
                    return
                continue
            # fast path: aligned frames back to back
            while pos + hs <= n:
                h = unpack_from(buf, pos)
                why = implausible(h, max_body, False)
                if why is not None:
                    self._add_garbage(buf[pos : pos + 1], base + pos, why)
                    pos += 1
                    self._strict = True
                    break
                end = pos + hs + h[bi]
                if end > n:
                    self._keep(buf, pos, base, end - pos)
                    return
                app(_tnew(Frame, (base + pos, buf[pos:end], dialect)))
                pos = end
            else:
                if pos < n:
                    self._keep(buf, pos, base, 0)
                return

    def _run_mcbp(self, buf: bytes, pos: int, base: int) -> int:
        """Frame aligned mcbp frames back to back (the hot loop: checks inlined).

        Returns the position after an implausible header's first byte (now
        pending garbage, strict mode on), or -1 when ``buf`` is used up.
        """
        unpack_from = _LENGTHS.unpack_from
        max_body = self.max_body
        app = self._events.append
        classic = _CLASSIC
        alt = _ALT
        tnew = _tnew
        frame = Frame
        n = len(buf)
        while pos + 24 <= n:
            m, kl, el, body = unpack_from(buf, pos)
            if m in classic:
                ok = kl + el <= body <= max_body
            elif m in alt:
                ok = (kl >> 8) + (kl & 0xFF) + el <= body <= max_body
            else:
                ok = False
            if not ok:
                why = _implausible_mcbp(spec.HEADER.unpack_from(buf, pos), max_body, False) or "implausible header"
                self._add_garbage(buf[pos : pos + 1], base + pos, why)
                self._strict = True
                return pos + 1
            end = pos + 24 + body
            if end > n:
                self._keep(buf, pos, base, end - pos)
                return -1
            app(tnew(frame, (base + pos, buf[pos:end], "mcbp")))
            pos = end
        if pos < n:
            self._keep(buf, pos, base, 0)
        return -1

    def _resync(self, buf: bytes, pos: int, base: int) -> int:
        """Skip to the next plausible header (strict rules); -1 if none in ``buf``."""
        d = self._d
        hs = d.header_size
        n = len(buf)
        while pos < n:
            m = d.search(buf, pos)
            cand = m.start() if m is not None else n
            if cand > pos:
                self._add_garbage(buf[pos:cand], base + pos, "no plausible header")
                pos = cand
            if pos >= n:
                return -1
            if pos + hs > n:
                # cannot judge yet: keep the candidate (pending garbage stays pending)
                self._keep(buf, pos, base, 0)
                return -1
            h = d.unpack_from(buf, pos)
            why = self._implausible(h, self.max_body, True)
            if why is None:
                self._flush_garbage()
                self._strict = False
                end = pos + hs + h[d.body_index]
                if end > n:
                    self._keep(buf, pos, base, end - pos)
                    return -1
                self._events.append(_tnew(Frame, (base + pos, buf[pos:end], self.dialect)))
                return end
            self._add_garbage(buf[pos : pos + 1], base + pos, why)
            pos += 1
        return -1

    def _keep(self, buf: bytes, pos: int, base: int, need: int) -> None:
        self._buf += buf[pos:]
        self._buf_off = base + pos
        self._need = need


def decode(data: bytes | bytearray | memoryview, *, dialect: str = "mcbp", **options: Any) -> list[Event]:
    """Decode a complete byte stream: every frame, garbage run and truncated tail."""
    dec = FrameDecoder(dialect, **options)
    return dec.feed(data) + dec.close()


def iter_decode(chunks: Iterable[bytes], *, dialect: str = "mcbp", **options: Any) -> Iterator[Event]:
    """Decode an iterable of chunks lazily (bounded memory)."""
    dec = FrameDecoder(dialect, **options)
    for chunk in chunks:
        yield from dec.feed(chunk)
    yield from dec.close()
