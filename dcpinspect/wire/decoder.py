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
6. A header whose body never completes (the stream ends, or a gap cuts it)
   does not swallow the frames after it.  Its bytes are framed again as if
   every header in them whose frame runs past their end (this one first) were
   implausible: such a header is *taken back*, its first byte garbage (a run
   it starts has the reason ``header of a N-byte frame taken back (...)``).
   What that gives is kept up to the first header taken back after the last
   frame *in step* - one followed by another plausible header, or ending
   exactly where the bytes end; from there on the bytes are one
   :class:`Truncated`, as a genuinely cut last frame is (all of them when no
   frame is in step).  It is decided at :meth:`FrameDecoder.close` or
   :meth:`FrameDecoder.feed_gap` from the bytes held, so rule 3 holds; the
   garbage before a header waiting for its body is reported with that frame
   (at most ``garbage_chunk`` bytes wait).
7. Resynchronising costs a bounded number of steps per byte, whatever the
   bytes: a pattern finds, in C, the headers that can pass the strict rules
   below (it reads the magic, opcode, datatype and body length), and only
   those are judged in Python (the sections against the body).  However
   hostile the input, that is under half of the positions (a header passing
   the pattern has bytes 5 and 8 that no other one can start with), and for
   the bytes seen in practice next to none.

A header is *plausible* when its magic is known, its section lengths fit in
its body, and the body is within ``max_body``.  While resynchronising (after
garbage or a gap) it must also have a known opcode and no unknown datatype
bits, so random bytes rarely pass for a frame.
"""

from __future__ import annotations

import functools
import gc
import re
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..protocol import spec
from ..protocol.upr import UPR_HEADER_STRUCT, UPR_OPCODES
from .events import Event, Frame, Gap, Garbage, Truncated

__all__ = [
    "DEFAULT_GARBAGE_CHUNK",
    "DEFAULT_MAX_BODY",
    "FrameDecoder",
    "chain_frames",
    "decode",
    "iter_decode",
    "plausible_header",
]

#: 20 MiB document + 1 MiB xattrs + key/extras/framing headroom.
DEFAULT_MAX_BODY = 22 * 1024 * 1024
DEFAULT_GARBAGE_CHUNK = 64 * 1024
_GC_PAUSE_BYTES = 1 << 16  # inputs larger than this are framed with the cyclic GC paused

_tnew = tuple.__new__

# ---------------------------------------------------------------------------
# dialects: how to read a header and judge whether it is plausible


class _Dialect:
    __slots__ = ("body_index", "check", "header_size", "name", "search", "starts", "unpack_from")

    def __init__(self, name: str, st: struct.Struct, body_index: int, starts: Iterable[int]) -> None:
        self.name = name
        self.header_size = st.size
        self.unpack_from = st.unpack_from
        self.body_index = body_index
        self.starts = frozenset(starts)  # the bytes a header can start with
        self.search = re.compile(_byte_class(self.starts)).search


def _byte_class(values: Iterable[int]) -> bytes:
    """A regex character class matching exactly ``values`` (bytes patterns)."""
    return b"[" + b"".join(b"\\x%02x" % v for v in sorted(values)) + b"]"


_MCBP = _Dialect("mcbp", spec.HEADER, 6, spec.MAGICS)
_UPR = _Dialect("upr", UPR_HEADER_STRUCT, 3, UPR_OPCODES)
_DIALECTS = {"mcbp": _MCBP, "upr": _UPR}
_MAGICS = frozenset(spec.MAGICS)
_ALT = spec.ALT_MAGICS
_LENGTHS = struct.Struct(">BxHBxxxI")  # magic, key length field, extras length, body length
_BODY = struct.Struct(">8xI")  # body length
_CLASSIC = frozenset(m for m in spec.MAGICS if m not in spec.ALT_MAGICS)
_KNOWN_OPS = frozenset(spec.COMMANDS)
_UPR_LENGTH = struct.Struct(">8xI")


def _at_most(limit: int, width: int) -> bytes:
    """A regex matching the ``width``-byte big-endian numbers up to ``limit``."""
    if limit >= 256**width - 1:
        return b".{%d}" % width
    top, rest = divmod(limit, 256 ** (width - 1))
    if width == 1:
        return _byte_class(range(top + 1))
    below = [_byte_class(range(top)) + b".{%d}" % (width - 1)] if top else []
    return b"(?:" + b"|".join([*below, _byte_class([top]) + _at_most(rest, width - 1)]) + b")"


@functools.lru_cache(maxsize=16)
def _candidate_pattern(dialect: str, max_body: int) -> Callable[..., re.Match[bytes] | None]:
    """``search`` of a pattern for the headers that can pass the strict rules (resynchronising).

    It checks, in C, every rule that reads bytes one field at a time: mcbp: a
    known magic, a known opcode, no unknown datatype bit and a body length
    within ``max_body``; upr: a known opcode, zero reserved bytes and a
    length within ``max_body``.  What it lets through is judged in Python
    (mcbp: the sections against the body), so a run of candidate bytes
    (``0x80 0x80 ...``) costs a few pattern steps per byte, not a Python
    check.  It matches whole headers only: a candidate too close to the end
    of the input to be judged is found by the dialect's ``search``.
    """
    body = _at_most(max_body, 4)
    if dialect == "mcbp":
        datatypes = _byte_class(d for d in range(256) if not d & ~spec.DATATYPE_MASK)
        pattern = _byte_class(spec.MAGICS) + _byte_class(_KNOWN_OPS) + b".{3}" + datatypes + b".{2}" + body + b".{12}"
    else:
        pattern = _byte_class(UPR_OPCODES) + b"\\x00{3}.{4}" + body
    return re.compile(pattern, re.DOTALL).search


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


def plausible_header(data: bytes | memoryview, *, max_body: int = DEFAULT_MAX_BODY, strict: bool = True) -> bool:
    """Whether the first 24 bytes of ``data`` are a plausible mcbp header (by default with the strict rules of resynchronising).

    It is the decoder's own judgement: a known magic, section lengths that fit
    in the body, a body within ``max_body``; strict: a known opcode and no
    unknown datatype bits too.  Fewer than 24 bytes are not a header.
    """
    if len(data) < spec.HEADER_SIZE:
        return False
    return _implausible_mcbp(spec.HEADER.unpack_from(data, 0), max_body, strict) is None


def chain_frames(buf: bytes | memoryview) -> tuple[list[int], int]:
    """Where frames back to back from ``buf[0]`` start, by their body lengths alone, and where the chain stopped.

    It judges nothing: the caller checks every header at once (bulk readers
    with arrays, :func:`dcpinspect.tables.columnar.frame_walk`) and cuts the
    chain at the first that the aligned loop of :class:`FrameDecoder` would not
    accept.  It stops at a header or a frame not complete in ``buf``.
    """
    unpack = _BODY.unpack_from
    starts: list[int] = []
    app = starts.append
    pos = 0
    last = len(buf) - 24
    n = len(buf)
    while pos <= last:
        end = pos + 24 + unpack(buf, pos)[0]
        if end > n:
            break
        app(pos)
        pos = end
    return starts, pos


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
        self._candidates = _candidate_pattern(dialect, max_body)
        self._checks = 0  # headers judged in Python while resynchronising (the cost the tests hold down)
        # taking back a header whose body never came (see _take_back)
        self._taking_back = False
        self._why = ""
        self._taken: list[tuple[int, int]] = []  # (position, declared frame length) of headers taken back
        self._taken_events = 0  # len(self._events) when the last of them was recorded
        self._held: tuple[int, int] | None = None  # where _scan stopped on an incomplete header (position, 0)

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
                self._flush_garbage()  # the garbage before it waited for it to complete (it could be taken back)
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
        if self._need:
            self._take_back(why)
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

    def _take_back(self, why: str) -> None:
        """A plausible header whose body never came (end of stream or a gap): decode its bytes again if frames follow it.

        ``_buf`` holds the header and the part of its body that arrived.  They
        are framed again as if every header whose frame runs past their end
        (this one first) had been implausible: such a header is *taken back*,
        its first byte garbage.  The result is kept up to the first header taken
        back after the last frame in step (followed by another plausible header,
        or ending exactly where the bytes end); from there on the bytes stay one
        :class:`Truncated` frame, as they were - all of them when no frame is in
        step.  One pass over the bytes, a bounded cost per byte.
        """
        held = bytes(self._buf)
        off = self._buf_off
        n = len(held)
        need = self._need
        self._buf.clear()
        self._need = 0
        events = self._events
        mark = len(events)
        self._taking_back = True
        self._why = why
        self._taken = [(0, need)]
        self._taken_events = mark
        self._held = None
        paused = n > _GC_PAUSE_BYTES and gc.isenabled()
        if paused:
            gc.disable()
        try:
            self._add_garbage(held[:1], off, self._taken_back_reason(need, n))
            self._strict = True
            self._scan(held, off, 1)
        finally:
            self._taking_back = False
            if paused:
                gc.enable()
        taken, rest, self._taken, self._held = self._taken, self._held, [], None
        last = -1  # where the last frame in step starts
        for i in range(len(events) - 1, mark - 1, -1):
            e = events[i]
            if type(e) is Frame and self._in_step(held, e[0] - off + len(e[1])):
                last = e[0] - off
                break
        cut = next(((pos, length) for pos, length in taken if pos > last), None)
        if cut is None:  # every header taken back is followed by frames in step
            if rest is not None:  # an incomplete header at the end: flushed as usual
                self._buf += held[rest[0] :]
                self._buf_off = off + rest[0]
            return
        pos, length = cut
        end = off + pos
        while len(events) > mark and events[-1].offset >= end:
            events.pop()
        g = events[-1] if len(events) > mark else None
        if isinstance(g, Garbage) and g.offset + g.length > end:
            events[-1] = Garbage(g.offset, g.data[: end - g.offset], g.reason)
        elif self._garbage and self._garbage_off < end:
            events.append(Garbage(self._garbage_off, bytes(self._garbage[: end - self._garbage_off]), self._garbage_reason))
        self._garbage.clear()
        self._garbage_run = False
        self._buf += held[pos:]
        self._buf_off = end
        self._need = length

    def _taken_back_reason(self, length: int, left: int) -> str:
        return f"header of a {length}-byte frame taken back ({self._why} after {left} bytes)"

    def _note_taken(self, pos: int, length: int) -> None:
        """Record a header taken back, if it is the first since an event.

        A later one can be where the kept part ends only if a frame lies
        between them, so the memory this takes is in proportion to the events.
        """
        if len(self._events) != self._taken_events:
            self._taken.append((pos, length))
            self._taken_events = len(self._events)

    def _take_back_here(self, buf: bytes, pos: int, base: int, length: int) -> int:
        """While taking back: the plausible header at ``pos`` runs past the end - it is garbage too."""
        self._note_taken(pos, length)
        self._add_garbage(buf[pos : pos + 1], base + pos, self._taken_back_reason(length, len(buf) - pos))
        self._strict = True
        return pos + 1

    def _in_step(self, held: bytes, end: int) -> bool:
        """Whether a frame ending at ``end`` of ``held`` ends it, or is followed by a plausible header."""
        d = self._d
        n = len(held)
        if end == n:
            return True
        if end + d.header_size <= n:
            return self._implausible(d.unpack_from(held, end), self.max_body, False) is None
        return held[end] in d.starts

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

    def _scan(self, buf: bytes, base: int, pos: int = 0) -> None:
        """Frame ``buf`` from ``pos`` on (``buf[0]`` is at stream offset ``base``)."""
        d = self._d
        hs = d.header_size
        unpack_from = d.unpack_from
        bi = d.body_index
        implausible = self._implausible
        max_body = self.max_body
        dialect = self.dialect
        app = self._events.append
        n = len(buf)
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
                    if self._taking_back:
                        pos = self._take_back_here(buf, pos, base, end - pos)
                        break
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
                if self._taking_back:
                    return self._take_back_here(buf, pos, base, end - pos)
                self._keep(buf, pos, base, end - pos)
                return -1
            app(tnew(frame, (base + pos, buf[pos:end], "mcbp")))
            pos = end
        if pos < n:
            self._keep(buf, pos, base, 0)
        return -1

    def _resync(self, buf: bytes, pos: int, base: int) -> int:
        """Skip to the next plausible header (strict rules); -1 if none in ``buf``.

        The candidate pattern finds, in C, the next header that can pass the
        strict rules; only those are judged in Python.  The bytes skipped are
        added to the garbage run in one piece (the reason of a run is its first
        byte's, written out only when the run starts).
        """
        d = self._d
        hs = d.header_size
        n = len(buf)
        candidates = self._candidates
        max_body = self.max_body
        at = pos
        if d is _MCBP:
            unpack_from = _LENGTHS.unpack_from
            alt = _ALT
            while True:
                m = candidates(buf, at)
                if m is None:
                    break
                cand = m.start()
                self._checks += 1
                magic, kl, el, body = unpack_from(buf, cand)
                if body <= max_body and ((kl >> 8) + (kl & 0xFF) + el if magic in alt else kl + el) <= body:
                    if cand + hs + body <= n or not self._taking_back:
                        return self._resynced(buf, pos, base, cand, hs + body)
                    self._note_taken(cand, hs + body)  # taking back: it runs past the end, garbage too
                at = cand + 1
        else:
            unpack_upr = _UPR_LENGTH.unpack_from
            while True:
                m = candidates(buf, at)
                if m is None:
                    break
                cand = m.start()
                self._checks += 1
                (body,) = unpack_upr(buf, cand)
                if body <= max_body:
                    if cand + hs + body <= n or not self._taking_back:
                        return self._resynced(buf, pos, base, cand, hs + body)
                    self._note_taken(cand, hs + body)
                at = cand + 1
        # no plausible header starts before n - hs + 1; a candidate after that cannot be judged yet: keep it
        m = d.search(buf, max(pos, n - hs + 1))
        cut = m.start() if m is not None else n
        if cut > pos:
            self._add_garbage(buf[pos:cut], base + pos, self._run_reason(buf, pos))
        if cut < n:
            self._keep(buf, cut, base, 0)  # pending garbage stays pending
        return -1

    def _resynced(self, buf: bytes, pos: int, base: int, cand: int, length: int) -> int:
        """A plausible header at ``cand``: ``buf[pos:cand]`` is garbage; frame it (or keep it for its body)."""
        if cand > pos:
            self._add_garbage(buf[pos:cand], base + pos, self._run_reason(buf, pos))
        self._strict = False
        end = cand + length
        if end > len(buf):
            # pending garbage stays pending until the frame completes: if its body never comes, the header
            # is taken back and joins the garbage run (see _take_back)
            self._keep(buf, cand, base, length)
            return -1
        self._flush_garbage()
        self._events.append(_tnew(Frame, (base + cand, buf[cand:end], self.dialect)))
        return end

    def _run_reason(self, buf: bytes, pos: int) -> str:
        """Why ``buf[pos]`` (skipped while resynchronising) is garbage, if it starts a garbage run."""
        if self._garbage_run:
            return self._garbage_reason  # not used: a run keeps its first byte's reason
        d = self._d
        n = len(buf)
        if buf[pos] in d.starts and pos + d.header_size <= n:
            h = d.unpack_from(buf, pos)
            why = self._implausible(h, self.max_body, True)
            if why is None and self._taking_back:
                length = d.header_size + h[d.body_index]
                why = self._taken_back_reason(length, n - pos)
            return why or "implausible header"
        return "no plausible header"

    def _keep(self, buf: bytes, pos: int, base: int, need: int) -> None:
        if self._taking_back:  # buf is the held bytes themselves: note where the scan stopped, copy nothing
            self._held = (pos, need)
            return
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
