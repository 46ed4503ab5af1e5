"""The timeline raises no false alarm on what a real server (or client) legally does, and keeps the true ones.

Every test builds its frames by hand (``dcpinspect.wire.encode``), never with
the simulator: the timeline is checked against kv_engine's behaviour, not
against our own producer.  Each legal case has a twin next to it: the nearest
thing that is *not* legal, which must still raise its anomaly.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import Record
from dcpinspect.flows.session import FRESH
from dcpinspect.protocol.enums import Feature, SnapshotFlag, StreamEndStatus, StreamReqFlag
from dcpinspect.protocol.rules import MAX_SEQNO, flow_control_size, rollback_decision
from dcpinspect.protocol.session import STREAM_END_NORMAL, STREAM_END_REREQUEST
from dcpinspect.timeline import Timeline, build_timeline
from dcpinspect.timeline import core as timeline_core
from dcpinspect.timeline import streams as timeline_streams
from dcpinspect.timeline.rollback import hex_uuids
from dcpinspect.wire.events import Frame

T0 = 1_700_000_000_000_000_000
MEM, DISK, CHK, HIST, DUPS = (
    int(f)
    for f in (SnapshotFlag.MEMORY, SnapshotFlag.DISK, SnapshotFlag.CHECKPOINT, SnapshotFlag.HISTORY, SnapshotFlag.MAY_CONTAIN_DUPLICATES)
)
Conv = list[tuple[str, bytes]]


# --- frames -------------------------------------------------------------------------------------------------


def records(frames: Conv, conn: int = 1) -> list[Record]:
    """Records of hand-built frames on one connection, numbered from 1, one nanosecond apart."""
    return [Record(n, "f", conn, "c", d, T0 + n, T0 + n, n, n, Frame(0, raw), FRESH) for n, (d, raw) in enumerate(frames, 1)]


def timeline(frames: Conv) -> Timeline:
    return build_timeline(records(frames))


def kinds(t: Timeline) -> list[tuple[str, list[int]]]:
    return [(str(a.kind), a.frames) for a in t.anomalies]


def req(
    vb: int = 0, opaque: int = 0x10, *, start: int = 0, end: int = MAX_SEQNO, uuid: int = 0, snap: tuple[int, int] | None = None, **kw: Any
) -> bytes:
    snap_start, snap_end = snap if snap is not None else (start, start)
    extras = {"flags": kw.pop("flags", 0), "start_seqno": start, "end_seqno": end, "vb_uuid": uuid}
    extras |= {"snap_start_seqno": snap_start, "snap_end_seqno": snap_end}
    return encode("DCP_STREAM_REQ", extras=extras, vbucket=vb, opaque=opaque, **kw)


def ok(log: list[tuple[int, int]] | None = None, opaque: int = 0x10) -> bytes:
    log = log or [(0xAA, 0)]
    return encode("DCP_STREAM_REQ", response=True, opaque=opaque, value={"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in log]})


def rollback(to: int, opaque: int = 0x10) -> bytes:
    return encode("DCP_STREAM_REQ", response=True, status=0x23, opaque=opaque, value={"rollback_seqno": to})


def marker(start: int, end: int, flags: int = MEM, opaque: int = 0x10, sid: int | None = None) -> bytes:
    return encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": start, "end_seqno": end, "flags": flags}, opaque=opaque, stream_id=sid)


def mut(seqno: int, key: str | bytes | None = None, opaque: int = 0x10, sid: int | None = None) -> bytes:
    k = f"k{seqno}" if key is None else key
    return encode("DCP_MUTATION", extras={"by_seqno": seqno, "rev_seqno": 1}, key=k, value=b"v", opaque=opaque, cas=seqno, stream_id=sid)


def end(status: int = 0, opaque: int = 0x10, sid: int | None = None) -> bytes:
    return encode("DCP_STREAM_END", extras={"status": status}, opaque=opaque, stream_id=sid)


def control(key: str, value: str, opaque: int) -> Conv:
    return [
        ("c2s", encode("DCP_CONTROL", key=key, value=value.encode(), opaque=opaque)),
        ("s2c", encode("DCP_CONTROL", response=True, opaque=opaque)),
    ]


def hello(*features: int, opaque: int = 1) -> Conv:
    value = {"features": [{"feature": f} for f in features]}
    return [
        ("c2s", encode("HELLO", key="test", value=value, opaque=opaque)),
        ("s2c", encode("HELLO", response=True, value=value, opaque=opaque)),
    ]


OPEN: Conv = [
    ("c2s", encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key="test:conn", opaque=2)),
    ("s2c", encode("DCP_OPEN", response=True, opaque=2)),
]
END_ON_CLOSE = control("send_stream_end_on_client_close_stream", "true", 3)
STREAM_IDS = control("enable_stream_id", "true", 4)
CLOSE: Conv = [("c2s", encode("DCP_CLOSE_STREAM", opaque=0x20)), ("s2c", encode("DCP_CLOSE_STREAM", response=True, opaque=0x20))]


# --- a stream re-requested after a close ----------------------------------------------------------------------


def test_a_stream_requested_again_before_its_closed_end_arrived() -> None:
    """kv_engine producer.cc: a new request replaces the closed stream at once; what it had queued (and its end) may still come first."""
    t = timeline(
        [
            *OPEN,
            *END_ON_CLOSE,
            ("c2s", req()),
            ("s2c", ok()),
            ("s2c", marker(1, 5)),
            ("s2c", mut(1)),
            *CLOSE,
            ("c2s", req(opaque=0x11, start=1, uuid=0xAA, snap=(1, 5))),
            ("s2c", mut(2)),  # queued before the close: the old stream's
            ("s2c", end(StreamEndStatus.CLOSED)),
            ("s2c", ok(opaque=0x11)),
            ("s2c", marker(2, 6, opaque=0x11)),
            ("s2c", mut(2, opaque=0x11)),
        ]
    )
    assert kinds(t) == []
    old, new = t.streams
    assert (old.end or {}).get("name") == "Closed" and [i.seqno for i in old.items] == [1, 2]
    assert new.segment == 1 and new.attempts[0].outcome == "success" and [i.seqno for i in new.items] == [2]


def test_a_stream_id_stream_requested_again_before_its_closed_end_arrived() -> None:
    """The same with stream ids: the messages find their stream by (vbucket, sid), and still go to the closed segment until the new answer."""
    sid_req = encode(
        "DCP_STREAM_REQ", extras={"start_seqno": 0, "end_seqno": MAX_SEQNO}, value={"sid": 1}, opaque=0x11
    )  # the same sid, another opaque
    t = timeline(
        [
            *OPEN,
            *END_ON_CLOSE,
            *STREAM_IDS,
            ("c2s", encode("DCP_STREAM_REQ", extras={"start_seqno": 0, "end_seqno": MAX_SEQNO}, value={"sid": 1}, opaque=0x10)),
            ("s2c", ok()),
            ("s2c", marker(1, 5, sid=1)),
            ("s2c", mut(1, sid=1)),
            ("c2s", encode("DCP_CLOSE_STREAM", opaque=0x20, stream_id=1)),
            ("s2c", encode("DCP_CLOSE_STREAM", response=True, opaque=0x20)),
            ("c2s", sid_req),
            ("s2c", mut(2, sid=1)),
            ("s2c", end(StreamEndStatus.CLOSED, sid=1)),
            ("s2c", ok(opaque=0x11)),
            ("s2c", marker(1, 1, sid=1, opaque=0x11)),
        ]
    )
    assert kinds(t) == []
    old, new = t.streams
    assert (old.end or {}).get("name") == "Closed" and [i.seqno for i in old.items] == [1, 2] and len(new.snapshots) == 1


def test_twin_a_request_for_an_open_stream_is_still_an_anomaly() -> None:
    t = timeline([*OPEN, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 5)), ("s2c", mut(1)), ("c2s", req(opaque=0x11))])
    assert kinds(t) == [("stream already open", [3, 7])]


# --- queued items between the close response and STREAM_END(Closed) -------------------------------------------


def test_queued_items_follow_the_close_response_when_a_closed_end_was_asked_for() -> None:
    """kv_engine active_stream.cc endStream: with send_stream_end_on_client_close_stream the readyQ is sent, then STREAM_END(Closed)."""
    conv = [*OPEN, *END_ON_CLOSE, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 5)), ("s2c", mut(1)), *CLOSE]
    conv += [("s2c", mut(2)), ("s2c", mut(3)), ("s2c", end(StreamEndStatus.CLOSED))]
    t = timeline(conv)
    assert kinds(t) == [] and [i.seqno for i in t.streams[0].items] == [1, 2, 3]


def test_twin_items_after_the_close_response_without_the_control() -> None:
    """Without the control the stream is erased at the close: nothing may follow its response."""
    conv = [*OPEN, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 5)), ("s2c", mut(1)), *CLOSE, ("s2c", mut(2))]
    assert kinds(timeline(conv)) == [("after close stream", [8, 9])]
    # ... and with it, nothing after the STREAM_END(Closed)
    conv = [*OPEN, *END_ON_CLOSE, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 5)), *CLOSE, ("s2c", end(1)), ("s2c", mut(2))]
    assert kinds(timeline(conv)) == [("after stream end", [10, 11])]


# --- seqnos above the requested end, within the snapshot that contains it -------------------------------------


def test_the_snapshot_that_contains_the_end_seqno_is_sent_whole() -> None:
    """kv_engine: a stream ends OK only after the complete snapshot that contains its end seqno."""
    conv = [*OPEN, ("c2s", req(end=3)), ("s2c", ok()), ("s2c", marker(1, 5)), *[("s2c", mut(i)) for i in range(1, 6)], ("s2c", end())]
    t = timeline(conv)
    assert kinds(t) == [] and t.streams[0].snapshots[0].complete


def test_a_replica_raises_the_end_to_its_checkpoint_snapshot_end() -> None:
    """On a replica vbucket the end is raised to the end of the checkpoint snapshot that contains it."""
    conv = [*OPEN, ("c2s", req(end=5)), ("s2c", ok()), ("s2c", marker(1, 3, MEM | CHK)), *[("s2c", mut(i)) for i in (1, 2, 3)]]
    conv += [("s2c", marker(4, 9, MEM | CHK)), *[("s2c", mut(i)) for i in (4, 6, 9)], ("s2c", end())]
    assert kinds(timeline(conv)) == []


def test_no_stream_end_is_due_before_the_snapshot_with_the_end_seqno_is_complete() -> None:
    """The end seqno is reached mid-snapshot and other streams go on: STREAM_END is not late yet."""
    conv = [*OPEN, ("c2s", req(end=3)), ("s2c", ok()), ("s2c", marker(1, 5)), *[("s2c", mut(i)) for i in (1, 3, 4)]]
    conv += [("c2s", req(vb=1, opaque=0x30)), ("s2c", ok(opaque=0x30))]
    assert kinds(timeline(conv)) == []


def test_twin_a_snapshot_past_the_end_seqno_is_beyond_it() -> None:
    conv = [*OPEN, ("c2s", req(end=3)), ("s2c", ok()), ("s2c", marker(1, 3)), *[("s2c", mut(i)) for i in (1, 2, 3)]]
    conv += [("s2c", marker(4, 6)), ("s2c", mut(4))]
    t = timeline(conv)
    assert kinds(t) == [("beyond end seqno", [3, 10])]
    # the end reached, its snapshot complete, the producer goes on with another stream: STREAM_END is missing
    conv = [*OPEN, ("c2s", req(end=3)), ("s2c", ok()), ("s2c", marker(1, 3)), *[("s2c", mut(i)) for i in (1, 3)]]
    conv += [("c2s", req(vb=1, opaque=0x30)), ("s2c", ok(opaque=0x30))]
    assert kinds(timeline(conv)) == [("stream never ended", [3])]


# --- change-stream backfills: a NoHistory marker, then a History marker with the same end ----------------------


def test_a_change_stream_backfill_sends_two_markers_with_the_same_end() -> None:
    """kv_engine active_stream.cc markDiskSnapshot: NoHistoryPrecedingHistory then History, one range; duplicates in the History part."""
    conv = [*OPEN, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 10, DISK | CHK)), ("s2c", mut(2, "a")), ("s2c", mut(4, "b"))]
    conv += [("s2c", marker(5, 10, DISK | CHK | HIST | DUPS)), ("s2c", mut(6, "c")), ("s2c", mut(8, "c")), ("s2c", mut(10, "a"))]
    t = timeline(conv)
    assert kinds(t) == [] and [sn.complete for sn in t.streams[0].snapshots] == [False, True]


def test_twin_two_markers_with_the_same_end_and_no_history_flag() -> None:
    conv = [
        *OPEN,
        ("c2s", req()),
        ("s2c", ok()),
        ("s2c", marker(1, 10, DISK)),
        ("s2c", mut(2)),
        ("s2c", marker(5, 10, DISK)),
        ("s2c", mut(6)),
    ]
    assert kinds(timeline(conv)) == [("snapshot never completed", [5, 7])]


# --- SET_VBUCKET_STATE carries no stream id --------------------------------------------------------------------


def test_set_vbucket_state_has_no_stream_id_on_a_stream_id_connection() -> None:
    """kv_engine response.h SetVBucketState: no sid, on any connection (a takeover stream's end of data)."""
    sid_req = encode(
        "DCP_STREAM_REQ",
        extras={"flags": int(StreamReqFlag.TAKEOVER), "start_seqno": 0, "end_seqno": MAX_SEQNO},
        value={"sid": 1},
        opaque=0x10,
    )
    conv = [*OPEN, *STREAM_IDS, ("c2s", sid_req), ("s2c", ok()), ("s2c", marker(1, 2, MEM | int(SnapshotFlag.ACK), sid=1))]
    conv += [("s2c", mut(1, sid=1)), ("s2c", mut(2, sid=1)), ("c2s", encode("DCP_SNAPSHOT_MARKER", response=True, opaque=0x10))]
    conv += [("s2c", encode("DCP_SET_VBUCKET_STATE", extras={"state": 3}, opaque=0x10))]
    conv += [("c2s", encode("DCP_SET_VBUCKET_STATE", response=True, opaque=0x10)), ("s2c", end(StreamEndStatus.OK, sid=1))]
    t = timeline(conv)
    assert kinds(t) == [] and (t.streams[0].end or {}).get("name") == "OK"


def test_twin_a_mutation_without_its_stream_id() -> None:
    sid_req = encode("DCP_STREAM_REQ", extras={"start_seqno": 0, "end_seqno": MAX_SEQNO}, value={"sid": 1}, opaque=0x10)
    conv = [*OPEN, *STREAM_IDS, ("c2s", sid_req), ("s2c", ok()), ("s2c", marker(1, 2, sid=1)), ("s2c", mut(1))]
    assert ("stream id missing", [8]) in kinds(timeline(conv))


# --- the rollback replay: purge_seqno strings, FromLatest, the rule itself -------------------------------------


def marker_v22(start: int, end: int, purge: int, opaque: int = 0x10) -> bytes:
    value = {"start_seqno": start, "end_seqno": end, "flags": DISK, "purge_seqno": purge}
    return encode("DCP_SNAPSHOT_MARKER", extras={"version": 2}, value=value, opaque=opaque)


def purge_story(purge_value: Any) -> Conv:
    """A first stream shows purge seqno 23 (a v2.2 disk marker); a resume with ``purge_value`` rolls back to 5, where history diverged."""
    log = [(0xBB, 5), (0xAA, 0)]
    resume = req(opaque=0x11, start=10, uuid=0xAA, value={"purge_seqno": purge_value})
    return [
        *hello(int(Feature.COLLECTIONS)),
        *OPEN,
        ("c2s", req()),
        ("s2c", ok(log)),
        ("s2c", marker_v22(0, 30, 23)),
        ("s2c", mut(30)),
        ("s2c", end()),
        ("c2s", resume),
        ("s2c", rollback(5, opaque=0x11)),
    ]


def test_a_purge_seqno_string_feeds_the_rollback_replay() -> None:
    """kv_engine vbucket_filter.cc reads purge_seqno as a string: equal to the purge seqno, it waives the purge rollback."""
    a = timeline(purge_story("23")).streams[-1].attempts[0]
    assert (a.outcome, a.rollback_seqno, a.predicted) == ("rollback", 5, 5)
    assert a.explanation.startswith("history diverged"), a.explanation


def test_twin_another_purge_seqno_leaves_the_rollback_unexplained() -> None:
    """With purge_seqno "22" (not the producer's 23) the rule predicts a rollback to 0: the observed 5 is not explained."""
    a = timeline(purge_story("22")).streams[-1].attempts[0]
    assert a.predicted == 0 and "the rule predicts a rollback to 0" in a.explanation


def seqnos(high: int, opaque: int = 0x40) -> Conv:
    return [
        ("c2s", encode("GET_ALL_VB_SEQNOS", opaque=opaque)),
        ("s2c", encode("GET_ALL_VB_SEQNOS", response=True, value=[{"vbucket": 0, "high_seqno": high}], opaque=opaque)),
    ]


def from_latest_story(flags: int) -> Conv:
    """High seqno 9, log [0xBB@5, 0xAA@0]; a request from 0 with uuid 0xAA rolls back to 5."""
    log = [(0xBB, 5), (0xAA, 0)]
    return [
        *OPEN,
        *seqnos(9),
        ("c2s", encode("DCP_GET_FAILOVER_LOG", opaque=0x41)),
        (
            "s2c",
            encode(
                "DCP_GET_FAILOVER_LOG", response=True, opaque=0x41, value={"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in log]}
            ),
        ),
        ("c2s", req(start=0, uuid=0xAA, flags=flags)),
        ("s2c", rollback(5)),
    ]


def test_a_from_latest_request_starts_at_the_high_seqno_in_the_replay() -> None:
    """kv_engine producer.cc: FromLatest sets start and snapshot to the high seqno before the rollback check."""
    a = timeline(from_latest_story(int(StreamReqFlag.FROM_LATEST))).streams[0].attempts[0]
    assert (a.rollback_seqno, a.predicted) == (5, 5) and a.explanation.startswith("history diverged"), a.explanation


def test_twin_the_same_request_without_from_latest_cannot_roll_back() -> None:
    a = timeline(from_latest_story(0)).streams[0].attempts[0]
    assert a.predicted is None and "predicts no rollback" in a.explanation


RULE_CASES = [
    # (log newest first, high, purge, start, snap, uuid, flags, client purge string or None)
    ([(0xAA, 0)], 10, 0, 3, (1, 4), 0xAA, 0, None),
    ([(2222, 3), (1111, 0)], 10, 0, 3, (1, 4), 1111, 0, None),
    ([(2222, 3), (1111, 0)], 10, 0, 3, (3, 3), 1111, 0, None),
    ([(0xAA, 0)], 40, 20, 5, (5, 5), 0xAA, 0, None),
    ([(0xAA, 0)], 40, 20, 5, (5, 5), 0xAA, int(StreamReqFlag.IGNORE_PURGED_TOMBSTONES), None),
    ([(0xAA, 0)], 40, 20, 5, (5, 5), 0xAA, 0, "20"),
    ([(0xAA, 0)], 40, 20, 0, (0, 0), 0xBB, int(StreamReqFlag.STRICT_VB_UUID), None),
    ([(0xCC, 30), (0xBB, 12), (0xAA, 0)], 40, 0, 20, (15, 25), 0xBB, 0, None),
    ([(0xCC, 30), (0xBB, 12), (0xAA, 0)], 40, 0, 20, (20, 25), 0xBB, 0, None),
    ([(0xCC, 30), (0xBB, 12), (0xAA, 0)], 40, 0, 25, (15, 25), 0xBB, 0, None),
    ([(0xBB, 5), (0xAA, 0)], 9, 0, 0, (0, 0), 0xAA, int(StreamReqFlag.FROM_LATEST), None),
    ([(0xAA, 0)], 10, 0, 3, (1, 4), 0xDD, 0, None),
    ([(0xAA, 0)], 10, 0, 8, (6, 14), 0xAA, 0, None),
    ([(0xCC, 30), (0xBB, 12), (0xAA, 0)], 40, 0, 15, (10, 15), 0xAA, 0, None),
    ([(0xAA, 0)], 40, 20, 5, (5, 5), 0xAA, 0, "19"),
]


@pytest.mark.parametrize("case", RULE_CASES, ids=[str(i) for i in range(len(RULE_CASES))])
def test_the_replay_is_the_rule(case: tuple[Any, ...]) -> None:
    """With the high and purge seqnos shown on the wire, the replay predicts exactly what rules.rollback_decision decides."""
    log, high, purge, start, snap, uuid, flags, client = case
    value = {"purge_seqno": client} if client is not None else None
    fl = [("c2s", encode("DCP_GET_FAILOVER_LOG", opaque=0x41))]
    fl += [
        (
            "s2c",
            encode(
                "DCP_GET_FAILOVER_LOG", response=True, opaque=0x41, value={"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in log]}
            ),
        )
    ]
    shown = [
        ("c2s", req(opaque=0x50)),
        ("s2c", ok(log, opaque=0x50)),
        ("s2c", marker_v22(0, 1, purge, opaque=0x50)),
        ("s2c", end(0, opaque=0x50)),
    ]
    if flags & StreamReqFlag.FROM_LATEST:
        s = ss = se = high
        u = uuid or log[0][0]
    else:
        s, (ss, se), u = start, snap, uuid
    d = rollback_decision(
        start=s,
        snap_start=ss,
        snap_end=se,
        vb_uuid=u,
        flags=flags,
        failover_log=log,
        high_seqno=high,
        purge_seqno=purge,
        client_purge_seqno=int(client or 0),
    )
    answer = rollback(d.seqno, opaque=0x11) if d.rollback else ok(log, opaque=0x11)
    conv = [*hello(int(Feature.COLLECTIONS)), *OPEN, *seqnos(high), *fl, *shown]
    conv += [("c2s", req(opaque=0x11, start=start, snap=snap, uuid=uuid, flags=flags, value=value)), ("s2c", answer)]
    t = timeline(conv)
    a = t.streams[-1].attempts[-1]
    if not d.rollback:
        assert a.outcome == "success"
        return
    assert (a.outcome, a.predicted) == ("rollback", d.seqno), a.explanation
    assert a.explanation.startswith(hex_uuids(d.reason, [u])), (a.explanation, d.reason)


# --- flow control: cache-transfer-end counts 24 bytes; acks beyond what was received ---------------------------


def cache_transfer(sid: int) -> Conv:
    record = struct.pack(">QQQIIIHBB", 7, 3, 1, 1, 0, 0, 2, 0, 1) + b"\x00k" + b"v"
    return [
        ("s2c", encode("DCP_CACHE_TRANSFER", value=record, opaque=0x10, stream_id=sid)),
        ("s2c", encode("DCP_CACHE_TRANSFER_END", opaque=0x10, stream_id=sid)),
    ]


def ack(n: int) -> tuple[str, bytes]:
    return ("c2s", encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": n}))


def test_cache_transfer_end_counts_24_bytes_with_a_stream_id() -> None:
    """kv_engine response.h CacheTransferToActiveStreamResponse: sizeof(Request), the sid frame not counted."""
    sid_req = encode(
        "DCP_STREAM_REQ",
        extras={"flags": int(StreamReqFlag.CACHE_TRANSFER), "start_seqno": 3, "end_seqno": 3},
        value={"sid": 1},
        opaque=0x10,
    )
    frames = cache_transfer(1)
    end_raw = frames[1][1]
    assert len(end_raw) == 27 and flow_control_size(end_raw[0], end_raw[1], len(end_raw)) == 24
    received = len(frames[0][1]) + 24
    base = [*OPEN, *control("connection_buffer_size", "1000", 5), *STREAM_IDS, ("c2s", sid_req), ("s2c", ok())]
    t = timeline([*base, *frames, ack(received)])
    assert kinds(t) == [] and [f.size for f in t.flow if f.event == "sent"][-1] == 24 and t.flow[-1].outstanding == 0
    # twin: the wire length (27) acknowledged is 3 bytes beyond what the producer charged
    t = timeline([*base, *frames, ack(received + 3), ("s2c", end(0, sid=1))])
    assert kinds(t) == [("ack beyond bytes received", [len(base) + 3])]


def test_an_ack_of_exactly_what_was_received_is_fine() -> None:
    conv = [*OPEN, *control("connection_buffer_size", "1000", 5), ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 2)), ("s2c", mut(1))]
    received = 44 + len(mut(1))
    conv += [ack(received), ("s2c", mut(2)), ack(len(mut(2)))]
    assert kinds(timeline(conv)) == []


def test_twin_an_ack_beyond_what_was_received() -> None:
    """A consumer that acknowledges 300 bytes after receiving 283 (kv_engine BufferLog::release warns of it)."""
    conv = [*OPEN, *control("connection_buffer_size", "1000", 5), ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 9))]
    conv += [("s2c", mut(i)) for i in (1, 2, 3)]
    received = 44 + sum(len(mut(i)) for i in (1, 2, 3))
    conv += [ack(received + 17), ("s2c", mut(4))]
    t = timeline(conv)
    assert kinds(t) == [("ack beyond bytes received", [len(conv) - 1])]
    assert f"{received + 17} bytes with {received} received" in t.anomalies[0].message
    # with nothing sent after the ack, it is told at the end of input
    assert kinds(timeline(conv[:-1])) == [("ack beyond bytes received", [len(conv) - 1])]


def test_an_ack_captured_before_data_sent_before_it_is_no_anomaly() -> None:
    """A capture may put an ack before the data it acknowledges (their timestamps say the data was sent first)."""
    conv = [*OPEN, *control("connection_buffer_size", "1000", 5), ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 9))]
    recs = records([*conv, ack(44 + len(mut(1))), ("s2c", mut(1)), ("s2c", mut(2))])
    n = len(conv) + 1  # the ack
    recs[n] = recs[n]._replace(ts=recs[n - 1].ts - 1)  # mut(1) was sent before the ack was captured
    t = build_timeline(recs)
    assert kinds(t) == []


# --- keys twice in one snapshot --------------------------------------------------------------------------------


def test_a_key_twice_in_a_snapshot_is_a_dedup_violation() -> None:
    """kv_engine snapshot-marker.md: a snapshot holds each key once, unless marked MayContainDuplicates or History."""
    conv = [*OPEN, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 5, DISK)), ("s2c", mut(2, "airline_10")), ("s2c", mut(4, "airline_10"))]
    t = timeline(conv)
    assert kinds(t) == [("key twice in snapshot", [6, 7])] and "'airline_10'" in t.anomalies[0].message


@pytest.mark.parametrize("flags", [DISK | DUPS, DISK | HIST, DISK | HIST | DUPS], ids=["may-contain-duplicates", "history", "both"])
def test_twin_duplicates_where_the_marker_allows_them(flags: int) -> None:
    conv = [*OPEN, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 5, flags)), ("s2c", mut(2, "a")), ("s2c", mut(4, "a"))]
    assert kinds(timeline(conv)) == []


def test_the_dedup_check_holds_a_bounded_number_of_keys_per_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys remembered for the check are bounded for all streams together; a snapshot that ends gives its budget back."""
    monkeypatch.setattr(timeline_core, "MAX_CONN_SNAPSHOT_KEYS", 6)

    def m(vb: int, seqno: int, key: str) -> tuple[str, bytes]:
        extras = {"by_seqno": seqno, "rev_seqno": 1}
        return ("s2c", encode("DCP_MUTATION", extras=extras, key=key, value=b"v", vbucket=vb, opaque=0x10 + vb, cas=seqno))

    conv: Conv = [*OPEN]
    for vb in (0, 1):
        conv += [("c2s", req(vb, opaque=0x10 + vb)), ("s2c", ok(opaque=0x10 + vb))]
        snap = {"start_seqno": 1, "end_seqno": 4 if vb == 0 else 99, "flags": DISK}
        conv += [("s2c", encode("DCP_SNAPSHOT_MARKER", extras=snap, vbucket=vb, opaque=0x10 + vb))]
    for seqno in range(1, 5):  # vb 0 holds 4 keys, vb 1 gets the 2 left
        conv += [m(0, seqno, f"a{seqno}"), m(1, seqno, f"b{seqno}")]
    conv += [m(1, 5, "b4")]  # b4 was not remembered: not checked
    conv += [m(1, 6, "b1")]  # b1 was: flagged
    t = timeline(conv)
    assert [(a.kind, a.message.split(" delivered")[0]) for a in t.anomalies] == [("key twice in snapshot", "key 'b1'")]
    # vb 0's snapshot ends (a new marker): its 4 keys make room, so vb 1's next keys are remembered again
    conv += [("s2c", encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 5, "end_seqno": 9, "flags": MEM}, vbucket=0, opaque=0x10))]
    conv += [m(1, 7, "b7"), m(1, 8, "b7")]
    (dup,) = timeline(conv).anomalies  # repeats on a stream merge into one anomaly with all their frames
    assert dup.kind == "key twice in snapshot" and dup.frames[-2:] == [len(conv) - 1, len(conv)]


def test_keys_in_other_snapshots_collections_and_namespaces_are_not_duplicates() -> None:
    """Two snapshots, the same name in two collections (with collections the key carries its collection id), a prepare and its commit."""
    prepare = encode("DCP_PREPARE", extras={"by_seqno": 6, "rev_seqno": 1, "durability_level": 1}, key=b"\x00p", value=b"v", opaque=0x10)
    commit = encode("DCP_COMMIT", extras={"prepared_seqno": 6, "commit_seqno": 7}, key=b"\x00p", opaque=0x10)
    conv = [*hello(int(Feature.COLLECTIONS)), *OPEN, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 3)), ("s2c", mut(3, b"\x00a"))]
    conv += [("s2c", marker(4, 7)), ("s2c", mut(4, b"\x00a")), ("s2c", mut(5, b"\x08a")), ("s2c", prepare), ("s2c", commit)]
    assert kinds(timeline(conv)) == []
    # twin: the same collection and key twice in one snapshot, named with its collection
    conv += [("s2c", marker(8, 9)), ("s2c", mut(8, b"\x08a")), ("s2c", mut(9, b"\x08a"))]
    t = timeline(conv)
    assert kinds(t) == [("key twice in snapshot", [len(conv) - 1, len(conv)])] and "cid 0x8 'a'" in t.anomalies[0].message


# --- what a stream end means to the consumer -------------------------------------------------------------------


@pytest.mark.parametrize("status", list(StreamEndStatus), ids=[s.name for s in StreamEndStatus])
def test_the_end_action_reads_the_session_sets(status: StreamEndStatus) -> None:
    t = timeline([*OPEN, ("c2s", req()), ("s2c", ok()), ("s2c", end(int(status)))])
    want = "stop" if status in STREAM_END_NORMAL else "re-request" if status in STREAM_END_REREQUEST else "unexpected"
    assert t.streams[0].end_action == want
    assert (t.streams[0].end_action == "unexpected") == (status == StreamEndStatus.DISCONNECTED)  # never on the wire


def test_an_ok_end_inside_a_snapshot_of_a_legacy_client_may_be_lost_privileges() -> None:
    """kv_engine producer.cc mapEndStreamStatus: a client without collections gets FilterEmpty / LostPrivileges as OK."""
    conv = [*OPEN, ("c2s", req()), ("s2c", ok()), ("s2c", marker(1, 5)), ("s2c", mut(1)), ("s2c", end(0))]
    (a,) = timeline(conv).anomalies
    assert a.kind == "snapshot never completed" and a.uncertain and "LostPrivileges" in a.message
    # twin: with collections the OK means OK
    (a,) = timeline([*hello(int(Feature.COLLECTIONS)), *conv]).anomalies
    assert a.kind == "snapshot never completed" and not a.uncertain


# --- requests answered several times, not at all, or by a closed connection; pipelined requests -----------------


def stat(group: str, opaque: int, *stats: tuple[str, str]) -> Conv:
    out: Conv = [("c2s", encode("STAT", key=group, opaque=opaque))]
    out += [("s2c", encode("STAT", response=True, key=k, value=v.encode(), opaque=opaque)) for k, v in stats]
    return [*out, ("s2c", encode("STAT", response=True, opaque=opaque))]


def test_stat_answers_with_one_response_per_stat_and_an_empty_one() -> None:
    t = timeline([*stat("dcp", 7, ("ep_dcp_count", "1"), ("ep_dcp_items_sent", "0")), *stat("", 8, ("pid", "1"))])
    assert kinds(t) == []


def test_twin_a_stat_response_after_its_end() -> None:
    conv = [*stat("dcp", 7, ("a", "1")), ("s2c", encode("STAT", response=True, key="b", value=b"2", opaque=7))]
    assert kinds(timeline(conv)) == [("response without request", [4])]


def test_quit_is_answered_or_the_connection_closes() -> None:
    quit_ = encode("QUIT", opaque=9)
    assert kinds(timeline([*hello(), ("c2s", quit_), ("s2c", encode("QUIT", response=True, opaque=9))])) == []
    # the server closed first (the capture shows its FIN, or a last frame): not a request never answered
    assert kinds(timeline([*hello(), ("c2s", quit_), ("s2c", encode("NOOP", response=True, opaque=1))])) == [
        ("response without request", [4])
    ]
    assert kinds(timeline([("c2s", encode("QUITQ", opaque=9)), *hello(opaque=2)])) == []


def test_quiet_commands_are_answered_only_when_they_have_something_to_say() -> None:
    getq = [("c2s", encode("GETQ", key="a", opaque=5)), ("c2s", encode("GETQ", key="b", opaque=6)), ("c2s", encode("NOOP", opaque=7))]
    hit = ("s2c", encode("GETQ", response=True, extras={"flags": 0}, value=b"v", opaque=6))
    assert kinds(timeline([*getq, hit, ("s2c", encode("NOOP", response=True, opaque=7))])) == []
    # twin: a plain GET left unanswered while the server answered the next request
    conv = [("c2s", encode("GET", key="a", opaque=5)), ("c2s", encode("NOOP", opaque=7)), ("s2c", encode("NOOP", response=True, opaque=7))]
    assert kinds(timeline(conv)) == [("request never answered", [1])]


def test_pipelined_requests_sharing_an_opaque() -> None:
    """Requests written in one burst before any reply (some clients give them all one opaque): answered in order."""
    burst = [
        ("c2s", encode("HELLO", key="x", value={"features": [{"feature": int(Feature.COLLECTIONS)}]}, opaque=0)),
        ("c2s", encode("SASL_LIST_MECHS", opaque=0)),
        ("c2s", encode("SASL_AUTH", key="PLAIN", value=b"\x00user\x00pass", opaque=0)),
        ("c2s", encode("SELECT_BUCKET", key="default", opaque=0)),
        ("c2s", encode("GET_CLUSTER_CONFIG", opaque=0)),
    ]
    answers = [
        ("s2c", encode("HELLO", response=True, value={"features": [{"feature": int(Feature.COLLECTIONS)}]}, opaque=0)),
        ("s2c", encode("SASL_LIST_MECHS", response=True, value=b"PLAIN", opaque=0)),
        ("s2c", encode("SASL_AUTH", response=True, opaque=0)),
        ("s2c", encode("SELECT_BUCKET", response=True, opaque=0)),
        ("s2c", encode("GET_CLUSTER_CONFIG", response=True, value=b'{"rev":1}', datatype=1, opaque=0)),
    ]
    t = timeline([*burst, *answers])
    assert kinds(t) == [] and t.connections[1].bucket == "default" and t.connections[1].features == ["Collections"]
    # twin: one answer too many
    assert kinds(timeline([*burst, *answers, answers[-1]])) == [("response without request", [11])]


def test_pipelined_stream_requests_and_closes_sharing_an_opaque() -> None:
    """A client closing several streams at once with opaque 0 (the stock client does): each answer finds its request, in order."""
    opened: Conv = []
    for vb in (0, 1):
        opened += [("c2s", req(vb, opaque=0x10 + vb)), ("s2c", ok(opaque=0x10 + vb))]
    closes: Conv = [("c2s", encode("DCP_CLOSE_STREAM", vbucket=vb, opaque=0)) for vb in (0, 1)]
    answers: Conv = [("s2c", encode("DCP_CLOSE_STREAM", response=True, opaque=0)) for _ in (0, 1)]
    t = timeline([*opened, *closes, *answers])
    assert kinds(t) == []
    assert [s.close_answered for s in t.streams] == [7, 8]  # each close answered by its own response, in order
    # twin: a third close response has no request left
    assert kinds(timeline([*opened, *closes, *answers, answers[0]])) == [("response without request", [9])]


# --- the official SDK's bootstrap (two connections), rebuilt as frames -----------------------------------------

SDK_FEATURES = [0x02, 0x0B, 0x0C, 0x0D, 0x0E, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E]


def sdk_connection(bucket: bool, first_vb: int = 14) -> Conv:
    """One connection of the SDK's bootstrap, pipelined as it writes it; the bucket one then SET/GET/DELETE and config polls."""
    agent = '{"a":"python/4.6.3","i":"0000000000000001/0000000000000002"}'
    hello_v = {"features": [{"feature": f} for f in SDK_FEATURES]}
    agreed = {"features": [{"feature": f} for f in (0x0B, 0x0E, 0x12, 0x10, 0x0C, 0x0D)]}
    out: Conv = [
        ("c2s", encode("HELLO", key=agent, value=hello_v, opaque=1)),
        ("c2s", encode("SASL_LIST_MECHS", opaque=2)),
        ("c2s", encode("SASL_AUTH", key="SCRAM-SHA512", value=b"n,,n=Administrator,r=abc", opaque=3)),
        ("s2c", encode("HELLO", response=True, value=agreed, opaque=1)),
        ("s2c", encode("SASL_LIST_MECHS", response=True, value=b"SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN", opaque=2)),
        ("s2c", encode("SASL_AUTH", response=True, status=0x21, value=b"r=abcdef,s=c2FsdA==,i=4096", opaque=3)),
        ("c2s", encode("SASL_STEP", key="SCRAM-SHA512", value=b"c=biws,r=abcdef,p=cHJvb2Y=", opaque=4)),
        ("s2c", encode("SASL_STEP", response=True, value=b"v=c2lnbmF0dXJl", opaque=4)),
    ]
    opaque = 5
    burst: Conv = [("c2s", encode("GET_ERROR_MAP", value={"version": 2}, opaque=opaque))]
    answers: Conv = [("s2c", encode("GET_ERROR_MAP", response=True, value={"version": 2, "errors": {}}, opaque=opaque))]
    if bucket:
        opaque += 1
        burst.append(("c2s", encode("SELECT_BUCKET", key="default", opaque=opaque)))
        answers.append(("s2c", encode("SELECT_BUCKET", response=True, opaque=opaque)))
    opaque += 1
    burst.append(("c2s", encode("GET_CLUSTER_CONFIG", opaque=opaque)))
    answers.append(("s2c", encode("GET_CLUSTER_CONFIG", response=True, value=b'{"rev":1}', datatype=1, opaque=opaque)))
    out += burst + answers
    if not bucket:
        return [*out, ("c2s", encode("NOOP", opaque=opaque + 1)), ("s2c", encode("NOOP", response=True, opaque=opaque + 1))]
    token = {"vb_uuid": 0xA1B2C3D4E5F6, "seqno": 1}
    o = opaque + 1
    out += [
        (
            "c2s",
            encode(
                "SET",
                extras={"flags": 0x02000000, "expiration": 0},
                key=b"\x00k1",
                value=b'{"a": 1}',
                datatype=1,
                vbucket=first_vb,
                opaque=o,
            ),
        ),
        ("s2c", encode("SET", response=True, variant="mutation seqno", extras=token, cas=0x1234, opaque=o)),
        ("c2s", encode("GET", key=b"\x00k1", vbucket=first_vb, opaque=o + 1)),
        ("s2c", encode("GET", response=True, extras={"flags": 0x02000000}, value=b'{"a": 1}', datatype=1, cas=0x1234, opaque=o + 1)),
        ("c2s", encode("COLLECTIONS_GET_ID", value=b"_default.c1", opaque=o + 2)),
        ("s2c", encode("COLLECTIONS_GET_ID", response=True, extras={"manifest_uid": 2, "collection_id": 8}, opaque=o + 2)),
        (
            "c2s",
            encode(
                "SET", extras={"flags": 0x02000000, "expiration": 0}, key=b"\x08k1", value=b"{}", datatype=1, vbucket=first_vb, opaque=o + 3
            ),
        ),
        ("s2c", encode("SET", response=True, variant="mutation seqno", extras={**token, "seqno": 2}, cas=0x1235, opaque=o + 3)),
        ("c2s", encode("DELETE", key=b"\x00k1", vbucket=first_vb, opaque=o + 4)),
        ("s2c", encode("DELETE", response=True, variant="mutation seqno", extras={**token, "seqno": 3}, cas=0x1236, opaque=o + 4)),
    ]
    for poll in range(3):  # GET_CLUSTER_CONFIG every 2.5 s while open
        out += [("c2s", encode("GET_CLUSTER_CONFIG", opaque=o + 5 + poll))]
        out += [("s2c", encode("GET_CLUSTER_CONFIG", response=True, value=b'{"rev":1}', datatype=1, opaque=o + 5 + poll))]
    return out


def write_two_connections(path: Path, a: Conv, b: Conv) -> Path:
    """The cluster connection, then the bucket connection (each from SYN to FIN, 2.5 s between frames of b's polls)."""
    with PcapWriter(path) as w:
        ts = T0
        for port, conv in ((40001, a), (40002, b)):
            tcp = TcpConversation(w, ("10.0.0.1", port), ("10.0.0.2", 11210), mss=1460)
            tcp.open(ts)
            ts += 10_000
            for direction, data in conv:
                ts = tcp.send(direction, data, ts, step_ns=1_000_000)
            tcp.close(ts)
            ts += 1_000_000
    return path


def test_the_official_sdk_bootstrap_raises_no_anomaly(tmp_path: Path) -> None:
    """SDK-shaped traffic: two connections, pipelined HELLO+LIST_MECHS+AUTH, GET_ERROR_MAP+SELECT_BUCKET+GET_CLUSTER_CONFIG,
    collection-prefixed SET/GET/DELETE with mutation tokens, a collection id lookup, config polls (115 of 116 anomalies were false)."""
    path = write_two_connections(tmp_path / "sdk.pcap", sdk_connection(False), sdk_connection(True))
    t = build_timeline(read_records([str(path)]))
    assert len(t.connections) == 2 and kinds(t) == []
    assert {c.bucket for c in t.connections.values()} == {"", "default"}


def test_twin_an_sdk_config_request_left_unanswered(tmp_path: Path) -> None:
    b = sdk_connection(True)
    config = next(i for i, (d, raw) in enumerate(b) if d == "s2c" and raw[1] == 0xB5)
    path = write_two_connections(tmp_path / "sdk.pcap", sdk_connection(False), b[:config] + b[config + 1 :])
    t = build_timeline(read_records([str(path)]))
    assert [str(a.kind) for a in t.anomalies] == ["request never answered"] and "GET_CLUSTER_CONFIG" in t.anomalies[0].message


def test_every_opcode_has_an_exchange() -> None:
    """The exchanges table: STAT goes on until an empty key, quiet commands may stay silent, QUIT may meet a closed connection."""
    from dcpinspect.protocol import spec
    from dcpinspect.protocol.exchanges import Exchange, answered_once, exchange, last_response
    from dcpinspect.protocol.session import STREAM_MESSAGES

    for op, cmd in spec.COMMANDS.items():
        ex = exchange(op)
        if cmd.name == "STAT":
            assert ex is Exchange.MANY
        elif cmd.name in ("QUIT", "QUITQ"):
            assert ex is (Exchange.CLOSE if cmd.name == "QUIT" else Exchange.NONE)
        elif cmd.name.endswith("Q") and not cmd.name.startswith("DCP"):
            assert ex is Exchange.QUIET, cmd.name
        elif op in STREAM_MESSAGES:
            assert ex in (Exchange.NONE, Exchange.ON_ACK_FLAG) or cmd.name == "DCP_SET_VBUCKET_STATE"
        elif cmd.name not in ("DCP_BUFFER_ACKNOWLEDGEMENT", "DCP_SEQNO_ACKNOWLEDGED"):
            assert ex is Exchange.ONE and answered_once(op), cmd.name
    stat = spec.OPCODES["STAT"]
    assert not last_response(stat, status=0, key_length=3) and last_response(stat, status=0, key_length=0)
    assert last_response(stat, status=1, key_length=0) and last_response(spec.OPCODES["GET"], status=0, key_length=3)


def test_the_timelines_flow_table_is_the_rule() -> None:
    """The hot loop charges a*length + b from a table built from flow_control_size: equal to the rule for every case."""
    from dcpinspect.protocol.enums import Magic
    from dcpinspect.protocol.session import STREAM_MESSAGES

    table = timeline_streams.flow_charges()
    assert set(table) == set(STREAM_MESSAGES)
    for op, (a, b) in table.items():
        for magic in (Magic.CLIENT_REQUEST, Magic.ALT_CLIENT_REQUEST):
            for length in (24, 27, 55, 1000, 1 << 20):
                assert a * length + b == flow_control_size(magic, op, length), (op, magic, length)


def test_a_snapshot_pickles_without_the_dedup_checks_keys() -> None:
    """Timeline parts travel between processes (Spark) without the builder's working state."""
    import pickle

    from dcpinspect.timeline.model import Snapshot

    snap = Snapshot(1, 0, 9, DISK, keys={b"k": 3})
    back = pickle.loads(pickle.dumps(snap))
    assert back.keys is None and (back.frame, back.end) == (1, 9) and snap.keys == {b"k": 3}
