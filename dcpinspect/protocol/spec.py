"""THE protocol table for the memcached binary protocol and DCP.

Pure data, restated from kv_engine's protocol documentation (``docs/BinaryProtocol.md``,
``docs/dcp/documentation/``), its headers (``include/mcbp/protocol/``) and the DCP
documents' example packets; docs/SOURCES.md lists the public source of each topic.  Nothing here decodes anything: ``dissect.py``, ``encode.py``,
``render.py`` and ``reference.py`` interpret these declarations.  Labels are
the docs' own (``start seqno``, ``vb UUID``, ``rollback #``...) so the
byte-table breakdowns read exactly like the protocol docs.
"""

from __future__ import annotations

import struct
from typing import Any

from .fields import ENUM, FLAGS, HEX, INT, UINT, Command, Field, Group, Variant
from .session import CONTROL_KEYS as _CONTROL_RULES

__all__ = [
    "ALT_HEADER",
    "ALT_MAGICS",
    "CACHE_RECORD_HEADER",
    "CLASSIC_HEADER",
    "COMMANDS",
    "CONTROL_KEYS",
    "DATATYPE",
    "DCP_OPEN_FLAGS",
    "ERROR",
    "FEATURES",
    "FLATBUFFER_TABLES",
    "HEADER",
    "HEADER_SIZE",
    "MAGICS",
    "OPCODES",
    "REQUEST_FRAME_INFOS",
    "RESPONSE_FRAME_INFOS",
    "RESPONSE_MAGICS",
    "STATUS",
    "STATUS_ONLY",
    "STREAM_END_STATUS",
    "STREAM_REQ_FLAGS",
    "command",
    "opcode_name",
]

# ---------------------------------------------------------------------------
# magic bytes (BinaryProtocol.md; include/mcbp/protocol/magic.h)

MAGICS: dict[int, str] = {
    0x80: "ClientRequest",
    0x81: "ClientResponse",
    0x08: "AltClientRequest",
    0x18: "AltClientResponse",
    0x82: "ServerRequest",
    0x83: "ServerResponse",
}
RESPONSE_MAGICS = frozenset((0x81, 0x18, 0x83))
ALT_MAGICS = frozenset((0x08, 0x18))  # byte 2 = framing extras length, byte 3 = key length
#: what the title line calls each magic ("DCP_OPEN command", "... response")
MAGIC_ROLE_WORD = {
    0x80: "command",
    0x08: "command",
    0x81: "response",
    0x18: "response",
    0x82: "server command",
    0x83: "server response",
}

# ---------------------------------------------------------------------------
# datatype bits (BinaryProtocol.md, Data Types)

DATATYPE: dict[int, str] = {0x01: "JSON", 0x02: "snappy", 0x04: "xattr"}
DATATYPE_MASK = 0x07

# ---------------------------------------------------------------------------
# status codes (include/mcbp/protocol/status.h; plus the classic memcached 0x06)

STATUS: dict[int, str] = {
    0x00: "Success",
    0x01: "KeyEnoent",
    0x02: "KeyEexists",
    0x03: "E2big",
    0x04: "Einval",
    0x05: "NotStored",
    0x06: "DeltaBadval",
    0x07: "NotMyVbucket",
    0x08: "NoBucket",
    0x0A: "DcpStreamNotFound",
    0x0B: "OpaqueNoMatch",
    0x1F: "AuthStale",
    0x20: "AuthError",
    0x21: "AuthContinue",
    0x22: "Erange",
    0x23: "Rollback",
    0x24: "Eaccess",
    0x80: "UnknownFrameInfo",
    0x81: "UnknownCommand",
    0x82: "Enomem",
    0x83: "NotSupported",
    0x84: "Einternal",
    0x85: "Ebusy",
    0x86: "Etmpfail",
    0x88: "UnknownCollection",
    0x8C: "UnknownScope",
    0x8D: "DcpStreamIdInvalid",
    0xA0: "DurabilityInvalidLevel",
    0xA1: "DurabilityImpossible",
    0xA2: "SyncWriteInProgress",
    0xA3: "SyncWriteAmbiguous",
    0xA4: "SyncWriteReCommitInProgress",
}

# ---------------------------------------------------------------------------
# HELLO features (include/mcbp/protocol/feature.h)

FEATURES: dict[int, str] = {
    0x01: "Datatype (retired)",
    0x02: "TLS",
    0x03: "TcpNoDelay",
    0x04: "MutationSeqno",
    0x05: "TcpDelay",
    0x06: "XATTR",
    0x07: "XERROR",
    0x08: "SelectBucket",
    0x09: "Collections prototype (retired)",
    0x0A: "Snappy",
    0x0B: "JSON",
    0x0C: "Duplex",
    0x0D: "ClustermapChangeNotification",
    0x0E: "UnorderedExecution",
    0x0F: "Tracing",
    0x10: "AltRequestSupport",
    0x11: "SyncReplication",
    0x12: "Collections",
    0x13: "SnappyEverywhere",
    0x14: "PreserveTtl",
    0x15: "VAttr",
    0x16: "PiTR (retired)",
    0x17: "SubdocCreateAsDeleted",
    0x18: "SubdocDocumentMacroSupport",
    0x19: "SubdocReplaceBodyWithXattr",
    0x1A: "ReportUnitUsage",
    0x1B: "NonBlockingThrottlingMode",
    0x1C: "SubdocReplicaRead",
    0x1D: "GetClusterConfigWithKnownVersion",
    0x1E: "DedupeNotMyVbucketClustermap",
    0x1F: "ClustermapChangeNotificationBrief",
    **{c: f"capability 0x{c:02x} (subdoc/range-scan/random-key/MutateWithMeta)" for c in range(0x20, 0x26)},
    0x26: "DcpSkipDeletesInInitialBackfill",
}

# ---------------------------------------------------------------------------
# flexible framing extras (BinaryProtocol.md): frame-info ids and their payloads

#: request frame infos: id -> (name, payload fields; () = empty, None = free text)
REQUEST_FRAME_INFOS: dict[int, tuple[str, tuple[Field, ...] | None]] = {
    0: ("Barrier", ()),
    1: (
        "DurabilityRequirement",
        (
            Field("level", "durability level", 1, ENUM, {1: "Majority", 2: "MajorityAndPersistOnMaster", 3: "PersistToMajority"}),
            Field("timeout", "durability timeout", 2, doc="milliseconds; 0 and 0xffff are rejected"),
        ),
    ),
    2: ("DcpStreamId", (Field("stream_id", "stream id", 2),)),
    3: ("OpenTracing (unused)", None),
    4: ("Impersonate", None),
    5: ("PreserveTtl", ()),
    6: ("ImpersonateExtraPrivilege", None),
    7: ("ImpersonateWithTokenAuthDataId", (Field("token_id", "token id", 2),)),
}
RESPONSE_FRAME_INFOS: dict[int, tuple[str, tuple[Field, ...] | None]] = {
    0: ("ServerRecvSendDuration", (Field("duration", "server duration", 2, doc="encoded: micros = v**1.74 / 2"),)),
    1: ("ReadUnits", (Field("read_units", "read units", 2),)),
    2: ("WriteUnits", (Field("write_units", "write units", 2),)),
    3: ("ThrottleDuration", (Field("throttle", "throttle duration", 2, doc="encoded: micros = v**1.74 / 2"),)),
}
FRAME_INFO_STREAM_ID = 2

# ---------------------------------------------------------------------------
# header layouts (BinaryProtocol.md) (labels exactly as the docs draw them)

HEADER_SIZE = 24
HEADER = struct.Struct(">BBHBBHIIQ")  # magic opcode keylen extlen datatype vb/status body opaque cas


def _header(alt: bool, response: bool) -> tuple[Field, ...]:
    six = Field("status", "Status", 2, ENUM, STATUS, quiet=frozenset({0}), strict=False) if response else Field("vbucket", "Vbucket", 2)
    keylen: tuple[Field, ...] = (
        (Field("framing_extras_length", "Framing extras", 1), Field("key_length", "Key length", 1))
        if alt
        else (Field("key_length", "Key length", 2),)
    )
    return (
        Field("magic", "Magic", 1),
        Field("opcode", "Opcode", 1),
        *keylen,
        Field("extras_length", "Extra length", 1),
        Field("datatype", "Data type", 1, FLAGS, DATATYPE),
        six,
        Field("body_length", "Total body", 4),
        Field("opaque", "Opaque", 4),
        Field("cas", "CAS", 8),
    )


#: (alt layout?, response?) -> header fields
HEADER_LAYOUTS: dict[tuple[bool, bool], tuple[Field, ...]] = {
    (alt, resp): _header(alt, resp) for alt in (False, True) for resp in (False, True)
}
CLASSIC_HEADER = HEADER_LAYOUTS[(False, False)]
ALT_HEADER = HEADER_LAYOUTS[(True, False)]

# ---------------------------------------------------------------------------
# DCP enums and flag sets (docs/dcp/documentation/commands/)

DCP_OPEN_FLAGS: dict[int, str] = {
    0x001: "producer",
    0x002: "invalid (old notifier)",
    0x004: "include xattrs",
    0x008: "no value",
    0x010: "unused",
    0x020: "include delete times",
    0x040: "no value with underlying datatype",
    0x080: "removed (PiTR)",
    0x100: "include deleted user xattrs",
    0x200: "skip deletes in initial backfill",
}

STREAM_REQ_FLAGS: dict[int, str] = {
    0x001: "takeover",
    0x002: "disk only",
    0x004: "to latest",
    0x008: "no value (obsolete)",
    0x010: "active vb only",
    0x020: "strict vb uuid",
    0x040: "from latest",
    0x080: "ignore purged tombstones",
    0x100: "cache transfer",
}
SNAPSHOT_FLAGS = {
    0x01: "memory",
    0x02: "disk",
    0x04: "checkpoint",
    0x08: "ack",
    0x10: "history",
    0x20: "may contain duplicates",
}
STREAM_END_STATUS = {
    0: "OK",
    1: "Closed",
    2: "StateChanged",
    3: "Disconnected",
    4: "Slow",
    5: "BackfillFail",
    6: "Rollback",
    7: "FilterEmpty",
    8: "LostPrivileges",
}
VBUCKET_STATES = {1: "active", 2: "replica", 3: "pending", 4: "dead"}
ALL_VB_STATES = {0: "alive", 1: "active", 2: "replica", 3: "pending", 4: "dead"}
SYSTEM_EVENTS = {
    0: "BeginCollection",
    1: "EndCollection",
    2: "reserved",
    3: "CreateScope",
    4: "DropScope",
    5: "ModifyCollection",
}
DURABILITY_LEVELS = {1: "Majority", 2: "MajorityAndPersistOnMaster", 3: "PersistToMajority"}
OSO_FLAGS = {0x01: "start", 0x02: "end"}
MARKER_VERSIONS = {0: "v2.0", 1: "v2.1 (never used)", 2: "v2.2"}
MARKER_VERSION_EXTRAS = (
    Field("version", "version", 1, ENUM, MARKER_VERSIONS, invalid={1: "snapshot marker v2.1 is never used (rejected)"}),
)

#: DCP_CONTROL keys -> accepted values / the server's rule (the rules themselves: :mod:`.session`)
CONTROL_KEYS: dict[str, str] = {key: rule.doc for key, rule in _CONTROL_RULES.items()}

#: stream-request JSON value keys (docs/dcp/documentation/commands/stream-request-value.md)
STREAM_REQ_JSON_KEYS = {
    "uid": "manifest uid, hex string",
    "sid": "stream id, integer 1..65535",
    "collections": "array of collection ids, hex strings",
    "scope": "scope id, hex string",
    "purge_seqno": "client's purge seqno, decimal string",
    "cts": "cache transfer settings {free_memory, all_keys}",
}

# ---------------------------------------------------------------------------
# reusable field runs

SEQNO = 8


def _u(name: str, label: str, size: int, **kw: object) -> Field:
    return Field(name, label, size, UINT, **kw)  # type: ignore[arg-type]


FAILOVER_LOG = Group(
    "failover_log",
    "failover log entry",
    (_u("vb_uuid", "vb UUID", 8), _u("vb_seqno", "vb seqno", 8)),
    doc="newest entry first (failover-log.md)",
)
STREAM_REQ_EXTRAS = (
    Field("flags", "flags", 4, FLAGS, STREAM_REQ_FLAGS, invalid={0x008: "NoValue stream flag is obsolete (EINVAL); use the DCP_OPEN flag"}),
    _u("reserved", "reserved", 4),
    _u("start_seqno", "start seqno", 8),
    _u("end_seqno", "end seqno", 8),
    _u("vb_uuid", "vb UUID", 8),
    _u("snap_start_seqno", "snapshot start seqno", 8),
    _u("snap_end_seqno", "snapshot end seqno", 8),
)
MUTATION_EXTRAS = (
    _u("by_seqno", "by seqno", 8),
    _u("rev_seqno", "rev seqno", 8),
    Field("flags", "flags", 4, HEX, doc="item flags, copied verbatim"),
    _u("expiration", "expiration", 4),
    _u("lock_time", "lock time", 4),
    _u("nmeta", "nmeta", 2, invalid=None),
    _u("nru", "nru", 1),
)
SNAPSHOT_V1_EXTRAS = (
    _u("start_seqno", "start seqno", 8),
    _u("end_seqno", "end seqno", 8),
    Field("flags", "flags", 4, FLAGS, SNAPSHOT_FLAGS),
)
SNAPSHOT_V20_VALUE = (
    *SNAPSHOT_V1_EXTRAS,
    _u("max_visible_seqno", "max visible seqno", 8),
    _u("high_completed_seqno", "high completed seqno", 8),
)
SNAPSHOT_V22_VALUE = (
    *SNAPSHOT_V20_VALUE,
    _u("purge_seqno", "purge seqno", 8),
    _u("high_prepared_seqno", "high prepared seqno", 8),
)
COLLECTION_EVENT_V0 = (_u("manifest_uid", "manifest uid", 8), _u("scope_id", "scope id", 4), _u("collection_id", "collection id", 4))
SCOPE_EVENT_V0 = (_u("manifest_uid", "manifest uid", 8), _u("scope_id", "scope id", 4))
SYSTEM_EVENT_EXTRAS = (
    _u("by_seqno", "by seqno", 8),
    Field("event", "event", 4, ENUM, SYSTEM_EVENTS, invalid={2: "event id 2 is reserved"}),
    Field("version", "version", 1, ENUM, {0: "v0", 1: "v1", 2: "v2 (FlatBuffers)"}),
)
MUTATION_SEQNO_EXTRAS = (_u("vb_uuid", "vb UUID", 8), _u("seqno", "seqno", 8))
STORE_EXTRAS = (Field("flags", "flags", 4, HEX), _u("expiration", "expiration", 4))
GET_RESPONSE_EXTRAS = (Field("flags", "flags", 4, HEX),)

# common variants
EMPTY = Variant(doc="no extras, key or value")
STATUS_ONLY = Variant(doc="status only")
#: any non-success response without a variant of its own: an error body
ERROR = Variant("error", any_extras=True, key="any", value="error", doc="error response: optional JSON or text context")
NO_BODY_CAS0 = Variant(cas="zero")


def _store(name: str, opcode: int, quiet: bool = False) -> Command:
    return Command(
        opcode,
        name,
        (Variant(extras=STORE_EXTRAS, key="doc", value="doc?"),),
        (Variant("", (("extlen", 0),)), Variant("mutation seqno", (("extlen", 16),), extras=MUTATION_SEQNO_EXTRAS)),
        doc="quiet: no success response" if quiet else "",
    )


def _get(name: str, opcode: int, with_key: bool) -> Command:
    return Command(
        opcode,
        name,
        (Variant(key="doc"),),
        (Variant(extras=GET_RESPONSE_EXTRAS, key="doc" if with_key else "none", value="doc?"),),
    )


def _gat(name: str, opcode: int) -> Command:
    return Command(
        opcode,
        name,
        (Variant(extras=(_u("expiration", "expiration", 4),), key="doc"),),
        (Variant(extras=GET_RESPONSE_EXTRAS, value="doc?"),),
    )


def _arith(name: str, opcode: int) -> Command:
    return Command(
        opcode,
        name,
        (Variant(extras=(_u("delta", "delta", 8), _u("initial", "initial", 8), _u("expiration", "expiration", 4)), key="doc"),),
        (
            Variant("", (("extlen", 0),), value=(_u("counter", "counter", 8),)),
            Variant("mutation seqno", (("extlen", 16),), extras=MUTATION_SEQNO_EXTRAS, value=(_u("counter", "counter", 8),)),
        ),
    )


def _concat(name: str, opcode: int) -> Command:
    return Command(
        opcode,
        name,
        (Variant(key="doc", value="doc"),),
        (Variant("", (("extlen", 0),)), Variant("mutation seqno", (("extlen", 16),), extras=MUTATION_SEQNO_EXTRAS)),
    )


def _delete(name: str, opcode: int) -> Command:
    return Command(
        opcode,
        name,
        (Variant(key="doc"),),
        (Variant("", (("extlen", 0),)), Variant("mutation seqno", (("extlen", 16),), extras=MUTATION_SEQNO_EXTRAS)),
    )


def _flush(name: str, opcode: int) -> Command:
    return Command(
        opcode,
        name,
        (Variant("", (("extlen", 0),)), Variant("delayed", (("extlen", 4),), extras=(_u("expiration", "expiration", 4),))),
    )


def _system_event(doc: str, event: int, version: int, key_label: str | None, value: Any) -> Variant:
    """One DCP_SYSTEM_EVENT variant: chosen by the event id and version in its 13 bytes of extras; a name key or none."""
    when = (("extlen", 13), ("event", event), ("version", version))
    if key_label is None:
        return Variant(doc, when, extras=SYSTEM_EVENT_EXTRAS, value=value)
    return Variant(doc, when, extras=SYSTEM_EVENT_EXTRAS, key="text", key_label=key_label, value=value)


_DOC_DELETION_DATATYPES = frozenset({0x00, 0x02, 0x04, 0x05, 0x06, 0x07})  # valid for a received DCP deletion (Data Types)

_COMMANDS: tuple[Command, ...] = (
    # --- classic memcached key-value opcodes real captures carry ---------------
    _get("GET", 0x00, with_key=False),
    _store("SET", 0x01),
    _store("ADD", 0x02),
    _store("REPLACE", 0x03),
    _delete("DELETE", 0x04),
    _arith("INCREMENT", 0x05),
    _arith("DECREMENT", 0x06),
    Command(0x07, "QUIT", (EMPTY,), (STATUS_ONLY,)),
    _flush("FLUSH", 0x08),
    _get("GETQ", 0x09, with_key=False),
    Command(0x0A, "NOOP", (EMPTY,), (STATUS_ONLY,), doc="key-value noop; not the DCP noop"),
    Command(0x0B, "VERSION", (EMPTY,), (Variant(value="text"),)),
    _get("GETK", 0x0C, with_key=True),
    _get("GETKQ", 0x0D, with_key=True),
    _concat("APPEND", 0x0E),
    _concat("PREPEND", 0x0F),
    Command(
        0x10,
        "STAT",
        (Variant(key="text?", key_label="Key", value="json?"),),
        (Variant(key="text?", value="text?"),),
        doc="one response per stat, terminated by an empty response",
    ),
    _store("SETQ", 0x11, quiet=True),
    _store("ADDQ", 0x12, quiet=True),
    _store("REPLACEQ", 0x13, quiet=True),
    _delete("DELETEQ", 0x14),
    _arith("INCREMENTQ", 0x15),
    _arith("DECREMENTQ", 0x16),
    Command(0x17, "QUITQ", (EMPTY,), (STATUS_ONLY,)),
    _flush("FLUSHQ", 0x18),
    _concat("APPENDQ", 0x19),
    _concat("PREPENDQ", 0x1A),
    Command(0x1B, "VERBOSITY", (Variant(extras=(_u("verbosity", "verbosity", 4),)),), (STATUS_ONLY,)),
    Command(0x1C, "TOUCH", (Variant(extras=(_u("expiration", "expiration", 4),), key="doc"),), (STATUS_ONLY,)),
    _gat("GAT", 0x1D),
    _gat("GATQ", 0x1E),
    # --- session bootstrap (BinaryProtocol.md) -------------------------------------------------
    Command(
        0x1F,
        "HELLO",
        (Variant(key="agent", value=(Group("features", "feature", (Field("feature", "feature", 2, ENUM, FEATURES, strict=False),)),)),),
        (Variant(value=(Group("features", "feature", (Field("feature", "feature", 2, ENUM, FEATURES, strict=False),)),)),),
        group="session",
    ),
    Command(0x20, "SASL_LIST_MECHS", (EMPTY,), (Variant(value="text"),), group="session"),
    Command(
        0x21,
        "SASL_AUTH",
        (Variant(key="text", key_label="Mechanism", value="sasl"),),
        (Variant(value="sasl"), Variant("continue", (("status", 0x21),), value="sasl")),
        group="session",
    ),
    Command(
        0x22,
        "SASL_STEP",
        (Variant(key="text", key_label="Mechanism", value="sasl"),),
        (Variant(value="sasl"), Variant("continue", (("status", 0x21),), value="sasl")),
        group="session",
    ),
    Command(
        0x3D,
        "SET_VBUCKET",
        (Variant(extras=(Field("state", "state", 1, ENUM, VBUCKET_STATES),), value="json?"),),
        (STATUS_ONLY,),
        group="session",
    ),
    Command(
        0x48,
        "GET_ALL_VB_SEQNOS",
        (
            Variant("all", (("extlen", 0),)),
            Variant("by state", (("extlen", 4),), extras=(Field("state", "vbucket state", 4, ENUM, ALL_VB_STATES),)),
            Variant(
                "by state and collection",
                (("extlen", 8),),
                extras=(Field("state", "vbucket state", 4, ENUM, ALL_VB_STATES), _u("collection_id", "collection id", 4)),
            ),
        ),
        (Variant(value=(Group("vb_seqnos", "vbucket seqno", (_u("vbucket", "vbucket", 2), _u("high_seqno", "high seqno", 8))),)),),
        group="session",
    ),
    Command(0x89, "SELECT_BUCKET", (Variant(key="text", key_label="Bucket"),), (STATUS_ONLY,), group="session"),
    Command(0x96, "GET_FAILOVER_LOG", (EMPTY,), (Variant(value=(FAILOVER_LOG,)),), group="session"),
    Command(
        0xB5,
        "GET_CLUSTER_CONFIG",
        (
            Variant("", (("extlen", 0),)),
            Variant("known version", (("extlen", 16),), extras=(Field("epoch", "epoch", 8, INT), Field("revision", "revision", 8, INT))),
        ),
        (Variant(value="json?"),),
        group="session",
    ),
    Command(0xBA, "COLLECTIONS_GET_MANIFEST", (EMPTY,), (Variant(value="json"),), group="session", doc="the bucket's collections manifest"),
    Command(
        0xBB,
        "COLLECTIONS_GET_ID",
        (Variant(key="text?", value="text?"),),
        (Variant(extras=(_u("manifest_uid", "manifest uid", 8), _u("collection_id", "collection id", 4))),),
        group="session",
    ),
    Command(
        0xBC,
        "COLLECTIONS_GET_SCOPE_ID",
        (Variant(key="text?", value="text?"),),
        (Variant(extras=(_u("manifest_uid", "manifest uid", 8), _u("scope_id", "scope id", 4))),),
        group="session",
    ),
    Command(0xFE, "GET_ERROR_MAP", (Variant(value=(_u("version", "version", 2),)),), (Variant(value="json"),), group="session"),
    # --- DCP 0x50-0x67 (docs/dcp/documentation/commands/) ------------------------------------------------------
    Command(
        0x50,
        "DCP_OPEN",
        (
            Variant(
                extras=(
                    _u("seqno", "seqno", 4, doc="reserved, ignored"),
                    Field(
                        "flags",
                        "flags",
                        4,
                        FLAGS,
                        {k: v for k, v in DCP_OPEN_FLAGS.items()},
                        clear={0x01: "consumer"},
                        invalid={
                            0x002: "flag 0x02 is invalid (old notifier)",
                            0x010: "flag 0x10 is unused",
                            0x080: "flag 0x80 was removed (PiTR)",
                        },
                    ),
                ),
                key="text",
                key_label="Key",
                value="json?",
                json_keys={"consumer_name": "consumer name (consumer connections only)"},
                checks=(
                    (
                        "exclusive",
                        "flags",
                        0x08,
                        0x40,
                        "open flags 0x08 (no value) and 0x40 (no value with underlying datatype) are mutually exclusive",
                    ),
                    ("requires", "flags", 0x100, 0x04, "open flag 0x100 (include deleted user xattrs) requires 0x04 (include xattrs)"),
                    ("requires", "flags", 0x200, 0x01, "open flag 0x200 (skip deletes in initial backfill) requires 0x01 (producer)"),
                ),
            ),
        ),
        (STATUS_ONLY,),
        group="dcp",
    ),
    Command(
        0x51,
        "DCP_ADD_STREAM",
        (Variant(extras=(STREAM_REQ_EXTRAS[0],)),),
        (Variant(extras=(_u("stream_opaque", "opaque", 4, doc="opaque of the stream the consumer created"),)),),
        group="dcp",
    ),
    Command(0x52, "DCP_CLOSE_STREAM", (EMPTY,), (STATUS_ONLY,), sid="stream", group="dcp"),
    Command(
        0x53,
        "DCP_STREAM_REQ",
        (
            Variant(
                extras=STREAM_REQ_EXTRAS,
                value="json?",
                json_keys=STREAM_REQ_JSON_KEYS,
                checks=(
                    (
                        "cache_transfer_only_with",
                        "flags",
                        0x100,
                        0x001 | 0x010 | 0x100,
                        "stream flag 0x100 (cache transfer) may only be combined with 0x01/0x10",
                    ),
                    ("order", "snap_start_seqno", "start_seqno", "snapshot start seqno > start seqno (the producer answers Erange)"),
                    ("order", "start_seqno", "snap_end_seqno", "start seqno > snapshot end seqno (the producer answers Erange)"),
                    ("order", "start_seqno", "end_seqno", "start seqno > end seqno (the producer answers Erange)"),
                ),
            ),
        ),
        (
            Variant("success", (("status", 0),), value=(FAILOVER_LOG,)),
            Variant("rollback", (("status", 0x23),), value=(_u("rollback_seqno", "rollback #", 8),)),
        ),
        group="dcp",
    ),
    Command(0x54, "DCP_GET_FAILOVER_LOG", (EMPTY,), (Variant(value=(FAILOVER_LOG,)),), group="dcp"),
    Command(
        0x55,
        "DCP_STREAM_END",
        (Variant(extras=(Field("status", "status", 4, ENUM, STREAM_END_STATUS),)),),
        sid="stream",
        group="dcp",
    ),
    Command(
        0x56,
        "DCP_SNAPSHOT_MARKER",
        (
            Variant("v1", (("extlen", 20),), extras=SNAPSHOT_V1_EXTRAS),
            Variant(
                "v2.0",
                (("extlen", 1), ("version", 0)),
                extras=MARKER_VERSION_EXTRAS,
                value=SNAPSHOT_V20_VALUE,
            ),
            Variant(
                "v2.2",
                (("extlen", 1), ("version", 2)),
                extras=MARKER_VERSION_EXTRAS,
                value=SNAPSHOT_V22_VALUE,
            ),
        ),
        (STATUS_ONLY,),
        sid="stream",
        group="dcp",
    ),
    Command(
        0x57,
        "DCP_MUTATION",
        (
            Variant(
                extras=MUTATION_EXTRAS,
                key="doc",
                value="doc?",
                checks=(("nonzero", "by_seqno", "by seqno 0 is rejected"), ("zero", "nmeta", "non-zero nmeta is rejected")),
            ),
        ),
        sid="stream",
        group="dcp",
    ),
    Command(
        0x58,
        "DCP_DELETION",
        (
            Variant(
                "v1",
                (("extlen", 18),),
                extras=(_u("by_seqno", "by seqno", 8), _u("rev_seqno", "rev seqno", 8), _u("nmeta", "nmeta", 2)),
                key="doc",
                value="doc?",
                datatypes=_DOC_DELETION_DATATYPES,
                checks=(
                    ("zero", "nmeta", "non-zero nmeta is rejected"),
                    ("context", "delete_times", False, "deletion v1 on a connection opened with include delete times (expects v2)"),
                ),
            ),
            Variant(
                "v2",
                (("extlen", 21),),
                extras=(
                    _u("by_seqno", "by seqno", 8),
                    _u("rev_seqno", "rev seqno", 8),
                    _u("delete_time", "delete time", 4),
                    _u("unused", "unused", 1),
                ),
                key="doc",
                value="doc?",
                datatypes=_DOC_DELETION_DATATYPES,
                checks=(("context", "delete_times", True, "deletion v2 on a connection opened without include delete times (expects v1)"),),
            ),
        ),
        sid="stream",
        group="dcp",
    ),
    Command(
        0x59,
        "DCP_EXPIRATION",
        (
            Variant(
                extras=(_u("by_seqno", "by seqno", 8), _u("rev_seqno", "rev seqno", 8), _u("delete_time", "delete time", 4)),
                key="doc",
                value="doc?",
            ),
        ),
        sid="stream",
        group="dcp",
    ),
    Command(
        0x5A,
        "DCP_FLUSH",
        (Variant(any_extras=True, key="any", value="any"),),
        obsolete="DCP_FLUSH is obsolete (unsupported since 3.0)",
        sid="stream",
        group="dcp",
    ),
    Command(
        0x5B,
        "DCP_SET_VBUCKET_STATE",
        (Variant(extras=(Field("state", "state", 1, ENUM, VBUCKET_STATES),)),),
        (STATUS_ONLY,),
        sid="stream",
        group="dcp",
    ),
    Command(0x5C, "DCP_NOOP", (EMPTY,), (STATUS_ONLY,), group="dcp"),
    Command(0x5D, "DCP_BUFFER_ACKNOWLEDGEMENT", (Variant(extras=(_u("buffer_bytes", "buffer bytes", 4),)),), group="dcp"),
    Command(0x5E, "DCP_CONTROL", (Variant(key="text", key_label="Key", value="text"),), (STATUS_ONLY,), group="dcp"),
    Command(
        0x5F,
        "DCP_SYSTEM_EVENT",
        (
            _system_event("begin collection v0", 0, 0, "Collection name", COLLECTION_EVENT_V0),
            _system_event("begin collection v1", 0, 1, "Collection name", (*COLLECTION_EVENT_V0, _u("max_ttl", "max ttl", 4))),
            _system_event("end collection v0", 1, 0, None, COLLECTION_EVENT_V0),
            _system_event("create scope v0", 3, 0, "Scope name", SCOPE_EVENT_V0),
            _system_event("drop scope v0", 4, 0, None, SCOPE_EVENT_V0),
            _system_event("begin collection v2", 0, 2, "Collection name", "flatbuffers:Collection"),
            _system_event("modify collection v2", 5, 2, "Collection name", "flatbuffers:Collection"),
            _system_event("end collection v2", 1, 2, None, "flatbuffers:DroppedCollection"),
            _system_event("create scope v2", 3, 2, "Scope name", "flatbuffers:Scope"),
            _system_event("drop scope v2", 4, 2, None, "flatbuffers:DroppedScope"),
        ),
        sid="stream",
        group="dcp",
    ),
    Command(
        0x60,
        "DCP_PREPARE",
        (
            Variant(
                extras=(
                    _u("by_seqno", "by seqno", 8),
                    _u("rev_seqno", "rev seqno", 8),
                    Field("flags", "flags", 4, HEX),
                    _u("expiration", "expiration", 4),
                    _u("lock_time", "lock time", 4),
                    _u("nru", "nru", 1),
                    Field("deleted", "deleted", 1, ENUM, {0: "no", 1: "prepared delete"}),
                    Field("durability_level", "durability level", 1, ENUM, DURABILITY_LEVELS, invalid={0: "durability level 0 is invalid"}),
                ),
                key="doc",
                value="doc?",
                cas="nonzero",
                checks=(("nonzero", "by_seqno", "by seqno 0 is rejected"),),
            ),
        ),
        sid="never",
        group="dcp",
    ),
    Command(0x61, "DCP_SEQNO_ACKNOWLEDGED", (Variant(extras=(_u("prepared_seqno", "prepared seqno", 8),), cas="zero"),), group="dcp"),
    Command(
        0x62,
        "DCP_COMMIT",
        (Variant(extras=(_u("prepared_seqno", "prepared seqno", 8), _u("commit_seqno", "commit seqno", 8)), key="doc", cas="zero"),),
        sid="never",
        group="dcp",
    ),
    Command(
        0x63,
        "DCP_ABORT",
        (Variant(extras=(_u("prepared_seqno", "prepared seqno", 8), _u("abort_seqno", "abort seqno", 8)), key="doc", cas="zero"),),
        sid="never",
        group="dcp",
    ),
    Command(0x64, "DCP_SEQNO_ADVANCED", (Variant(extras=(_u("seqno", "seqno", 8),)),), sid="stream", group="dcp"),
    Command(0x65, "DCP_OSO_SNAPSHOT", (Variant(extras=(Field("flags", "flags", 4, FLAGS, OSO_FLAGS),)),), sid="stream", group="dcp"),
    Command(0x66, "DCP_CACHE_TRANSFER", (Variant(value="cache_records", cas="zero"),), sid="stream", group="dcp"),
    Command(0x67, "DCP_CACHE_TRANSFER_END", (NO_BODY_CAS0,), sid="stream", group="dcp"),
)

#: opcode -> Command
COMMANDS: dict[int, Command] = {c.opcode: c for c in _COMMANDS}
#: name -> opcode
OPCODES: dict[str, int] = {c.name: c.opcode for c in _COMMANDS}

#: cache-transfer record header (commands/cache-transfer.md) (40 bytes) followed by key and value
CACHE_RECORD_HEADER = (
    _u("cas", "cas", 8),
    _u("by_seqno", "by seqno", 8),
    _u("rev_seqno", "rev seqno", 8),
    _u("value_len", "value length", 4),
    Field("flags", "flags", 4, HEX),
    _u("expiration", "expiration", 4),
    _u("key_len", "key length", 2),
    Field("datatype", "datatype", 1, FLAGS, DATATYPE),
    _u("cache_hint", "cache hint", 1),
)

#: system-event v2 FlatBuffers tables (commands/system_event.md): name -> [(field name, type)] in schema order
FLATBUFFER_TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "Collection": (
        ("uid", "u64"),
        ("scopeId", "u32"),
        ("collectionId", "u32"),
        ("ttlValid", "bool"),
        ("maxTtl", "u32"),
        ("name", "string"),
        ("history", "bool"),
        ("defaultCollectionMVS", "u64"),
        ("metered", "bool"),
        ("flushUid", "u64"),
    ),
    "DroppedCollection": (("uid", "u64"), ("scopeId", "u32"), ("collectionId", "u32"), ("systemCollection", "bool")),
    "Scope": (("uid", "u64"), ("scopeId", "u32"), ("name", "string")),
    "DroppedScope": (("uid", "u64"), ("scopeId", "u32"), ("systemScope", "bool")),
}


def command(opcode: int) -> Command | None:
    """The table entry for ``opcode`` (``None`` for an unknown opcode)."""
    return COMMANDS.get(opcode)


def opcode_name(opcode: int) -> str:
    """``DCP_STREAM_REQ`` for 0x53; ``unknown 0xNN`` for opcodes not in the table."""
    cmd = COMMANDS.get(opcode)
    return cmd.name if cmd is not None else f"unknown 0x{opcode:02x}"
