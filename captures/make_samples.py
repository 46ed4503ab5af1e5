"""Regenerate the sample captures in this folder: ``python captures/make_samples.py``.

Deterministic: frames are built with ``dcpinspect.wire.encode`` and written with
``dcpinspect.capture.pcapwrite`` (synthesised Ethernet/IPv4/TCP headers, fixed
addresses, sequence numbers and timestamps), so the files are byte-for-byte
reproducible.  ``captures/README.md`` says what each holds.
"""

from __future__ import annotations

import struct
from pathlib import Path

from dcpinspect import decode, encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.protocol.rules import flow_control_size
from dcpinspect.wire.examples import example

HERE = Path(__file__).parent
T0 = 1_763_800_000_000_000_000  # 2025-11-22T08:26:40Z, in ns
CLIENT = ("192.0.2.10", 49152)
SERVER = ("192.0.2.20", 11210)
Message = tuple[str, bytes]


def seed_000() -> list[Message]:
    """Seed 000's worked example: stream request, rollback to 0, retry, success with a 4-entry failover log."""
    names = ["stream-req-rollback-request", "stream-req-rollback-response", "stream-req-retry", "stream-req-success"]
    return [("c2s" if example(n).data[0] == 0x80 else "s2c", example(n).data) for n in names]


def session() -> list[Message]:
    """A consumer's bootstrap and one collection-filtered stream, both directions in order."""
    return _session()


def broken_session() -> list[Message]:
    """:func:`session` with two consumer-visible bugs: ``airline_10`` twice in one snapshot, and an over-ack.

    The producer's deletion at seqno 4 names ``airline_10`` again, already
    delivered at seqno 2 in the same disk snapshot (within a snapshot a key
    appears once: kv_engine docs/dcp, snapshot marker); the consumer then acks
    300 bytes, a round number above the 283 it received (a consumer acks what
    it received, never more: kv_engine docs/dcp, flow control).
    """
    return _session(name="dcpinspect:sample-2", deleted="airline_10", over_ack=OVER_ACK)


#: the broken session's buffer ack: a round number, more than the 283 bytes its snapshot took
OVER_ACK = 300


def _session(*, name: str = "dcpinspect:sample-1", deleted: str = "airline_24", over_ack: int | None = None) -> list[Message]:
    m: list[Message] = []

    def rr(request: bytes, response: bytes) -> None:
        m.append(("c2s", request))
        m.append(("s2c", response))

    rr(
        encode(
            "HELLO",
            key='{"a":"dcpinspect/0.1","i":"0000000000000001/0000000000000001"}',
            value=struct.pack(">HHHHH", 0x12, 0x06, 0x0A, 0x0B, 0x10),
            opaque=1,
        ),
        encode("HELLO", response=True, value=struct.pack(">HHHH", 0x12, 0x06, 0x0B, 0x10), opaque=1),
    )
    rr(encode("SASL_LIST_MECHS", opaque=2), encode("SASL_LIST_MECHS", response=True, value="SCRAM-SHA512 SCRAM-SHA256 PLAIN", opaque=2))
    rr(encode("SASL_AUTH", key="PLAIN", value=b"\0Administrator\0password", opaque=3), encode("SASL_AUTH", response=True, opaque=3))
    rr(encode("SELECT_BUCKET", key="travel-sample", opaque=4), encode("SELECT_BUCKET", response=True, opaque=4))
    rr(encode("DCP_OPEN", key=name, extras={"flags": 0x01 | 0x20}, opaque=5), encode("DCP_OPEN", response=True, opaque=5))
    for i, (k, v) in enumerate((("enable_noop", "true"), ("set_noop_interval", "60"), ("connection_buffer_size", "1048576")), start=6):
        rr(encode("DCP_CONTROL", key=k, value=v, opaque=i), encode("DCP_CONTROL", response=True, opaque=i))
    rr(
        encode("DCP_STREAM_REQ", vbucket=3, opaque=0x1000, extras={"end_seqno": 2**64 - 1}, value={"collections": ["8"]}, datatype=1),
        encode("DCP_STREAM_REQ", response=True, opaque=0x1000, value=[(0x3A5F0C9E21B7, 0)]),
    )
    items = encode("DCP_SNAPSHOT_MARKER", vbucket=3, opaque=0x1000, extras={"start_seqno": 0, "end_seqno": 4, "flags": 0x06})
    mut = {"rev_seqno": 1, "flags": 0x02000006, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0}
    for seqno, key in ((2, "airline_10"), (3, "airline_137")):
        doc = b'{"type":"airline","id":%d}' % seqno
        items += encode(
            "DCP_MUTATION",
            vbucket=3,
            opaque=0x1000,
            extras={**mut, "by_seqno": seqno},
            key=key,
            cid=8,
            value=doc,
            datatype=1,
            cas=0x17A0C5E8F2B40000 + seqno,
        )
    items += encode(
        "DCP_DELETION",
        vbucket=3,
        opaque=0x1000,
        extras={"by_seqno": 4, "rev_seqno": 2, "delete_time": 0},
        key=deleted,  # within a snapshot a key appears once (kv_engine docs/dcp, snapshot marker)
        cid=8,
        cas=0x17A0C5E8F2B40010,
    )
    m.append(("s2c", items))
    # acknowledge exactly the bytes received: every stream message counts in full (kv_engine docs/dcp, flow control)
    received = sum(flow_control_size(f.magic, f.opcode, f.length) for f in decode(items))
    if over_ack is not None:
        assert over_ack > received, (over_ack, received)
    rr(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": over_ack or received}), b"")
    m.append(("s2c", encode("DCP_NOOP", opaque=10000001)))
    m.append(("c2s", encode("DCP_NOOP", response=True, opaque=10000001)))
    return [x for x in m if x[1]]


def write(path: Path, conversations: list[tuple[tuple[str, int], tuple[str, int], list[Message], dict[str, object]]]) -> None:
    """Write conversations one after another (each its own TCP connection)."""
    ts = T0
    with PcapWriter(path) as w:
        for client, server, msgs, opts in conversations:
            conv = TcpConversation(w, client, server, mss=int(opts.get("mss", 1448)))  # type: ignore[call-overload]
            if opts.get("handshake", True):
                conv.open(ts)
            ts += 10_000_000
            for i, (direction, data) in enumerate(msgs):
                skip = tuple(opts.get("skip", {}).get(i, ()))  # type: ignore[attr-defined]
                ts = conv.send(direction, data, ts, skip=skip) + 1_000_000
            if opts.get("close", True):
                conv.close(ts)
            ts += 100_000_000


def messy() -> list[tuple[tuple[str, int], tuple[str, int], list[Message], dict[str, object]]]:
    """Loss, a mid-connection start, garbage, an HTTP connection and a TLS one."""
    mut = {"rev_seqno": 1}
    items = b"".join(
        encode("DCP_MUTATION", vbucket=1, opaque=0x2000, extras={**mut, "by_seqno": i + 1}, key=f"k{i}", value=b"x" * 300)
        for i in range(20)
    )
    lossy = [
        ("c2s", encode("DCP_OPEN", key="lossy", extras={"flags": 1}, opaque=1)),
        ("s2c", encode("DCP_OPEN", response=True, opaque=1)),
        ("s2c", items),
    ]
    late = [("s2c", items[700:])]  # the capture starts inside a frame: no handshake
    noisy = [("s2c", b"\x00\x01not a frame" + encode("DCP_SEQNO_ADVANCED", vbucket=1, opaque=0x3000, extras={"seqno": 99}))]
    http = [("c2s", b"GET / HTTP/1.1\r\nHost: example\r\n\r\n"), ("s2c", b"HTTP/1.1 204 No Content\r\n\r\n")]
    tls = [("c2s", b"\x16\x03\x01\x00\x2f" + bytes(47))]
    return [
        (("192.0.2.11", 49153), SERVER, lossy, {"mss": 1000, "skip": {2: (2,)}}),
        (("192.0.2.12", 49154), SERVER, late, {"handshake": False, "close": False}),
        (("192.0.2.13", 49155), SERVER, noisy, {}),
        (("192.0.2.14", 49156), ("192.0.2.20", 8080), http, {}),
        (("192.0.2.15", 49157), ("192.0.2.20", 11207), tls, {}),
    ]


def main() -> None:
    """Write every sample."""
    (HERE / "seed-000-rollback-retry.bin").write_bytes(b"".join(d for _, d in seed_000()))
    write(HERE / "seed-000-rollback-retry.pcap", [(CLIENT, SERVER, seed_000(), {})])
    write(HERE / "dcp-session.pcap", [(CLIENT, SERVER, session(), {})])
    write(HERE / "messy.pcap", messy())
    write(HERE / "session-broken.pcap", [(CLIENT, SERVER, broken_session(), {})])
    for name in ("seed-000-rollback-retry.bin", "seed-000-rollback-retry.pcap", "dcp-session.pcap", "messy.pcap", "session-broken.pcap"):
        print(f"wrote captures/{name} ({(HERE / name).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
