"""Per-stream timelines from records: attempts, rollbacks, snapshots, flow control, anomalies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dcpinspect import encode
from dcpinspect.cli import main
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
