"""Hostile capture files through the whole capture path: 0 exceptions expected.

    python benchmarks/fuzz_captures.py [--count 30000] [--seed 11]

Writes a small valid pcap (dcpinspect.pcapwrite) and a pcapng version of it,
then corrupts copies (random bytes overwritten, truncation) and reads each
through ``read_records`` into the frames table (``FrameColumns``), counting
exceptions by kind.  Exits 1 if there was any.  Not part of the test run.
"""

from __future__ import annotations

import argparse
import random
import struct
import tempfile
import traceback
from pathlib import Path

from dcpinspect import encode
from dcpinspect.columns import FrameColumns
from dcpinspect.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.records import CaptureStats, read_records


def sample_pcap(path: Path) -> bytes:
    items = b"".join(
        encode("DCP_MUTATION", extras={"by_seqno": i + 1, "rev_seqno": 1}, key=f"k{i}", value=bytes(40 + i), opaque=7) for i in range(12)
    )
    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 50000), ("10.0.0.2", 11210), mss=200)
        conv.open(1_700_000_000_000_000_000)
        t = conv.send("c2s", encode("DCP_OPEN", key="c", extras={"flags": 1}, opaque=1), 1_700_000_000_010_000_000)
        t = conv.send("s2c", items, t)
        conv.close(t)
    return path.read_bytes()


def as_pcapng(pcap: bytes) -> bytes:
    """The same packets as pcapng (section header, one interface, enhanced packet blocks)."""

    def block(btype: int, body: bytes) -> bytes:
        body += bytes(-len(body) % 4)
        n = 12 + len(body)
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    out += block(1, struct.pack("<HHI", 1, 0, 262144) + struct.pack("<HHB3x", 9, 1, 9) + b"\0\0\0\0")
    pos = 24
    while pos < len(pcap):
        sec, frac, caplen, wirelen = struct.unpack_from("<IIII", pcap, pos)
        ts = sec * 1_000_000_000 + frac
        out += block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, caplen, wirelen) + pcap[pos + 16 : pos + 16 + caplen])
        pos += 16 + caplen
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="dcpinspect-fuzz-"))
    samples = {"pcap": sample_pcap(tmp / "s.pcap")}
    samples["pcapng"] = as_pcapng(samples["pcap"])
    errors = problems = rows = 0
    kinds: dict[tuple[str, str, int], int] = {}
    for _ in range(args.count):
        fmt = rng.choice(["pcap", "pcapng"])
        data = bytearray(samples[fmt])
        for _ in range(rng.randrange(1, 30)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            del data[rng.randrange(len(data)) :]
        path = tmp / f"x.{fmt}"
        path.write_bytes(bytes(data))
        st = CaptureStats()
        try:
            cols = FrameColumns().extend(read_records([str(path)], stats=st))
            rows += cols.rows
            info = st.files[str(path)]
            errors += bool(info["error"])
            problems += len(info["problems"])
        except Exception as exc:
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            sig = (type(exc).__name__, Path(tb.filename).name, tb.lineno or 0)
            if sig not in kinds:
                traceback.print_exc()
            kinds[sig] = kinds.get(sig, 0) + 1
    total = sum(kinds.values())
    print(
        f"fuzz_captures: {args.count} corrupted captures, {total} exceptions, {errors} reported as not readable, {problems} file problems, {rows} table rows"
    )
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
