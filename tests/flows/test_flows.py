"""TCP reassembly (pure): segmentation, reordering, duplicates, loss, wrap, reuse, roles."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from scripts import load_script

from dcpinspect import decode, encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.capture.read import read_records
from dcpinspect.flows.reassembly import ACK, FIN, RST, SYN, Reassembler, Segment
from dcpinspect.flows.session import ConnState
from dcpinspect.wire.events import Frame

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


def test_tls_after_a_handshake_on_a_memcached_port_is_reported_not_decoded() -> None:
    hello = b"\x16\x03\x01\x02\x00" + bytes(60)
    r, events = run([Segment(0, *C, *S, 100, SYN), Segment(1, *S, *C, 500, SYN | ACK), Segment(2, *C, *S, 101, ACK, hello)])
    (conn,) = r.connections
    assert conn.tls and events == []


def test_a_client_port_of_11207_is_not_tls() -> None:
    frame = encode("DCP_NOOP", opaque=1)
    r, events = run([Segment(0, "10.0.0.1", 11207, *S, 100, SYN), Segment(1, "10.0.0.1", 11207, *S, 101, ACK, frame)])
    (conn,) = r.connections
    assert not conn.tls and frames_of(events) == [frame]


def test_the_compare_window_is_bounded_and_may_be_off() -> None:
    from dcpinspect.flows import halfstream as flows

    data = stream(2000)
    for window in (flows.RECENT, 0):
        r = Reassembler(compare_window=window)
        for seg in segments(data, mss=1000):
            for _ in r.feed(seg):
                pass
        half = r.connections[0].halves["s2c"]
        assert len(half._recent) <= 2 * window
        assert half.bytes == len(data)


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


# --- out-of-order holes cost O(log n) per segment (audit finding A) ------------------------------


class _CountingDict(dict[int, tuple[bytes, int, int, int]]):
    """A ``pending`` map that counts the keys anyone walks through (a complexity proxy, not a clock)."""

    visits = 0

    def __iter__(self) -> Iterator[int]:
        for k in super().__iter__():
            _CountingDict.visits += 1
            yield k


def _holes_run(n: int, m: int) -> tuple[Reassembler, list[object], int]:
    """``n`` one-byte segments held behind one-byte holes, ``m`` in-order segments, then the end."""
    isn = 1000
    r = Reassembler()
    r.feed(Segment(0, *S, *C, isn, SYN | ACK))
    r.connections[0].halves["s2c"].pending = _CountingDict()
    _CountingDict.visits = 0
    events: list[object] = []
    far = isn + 1 + m
    for i in range(n):
        events += r.feed(Segment(1 + i, *S, *C, far + 2 * i, ACK, b"\x00", packet=1 + i))
    for i in range(m):
        events += r.feed(Segment(1 + n + i, *S, *C, isn + 1 + i, ACK, b"\x00", packet=1 + n + i))
    events += r.close()
    return r, events, _CountingDict.visits


def test_pending_holes_cost_no_scan_of_the_held_segments() -> None:
    n, m = 3000, 1000
    r, events, visits = _holes_run(n, m)
    half = r.connections[0].halves["s2c"]
    gaps = [(e.event.offset, e.event.length) for e in events if e.event.type == "gap"]  # type: ignore[attr-defined]
    assert gaps == [(m + 2 * i + 1, 1) for i in range(n - 1)]  # the holes between the held bytes, nothing else
    assert half.lost == n - 1 and half.bytes == n + m and not half.pending
    pos = 0
    for e in events:  # the events tile the stream
        assert e.event.offset == pos  # type: ignore[attr-defined]
        pos += e.event.length  # type: ignore[attr-defined]
    assert pos == m + 2 * n - 1
    # the held segments are never walked: each one is looked at O(1) times, not once per later segment (was ~n*m + n*n/2)
    assert visits <= 2 * (n + m)


# --- snaplen cuts are holes a retransmission can fill (audit finding B) ----------------------------


def _cut(seg: Segment, keep: int) -> Segment:
    return seg._replace(payload=seg.payload[:keep], missing=len(seg.payload) - keep)


def test_a_snaplen_cut_filled_by_a_retransmission_is_not_lost() -> None:
    frame = encode("DCP_MUTATION", extras=MUT, key="k", value=bytes(100), opaque=7)
    syn, seg = segments(frame, mss=len(frame))
    r, events = run([syn, _cut(seg, 10), seg._replace(ts=9, packet=9)])
    assert frames_of(events) == [frame]
    assert [e for e in events if e.event.type != "frame"] == []  # type: ignore[attr-defined]
    assert r.connections[0].lost == 0 and r.connections[0].halves["s2c"].conflicts == 0


def test_a_capture_that_cuts_every_segment_holds_little() -> None:
    """A small snaplen (tcpdump -s 96) cuts every segment: the holes are given up after a few segments, not 4,096 each."""
    from dcpinspect.flows import halfstream as flows

    data = stream(400)
    segs = segments(data, mss=200)
    r = Reassembler()
    held = 0
    for seg in [segs[0], *(_cut(s, 40) for s in segs[1:])]:
        for _ in r.feed(seg):
            pass
        half = r.connections[0].halves["s2c"] if r.connections else None
        if half is not None:
            held = max(held, len(half.pending))
    for _ in r.close():
        pass
    lost = r.connections[0].lost
    assert 0 < held <= flows.MAX_CUT_PENDING_SEGMENTS < 100  # not the 4,096 allowed behind a plain hole
    assert lost == sum(len(s.payload) - 40 for s in segs[1:] if len(s.payload) > 40)  # every cut byte, exactly once


def test_a_snaplen_cut_filled_later_while_later_segments_wait() -> None:
    data = stream(6)
    segs = segments(data, mss=120)
    k = 3
    late = segs[k]._replace(ts=10**6, packet=999)
    segs[k] = _cut(segs[k], 7)
    for cut_pending in (False, True):  # the cut segment in order, or itself held out of order
        body = segs[1:]
        if cut_pending:
            body = [*body[k - 1 : k], *body[: k - 1], *body[k:]]
        r, events = run([segs[0], *body, late])
        assert frames_of(events) == [e.raw for e in decode(data)]  # type: ignore[union-attr]
        assert r.connections[0].lost == 0


def test_a_snaplen_cut_held_out_of_order_is_replaced_by_its_full_retransmission() -> None:
    data = stream(4)
    segs = segments(data, mss=150)
    cut = _cut(segs[3], 20)
    r, events = run([segs[0], segs[1], cut, segs[3], segs[2], *segs[4:]])  # both wait behind segs[2]
    assert frames_of(events) == [e.raw for e in decode(data)]  # type: ignore[union-attr]
    assert r.connections[0].lost == 0


def test_an_unfilled_snaplen_cut_is_lost_at_close_dated_by_the_cut_packet() -> None:
    a = encode("DCP_NOOP", opaque=1)
    frame = encode("DCP_MUTATION", extras=MUT, key="k", value=bytes(100), opaque=7)
    segs = [
        Segment(0, *C, *S, 100, SYN),
        Segment(1, *S, *C, 500, SYN | ACK, packet=2),
        Segment(2, *S, *C, 501, ACK, frame[:30], missing=len(frame) - 30, packet=3),
        Segment(3, *S, *C, 501 + len(frame), FIN | ACK, packet=4),
        Segment(4, *C, *S, 101, ACK, a, packet=5),
        Segment(5, *C, *S, 101 + len(a), FIN | ACK, packet=6),  # both ends sent FIN: nothing can fill it now
        Segment(6, "10.9.9.9", 1, "10.9.9.8", 11210, 1, ACK, a, packet=7),  # the capture goes on
    ]
    r = Reassembler()
    done = [e for seg in segs[:6] for e in r.feed(seg)]
    (gap,) = [e for e in done if e.event.type == "gap"]
    assert (gap.event.offset, gap.event.length) == (30, len(frame) - 30)
    assert (gap.packet_first, gap.ts_first) == (3, 2)
    assert r.connections[0].closed and r.connections[0].lost == len(frame) - 30


# --- closed connections leave every map (audit finding C) -----------------------------------------


_GET = encode("GET", key="key-00000", opaque=0)
_GOT = encode("GET", key="key-00000", value=b"v", opaque=0, response=True)


def _messages(i: int) -> tuple[bytes, bytes]:
    """The request and response of short connection ``i`` (its number in the key and the opaque)."""
    key, opaque = f"key-{i:05d}".encode(), i.to_bytes(4, "big")
    return tuple(m[:12] + opaque + m[16:].replace(b"key-00000", key) for m in (_GET, _GOT))  # type: ignore[return-value]


def _short(i: int, port: int, *, lose: bool) -> list[Segment]:
    """One short connection: a request in two segments (the first lost if ``lose``), a response, FIN both ways, the last ACK."""
    cl = ("10.1.%d.%d" % (i // 200 % 200, i % 200), port)  # noqa: UP031
    req, resp = _messages(i)
    ci, si = (7 * i) & 0xFFFFFFFF, (13 * i + 5) & 0xFFFFFFFF
    t = 100 * i
    out = [Segment(t, *cl, *S, ci, SYN), Segment(t + 1, *S, *cl, si, SYN | ACK)]
    if not lose:
        out.append(Segment(t + 2, *cl, *S, (ci + 1) & 0xFFFFFFFF, ACK, req[:10]))
    out += [
        Segment(t + 3, *cl, *S, (ci + 11) & 0xFFFFFFFF, ACK, req[10:]),
        Segment(t + 4, *S, *cl, (si + 1) & 0xFFFFFFFF, ACK, resp),
        Segment(t + 5, *cl, *S, (ci + 1 + len(req)) & 0xFFFFFFFF, FIN | ACK),
        Segment(t + 6, *S, *cl, (si + 1 + len(resp)) & 0xFFFFFFFF, FIN | ACK),
        Segment(t + 7, *cl, *S, (ci + 2 + len(req)) & 0xFFFFFFFF, ACK),  # after the close: no new connection
    ]
    if i % 10 == 0:  # other traffic, its tuple forgotten at FIN both ways
        web = ("10.2.0.%d" % (i % 250), 40000 + i % 20000)  # noqa: UP031
        out += [
            Segment(t + 8, *web, "10.0.0.80", 80, 1, ACK, b"GET / HTTP/1.1\r\n\r\n"),
            Segment(t + 9, *web, "10.0.0.80", 80, 20, FIN | ACK),
            Segment(t + 9, "10.0.0.80", 80, *web, 9, FIN | ACK),
        ]
    return out


def _results(events: list[object]) -> tuple[list[tuple[str, bytes]], list[tuple[str, int, int]], dict[str, int]]:
    """Frames and gaps of one connection, and the bytes its events account for per direction."""
    frames = [(e.direction, e.event.raw) for e in events if e.event.type == "frame"]  # type: ignore[attr-defined]
    gaps = [(e.direction, e.event.offset, e.event.length) for e in events if e.event.type == "gap"]  # type: ignore[attr-defined]
    tiled: dict[str, int] = {}
    for e in events:
        assert e.event.offset == tiled.get(e.direction, 0)  # type: ignore[attr-defined]
        tiled[e.direction] = e.event.offset + e.event.length  # type: ignore[attr-defined]
    return frames, gaps, tiled


def test_twenty_thousand_short_connections_leave_the_maps_bounded() -> None:
    n, keep = 20_000, 50
    r = Reassembler(keep_closed=keep)
    dropped: list[int] = []
    r.on_drop = lambda conn: dropped.append(conn.id)
    per_conn: dict[int, list[object]] = {}
    largest: dict[str, int] = {}
    for i in range(n):
        for seg in _short(i, 20000 + i % 500, lose=i % 7 == 0):  # each client port reused 40 times
            for e in r.feed(seg):
                per_conn.setdefault(e.conn.id, []).append(e)
        if i % 97 == 0:
            for name, value in vars(r).items():
                if hasattr(value, "__len__") and not isinstance(value, (str, bytes, frozenset)):
                    largest[name] = max(largest.get(name, 0), len(value))
    assert r.close() == []
    kept = [c for c in r.connections if not c.dropped]
    assert len(kept) == keep and r.dropped["connections"] + keep == n == len(per_conn)
    assert sorted(dropped) == list(range(1, n - keep + 1))
    assert r.dropped["lost"] + sum(c.lost for c in kept) == 10 * len(range(0, n, 7))
    assert r.skipped_segments == 3 * len(range(0, n, 10))
    # every map stays small: nothing grows with the number of connections
    assert largest.pop("_recently_closed") <= 1024
    assert largest.pop("connections") <= 2 * keep + 64 + 2
    assert all(size <= keep + 64 for size in largest.values()), largest
    for i in range(n):  # what each connection alone gives
        req, resp = _messages(i)
        frames, gaps, tiled = _results(per_conn[i + 1])
        if i % 7:
            assert (frames, gaps) == ([("c2s", req), ("s2c", resp)], []), i
        else:
            assert (frames, gaps) == ([("s2c", resp)], [("c2s", 0, 10)]), i
        assert tiled == {"c2s": len(req), "s2c": len(resp)}


def test_closed_connections_leave_the_live_map_even_when_all_are_kept() -> None:
    from dcpinspect.flows.reassembly import MAX_RECENTLY_CLOSED

    n = MAX_RECENTLY_CLOSED + 200
    r = Reassembler()  # the default: every connection stays listed (a capture's summary)
    for i in range(n):
        for seg in _short(i, 20000 + i % 300, lose=False):
            r.feed(seg)
    assert len(r.connections) == n and all(c.closed for c in r.connections)
    assert not r._live and len(r._recently_closed) == MAX_RECENTLY_CLOSED and not r._ignored
    assert {c.halves["c2s"].decoder for c in r.connections} == {r.connections[0].halves["s2c"].decoder}  # one shared


def test_other_traffic_and_idle_connections_are_forgotten() -> None:
    a = encode("DCP_NOOP", opaque=1)
    web = ("10.0.0.9", 40000)
    r = Reassembler(keep_closed=0)
    # a SYN on an unknown port whose first bytes are not memcached binary; it ends with a RST
    r.feed(Segment(0, *web, "10.0.0.8", 8080, 1, SYN))
    r.feed(Segment(1, *web, "10.0.0.8", 8080, 2, ACK, b"GET / HTTP/1.1\r\n\r\n"))
    r.feed(Segment(2, "10.0.0.8", 8080, *web, 7, ACK, b"HTTP/1.1 200 OK\r\n\r\n"))
    r.feed(Segment(3, *web, "10.0.0.8", 8080, 40, RST))
    assert r.connections == [] and not r._live and not r._ignored and r.skipped_segments == 3
    # a connection that vanishes without FIN or RST: live until expired, then its held bytes are given up
    r.feed(Segment(10, *S, *C, 500, SYN | ACK))
    r.feed(Segment(11, *S, *C, 501, ACK, a[:10], packet=2))
    assert r.expire(11) == [] and len(r._live) == 1
    (batch,) = r.expire(12)
    assert [ev.type for ev in batch[2]] == ["truncated"] and r.connections[0].closed and not r._live
    r.feed(Segment(13, *S, *C, 501 + len(a), ACK, a))  # late: counted on the closed connection, not a new one
    assert [c.id for c in r.connections] == [1] and r.connections[0].halves["s2c"].after_close == len(a)
    r.feed(Segment(14, "10.9.9.9", 1, *S, 1, ACK, a))  # the next segment drops the closed one (keep_closed=0)
    assert [c.id for c in r.connections if not c.dropped] == [2] and r.dropped["connections"] == 1


def test_the_out_of_order_bound_gives_up_the_earliest_hole_exactly() -> None:
    from dcpinspect.flows.halfstream import MAX_PENDING_SEGMENTS

    n = MAX_PENDING_SEGMENTS + 10
    r = Reassembler()
    r.feed(Segment(0, *S, *C, 0, SYN | ACK))
    events = [e for i in range(n) for e in r.feed(Segment(1 + i, *S, *C, 1 + 1 + 2 * i, ACK, b"\x00", packet=2 + i))]
    half = r.connections[0].halves["s2c"]
    assert len(half.pending) == MAX_PENDING_SEGMENTS
    gaps = [(e.event.offset, e.event.length) for e in events if e.event.type == "gap"]
    assert gaps == [(2 * i, 1) for i in range(n - MAX_PENDING_SEGMENTS)] and half.lost == len(gaps)


# --- reassembly against the ground truth (audit finding D; benchmarks/fuzz_reassembly.py runs thousands) ---


def test_fuzz_slice_matches_the_ground_truth() -> None:
    fuzz = load_script("benchmarks/fuzz_reassembly.py")
    failures = {seed: problem for seed in range(200) if (problem := fuzz.trial(seed))}
    assert failures == {}
    assert fuzz.shared(range(1000, 1100)) == {}  # one long-lived reassembler: pruning and port reuse change nothing


def test_a_one_way_control_that_is_on_stays_on() -> None:
    """send_stream_end_on_client_close_stream: "true" then "false", both accepted: the connection keeps "true" (producer.cc)."""
    st = ConnState()
    for value in ("true", "false"):
        st.observe("c2s", Frame(0, encode("DCP_CONTROL", key="send_stream_end_on_client_close_stream", value=value, opaque=7)))
        st.observe("s2c", Frame(0, encode("DCP_CONTROL", response=True, opaque=7)))
    assert st.controls["send_stream_end_on_client_close_stream"] == "true"
    st.observe("c2s", Frame(0, encode("DCP_CONTROL", key="set_priority", value="high", opaque=8)))
    st.observe("s2c", Frame(0, encode("DCP_CONTROL", response=True, opaque=8)))
    st.observe("c2s", Frame(0, encode("DCP_CONTROL", key="set_priority", value="low", opaque=9)))
    st.observe("s2c", Frame(0, encode("DCP_CONTROL", response=True, opaque=9)))
    assert st.controls["set_priority"] == "low"  # an ordinary key takes the newest value
