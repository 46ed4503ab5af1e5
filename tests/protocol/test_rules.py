"""The protocol rules (:mod:`dcpinspect.protocol.rules`): the rollback decision and the flow-control sizes, as tables."""

from __future__ import annotations

import pytest

from dcpinspect import encode
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Magic, Opcode, StreamReqFlag
from dcpinspect.protocol.rules import RollbackDecision, flow_control_size, rollback_decision

STRICT, IGNORE_PURGED = StreamReqFlag.STRICT_VB_UUID, StreamReqFlag.IGNORE_PURGED_TOMBSTONES

# ---------------------------------------------------------------------------
# the rollback decision, every case as a table

FT = [(2222, 3), (1111, 0)]  # discussion.md worked example
ROLLBACK_CASES = [
    # (id, kwargs, expected (rollback, seqno))
    ("start0-not-strict", {"start": 0, "vb_uuid": 9999}, (False, 0)),
    ("start0-strict-uuid0", {"start": 0, "vb_uuid": 0, "flags": STRICT}, (False, 0)),
    ("start0-strict-unknown-uuid", {"start": 0, "vb_uuid": 9999, "flags": STRICT}, (True, 0)),
    ("start0-strict-known-uuid", {"start": 0, "vb_uuid": 2222, "flags": STRICT}, (False, 0)),
    ("purge-above-start", {"start": 2, "snap_start": 2, "snap_end": 2, "vb_uuid": 2222, "purge_seqno": 5}, (True, 0)),
    (
        "purge-client-knows",
        {"start": 2, "snap_start": 2, "snap_end": 2, "vb_uuid": 2222, "purge_seqno": 5, "client_purge_seqno": 5},
        (False, 0),
    ),
    (
        "purge-ignored-flag",
        {"start": 2, "snap_start": 2, "snap_end": 2, "vb_uuid": 2222, "purge_seqno": 5, "flags": IGNORE_PURGED},
        (False, 0),
    ),
    (
        "purge-filtered-M-below",
        {"start": 2, "snap_start": 2, "snap_end": 2, "vb_uuid": 2222, "purge_seqno": 5, "filtered_max_seqno": 1},
        (False, 0),
    ),
    (
        "purge-filtered-M-above",
        {"start": 2, "snap_start": 2, "snap_end": 2, "vb_uuid": 2222, "purge_seqno": 5, "filtered_max_seqno": 3},
        (True, 0),
    ),
    ("purge-equal-start", {"start": 5, "snap_start": 5, "snap_end": 5, "vb_uuid": 2222, "purge_seqno": 5}, (False, 0)),
    ("uuid-not-found", {"start": 3, "snap_start": 3, "snap_end": 3, "vb_uuid": 4242}, (True, 0)),
    ("doc-example-snap-1-4", {"start": 3, "snap_start": 1, "snap_end": 4, "vb_uuid": 1111}, (True, 1)),
    ("doc-example-snap-3-3", {"start": 3, "snap_start": 3, "snap_end": 3, "vb_uuid": 1111}, (False, 0)),
    ("step5-start-eq-snapstart", {"start": 3, "snap_start": 3, "snap_end": 8, "vb_uuid": 1111}, (False, 0)),
    ("step7-start-eq-snapend", {"start": 5, "snap_start": 2, "snap_end": 5, "vb_uuid": 1111}, (True, 3)),
    ("step8-upper-below-snapstart", {"start": 6, "snap_start": 4, "snap_end": 8, "vb_uuid": 1111}, (True, 3)),
    ("newest-uuid-within-high", {"start": 8, "snap_start": 6, "snap_end": 10, "vb_uuid": 2222}, (False, 0)),
    ("newest-uuid-client-ahead", {"start": 11, "snap_start": 9, "snap_end": 12, "vb_uuid": 2222}, (True, 9)),
    ("newest-uuid-ahead-snap-done", {"start": 12, "snap_start": 9, "snap_end": 12, "vb_uuid": 2222}, (True, 10)),
]


@pytest.mark.parametrize(("kw", "want"), [c[1:] for c in ROLLBACK_CASES], ids=[c[0] for c in ROLLBACK_CASES])
def test_rollback_decision_table(kw, want) -> None:
    args = {"snap_start": kw.get("start", 0), "snap_end": kw.get("start", 0), "failover_log": FT, "high_seqno": 10, "purge_seqno": 0, **kw}
    d = rollback_decision(**args)
    assert isinstance(d, RollbackDecision)
    assert (d.rollback, d.seqno) == want, d.reason
    assert d.reason


# ---------------------------------------------------------------------------
# flow control: what a producer charges to the consumer's buffer

#: the producer's messages that belong to a stream, written out here independently of protocol/session.py
CHARGED = {
    "DCP_STREAM_END",
    "DCP_SNAPSHOT_MARKER",
    "DCP_MUTATION",
    "DCP_DELETION",
    "DCP_EXPIRATION",
    "DCP_SET_VBUCKET_STATE",
    "DCP_SYSTEM_EVENT",
    "DCP_PREPARE",
    "DCP_COMMIT",
    "DCP_ABORT",
    "DCP_SEQNO_ADVANCED",
    "DCP_OSO_SNAPSHOT",
    "DCP_CACHE_TRANSFER",
    "DCP_CACHE_TRANSFER_END",
}
REQUESTS = {Magic.CLIENT_REQUEST, Magic.ALT_CLIENT_REQUEST}


@pytest.mark.parametrize("magic", list(Magic), ids=[m.name for m in Magic])
def test_flow_control_size_of_every_opcode_and_magic(magic: Magic) -> None:
    for opcode in range(256):
        name = Opcode(opcode).name if opcode in spec.COMMANDS else None
        for length in (24, 55, 1000):
            got = flow_control_size(magic, opcode, length)
            if magic not in REQUESTS or name not in CHARGED:
                want = 0  # noops, responses, server requests, anything not a stream message
            elif opcode == Opcode.DCP_PREPARE:
                want = length + 2  # MB-46634: a prepare counts 2 bytes more than its size
            elif opcode == Opcode.DCP_CACHE_TRANSFER_END:
                want = spec.HEADER_SIZE  # kv_engine response.h: sizeof(Request), a stream id or not
            else:
                want = length
            assert got == want, (magic.name, name or hex(opcode), length)


@pytest.mark.parametrize("name", sorted(CHARGED))
def test_flow_control_size_of_encoded_stream_messages(name: str) -> None:
    """On real frames (both magics: a stream id makes an alt request): the frame's length, +2 for a prepare."""
    for raw in (encode(name), encode(name, stream_id=7)):
        extra = 2 if name == "DCP_PREPARE" else 0
        want = spec.HEADER_SIZE if name == "DCP_CACHE_TRANSFER_END" else len(raw) + extra
        assert flow_control_size(raw[0], raw[1], len(raw)) == want
        response = encode(name, response=True)
        assert flow_control_size(response[0], response[1], len(response)) == 0
