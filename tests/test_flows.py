"""TCP reassembly (pure): segmentation, reordering, duplicates, loss, wrap, reuse, roles."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpinspect import decode, encode
from dcpinspect.flows import ACK, FIN, RST, SYN, Reassembler, Segment
from dcpinspect.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.records import read_records

C = ("10.0.0.1", 50000)
S = ("10.0.0.2", 11210)
MUT = {"by_seqno": 1, "rev_seqno": 1}


def stream(n: int = 20, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    return b"".join(
        encode("DCP_MUTATION", extras={**MUT, "by_seqno": i + 1}, key=f"k{i}", value=bytes(rng.randrange(0, 300)), opaque=7)
        for i in range(n)
    )


def segments(
    data: bytes, *, src: tuple[str, int] = S, dst: tuple[str, int] = C, isn: int = 5000, mss: int = 100, syn: bool = True, ts0: int = 0
) -> list[Segment]:
    out = []
    if syn:
        out.append(Segment(ts0, *src, *dst, isn, SYN | ACK))
    seq = isn + 1 if syn else isn
    for i in range(0, len(data), mss):
        chunk = data[i : i + mss]
        out.append(Segment(ts0 + i + 1, *src, *dst, seq & 0xFFFFFFFF, ACK, chunk, packet=len(out) + 1))
        seq += len(chunk)
    return out


def run(segs: list[Segment], **kw: object) -> tuple[Reassembler, list[object]]:
    r = Reassembler(**kw)  # type: ignore[arg-type]
    events = list(r.run(segs))
    return r, events


def frames_of(events: list[object]) -> list[bytes]:
    return [e.event.raw for e in events if e.event.type == "frame"]  # type: ignore[attr-defined]


def test_in_order_equals_plain_decode() -> None:
    data = stream()
    _, events = run(segments(data))
    assert frames_of(events) == [e.raw for e in decode(data)]  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), mss=st.integers(1, 400), isn=st.integers(0, 2**32 - 1))
def test_reorder_and_duplicates_do_not_change_frames(seed: int, mss: int, isn: int) -> None:
    data = stream(10, seed)
    segs = segments(data, mss=mss, isn=isn)
    rng = random.Random(seed)
    body = segs[1:]
    for _ in range(len(body) // 3):  # local reordering within the buffer bound
        i = rng.randrange(len(body))
        j = min(len(body) - 1, i + rng.randrange(1, 4))
        body[i], body[j] = body[j], body[i]
    body += [body[rng.randrange(len(body))] for _ in range(len(body) // 4)]  # retransmissions
    r, events = run([segs[0], *body])
    assert frames_of(events) == [e.raw for e in decode(data)]  # type: ignore[union-attr]
    (conn,) = r.connections
    assert conn.lost == 0 and conn.halves["s2c"].conflicts == 0


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), mss=st.integers(20, 300))
def test_a_dropped_segment_is_an_exact_gap(seed: int, mss: int) -> None:
    data = stream(12, seed)
    segs = segments(data, mss=mss)
    rng = random.Random(seed)
    k = rng.randrange(1, len(segs) - 1)
    lost = len(segs[k].payload)
    r, events = run(segs[:k] + segs[k + 1 :])
    gaps = [e.event for e in events if e.event.type == "gap"]  # type: ignore[attr-defined]
    assert [(g.offset, g.length) for g in gaps] == [((k - 1) * mss, lost)]
    assert r.connections[0].lost == lost
    # every byte accounted for: the events tile the stream, gaps included
    pos = 0
    for e in events:
        assert e.event.offset == pos  # type: ignore[attr-defined]
        pos += e.event.length  # type: ignore[attr-defined]
    assert pos == len(data)
    # the frames entirely before and after the hole are intact
    intact = [e.raw for e in decode(data) if e.offset + e.length <= (k - 1) * mss]  # type: ignore[union-attr]
    assert frames_of(events)[: len(intact)] == intact


def test_sequence_numbers_wrap() -> None:
    data = stream(30)
    _, events = run(segments(data, isn=2**32 - 1000, mss=97))
    assert frames_of(events) == [e.raw for e in decode(data)]  # type: ignore[union-attr]


def test_snaplen_cut_becomes_a_gap_not_zeros() -> None:
    data = stream(5)
    segs = segments(data, mss=200)
    cut = segs[2]
    segs[2] = Segment(cut.ts, cut.src, cut.sport, cut.dst, cut.dport, cut.seq, cut.flags, cut.payload[:50], missing=150, packet=cut.packet)
    r, events = run(segs)
    gaps = [e.event for e in events if e.event.type == "gap"]  # type: ignore[attr-defined]
    assert [(g.offset, g.length) for g in gaps] == [(250, 150)]
    assert r.connections[0].lost == 150
    assert b"\0" * 150 not in b"".join(frames_of(events)[1:2])


def test_overlap_with_different_bytes_is_counted() -> None:
    data = stream(3)
    segs = segments(data, mss=50)
    bad = segs[2]
    changed = bytes(b ^ 0xFF for b in bad.payload)
    segs.append(Segment(bad.ts + 1, bad.src, bad.sport, bad.dst, bad.dport, bad.seq, bad.flags, changed))
    r, events = run(segs)
    assert r.connections[0].halves["s2c"].conflicts == 1
    assert frames_of(events) == [e.raw for e in decode(data)]  # type: ignore[union-attr]


def test_mid_connection_start_resyncs() -> None:
    data = stream(10)
    segs = segments(data, mss=64, syn=False)[3:]  # no SYN, starts inside a frame
    r, events = run(segs)
    kinds = [e.event.type for e in events]  # type: ignore[attr-defined]
    assert kinds[0] == "garbage" and "frame" in kinds
    full = [e.raw for e in decode(data)]  # type: ignore[union-attr]
    got = frames_of(events)
    assert got == full[-len(got) :]
    assert r.connections[0].role_source == "port" and r.connections[0].server == S


def test_roles_from_syn_port_and_session() -> None:
    hello = encode("HELLO", key="agent", opaque=1)
    # SYN from the client on an unknown port
    r, _ = run(
        [
            Segment(0, *C, "10.0.0.9", 9999, 100, SYN),
            Segment(1, "10.0.0.9", 9999, *C, 900, SYN | ACK),
            Segment(2, *C, "10.0.0.9", 9999, 101, ACK, hello),
        ]
    )
    assert r.connections[0].client == C and r.connections[0].role_source == "syn"
    # no SYN, unknown ports: who sent HELLO is the client
    r, _ = run([Segment(0, "10.0.0.9", 7000, "10.0.0.8", 7001, 1, ACK, hello)])
    assert r.connections[0].client == ("10.0.0.9", 7000) and r.connections[0].role_source == "session"


def test_other_traffic_is_skipped_and_tls_reported() -> None:
    r, events = run(
        [
            Segment(0, "10.0.0.1", 40000, "10.0.0.2", 80, 1, ACK, b"GET / HTTP/1.1\r\n\r\n"),
            Segment(1, "10.0.0.1", 40001, "10.0.0.2", 11207, 1, ACK, b"\x16\x03\x01\x02\x00" + bytes(30)),
        ]
    )
    assert r.skipped_segments == 1
    (tls,) = r.connections
    assert tls.tls and events == []


def test_port_reuse_is_a_new_connection() -> None:
    a = encode("DCP_NOOP", opaque=1)
    segs = [
        Segment(0, *C, *S, 100, SYN),
        Segment(1, *C, *S, 101, ACK, a),
        Segment(2, *C, *S, 101 + len(a), FIN | ACK),
        Segment(3, *S, *C, 500, FIN | ACK),
        Segment(4, *C, *S, 9000, SYN),
        Segment(5, *C, *S, 9001, ACK, a),
        Segment(6, *C, *S, 9001 + len(a), RST),
    ]
    r, events = run(segs)
    assert [c.id for c in r.connections] == [1, 2]
    assert [e.conn.id for e in events if e.event.type == "frame"] == [1, 2]  # type: ignore[attr-defined]


def test_timestamps_of_first_and_completing_packet() -> None:
    data = encode("DCP_MUTATION", extras=MUT, key="k", value=bytes(250), opaque=7)
    segs = segments(data, mss=100, ts0=1000)
    _, events = run(segs)
    (fe,) = [e for e in events if e.event.type == "frame"]  # type: ignore[attr-defined]
    assert (fe.ts_first, fe.ts_last) == (segs[1].ts, segs[-1].ts)
    assert (fe.packet_first, fe.packet_last) == (segs[1].packet, segs[-1].packet)


def test_data_after_the_direction_ended_is_counted_not_decoded() -> None:
    a = encode("DCP_NOOP", opaque=1)
    segs = [
        Segment(0, *S, *C, 500, SYN | ACK),
        Segment(1, *S, *C, 501, FIN | ACK, a),
        Segment(2, *S, *C, 501 + len(a) + 1, ACK, a),  # a corrupt or hostile capture: data after FIN
        Segment(3, *S, *C, 501 + len(a) + 1 + len(a), ACK, a),
    ]
    r, events = run(segs)
    assert frames_of(events) == [a]
    assert r.connections[0].halves["s2c"].after_close == 2 * len(a)


def test_records_held_to_the_end_name_the_file_their_connection_was_last_seen_in(tmp_path: Path) -> None:
    t0 = 1_700_000_000_000_000_000
    a, b = tmp_path / "a.pcap", tmp_path / "b.pcap"
    with PcapWriter(a) as w:  # connection 1: a frame cut short, never closed
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210))
        conv.open(t0)
        conv.send("c2s", encode("GET", key="abc")[:20], t0 + 1000)
    with PcapWriter(b) as w:  # connection 2 in the next file
        conv = TcpConversation(w, ("10.0.0.3", 40001), ("10.0.0.2", 11210))
        conv.open(t0 + 10_000)
        conv.send("c2s", encode("GET", key="x"), t0 + 11_000)
    recs = list(read_records([str(a), str(b)]))
    held = [r for r in recs if r.conn == 1 and r.event.type != "frame"]
    assert held and {r.file for r in held} == {str(a)}
