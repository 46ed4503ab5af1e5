"""The DCP consumer's state machines as tables, and the events it reports.

:class:`~dcpinspect.live.consumer.DcpConsumer` has two kinds of state: the
connection's :class:`Phase` (the bootstrap steps, streaming, and its two ends)
and each vbucket stream's :class:`StreamStatus`.  Both move only along the
tables here; anything else is a bug and raises :class:`TransitionError` (the
server's input never does: it becomes a :class:`ConsumerEvent`).

1. :data:`PHASE_TRANSITIONS` and :data:`STREAM_TRANSITIONS` list every move; a
   state with no moves is an end.
2. :data:`AWAITS` says which kinds of :class:`Request` may be waiting for a reply
   in each phase; a reply is routed by the kind of request it answers.
3. Text the server sent goes into a message only through :func:`server_text`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..protocol import spec
from ..wire.dissection import Dissection
from ..wire.render import safe_text

__all__ = [
    "AWAITS",
    "FINISHED",
    "PHASE_TRANSITIONS",
    "STREAM_TRANSITIONS",
    "TEXT_LIMIT",
    "ConsumerEvent",
    "Phase",
    "Request",
    "StreamStatus",
    "TransitionError",
    "server_text",
    "status_text",
]

#: characters of server-provided text kept in a message (escaped, see :func:`~dcpinspect.wire.render.safe_text`)
TEXT_LIMIT = 200


class TransitionError(RuntimeError):
    """A move that is not in a transition table: a bug in the consumer, never the server's doing."""


class Phase(StrEnum):
    """Where the connection is: the bootstrap steps in order, then streaming, then one of two ends."""

    HELLO = "hello"
    SASL_MECHS = "sasl_mechs"
    SASL_AUTH = "sasl_auth"
    SELECT_BUCKET = "select_bucket"
    CONFIG = "config"  # GET_CLUSTER_CONFIG: which node holds which vbucket
    SEQNOS = "seqnos"
    OPEN = "open"
    CONTROLS = "controls"
    STREAMING = "streaming"
    DONE = "done"
    FAILED = "failed"


_P = Phase
#: the phases a connection ends in
ENDS = frozenset((_P.DONE, _P.FAILED))
#: every move between phases.  A bootstrap phase may end early: a failure, or a stop (DONE).
PHASE_TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    _P.HELLO: frozenset((_P.SASL_MECHS,)) | ENDS,
    _P.SASL_MECHS: frozenset((_P.SASL_AUTH,)) | ENDS,
    _P.SASL_AUTH: frozenset((_P.SELECT_BUCKET,)) | ENDS,  # SCRAM's second step stays in SASL_AUTH
    _P.SELECT_BUCKET: frozenset((_P.CONFIG, _P.SEQNOS, _P.OPEN)) | ENDS,
    _P.CONFIG: frozenset((_P.SEQNOS, _P.OPEN)) | ENDS,  # every vbucket elsewhere: DONE
    _P.SEQNOS: frozenset((_P.OPEN,)) | ENDS,  # the STAT fallback stays in SEQNOS
    _P.OPEN: frozenset((_P.CONTROLS,)) | ENDS,
    _P.CONTROLS: frozenset((_P.STREAMING,)) | ENDS,
    _P.STREAMING: ENDS,
    _P.DONE: frozenset(),
    _P.FAILED: frozenset(),
}


class Request(StrEnum):
    """The kinds of request whose reply the consumer waits for."""

    HELLO = "HELLO"
    SASL_MECHS = "SASL_MECHS"
    SASL_AUTH = "SASL_AUTH"  # SASL_AUTH and SASL_STEP
    SELECT_BUCKET = "SELECT_BUCKET"
    CONFIG = "CONFIG"  # GET_CLUSTER_CONFIG
    SEQNOS = "SEQNOS"  # GET_ALL_VB_SEQNOS
    STAT = "STAT"  # STAT vbucket-seqno, when GET_ALL_VB_SEQNOS is refused
    OPEN = "OPEN"
    CONTROL = "CONTROL"
    STREAM_REQ = "STREAM_REQ"


_R = Request
#: the kinds of request a phase may send and wait for
AWAITS: Mapping[Phase, frozenset[Request]] = {
    _P.HELLO: frozenset((_R.HELLO,)),
    _P.SASL_MECHS: frozenset((_R.SASL_MECHS,)),
    _P.SASL_AUTH: frozenset((_R.SASL_AUTH,)),
    _P.SELECT_BUCKET: frozenset((_R.SELECT_BUCKET,)),
    _P.CONFIG: frozenset((_R.CONFIG,)),
    _P.SEQNOS: frozenset((_R.SEQNOS, _R.STAT)),
    _P.OPEN: frozenset((_R.OPEN,)),
    _P.CONTROLS: frozenset((_R.CONTROL,)),
    _P.STREAMING: frozenset((_R.STREAM_REQ, _R.CONFIG)),  # the map again when a vbucket moved
    _P.DONE: frozenset(),
    _P.FAILED: frozenset(),
}


class StreamStatus(StrEnum):
    """Where one vbucket's stream is."""

    PENDING = "pending"  # not requested yet
    REQUESTED = "requested"  # a stream request awaits its reply
    STREAMING = "streaming"
    CLOSING = "closing"  # closed by the client; the producer's STREAM_END(Closed) is awaited
    LOCATING = "locating"  # the vbucket moved (StateChanged, NOT_MY_VBUCKET): the cluster map is awaited
    ENDED = "ended"
    FAILED = "failed"
    MOVED = "moved"  # handed over to the connection to the node that now holds the vbucket active


_S = StreamStatus
#: the statuses a stream ends in (on this connection: a MOVED stream goes on over another one)
FINISHED = frozenset((_S.ENDED, _S.FAILED, _S.MOVED))
#: every move of a stream.  REQUESTED -> REQUESTED is a rollback's retry; STREAMING -> REQUESTED a re-request;
#: LOCATING waits for the cluster map, then requests again here or hands the stream over (MOVED).
STREAM_TRANSITIONS: Mapping[StreamStatus, frozenset[StreamStatus]] = {
    _S.PENDING: frozenset((_S.REQUESTED,)) | FINISHED,
    _S.REQUESTED: frozenset((_S.REQUESTED, _S.STREAMING, _S.LOCATING)) | FINISHED,
    _S.STREAMING: frozenset((_S.REQUESTED, _S.CLOSING, _S.LOCATING)) | FINISHED,
    _S.CLOSING: frozenset((_S.ENDED,)),
    _S.LOCATING: frozenset((_S.REQUESTED, _S.ENDED, _S.FAILED, _S.MOVED)),
    _S.ENDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.MOVED: frozenset(),
}


@dataclass(frozen=True)
class ConsumerEvent:
    """Something that happened on the connection.

    ``kind`` is one of: ``hello``, ``authenticated``, ``auth_failed``,
    ``bucket_selected``, ``cluster_map`` (what GET_CLUSTER_CONFIG answered), ``moved`` (a vbucket
    lives on another node: ``data`` holds its :class:`~dcpinspect.live.consumer_streams.Handoff`),
    ``seqnos``, ``opened``, ``control``,
    ``control_rejected``, ``stream_requested``, ``stream_started``,
    ``rollback``, ``resume_reset`` (a resume position outside its own snapshot: streamed again from 0), ``stream_failed``, ``stream_end``, ``rerequest``,
    ``snapshot``, ``mutation``, ``deletion``, ``expiration``, ``prepare``,
    ``commit``, ``abort``, ``system_event``, ``seqno_advanced``, ``oso``,
    ``set_vbucket_state``, ``cache_transfer``, ``checkpoint`` (a consistent
    point: persist :attr:`DcpConsumer.state`), ``noop``, ``buffer_ack``,
    ``malformed``, ``unexpected``, ``error`` (a fatal failure; the consumer
    is done), ``done`` (all streams ended).
    """

    kind: str
    message: str = ""
    vbucket: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    dissection: Dissection | None = field(default=None, repr=False, compare=False)
    #: ``host:port`` of the connection it happened on, when the client has several (see ``ClusterConsumer``)
    node: str = ""

    def __str__(self) -> str:
        where = f"vb {self.vbucket}: " if self.vbucket is not None else ""
        return f"{self.kind}: {where}{self.message}" if self.message else f"{self.kind}: {where}".rstrip(": ")


def server_text(text: str) -> str:
    """Text the server sent, made safe to show: control characters escaped, shortened."""
    return safe_text(text, TEXT_LIMIT)


def status_text(status: int | None) -> str:
    """A status as ``0x.. Name`` for messages."""
    if status is None:
        return "no status"
    return f"0x{status:02x} {spec.STATUS.get(status, 'unknown')}"
