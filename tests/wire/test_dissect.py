"""Dissection cases: one table of (bytes, context) -> expected values and problems."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import cramjam
import pytest

from dcpinspect import DissectContext, Frame, annotate, annotate_html, decode, dissect, encode
from dcpinspect.protocol.flatbuf import build_table
from dcpinspect.protocol.spec import FLATBUFFER_TABLES
from dcpinspect.wire.framing import encode_leb128

COLL = DissectContext(collections=True)
SID = DissectContext(collections=True, stream_ids=True)


def xattrs(pairs: dict[str, str], body: bytes) -> bytes:
    blob = b"".join(struct.pack(">I", len(k) + len(v) + 2) + k.encode() + b"\0" + v.encode() + b"\0" for k, v in pairs.items())
    return struct.pack(">I", len(blob)) + blob + body


@dataclass
class Case:
    name: str
    data: bytes
    context: DissectContext | None = None
    title: str | None = None
    variant: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    key: bytes | None = None
    cid: int | None = None
    stream_id: int | None = None
    document: Any = None
    fields: dict[str, Any] = field(default_factory=dict)  # path -> value
    meanings: dict[str, str] = field(default_factory=dict)  # path -> meaning
    problems: tuple[str, ...] = ()  # substrings, each must match one problem; no other problems allowed


MUT = {"by_seqno": 5, "rev_seqno": 1, "flags": 0xCAFE, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 2}

CASES = [
    Case(
        "hello-json-agent",
        encode("HELLO", key='{"a":"dcpinspect/0.1","i":"0000000000000001/0000000000000002"}', value=struct.pack(">HHH", 0x12, 0x06, 0x0A)),
        title="HELLO command",
        body={"features": [{"feature": 0x12}, {"feature": 0x06}, {"feature": 0x0A}]},
        fields={"key.a": "dcpinspect/0.1", "value.features[0].feature": 0x12},
        meanings={"value.features[0].feature": "Collections", "value.features[2].feature": "Snappy"},
    ),
    Case(
        "hello-response",
        encode("HELLO", response=True, value=[{"feature": 0x12}]),
        title="HELLO response",
        body={"features": [{"feature": 0x12}]},
    ),
    Case(
        "sasl-plain-masked",
        encode("SASL_AUTH", key="PLAIN", value=b"\0alice\0s3cret"),
        fields={"value.user": "alice", "value.password": "********"},
        meanings={"value.password": "masked"},
    ),
    Case(
        "sasl-plain-revealed",
        encode("SASL_AUTH", key="PLAIN", value=b"\0alice\0s3cret"),
        context=DissectContext(reveal_secrets=True),
        fields={"value.password": "s3cret"},
    ),
    Case(
        "sasl-scram-proof-masked",
        encode("SASL_STEP", key="SCRAM-SHA512", value=b"c=biws,r=abcdef,p=dGhpcyBpcyBhIHByb29m"),
        fields={"value.r": "r=abcdef", "value.p": "p=********"},
    ),
    Case(
        "sasl-continue",
        encode("SASL_AUTH", response=True, status=0x21, value=b"r=abc,s=c2FsdA==,i=4096"),
        variant="continue",
        fields={"value.i": "i=4096"},
    ),
    Case(
        "sasl-auth-error",
        encode("SASL_AUTH", response=True, status=0x20, value=b"Auth failure"),
        variant="error",
        meanings={"header.status": "AuthError"},
    ),
    Case("select-bucket", encode("SELECT_BUCKET", key="default"), fields={"key": "default"}),
    Case("select-bucket-without-key", encode("SELECT_BUCKET"), problems=("must have a key",)),
    Case("get-error-map", encode("GET_ERROR_MAP", value={"version": 2}), body={"version": 2}),
    Case(
        "get-error-map-response",
        encode("GET_ERROR_MAP", response=True, value=b'{"version":2,"revision":1}'),
        document={"version": 2, "revision": 1},
    ),
    Case(
        "cluster-config-known-version",
        encode("GET_CLUSTER_CONFIG", extras={"epoch": -1, "revision": 7}),
        variant="known version",
        extras={"epoch": -1, "revision": 7},
    ),
    Case(
        "all-vb-seqnos-by-state", encode("GET_ALL_VB_SEQNOS", extras={"state": 1}), variant="by state", meanings={"extras.state": "active"}
    ),
    Case(
        "all-vb-seqnos-response",
        encode("GET_ALL_VB_SEQNOS", response=True, value=[{"vbucket": 0, "high_seqno": 10}, {"vbucket": 1, "high_seqno": 2**64 - 1}]),
        body={"vb_seqnos": [{"vbucket": 0, "high_seqno": 10}, {"vbucket": 1, "high_seqno": 2**64 - 1}]},
    ),
    Case(
        "get-failover-log-0x96",
        encode(0x96, response=True, value=[(7, 0)]),
        title="GET_FAILOVER_LOG response",
        body={"failover_log": [{"vb_uuid": 7, "vb_seqno": 0}]},
    ),
    Case("stat-response", encode("STAT", response=True, key="curr_items", value="42"), fields={"key": "curr_items", "value": "42"}),
    Case(
        "kv-set", encode("SET", key="k", value=b"v", extras={"flags": 1, "expiration": 60}), extras={"flags": 1, "expiration": 60}, key=b"k"
    ),
    Case(
        "kv-incr",
        encode("INCREMENT", key="cnt", extras={"delta": 2, "initial": 0, "expiration": 0}),
        extras={"delta": 2, "initial": 0, "expiration": 0},
    ),
    Case("kv-get-miss", encode("GET", response=True, status=1, value=b"Not found"), variant="error", fields={"value": "Not found"}),
    Case("kv-set-with-key-on-response", encode("SET", response=True, key="k"), problems=("must not have a key",)),
    Case("dcp-open-consumer", encode("DCP_OPEN", key="conn", extras={"flags": 0}), meanings={"extras.flags": "consumer"}),
    Case(
        "dcp-open-producer-xattr",
        encode("DCP_OPEN", key="conn", extras={"flags": 0x25}),
        meanings={"extras.flags": "producer, include xattrs, include delete times"},
    ),
    Case(
        "dcp-open-invalid-flags",
        encode("DCP_OPEN", key="conn", extras={"flags": 0x02 | 0x08 | 0x40 | 0x100}),
        problems=("0x02 is invalid", "mutually exclusive", "requires 0x04"),
    ),
    Case("dcp-open-unknown-flag", encode("DCP_OPEN", key="conn", extras={"flags": 0x1000}), problems=("unknown flags bits 0x00001000",)),
    Case("dcp-open-no-name", encode("DCP_OPEN", extras={"flags": 1}), problems=("must have a key",)),
    Case(
        "dcp-open-json-value",
        encode("DCP_OPEN", key="c", extras={"flags": 0}, value={"consumer_name": "replica"}, datatype=1),
        document={"consumer_name": "replica"},
        meanings={"value.consumer_name": "consumer name (consumer connections only)"},
    ),
    Case(
        "dcp-open-json-value-wrong",
        encode("DCP_OPEN", key="c", extras={"flags": 1}, value={"consumer_name": "x", "bogus": 1}, datatype=0),
        problems=("must have datatype JSON", "unknown DCP_OPEN value key 'bogus'", "only valid on consumer"),
    ),
    Case(
        "add-stream-response-opaque",
        encode("DCP_ADD_STREAM", response=True, extras={"stream_opaque": 0x1000}),
        extras={"stream_opaque": 0x1000},
    ),
    Case(
        "stream-req-json-value",
        encode("DCP_STREAM_REQ", extras={"end_seqno": 2**64 - 1}, value={"uid": "c2", "collections": ["a", "1e"], "sid": 7}, datatype=1),
        context=SID,
        document={"uid": "c2", "collections": ["a", "1e"], "sid": 7},
        fields={"value.sid": 7, "value.uid": "c2"},
        meanings={"value.sid": "stream id, integer 1..65535"},
    ),
    Case(
        "stream-req-json-rules",
        encode("DCP_STREAM_REQ", value={"collections": ["zz"], "scope": "9", "sid": 0, "purge_seqno": 5}),
        context=DissectContext(collections=True, stream_ids=False),
        problems=(
            "sid 0 out of range",
            "sid given but enable_stream_id",
            "array of hex strings",
            "together are invalid",
            "purge_seqno must be a decimal string",
        ),
    ),
    Case(
        "stream-req-value-without-collections",
        encode("DCP_STREAM_REQ", value={"uid": "1"}),
        context=DissectContext(collections=False),
        problems=("only accepted when collections",),
    ),
    Case("stream-req-sid-required", encode("DCP_STREAM_REQ", value={"uid": "1"}), context=SID, problems=("sid required",)),
    Case(
        "stream-req-erange",
        encode("DCP_STREAM_REQ", extras={"start_seqno": 10, "end_seqno": 5, "snap_start_seqno": 11, "snap_end_seqno": 9}),
        problems=("snapshot start seqno > start seqno", "start seqno > snapshot end seqno", "start seqno > end seqno"),
    ),
    Case(
        "stream-req-obsolete-novalue-flag",
        encode("DCP_STREAM_REQ", extras={"flags": 0x08, "end_seqno": 1}),
        problems=("NoValue stream flag is obsolete",),
    ),
    Case(
        "stream-req-cache-transfer-combination",
        encode("DCP_STREAM_REQ", extras={"flags": 0x100 | 0x04, "end_seqno": 1}),
        problems=("may only be combined",),
    ),
    Case(
        "stream-req-error-status",
        encode("DCP_STREAM_REQ", response=True, status=0x22),
        variant="error",
        meanings={"header.status": "Erange"},
    ),
    Case("stream-end-slow", encode("DCP_STREAM_END", extras={"status": 4}), meanings={"extras.status": "Slow"}),
    Case(
        "stream-end-sid",
        encode("DCP_STREAM_END", extras={"status": 0}, stream_id=3),
        context=SID,
        stream_id=3,
        fields={"framing[0].stream_id": 3},
        meanings={"framing[0].id": "DcpStreamId, 2 bytes"},
    ),
    Case(
        "stream-end-sid-not-enabled",
        encode("DCP_STREAM_END", extras={"status": 0}, stream_id=3),
        context=DissectContext(stream_ids=False),
        problems=("enable_stream_id was not negotiated",),
    ),
    Case("stream-end-sid-missing", encode("DCP_STREAM_END", extras={"status": 0}), context=SID, problems=("stream id missing",)),
    Case(
        "marker-v1",
        encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 9, "flags": 0x05}),
        variant="v1",
        meanings={"extras.flags": "memory, checkpoint"},
    ),
    Case(
        "marker-v2.0",
        encode(
            "DCP_SNAPSHOT_MARKER",
            variant="v2.0",
            value={"start_seqno": 1, "end_seqno": 9, "flags": 2, "max_visible_seqno": 8, "high_completed_seqno": 7},
        ),
        variant="v2.0",
        body={"start_seqno": 1, "end_seqno": 9, "flags": 2, "max_visible_seqno": 8, "high_completed_seqno": 7},
    ),
    Case(
        "marker-v2.2",
        encode(
            "DCP_SNAPSHOT_MARKER",
            extras={"version": 2},
            value={"start_seqno": 1, "end_seqno": 9, "flags": 0x12, "purge_seqno": 3, "high_prepared_seqno": 4},
        ),
        variant="v2.2",
        meanings={"extras.version": "v2.2", "value.flags": "disk, history"},
        fields={"value.purge_seqno": 3, "value.high_prepared_seqno": 4},
    ),
    Case(
        "marker-v2.1-rejected",
        encode("DCP_SNAPSHOT_MARKER", extras=b"\x01", value=bytes(36)),
        variant="unknown layout",
        problems=("no DCP_SNAPSHOT_MARKER layout for version=1", "v2.1 is never used"),
    ),
    Case(
        "marker-v2.0-short-value",
        encode("DCP_SNAPSHOT_MARKER", extras=b"\x00", value=bytes(20)),
        variant="v2.0",
        problems=("section ends inside max visible seqno",),
    ),
    Case(
        "mutation-plain", encode("DCP_MUTATION", extras=MUT, key="doc1", value=b"hello", cas=99), key=b"doc1", document="hello", extras=MUT
    ),
    Case(
        "mutation-collections",
        encode("DCP_MUTATION", extras=MUT, key="doc1", cid=0x555, value=b"{}", datatype=1),
        context=COLL,
        key=b"doc1",
        cid=0x555,
        document={},
        fields={"key.cid": 0x555},
    ),
    Case(
        "mutation-collections-unknown-context", encode("DCP_MUTATION", extras=MUT, key="doc1", cid=0x555, value=b"x"), key=b"\xd5\x0adoc1"
    ),
    Case(
        "mutation-collections-default",
        encode("DCP_MUTATION", extras=MUT, key="k", cid=0),
        context=COLL,
        cid=0,
        meanings={"key.cid": "_default"},
    ),
    Case(
        "mutation-overlong-leb128", encode("DCP_MUTATION", extras=MUT, key=b"\x80\x00k"), context=COLL, cid=0, problems=("non-canonical",)
    ),
    Case(
        "mutation-leb128-unterminated", encode("DCP_MUTATION", extras=MUT, key=b"\x80\x80"), context=COLL, problems=("inside its LEB128",)
    ),
    Case("mutation-by-seqno-zero", encode("DCP_MUTATION", extras={**MUT, "by_seqno": 0}, key="k"), problems=("by seqno 0 is rejected",)),
    Case("mutation-nmeta", encode("DCP_MUTATION", extras={**MUT, "nmeta": 3}, key="k"), problems=("non-zero nmeta",)),
    Case("mutation-no-key", encode("DCP_MUTATION", extras=MUT), problems=("must have a key",)),
    Case(
        "mutation-bad-extras-length",
        encode("DCP_MUTATION", extras=bytes(32), key="k"),
        problems=("unexpected extras length 32", "by seqno 0"),
    ),
    Case("mutation-json-invalid", encode("DCP_MUTATION", extras=MUT, key="k", value=b"{nope", datatype=1), problems=("not valid JSON",)),
    Case(
        "mutation-xattr",
        encode("DCP_MUTATION", extras=MUT, key="k", value=xattrs({"_sync": '{"rev":1}', "meta": "x"}, b'{"a":1}'), datatype=0x05),
        document={"a": 1},
        fields={"value.xattrs[0]": '_sync={"rev":1}', "value.xattrs[1]": "meta=x", "value.document": '{"a":1}'},
    ),
    Case(
        "mutation-xattr-overrun",
        encode("DCP_MUTATION", extras=MUT, key="k", value=b"\x00\x00\x00\xff" + b"x", datatype=0x04),
        problems=("overruns the value",),
    ),
    Case(
        "mutation-xattr-bad-pair",
        encode("DCP_MUTATION", extras=MUT, key="k", value=b"\x00\x00\x00\x06\x00\x00\x00\x02ab", datatype=0x04),
        problems=("malformed xattr pair 0",),
    ),
    Case(
        "mutation-snappy",
        encode(
            "DCP_MUTATION", extras=MUT, key="k", value=bytes(cramjam.snappy.compress_raw(b'{"big":"' + b"x" * 300 + b'"}')), datatype=0x03
        ),
        document={"big": "x" * 300},
        fields={"value.inflated_length": 310},
    ),
    Case(
        "mutation-bad-snappy",
        encode("DCP_MUTATION", extras=MUT, key="k", value=b"\x05\xff\xff", datatype=0x02),
        problems=("bad snappy value",),
    ),
    Case(
        "mutation-snappy-bomb",
        encode("DCP_MUTATION", extras=MUT, key="k", value=encode_leb128(2**31) + b"\x00", datatype=0x02),
        problems=("claims 2147483648 inflated bytes",),
    ),
    Case("mutation-unknown-datatype", encode("DCP_MUTATION", extras=MUT, key="k", datatype=0x08), problems=("unknown datatype bits 0x08",)),
    Case(
        "deletion-v1",
        encode("DCP_DELETION", extras={"by_seqno": 4, "rev_seqno": 2, "nmeta": 0}, key="k"),
        variant="v1",
        context=DissectContext(delete_times=False),
    ),
    Case(
        "deletion-v1-but-delete-times",
        encode("DCP_DELETION", extras={"by_seqno": 4, "rev_seqno": 2}, key="k"),
        context=DissectContext(delete_times=True),
        problems=("expects v2",),
    ),
    Case(
        "deletion-v2",
        encode("DCP_DELETION", extras={"by_seqno": 4, "rev_seqno": 2, "delete_time": 1700000000, "unused": 0}, key="k"),
        variant="v2",
        extras={"by_seqno": 4, "rev_seqno": 2, "delete_time": 1700000000, "unused": 0},
    ),
    Case(
        "deletion-v2-without-delete-times",
        encode("DCP_DELETION", variant="v2", extras={"by_seqno": 4}, key="k"),
        context=DissectContext(delete_times=False),
        problems=("expects v1",),
    ),
    Case(
        "deletion-json-only-datatype",
        encode("DCP_DELETION", variant="v1", extras={"by_seqno": 4}, key="k", datatype=1),
        problems=("datatype 0x01 is not valid",),
    ),
    Case(
        "expiration",
        encode("DCP_EXPIRATION", extras={"by_seqno": 4, "rev_seqno": 2, "delete_time": 5}, key="k"),
        extras={"by_seqno": 4, "rev_seqno": 2, "delete_time": 5},
    ),
    Case("flush-obsolete", encode("DCP_FLUSH"), problems=("obsolete",)),
    Case("set-vbucket-state", encode("DCP_SET_VBUCKET_STATE", extras={"state": 3}), meanings={"extras.state": "pending"}),
    Case("set-vbucket-state-bad", encode("DCP_SET_VBUCKET_STATE", extras={"state": 9}), problems=("unknown state 0x09",)),
    Case("noop-with-value", encode("DCP_NOOP", value=b"x"), problems=("must not have a value",)),
    Case("buffer-ack", encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 1 << 20}), extras={"buffer_bytes": 1 << 20}),
    Case(
        "control-known",
        encode("DCP_CONTROL", key="enable_noop", value="true"),
        fields={"key": "enable_noop", "value": "true"},
        meanings={"key": 'any value; only "true" turns noops on (anything else turns them off)'},
    ),
    Case("control-unknown", encode("DCP_CONTROL", key="make_it_fast", value="true"), problems=("unknown control key 'make_it_fast'",)),
    Case(
        "system-event-begin-v0",
        encode(
            "DCP_SYSTEM_EVENT",
            extras={"by_seqno": 9, "event": 0, "version": 0},
            key="beers",
            value={"manifest_uid": 2, "scope_id": 8, "collection_id": 9},
        ),
        variant="begin collection v0",
        body={"manifest_uid": 2, "scope_id": 8, "collection_id": 9},
        fields={"key": "beers"},
        meanings={"extras.event": "BeginCollection"},
    ),
    Case(
        "system-event-begin-v1",
        encode(
            "DCP_SYSTEM_EVENT",
            extras={"by_seqno": 9, "event": 0, "version": 1},
            key="beers",
            value={"manifest_uid": 2, "scope_id": 8, "collection_id": 9, "max_ttl": 60},
        ),
        variant="begin collection v1",
        body={"manifest_uid": 2, "scope_id": 8, "collection_id": 9, "max_ttl": 60},
    ),
    Case(
        "system-event-drop-scope-v0",
        encode("DCP_SYSTEM_EVENT", extras={"by_seqno": 9, "event": 4, "version": 0}, value={"manifest_uid": 2, "scope_id": 8}),
        variant="drop scope v0",
    ),
    Case(
        "system-event-v2-flatbuffers",
        encode(
            "DCP_SYSTEM_EVENT",
            extras={"by_seqno": 9, "event": 5, "version": 2},
            key="beers",
            value=build_table(
                {"uid": 3, "scopeId": 8, "collectionId": 9, "name": "beers", "history": True}, FLATBUFFER_TABLES["Collection"]
            ),
        ),
        variant="modify collection v2",
        fields={"value.uid": 3, "value.name": "beers", "value.history": True},
    ),
    Case(
        "system-event-v2-garbage",
        encode("DCP_SYSTEM_EVENT", extras={"by_seqno": 9, "event": 1, "version": 2}, value=b"\xff\xff"),
        problems=("too short for a root offset",),
    ),
    Case(
        "system-event-reserved",
        encode("DCP_SYSTEM_EVENT", extras={"by_seqno": 9, "event": 2, "version": 0}),
        variant="unknown layout",
        problems=("no DCP_SYSTEM_EVENT layout for event=2, version=0", "event id 2 is reserved"),
    ),
    Case(
        "prepare",
        encode("DCP_PREPARE", extras={"by_seqno": 3, "deleted": 1, "durability_level": 2}, key="k", value=b"v", cas=1),
        meanings={"extras.durability_level": "MajorityAndPersistOnMaster", "extras.deleted": "prepared delete"},
    ),
    Case(
        "prepare-rules",
        encode("DCP_PREPARE", extras={"by_seqno": 3, "durability_level": 0}, key="k", stream_id=1),
        problems=("CAS must not be 0", "durability level 0 is invalid", "must never carry a stream id"),
    ),
    Case("seqno-ack", encode("DCP_SEQNO_ACKNOWLEDGED", extras={"prepared_seqno": 3}), extras={"prepared_seqno": 3}),
    Case("commit-cas", encode("DCP_COMMIT", extras={"prepared_seqno": 3, "commit_seqno": 4}, key="k", cas=5), problems=("CAS must be 0",)),
    Case(
        "abort",
        encode("DCP_ABORT", extras={"prepared_seqno": 3, "abort_seqno": 4}, key="k"),
        extras={"prepared_seqno": 3, "abort_seqno": 4},
    ),
    Case("seqno-advanced", encode("DCP_SEQNO_ADVANCED", extras={"seqno": 77}), extras={"seqno": 77}),
    Case("oso-start", encode("DCP_OSO_SNAPSHOT", extras={"flags": 1}), meanings={"extras.flags": "start"}),
    Case(
        "cache-transfer",
        encode(
            "DCP_CACHE_TRANSFER",
            value=struct.pack(">QQQIIIHBB", 7, 3, 1, 2, 0, 0, 3, 0, 1) + b"\x08ab" + b"hi",
        ),
        context=COLL,
        fields={"value.records[0].key": "ab", "value.records[0].cid": 8, "value.records[0].value": "hi", "value.records[0].by_seqno": 3},
    ),
    Case(
        "cache-transfer-overrun",
        encode("DCP_CACHE_TRANSFER", value=struct.pack(">QQQIIIHBB", 7, 3, 1, 200, 0, 0, 3, 0, 1)),
        problems=("overrun",),
    ),
    Case("cache-transfer-end", encode("DCP_CACHE_TRANSFER_END"), title="DCP_CACHE_TRANSFER_END command"),
    Case(
        "unknown-opcode",
        encode(0xEE, extras=b"\x01\x02", key="k", value=b"v"),
        title="unknown 0xee command",
        variant="generic",
        fields={"key": "k"},
    ),
    Case("server-request", encode(0x01, magic=0x82, value=b'{"rev":1}'), title="server opcode 0x01 server command"),
    Case(
        "alt-request-durability",
        encode("SET", key="k", extras={"flags": 0, "expiration": 0}, frame_infos=[(1, b"\x02\x00\x10"), (0, b"")]),
        fields={"framing[0].level": 2, "framing[0].timeout": 16},
        meanings={"framing[0].id": "DurabilityRequirement, 3 bytes", "framing[1].id": "Barrier, 0 bytes"},
    ),
    Case("alt-request-unknown-frame-info", encode("GET", key="k", frame_infos=[(20, b"ab")]), problems=("unknown frame info id 20",)),
    Case(
        "alt-request-frame-info-overrun",
        encode("GET", key="k", frame_infos=[(2, b"\x00\x01")], overrides={"framing_extras_length": 2, "key_length": 2}),
        problems=("overruns the framing extras",),
    ),
]


def _find(d: Any, path: str) -> Any:
    for f in d.fields:
        if f.path == path:
            return f
    raise AssertionError(f"no field {path}; have {[f.path for f in d.fields]}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case(case: Case) -> None:
    events = decode(case.data)
    assert [e.type for e in events] == ["frame"], events
    frame = events[0]
    assert isinstance(frame, Frame)
    d = dissect(frame, case.context)
    if case.title:
        assert d.title == case.title
    if case.variant is not None:
        assert d.variant == case.variant
    for k, v in case.extras.items():
        assert d.extras[k] == v
    for k, v in case.body.items():
        assert d.body[k] == v
    if case.key is not None:
        assert d.key == case.key
    if case.cid is not None:
        assert d.cid == case.cid
    if case.stream_id is not None:
        assert d.stream_id == case.stream_id == frame.stream_id
    if case.document is not None:
        assert d.document == case.document
    for path, value in case.fields.items():
        assert _find(d, path).value == value, path
    for path, meaning in case.meanings.items():
        assert _find(d, path).meaning == meaning, path
    messages = [p.message for p in d.problems]
    for want in case.problems:
        assert any(want in m for m in messages), (want, messages)
    unexpected = [m for m in messages if not any(w in m for w in case.problems)]
    assert unexpected == []
    # every field lies inside the frame; rendering never fails
    for f in d.fields:
        assert f.offset >= 0 and f.offset + f.length <= frame.length, f
    assert annotate(d)
    assert annotate_html(d)
    json.dumps(d.as_dict())


def test_secrets_never_leave_unmasked() -> None:
    raw = encode("SASL_AUTH", key="PLAIN", value=b"\0alice\0s3cret")
    d = dissect(decode(raw)[0])  # type: ignore[arg-type]
    for text in (annotate(d), annotate_html(d), json.dumps(d.as_dict())):
        assert "s3cret" not in text
        assert b"s3cret".hex() not in text
    grid = annotate(d)
    assert grid.count("0x**") == len("s3cret")
    assert "('3')" not in grid  # the password's characters are not drawn in the grid
    revealed = dissect(decode(raw)[0], DissectContext(reveal_secrets=True))  # type: ignore[arg-type]
    assert "s3cret" in annotate(revealed)


def test_scram_proof_masked_in_grid_and_json() -> None:
    raw = encode("SASL_STEP", key="SCRAM-SHA256", value=b"c=biws,r=n0nce,p=PROOFPROOF")
    d = dissect(decode(raw)[0])  # type: ignore[arg-type]
    for text in (annotate(d), annotate_html(d), json.dumps(d.as_dict())):
        assert "PROOFPROOF" not in text
        assert b"PROOFPROOF".hex() not in text
    assert "n0nce" in annotate(d)


def test_stream_id_frame_is_0x22_hi_lo() -> None:
    raw = encode("DCP_MUTATION", extras=MUT, key="k", stream_id=0x1234)
    assert raw[0] == 0x08 and raw[2] == 3 and raw[24:27] == b"\x22\x12\x34"
    assert dissect(decode(raw)[0], SID).extras["by_seqno"] == 5  # type: ignore[arg-type]


def test_extras_offsets_follow_framing_extras() -> None:
    raw = encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 2, "flags": 1}, stream_id=9)
    d = dissect(decode(raw)[0], SID)  # type: ignore[arg-type]
    assert _find(d, "extras.start_seqno").offset == 27


def test_html_escapes_wire_text() -> None:
    raw = encode("DCP_MUTATION", extras=MUT, key="<script>alert(1)</script>", value=b"<b>&amp;</b>")
    html = annotate_html(decode(raw)[0])
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<b>&amp;" not in html


def test_terminal_escapes_control_characters() -> None:
    raw = encode("DCP_MUTATION", extras=MUT, key="a\x1b[31mred", value=b"\x1b]0;title\x07")
    text = annotate(decode(raw)[0])
    assert "\x1b" not in text and "\\x1b" in text


# --- SASL masking: every SASL request payload is masked unless positively known to be safe ---------------------


def _shown(d: Any) -> list[str]:
    return [annotate(d), annotate_html(d), json.dumps(d.as_dict())]


@pytest.mark.parametrize(
    ("mech", "value", "secret"),
    [
        ("PLAIN ", b"\0alice\0s3cret-pw", b"s3cret-pw"),
        ("PLAIN\0", b"\0alice\0s3cret-pw", b"s3cret-pw"),
        ("PLAIN", b"\0alice\0s3cret-pw\0extra", b"s3cret-pw"),
        ("CRAM-MD5", b"alice 3f2d0c6b9a8e7f6d5c4b3a2910fedcba", b"3f2d0c6b9a8e7f6d5c4b3a2910fedcba"),
        ("SCRAM-SHA256", b"c=biws,r=n0nce,p=PROOFPROOF\x01", b"PROOFPROOF"),
        ("SCRAM-SHA256", b"n,,n=alice,r=n0nce\x00,p=PROOFPROOF", b"PROOFPROOF"),
        ("SCRAM-SHA512", b"c=biws,r=n0nce,x=PROOFPROOF", b"PROOFPROOF"),
        ("", b"whatever-secret", b"whatever-secret"),
        ("OAUTHBEARER", b"n,,\x01auth=Bearer TOKENTOKEN\x01\x01", b"TOKENTOKEN"),
    ],
    ids=[
        "plain-space",
        "plain-nul",
        "plain-4-parts",
        "cram-md5",
        "scram-nonprintable",
        "scram-first-nul",
        "scram-unknown-attr",
        "no-mech",
        "oauth",
    ],
)
@pytest.mark.parametrize("op", ["SASL_AUTH", "SASL_STEP"])
def test_sasl_payload_masked_unless_known_safe(op: str, mech: str, value: bytes, secret: bytes) -> None:
    raw = encode(op, key=mech, value=value)
    frame = decode(raw)[0]
    d = dissect(frame)  # type: ignore[arg-type]
    for text in _shown(d):
        assert secret.decode() not in text
        assert secret.hex() not in text
    assert d.secrets and sum(n for _, n in d.secrets) >= len(secret)
    revealed = dissect(frame, DissectContext(reveal_secrets=True))  # type: ignore[arg-type]
    assert revealed.secrets == []
    assert secret.hex() in json.dumps(revealed.as_dict()) or secret.decode() in annotate(revealed)


def test_sasl_safe_messages_stay_readable() -> None:
    first = dissect(decode(encode("SASL_AUTH", key="SCRAM-SHA512", value=b"n,,n=alice,r=n0nce"))[0])  # type: ignore[arg-type]
    assert first.secrets == [] and "n=alice" in annotate(first) and "r=n0nce" in annotate(first)
    final = dissect(decode(encode("SASL_STEP", key="SCRAM-SHA512", value=b"c=biws,r=n0nce,p=PROOFPROOF"))[0])  # type: ignore[arg-type]
    assert "r=n0nce" in annotate(final) and "PROOFPROOF" not in annotate(final)
    challenge = dissect(decode(encode("SASL_AUTH", response=True, status=0x21, value=b"r=n0nceS,s=c2FsdA==,i=4096"))[0])  # type: ignore[arg-type]
    assert challenge.secrets == [] and "s=c2FsdA==" in annotate(challenge)
    verifier = dissect(decode(encode("SASL_STEP", response=True, value=b"v=VERIFIERVERIFIER"))[0])  # type: ignore[arg-type]
    assert "VERIFIERVERIFIER" not in annotate(verifier)
    error = dissect(decode(encode("SASL_AUTH", response=True, status=0x20, value=b"Auth failure"))[0])  # type: ignore[arg-type]
    assert "Auth failure" in annotate(error)
