"""LiveCapture: live bytes as records and as a pcap that reads back the same, with SASL secrets masked."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcpinspect import encode
from dcpinspect.live import LiveCapture
from dcpinspect.records import read_records


def name(r: object) -> str:
    ev = r.event  # type: ignore[attr-defined]
    return ev.name if ev.type == "frame" else ev.type


@pytest.mark.parametrize("cut", [3, 30, 40])
@pytest.mark.parametrize("keep", [False, True])
def test_sasl_secret_masked_in_the_pcap_only(tmp_path: Path, cut: int, keep: bool) -> None:
    pcap = tmp_path / "s.pcap"
    auth = encode("SASL_AUTH", key="PLAIN", value=b"\x00bob\x00hunter2", opaque=1)
    mutation = encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="k", value=b"hunter2 is a value", opaque=2)
    with LiveCapture(pcap=pcap, keep_secrets=keep) as cap:
        c = cap.connection(("127.0.0.1", 50000), ("127.0.0.1", 11210))
        c.data("c2s", auth[:cut])
        c.data("c2s", auth[cut:] + mutation[:10])  # the next frame starts in the same packet
        c.data("s2c", encode("SASL_AUTH", response=True, opaque=1))
        c.data("c2s", mutation[10:])
        c.close()
    raw = pcap.read_bytes()
    assert raw.count(b"hunte") == (2 if keep else 1)  # the mutation's value is never touched
    back = list(read_records([str(pcap)]))
    assert [name(r) for r in back] == [name(r) for r in cap.records] == ["SASL_AUTH", "SASL_AUTH", "DCP_MUTATION"]
    assert [(r.number, r.packet, r.direction) for r in back] == [(r.number, r.packet, r.direction) for r in cap.records]
    assert cap.records[0].event[1] == auth  # the records hold what was forwarded
    assert back[0].event[1] == (auth if keep else auth.replace(b"hunter2", b"*******"))


def test_connection_ending_inside_a_sasl_frame_is_written_masked(tmp_path: Path) -> None:
    pcap = tmp_path / "cut.pcap"
    auth = encode("SASL_AUTH", key="PLAIN", value=b"\x00bob\x00hunter2")
    with LiveCapture(pcap=pcap) as cap:
        c = cap.connection(("127.0.0.1", 50001), ("127.0.0.1", 11210))
        c.data("c2s", auth[:-2])
        c.close()
    raw = pcap.read_bytes()
    assert b"hunte" not in raw and auth[:24] in raw
    assert [r.event.type for r in read_records([str(pcap)])] == ["truncated"]
