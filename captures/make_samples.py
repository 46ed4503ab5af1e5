"""Regenerate the raw byte-stream samples in this folder: ``python captures/make_samples.py``.

Each ``.bin`` file is one direction of a connection (or the seed documents'
example frames back to back), frames as they travel on the wire, built with
``dcpinspect.encode`` so the bytes are reproducible.  Decode with
``dcpinspect decode --file captures/NAME.bin`` (add ``--collections`` for the
session samples, which negotiate collections).
"""

from __future__ import annotations

import struct
from pathlib import Path

from dcpinspect import encode
from dcpinspect.examples import example

HERE = Path(__file__).parent


def seed_000() -> bytes:
    """Seed 000's worked example: stream request, rollback to 0, retry, success with a 4-entry failover log."""
    names = ["stream-req-rollback-request", "stream-req-rollback-response", "stream-req-retry", "stream-req-success"]
    return b"".join(example(n).data for n in names)


def session() -> tuple[bytes, bytes]:
    """A consumer's bootstrap and one collection-aware stream: (client->server, server->client)."""
    c: list[bytes] = []
    s: list[bytes] = []
    c.append(
        encode(
            "HELLO",
            key='{"a":"dcpinspect/0.1","i":"0000000000000001/0000000000000001"}',
            value=struct.pack(">HHHHH", 0x12, 0x06, 0x0A, 0x0B, 0x10),
            opaque=1,
        )
    )
    s.append(encode("HELLO", response=True, value=struct.pack(">HHHH", 0x12, 0x06, 0x0B, 0x10), opaque=1))
    c.append(encode("SASL_LIST_MECHS", opaque=2))
    s.append(encode("SASL_LIST_MECHS", response=True, value="SCRAM-SHA512 SCRAM-SHA256 PLAIN", opaque=2))
    c.append(encode("SASL_AUTH", key="PLAIN", value=b"\0Administrator\0password", opaque=3))
    s.append(encode("SASL_AUTH", response=True, opaque=3))
    c.append(encode("SELECT_BUCKET", key="travel-sample", opaque=4))
    s.append(encode("SELECT_BUCKET", response=True, opaque=4))
    c.append(encode("DCP_OPEN", key="dcpinspect:sample-1", extras={"flags": 0x01 | 0x20}, opaque=5))
    s.append(encode("DCP_OPEN", response=True, opaque=5))
    for i, (k, v) in enumerate((("enable_noop", "true"), ("set_noop_interval", "60"), ("connection_buffer_size", "1048576")), start=6):
        c.append(encode("DCP_CONTROL", key=k, value=v, opaque=i))
        s.append(encode("DCP_CONTROL", response=True, opaque=i))
    c.append(encode("DCP_STREAM_REQ", vbucket=3, opaque=0x1000, extras={"end_seqno": 2**64 - 1}, value={"collections": ["8"]}, datatype=1))
    s.append(encode("DCP_STREAM_REQ", response=True, opaque=0x1000, value=[(0x3A5F0C9E21B7, 0)]))
    s.append(encode("DCP_SNAPSHOT_MARKER", vbucket=3, opaque=0x1000, extras={"start_seqno": 0, "end_seqno": 4, "flags": 0x06}))
    mut = {"rev_seqno": 1, "flags": 0x02000006, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0}
    for seqno, key in ((2, "airline_10"), (3, "airline_137")):
        doc = b'{"type":"airline","id":%d}' % seqno
        s.append(
            encode(
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
        )
    s.append(
        encode(
            "DCP_DELETION",
            vbucket=3,
            opaque=0x1000,
            extras={"by_seqno": 4, "rev_seqno": 2, "delete_time": 0},
            key="airline_10",
            cid=8,
            cas=0x17A0C5E8F2B40010,
        )
    )
    s.append(encode("DCP_NOOP", opaque=10000001))
    c.append(encode("DCP_NOOP", response=True, opaque=10000001))
    c.append(encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 300}))
    return b"".join(c), b"".join(s)


def messy() -> bytes:
    """Garbage, a frame, an oversize declared body, a frame, and a frame cut short."""
    ok = encode("DCP_SEQNO_ADVANCED", vbucket=1, opaque=7, extras={"seqno": 99})
    huge = bytearray(encode("DCP_NOOP"))
    huge[8:12] = (0x7FFFFFFF).to_bytes(4, "big")
    return b"\x16\x03\x01noise" + ok + bytes(huge) + ok + ok[:30]


def main() -> None:
    """Write every sample."""
    client, server = session()
    samples = {
        "seed-000-rollback-retry.bin": seed_000(),
        "dcp-session.client.bin": client,
        "dcp-session.server.bin": server,
        "messy-stream.bin": messy(),
    }
    for name, data in samples.items():
        (HERE / name).write_bytes(data)
        print(f"wrote captures/{name} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
