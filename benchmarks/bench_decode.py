"""Throughput benchmark of the core: framing, dissection and the render path.

Builds, in memory, a stream of N ``DCP_MUTATION`` frames (keys ``doc-000123``
of varying length, JSON-ish values of 40-200 bytes, datatype JSON for some and
raw for others, increasing ``by_seqno``, a few vbuckets and opaques
interleaved) and measures, pinned to one core, the best of 3 runs of:

(a) framing + header decode: ``FrameDecoder().feed(stream)`` all at once, and
    fed in 64 KiB chunks; each both as is and touching ``Frame.header`` of
    every frame (the decoder may leave the full header unpacked until asked);
(b) full dissection: ``dissect(frame)`` of every frame, touching ``extras``,
    ``key``, ``document`` and ``problems``;
(c) dissection plus the ``fields`` list (the render path) on a 100k subset;

plus a naive baseline for context: a plain Python loop of
``struct.unpack_from('>BBHBBHIIQ', buf, pos)`` and a slice per frame.

Targets: framing + header >= 1.5M frames/s, full dissection >= 300k frames/s.
It is a benchmark, not a test: it always exits 0.

Usage::

    python benchmarks/bench_decode.py [--frames N] [--quick] [--runs R]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import struct
import sys
import time
from collections.abc import Callable, Sequence

from dcpinspect import FrameDecoder, dissect, encode
from dcpinspect.wire.events import Frame

FRAMING_TARGET = 1_500_000  # frames/s
DISSECT_TARGET = 300_000  # frames/s
CHUNK = 64 * 1024
TEMPLATES = 512  # distinct frames encoded; the stream repeats them with by_seqno patched
FIELDS_SUBSET = 100_000
SEQNO_OFFSET = 24  # classic header, then extras: by_seqno is the first extras field
VBUCKETS = (0, 3, 17, 511, 1023)
OPAQUES = (0x1000, 0x1001, 0x2A, 0xDEADBEEF)

_WORDS = ("alpha", "beta", "gamma", "delta", "kv", "dcp", "couchbase", "stream", "seqno", "vbucket", "mutation", "hello world")


def _json_value(rng: random.Random, target: int) -> bytes:
    """A JSON object of roughly ``target`` bytes."""
    doc: dict[str, object] = {"type": rng.choice(("user", "order", "event", "item"))}
    i = 0
    while len(json.dumps(doc, separators=(",", ":"))) < target:
        k = f"{rng.choice(_WORDS).replace(' ', '_')}{i}"
        doc[k] = rng.choice((rng.randint(0, 10**9), rng.choice(_WORDS), rng.random() < 0.5, [rng.randint(0, 99) for _ in range(3)]))
        i += 1
    return json.dumps(doc, separators=(",", ":")).encode()


def _raw_value(rng: random.Random, target: int) -> bytes:
    """JSON-ish text sent without the JSON datatype (or binary-ish bytes, now and then)."""
    if rng.random() < 0.2:
        return bytes(rng.getrandbits(8) for _ in range(target))
    text = ",".join(f"{rng.choice(_WORDS)}={rng.randint(0, 10**6)}" for _ in range(target // 8 + 1))
    return text[:target].encode()


def build_templates(rng: random.Random, count: int = TEMPLATES) -> list[bytes]:
    """``count`` distinct DCP_MUTATION frames (by_seqno left 0, patched later)."""
    out: list[bytes] = []
    for i in range(count):
        key = f"doc-{rng.randint(0, 10 ** rng.randint(3, 9)):0{rng.randint(3, 9)}d}"
        if rng.random() < 0.2:
            key += "::" + rng.choice(_WORDS).replace(" ", "-")
        size = rng.randint(40, 200)
        is_json = rng.random() < 0.7
        value = _json_value(rng, size) if is_json else _raw_value(rng, size)
        out.append(
            encode(
                "DCP_MUTATION",
                extras={
                    "by_seqno": 1,
                    "rev_seqno": rng.randint(1, 50),
                    "flags": rng.choice((0, 0x02000006, 0x01000000)),
                    "expiration": rng.choice((0, 0, 0, 1_700_000_000)),
                    "lock_time": 0,
                    "nmeta": 0,
                    "nru": rng.choice((0, 2)),
                },
                key=key,
                value=value,
                datatype=0x01 if is_json else 0x00,
                vbucket=VBUCKETS[i % len(VBUCKETS)],
                opaque=OPAQUES[i % len(OPAQUES)],
                cas=rng.getrandbits(63) | 1,
            )
        )
    return out


def build_stream(n: int, seed: int = 42) -> bytes:
    """N mutation frames, by_seqno increasing from 1."""
    rng = random.Random(seed)
    templates = build_templates(rng)
    heads = [t[:SEQNO_OFFSET] for t in templates]
    tails = [t[SEQNO_OFFSET + 8 :] for t in templates]
    order = [rng.randrange(len(templates)) for _ in range(min(n, 65_536))]
    pack = struct.Struct(">Q").pack
    parts: list[bytes] = []
    append = parts.append
    period = len(order)
    for i in range(n):
        j = order[i % period]
        append(heads[j])
        append(pack(i + 1))
        append(tails[j])
    return b"".join(parts)


# ---------------------------------------------------------------------------
# measured workloads (each returns the number of frames it handled)


def framing_all(stream: bytes) -> int:
    dec = FrameDecoder()
    events = dec.feed(stream)
    events += dec.close()
    return len(events)


def framing_chunked(chunks: Sequence[bytes]) -> int:
    dec = FrameDecoder()
    feed = dec.feed
    n = 0
    for c in chunks:
        n += len(feed(c))
    return n + len(dec.close())


def framing_all_header(stream: bytes) -> int:
    """``feed(all)`` and the unpacked header of every frame (``Frame.header`` may be lazy)."""
    dec = FrameDecoder()
    events = dec.feed(stream)
    events += dec.close()
    for e in events:
        e.header  # type: ignore[union-attr]  # noqa: B018 - the stream holds only frames
    return len(events)


def framing_chunked_header(chunks: Sequence[bytes]) -> int:
    """64 KiB chunks and the unpacked header of every frame."""
    dec = FrameDecoder()
    feed = dec.feed
    n = 0
    for c in chunks:
        events = feed(c)
        for e in events:
            e.header  # type: ignore[union-attr]  # noqa: B018
        n += len(events)
    return n + len(dec.close())


def naive_baseline(stream: bytes) -> int:
    """Plain Python: unpack each header, slice each frame, keep (offset, raw, header)."""
    unpack_from = struct.unpack_from
    out = []
    append = out.append
    pos = 0
    n = len(stream)
    while pos + 24 <= n:
        h = unpack_from(">BBHBBHIIQ", stream, pos)
        end = pos + 24 + h[6]
        append((pos, stream[pos:end], h))
        pos = end
    return len(out)


def dissect_all(frames: Sequence[Frame]) -> int:
    for f in frames:
        d = dissect(f)
        d.extras  # noqa: B018 - touching the attributes is the point
        d.key  # noqa: B018
        d.document  # noqa: B018
        d.problems  # noqa: B018
    return len(frames)


def dissect_fields(frames: Sequence[Frame]) -> int:
    n = 0
    for f in frames:
        d = dissect(f)
        n += len(d.fields)
        d.problems  # noqa: B018
    return len(frames)


def best_of(runs: int, fn: Callable[[], int]) -> tuple[float, int]:
    """Best wall time of ``runs`` calls (a collection before each, none timed)."""
    best = float("inf")
    count = 0
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        count = fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
    return best, count


def _pin_one_core() -> str:
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[-1]})
        return f"pinned to cpu {cpus[-1]} (of {len(cpus)})"
    except (AttributeError, OSError):
        return "not pinned (no sched_setaffinity)"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--frames", type=int, default=None, help="frames in the stream (default 1,000,000; 100,000 with --quick)")
    p.add_argument("--quick", action="store_true", help="smoke run: 100,000 frames")
    p.add_argument("--runs", type=int, default=3, help="runs per measurement; the best is reported (default 3)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    n = args.frames if args.frames is not None else (100_000 if args.quick else 1_000_000)
    n = max(1, n)
    runs = max(1, args.runs)

    pinned = _pin_one_core()
    print(f"python {platform.python_version()} ({platform.python_implementation()}) on {_cpu_model()}; {pinned}")

    t0 = time.perf_counter()
    stream = build_stream(n, args.seed)
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    setup = time.perf_counter() - t0
    mib = len(stream) / 2**20
    print(
        f"stream: {n:,} DCP_MUTATION frames, {len(stream):,} bytes ({mib:.1f} MiB, {len(stream) / n:.1f} B/frame), {len(chunks):,} chunks of 64 KiB; built in {setup:.2f}s"
    )

    rows: list[tuple[str, int, float, int | None]] = []

    def measure(label: str, fn: Callable[[], int], target: int | None, expect: int) -> float:
        dt, count = best_of(runs, fn)
        if count != expect:
            print(f"warning: {label}: handled {count:,} frames, expected {expect:,}")
        rows.append((label, count, dt, target))
        return count / dt if dt > 0 else float("inf")

    base_rate = measure("baseline: unpack_from + slice loop", lambda: naive_baseline(stream), None, n)
    all_rate = measure("(a) framing, feed(all)", lambda: framing_all(stream), FRAMING_TARGET, n)
    chunk_rate = measure("(a) framing, 64 KiB chunks", lambda: framing_chunked(chunks), FRAMING_TARGET, n)
    all_h_rate = measure("(a) framing + .header, feed(all)", lambda: framing_all_header(stream), FRAMING_TARGET, n)
    chunk_h_rate = measure("(a) framing + .header, 64 KiB chunks", lambda: framing_chunked_header(chunks), FRAMING_TARGET, n)

    dec = FrameDecoder()
    frames = [e for e in dec.feed(stream) + dec.close() if isinstance(e, Frame)]
    problems = sum(len(dissect(f).problems) for f in frames[:1000])
    if problems:
        print(f"warning: {problems} problems in the first 1000 frames (the stream should be clean)")
    measure("(b) dissect + extras/key/document/problems", lambda: dissect_all(frames), DISSECT_TARGET, n)
    # the same split by value kind: JSON documents are parsed (json.loads dominates), the rest are not
    json_frames = [f for f in frames if f.datatype & 0x01]
    other_frames = [f for f in frames if not f.datatype & 0x01]
    measure("(b) ... of the non-JSON values only", lambda: dissect_all(other_frames), DISSECT_TARGET, len(other_frames))
    measure("(b) ... of the JSON values only (json.loads)", lambda: dissect_all(json_frames), DISSECT_TARGET, len(json_frames))
    subset = frames[: min(FIELDS_SUBSET, len(frames))]
    measure(f"(c) dissect + .fields ({len(subset):,} subset)", lambda: dissect_fields(subset), None, len(subset))

    print()
    print(f"best of {runs} run(s), one core")
    w = max(len(r[0]) for r in rows)
    header = f"{'measurement':<{w}}  {'frames':>10}  {'best s':>8}  {'frames/s':>12}  {'MiB/s':>8}  {'target':>10}  {'ratio to target':>15}"
    print(header)
    print("-" * len(header))
    per_frame = len(stream) / n
    for label, count, dt, target in rows:
        rate = count / dt if dt > 0 else float("inf")
        tgt = f"{target:,}" if target else "-"
        ratio = f"{rate / target:.2f}x" if target else "-"
        print(f"{label:<{w}}  {count:>10,}  {dt:>8.3f}  {rate:>12,.0f}  {rate * per_frame / 2**20:>8.1f}  {tgt:>10}  {ratio:>15}")
    print()
    print(
        f"framing speed / naive baseline: feed(all) {all_rate / base_rate:.2f}x, 64 KiB chunks {chunk_rate / base_rate:.2f}x;"
        f" with .header: feed(all) {all_h_rate / base_rate:.2f}x, 64 KiB chunks {chunk_h_rate / base_rate:.2f}x"
    )
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a benchmark reports, it does not fail the build
        print(f"bench_decode: error: {exc!r}", file=sys.stderr)
    raise SystemExit(0)
