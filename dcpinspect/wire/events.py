"""The events the decoder reports: the vocabulary every layer above it speaks.

One direction of a byte stream becomes a sequence of events that tile it:

* :class:`Frame` - a complete frame (header + body) whose header is plausible;
* :class:`Garbage` - bytes skipped while looking for the next plausible header;
* :class:`Truncated` - the start of a frame that never completed;
* :class:`Gap` - bytes the source knows are missing (capture loss).

``Frame`` is a tuple ``(offset, raw, dialect)`` because the framing loop makes
millions of them; everything else about a frame is read from ``raw`` on demand.
Notebook and IPython display hooks call the renderers that
:mod:`~dcpinspect.wire.render` registers with :func:`set_renderers` when it is
imported (``dcpinspect`` imports it), so this module depends on nothing above it.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from ..protocol import spec
from ..protocol.enums import UprOpcode
from ..protocol.upr import UPR_HEADER_SIZE, UPR_HEADER_STRUCT, UPR_OPCODES
from .framing import parse_frame_infos

__all__ = ["Event", "Frame", "Gap", "Garbage", "Truncated", "render_html", "render_text", "set_renderers"]

_tnew = tuple.__new__
_UPR_RESPONSE = int(UprOpcode.RESPONSE)
_RENDERERS: dict[str, Callable[[Any], str]] = {"text": repr, "html": lambda obj: f"<pre>{html.escape(repr(obj))}</pre>"}


def set_renderers(*, text: Callable[[Any], str], html: Callable[[Any], str]) -> None:
    """The functions the display hooks of frames and dissections call (plain text for IPython, HTML for notebooks)."""
    _RENDERERS["text"] = text
    _RENDERERS["html"] = html


def render_text(obj: object) -> str:
    """``obj`` annotated as text, by the registered renderer (for ``_repr_pretty_`` hooks)."""
    return _RENDERERS["text"](obj)


def render_html(obj: object) -> str:
    """``obj`` annotated as HTML, by the registered renderer (for ``_repr_html_`` hooks)."""
    return _RENDERERS["html"](obj)


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
            return self[1][0] == _UPR_RESPONSE
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
        for info in parse_frame_infos(self.framing)[0]:
            if info.id == spec.FRAME_INFO_STREAM_ID and len(info.payload) == 2:
                return int.from_bytes(info.payload, "big")
        return None

    def __repr__(self) -> str:
        return f"Frame(offset={self[0]}, length={len(self[1])}, name={self.name!r}, role={self.role!r})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(render_text(self))

    def _repr_html_(self) -> str:
        return render_html(self)


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
