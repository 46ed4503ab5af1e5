"""Protocol behaviour as data: what each message does to a connection and to its streams.

The table (:mod:`.spec`) says how a frame is laid out; this module says what a
frame *means* to the session around it.  Every set and rule here is used by the
decoder's records, the timeline, the consumer and the producer alike, so a
behaviour is written once:

1. ``STREAM_MESSAGES`` are the producer's messages that belong to a stream and
   count against flow control; ``ITEMS`` are the seqno-carrying ones among them.
2. ``SESSION_OPS`` change what later frames on the connection mean (the
   connection context); ``CONTEXT_EFFECTS`` says which part each one changes.
3. ``EXPECTS_RESPONSE`` are the requests that are answered; producer stream
   messages, buffer acks and seqno acks are not.
4. ``CONTROL_KEYS`` holds every DCP_CONTROL key with its accepted values, the
   values that turn it on, what it requires, what it conflicts with, and whether
   it is refused outright; :func:`control_status` applies them and
   :func:`control_value` / :func:`control_on` say what the connection keeps.
5. ``STREAM_END_REREQUEST`` / ``STREAM_END_NORMAL`` say which stream-end reasons
   call for a new stream request and which end a stream for good.
6. Noops: ``DEFAULT_NOOP_INTERVAL``, ``DCP_IDLE_TIMEOUT`` and ``NOOP_OPAQUE_BASE``
   are the producer's liveness defaults.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass

from .enums import Feature, Magic, Opcode, OpenFlag, Status, StreamEndStatus

__all__ = [
    "CONNECTION_MANAGER_INTERVAL",
    "CONTEXT_EFFECTS",
    "CONTROL_KEYS",
    "DCP_IDLE_TIMEOUT",
    "DEFAULT_NOOP_INTERVAL",
    "EXPECTS_RESPONSE",
    "ITEMS",
    "NOOP_OPAQUE_BASE",
    "REQUEST_MAGICS",
    "RESPONSE_MAGICS",
    "SASL_REQUESTS",
    "SEQNO_FIELD",
    "SESSION_OPS",
    "SESSION_START_OPS",
    "STREAM_END_NEVER_SENT",
    "STREAM_END_NORMAL",
    "STREAM_END_RELOCATE",
    "STREAM_END_REREQUEST",
    "STREAM_MESSAGES",
    "SYNC_WRITES",
    "ControlKey",
    "control_on",
    "control_status",
    "control_value",
    "parse_float",
    "parse_u32",
]

_ = Opcode

#: producer messages that belong to a stream and count against flow control (REFERENCE.md, "flow control")
STREAM_MESSAGES: frozenset[int] = frozenset(
    int(op)
    for op in (
        _.DCP_STREAM_END,
        _.DCP_SNAPSHOT_MARKER,
        _.DCP_MUTATION,
        _.DCP_DELETION,
        _.DCP_EXPIRATION,
        _.DCP_SET_VBUCKET_STATE,
        _.DCP_SYSTEM_EVENT,
        _.DCP_PREPARE,
        _.DCP_COMMIT,
        _.DCP_ABORT,
        _.DCP_SEQNO_ADVANCED,
        _.DCP_OSO_SNAPSHOT,
        _.DCP_CACHE_TRANSFER,
        _.DCP_CACHE_TRANSFER_END,
    )
)
#: the items of a snapshot: the seqno-carrying stream messages
ITEMS: frozenset[int] = frozenset(
    int(op)
    for op in (
        _.DCP_MUTATION,
        _.DCP_DELETION,
        _.DCP_EXPIRATION,
        _.DCP_SYSTEM_EVENT,
        _.DCP_PREPARE,
        _.DCP_COMMIT,
        _.DCP_ABORT,
        _.DCP_SEQNO_ADVANCED,
    )
)
#: the sync-write messages (enabled by DCP_CONTROL enable_sync_writes)
SYNC_WRITES: frozenset[int] = frozenset(int(op) for op in (_.DCP_PREPARE, _.DCP_SEQNO_ACKNOWLEDGED, _.DCP_COMMIT, _.DCP_ABORT))
#: requests that are answered (the rest - producer stream messages, buffer acks, seqno acks - are not)
EXPECTS_RESPONSE: frozenset[int] = frozenset(
    int(op)
    for op in (
        _.HELLO,
        _.SASL_LIST_MECHS,
        _.SASL_AUTH,
        _.SASL_STEP,
        _.SELECT_BUCKET,
        _.GET_ERROR_MAP,
        _.GET_ALL_VB_SEQNOS,
        _.DCP_OPEN,
        _.DCP_CLOSE_STREAM,
        _.DCP_STREAM_REQ,
        _.DCP_GET_FAILOVER_LOG,
        _.DCP_NOOP,
        _.DCP_CONTROL,
        _.GET_FAILOVER_LOG,
        _.STAT,
    )
)
#: what a successful exchange of each session command changes in the connection context
CONTEXT_EFFECTS: Mapping[int, str] = {
    _.HELLO: "features",
    _.SASL_AUTH: "sasl_mechanism",
    _.DCP_OPEN: "open_flags",
    _.DCP_CONTROL: "controls",
    _.SELECT_BUCKET: "bucket",
}
#: the commands that change what later frames on the connection mean
SESSION_OPS: frozenset[int] = frozenset(int(op) for op in CONTEXT_EFFECTS)
#: commands a client sends first on a connection: a request with one of them names the client side
SESSION_START_OPS: frozenset[int] = frozenset(int(op) for op in (_.HELLO, _.SASL_LIST_MECHS, _.SASL_AUTH, _.DCP_OPEN, _.SELECT_BUCKET))
#: the magics of a request from a client (with and without flexible framing extras)
REQUEST_MAGICS: frozenset[int] = frozenset(int(m) for m in (Magic.CLIENT_REQUEST, Magic.ALT_CLIENT_REQUEST))
#: the magics of a response to a client request (classic and alt)
RESPONSE_MAGICS: frozenset[int] = frozenset(int(m) for m in (Magic.CLIENT_RESPONSE, Magic.ALT_CLIENT_RESPONSE))
#: the requests whose value carries SASL secrets (a PLAIN password, a SCRAM proof)
SASL_REQUESTS: frozenset[int] = frozenset(int(op) for op in (_.SASL_AUTH, _.SASL_STEP))
#: opcode -> the extras field holding the seqno a frame carries
SEQNO_FIELD: Mapping[int, str] = {
    _.DCP_MUTATION: "by_seqno",
    _.DCP_DELETION: "by_seqno",
    _.DCP_EXPIRATION: "by_seqno",
    _.DCP_SYSTEM_EVENT: "by_seqno",
    _.DCP_PREPARE: "by_seqno",
    _.DCP_SEQNO_ACKNOWLEDGED: "prepared_seqno",
    _.DCP_COMMIT: "commit_seqno",
    _.DCP_ABORT: "abort_seqno",
    _.DCP_SEQNO_ADVANCED: "seqno",
}

#: stream-end reasons after which a consumer requests the stream again where the vbucket lives on
#: (kv_engine sends Rollback (6) as StateChanged (2) on the wire; Slow comes from a stalled disk backfill)
STREAM_END_REREQUEST: frozenset[int] = frozenset(
    int(s) for s in (StreamEndStatus.STATE_CHANGED, StreamEndStatus.SLOW, StreamEndStatus.BACKFILL_FAIL, StreamEndStatus.ROLLBACK)
)
#: stream-end reasons that end a stream for good: the consumer stops (OK: end seqno reached, Closed: it closed
#: the stream, FilterEmpty: its collections were dropped, LostPrivileges: its user lost access).  Disconnected (3)
#: is never sent on the wire: it is the reason a stream ends when its connection goes away.
STREAM_END_NORMAL: frozenset[int] = frozenset(
    int(s) for s in (StreamEndStatus.OK, StreamEndStatus.CLOSED, StreamEndStatus.FILTER_EMPTY, StreamEndStatus.LOST_PRIVILEGES)
)
#: stream-end reasons after which a client that follows the cluster map asks it where the vbucket lives now
STREAM_END_RELOCATE: frozenset[int] = frozenset(int(s) for s in (StreamEndStatus.STATE_CHANGED, StreamEndStatus.ROLLBACK))
#: stream-end reasons a producer never puts on the wire
STREAM_END_NEVER_SENT: frozenset[int] = frozenset({int(StreamEndStatus.DISCONNECTED)})

# ---------------------------------------------------------------------------
# noops and liveness (kv_engine engines/ep/src/dcp/producer.cc ``maybeSendNoop``, engines/ep/configuration.json)

#: the producer's noop interval until the consumer sets one (``set_noop_interval``); seconds
DEFAULT_NOOP_INTERVAL = 20.0
#: kv_engine's ``dcp_idle_timeout``: seconds without anything received from the consumer before the
#: producer disconnects (noops on)
DCP_IDLE_TIMEOUT = 360.0
#: the server's noop opaques are a counter starting here
NOOP_OPAQUE_BASE = 10000001

# ---------------------------------------------------------------------------
# DCP_CONTROL (kv_engine engines/ep/src/dcp/producer.cc ``DcpProducer::control``)

#: the smallest noop interval a server accepts (seconds; kv_engine's connection_manager_interval default)
CONNECTION_MANAGER_INTERVAL = 0.1

_C_SPACE = " \t\n\v\f\r"
_FLOAT = re.compile(
    r"[+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|(?i:inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?))",
)
_UINT = re.compile(r"[0-9]+")
_INF = float("inf")


def parse_u32(value: str) -> int | None:
    """``value`` read as kv_engine's ``safe_strtoul`` reads it (utilities/util.cc), or ``None``.

    Leading whitespace and one ``+`` are skipped, then decimal digits that must fit a
    u32; anything after them must start with whitespace (and is ignored).
    """
    text = value.lstrip(_C_SPACE)
    text = text.removeprefix("+")
    m = _UINT.match(text)
    if m is None or (m.end() < len(text) and text[m.end()] not in _C_SPACE):
        return None
    digits = m.group().lstrip("0") or "0"
    if len(digits) > 10:
        return None
    n = int(digits)
    return n if n < 2**32 else None


def parse_float(value: str) -> float | None:
    """``value`` read as kv_engine's ``safe_strtof`` reads it (C ``strtof``), or ``None``.

    Leading whitespace, then a C float (decimal, hex, ``inf``, ``nan``); anything after it
    must start with whitespace; an overflow is refused.
    """
    text = value.lstrip(_C_SPACE)
    m = _FLOAT.match(text)
    if m is None or (m.end() < len(text) and text[m.end()] not in _C_SPACE):
        return None
    token = m.group()
    body = token.lstrip("+-")
    if body[:2].lower() == "0x":
        mantissa = body if "p" in body.lower() else body + "p0"
        number = float.fromhex(("-" if token.startswith("-") else "") + mantissa)
    elif body[:1].lower() == "n":
        number = float("nan")
    else:
        number = float(token)
    try:
        rounded = _f32(number)
    except OverflowError:
        return None  # ERANGE
    return None if rounded in (_INF, -_INF) and number not in (_INF, -_INF) else rounded


def _f32(number: float) -> float:
    """``number`` rounded to a C float (what strtof returns); OverflowError beyond the float range."""
    return float(struct.unpack("f", struct.pack("f", number))[0])


def _any(value: str) -> bool:
    del value
    return True


def _uint32(value: str) -> bool:
    return parse_u32(value) is not None


def _noop_interval(value: str) -> bool:
    number = parse_float(value)
    return number is not None and number >= _f32(CONNECTION_MANAGER_INTERVAL)  # nan is never >=


_TRUE = frozenset({"true"})


@dataclass(frozen=True, slots=True)
class ControlKey:
    """One DCP_CONTROL key: what it accepts and needs, what turns it on, and the prose for the reference.

    ``values`` is the set of accepted values, or a predicate, or ``None`` for any
    (non-empty) value.  ``on`` are the accepted values that turn the setting on
    (``None``: the value is a quantity or a name, not a switch); an accepted value
    outside ``on`` turns it off, unless ``one_way`` (once on it stays on).
    ``needs_feature`` / ``needs_open_flag`` must have been negotiated (EINVAL
    otherwise); ``needs_collections`` keys are NotSupported without HELLO
    Collections.  ``conflicts`` are controls (key, value) that make this one
    NotSupported, and ``conflicts_stream_ids`` the same for an earlier
    ``enable_stream_id``.  ``refused`` keys are always NotSupported after their
    value is checked.
    """

    doc: str
    values: frozenset[str] | Callable[[str], bool] | None = _TRUE
    on: frozenset[str] | None = _TRUE
    one_way: bool = False
    needs_feature: int | None = None
    needs_open_flag: int = 0
    needs_collections: bool = False
    conflicts: tuple[tuple[str, str], ...] = ()
    conflicts_stream_ids: bool = False
    refused: bool = False

    def accepts(self, value: str) -> bool:
        """Whether ``value`` is one this key takes."""
        if self.values is None:
            return value != ""
        if callable(self.values):
            return self.values(value)
        return value in self.values


#: every key kv_engine's producer knows, with the producer's rule for its value (``DcpProducer::control``)
CONTROL_KEYS: Mapping[str, ControlKey] = {
    "enable_noop": ControlKey('any value; only "true" turns noops on (anything else turns them off)', None),
    "set_noop_interval": ControlKey("seconds (a C float) >= connection_manager_interval (0.1)", _noop_interval, on=None),
    "connection_buffer_size": ControlKey("bytes, a u32; flow control, 0 disables", _uint32, on=None),
    "stream_buffer_size": ControlKey("NotSupported whatever the value", None, refused=True),
    "set_priority": ControlKey("high / medium / low", frozenset({"high", "medium", "low"}), on=None),
    "supports_cursor_dropping": ControlKey('any value; "true" allows cursor dropping', None),
    "supports_cursor_dropping_vulcan": ControlKey('any value; "true" allows cursor dropping', None),
    "supports_hifi_MFU": ControlKey('any value; "true": the consumer reads hifi MFU', None),
    "force_value_compression": ControlKey(
        'any value, EINVAL unless HELLO Snappy; "true" compresses values', None, needs_feature=Feature.SNAPPY
    ),
    "send_stream_end_on_client_close_stream": ControlKey(
        'any value; "true" turns it on for good: STREAM_END(Closed) after a close', None, one_way=True
    ),
    "enable_expiry_opcode": ControlKey('any value; "true" sends DCP_EXPIRATION (with IncludeDeleteTimes only)', None),
    "enable_stream_id": ControlKey("true; NotSupported with sync writes; one-way", conflicts=(("enable_sync_writes", "true"),)),
    "enable_sync_writes": ControlKey("true; NotSupported with stream ids", conflicts_stream_ids=True),
    "consumer_name": ControlKey("any name; with sync writes the consumer acknowledges seqnos", None, on=None),
    "enable_out_of_order_snapshots": ControlKey(
        "true / true_with_seqno_advanced",
        frozenset({"true", "true_with_seqno_advanced"}),
        on=frozenset({"true", "true_with_seqno_advanced"}),
    ),
    "include_deleted_user_xattrs": ControlKey(
        "true; EINVAL without DCP_OPEN flag 0x100", needs_open_flag=OpenFlag.INCLUDE_DELETED_USER_XATTRS
    ),
    "v7_dcp_status_codes": ControlKey("true"),
    "flatbuffers_system_events": ControlKey("true"),
    "change_streams": ControlKey("true; NotSupported unless the storage keeps history (the simulator's does not)", refused=True),
    "max_marker_version": ControlKey(
        "2.2 only; NotSupported without HELLO Collections", frozenset({"2.2"}), on=None, needs_collections=True
    ),
    "backfill_order": ControlKey("round-robin / sequential", frozenset({"round-robin", "sequential"}), on=None),
    "cache_transfer": ControlKey("any value; succeeds while dcp_cache_transfer_enabled (default true)", None, on=None),
}


def control_status(
    key: str,
    value: str,
    *,
    features: Set[int] = frozenset(),
    open_flags: int = 0,
    controls: Mapping[str, str] | None = None,
    stream_ids: bool = False,
) -> Status:
    """The status a producer answers ``DCP_CONTROL key=value`` with, given what the connection negotiated.

    An empty value is EINVAL whatever the key (the validator wants a key and a value).
    """
    rule = CONTROL_KEYS.get(key)
    if rule is None or not value:
        return Status.EINVAL
    if rule.needs_feature is not None and rule.needs_feature not in features:
        return Status.EINVAL
    if not rule.accepts(value):
        return Status.EINVAL
    if rule.needs_open_flag and not open_flags & rule.needs_open_flag:
        return Status.EINVAL
    if rule.needs_collections and Feature.COLLECTIONS not in features:
        return Status.NOT_SUPPORTED
    if rule.refused:
        return Status.NOT_SUPPORTED
    set_controls = controls or {}
    if any(set_controls.get(k) == v for k, v in rule.conflicts) or (rule.conflicts_stream_ids and stream_ids):
        return Status.NOT_SUPPORTED
    return Status.SUCCESS


def control_value(key: str, value: str, previous: str | None) -> str:
    """The value a connection keeps for ``key`` after the producer accepted ``key=value``.

    The new value, except that a ``one_way`` setting that is on stays on (its earlier value is kept).
    """
    rule = CONTROL_KEYS.get(key)
    if rule is not None and rule.one_way and rule.on is not None and previous in rule.on and value not in rule.on:
        return previous
    return value


def control_on(key: str, controls: Mapping[str, str]) -> bool:
    """Whether the switch ``key`` is on, given the controls a connection kept (:func:`control_value`)."""
    rule = CONTROL_KEYS.get(key)
    value = controls.get(key)
    if rule is None or value is None:
        return False
    return value in rule.on if rule.on is not None else True
