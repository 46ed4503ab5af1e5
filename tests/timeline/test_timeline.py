"""Per-stream timelines from records: attempts, rollbacks, snapshots, flow control, anomalies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import ROOT

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.capture.read import read_records
from dcpinspect.cli.main import main
from dcpinspect.flows.records import Record
from dcpinspect.flows.session import FRESH
from dcpinspect.tables.timeline import story, timeline_frames
from dcpinspect.timeline import MAX_SEQNO, TimelineBuilder, build_timeline
from dcpinspect.wire.events import Frame

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


def item(seqno: int, key: str, opaque: int = 0x10) -> bytes:
    """A mutation of ``key`` itself (``mut`` makes a key per seqno)."""
    return encode("DCP_MUTATION", extras={"by_seqno": seqno, "rev_seqno": 1}, key=key, value=b"v", opaque=opaque, cas=seqno)


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
    told = False
    for r in rest:
        if r.number > items[-1].number and not told:
            b.observe_seqno(0, 6)
            b.observe_seqno(0, 3)  # lower: no effect
            told = True
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
    """kv_engine docs/dcp/documentation/commands/snapshot-marker.md: a marker start below the first delivered seqno, memory/disk switches, seqno-advanced."""
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
        lines = [json.loads(line) for line in out.splitlines()]
        (loss,) = [x["rollback_loss"] for x in lines if "rollback_loss" in x]
        assert (loss["rollback_seqno"], loss["items"]) == (0, 0)  # a rollback to 0 before anything was received cost nothing
        header, stream, tree = [x for x in lines if "rollback_loss" not in x]
        assert header["connection"]["conn"] == 1 and header["connection"]["file"] == str(SEED000)
        assert header["connection"]["capture_set"] == 1
        assert [a["outcome"] for a in stream["attempts"]] == ["rollback", "success"]
        assert stream["attempts"][0]["rollback_seqno"] == 0 and len(tree["branches"]) == 4
        assert (tree["vbucket"], tree["capture_set"], tree["history"]) == (0, 1, 1)
    else:
        assert "ROLLBACK to 0" in out


def test_cli_json_has_connection_level_anomalies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = session(tmp_path / "stray.pcap", [("s2c", encode("DCP_NOOP", response=True, opaque=9))])
    assert main(["timeline", "--no-progress", "--json", str(path)]) == 0
    objs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [next(iter(o)) for o in objs] == ["connection", "anomaly"]
    assert objs[1]["anomaly"]["kind"] == "response without request" and objs[1]["anomaly"]["conn"] == objs[0]["connection"]["conn"]


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
    # the snapshot that contains the end seqno is sent whole (see test_server_behaviour.py); one after it is beyond the end
    "beyond end seqno": (
        [
            ("c2s", req(start=0, end_seqno=3)),
            ("s2c", ok([(1, 0)])),
            ("s2c", marker(1, 3)),
            ("s2c", mut(3)),
            ("s2c", marker(4, 5)),
            ("s2c", mut(4)),
        ],
        [3, 8],
    ),
    "key twice in snapshot": ([*OPEN, ("s2c", marker(1, 5, flags=2)), ("s2c", item(1, "a")), ("s2c", item(2, "a"))], [6, 7]),
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
    """kv_engine docs/dcp/documentation/commands/control.md: with send_stream_end_on_client_close_stream the STREAM_END(Closed) follows the close response."""
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
    """kv_engine docs/dcp/documentation/commands/oso_snapshot.md: items between OSO start and end come in key order with no marker; a SEQNO_ADVANCED may follow."""
    oso = [("s2c", encode("DCP_OSO_SNAPSHOT", extras={"flags": f}, opaque=0x10)) for f in (1, 2)]
    conv = [*bootstrap(), *OPEN, oso[0], ("s2c", mut(3)), ("s2c", mut(1)), ("s2c", mut(2)), oso[1]]
    conv += [("s2c", encode("DCP_SEQNO_ADVANCED", extras={"seqno": 5}, opaque=0x10)), ("s2c", marker(6, 6)), ("s2c", mut(6))]
    t = build_timeline(read_records([str(session(tmp_path / "o.pcap", conv))]))
    assert t.anomalies == []
    assert [i.seqno for i in t.streams[0].items] == [3, 1, 2, 5, 6]


def test_acks_seen_before_the_data_are_credited(tmp_path: Path) -> None:
    """An ack captured before the bytes it acknowledges is an ack beyond what was received (a consumer bug, or directions
    reordered by the capture); the excess is credited, so what follows is no overrun, and later overruns are uncertain."""
    m = mut(1)
    conv = [*bootstrap(buffer=len(m) + 10), *OPEN, ("s2c", marker(1, 9))]
    conv += [("c2s", encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 500}))]
    conv += [("s2c", mut(i)) for i in range(1, 6)]
    t = build_timeline(read_records([str(session(tmp_path / "r.pcap", conv))]))
    assert [(a.kind, a.frames) for a in t.anomalies] == [("ack beyond bytes received", [8])]
    conv += [("s2c", mut(i)) for i in range(6, 20)]  # now well past the window: reported, but uncertain
    t = build_timeline(read_records([str(session(tmp_path / "r2.pcap", conv))]))
    over = [a for a in t.anomalies if a.kind == "flow-control overrun"]
    assert over and all(a.uncertain for a in over)


def test_stream_end_in_flight_at_capture_end_is_not_an_anomaly(tmp_path: Path) -> None:
    conv = [*bootstrap(), ("c2s", req(start=0, end_seqno=1)), ("s2c", ok([(1, 0)])), ("s2c", marker(1, 1)), ("s2c", mut(1))]
    t = build_timeline(read_records([str(session(tmp_path / "e.pcap", conv))]))
    assert t.anomalies == []


# --- messages in unexpected orders (captures that start mid-stream, loss, reordering) ---------------------------


def records(*frames: tuple[str, bytes], conn: int = 1) -> list[Record]:
    """Records of hand-built frames on one connection, numbered from 1 (what a capture of them would give)."""
    return [Record(n, "f", conn, "c", d, T0 + n, T0 + n, n, n, Frame(0, raw), FRESH) for n, (d, raw) in enumerate(frames, 1)]


MID_STREAM = {
    "mutation": mut(1),
    "marker": marker(1, 5),
    "deletion": encode("DCP_DELETION", extras={"by_seqno": 1, "rev_seqno": 1}, key="k", opaque=0x10),
    "seqno advanced": encode("DCP_SEQNO_ADVANCED", extras={"seqno": 3}, opaque=0x10),
    "oso snapshot": encode("DCP_OSO_SNAPSHOT", extras={"flags": 1}, opaque=0x10),
    "system event": encode("DCP_SYSTEM_EVENT", extras={"by_seqno": 2, "event": 0, "version": 0}, key="c", opaque=0x10),
}


@pytest.mark.parametrize("first", MID_STREAM)
def test_data_before_the_stream_request_is_a_stream_followed_from_mid_way(first: str) -> None:
    """A stream message for a vbucket before its STREAM_REQ on the connection (IndexError before the fix)."""
    t = build_timeline(records(("s2c", MID_STREAM[first]), ("c2s", req(start=0)), ("s2c", ok([(1, 0)])), ("s2c", marker(1, 2))))
    mid, new = t.streams
    assert (mid.segment, mid.attempts, new.segment) == (0, [], 1)
    (a,) = new.attempts
    assert (a.frame, a.outcome, a.response_frame) == (2, "success", 3)
    assert [sn.frame for sn in new.snapshots] == [4]  # the request's opaque now leads to the new segment
    kinds = [(x.kind, x.frames) for x in t.anomalies]
    assert kinds == [("no stream request", [1]), ("stream already open", [1, 2])]
    assert "mid-way" in t.anomalies[1].message
    assert "(stream request not captured)" in story(t)
    timeline_frames(t)


def test_data_before_the_stream_request_with_stream_ids() -> None:
    sid = [
        ("c2s", encode("DCP_CONTROL", key="enable_stream_id", value=b"true", opaque=3)),
        ("s2c", encode("DCP_CONTROL", response=True, opaque=3)),
    ]
    m = encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="k", value=b"v", opaque=0x10, stream_id=7)
    r = encode("DCP_STREAM_REQ", extras={"end_seqno": MAX_SEQNO}, value={"sid": 7}, opaque=0x10)
    t = build_timeline(records(*sid, ("s2c", m), ("c2s", r), ("s2c", ok([(1, 0)]))))
    assert [(s.stream_id, s.segment, len(s.attempts)) for s in t.streams] == [(7, 0, 0), (7, 1, 1)]
    assert t.streams[1].attempts[0].outcome == "success"


def test_unexpected_orders_never_raise_and_are_told() -> None:
    """Answers before requests, ends and closes before anything, acks before the open: anomalies, no exceptions."""
    close = encode("DCP_CLOSE_STREAM", opaque=0x20)
    close_ok = encode("DCP_CLOSE_STREAM", response=True, opaque=0x20)
    ack = encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 100})
    t = build_timeline(
        records(
            ("c2s", ack),  # an ack before the open and any data
            ("s2c", ok([(1, 0)])),  # the answer before its request
            ("s2c", close_ok),  # a close answered before it was asked
            ("s2c", end(opaque=0x10)),  # a stream end before the stream
            ("c2s", req(start=0)),  # the request after its answer: a new segment, never answered
            ("c2s", close),  # closing it before any answer (not live: nothing recorded)
            ("c2s", req(start=0, vb=1, opaque=0x30)),
            ("c2s", req(start=0, vb=1, opaque=0x31)),  # a second request for vb 1 before the first is answered
            ("s2c", rollback(0x31, 0)),
            ("s2c", ok([(2, 0)], opaque=0x30)),  # the first one's answer: superseded
            ("s2c", rollback(0x31, 0)),  # twice
            ("s2c", encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 5, "flags": 1}, opaque=0x30, vbucket=1)),
        )
    )
    kinds = [a.kind for a in t.anomalies]
    assert kinds.count("response without request") == 3  # the early answer, the early close answer, the second rollback
    assert "no stream request" in kinds
    vb0 = [s for s in t.streams if s.vbucket == 0]
    assert [(len(s.attempts), s.end is not None) for s in vb0] == [(0, True), (1, False)]
    assert vb0[1].attempts[0].outcome is None and vb0[1].closed_frame is None
    (vb1,) = [s for s in t.streams if s.vbucket == 1]
    assert [(a.frame, a.outcome) for a in vb1.attempts] == [(7, None), (8, "rollback")]
    assert vb1.attempts[1].explanation == "cannot replay the rule: no failover log of this vbucket was seen"


def test_a_close_stream_answer_finds_its_stream() -> None:
    """The answer to a CLOSE_STREAM is recorded on the stream it closed, only while that segment is the live one."""
    close = [("c2s", encode("DCP_CLOSE_STREAM", opaque=0x20)), ("s2c", encode("DCP_CLOSE_STREAM", response=True, opaque=0x20))]
    t = build_timeline(records(("c2s", req(start=0)), ("s2c", ok([(1, 0)])), *close))
    assert (t.streams[0].closed_frame, t.streams[0].close_answered) == (3, 4)
    # a new segment in between: the answer belongs to neither
    t = build_timeline(records(("c2s", req(start=0)), ("s2c", ok([(1, 0)])), close[0], ("c2s", req(start=0, opaque=0x11)), close[1]))
    assert [(s.closed_frame, s.close_answered) for s in t.streams] == [(3, None), (None, None)]


def test_a_log_seen_after_a_rollback_explains_it_at_the_end() -> None:
    """A rollback without any failover log is explained once one turns up (by timeline(); not replayed again after)."""
    log = encode("DCP_GET_FAILOVER_LOG", response=True, opaque=0x12, value={"failover_log": [{"vb_uuid": 0xAA, "vb_seqno": 0}]})
    recs = records(
        ("c2s", req(start=5, vb_uuid=0xBB, opaque=0x11)),
        ("s2c", rollback(0x11, 0)),
        ("c2s", encode("DCP_GET_FAILOVER_LOG", opaque=0x12)),
        ("s2c", log),
    )
    b = TimelineBuilder().feed_all(recs[:2])
    assert b.timeline().streams[0].attempts[0].explanation == "cannot replay the rule: no failover log of this vbucket was seen"
    assert len(b._history.unexplained) == 1
    a = b.feed_all(recs[2:]).timeline().streams[0].attempts[0]
    assert "no common history" in a.explanation and "seen later, at frame 4" in a.explanation
    assert b._history.unexplained == []


# --- cost: linear in the streams of a connection --------------------------------------------------------------


def many_streams(n: int) -> list[Record]:
    """One connection opening ``n`` streams at once (every 8th rolled back and retried), one item each, all closed."""
    frames: list[tuple[str, bytes]] = [("c2s", req(start=0, vb=vb, opaque=0x1000 + vb)) for vb in range(n)]
    for vb in range(n):
        if vb % 8 == 0:
            frames += [("s2c", rollback(0x1000 + vb, 0)), ("c2s", req(start=0, vb=vb, vb_uuid=0xA000 + vb, opaque=0x40000 + vb))]
    frames += [("s2c", ok([(0xA000 + vb, 0)], opaque=(0x40000 if vb % 8 == 0 else 0x1000) + vb)) for vb in range(n)]
    for vb in range(n):
        opaque = (0x40000 if vb % 8 == 0 else 0x1000) + vb
        frames += [("s2c", marker(1, 1, opaque=opaque, vb=vb)), ("s2c", mut(1, opaque=opaque, vb=vb))]
    frames += [("c2s", encode("DCP_CLOSE_STREAM", vbucket=vb, opaque=0x80000 + vb)) for vb in range(n)]
    frames += [("s2c", encode("DCP_CLOSE_STREAM", response=True, opaque=0x80000 + vb)) for vb in range(n)]
    return records(*frames)


def lines_run(recs: list[Record]) -> int:
    """Lines of the timeline package and tables/timeline.py executed building the timeline of ``recs`` and its tables (deterministic)."""
    import sys

    from dcpinspect import timeline
    from dcpinspect.tables import timeline as timeline_tables

    files = {str(p) for p in Path(timeline.__file__).parent.glob("*.py")} | {timeline_tables.__file__}
    count = 0

    def local(frame: object, event: str, arg: object) -> object:
        nonlocal count
        count += event == "line"
        return local

    def tracer(frame: object, event: str, arg: object) -> object:
        return local if frame.f_code.co_filename in files else None  # type: ignore[attr-defined]

    sys.settrace(tracer)
    try:
        t = build_timeline(recs)
        timeline_frames(t, items=False)
    finally:
        sys.settrace(None)
    assert not [a for a in t.anomalies if a.kind != "rollback loop"], t.anomalies[:3]
    return count


def test_work_per_stream_does_not_grow_with_the_streams() -> None:
    """Answers, closes, rollbacks, failover logs: found through indexes, never by a scan of every stream (was quadratic)."""
    small, big = 250, 1000
    per_small, per_big = lines_run(many_streams(small)) / small, lines_run(many_streams(big)) / big
    assert per_big < 1.1 * per_small, (per_small, per_big)


def test_stepper_replays_a_capture_that_starts_mid_stream() -> None:
    """The stepper asks the builder for a timeline after every frame: data before its request no longer crashes it."""
    from dcpinspect.views.stepper import StepperModel

    m = StepperModel(records(("s2c", mut(1)), ("c2s", req(start=0)), ("s2c", ok([(1, 0)])), ("s2c", marker(1, 2))))
    assert len(m) == 4 and m.steps[-1].state["attempts"] == 1


def test_thousands_of_stream_requests_in_flight_are_all_answered() -> None:
    """A consumer asks for every vbucket at once: 5,000 requests before any answer (the oldest 904 were forgotten before)."""
    n = 5000
    recs = records(
        *[("c2s", req(start=0, vb=vb, opaque=0x1000 + vb)) for vb in range(n)],
        *[("s2c", ok([(1, 0)], opaque=0x1000 + vb)) for vb in range(n)],
    )
    t = build_timeline(recs)
    assert [a.kind for a in t.anomalies] == []
    assert all(s.attempts[0].outcome == "success" for s in t.streams) and len(t.streams) == n
