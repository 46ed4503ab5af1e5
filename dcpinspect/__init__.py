"""dcpinspect: inspect Couchbase DCP and the memcached binary protocol.

The package is layered along the data flow - ``protocol`` -> ``wire`` ->
``flows`` -> ``timeline`` -> ``tables`` -> ``views``, with ``capture``, ``live``,
``spark`` and ``cli`` at the edges (docs/ARCHITECTURE.md).  The core (table,
decoder, dissector, encoder, renderer) is pure Python with no I/O and no heavy
imports; the names notebooks use (``read_records``, ``build_timeline``,
``frames_df``, ``plots``, ``Simulator``, ``DcpClient``, ...) are re-exported here
and imported on first use::

    >>> import dcpinspect
    >>> events = dcpinspect.decode(bytes.fromhex("815c0000000000000000000000000007" + "00" * 8))
    >>> print(dcpinspect.breakdown(events[0]).splitlines()[0])
    DCP_NOOP response
"""

from __future__ import annotations

from .wire.decoder import DEFAULT_MAX_BODY, FrameDecoder, decode, iter_decode
from .wire.dissect import dissect
from .wire.dissection import DissectContext, Dissection, FieldValue, Problem
from .wire.encode import EncodeError, encode
from .wire.events import Event, Frame, Gap, Garbage, Truncated
from .wire.render import annotate, annotate_html, breakdown, byte_table, summary

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


#: the names notebooks and scripts use, imported on first use so ``import dcpinspect`` stays light:
#: name -> (module, attribute; ``None`` for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "read_records": ("capture.read", "read_records"),
    "CaptureStats": ("flows.records", "CaptureStats"),
    "build_timeline": ("timeline", "build_timeline"),
    "read_timeline": ("tables.timeline_feed", "read_timeline"),
    "TimelineBuilder": ("timeline", "TimelineBuilder"),
    "rollback_decision": ("protocol.rules", "rollback_decision"),
    "frames_table": ("tables.export", "frames_table"),
    "frames_df": ("tables.export", "frames_df"),
    "reference_frame": ("tables.export", "reference_frame"),
    "flow_control_frame": ("tables.export", "flow_control_frame"),
    "timeline_frames": ("tables.timeline", "timeline_frames"),
    "story": ("tables.timeline", "story"),
    "key_history": ("tables.history", "key_history"),
    "rollback_losses": ("tables.history", "rollback_losses"),
    "consumer_lag": ("tables.progress", "consumer_lag"),
    "compare": ("tables.compare", "compare"),
    "plots": ("views.plots", None),
    "explore": ("views.widgets", "explore"),
    "stepper": ("views.widgets", "stepper"),
    "Exercises": ("views.exercises", "Exercises"),
    "Simulator": ("live.sim", "Simulator"),
    "DcpClient": ("live.client", "DcpClient"),
    "ConsumerConfig": ("live.consumer", "ConsumerConfig"),
    "VbState": ("live.resume", "VbState"),
    "TapProxy": ("live.proxy", "TapProxy"),
    "LiveCapture": ("live.tap", "LiveCapture"),
    "EXAMPLES": ("wire.examples", "EXAMPLES"),
    "example": ("wire.examples", "example"),
}


def __getattr__(name: str) -> object:
    """The notebook-facing names of :data:`_LAZY`, imported on first use: the core stays light."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"{__name__}.{where[0]}")
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
