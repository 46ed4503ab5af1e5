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
4. ``CONTROL_KEYS`` holds every DCP_CONTROL key with its accepted values, what it
   requires, what it conflicts with, and whether it is refused outright;
   :func:`control_status` applies them.
5. ``STREAM_END_REREQUEST`` / ``STREAM_END_NORMAL`` say which stream-end reasons
   call for a new stream request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass

from .enums import Feature, Magic, Opcode, OpenFlag, Status, StreamEndStatus

__all__ = [
    "CONNECTION_MANAGER_INTERVAL",
    "CONTEXT_EFFECTS",
    "CONTROL_KEYS",
    "EXPECTS_RESPONSE",
    "ITEMS",
    "REQUEST_MAGICS",
    "RESPONSE_MAGICS",
    "SASL_REQUESTS",
    "SEQNO_FIELD",
    "SESSION_OPS",
    "SESSION_START_OPS",
    "STREAM_END_NORMAL",
    "STREAM_END_REREQUEST",
    "STREAM_MESSAGES",
    "SYNC_WRITES",
    "ControlKey",
    "control_status",
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

#: stream-end reasons after which a consumer requests the stream again (Rollback arrives as StateChanged)
STREAM_END_REREQUEST: frozenset[int] = frozenset(
    int(s) for s in (StreamEndStatus.STATE_CHANGED, StreamEndStatus.SLOW, StreamEndStatus.BACKFILL_FAIL, StreamEndStatus.ROLLBACK)
)
#: stream-end reasons that end a stream for good
STREAM_END_NORMAL: frozenset[int] = frozenset(int(s) for s in (StreamEndStatus.OK, StreamEndStatus.CLOSED, StreamEndStatus.FILTER_EMPTY))

# ---------------------------------------------------------------------------
# DCP_CONTROL

#: the smallest noop interval a server accepts (seconds)
CONNECTION_MANAGER_INTERVAL = 0.1

_BOOL = frozenset({"true", "false"})
_TRUE = frozenset({"true"})


def _any(value: str) -> bool:
    del value
    return True


def _uint32(value: str) -> bool:
    # kv_engine parses connection_buffer_size as a uint32_t (decimal digits only here)
    return value.isascii() and value.isdigit() and len(value) <= 10 and int(value) < 2**32


def _noop_interval(value: str) -> bool:
    try:
        return float(value) >= CONNECTION_MANAGER_INTERVAL
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ControlKey:
    """One DCP_CONTROL key: what it accepts and needs, and the prose for the reference.

    ``values`` is the set of accepted values, or a predicate, or ``None`` for any
    non-empty value.  ``needs_feature`` / ``needs_open_flag`` must have been
    negotiated (EINVAL otherwise); ``needs_collections_for`` are the values that
    need HELLO Collections.  ``conflicts`` are controls (key, value) that make
    this one NotSupported, and ``conflicts_stream_ids`` the same for an earlier
    ``enable_stream_id``.  ``refused`` keys are always NotSupported after their
    value is checked.
    """

    doc: str
    values: frozenset[str] | Callable[[str], bool] | None = _TRUE
    needs_feature: int | None = None
    needs_open_flag: int = 0
    needs_collections_for: frozenset[str] = frozenset()
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


CONTROL_KEYS: Mapping[str, ControlKey] = {
    "enable_noop": ControlKey("true/false: noop liveness", _BOOL),
    "set_noop_interval": ControlKey("seconds (float) >= connection_manager_interval", _noop_interval),
    "connection_buffer_size": ControlKey("bytes; flow control, 0 disables", _uint32),
    "stream_buffer_size": ControlKey("NotSupported", _any, refused=True),
    "set_priority": ControlKey("high / medium / low", frozenset({"high", "medium", "low"})),
    "supports_cursor_dropping": ControlKey("true/false", _BOOL),
    "supports_cursor_dropping_vulcan": ControlKey("true/false", _BOOL),
    "supports_hifi_MFU": ControlKey("true/false", _BOOL),
    "force_value_compression": ControlKey("true/false; EINVAL unless snappy negotiated", _BOOL, needs_feature=Feature.SNAPPY),
    "send_stream_end_on_client_close_stream": ControlKey("true; STREAM_END(Closed) after close"),
    "enable_expiry_opcode": ControlKey("true; needs IncludeDeleteTimes"),
    "enable_stream_id": ControlKey("true; NotSupported with sync writes", conflicts=(("enable_sync_writes", "true"),)),
    "enable_sync_writes": ControlKey("true; NotSupported with stream-ids", conflicts_stream_ids=True),
    "consumer_name": ControlKey("non-empty string", None),
    "enable_out_of_order_snapshots": ControlKey("true / true_with_seqno_advanced", frozenset({"true", "true_with_seqno_advanced"})),
    "include_deleted_user_xattrs": ControlKey("true; needs open flag 0x100", needs_open_flag=OpenFlag.INCLUDE_DELETED_USER_XATTRS),
    "v7_dcp_status_codes": ControlKey("true"),
    "flatbuffers_system_events": ControlKey("true"),
    "change_streams": ControlKey("true", refused=True),
    "max_marker_version": ControlKey("2.2; needs collections", frozenset({"2.0", "2.2"}), needs_collections_for=frozenset({"2.2"})),
    "backfill_order": ControlKey("round-robin / sequential", frozenset({"round-robin", "sequential"})),
    "cache_transfer": ControlKey("any", _any, refused=True),
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

    An empty value is EINVAL whatever the key.
    """
    rule = CONTROL_KEYS.get(key)
    if rule is None or not value or not rule.accepts(value):
        return Status.EINVAL
    if rule.needs_feature is not None and rule.needs_feature not in features:
        return Status.EINVAL
    if rule.needs_open_flag and not open_flags & rule.needs_open_flag:
        return Status.EINVAL
    if value in rule.needs_collections_for and Feature.COLLECTIONS not in features:
        return Status.EINVAL
    if rule.refused:
        return Status.NOT_SUPPORTED
    set_controls = controls or {}
    if any(set_controls.get(k) == v for k, v in rule.conflicts) or (rule.conflicts_stream_ids and stream_ids):
        return Status.NOT_SUPPORTED
    return Status.SUCCESS
