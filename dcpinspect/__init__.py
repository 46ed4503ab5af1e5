"""dcpinspect: inspect Couchbase DCP and the memcached binary protocol.

The core (table, decoder, dissector, encoder, renderer) is pure Python with no
I/O and no heavy imports::

    >>> import dcpinspect
    >>> events = dcpinspect.decode(bytes.fromhex("815c0000000000000000000000000007" + "00" * 8))
    >>> print(dcpinspect.breakdown(events[0]).splitlines()[0])
    DCP_NOOP response
"""

from __future__ import annotations

from .decoder import DEFAULT_MAX_BODY, Event, Frame, FrameDecoder, Gap, Garbage, Truncated, decode, iter_decode
from .dissect import DissectContext, Dissection, FieldValue, Problem, dissect
from .encode import EncodeError, encode
from .render import annotate, annotate_html, breakdown, byte_table, summary

__all__ = [
    "DEFAULT_MAX_BODY",
    "DissectContext",
    "Dissection",
    "EncodeError",
    "Event",
    "FieldValue",
    "Frame",
    "FrameDecoder",
    "Gap",
    "Garbage",
    "Problem",
    "Truncated",
    "annotate",
    "annotate_html",
    "breakdown",
    "byte_table",
    "decode",
    "dissect",
    "encode",
    "iter_decode",
    "summary",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``explore`` and ``stepper`` (the notebook widgets) are imported on first use: the core stays light."""
    if name in ("explore", "stepper"):
        from . import widgets

        return getattr(widgets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
