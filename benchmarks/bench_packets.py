"""segment_windows vs capture_segments: packets/s on one generated capture (CPU time, best of N).

python benchmarks/bench_packets.py [--frames 1000000] [--mss 1448] [--repeat 3] [--pcapng]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_capture

from dcpinspect.capture.read import capture_segments
from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.packets_vector import segment_windows


def to_pcapng(src: Path, dst: Path) -> None:
    import struct

    from dcpinspect.capture.pcapfile import CaptureReader

    with dst.open("wb") as f:

        def block(bt: int, body: bytes) -> None:
            body += bytes(-len(body) % 4)
            f.write(struct.pack("<II", bt, len(body) + 12) + body + struct.pack("<I", len(body) + 12))

        block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
        block(1, struct.pack("<HHI", 1, 0, 262144) + struct.pack("<HHB3xHH", 9, 1, 9, 0, 0))
        for p in CaptureReader(str(src)):
            block(6, struct.pack("<IIIII", 0, p.ts >> 32, p.ts & 0xFFFFFFFF, len(p.data), p.wirelen) + p.data)


def cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--mss", type=int, default=1448)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pcapng", action="store_true")
    a = ap.parse_args()
    bench_capture.MSS = a.mss
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.pcap"
        bench_capture.write_capture(path, a.frames)
        if a.pcapng:
            ng = Path(d) / "big.pcapng"
            to_pcapng(path, ng)
            path = ng
        st = CaptureStats()
        n_seg = sum(1 for _ in capture_segments([str(path)], st))
        packets = st.packets
        print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB, {packets} packets, {n_seg} segments, mss {a.mss}")

        def old() -> None:
            for _ in capture_segments([str(path)], CaptureStats()):
                pass

        def new() -> None:
            for _ in segment_windows([str(path)], CaptureStats()):
                pass

        t_old = min(cpu(old) for _ in range(a.repeat))
        t_new = min(cpu(new) for _ in range(a.repeat))
        print(f"capture_segments: {t_old:.2f} s CPU, {packets / t_old / 1e3:.0f}k packets/s")
        print(f"segment_windows : {t_new:.2f} s CPU, {packets / t_new / 1e3:.0f}k packets/s  ({t_old / t_new:.1f}x)")


if __name__ == "__main__":
    main()
