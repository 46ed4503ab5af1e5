"""LiveCapture: live bytes as records and as a pcap that reads back the same, with SASL secrets masked."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcpinspect import encode
from dcpinspect.capture.read import read_records
from dcpinspect.live.tap import LiveCapture


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


def _pcap_frames(pcap: Path) -> list[tuple[str, bytes]]:
    return [(r.direction, r.event[1]) for r in read_records([str(pcap)]) if r.event.type == "frame"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("direction", "mech", "value", "secret"),
    [
        ("s2c", "PLAIN", b"\x00bob\x00hunter2", b"hunter2"),  # a SASL request reflected by an upstream
        ("s2c", "SCRAM-SHA256", b"c=biws,r=n0nce,p=PROOFPROOF", b"PROOFPROOF"),
        ("c2s", "CRAM-MD5", b"bob 0123456789abcdef0123456789abcdef", b"0123456789abcdef0123456789abcdef"),
        ("c2s", "PLAIN ", b"\x00bob\x00hunter2", b"hunter2"),
        ("c2s", "SCRAM-SHA1", b"c=biws,r=n0nce,p=PROOF\x01PROOF", b"PROOF"),
    ],
    ids=["s2c-plain", "s2c-scram", "cram-md5", "plain-space", "scram-nonprintable"],
)
def test_every_sasl_request_masked_in_the_pcap(tmp_path: Path, direction: str, mech: str, value: bytes, secret: bytes) -> None:
    pcap = tmp_path / "m.pcap"
    auth = encode("SASL_AUTH", key=mech, value=value, opaque=1)
    with LiveCapture(pcap=pcap) as cap:
        c = cap.connection(("127.0.0.1", 50002), ("127.0.0.1", 11210))
        c.data(direction, auth[:30])
        c.data(direction, auth[30:])
        c.close()
    assert secret not in pcap.read_bytes()
    assert _pcap_frames(pcap) == [(direction, _masked(auth))]  # the same frame, its secret bytes overwritten
    assert cap.records[0].event[1] == auth  # type: ignore[index]


def _masked(auth: bytes) -> bytes:
    from dcpinspect import dissect
    from dcpinspect.wire.decoder import decode

    out = bytearray(auth)
    for off, n in dissect(decode(auth)[0]).secrets:  # type: ignore[arg-type]
        out[off : off + n] = b"*" * n
    assert bytes(out) != auth
    return bytes(out)


def test_closed_connections_leave_every_per_connection_map_bounded() -> None:
    """20,000 short connections (a request and its answer each): what the capture keeps does not grow with them."""
    from dcpinspect.live.tap import KEEP_CLOSED, STATE_SLACK

    req, resp = encode("GET", key="k", opaque=1), encode("GET", response=True, value=b"v", opaque=1)
    cap = LiveCapture(on_record=lambda r: None)
    r = cap.recorder.reassembler
    sizes = []
    for i in range(20_000):
        c = cap.connection(("127.0.0.1", 30_000 + i), ("127.0.0.1", 11210))
        c.data("c2s", req)
        c.data("s2c", resp)
        c.close(reset=i % 7 == 0, by="s2c" if i % 3 else "c2s")
        if i % 5000 == 4999:
            sizes.append((len(cap.stats.states), len(r.connections), len(r._live), len(getattr(r, "_recently_closed", ()))))
    cap.close()
    assert cap.opened == 20_000 and cap.open == 0 and cap.stats.records == 40_000
    for states, conns, live, recent in sizes:
        assert states <= 2 * STATE_SLACK
        assert conns <= 2 * KEEP_CLOSED + 1  # the closed ones kept (a summary), compacted now and then
        assert live <= 1 and recent <= 1024
    assert cap.records == []  # counted, not kept (a callback was given)


@pytest.mark.parametrize("port", [11207, 11210])
def test_client_port_that_is_a_well_known_port_is_still_decoded(port: int) -> None:
    """A client's ephemeral port may be 11207 (the TLS port): TLS is recognised by its bytes, not by a port."""
    cap = LiveCapture()
    c = cap.connection(("127.0.0.2", port), ("127.0.0.1", 11210))
    c.data("c2s", encode("NOOP", opaque=1))
    c.data("s2c", encode("NOOP", response=True, opaque=1))
    c.close()
    cap.close()
    assert [name(r) for r in cap.records] == ["NOOP", "NOOP"] and c.undecoded is None
