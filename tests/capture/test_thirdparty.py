"""Real memcached binary captures recorded by others decode cleanly.

Read from ../shared/captures/third-party (never copied into the project).
The capture reader and reassembler are a later issue; here the TCP payloads
of these clean captures are ordered by sequence number with scapy and fed
straight to the decoder, in the chunks the packets carried.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from paths import THIRD_PARTY

from dcpinspect import FrameDecoder, dissect

#: PROVENANCE.md: memcached frames per capture
EXPECTED = {
    "packetbeat_memcache_bin_tcp_counter_ops.pcap": 10,
    "packetbeat_memcache_bin_tcp_delete.pcap": 8,
    "packetbeat_memcache_bin_tcp_multi_store_load.pcap": 18,
    "packetbeat_memcache_bin_tcp_single_load_store.pcap": 6,
    "packetbeat_memcache_bin_tcp_stats.pcap": 60,
}

pytestmark = [pytest.mark.shared, pytest.mark.skipif(not THIRD_PARTY.is_dir(), reason="../shared/captures/third-party is absent")]


def _directions(path: Path) -> dict[tuple[str, int, str, int], list[bytes]]:
    from scapy.layers.inet import IP, TCP
    from scapy.utils import rdpcap

    segs: dict[tuple[str, int, str, int], dict[int, bytes]] = {}
    for pkt in rdpcap(str(path)):
        if IP in pkt and TCP in pkt and bytes(pkt[TCP].payload):
            key = (pkt[IP].src, pkt[TCP].sport, pkt[IP].dst, pkt[TCP].dport)
            segs.setdefault(key, {})[pkt[TCP].seq] = bytes(pkt[TCP].payload)
    return {k: [v[s] for s in sorted(v)] for k, v in segs.items()}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_third_party_capture_decodes_cleanly(name: str) -> None:
    frames = []
    for chunks in _directions(THIRD_PARTY / name).values():
        dec = FrameDecoder()
        events = [e for c in chunks for e in dec.feed(c)] + dec.close()
        assert [e.type for e in events if e.type != "frame"] == []
        frames += events
    assert len(frames) == EXPECTED[name]
    for f in frames:
        d = dissect(f)  # type: ignore[arg-type]
        assert d.problems == [], (d.title, [p.message for p in d.problems])
        assert not d.name.startswith("unknown")


def test_stats_capture_has_the_frame_crossing_a_segment() -> None:
    dirs = _directions(THIRD_PARTY / "packetbeat_memcache_bin_tcp_stats.pcap")
    server = next(chunks for (_, sport, _, _), chunks in dirs.items() if sport == 11211)
    dec = FrameDecoder()
    crossing = 0
    for chunk in server:
        before = dec.buffered
        events = dec.feed(chunk)
        crossing += bool(before and events)
    assert crossing >= 1
    one = FrameDecoder()
    names = [dissect(e).name for c in server for e in one.feed(c)]  # type: ignore[arg-type]
    assert names.count("STAT") == 53  # PROVENANCE.md: "answered by 53 STAT frames"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_third_party_capture_through_the_capture_reader(name: str) -> None:
    from dcpinspect.capture.read import read_records
    from dcpinspect.flows.records import CaptureStats

    st = CaptureStats()
    records = list(read_records([str(THIRD_PARTY / name)], stats=st))
    assert [r.event.type for r in records] == ["frame"] * EXPECTED[name]
    info = st.files[str(THIRD_PARTY / name)]
    assert info["error"] is None and info["problems"] == [] and info["format"] == "pcap"
    (conn,) = st.connections
    assert conn.server == ("192.168.188.38", 11211) and conn.client[0] == "192.168.188.37"
    assert conn.role_source == "syn" and conn.lost == 0
    for r in records:
        assert r.conn == 1 and r.direction == ("c2s" if r.event.role == "request" else "s2c")  # type: ignore[union-attr]
        assert r.ts >= r.ts_first > 1_400_000_000 * 10**9
        assert dissect(r.event, r.context).problems == []  # type: ignore[arg-type]
    assert [r.number for r in records] == list(range(1, len(records) + 1))


@pytest.mark.tshark
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tshark_agrees_on_third_party_captures(name: str) -> None:
    from tshark import TSHARK, opaque_value, tshark_frames

    if TSHARK is None:
        pytest.skip("tshark is not installed")
    from dcpinspect.capture.read import read_records

    theirs = tshark_frames(THIRD_PARTY / name)
    mine = sorted((r for r in read_records([str(THIRD_PARTY / name)]) if r.event.type == "frame"), key=lambda r: (r.packet, r.event.offset))
    assert len(theirs) == len(mine) == EXPECTED[name]
    for p, r in zip(theirs, mine, strict=True):
        fr = r.event
        assert int(p["couchbase.opcode"], 16) == fr.opcode  # type: ignore[union-attr]
        assert opaque_value(p["couchbase.opaque"]) == fr.opaque  # type: ignore[union-attr]
        assert int(p["couchbase.total_bodylength"]) == fr.body_length  # type: ignore[union-attr]
        d = dissect(fr, r.context)  # type: ignore[arg-type]
        if d.key:
            assert p["couchbase.key"] == d.key_text
