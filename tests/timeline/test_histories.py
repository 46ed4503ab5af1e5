"""Failover histories: never across capture sets, within one only across logs that share an entry.

Hand-built records of several connections (and files), the shipped captures
read as one run with one capture set per file, and a property: a connection's
rollback is explained the same whatever an unrelated capture set interleaves.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from paths import ROOT

from dcpinspect import encode
from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import Record
from dcpinspect.flows.session import FRESH
from dcpinspect.protocol.enums import Status
from dcpinspect.protocol.rules import MAX_SEQNO
from dcpinspect.tables.timeline import story, timeline_frames
from dcpinspect.timeline import Timeline, TimelineBuilder, build_timeline
from dcpinspect.wire.events import Frame

T0 = 1_700_000_000_000_000_000
SEED = "seed-000-rollback-retry.pcap"
Conv = list[tuple[str, bytes]]


def req(opaque: int, start: int = 0, uuid: int = 0, vb: int = 0) -> bytes:
    extras = {"flags": 0, "reserved": 0, "start_seqno": start, "end_seqno": MAX_SEQNO, "vb_uuid": uuid}
    extras |= {"snap_start_seqno": start, "snap_end_seqno": start}
    return encode("DCP_STREAM_REQ", extras=extras, vbucket=vb, opaque=opaque)


def ok(log: list[tuple[int, int]], opaque: int) -> bytes:
    return encode("DCP_STREAM_REQ", response=True, opaque=opaque, value={"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in log]})


def rollback(opaque: int, to: int) -> bytes:
    return encode("DCP_STREAM_REQ", response=True, status=int(Status.ROLLBACK), opaque=opaque, value={"rollback_seqno": to})


def stream(log: list[tuple[int, int]], opaque: int = 0x10) -> Conv:
    """A stream request from 0 whose success carries ``log``."""
    return [("c2s", req(opaque)), ("s2c", ok(log, opaque))]


def recs(*convs: tuple[int, str, Conv]) -> list[Record]:
    """Records of (conn, file, conversation), one conversation after the other, numbered from 1."""
    out: list[Record] = []
    for conn, file, conv in convs:
        for d, raw in conv:
            n = len(out) + 1
            out.append(Record(n, file, conn, f"c{conn}", d, T0 + n, T0 + n, n, n, Frame(0, raw), FRESH))
    return out


def tree(t: Timeline) -> dict[tuple[int, int, int], list[int]]:
    """(set, vbucket, history) -> the uuids of its branches in order of first sight."""
    return {k: [b.uuid for b in bs] for k, bs in t.histories().items()}


def test_two_unrelated_logs_of_a_vbucket_are_two_histories() -> None:
    t = build_timeline(recs((1, "f", stream([(0xA1, 0)])), (2, "f", stream([(0xB2, 5), (0xB1, 0)]))))
    assert tree(t) == {(1, 0, 1): [0xA1], (1, 0, 2): [0xB1, 0xB2]}
    assert [(b.capture_set, b.history) for b in t.branches[0]] == [(1, 1), (1, 2), (1, 2)]  # every branch, tagged
    assert [f for f, _log in t.history_logs[(1, 0, 2)]] == [4]
    assert all(b.cut_frame is None for b in t.branches[0])  # the other history's log cuts nothing
    text = story(t)
    assert "vbucket 0, history 1 failover branches" in text and "vbucket 0, history 2 failover branches" in text
    assert "capture set" not in text  # one set: not named


def test_logs_sharing_an_entry_are_one_history() -> None:
    t = build_timeline(recs((1, "f", stream([(0xA1, 0)])), (2, "f", stream([(0xA2, 7), (0xA1, 0)]))))
    assert tree(t) == {(1, 0, 1): [0xA1, 0xA2]}
    assert "vbucket 0 failover branches (oldest first):" in story(t)  # one history: not named


def test_a_log_sharing_entries_with_two_histories_joins_them() -> None:
    convs = (
        (1, "f", stream([(0xA1, 0)])),
        (2, "f", stream([(0xB2, 9), (0xB1, 0)])),
        (3, "f", stream([(0xC1, 0)])),
        (4, "f", stream([(0xB2, 9), (0xA1, 0)])),  # shares (0xA1, 0) with history 1 and (0xB2, 9) with history 2
    )
    t = build_timeline(recs(*convs))
    assert tree(t) == {(1, 0, 1): [0xA1, 0xB1, 0xB2], (1, 0, 2): [0xC1]}  # numbered 1.. again, in order of first sight
    assert [f for f, _log in t.history_logs[(1, 0, 1)]] == [2, 4, 8]
    # the joined tree is the one a single history would have grown from the same logs in the same order
    cuts = {b.uuid: (b.cut_frame, b.cut_by) for b in t.branches[0]}
    assert cuts[0xA1] == (4, None) and cuts[0xB1] == (8, None) and cuts[0xC1] == (None, None)
    assert t.logs[0] == sorted(t.logs[0], key=lambda e: e[0]) and len(t.logs[0]) == 4


def test_capture_sets_never_share_a_history_even_with_identical_entries() -> None:
    records = recs((1, "a.pcap", stream([(0xA1, 0)])), (2, "b.pcap", stream([(0xA2, 3), (0xA1, 0)])))
    assert tree(build_timeline(records)) == {(1, 0, 1): [0xA1, 0xA2]}
    t = build_timeline(records, {"a.pcap": 1, "b.pcap": 2})
    assert tree(t) == {(1, 0, 1): [0xA1], (2, 0, 1): [0xA1, 0xA2]}
    assert {c.conn: (c.capture_set, c.file) for c in t.connections.values()} == {1: (1, "a.pcap"), 2: (2, "b.pcap")}
    text = story(t)
    assert "vbucket 0, capture set 1 failover branches" in text and "vbucket 0, capture set 2 failover branches" in text
    assert "(capture set 2, b.pcap)" in text
    frames = timeline_frames(t)
    assert all({"capture_set", "file"} <= set(df.columns) for df in frames.values())
    failover = frames["failover"]
    assert failover[["capture_set", "file", "history"]].values.tolist() == [[1, "a.pcap", 1], [2, "b.pcap", 1], [2, "b.pcap", 1]]
    assert frames["attempts"][["conn", "capture_set", "file"]].values.tolist() == [[1, 1, "a.pcap"], [2, 2, "b.pcap"]]


def test_a_rollback_is_judged_against_its_own_history() -> None:
    """Another cluster's log (same set) said nothing of the uuid: once merged, it 'explained' the rollback to 0."""
    mine = [("c2s", req(0x11, start=5, uuid=0xAA)), ("s2c", rollback(0x11, 0)), *stream([(0xAA, 0)], 0x12)]
    alone = build_timeline(recs((2, "f", mine))).streams[0].attempts[0]
    t = build_timeline(recs((1, "f", stream([(0x111, 0)])), (2, "f", mine)))
    a = t.stream(0, conn=2)[0].attempts[0]
    assert "not in the failover log" not in a.explanation
    assert re.sub(r"frame \d+", "frame N", a.explanation) == re.sub(r"frame \d+", "frame N", alone.explanation)
    assert a.predicted == alone.predicted


def test_no_log_of_the_streams_history_is_said_plainly() -> None:
    """Another history without the requested uuid, and no log of the stream's own connection: not read for it."""
    mine = [("c2s", req(0x11, start=5, uuid=0xAA)), ("s2c", rollback(0x11, 0))]
    t = build_timeline(recs((1, "f", stream([(0x111, 0)])), (2, "f", mine)))
    a = t.stream(0, conn=2)[0].attempts[0]
    assert a.explanation.startswith("cannot replay the rule: no failover log of this stream's history was seen")
    assert "vb uuid 0x00000000000000aa is in no log of its capture set" in a.explanation and a.predicted is None
    # a log of another connection that holds the uuid is of the stream's history
    t = build_timeline(recs((1, "f", stream([(0xAA, 0)])), (2, "f", mine)))
    assert "rollback to min(upper=0, snap_start=5)" in t.stream(0, conn=2)[0].attempts[0].explanation


def test_uuids_are_sixteen_hex_digits_in_the_story_and_explanations() -> None:
    mine = [("c2s", req(0x11, start=5, uuid=0xBAD)), ("s2c", rollback(0x11, 0)), *stream([(0xFEEDDECA, 0)], 0x12)]
    t = build_timeline(recs((1, "f", mine)))
    text = story(t)
    assert "uuid 0x0000000000000bad" in text and "0x00000000feeddeca@0" in text
    assert "vb uuid 0x0000000000000bad not in the failover log" in t.streams[0].attempts[0].explanation
    assert not re.search(r"0x[0-9a-f]{1,15}\b(?!@)", " ".join(re.findall(r"uuid 0x\w+", text)))


def _per_file_explanations(t: Timeline, records: list[Record]) -> list[tuple[str, str, int | None]]:
    """(file, explanation with frame numbers made file-relative, predicted) of every rollback."""
    first: dict[str, int] = {}
    for r in records:
        first.setdefault(r.file, r.number)
    out = []
    for s in t.streams:
        file = t.connections[s.conn].file
        for a in s.attempts:
            if a.outcome == "rollback":
                text = re.sub(r"frame (\d+)", lambda m: f"frame {int(m[1]) - first[file] + 1}", a.explanation)  # noqa: B023
                out.append((file, text, a.predicted))
    return out


def test_shipped_captures_in_one_run_explain_each_rollback_as_alone() -> None:
    files = [str(p) for p in sorted((ROOT / "captures").glob("*.pcap"))]
    alone = []
    for f in files:
        records = list(read_records([f]))
        alone += _per_file_explanations(build_timeline(records), records)
    records = list(read_records(files))
    per_file = build_timeline(records, {f: i for i, f in enumerate(files, 1)})
    assert _per_file_explanations(per_file, records) == alone
    assert _per_file_explanations(build_timeline(records), records) == alone  # one set: the histories do not share entries
    seed = [e for e in alone if e[0].endswith(SEED)]
    assert len(seed) == 1 and "purge" in seed[0][1]
    conns = per_file.connections
    assert all(conns[b.conn].capture_set == b.capture_set for bs in per_file.branches.values() for b in bs if b.conn is not None)


# --- the property: an unrelated capture set changes nothing of a connection's rollback ----------------------------

UUIDS = [0xAA, 0xBB, 0xCC]
entries = st.tuples(st.sampled_from(UUIDS), st.integers(0, 20))
logs = st.lists(entries, min_size=1, max_size=3, unique_by=lambda e: e[0])


@st.composite
def other_set(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """What another recording's connection may show of vbucket 0: logs, high seqnos, items, purge seqnos."""
    out: list[tuple[str, bytes]] = []
    for k in range(draw(st.integers(1, 4))):
        op = 0x20 + k
        kind = draw(st.sampled_from(["log", "high", "items", "failover"]))
        if kind == "log":
            out += stream(draw(logs), op)
        elif kind == "failover":
            value = {"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in draw(logs)]}
            out += [
                ("c2s", encode("DCP_GET_FAILOVER_LOG", opaque=op)),
                ("s2c", encode("DCP_GET_FAILOVER_LOG", response=True, opaque=op, value=value)),
            ]
        elif kind == "high":
            highs = [{"vbucket": 0, "high_seqno": draw(st.integers(0, 1000))}]
            out += [
                ("c2s", encode("GET_ALL_VB_SEQNOS", opaque=op)),
                ("s2c", encode("GET_ALL_VB_SEQNOS", response=True, opaque=op, value=highs)),
            ]
        else:
            q = draw(st.integers(1, 1000))
            marker = {"start_seqno": q, "end_seqno": q, "flags": 2, "purge_seqno": draw(st.integers(0, q))}
            out += stream(draw(logs), op)
            out += [("s2c", encode("DCP_SNAPSHOT_MARKER", extras={"version": 2}, value=marker, opaque=op))]
            mutation = encode("DCP_MUTATION", extras={"by_seqno": q, "rev_seqno": 1}, key="k", value=b"v", opaque=op, cas=q)
            out += [("s2c", mutation)]
    return out


@st.composite
def mine(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """A resume that rolls back, then (maybe) a retry from 0 whose success carries the producer's log."""
    start = draw(st.integers(1, 20))
    out = [("c2s", req(0x11, start=start, uuid=draw(st.sampled_from(UUIDS)))), ("s2c", rollback(0x11, draw(st.integers(0, start))))]
    if draw(st.booleans()):
        out += stream(draw(logs), 0x12)
    return out


@settings(max_examples=150, deadline=None)
@given(mine(), other_set(), st.data())
def test_an_unrelated_capture_set_never_changes_a_rollbacks_explanation(my: Conv, other: Conv, data: st.DataObject) -> None:
    def record(n: int, conn: int, file: str, d: str, raw: bytes) -> Record:
        return Record(n, file, conn, f"c{conn}", d, T0 + n, T0 + n, n, n, Frame(0, raw), FRESH)

    alone = [record(100 * (i + 1), 2, "mine", d, raw) for i, (d, raw) in enumerate(my)]
    # the other set's frames between mine (numbered in the gaps: my frames keep their numbers)
    slots = sorted(data.draw(st.lists(st.integers(0, len(my)), min_size=len(other), max_size=len(other))))
    theirs = [record(100 * slot + 1 + k, 1, "other", d, raw) for k, (slot, (d, raw)) in enumerate(zip(slots, other, strict=True))]
    mixed = sorted(alone + theirs, key=lambda r: r.number)
    sets = {"mine": 1, "other": 2}

    def explained(records: list[Record]) -> list[tuple[str, int | None]]:
        t = TimelineBuilder(sets).feed_all(records).timeline()
        return [(a.explanation, a.predicted) for s in t.streams if s.conn == 2 for a in s.attempts if a.outcome == "rollback"]

    assert explained(mixed) == explained(alone)
