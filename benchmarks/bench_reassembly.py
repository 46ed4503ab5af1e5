"""TCP reassembly costs: holes, snaplen cuts, many short connections.

    python benchmarks/bench_reassembly.py [--pending 4000] [--connections 16000]

Measures :class:`dcpinspect.flows.reassembly.Reassembler` in one run:

* holes: ``--pending`` one-byte segments wait behind holes (out of order),
  then 2,000 in-order one-byte segments arrive (the cost of each), then the
  capture ends and every hole is given up (the cost of closing);
* snaplen: one connection whose every segment was cut by the capture's snap
  length (the cut bytes are held as holes a retransmission could fill):
  segments per second and the most segments held at once;
* connections: ``--connections`` short connections (handshake, one frame each
  way, FIN both ways) fed one after the other: Python heap growth
  (``tracemalloc``) and the number of entries of the reassembler's maps, with
  every closed connection kept (the default) and with ``keep_closed=100``.

A benchmark, not a test: it prints and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import time
import tracemalloc

from dcpinspect import encode
from dcpinspect.flows.reassembly import ACK, FIN, SYN, Reassembler, Segment

C = ("10.0.0.1", 50000)
S = ("10.0.0.2", 11210)


def holes(pending: int, in_order: int = 2000) -> tuple[float, float]:
    """Microseconds per in-order segment and seconds to close, with ``pending`` segments held behind holes."""
    r = Reassembler()
    isn = 1000
    r.feed(Segment(0, *S, *C, isn, SYN | ACK))
    far = isn + 1 + 10 * in_order
    for i in range(pending):
        r.feed(Segment(i + 1, *S, *C, far + 2 * i, ACK, b"x", packet=i + 1))
    segs = [Segment(pending + i, *S, *C, isn + 1 + i, ACK, b"y", packet=pending + i) for i in range(in_order)]
    gc.collect()
    t0 = time.perf_counter()
    for seg in segs:
        r.feed(seg)
    t1 = time.perf_counter()
    r.close()
    t2 = time.perf_counter()
    return (t1 - t0) / in_order * 1e6, t2 - t1


def snaplen(segments: int = 100_000, mss: int = 1448, snap: int = 60) -> tuple[float, int]:
    """Segments per second of one connection whose every segment was cut to ``snap`` bytes; the most held at once."""
    r = Reassembler()
    isn = 7
    r.feed(Segment(0, *S, *C, isn, SYN | ACK))
    head = len(encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="k"))
    frame = encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="k", value=b"v" * (mss - head))
    seq = isn + 1
    segs = []
    for i in range(segments):  # one frame per segment, each cut after ``snap`` bytes
        segs.append(Segment(i + 1, *S, *C, seq & 0xFFFFFFFF, ACK, frame[:snap], missing=mss - snap, packet=i + 1))
        seq += mss
    most = 0
    t0 = time.perf_counter()
    for k, seg in enumerate(segs):
        r.feed(seg)
        if k % 1024 == 0:
            half = r.connections[0].halves["s2c"]
            most = max(most, len(half.pending))
    r.close()
    dt = time.perf_counter() - t0
    return segments / dt, most


def connections(n: int, keep_closed: int | None) -> tuple[float, dict[str, int]]:
    """KiB of Python heap per connection after ``n`` short connections; the size of each map."""
    kw = {} if keep_closed is None else {"keep_closed": keep_closed}
    if keep_closed is not None and "keep_closed" not in inspect.signature(Reassembler).parameters:
        return float("nan"), {}
    r = Reassembler(**kw)  # type: ignore[arg-type]
    req = encode("DCP_NOOP", opaque=1)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        client = ("10.0.%d.%d" % (i // 250 % 250, i % 250 + 1), 30000 + i % 30000)  # noqa: UP031 - short
        t = i * 10
        r.feed(Segment(t, *client, *S, 100, SYN))
        r.feed(Segment(t + 1, *S, *client, 900, SYN | ACK))
        r.feed(Segment(t + 2, *client, *S, 101, ACK, req))
        r.feed(Segment(t + 3, *S, *client, 901, ACK, req))
        r.feed(Segment(t + 4, *client, *S, 101 + len(req), FIN | ACK))
        r.feed(Segment(t + 5, *S, *client, 901 + len(req), FIN | ACK))
        r.feed(Segment(t + 6, *client, *S, 102 + len(req), ACK))
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    sizes = {name: len(v) for name, v in vars(r).items() if hasattr(v, "__len__") and not isinstance(v, (str, bytes, frozenset))}
    return grown / n / 1024, sizes


def main() -> None:
    """Run the three measurements and print them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pending", type=int, default=4000)
    ap.add_argument("--connections", type=int, default=16000)
    args = ap.parse_args()
    per, close = holes(args.pending)
    print(f"holes: {args.pending} segments pending: {per:.2f} us per in-order segment, close {close * 1000:.1f} ms")
    rate, most = snaplen()
    print(f"snaplen: every segment cut: {rate:,.0f} segments/s, at most {most} segments held")
    for keep in (None, 100):
        kib, sizes = connections(args.connections, keep)
        name = "all closed kept" if keep is None else f"keep_closed={keep}"
        print(f"connections: {args.connections} short ones, {name}: {kib:.2f} KiB heap per connection, maps {sizes}")


if __name__ == "__main__":
    main()
