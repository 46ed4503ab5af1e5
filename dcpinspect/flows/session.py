"""The one connection-context tracker: what a connection negotiated, followed frame by frame.

A frame's meaning depends on its connection: HELLO features decide whether keys
carry a collection id, DCP_OPEN flags whether deletions carry a delete time,
DCP_CONTROL ``enable_stream_id`` whether stream messages carry a stream id.
:class:`ConnState` follows exactly that, and everything that needs it uses this
one class: the records of a capture or a live tap, the timeline, the DCP
consumer and the simulated producer.

1. Only the session commands of :data:`~dcpinspect.protocol.session.SESSION_OPS`
   are looked at, and they are read through the table (:func:`dissect`).
2. A request takes effect when its *success* response arrives (matched by
   direction, opcode and opaque); SASL_AUTH's mechanism is noted at once.
3. A connection whose start was not captured has an unknown context (all
   ``None``): nothing is guessed.  :attr:`ConnState.captured_start` says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from operator import itemgetter
from typing import Any

from ..protocol.enums import Opcode, Status
from ..protocol.session import CONTEXT_EFFECTS, SESSION_OPS, control_on, control_value
from ..protocol.session import REQUEST_MAGICS as _REQUEST_MAGICS
from ..protocol.session import RESPONSE_MAGICS as _RESPONSE_MAGICS
from ..wire.dissect import dissect
from ..wire.dissection import DissectContext, Dissection
from ..wire.events import Event, Frame
from .reassembly import Connection

__all__ = ["FRESH", "MAX_PENDING", "ConnState", "Sessions"]

#: the context of a connection whose start (SYN) was captured but negotiated nothing yet
FRESH = DissectContext(collections=False, xattr=False, snappy=False, json=False, delete_times=False, include_xattrs=False, stream_ids=False)
#: session requests awaiting their response kept per connection (the oldest are forgotten)
MAX_PENDING = 1024

_SASL_AUTH = int(Opcode.SASL_AUTH)
_SUCCESS = int(Status.SUCCESS)


@dataclass
class ConnState:
    """What a connection negotiated so far (fed one frame at a time with :meth:`observe`)."""

    context: DissectContext = FRESH
    features: tuple[int, ...] = ()
    open_flags: int | None = None
    open_name: str = ""
    controls: dict[str, str] = field(default_factory=dict)
    bucket: str = ""
    sasl_mechanism: str = ""
    _pending: dict[tuple[str, int, int], Dissection] = field(default_factory=dict)

    @property
    def captured_start(self) -> bool:
        """Whether the connection's start was seen (its context is known, not guessed)."""
        return self.context.collections is not None

    def observe(self, direction: str, frame: Frame, dissected: Callable[[], Dissection] | None = None) -> None:
        """Update the context with a frame seen in ``direction`` (``c2s``/``s2c``).

        A caller that keeps the frame's dissection (in the same context) passes
        ``dissected``, called only when the tracker needs the fields, so the frame
        is never dissected twice.
        """
        if frame.dialect != "mcbp" or frame.opcode not in SESSION_OPS:
            return
        read = dissected if dissected is not None else partial(dissect, frame, self.context)
        magic = frame.magic
        if magic in _REQUEST_MAGICS:
            d = read()
            if frame.opcode == _SASL_AUTH:
                self.sasl_mechanism = d.key_text
                return
            self._pending[(direction, frame.opcode, frame.opaque)] = d
            if len(self._pending) > MAX_PENDING:
                del self._pending[next(iter(self._pending))]
        elif magic in _RESPONSE_MAGICS:
            other = "c2s" if direction == "s2c" else "s2c"
            req = self._pending.pop((other, frame.opcode, frame.opaque), None)
            if req is not None and frame.status == _SUCCESS:
                _EFFECTS[CONTEXT_EFFECTS[frame.opcode]](self, req, read)

    def _features(self, req: Dissection, read: Callable[[], Dissection]) -> None:
        del req
        resp = read()
        self.features = tuple(f["feature"] for f in resp.body.get("features", ()))
        self.context = self.context.with_features(self.features)

    def _open_flags(self, req: Dissection, read: Callable[[], Dissection]) -> None:
        del read
        if isinstance(req.extras.get("flags"), int):
            self.open_name = req.key_text
            self.open_flags = req.extras["flags"]
            self.context = self.context.with_open_flags(self.open_flags)

    def _controls(self, req: Dissection, read: Callable[[], Dissection]) -> None:
        del read
        key, value = req.key_text, str(req.document) if req.document is not None else ""
        self.controls[key] = control_value(key, value, self.controls.get(key))  # a one-way switch that is on stays on
        if key == "enable_stream_id" and control_on(key, self.controls):
            self.context = replace(self.context, stream_ids=True)

    def _bucket(self, req: Dissection, read: Callable[[], Dissection]) -> None:
        del read
        self.bucket = req.key_text

    def _nothing(self, req: Dissection, read: Callable[[], Dissection]) -> None:
        del req, read


_EFFECTS: dict[str, Callable[[ConnState, Dissection, Callable[[], Dissection]], None]] = {
    "features": ConnState._features,
    "open_flags": ConnState._open_flags,
    "controls": ConnState._controls,
    "bucket": ConnState._bucket,
    "sasl_mechanism": ConnState._nothing,  # noted when the request is seen
}

_RAW: Callable[[Any], bytes] = itemgetter(1)
_OPCODE: Callable[[bytes], int] = itemgetter(1)


class Sessions:
    """Per-connection :class:`ConnState`: the context each event is dissected with."""

    def __init__(self, states: dict[int, ConnState], reveal_secrets: bool) -> None:
        self.states = states
        self.reveal_secrets = reveal_secrets

    def state(self, conn: Connection) -> ConnState:
        """The state of ``conn`` (created on first sight: fresh if its SYN was seen, unknown if not)."""
        state = self.states.get(conn.id)
        if state is None:
            base = FRESH if conn.syn_seen else DissectContext()
            if self.reveal_secrets:
                base = replace(base, reveal_secrets=True)
            state = self.states[conn.id] = ConnState(base)
        return state

    def contexts(self, conn: Connection, direction: str, events: list[Event]) -> list[DissectContext]:
        """The context of each event (as it was before the event), observing session frames."""
        state = self.state(conn)
        ctx = state.context
        try:  # the common case: all frames, none of them a session command (checked at C speed)
            if SESSION_OPS.isdisjoint(map(_OPCODE, map(_RAW, events))):
                return [ctx] * len(events)
        except (TypeError, IndexError):  # garbage, gaps, a short UPR frame
            pass
        out = []
        for ev in events:
            out.append(ctx)
            if ev.__class__ is Frame and ev[1][1] in SESSION_OPS and ev[2] == "mcbp":
                state.observe(direction, ev)
                ctx = state.context
        return out
