"""Per-connection timelines merged back into one (no Java: the pure half of the Spark stage 4).

Each capture's records are fed per connection to builders of their own, as the
Spark keys pass does (here the keys are the record numbers and ``ck`` the
connection ids), packed into :class:`ConnPart`, pickled, merged and renumbered:
the result must be the single-process timeline, table for table.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from paths import ROOT

from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import Record
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Magic, Opcode
from dcpinspect.protocol.session import EXPECTS_RESPONSE
from dcpinspect.tables.timeline import story, timeline_frames
from dcpinspect.timeline import Anomaly, FlowSample, Item, Stream, Timeline, TimelineBuilder, build_timeline
from dcpinspect.timeline.merge import ConnPart, SeqnoRises, highest_before, merge_timelines, record_from, record_tuple, thin
from dcpinspect.wire.events import Frame

CAPTURES = sorted((ROOT / "captures").glob("*.pcap"))
RESPONSES = {int(Magic.CLIENT_RESPONSE), int(Magic.ALT_CLIENT_RESPONSE)}
REQUESTS = {int(Magic.CLIENT_REQUEST), int(Magic.ALT_CLIENT_REQUEST)}
V1_MARKER_EXTRAS = sum(f.size or 0 for f in spec.SNAPSHOT_V1_EXTRAS)  # a v2 marker's extras differ


class _Conn:
    def __init__(self, ck: int, first: int, max_items: int | None) -> None:
        self.ck, self.first = ck, first
        self.born: list[int] = []
        self.raised: list[int] = []
        self.control: list[Record] = []
        self.markers: dict[int, Record] = {}
        self.rises = SeqnoRises()
        self.sunk: dict[int, list[Item]] = {}  # stream index -> every item the sink got
        self.new: dict[int, list[list[Item]]] = {}  # vbucket -> the items of one flush, per stream
        self.flow: list[FlowSample] = []
        self.builder = (
            TimelineBuilder(max_items=max_items, on_items=self._items, on_flow=self.flow.extend) if max_items else TimelineBuilder()
        )

    def _items(self, index: int, items: list[Item]) -> None:
        self.sunk.setdefault(index, []).extend(items)
        self.new.setdefault(self.builder.streams[index].vbucket, []).append(items)

    def drain(self) -> None:
        for vb, batches in self.new.items():
            self.rises.add(vb, batches)
        self.new.clear()


def parts_of(records: list[Record], max_items: int | None = None, *, flush_every: int = 50) -> tuple[list[ConnPart], dict[int, _Conn]]:
    """What the Spark keys pass ships: one pickled part per connection (keys = record numbers)."""
    conns: dict[int, _Conn] = {}
    for n, r in enumerate(records, 1):
        c = conns.get(r.conn)
        if c is None:
            c = conns[r.conn] = _Conn(r.conn, r.number, max_items)
        ns, na = len(c.builder.streams), c.builder.anomaly_count
        c.builder.feed(r)
        c.born += [r.number] * (len(c.builder.streams) - ns)
        c.raised += [r.number] * (c.builder.anomaly_count - na)
        ev = r.event
        if isinstance(ev, Frame) and ev.dialect == "mcbp":
            if ev.magic in RESPONSES or (ev.magic in REQUESTS and ev.opcode in EXPECTS_RESPONSE):
                c.control.append(r)
            elif ev.magic in REQUESTS and ev.opcode == Opcode.DCP_SNAPSHOT_MARKER and ev[1][4] != V1_MARKER_EXTRAS:
                c.markers[r.number] = r
        if n % flush_every == 0:
            for x in conns.values():
                x.builder.flush()
                x.drain()
    parts = []
    for c in conns.values():
        bl = c.builder
        t = bl.timeline()
        c.drain()
        purge = {sn.frame for s in t.streams for sn in s.snapshots if isinstance(sn.purge_seqno, int)}
        ctl = sorted(c.control + [r for k, r in c.markers.items() if k in purge], key=lambda r: r.number)
        rises = c.rises if max_items else SeqnoRises.of(t.streams)
        nrt = bl.anomaly_count
        part = ConnPart(
            c.ck,
            c.first,
            t.connections[c.ck],
            list(zip(c.born, t.streams, strict=True)),
            list(zip(c.raised, t.anomalies[:nrt], strict=True)),
            t.anomalies[nrt:],
            t.flow,
            t.noops,
            t.stalls,
            [bl.items_seen(i) for i in range(len(t.streams))],
            [record_tuple(r) for r in ctl],
            {vb: (ks, qs) for vb, (ks, qs) in rises.rises.items() if ks},
            [tuple(map(list, zip(*s.items, strict=True))) if s.items else () for s in t.streams],
        )
        parts.append(pickle.loads(pickle.dumps(part)))
    return parts, conns


def merged(records: list[Record], max_items: int | None = None) -> tuple[Timeline, dict[int, int]]:
    parts, _ = parts_of(records, max_items)
    t, counts = merge_timelines(parts[::-1])  # any order of parts
    t.renumber(lambda k: k, {p.ck: p.ck for p in parts})
    return t, counts


def tables(t: Timeline, *, items: bool = True) -> dict[str, list[list[str]]]:
    return {k: df.astype(str).values.tolist() for k, df in timeline_frames(t, items=items).items()}


@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_merged_parts_are_the_single_process_timeline(path: Path) -> None:
    records = list(read_records([str(path)]))
    want = build_timeline(records)
    got, counts = merged(records)
    assert story(got) == story(want)
    assert tables(got) == tables(want)
    assert counts == {i: len(s.items) for i, s in enumerate(want.streams)}


def test_merged_parts_keep_capture_sets_as_the_single_process_timeline() -> None:
    """Every shipped capture in one run, one capture set per file: the merge places each connection as one builder does."""
    files = [str(p) for p in CAPTURES]
    sets = {f: i for i, f in enumerate(files, 1)}
    records = list(read_records(files))
    want = build_timeline(records, sets)
    parts, _ = parts_of(records)
    got, _counts = merge_timelines(parts[::-1], capture_sets=sets)
    got.renumber(lambda k: k, {p.ck: p.ck for p in parts})
    assert story(got) == story(want)
    assert tables(got) == tables(want)
    assert len({c.capture_set for c in got.connections.values()}) == len(files)
    assert {k: len(v) for k, v in got.history_logs.items()} == {k: len(v) for k, v in want.history_logs.items()}


@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_thinned_parts_keep_true_counts_and_every_item_passes_the_sink(path: Path) -> None:
    records = list(read_records([str(path)]))
    want = build_timeline(records)
    parts, conns = parts_of(records, max_items=3, flush_every=7)
    for c in conns.values():
        for i, s in enumerate(c.builder.streams):
            full = next(
                x for x in want.streams if (x.conn, x.vbucket, x.stream_id, x.segment) == (s.conn, s.vbucket, s.stream_id, s.segment)
            )
            assert c.sunk.get(i, []) == full.items  # every item once, in order
            assert len(s.items) <= 2 * 3 + 1 and (not full.items or s.items[-1] == full.items[-1])
        assert c.flow == [f for f in want.flow if f.conn == c.ck]
    got, counts = merge_timelines(parts)
    got.renumber(lambda k: k, {p.ck: p.ck for p in parts})
    assert counts == {i: len(s.items) for i, s in enumerate(want.streams)}
    gt, wt = timeline_frames(got, items=False), timeline_frames(want, items=False)
    assert tables(got, items=False) | {"streams": []} == tables(want, items=False) | {"streams": []}
    assert gt["streams"].drop(columns="items").equals(wt["streams"].drop(columns="items"))  # items: thinned
    assert [a.explanation for s in got.streams for a in s.attempts] == [a.explanation for s in want.streams for a in s.attempts]


def test_thin_keeps_n_evenly_spaced_and_the_last() -> None:
    assert thin(list(range(5)), 10) == [0, 1, 2, 3, 4]
    assert thin(list(range(10)), 4) == [0, 2, 5, 9]
    assert thin(list(range(100)), 1) == [99]


def test_seqno_rises_across_streams_of_a_vbucket() -> None:
    r = SeqnoRises()
    r.add(0, [[Item(1, 0, 0x57, 5, 0), Item(4, 0, 0x57, 6, 0)], [Item(2, 0, 0x57, 9, 0), Item(3, 0, 0x57, None, 0)]])
    r.add(0, [[Item(5, 0, 0x57, 7, 0), Item(6, 0, 0x57, 10, 0)]])
    assert r.rises == {0: ([1, 2, 6], [5, 9, 10])}
    s = Stream(1, 0, None, 0, items=[Item(1, 0, 0x57, 5, 0), Item(2, 0, 0x57, 9, 0), Item(4, 0, 0x57, 6, 0), Item(6, 0, 0x57, 10, 0)])
    assert SeqnoRises.of([s]).rises == r.rises


def test_highest_before_each_rollback_over_every_connection() -> None:
    def part(ck: int, history: dict[int, tuple[list[int], list[int]]]) -> ConnPart:
        return ConnPart(ck, ck, None, [], [], [], [], [], [], [], [], history)  # type: ignore[arg-type]

    parts = [part(1, {0: ([10, 20, 30], [5, 8, 12]), 1: ([15], [3])}), part(2, {0: ([25], [9])})]
    at, end = highest_before(parts, [10, 21, 26, 100])
    # per connection (vbucket, ck, seqno): the replay counts each in its own capture set and history
    assert at == {21: [(0, 1, 8), (1, 1, 3)], 26: [(0, 1, 8), (0, 2, 9), (1, 1, 3)], 100: [(0, 1, 12), (0, 2, 9), (1, 1, 3)]}
    assert end == {(0, 1): 12, (0, 2): 9, (1, 1): 3}
    decoded = [part(1, {0: "a"})]
    assert highest_before(decoded, [11], rises=lambda e: ([10], [7])) == ({11: [(0, 1, 7)]}, {(0, 1): 7})


def test_renumber_maps_every_frame_and_connection_once() -> None:
    records = list(read_records([str(ROOT / "captures" / "live-rollback-retry.pcap")]))
    t = build_timeline(records)
    frames = {r.number for r in records}
    conns = {c: c + 100 for c in t.connections}
    shared = [a for s in t.streams for a in s.anomalies if a in t.anomalies]
    before = [list(a.frames) for a in shared]
    t.renumber(lambda k: k + 10_000, conns, items=lambda ks: [k + 10_000 for k in ks])
    assert set(t.connections) == set(conns.values()) and all(c.conn in conns.values() for c in t.connections.values())
    assert all(s.conn in conns.values() for s in t.streams)
    assert all(a.frame - 10_000 in frames for s in t.streams for a in s.attempts)
    assert all(it.frame - 10_000 in frames for s in t.streams for it in s.items)
    assert all(sn.frame - 10_000 in frames for s in t.streams for sn in s.snapshots)
    assert all(f.frame - 10_000 in frames and f.conn in conns.values() for f in t.flow)
    assert all(b.first_frame - 10_000 in frames for bs in t.branches.values() for b in bs)
    assert [a.frames for a in shared] == [[f + 10_000 for f in fs] for fs in before]  # once, not twice


def test_renumber_follows_the_frame_an_explanation_names() -> None:
    """A rollback explained from the log seen later names its frame: keys (Spark) become frame numbers in the text too."""
    records = list(read_records([str(ROOT / "captures" / "seed-000-rollback-retry.pcap")]))
    t = build_timeline(records)
    (a,) = [a for s in t.streams for a in s.attempts if a.outcome == "rollback"]
    assert a.log_frame == 4 and "at frame 4)" in a.explanation
    t.renumber(lambda k: k * 1000, {c: c for c in t.connections})
    assert a.log_frame == 4000 and "at frame 4000)" in a.explanation and "at frame 4)" not in a.explanation


def test_records_and_parts_pickle() -> None:
    records = list(read_records([str(ROOT / "captures" / "seed-000-rollback-retry.pcap")]))
    r = next(r for r in records if isinstance(r.event, Frame))
    assert record_from(pickle.loads(pickle.dumps(record_tuple(r)))) == r
    parts, _ = parts_of(records)
    assert all(isinstance(p, ConnPart) and isinstance(p.final, list) for p in parts)
    assert all(isinstance(a, Anomaly) for p in parts for _k, a in p.runtime)
