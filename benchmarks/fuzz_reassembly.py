"""Fuzz TCP reassembly against the ground truth: what was sent, what the capture kept.

Each trial builds one connection (a random initial sequence number, often
near the 32-bit wrap) whose two directions carry known bytes (memcached-binary
frames, now and then random bytes), cuts each direction into random segments
and then damages what a capture would see:

* segments lost (never captured);
* segments cut by the snap length (a prefix kept, the rest only counted in
  ``Segment.missing``), including cut retransmissions;
* duplicates, and retransmissions of random ranges that overlap several
  original segments;
* local reordering (and now and then a segment far later), the two
  directions interleaved;
* an ending: FIN both ways (the first anywhere, the second last), a RST, or
  nothing (the capture just ends).

The ground truth of a direction: a byte is *captured* if any captured segment
carries it; the stream's known extent is its FIN (when the FIN was captured)
or else the furthest byte any captured segment accounts for (payload plus
``missing``); every byte inside the extent that no segment carries is *lost*.
The reassembler must deliver every captured byte, at its offset, with its
value (frames, garbage and truncated frames together tile the stream), report
exactly the lost bytes as gaps (nothing more, nothing less: ``HalfStream.lost``
and the gap events), and count no conflicting retransmission.  Trials stay far
below the out-of-order bounds (``MAX_PENDING``, ``MAX_PENDING_SEGMENTS``), so
no hole is given up early.

With ``--shared`` the trials go through one long-lived reassembler
(``keep_closed=8``), four connections at a time interleaved, each client port
reused 64 trials later: pruning closed connections and port reuse must not
change any connection's events.

Usage::

    python benchmarks/fuzz_reassembly.py [--trials 3000] [--seed S] [--show 5] [--shared]

The last line reads ``fuzz_reassembly: 3000 trials, 0 failures (...)``; the
exit status is 1 if any trial failed.  :func:`trial` is also the CI slice of
``tests/test_flows.py``.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from typing import NamedTuple

from dcpinspect import encode
from dcpinspect.flows.reassembly import ACK, FIN, RST, SYN, Connection, FlowEvent, Reassembler, Segment

C = ("10.0.0.1", 50000)
S = ("10.0.0.2", 11210)
MUT = {"by_seqno": 1, "rev_seqno": 1}


def payload(rng: random.Random) -> bytes:
    """The bytes one direction sends: frames, now and then random bytes in between."""
    out = []
    for i in range(rng.randrange(0, 12)):
        if rng.random() < 0.1:
            out.append(rng.randbytes(rng.randrange(1, 60)))
        else:
            value = rng.randbytes(rng.choice((0, 1, 5, 40, 200, 700)))
            out.append(encode("DCP_MUTATION", extras={**MUT, "by_seqno": i + 1}, key=f"k{i}", value=value, opaque=i))
    return b"".join(out)


def damage(
    rng: random.Random, data: bytes, src: tuple[str, int], dst: tuple[str, int], isn: int
) -> tuple[list[tuple[float, Segment]], list[bool], int]:
    """One direction as captured: ``(time key, segment)`` pairs, which bytes were captured, the known extent."""
    n = len(data)
    mss = rng.choice((1, 7, 50, 100, 300, 1448))
    p_loss, p_cut, p_dup, p_overlap = (rng.choice((0.0, 0.05, 0.2)) for _ in range(4))
    has = [False] * n
    extent = 0
    segs: list[tuple[float, Segment]] = []

    def add(t: float, a: int, b: int, *, may_cut: bool = True) -> None:
        nonlocal extent
        keep = b
        if may_cut and b - a > 1 and rng.random() < p_cut:
            keep = rng.randrange(a, b)  # the snap length cut it after keep - a bytes (maybe none)
        seq = (isn + 1 + a) & 0xFFFFFFFF
        segs.append((t, Segment(0, *src, *dst, seq, ACK, data[a:keep], b - keep)))
        for i in range(a, keep):
            has[i] = True
        extent = max(extent, b)

    pos, k = 0, 0
    while pos < n:
        end = min(n, pos + rng.randrange(1, mss + 1))
        if rng.random() >= p_loss:
            add(k + rng.uniform(0, 6) + (rng.random() < 0.02) * rng.uniform(0, 50), pos, end)
        if rng.random() < p_dup:
            add(k + rng.uniform(0, 30), pos, end)
        if rng.random() < p_overlap:
            a = rng.randrange(max(0, pos - 2 * mss), end)
            add(k + rng.uniform(0, 30), a, min(n, a + rng.randrange(1, 3 * mss + 2)))
        if rng.random() < 0.05:
            segs.append((k + rng.uniform(0, 6), Segment(0, *src, *dst, (isn + 1 + pos) & 0xFFFFFFFF, ACK)))  # a bare ACK
        pos = end
        k += 1
    return segs, has, extent


def _runs(flags: list[bool], want: bool, limit: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the runs of ``flags[:limit]`` equal to ``want``."""
    out: list[tuple[int, int]] = []
    start = None
    for i in range(limit + 1):
        on = i < limit and flags[i] == want
        if on and start is None:
            start = i
        elif not on and start is not None:
            out.append((start, i - start))
            start = None
    return out


class Built(NamedTuple):
    """One trial's connection: its segments, and per direction the bytes sent and the ground truth."""

    segments: list[Segment]
    data: dict[str, bytes]
    truth: dict[str, tuple[list[bool], int]]  # which bytes were captured, the known extent


def build(seed: int, client: tuple[str, int] = C) -> Built:
    """The segments a capture saw of one randomised connection from ``client`` to the server."""
    rng = random.Random(seed)
    isn = {"s2c": rng.choice((rng.randrange(1 << 32), (1 << 32) - rng.randrange(1, 3000))), "c2s": rng.randrange(1 << 32)}
    data = {"s2c": payload(rng), "c2s": payload(rng) if rng.random() < 0.5 else b""}
    ends = {"s2c": (S, client), "c2s": (client, S)}
    timed: list[tuple[float, Segment]] = []
    truth: dict[str, tuple[list[bool], int]] = {}
    for d in ("s2c", "c2s"):
        segs, has, extent = damage(rng, data[d], *ends[d], isn[d])
        timed += segs
        truth[d] = (has, extent)
    timed.sort(key=lambda x: x[0])
    body = [s for _, s in timed]
    ending = rng.choice(("fin", "fin", "rst", "none"))
    tail: list[Segment] = []
    if ending == "fin":  # the first FIN anywhere (its own bytes may still come), the second one last: the connection closed
        first, second = ["s2c", "c2s"] if rng.random() < 0.5 else ["c2s", "s2c"]
        fins = {d: Segment(0, *ends[d][0], *ends[d][1], (isn[d] + 1 + len(data[d])) & 0xFFFFFFFF, FIN | ACK) for d in ends}
        body.insert(rng.randrange(len(body) + 1), fins[first])
        tail.append(fins[second])
        for d in ends:
            truth[d] = (truth[d][0], len(data[d]))
    elif ending == "rst":
        tail.append(Segment(0, *client, *S, (isn["c2s"] + 1 + len(data["c2s"])) & 0xFFFFFFFF, RST))
    start = [Segment(0, *client, *S, isn["c2s"], SYN), Segment(0, *S, *client, isn["s2c"], SYN | ACK)]
    return Built(start + body + tail, data, truth)


def check(built: Built, conn: Connection, events: list[FlowEvent]) -> str:
    """``""`` if the events of ``conn`` match the ground truth, else what differed."""
    problems = []
    for d in ("s2c", "c2s"):
        has, extent = built.truth[d]
        stream = built.data[d]
        half = conn.halves.get(d)
        pos = 0
        gaps = []
        for ev in (e.event for e in events if e.direction == d):
            if ev.offset != pos:
                problems.append(f"{d}: events do not tile: {ev.type} at {ev.offset}, expected {pos}")
                break
            if ev.type == "gap":
                gaps.append((ev.offset, ev.length))
            else:
                raw = ev.raw if ev.type == "frame" else ev.data  # type: ignore[union-attr]
                if raw != stream[pos : pos + len(raw)]:
                    problems.append(f"{d}: wrong bytes in the {ev.type} at {pos}")
                    break
            pos += ev.length
        want_gaps = _runs(has, False, extent)
        lost = sum(n for _, n in want_gaps)
        got_lost = half.lost if half is not None else 0
        merged = _merge(gaps)
        if merged != want_gaps or got_lost != lost:
            kind = "over" if got_lost > lost else "under" if got_lost < lost else "misplaced"
            problems.append(f"{d}: {kind}-reported loss: gaps {merged} ({got_lost} bytes), truth {want_gaps} ({lost} bytes)")
        elif pos != extent:
            problems.append(f"{d}: events cover {pos} bytes, the known extent is {extent}")
        if half is not None and half.conflicts:
            problems.append(f"{d}: {half.conflicts} conflicts")
    return "; ".join(problems)


def trial(seed: int) -> str:
    """One randomised trial, alone in its reassembler; ``""`` if it matched the ground truth, else what differed."""
    built = build(seed)
    r = Reassembler()
    events = list(r.run(s._replace(ts=i * 10, packet=i + 1) for i, s in enumerate(built.segments)))
    if len(r.connections) != 1:
        return f"{len(r.connections)} connections"
    return check(built, r.connections[0], events)


def shared(seeds: range, keep_closed: int = 8) -> dict[int, str]:
    """The trials of ``seeds`` through one long-lived reassembler (``keep_closed``), four at a time interleaved.

    Each trial has a client port of its own, reused 64 trials later (a trial
    left open is then ended by the SYN that reuses its port): port reuse and
    the pruning of closed connections must not change any connection's
    events.  Returns the problems of the trials that failed.
    """
    r = Reassembler(keep_closed=keep_closed)
    rng = random.Random(seeds.start)
    events: dict[int, list[FlowEvent]] = {}
    conns: dict[int, list[Connection]] = {}
    built: dict[int, Built] = {}
    seen: set[int] = set()
    n = 0
    for group in range(0, len(seeds), 4):
        queues = {}
        for k, seed in enumerate(seeds[group : group + 4]):
            built[seed] = build(seed, (C[0], 20000 + (group + k) % 64))
            queues[seed] = list(built[seed].segments)
            conns[seed] = []
        while queues:
            seed = rng.choice(list(queues))
            n += 1
            for e in r.feed(queues[seed].pop(0)._replace(ts=n * 10, packet=n)):
                events.setdefault(e.conn.id, []).append(e)
            if r.connections and r.connections[-1].id not in seen:  # the segment opened a connection
                seen.add(r.connections[-1].id)
                conns[seed].append(r.connections[-1])
            if not queues[seed]:
                del queues[seed]
    for e in r.close():
        events.setdefault(e.conn.id, []).append(e)
    out = {}
    for seed, b in built.items():
        if len(conns[seed]) != 1:
            out[seed] = f"{len(conns[seed])} connections"
        elif problem := check(b, conns[seed][0], events.get(conns[seed][0].id, [])):
            out[seed] = problem
    return out


def _merge(gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, n in gaps:
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((off, n))
    return out


def main() -> int:
    """Run the trials; print failures (the first ``--show``) and the counts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0, help="trial i uses seed S + i")
    ap.add_argument("--show", type=int, default=5, help="failures printed in full")
    ap.add_argument("--shared", action="store_true", help="all trials through one reassembler (keep_closed=8), four at a time interleaved")
    args = ap.parse_args()
    failures = 0
    kinds: Counter[str] = Counter()
    seeds = range(args.seed, args.seed + args.trials)
    problems = shared(seeds) if args.shared else {seed: p for seed in seeds if (p := trial(seed))}
    for seed, problem in sorted(problems.items()):
        if problem:
            failures += 1
            for p in problem.split("; "):
                kinds[p.split(":")[1].strip().split(" ")[0] if ":" in p else p] += 1
            if failures <= args.show:
                print(f"seed {seed}: {problem}")
    detail = ", ".join(f"{k}: {v}" for k, v in kinds.most_common())
    print(f"fuzz_reassembly: {args.trials} trials, {failures} failures" + (f" ({detail})" if detail else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
