"""Item runs taken in bulk build the same timeline as every record fed one by one.

:func:`~dcpinspect.tables.timeline_feed.feed_part` hands runs of item
messages and v1 snapshot markers to :meth:`~dcpinspect.timeline.builder.TimelineBuilder.take_items`,
which takes them only where it proves that the records would have raised
nothing.  These tests feed the same captures both ways - one builder for the
whole capture, and one per connection as Spark's tasks do - on every capture
we have and on Hypothesis-generated DCP sessions full of what a run must not
swallow: seqnos that fall back or leave their snapshot, markers that go
backwards, overlap or cut a snapshot short, keys twice in a snapshot, flow control that overruns or is over-acked, items before a marker,
past the end seqno, of streams never requested, in OSO snapshots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import CAPTURES, THIRD_PARTY
from pcapfactory import Conn, Msg, write_capture

from dcpinspect import encode
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Opcode, SnapshotFlag
from dcpinspect.tables.columnar import read_parts
from dcpinspect.tables.timeline_feed import feed_part
from dcpinspect.timeline import Timeline, TimelineBuilder
from dcpinspect.timeline.runs import ITEM_RUN_LAYOUTS

CAPTURE_FILES = sorted(CAPTURES.glob("*.pcap")) + sorted(THIRD_PARTY.glob("*.pcap*"))


def _both_ways(paths: list[str], min_run: int) -> tuple[Timeline, Timeline, int]:
    """(records one by one, runs in bulk, records the bulk way fed as records) over one builder."""
    one = TimelineBuilder()
    for part in read_parts(paths):
        for r in part.records():
            one.feed(r)
    bulk = TimelineBuilder()
    fed = [0]

    def feed(rec: Any) -> None:
        fed[0] += 1
        bulk.feed(rec)

    for part in read_parts(paths):
        feed_part(part, lambda _c, _n: bulk, feed, min_run=min_run)
    return one.timeline(), bulk.timeline(), fed[0]


def _per_connection(paths: list[str], min_run: int) -> None:
    """One builder per connection, fed Spark's way (numbers and connections given, a connection at a time): equal timelines."""
    one: dict[int, TimelineBuilder] = {}
    bulk: dict[int, TimelineBuilder] = {}
    for part in read_parts(paths):
        for r in part.records():
            one.setdefault(r.conn, TimelineBuilder()).feed(r._replace(number=10 * r.number))  # any increasing numbers
    for part in read_parts(paths):
        recs = list(part.records())
        feed_part(
            part,
            lambda c, _n: bulk.setdefault(c, TimelineBuilder()),
            lambda r: bulk.setdefault(r.conn, TimelineBuilder()).feed(r),
            numbers=[10 * r.number for r in recs],
            conns=np.asarray([r.conn for r in recs], np.int64),
            per_connection=True,
            min_run=min_run,
        )
    assert set(bulk) <= set(one)
    for c, b in one.items():
        assert bulk.get(c, TimelineBuilder()).timeline() == b.timeline(), c


def assert_same(paths: list[str]) -> int:
    """Both ways, every run length; the records fed one by one in bulk mode with the default run length."""
    for min_run in (1, 3):
        one, bulk, _ = _both_ways(paths, min_run)
        assert bulk == one
        _per_connection(paths, min_run)
    one, bulk, fed = _both_ways(paths, 16)
    assert bulk == one
    return fed


@pytest.mark.parametrize("path", CAPTURE_FILES, ids=lambda p: p.name)
def test_captures(path: Path) -> None:
    assert_same([str(path)])


def test_run_layouts_give_the_seqno() -> None:
    """Each layout's seqno offset reads the seqno of a frame built from the table, in every variant of the run's opcodes."""
    seen = set()
    for key, off in ITEM_RUN_LAYOUTS.items():
        op = key >> 8
        field = "commit_seqno" if op == Opcode.DCP_COMMIT else "by_seqno"
        for v in spec.COMMANDS[op].request:
            if (op << 8 | v.extras_len) == key:
                raw = encode(op, variant=v.name or None, extras={field: 0x0102030405060708}, key="k")
                assert int.from_bytes(raw[24 + off : 32 + off], "big") == 0x0102030405060708
                seen.add(key)
    assert seen == set(ITEM_RUN_LAYOUTS)
    ops = {int(o) for o in (Opcode.DCP_MUTATION, Opcode.DCP_DELETION, Opcode.DCP_EXPIRATION, Opcode.DCP_COMMIT)}
    assert {k >> 8 for k in ITEM_RUN_LAYOUTS} == ops


@pytest.mark.parametrize("size", [1, 3, 200])
def test_a_long_mutation_stream_is_taken_in_bulk(tmp_path: Path, size: int) -> None:
    """Markers and mutations of one requested stream, snapshots of 1, 3 or 200 items: almost nothing is fed as records."""
    msgs = [Msg("c2s", _req(0, 7)), Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=7, value=[(0xAB, 0)]))]
    body = b""
    for lo in range(1, 1001, size):
        body += encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": lo, "end_seqno": lo + size - 1, "flags": 1}, opaque=7)
        body += b"".join(_mut(q, f"k{q % size}", 7) for q in range(lo, lo + size))  # keys repeat across snapshots, never within one
    msgs.append(Msg("s2c", body))
    path = tmp_path / "long.pcap"
    write_capture(path, [Conn(msgs=msgs)])
    fed = assert_same([str(path)])
    assert fed < 30  # the request and its answer (and a head of records, were the stream new)


# --------------------------------------------------------------------------- generated sessions


def _req(vb: int, opaque: int, end: int | None = None) -> bytes:
    return encode(
        "DCP_STREAM_REQ", extras={"start_seqno": 0, "end_seqno": end if end is not None else 2**64 - 1}, vbucket=vb, opaque=opaque
    )


def _mut(seqno: int, key: str, opaque: int, vb: int = 0, op: str = "DCP_MUTATION") -> bytes:
    extras = {"by_seqno": seqno, "rev_seqno": 1}
    value = b"v" if op == "DCP_MUTATION" else None
    return encode(op, extras=extras, key=key, value=value, vbucket=vb, opaque=opaque)


@st.composite
def sessions(draw: st.DrawFn) -> list[Conn]:
    """One to three DCP connections: an open, maybe a buffer size, stream requests, then markers, items, acks and ends."""
    conns = []
    for ci in range(draw(st.integers(1, 3))):
        msgs = [
            Msg("c2s", encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key=f"c{ci}", opaque=1)),
            Msg("s2c", encode("DCP_OPEN", response=True, opaque=1)),
        ]
        buffer = draw(st.sampled_from([None, None, 300, 3000]))
        if buffer:
            msgs += [
                Msg("c2s", encode("DCP_CONTROL", key="connection_buffer_size", value=str(buffer).encode(), opaque=2)),
                Msg("s2c", encode("DCP_CONTROL", response=True, opaque=2)),
            ]
        vbs = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True))
        requested = [vb for vb in vbs if draw(st.integers(0, 5))]  # some streams never requested: followed
        for vb in requested:
            end = draw(st.sampled_from([None, None, 30]))
            msgs += [
                Msg("c2s", _req(vb, 0x10 + vb, end)),
                Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=0x10 + vb, value=[(0xA0 + vb, 0)])),
            ]
        seqno = dict.fromkeys(vbs, 0)
        body = b""
        for _ in range(draw(st.integers(0, 60))):
            vb = draw(st.sampled_from(vbs))
            kind = draw(st.sampled_from(["item"] * 8 + ["marker", "marker", "ack", "end", "oso", "noop"]))
            if kind == "marker":
                size = draw(st.integers(1, 12))
                flags = draw(st.sampled_from([1, 2, 1 | int(SnapshotFlag.HISTORY) | int(SnapshotFlag.MAY_CONTAIN_DUPLICATES)]))
                lo = seqno[vb] + 1 + draw(st.sampled_from([0, 0, 0, 2, -1]))
                body += encode(
                    "DCP_SNAPSHOT_MARKER",
                    extras={"start_seqno": max(lo, 0), "end_seqno": max(lo, 0) + size, "flags": flags},
                    vbucket=vb,
                    opaque=0x10 + vb,
                )
            elif kind == "item":
                step = draw(st.sampled_from([1, 1, 1, 1, 1, 2, 0, -1, 20]))
                seqno[vb] = max(seqno[vb] + step, 0)
                key = draw(st.sampled_from(["a", "b", "c", f"k{seqno[vb]}", f"k{seqno[vb]}", f"k{seqno[vb]}"]))
                op = draw(st.sampled_from(["DCP_MUTATION"] * 4 + ["DCP_DELETION", "DCP_EXPIRATION"]))
                body += _mut(seqno[vb], key, 0x10 + vb, vb, op)
            elif kind == "ack":
                msgs += [Msg("s2c", body)] if body else []
                body = b""
                msgs.append(
                    Msg("c2s", encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": draw(st.sampled_from([50, 200, 5000]))}))
                )
            elif kind == "end":
                body += encode("DCP_STREAM_END", extras={"status": 0}, vbucket=vb, opaque=0x10 + vb)
            elif kind == "oso":
                body += encode("DCP_OSO_SNAPSHOT", extras={"flags": draw(st.sampled_from([1, 2]))}, vbucket=vb, opaque=0x10 + vb)
            else:
                body += encode("DCP_NOOP", opaque=0x50)
        if body:
            msgs.append(Msg("s2c", body))
        conns.append(Conn(client=(f"10.0.0.{ci + 10}", 50000 + ci), msgs=msgs))
    return conns


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(conns=sessions(), data=st.data())
def test_generated_sessions(tmp_path_factory: pytest.TempPathFactory, conns: list[Conn], data: st.DataObject) -> None:
    path = tmp_path_factory.mktemp("feed") / "s.pcap"
    write_capture(
        path, conns, mss=data.draw(st.sampled_from([100, 1460]), label="mss"), interleave=data.draw(st.booleans(), label="interleave")
    )
    assert_same([str(path)])
