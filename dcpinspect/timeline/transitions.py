"""The life of a stream segment as a table: ``TRANSITIONS[(state, input)] -> next state``.

The builder classifies each frame that reaches a stream as one :class:`Input`
and looks the pair up once:

1. A pair in :data:`TRANSITIONS` is allowed; the segment moves to the state it
   names (often the same one: data on an open stream).  A ``REQUEST`` that does
   not leave the segment ``REQUESTED`` starts a new segment of the stream; a
   ``CLOSE`` that does not leave it ``CLOSING``/``CLOSED`` closes nothing.
2. A pair in :data:`VIOLATIONS` is not allowed; it becomes an anomaly of the
   kind named, and the segment moves to the state named (``None``: the input
   is dropped).
3. Any other pair cannot happen through the builder's own lookups; should it,
   it is an ``unexpected stream input`` anomaly and the input is dropped.

:func:`step` applies these three rules.
"""

from __future__ import annotations

from enum import StrEnum

from .model import AnomalyKind, StreamState

__all__ = ["TRANSITIONS", "VIOLATIONS", "Input", "step"]


class Input(StrEnum):
    """What a frame does to the stream segment it reaches."""

    REQUEST = "stream request"  # DCP_STREAM_REQ for the stream's (vbucket, stream id)
    SUCCESS = "request succeeded"  # the answer to the segment's last DCP_STREAM_REQ: Success
    ROLLBACK = "request rolled back"  # ... Rollback
    ERROR = "request refused"  # ... any other status
    CLOSE = "close stream"  # DCP_CLOSE_STREAM for the stream's (vbucket, stream id)
    CLOSE_ANSWERED = "close answered"  # the answer to the segment's last DCP_CLOSE_STREAM
    DATA = "stream message"  # a producer stream message other than DCP_STREAM_END
    END = "stream end"  # DCP_STREAM_END
    # the same two on a connection that asked for a STREAM_END(Closed) after CLOSE_STREAM
    # (send_stream_end_on_client_close_stream): the producer sends what it had queued after the close response, then the end
    CLOSE_DATA = "stream message, end after close"
    CLOSE_END = "stream end after close"


_S, _I = StreamState, Input
# a stream ends from any state; after the CLOSE_STREAM answer only when the connection asked for that end
_ENDS: dict[tuple[StreamState, Input], StreamState] = {
    (s, i): _S.ENDED for s in _S if s is not _S.ENDED for i in (_I.END, _I.CLOSE_END) if (s, i) != (_S.CLOSED, _I.END)
}
_WAITING = (_S.ROLLED_BACK, _S.REFUSED)  # answered, not open: the consumer may ask again on the same segment

_TABLE: dict[tuple[StreamState, Input], StreamState] = {
    **_ENDS,
    # followed from mid-way (its request was not captured): open
    (_S.FOLLOWED, _I.DATA): _S.FOLLOWED,
    (_S.FOLLOWED, _I.CLOSE): _S.CLOSING,
    # requested: the answer decides; data before it, a repeated request, a close of no open stream change nothing
    (_S.REQUESTED, _I.REQUEST): _S.REQUESTED,
    (_S.REQUESTED, _I.SUCCESS): _S.OPEN,
    (_S.REQUESTED, _I.ROLLBACK): _S.ROLLED_BACK,
    (_S.REQUESTED, _I.ERROR): _S.REFUSED,
    (_S.REQUESTED, _I.DATA): _S.REQUESTED,
    (_S.REQUESTED, _I.CLOSE): _S.REQUESTED,
    # open
    (_S.OPEN, _I.DATA): _S.OPEN,
    (_S.OPEN, _I.CLOSE): _S.CLOSING,
    # rolled back or refused: the next request continues the segment
    **{(s, _I.REQUEST): _S.REQUESTED for s in _WAITING},
    **{(s, _I.DATA): s for s in _WAITING},
    **{(s, _I.CLOSE): s for s in _WAITING},
    # closing, closed (a second close is answered like the first)
    (_S.CLOSING, _I.DATA): _S.CLOSING,
    (_S.CLOSING, _I.CLOSE): _S.CLOSING,
    (_S.CLOSING, _I.CLOSE_ANSWERED): _S.CLOSED,
    (_S.CLOSED, _I.CLOSE): _S.CLOSED,
    (_S.CLOSED, _I.CLOSE_ANSWERED): _S.CLOSED,
    # a closed stream may be requested again at once, even before its STREAM_END(Closed): the request starts a new
    # segment, and this one still takes what the producer had queued (kv_engine engines/ep/src/dcp/producer.cc
    # ``shouldAddVBToProducerConnection``: the new stream replaces the dead one)
    (_S.CLOSING, _I.REQUEST): _S.CLOSING,
    (_S.CLOSED, _I.REQUEST): _S.CLOSED,
    # ... with send_stream_end_on_client_close_stream, the queued messages follow the close response
    (_S.CLOSED, _I.CLOSE_DATA): _S.CLOSED,
    # ended: a request starts a new segment; late answers are still recorded on this one
    (_S.ENDED, _I.REQUEST): _S.ENDED,
    (_S.ENDED, _I.CLOSE): _S.ENDED,
    (_S.ENDED, _I.CLOSE_ANSWERED): _S.ENDED,
    (_S.ENDED, _I.SUCCESS): _S.ENDED,
    (_S.ENDED, _I.ROLLBACK): _S.ENDED,
    (_S.ENDED, _I.ERROR): _S.ENDED,
}
#: the table; a stream message on a connection with STREAM_END after close goes where any stream message goes
TRANSITIONS: dict[tuple[StreamState, Input], StreamState] = {
    **_TABLE,
    **{(s, _I.CLOSE_DATA): t for (s, i), t in _TABLE.items() if i is _I.DATA and (s, _I.CLOSE_DATA) not in _TABLE},
}

_OPEN = (_S.FOLLOWED, _S.OPEN)
VIOLATIONS: dict[tuple[StreamState, Input], tuple[AnomalyKind, StreamState | None]] = {
    # a request while the stream is open (not closed by the consumer): the old segment stays as it is, the request
    # starts a new one
    **{(s, _I.REQUEST): (AnomalyKind.STREAM_ALREADY_OPEN, s) for s in _OPEN},
    # the producer goes on after it answered CLOSE_STREAM: still read
    (_S.CLOSED, _I.DATA): (AnomalyKind.AFTER_CLOSE_STREAM, _S.CLOSED),
    (_S.CLOSED, _I.END): (AnomalyKind.AFTER_CLOSE_STREAM, _S.ENDED),
    # ... or after it ended the stream: dropped
    (_S.ENDED, _I.DATA): (AnomalyKind.AFTER_STREAM_END, None),
    (_S.ENDED, _I.CLOSE_DATA): (AnomalyKind.AFTER_STREAM_END, None),
    (_S.ENDED, _I.END): (AnomalyKind.AFTER_STREAM_END, None),
    (_S.ENDED, _I.CLOSE_END): (AnomalyKind.AFTER_STREAM_END, None),
}


def step(state: StreamState, inp: Input) -> tuple[StreamState | None, AnomalyKind | None]:
    """(the next state or ``None``: input dropped, the anomaly kind or ``None``: allowed) for ``inp`` in ``state``."""
    nxt = TRANSITIONS.get((state, inp))
    if nxt is not None:
        return nxt, None
    kind, after = VIOLATIONS.get((state, inp), (AnomalyKind.UNEXPECTED_STREAM_INPUT, None))
    return after, kind
