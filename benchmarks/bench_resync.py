"""Throughput of the decoder while resynchronising: hostile and random garbage.

Feeds (all at once, then closes) ``--mib`` MiB (default 16) of:

* ``0x80`` bytes - every byte is a magic, so every byte is a candidate header;
* random bytes (``random.Random(seed)``) - the plain garbage case; with the
  default ``max_body`` a random header now and then declares a body of some
  MiB that completes, so most of the input is framed, not resynchronised;
  with ``max_body=65536`` nearly all of it is resynchronised over;
* ``0x00`` bytes - no byte is a candidate;
* ``80 57 01`` repeated - every third byte starts a header with a known
  magic and opcode and a valid datatype, whose body length (0x01805701) is
  just above the 22 MiB ``max_body``: rejected by the pattern, in C;
* ``80 07 00`` repeated - the worst case found: every third byte starts a
  plausible header declaring an 8 MiB body; the first is buffered, and at
  close every one of them is taken back (judged in Python), none holds frames
  in step, so it all ends as one truncated frame;
* a stream of DCP_NOOP frames with a corrupt header 40% in that declares a
  20 MiB body and never completes (the rest is taken back and decoded at
  close).

and reports MiB/s (best of ``--runs``, default 3) and the events produced.  It
is a benchmark, not a test: it always exits 0.

Usage::

    python benchmarks/bench_resync.py [--mib 16] [--runs 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from dcpinspect import FrameDecoder
from dcpinspect.protocol import spec


def _noops_with_bogus_header(size: int) -> bytes:
    noop = spec.HEADER.pack(0x80, 0x5C, 0, 0, 0, 0, 0, 0, 0)
    frames = size // len(noop)
    cut = frames * 2 // 5
    bogus = spec.HEADER.pack(0x80, 0x57, 0, 0, 0, 0, 20 * 1024 * 1024, 0, 0)
    return noop * cut + bogus + noop * (frames - cut - 1)


def inputs(mib: int, seed: int) -> list[tuple[str, bytes, dict[str, Any]]]:
    """(label, bytes, decoder options) of each measured input."""
    n = mib * 2**20
    rand = random.Random(seed).randbytes(n)
    return [
        ("0x80 x N (every byte a candidate)", b"\x80" * n, {}),
        ("random bytes", rand, {}),
        ("random bytes, max_body=65536", rand, {"max_body": 65536}),
        ("0x00 x N (no candidate)", bytes(n), {}),
        ("80 57 01 repeated", b"\x80\x57\x01" * (n // 3), {}),
        ("80 07 00 repeated (1/3 judged)", b"\x80\x07\x00" * (n // 3), {}),
        ("noops, bogus 20 MiB header 40% in", _noops_with_bogus_header(n), {}),
    ]


def run(data: bytes, options: dict[str, Any]) -> tuple[float, Counter[str]]:
    gc.collect()
    t0 = time.perf_counter()
    dec = FrameDecoder(**options)
    events = dec.feed(data)
    events += dec.close()
    dt = time.perf_counter() - t0
    return dt, Counter(e.type for e in events)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=16, help="MiB per input (default 16)")
    p.add_argument("--runs", type=int, default=3, help="runs per input; the best is reported (default 3)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    print(f"{'input':<36}  {'MiB':>5}  {'best s':>8}  {'MiB/s':>8}  events")
    for label, data, options in inputs(max(1, args.mib), args.seed):
        best = float("inf")
        kinds: Counter[str] = Counter()
        for _ in range(max(1, args.runs)):
            dt, kinds = run(data, options)
            best = min(best, dt)
        mib = len(data) / 2**20
        print(f"{label:<36}  {mib:>5.1f}  {best:>8.3f}  {mib / best:>8.1f}  {dict(kinds)}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a benchmark reports, it does not fail the build
        print(f"bench_resync: error: {exc!r}", file=sys.stderr)
    raise SystemExit(0)
