"""Per-stream timelines from records: attempts, rollbacks, snapshots, flow control, anomalies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dcpinspect import encode
from dcpinspect.cli import main
from dcpinspect.decoder import Frame
from dcpinspect.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.records import read_records
from dcpinspect.timeline import MAX_SEQNO, TimelineBuilder, build_timeline
from dcpinspect.timeline_tables import story, timeline_frames

ROOT = Path(__file__).resolve().parent.parent
SEED000 = ROOT / "captures" / "seed-000-rollback-retry.pcap"
T0 = 1_700_000_000_000_000_000


def session(path: Path, c2s_s2c: list[tuple[str, bytes]], *, mss: int = 200) -> Path:
    """Write one connection: a list of (direction, bytes) in order."""
    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210), mss=mss)
        conv.open(T0)
        ts = T0 + 10_000
        for direction, data in c2s_s2c:
            ts = conv.send(direction, data, ts, step_ns=1_000_000)
        conv.close(ts)
    return path


def req(**kw: object) -> bytes:
    extras = {"flags": 0, "reserved": 0, "start_seqno": 0, "end_seqno": MAX_SEQNO, "vb_uuid": 0, "snap_start_seqno": 0, "snap_end_seqno": 0}
    kw = {("start_seqno" if k == "start" else k): v for k, v in kw.items()}
    extras.update({k: v for k, v in kw.items() if k in extras})
    return encode("DCP_STREAM_REQ", extras=extras, vbucket=int(kw.get("vb", 0)), opaque=int(kw.get("opaque", 0x10)))  # type: ignore[call-overload]


def ok(log: list[tuple[int, int]], opaque: int = 0x10) -> bytes:
    return encode("DCP_STREAM_REQ", response=True, opaque=opaque, value={"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in log]})


def marker(start: int, end: int, flags: int = 1, opaque: int = 0x10, vb: int = 0) -> bytes:
    return encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": start, "end_seqno": end, "flags": flags}, opaque=opaque, vbucket=vb)


def mut(seqno: int, opaque: int = 0x10, vb: int = 0, key: str = "k") -> bytes:
    return encode(
        "DCP_MUTATION", extras={"by_seqno": seqno, "rev_seqno": 1}, key=f"{key}{seqno}", value=b"v", opaque=opaque, vbucket=vb, cas=seqno
    )


def bootstrap(buffer: int | None = None) -> list[tuple[str, bytes]]:
    out = [
        ("c2s", encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key="test:conn", opaque=1)),
        ("s2c", encode("DCP_OPEN", response=True, opaque=1)),
    ]
    if buffer is not None:
        out += [
            ("c2s", encode("DCP_CONTROL", key="connection_buffer_size", value=str(buffer).encode(), opaque=2)),
            ("s2c", encode("DCP_CONTROL", response=True, opaque=2)),
        ]
    return out


def test_seed_000_reconstructs_from_its_own_bytes() -> None:
    t = build_timeline(read_records([str(SEED000)]))
    (s,) = t.streams
    first, retry = s.attempts
    assert (first.start, first.uuid, first.outcome, first.rollback_seqno) == (0xFFEEDD, 0xFEEDDECA, "rollback", 0)
    assert (retry.start, retry.outcome) == (0, "success")
    assert retry.failover_log == [(0xFEEDDECA, 21554), (0xDECAFE, 20197908), (0xFEEDFACE, 4), (0xDEADBEEF, 25892)]
    assert [b.uuid for b in t.branches[0]] == [0xDEADBEEF, 0xFEEDFACE, 0xDECAFE, 0xFEEDDECA]
    assert "purge seqno above the start seqno" in first.explanation


def test_stream_story_rollback_retry_snapshots_end(tmp_path: Path) -> None:
    log1 = [(0xAAAA, 0)]
    log2 = [(0xBBBB, 5), (0xAAAA, 0)]
    conv = [
        *bootstrap(),
        ("c2s", req(start=0)),
        ("s2c", ok(log1)),
        ("s2c", marker(0, 3)),
        *[("s2c", mut(i)) for i in (1, 2, 3)],
        ("s2c", marker(4, 8)),
        *[("s2c", mut(i)) for i in (4, 6)],
        ("s2c", encode("DCP_STREAM_END", extras={"status": 2}, opaque=0x10)),
        # a new segment: resume, rolled back (history diverged at 5), retry
        ("c2s", req(start=6, vb_uuid=0xAAAA, snap_start_seqno=4, snap_end_seqno=8, opaque=0x11)),
        ("s2c", encode("DCP_STREAM_REQ", response=True, status=0x23, opaque=0x11, value={"rollback_seqno": 4})),
        ("c2s", encode("DCP_GET_FAILOVER_LOG", vbucket=0, opaque=0x12)),
        (
            "s2c",
            encode(
                "DCP_GET_FAILOVER_LOG", response=True, opaque=0x12, value={"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in log2]}
            ),
        ),
        ("c2s", req(start=4, vb_uuid=0xAAAA, snap_start_seqno=4, snap_end_seqno=4, opaque=0x13)),
        ("s2c", ok(log2, opaque=0x13)),
    ]
    t = build_timeline(read_records([str(session(tmp_path / "s.pcap", conv))]))
    assert [len(s.attempts) for s in t.streams] == [1, 2]
    first, second = t.streams
    assert first.end is not None and first.end["name"] == "StateChanged"
    assert [(sn.start, sn.end, sn.items, sn.complete) for sn in first.snapshots] == [(0, 3, 3, True), (4, 8, 2, False)]
    assert first.last_seqno == 6
    rb, retry = second.attempts
    assert (rb.outcome, rb.rollback_seqno, retry.outcome) == ("rollback", 4, "success")
    # the log then known ([0xAAAA@0]) and seqnos seen up to 6: the rule gives 4 if the high seqno was 6
    assert "high seqno" in rb.explanation and rb.predicted is None
    assert second.segment == 1
    assert t.connections[1].name == "test:conn" and t.connections[1].side == "producer"
    # the branch tree: 0xAAAA from 0, then 0xBBBB from 5
    assert [(b.uuid, b.seqno) for b in t.branches[0]] == [(0xAAAA, 0), (0xBBBB, 5)]
    text = story(t)
    assert "ROLLBACK to 4" in text and "StateChanged" in text
    dfs = timeline_frames(t)
    assert list(dfs["rollbacks"]["rollback_seqno"]) == [4]
    assert dfs["attempts"]["end"].dtype == "UInt64" and int(dfs["attempts"]["end"].iloc[0]) == MAX_SEQNO


def test_observe_seqno_stands_in_for_items_seen_elsewhere(tmp_path: Path) -> None:
    """A builder told the highest seqno seen elsewhere explains a rollback as one that saw the items."""
    conv = [
        *bootstrap(),
        ("c2s", req(start=0)),
        ("s2c", ok([(0xAAAA, 0)])),
        ("s2c", marker(0, 8)),
        *[("s2c", mut(i)) for i in (1, 2, 3, 4, 6)],
        ("s2c", encode("DCP_STREAM_END", extras={"status": 2}, opaque=0x10)),
        ("c2s", req(start=6, vb_uuid=0xAAAA, snap_start_seqno=4, snap_end_seqno=8, opaque=0x11)),
        ("s2c", encode("DCP_STREAM_REQ", response=True, status=0x23, opaque=0x11, value={"rollback_seqno": 4})),
    ]
    records = list(read_records([str(session(tmp_path / "s.pcap", conv))]))
    want = build_timeline(records).streams[1].attempts[0]
    items = [r for r in records if isinstance(r.event, Frame) and r.event.opcode == 0x57]
    rest = [r for r in records if r not in items]
    alone = TimelineBuilder().feed_all(rest).timeline().streams[-1].attempts[0]
    assert alone.explanation != want.explanation  # without the items the replay sees other inputs
    b = TimelineBuilder()
    for r in rest:
        if r.number > items[-1].number and not b._seen_elsewhere:
            b.observe_seqno(0, 6)
            b.observe_seqno(0, 3)  # lower: no effect
        b.feed(r)
    got = b.timeline().streams[-1].attempts[0]
    assert (got.outcome, got.explanation, got.predicted) == (want.outcome, want.explanation, want.predicted)


def test_anomalies(tmp_path: Path) -> None:
    conv = [
        *bootstrap(buffer=100),
        ("c2s", req(start=0)),
        ("s2c", ok([(1, 0)])),
        ("s2c", marker(1, 5)),
        ("s2c", mut(2)),
        ("s2c", mut(2)),  # not increasing
        ("s2c", mut(9)),  # outside the snapshot (and the buffer is long exceeded: overrun)
        ("c2s", req(start=0)),  # a second request while the stream is live
        ("s2c", encode("DCP_NOOP", opaque=77)),  # never answered (while the consumer kept talking)
        ("s2c", encode("DCP_CONTROL", response=True, opaque=99)),  # answers nothing
        ("c2s", encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 10})),
    ]
    t = build_timeline(read_records([str(session(tmp_path / "a.pcap", conv))]))
    kinds = {a.kind for a in t.anomalies}
    assert {
        "seqno not increasing",
        "seqno outside snapshot",
        "stream already open",
        "response without request",
        "flow-control overrun",
        "request never answered",
    } <= kinds
    bad = next(a for a in t.anomalies if a.kind == "seqno outside snapshot")
    assert len(bad.frames) == 2 and not bad.uncertain


def test_in_flight_at_capture_end_is_not_an_anomaly(tmp_path: Path) -> None:
    conv = [
        *bootstrap(),
        ("c2s", req(start=0)),
        ("s2c", ok([(1, 0)])),
        ("s2c", encode("DCP_NOOP", opaque=5)),
        ("c2s", req(start=0, vb=1, opaque=9)),
    ]
    t = build_timeline(read_records([str(session(tmp_path / "f.pcap", conv))]))
    assert t.anomalies == []


def test_legal_cases_raise_nothing(tmp_path: Path) -> None:
    """FACTS §7.2: a marker start below the first delivered seqno, memory/disk switches, seqno-advanced."""
    conv = [
        *bootstrap(),
        ("c2s", req(start=0)),
        ("s2c", ok([(1, 0)])),
        ("s2c", marker(0, 10, flags=2)),  # disk, starts at the requested start
        *[("s2c", mut(i)) for i in (3, 7, 10)],
        ("s2c", marker(11, 15, flags=1)),  # memory
        ("s2c", mut(12)),
        ("s2c", encode("DCP_SEQNO_ADVANCED", extras={"seqno": 15}, opaque=0x10)),
        ("s2c", marker(16, 20, flags=2)),  # back to disk
        ("s2c", mut(20)),
        ("s2c", encode("DCP_STREAM_END", extras={"status": 0}, opaque=0x10)),
    ]
    t = build_timeline(read_records([str(session(tmp_path / "l.pcap", conv))]))
    assert t.anomalies == []
    assert all(sn.complete for sn in t.streams[0].snapshots)


def test_live_equals_bulk(tmp_path: Path) -> None:
    conv = [
        *bootstrap(buffer=1000),
        ("c2s", req(start=0)),
        ("s2c", ok([(1, 0)])),
        ("s2c", marker(1, 3)),
        *[("s2c", mut(i)) for i in (1, 2, 3)],
    ]
    recs = list(read_records([str(session(tmp_path / "b.pcap", conv, mss=7))]))
    b = TimelineBuilder()
    for r in recs:
        b.feed(r)
        b.timeline(final=False)  # asking mid-way changes nothing
    live, bulk = b.timeline(), build_timeline(recs)
    assert [s.as_dict() for s in live.streams] == [s.as_dict() for s in bulk.streams]
    assert [a.as_dict() for a in live.anomalies] == [a.as_dict() for a in bulk.anomalies]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_cli(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["timeline", "--no-progress", str(SEED000)] + (["--json"] if fmt == "json" else [])
    assert main(args) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        stream, tree = (json.loads(line) for line in out.splitlines())
        assert [a["outcome"] for a in stream["attempts"]] == ["rollback", "success"]
        assert stream["attempts"][0]["rollback_seqno"] == 0 and len(tree["branches"]) == 4
    else:
        assert "ROLLBACK to 0" in out


def sid_control() -> list[tuple[str, bytes]]:
    return [
        ("c2s", encode("DCP_CONTROL", key="enable_stream_id", value=b"true", opaque=3)),
        ("s2c", encode("DCP_CONTROL", response=True, opaque=3)),
    ]


def end(status: int = 0, opaque: int = 0x10) -> bytes:
    return encode("DCP_STREAM_END", extras={"status": status}, opaque=opaque)


def rollback(opaque: int, to: int = 0) -> bytes:
    return encode("DCP_STREAM_REQ", response=True, status=0x23, opaque=opaque, value={"rollback_seqno": to})


def noop_interval(seconds: int) -> list[tuple[str, bytes]]:
    return [
        ("c2s", encode("DCP_CONTROL", key="set_noop_interval", value=str(seconds).encode(), opaque=4)),
        ("s2c", encode("DCP_CONTROL", response=True, opaque=4)),
    ]


def timed_session(path: Path, conv: list[tuple[str, bytes | int]]) -> Path:
    """Like :func:`session`; a ``("wait", ns)`` entry moves the clock."""
    with PcapWriter(path) as w:
        tcp = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210), mss=200)
        tcp.open(T0)
        ts = T0 + 10_000
        for direction, data in conv:
            if isinstance(data, int):
                ts += data
            else:
                ts = tcp.send(direction, data, ts, step_ns=1_000_000)
        tcp.close(ts)
    return path


S = 1_000_000_000
OPEN = [("c2s", req(start=0)), ("s2c", ok([(1, 0)]))]  # frames 3, 4 after the two bootstrap frames
# (kind, conversation after bootstrap(), the frames the anomaly names) - frame numbers count from 1 in capture order
ANOMALY_CASES: dict[str, tuple[list[tuple[str, bytes | int]], list[int]]] = {
    "item before marker": ([*OPEN, ("s2c", mut(1))], [5]),
    "after stream end": ([*OPEN, ("s2c", marker(1, 5)), ("s2c", mut(1)), ("s2c", end()), ("s2c", mut(2))], [7, 8]),
    "after close stream": (
        [
            *OPEN,
            ("s2c", marker(1, 5)),
            ("s2c", mut(1)),
            ("c2s", encode("DCP_CLOSE_STREAM", opaque=0x20)),
            ("s2c", encode("DCP_CLOSE_STREAM", response=True, opaque=0x20)),
            ("s2c", mut(2)),
        ],
        [8, 9],
    ),
    "beyond end seqno": ([("c2s", req(start=0, end_seqno=3)), ("s2c", ok([(1, 0)])), ("s2c", marker(1, 5)), ("s2c", mut(4))], [3, 6]),
    "marker goes backwards": ([*OPEN, ("s2c", marker(1, 2)), ("s2c", mut(1)), ("s2c", mut(2)), ("s2c", marker(1, 1))], [5, 8]),
    "marker overlaps": ([*OPEN, ("s2c", marker(1, 2)), ("s2c", mut(1)), ("s2c", mut(2)), ("s2c", marker(2, 2))], [5, 8]),
    "snapshot never completed": ([*OPEN, ("s2c", marker(1, 5)), ("s2c", mut(1)), ("s2c", marker(6, 8))], [5, 7]),
    "no stream request": ([("s2c", marker(1, 5))], [3]),
    "stream never ended": (
        [
            ("c2s", req(start=0, end_seqno=1)),
            ("s2c", ok([(1, 0)])),
            ("s2c", marker(1, 1)),
            ("s2c", mut(1)),
            ("c2s", req(start=0, vb=1, opaque=0x30)),
            ("s2c", ok([(2, 0)], opaque=0x30)),
        ],
        [3],
    ),
    "rollback loop": (
        [("c2s", req(start=5, vb_uuid=9, opaque=o)) if i % 2 == 0 else ("s2c", rollback(o)) for o in (0x11, 0x12, 0x13) for i in (0, 1)],
        [3, 5, 7],
    ),
    "stream id missing": (
        [
            *sid_control(),
            ("c2s", encode("DCP_STREAM_REQ", extras={"end_seqno": MAX_SEQNO}, opaque=0x10, stream_id=1)),
            ("s2c", ok([(1, 0)])),
            ("s2c", marker(1, 5)),
        ],
        [7],
    ),
    "stream id not enabled": (
        [*OPEN, ("s2c", encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 5, "flags": 1}, opaque=0x10, stream_id=1))],
        [5],
    ),
    "sync write with stream ids": (
        [
            *sid_control(),
            ("c2s", encode("DCP_STREAM_REQ", extras={"end_seqno": MAX_SEQNO}, opaque=0x10, stream_id=1)),
            ("s2c", ok([(1, 0)])),
            ("s2c", encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 5, "flags": 1}, opaque=0x10, stream_id=1)),
            (
                "s2c",
                encode(
                    "DCP_PREPARE",
                    extras={"by_seqno": 1, "rev_seqno": 1, "durability_level": 1},
                    key="k",
                    value=b"v",
                    opaque=0x10,
                    stream_id=1,
                ),
            ),
        ],
        [8],
    ),
    "noop answered late": (
        [
            *noop_interval(1),
            ("s2c", encode("DCP_NOOP", opaque=0x40)),
            ("wait", 3 * S),
            ("c2s", encode("DCP_NOOP", response=True, opaque=0x40)),
        ],
        [5, 6],
    ),
    "noop unanswered": (
        [*noop_interval(1), ("s2c", encode("DCP_NOOP", opaque=0x40)), ("wait", 3 * S), ("s2c", encode("DCP_NOOP", opaque=0x41))],
        [5],
    ),
}


@pytest.mark.parametrize("kind", ANOMALY_CASES)
def test_each_anomaly_with_its_frames(kind: str, tmp_path: Path) -> None:
    conv, frames = ANOMALY_CASES[kind]
    t = build_timeline(read_records([str(timed_session(tmp_path / "x.pcap", [*bootstrap(), *conv]))]))
    got = [a for a in t.anomalies if a.kind == kind]
    assert [a.frames for a in got] == [frames], [(a.kind, a.frames, a.message) for a in t.anomalies]
    assert not got[0].uncertain


def test_stream_end_closed_after_close_when_asked_for(tmp_path: Path) -> None:
    """FACTS §6.3: with send_stream_end_on_client_close_stream the STREAM_END(Closed) follows the close response."""
    conv = [
        *bootstrap(),
        ("c2s", encode("DCP_CONTROL", key="send_stream_end_on_client_close_stream", value=b"true", opaque=5)),
        ("s2c", encode("DCP_CONTROL", response=True, opaque=5)),
        *OPEN,
        ("c2s", encode("DCP_CLOSE_STREAM", opaque=0x20)),
        ("s2c", encode("DCP_CLOSE_STREAM", response=True, opaque=0x20)),
        ("s2c", end(status=1)),
    ]
    t = build_timeline(read_records([str(timed_session(tmp_path / "c.pcap", conv))]))  # type: ignore[arg-type]
    assert t.anomalies == [] and t.streams[0].end is not None and t.streams[0].end["name"] == "Closed"
    # without the control the same STREAM_END is beyond what was in flight
    t = build_timeline(
        read_records(
            [str(timed_session(tmp_path / "d.pcap", [c for c in conv if b"send_stream_end" not in c[1] and c[1][1:2] != b"\x5e"]))]
        )
    )  # type: ignore[arg-type]
    assert [a.kind for a in t.anomalies] == ["after close stream"]


def test_oso_items_need_no_marker(tmp_path: Path) -> None:
    """FACTS §6.20: items between OSO start and end come in key order with no marker; a SEQNO_ADVANCED may follow."""
    oso = [("s2c", encode("DCP_OSO_SNAPSHOT", extras={"flags": f}, opaque=0x10)) for f in (1, 2)]
    conv = [*bootstrap(), *OPEN, oso[0], ("s2c", mut(3)), ("s2c", mut(1)), ("s2c", mut(2)), oso[1]]
    conv += [("s2c", encode("DCP_SEQNO_ADVANCED", extras={"seqno": 5}, opaque=0x10)), ("s2c", marker(6, 6)), ("s2c", mut(6))]
    t = build_timeline(read_records([str(session(tmp_path / "o.pcap", conv))]))
    assert t.anomalies == []
    assert [i.seqno for i in t.streams[0].items] == [3, 1, 2, 5, 6]


def test_acks_seen_before_the_data_are_credited(tmp_path: Path) -> None:
    """An ack captured before the bytes it acknowledges (directions reordered) is no overrun; later overruns are uncertain."""
    m = mut(1)
    conv = [*bootstrap(buffer=len(m) + 10), *OPEN, ("s2c", marker(1, 9))]
    conv += [("c2s", encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 500}))]
    conv += [("s2c", mut(i)) for i in range(1, 6)]
    t = build_timeline(read_records([str(session(tmp_path / "r.pcap", conv))]))
    assert [a.kind for a in t.anomalies] == []
    conv += [("s2c", mut(i)) for i in range(6, 20)]  # now well past the window: reported, but uncertain
    t = build_timeline(read_records([str(session(tmp_path / "r2.pcap", conv))]))
    over = [a for a in t.anomalies if a.kind == "flow-control overrun"]
    assert over and all(a.uncertain for a in over)


def test_stream_end_in_flight_at_capture_end_is_not_an_anomaly(tmp_path: Path) -> None:
    conv = [*bootstrap(), ("c2s", req(start=0, end_seqno=1)), ("s2c", ok([(1, 0)])), ("s2c", marker(1, 1)), ("s2c", mut(1))]
    t = build_timeline(read_records([str(session(tmp_path / "e.pcap", conv))]))
    assert t.anomalies == []
