"""The protocol table of the old UPR draft (couchbaselabs/ep-engine-designs upr-protocol.md; REFERENCE.md, "UPR draft").

UPR was DCP's pre-release name.  Its first draft had a 12-byte header of its
own (opcode, 3 reserved bytes, request id, length) and a body that starts
with a one-byte type.  It never shipped, but it is how DCP was first
described, so ``dialect="upr"`` decodes and draws it like the draft did.
"""

from __future__ import annotations

import struct

from .fields import BYTES, ENUM, HEX, TEXT, UINT, Field, Group, Variant

__all__ = ["UPR_BODIES", "UPR_HEADER", "UPR_HEADER_SIZE", "UPR_HEADER_STRUCT", "UPR_OPCODES"]

UPR_OPCODES = {
    1: "Request",
    2: "Response",
    3: "Stream Begin",
    4: "Stream Message",
    5: "Stream Close",
    6: "Request Error Only",
    7: "Response Decode Error",
}
UPR_REQUEST_TYPES = {1: "STREAM_REQUEST", 2: "FAILOVER_LOG_REQUEST"}
UPR_RESPONSE_TYPES = {1: "OK", 2: "Not My VBucket", 3: "Rollback"}
UPR_STREAM_TYPES = {1: "SNAPSHOT_START", 2: "SNAPSHOT_END", 3: "MUTATION", 4: "DELETION", 5: "EXPIRATION", 6: "FLUSH"}

UPR_HEADER_SIZE = 12
UPR_HEADER_STRUCT = struct.Struct(">B3sII")
UPR_HEADER = (
    Field("opcode", "Opcode", 1, ENUM, UPR_OPCODES),
    Field("reserved", "Reserved", 3, BYTES),
    Field("request_id", "Request ID", 4),
    Field("length", "Length", 4),
)

_REQ_TYPE = Field("type", "Request Type", 1, ENUM, UPR_REQUEST_TYPES)
_RESP_TYPE = Field("type", "Type", 1, ENUM, UPR_RESPONSE_TYPES)
_MSG_TYPE = Field("type", "Type", 1, ENUM, UPR_STREAM_TYPES)
_ITEM_META = (
    _MSG_TYPE,
    Field("cas", "Cas", 8),
    Field("by_seqno", "By Seqno", 8),
    Field("rev_seqno", "Rev Seqno", 8),
    Field("flags", "Item Flags", 4, HEX),
    Field("expiry", "Item Exp", 4),
)

#: header opcode -> body variants (``when`` tests the body's type byte)
UPR_BODIES: dict[int, tuple[Variant, ...]] = {
    1: (
        Variant(
            "stream request",
            (("type", 1),),
            value=(
                _REQ_TYPE,
                Field("reserved", "Reserved", 1),
                Field("vbucket", "VBucket", 2),
                Field("start_seqno", "Start By Seqno", 8),
                Field("end_seqno", "End By Seqno", 8),
                Field("vb_uuid", "VBucket UUID", 8),
                Field("high_seqno", "High Seqno", 8),
                Field("group_id", "Group ID", None, TEXT),
            ),
        ),
        Variant("failover log request", (("type", 2),), value=(_REQ_TYPE,)),
    ),
    2: (
        Variant(
            "ok",
            (("type", 1),),
            value=(
                _RESP_TYPE,
                Group(
                    "failover_log",
                    "failover log entry",
                    (Field("vb_uuid", "VBucket UUID", 8, UINT), Field("high_seqno", "High Seqno", 8, UINT)),
                ),
            ),
            doc="a failover-log response is an OK carrying <VBucket UUID, High Seqno> pairs",
        ),
        Variant("not my vbucket", (("type", 2),), value=(_RESP_TYPE,)),
        Variant("rollback", (("type", 3),), value=(_RESP_TYPE, Field("rollback_seqno", "Rollback Seqno", 8))),
    ),
    3: (Variant("stream begin", value=()),),
    4: (
        Variant("snapshot start", (("type", 1),), value=(_MSG_TYPE,)),
        Variant("snapshot end", (("type", 2),), value=(_MSG_TYPE,)),
        Variant(
            "mutation",
            (("type", 3),),
            value=(*_ITEM_META, Field("lock_time", "Lock time", 4), Field("key_value", "Key+Value", None, BYTES)),
            doc="the draft has no key length field: where the key ends and the value starts is unspecified",
        ),
        Variant("deletion", (("type", 4),), value=(*_ITEM_META, Field("key", "Key", None, TEXT))),
        Variant("expiration", (("type", 5),), value=(*_ITEM_META, Field("key", "Key", None, TEXT))),
        Variant("flush", (("type", 6),), value=(_MSG_TYPE,)),
    ),
    5: (Variant("stream close", value="any"),),
    6: (Variant("request error only", value="any"),),
    7: (Variant("response decode error", value="any"),),
}
