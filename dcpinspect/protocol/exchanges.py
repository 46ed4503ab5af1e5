"""How each request is answered: one response, several, one only on error, none, or the connection closes.

Data, read by the timeline to match responses to requests (and by anything
else that must know when an exchange is over).  From kv_engine's
docs/BinaryProtocol.md and daemon/mcbp_executors.cc:

1. Most commands get exactly one response, with the request's opaque.
2. STAT gets one response per statistic and ends with a response that has no
   key (and no value); an error status is a single response that ends it.
3. The quiet commands (GETQ, SETQ, ...) are answered only when there is
   something to say: a hit for the quiet gets, a failure for the quiet
   updates (kv_engine's serverless mode refuses them with one response).
4. QUIT is answered once and then the server closes the connection (the
   client may be gone first); QUITQ just closes it.
5. The producer's stream messages, buffer acks and seqno acks get none,
   except a SET_VBUCKET_STATE (always acknowledged by the consumer) and a
   snapshot marker that carries the Ack flag.

>>> exchange(Opcode.STAT) is Exchange.MANY and exchange(Opcode.GET_CLUSTER_CONFIG) is Exchange.ONE
True
>>> last_response(Opcode.STAT, status=0, key_length=0), last_response(Opcode.STAT, status=0, key_length=4)
(True, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from .enums import Opcode, Status
from .session import STREAM_MESSAGES

__all__ = ["EXCHANGES", "Exchange", "answered_once", "exchange", "last_response"]


class Exchange(StrEnum):
    """How a request is answered."""

    ONE = "one response"
    MANY = "responses until one without a key"  # STAT
    QUIET = "a response only when there is something to say"  # GETQ, SETQ...: hit / failure
    CLOSE = "one response, then the connection closes"  # QUIT (the response may not be seen)
    NONE = "no response"  # QUITQ (closes), stream messages, buffer and seqno acks
    ON_ACK_FLAG = "one response when it carries the Ack flag"  # DCP_SNAPSHOT_MARKER


_ = Opcode
_QUIET = (
    _.GETQ,
    _.GETKQ,
    _.SETQ,
    _.ADDQ,
    _.REPLACEQ,
    _.DELETEQ,
    _.INCREMENTQ,
    _.DECREMENTQ,
    _.FLUSHQ,
    _.APPENDQ,
    _.PREPENDQ,
    _.GATQ,
)

#: opcode -> how its request is answered (an opcode not listed: :attr:`Exchange.ONE`)
EXCHANGES: Mapping[int, Exchange] = {
    **dict.fromkeys((int(op) for op in Opcode), Exchange.ONE),
    **dict.fromkeys(STREAM_MESSAGES, Exchange.NONE),
    **dict.fromkeys((int(op) for op in _QUIET), Exchange.QUIET),
    int(_.STAT): Exchange.MANY,
    int(_.QUIT): Exchange.CLOSE,
    int(_.QUITQ): Exchange.NONE,
    int(_.DCP_BUFFER_ACKNOWLEDGEMENT): Exchange.NONE,
    int(_.DCP_SEQNO_ACKNOWLEDGED): Exchange.NONE,
    int(_.DCP_SET_VBUCKET_STATE): Exchange.ONE,
    int(_.DCP_SNAPSHOT_MARKER): Exchange.ON_ACK_FLAG,
}

_SUCCESS = int(Status.SUCCESS)


def exchange(opcode: int) -> Exchange:
    """How a request with ``opcode`` is answered."""
    return EXCHANGES.get(opcode, Exchange.ONE)


def answered_once(opcode: int) -> bool:
    """Whether a request with ``opcode`` always gets a response (one or more): a request left without one was never answered."""
    return exchange(opcode) in (Exchange.ONE, Exchange.MANY)


def last_response(opcode: int, *, status: int, key_length: int) -> bool:
    """Whether a response (its status, the length of its key) is the last one of its request.

    Only STAT goes on: its statistics have keys, its end has none; an error ends it at once.
    """
    if exchange(opcode) is not Exchange.MANY:
        return True
    return status != _SUCCESS or key_length == 0
