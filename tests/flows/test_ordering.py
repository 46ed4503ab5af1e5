"""Rows in the capture's order: frames after a hole keep their place, and a hole is waited for a bounded number of packets.

A frame is numbered by the packet that completed it.  Bytes held behind a
hole (a lost segment) used to be numbered when the hole was given up - at the
end of the capture, or at a FIN - so they moved to the end.  Now they keep the
place of their own packets (rule 5 of :mod:`dcpinspect.flows.reassembly`), a
hole is given up :data:`~dcpinspect.flows.halfstream.MAX_HOLE_WAIT` packets
after the oldest segment held behind it, and both capture paths (and Spark's
tasks, which read some connections each) place every row alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pcapfactory import Conn, Msg, Written, write_capture
from readcheck import assert_same_read

from dcpinspect import encode
from dcpinspect.capture.read import read_records
from dcpinspect.flows import reassembly
from dcpinspect.flows.reassembly import Segment
from dcpinspect.flows.records import Recorder
from dcpinspect.wire.events import Frame, Gap


def _mutation(i: int) -> bytes:
    return encode("DCP_MUTATION", extras={"by_seqno": i, "rev_seqno": 1}, key=f"k{i}", value=b"v" * 40, opaque=7)


def _two_streams(n: int = 12) -> list[Conn]:
    """Two producers sending one frame per segment, interleaved in the capture."""
    return [
        Conn(client=("10.0.0.1", 50001), server=("10.0.0.9", 11210), msgs=[Msg("s2c", _mutation(i)) for i in range(1, n + 1)], close="fin"),
        Conn(
            client=("10.0.0.2", 50002),
            server=("10.0.0.9", 11210),
            msgs=[Msg("s2c", _mutation(i)) for i in range(100, 100 + n)],
            close="fin",
        ),
    ]


def _fourth(w: Written) -> int:
    """The index of the segment carrying the first connection's fourth frame."""
    size = len(_mutation(1))
    return next(s.index for s in w.segments if s.conn == 0 and s.direction == "s2c" and s.offset == 3 * size)


def _lost_capture(tmp_path: Path) -> tuple[str, int]:
    """A capture where one segment of the first connection is lost for good; the lost segment's index."""
    w = write_capture(tmp_path / "probe.pcap", _two_streams())
    lost = _fourth(w)
    path = tmp_path / "lost.pcap"
    write_capture(path, _two_streams(), drop=[lost])
    return str(path), lost


def test_frames_after_a_lost_segment_keep_their_place(tmp_path: Path) -> None:
    path, _lost = _lost_capture(tmp_path)
    recs = list(read_records([path]))
    mine = [r for r in recs if r.conn == 1]
    gap = next(r for r in mine if r.event.__class__ is Gap)
    after = mine[mine.index(gap) + 1]
    # the gap is dated by the segment after the hole, and placed with it
    assert after.event.__class__ is Frame and gap.packet == after.packet
    # every row is in the order of the packet that completed it: nothing moved to the end
    packets = [r.packet for r in recs]
    assert packets == sorted(packets), packets
    assert [r.number for r in recs] == list(range(1, len(recs) + 1))
    # the other connection's frames sent after the hole come after the frames behind it that arrived before them
    other_later = [r for r in recs if r.conn == 2 and r.packet > after.packet]
    assert other_later and all(r.number > after.number for r in other_later)
    assert_same_read([path])
    assert_same_read([path], rows=3, window=300)


def test_a_hole_is_waited_for_a_bounded_number_of_packets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A hole is given up ``MAX_HOLE_WAIT`` packets after the oldest segment behind it; meanwhile rows wait, then flow."""
    monkeypatch.setattr(reassembly, "MAX_HOLE_WAIT", 4)
    conns = _two_streams(30)
    w = write_capture(tmp_path / "probe.pcap", conns)
    lost = _fourth(w)
    path = tmp_path / "lost.pcap"
    write_capture(path, conns, drop=[lost])
    rec = Recorder()
    from dcpinspect.capture.read import capture_segments
    from dcpinspect.flows.records import CaptureStats

    held_most = 0
    out = []
    for seg in capture_segments([str(path)], CaptureStats()):
        out += rec.feed(seg)
        held_most = max(held_most, rec.held)
    before_end = len(out)
    out += rec.close()
    assert held_most <= 2 * 4  # a batch per packet at most, for MAX_HOLE_WAIT packets (both connections)
    gap = next(r for r in out if r.event.__class__ is Gap)
    assert gap.number <= before_end  # given up while the capture went on, not at its end
    packets = [r.packet for r in out]
    assert packets == sorted(packets)
    assert_same_read([str(path)])
    assert_same_read([str(path)], rows=2, window=200)


def test_a_retransmission_after_the_wait_comes_too_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hole was given up: the late bytes are not decoded again, and the connection counts them lost."""
    monkeypatch.setattr(reassembly, "MAX_HOLE_WAIT", 3)
    a, b = _mutation(1), _mutation(2)

    def seg(pos: int, seq: int, data: bytes, sport: int = 50001) -> Segment:
        return Segment(pos * 1000, "10.0.0.9", 11210, "10.0.0.1", sport, seq, 0x18, data, 0, pos, "x", pos)

    rec = Recorder()
    out = rec.feed(seg(1, 1000, a))
    out += rec.feed(seg(2, 1000 + len(a) + len(b), _mutation(3)))  # b lost: a hole
    for p in range(3, 8):
        out += rec.feed(seg(p, 5000 + 100 * p, b"", sport=50002))  # other traffic: the capture goes on
    out += rec.feed(seg(8, 1000 + len(a), b))  # the retransmission, five packets late
    out += rec.close()
    kinds = [(r.event.__class__.__name__, r.packet) for r in out if r.conn == 1]
    assert kinds == [("Frame", 1), ("Gap", 2), ("Frame", 2)]
    conn = rec.stats.connections[0]
    assert conn.halves["s2c"].lost == len(b)


def test_watermark_follows_the_oldest_segment_held() -> None:
    r = reassembly.Reassembler()
    a = _mutation(1)

    def seg(pos: int, seq: int, data: bytes) -> Segment:
        return Segment(pos, "10.0.0.9", 11210, "10.0.0.1", 50001, seq, 0x18, data, 0, pos, "x", pos)

    assert r.watermark() > 1 << 62
    r.feed_raw(seg(1, 1000, a))
    r.feed_raw(seg(5, 1000 + 2 * len(a), a))  # one frame missing before it
    r.feed_raw(seg(9, 1000 + 3 * len(a), a))
    assert r.watermark() == 5
    batches = r.feed_raw(seg(12, 1000 + len(a), a))  # the hole filled: all three emitted at the filling packet
    assert [(b[7], b[8], len(b[2])) for b in batches] == [(12, 0, 1), (12, 1, 1), (12, 2, 1)]
    assert r.watermark() > 1 << 62


_SLOW = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@_SLOW
@given(
    n=st.lists(st.integers(1, 8), min_size=1, max_size=3),
    wait=st.sampled_from([1, 2, 3, 5, 8, 65536]),
    data=st.data(),
)
def test_both_paths_place_rows_alike_with_any_hole_wait(
    tmp_path_factory: pytest.TempPathFactory, n: list[int], wait: int, data: st.DataObject
) -> None:
    """Lost, reordered and duplicated segments over interleaved connections, holes given up after ``wait`` packets."""
    conns = [
        Conn(
            client=(f"10.0.0.{c + 1}", 50000 + c),
            server=("10.0.0.9", 11210),
            msgs=[
                Msg(data.draw(st.sampled_from(["s2c", "c2s"])), b"".join(_mutation(c * 100 + i * 3 + j) for j in range(2)))
                for i in range(k)
            ],
            close=data.draw(st.sampled_from(["fin", "rst", None])),
        )
        for c, k in enumerate(n)
    ]
    segs = sum(k for k in n) * 3
    drop, reorder, duplicate = (data.draw(st.lists(st.integers(0, segs), max_size=3), label=f) for f in ("drop", "reorder", "duplicate"))
    tmp = tmp_path_factory.mktemp("order")
    path = tmp / "x.pcap"
    try:
        write_capture(path, conns, mss=data.draw(st.sampled_from([30, 70, 200])), drop=drop, reorder=reorder, duplicate=duplicate)
    except ValueError:
        assume(False)
    old = reassembly.MAX_HOLE_WAIT
    reassembly.MAX_HOLE_WAIT = wait
    try:
        got = assert_same_read(
            [str(path)], rows=data.draw(st.sampled_from([2, 65536])), window=data.draw(st.sampled_from([0, 150])) or None
        )
        assert got.column("frame").to_pylist() == list(range(1, got.num_rows + 1))
        # a direction's rows stay in stream order whatever the holes
        for conn in set(got.column("conn_id").to_pylist()):
            for d in ("c2s", "s2c"):
                offs = [
                    o
                    for c, dd, o in zip(
                        got.column("conn_id").to_pylist(), got.column("dir").to_pylist(), got.column("offset").to_pylist(), strict=True
                    )
                    if c == conn and dd == d and o is not None
                ]
                assert offs == sorted(offs)
    finally:
        reassembly.MAX_HOLE_WAIT = old
