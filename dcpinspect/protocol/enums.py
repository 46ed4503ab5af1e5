"""The protocol's numbers as enums, GENERATED from the table (:mod:`dcpinspect.protocol.spec`): do not edit.

Regenerate with ``python -m dcpinspect.protocol.reference --enums > dcpinspect/protocol/enums.py``;
``tests/protocol/test_enums.py`` fails when this file and the table disagree.
"""

from enum import IntEnum, IntFlag

__all__ = [
    "Datatype",
    "DurabilityLevel",
    "Feature",
    "Magic",
    "MarkerVersion",
    "Opcode",
    "OpenFlag",
    "OsoFlag",
    "SnapshotFlag",
    "Status",
    "StreamEndStatus",
    "StreamReqFlag",
    "SystemEvent",
    "UprOpcode",
    "VBucketState",
]


class Magic(IntEnum):
    """The first header byte (``spec.MAGICS``)."""

    ALT_CLIENT_REQUEST = 0x08
    ALT_CLIENT_RESPONSE = 0x18
    CLIENT_REQUEST = 0x80
    CLIENT_RESPONSE = 0x81
    SERVER_REQUEST = 0x82
    SERVER_RESPONSE = 0x83


class Opcode(IntEnum):
    """Memcached binary protocol and DCP opcodes (``OPCODE_NAMES``)."""

    GET = 0x00
    SET = 0x01
    ADD = 0x02
    REPLACE = 0x03
    DELETE = 0x04
    INCREMENT = 0x05
    DECREMENT = 0x06
    QUIT = 0x07
    FLUSH = 0x08
    GETQ = 0x09
    NOOP = 0x0A
    VERSION = 0x0B
    GETK = 0x0C
    GETKQ = 0x0D
    APPEND = 0x0E
    PREPEND = 0x0F
    STAT = 0x10
    SETQ = 0x11
    ADDQ = 0x12
    REPLACEQ = 0x13
    DELETEQ = 0x14
    INCREMENTQ = 0x15
    DECREMENTQ = 0x16
    QUITQ = 0x17
    FLUSHQ = 0x18
    APPENDQ = 0x19
    PREPENDQ = 0x1A
    VERBOSITY = 0x1B
    TOUCH = 0x1C
    GAT = 0x1D
    GATQ = 0x1E
    HELLO = 0x1F
    SASL_LIST_MECHS = 0x20
    SASL_AUTH = 0x21
    SASL_STEP = 0x22
    SET_VBUCKET = 0x3D
    GET_ALL_VB_SEQNOS = 0x48
    DCP_OPEN = 0x50
    DCP_ADD_STREAM = 0x51
    DCP_CLOSE_STREAM = 0x52
    DCP_STREAM_REQ = 0x53
    DCP_GET_FAILOVER_LOG = 0x54
    DCP_STREAM_END = 0x55
    DCP_SNAPSHOT_MARKER = 0x56
    DCP_MUTATION = 0x57
    DCP_DELETION = 0x58
    DCP_EXPIRATION = 0x59
    DCP_FLUSH = 0x5A
    DCP_SET_VBUCKET_STATE = 0x5B
    DCP_NOOP = 0x5C
    DCP_BUFFER_ACKNOWLEDGEMENT = 0x5D
    DCP_CONTROL = 0x5E
    DCP_SYSTEM_EVENT = 0x5F
    DCP_PREPARE = 0x60
    DCP_SEQNO_ACKNOWLEDGED = 0x61
    DCP_COMMIT = 0x62
    DCP_ABORT = 0x63
    DCP_SEQNO_ADVANCED = 0x64
    DCP_OSO_SNAPSHOT = 0x65
    DCP_CACHE_TRANSFER = 0x66
    DCP_CACHE_TRANSFER_END = 0x67
    SELECT_BUCKET = 0x89
    GET_FAILOVER_LOG = 0x96
    GET_CLUSTER_CONFIG = 0xB5
    COLLECTIONS_GET_MANIFEST = 0xBA
    COLLECTIONS_GET_ID = 0xBB
    COLLECTIONS_GET_SCOPE_ID = 0xBC
    GET_ERROR_MAP = 0xFE


class Status(IntEnum):
    """Response status codes (``spec.STATUS``)."""

    SUCCESS = 0x00
    KEY_ENOENT = 0x01
    KEY_EEXISTS = 0x02
    E2BIG = 0x03
    EINVAL = 0x04
    NOT_STORED = 0x05
    DELTA_BADVAL = 0x06
    NOT_MY_VBUCKET = 0x07
    NO_BUCKET = 0x08
    DCP_STREAM_NOT_FOUND = 0x0A
    OPAQUE_NO_MATCH = 0x0B
    AUTH_STALE = 0x1F
    AUTH_ERROR = 0x20
    AUTH_CONTINUE = 0x21
    ERANGE = 0x22
    ROLLBACK = 0x23
    EACCESS = 0x24
    UNKNOWN_FRAME_INFO = 0x80
    UNKNOWN_COMMAND = 0x81
    ENOMEM = 0x82
    NOT_SUPPORTED = 0x83
    EINTERNAL = 0x84
    EBUSY = 0x85
    ETMPFAIL = 0x86
    UNKNOWN_COLLECTION = 0x88
    UNKNOWN_SCOPE = 0x8C
    DCP_STREAM_ID_INVALID = 0x8D
    DURABILITY_INVALID_LEVEL = 0xA0
    DURABILITY_IMPOSSIBLE = 0xA1
    SYNC_WRITE_IN_PROGRESS = 0xA2
    SYNC_WRITE_AMBIGUOUS = 0xA3
    SYNC_WRITE_RE_COMMIT_IN_PROGRESS = 0xA4


class Feature(IntEnum):
    """HELLO features (``spec.FEATURES``)."""

    DATATYPE = 0x01  # Datatype (retired)
    TLS = 0x02
    TCP_NO_DELAY = 0x03
    MUTATION_SEQNO = 0x04
    TCP_DELAY = 0x05
    XATTR = 0x06
    XERROR = 0x07
    SELECT_BUCKET = 0x08
    COLLECTIONS_PROTOTYPE = 0x09  # Collections prototype (retired)
    SNAPPY = 0x0A
    JSON = 0x0B
    DUPLEX = 0x0C
    CLUSTERMAP_CHANGE_NOTIFICATION = 0x0D
    UNORDERED_EXECUTION = 0x0E
    TRACING = 0x0F
    ALT_REQUEST_SUPPORT = 0x10
    SYNC_REPLICATION = 0x11
    COLLECTIONS = 0x12
    SNAPPY_EVERYWHERE = 0x13
    PRESERVE_TTL = 0x14
    V_ATTR = 0x15
    PI_TR = 0x16  # PiTR (retired)
    SUBDOC_CREATE_AS_DELETED = 0x17
    SUBDOC_DOCUMENT_MACRO_SUPPORT = 0x18
    SUBDOC_REPLACE_BODY_WITH_XATTR = 0x19
    REPORT_UNIT_USAGE = 0x1A
    NON_BLOCKING_THROTTLING_MODE = 0x1B
    SUBDOC_REPLICA_READ = 0x1C
    GET_CLUSTER_CONFIG_WITH_KNOWN_VERSION = 0x1D
    DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP = 0x1E
    CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF = 0x1F
    CAPABILITY_0X20 = 0x20  # capability 0x20 (subdoc/range-scan/random-key/MutateWithMeta)
    CAPABILITY_0X21 = 0x21  # capability 0x21 (subdoc/range-scan/random-key/MutateWithMeta)
    CAPABILITY_0X22 = 0x22  # capability 0x22 (subdoc/range-scan/random-key/MutateWithMeta)
    CAPABILITY_0X23 = 0x23  # capability 0x23 (subdoc/range-scan/random-key/MutateWithMeta)
    CAPABILITY_0X24 = 0x24  # capability 0x24 (subdoc/range-scan/random-key/MutateWithMeta)
    CAPABILITY_0X25 = 0x25  # capability 0x25 (subdoc/range-scan/random-key/MutateWithMeta)
    DCP_SKIP_DELETES_IN_INITIAL_BACKFILL = 0x26


class Datatype(IntFlag):
    """Datatype bits (``spec.DATATYPE``)."""

    JSON = 0x01
    SNAPPY = 0x02
    XATTR = 0x04


class OpenFlag(IntFlag):
    """DCP_OPEN flags (``spec.DCP_OPEN_FLAGS``)."""

    PRODUCER = 0x01
    INVALID = 0x02  # invalid (old notifier)
    INCLUDE_XATTRS = 0x04
    NO_VALUE = 0x08
    UNUSED = 0x10
    INCLUDE_DELETE_TIMES = 0x20
    NO_VALUE_WITH_UNDERLYING_DATATYPE = 0x40
    REMOVED = 0x80  # removed (PiTR)
    INCLUDE_DELETED_USER_XATTRS = 0x100
    SKIP_DELETES_IN_INITIAL_BACKFILL = 0x200


class StreamReqFlag(IntFlag):
    """DCP_STREAM_REQ flags (``spec.STREAM_REQ_FLAGS``)."""

    TAKEOVER = 0x01
    DISK_ONLY = 0x02
    TO_LATEST = 0x04
    NO_VALUE = 0x08  # no value (obsolete)
    ACTIVE_VB_ONLY = 0x10
    STRICT_VB_UUID = 0x20
    FROM_LATEST = 0x40
    IGNORE_PURGED_TOMBSTONES = 0x80
    CACHE_TRANSFER = 0x100


class SnapshotFlag(IntFlag):
    """DCP_SNAPSHOT_MARKER flags (``spec.SNAPSHOT_FLAGS``)."""

    MEMORY = 0x01
    DISK = 0x02
    CHECKPOINT = 0x04
    ACK = 0x08
    HISTORY = 0x10
    MAY_CONTAIN_DUPLICATES = 0x20


class StreamEndStatus(IntEnum):
    """DCP_STREAM_END status (``spec.STREAM_END_STATUS``)."""

    OK = 0
    CLOSED = 1
    STATE_CHANGED = 2
    DISCONNECTED = 3
    SLOW = 4
    BACKFILL_FAIL = 5
    ROLLBACK = 6
    FILTER_EMPTY = 7
    LOST_PRIVILEGES = 8


class VBucketState(IntEnum):
    """Vbucket states (``spec.VBUCKET_STATES``)."""

    ACTIVE = 1
    REPLICA = 2
    PENDING = 3
    DEAD = 4


class SystemEvent(IntEnum):
    """DCP_SYSTEM_EVENT event ids (``spec.SYSTEM_EVENTS``)."""

    BEGIN_COLLECTION = 0
    END_COLLECTION = 1
    RESERVED = 2
    CREATE_SCOPE = 3
    DROP_SCOPE = 4
    MODIFY_COLLECTION = 5


class DurabilityLevel(IntEnum):
    """Sync-write durability levels (``spec.DURABILITY_LEVELS``)."""

    MAJORITY = 1
    MAJORITY_AND_PERSIST_ON_MASTER = 2
    PERSIST_TO_MAJORITY = 3


class OsoFlag(IntFlag):
    """DCP_OSO_SNAPSHOT flags (``spec.OSO_FLAGS``)."""

    START = 0x01
    END = 0x02


class MarkerVersion(IntEnum):
    """Snapshot marker v2 versions (``spec.MARKER_VERSIONS``)."""

    V2_0 = 0
    V2_1 = 1  # v2.1 (never used)
    V2_2 = 2


class UprOpcode(IntEnum):
    """UPR draft opcodes (``UPR_OPCODES``)."""

    REQUEST = 1
    RESPONSE = 2
    STREAM_BEGIN = 3
    STREAM_MESSAGE = 4
    STREAM_CLOSE = 5
    REQUEST_ERROR_ONLY = 6
    RESPONSE_DECODE_ERROR = 7
