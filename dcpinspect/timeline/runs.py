"""Item runs: many stream messages of one connection taken at once, exactly as one at a time would take them.

A bulk reader (the frames table's columns) finds runs of item messages -
DCP_MUTATION, DELETION, EXPIRATION, COMMIT: the messages whose handler only
adds an item - and v1 snapshot markers, with nothing else of their
connection between them, and hands each run over grouped by stream.
:meth:`RunHandlers.plan_items` first proves, group by group, that feeding
the run's records one by one would raise no anomaly and change nothing but
what it applies: the stream exists and simply takes data; each marker
follows its predecessor as ``StreamHandlers._marker`` requires (the previous
snapshot complete, not ending before it, not at or below what was
delivered); seqnos rise and stay inside their snapshot (and below the
requested end); no key repeats inside a snapshot that allows no duplicates;
flow control neither overruns nor meets an over-ack.  Then the commit
applies the run's effects in bulk (snapshots, items, counts, last seqno,
remembered keys, flow samples, the stall point).  A group that fails the
proof is handed back through ``fallback`` to be fed as records, so the
result is the same as feeding every record: tested by feeding the same
captures both ways.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate, islice, repeat
from operator import lt
from typing import NamedTuple

from ..protocol import spec
from ..protocol.enums import Magic, Opcode, SnapshotFlag
from ..protocol.rules import DUPLICATES_ALLOWED, KEY_SPACES
from ..protocol.session import STREAM_MESSAGES
from .core import Conn, Seen
from .model import FlowSample, Item, Snapshot, Stream
from .streams import ITEM_LAYOUTS, TAKES_DATA, StreamHandlers, flow_charges

__all__ = [
    "ITEM_RUN_LAYOUTS",
    "RUN_MAGIC",
    "RUN_MARKER",
    "RUN_MARKER_FIELDS",
    "ItemGroup",
    "ItemPlan",
    "ItemRun",
    "RunHandlers",
    "flow_charges",
]

_HISTORY = int(SnapshotFlag.HISTORY)
_tnew = tuple.__new__  # a named tuple made from a tuple in C (its own __new__ is a Python function)

#: the magic of a run's messages (an alt request may carry a stream id: fed one by one)
RUN_MAGIC = int(Magic.CLIENT_REQUEST)


def _run_layouts() -> dict[int, int]:
    """Opcode << 8 | extras length -> the seqno's offset in the extras, for the messages a run may hold.

    Those whose handler only adds an item in the plain key space (SEQNO_ADVANCED
    and OSO have rules of their own; prepares and aborts a key space apart).
    """
    out = {}
    for key, (st, index, space) in ITEM_LAYOUTS.items():
        op = key >> 8
        if op in STREAM_MESSAGES and op != Opcode.DCP_SEQNO_ADVANCED and space == 0 and KEY_SPACES.get(op) == 0:
            fmt = st.format
            out[key] = struct.calcsize(fmt[: 1 + index])  # one letter per field (checked by the test of this table)
    return out


#: what a bulk reader needs to find runs and read their seqnos (from the protocol table's extras structs)
ITEM_RUN_LAYOUTS: dict[int, int] = _run_layouts()


def _marker_layout() -> tuple[int, tuple[tuple[int, int], ...]]:
    """A v1 snapshot marker's opcode << 8 | extras length, and the (offset, width) of its start, end and flags in the extras."""
    op = int(Opcode.DCP_SNAPSHOT_MARKER)
    names = tuple(f.name for f in spec.SNAPSHOT_V1_EXTRAS)
    v = next(v for v in spec.COMMANDS[op].request if v.extras_names == names and v.extras_struct is not None)
    assert v.extras_struct is not None
    fmt = v.extras_struct.format
    fields = tuple((struct.calcsize(fmt[: 1 + i]), struct.calcsize(fmt[0] + fmt[1 + i])) for i in range(len(names)))
    return op << 8 | v.extras_len, fields


#: a v1 snapshot marker in a run: its layout key, and where its start seqno, end seqno and flags are (offset, width)
RUN_MARKER, RUN_MARKER_FIELDS = _marker_layout()


class ItemGroup(NamedTuple):
    """A run's messages of one (vbucket, opaque), in record order."""

    vbucket: int
    opaque: int
    positions: list[int]  # indices into the run's row-order lists
    number: list[int]
    ts: list[int]
    opcode: list[int]
    seqno: list[int]  # 0 for a marker
    markers: dict[int, tuple[int, int, int]]  # index in the group -> a v1 marker's (start, end, flags)


class ItemRun(NamedTuple):
    """Item messages and v1 markers of one connection and direction with nothing else of that connection between them."""

    conn: int
    direction: str
    number: list[int]  # row order
    ts: list[int]
    charged: list[int]  # flow-control size of each (the rule, :func:`flow_charges`)
    groups: list[ItemGroup]
    keys: Callable[[list[int]], list[bytes]]  # the keys, as on the wire, of the messages at these positions


class ItemPlan(NamedTuple):
    """What :meth:`RunHandlers.plan_items` found a run to be: the positions it cannot take in bulk, and how to take the rest."""

    refused: list[int]  # in order
    commit: Callable[[], None]  # take the others (once, before anything else is fed to their connection)


class RunHandlers(StreamHandlers):
    """:meth:`take_items`: a run of items in bulk."""

    _flow_unordered = False  # flow samples of runs were appended a connection at a time: sorted by frame when read

    def take_items(self, run: ItemRun, fallback: Callable[[Sequence[int]], None]) -> bool:
        """Take ``run``, the positions it cannot take in bulk passed, in order, to ``fallback`` (to feed them as records).

        ``False``: the run cannot be taken in bulk at all (nothing was taken, nothing passed on).
        """
        plan = self.plan_items(run)
        if plan is None:
            return False
        plan.commit()
        if plan.refused:
            fallback(plan.refused)
            last = len(run.number) - 1
            if plan.refused[-1] != last:  # the records fed after the bulk were earlier than its last
                self._conns[run.conn].last[run.direction] = Seen(run.number[last], run.ts[last])
        return True

    def plan_items(self, run: ItemRun) -> ItemPlan | None:
        """Prove what of ``run`` feeding its records would take without raising anything (changes nothing; ``None``: none of it)."""
        n = len(run.number)
        c = self._conns.get(run.conn)
        if c is None or c.stream_ids or c.draining or c.over_acks or c.ack_credit or c.key_room < n:
            return None
        plans: list[tuple[ItemGroup, Stream, list[_Step]]] = []
        refused: list[int] = []
        by_opaque, by_key = c.by_opaque, c.by_key
        for g in run.groups:
            s = by_opaque.get(g.opaque)
            if s is None or s.vbucket != g.vbucket:
                s = by_key.get((g.vbucket, None))
            if s is None or s.state not in TAKES_DATA:
                return None  # a stream to follow, or a state to move: may change how the other groups find theirs
            steps = None if s.oso else _steps(s, g, run.keys)
            if steps is None:
                refused += g.positions
            else:
                plans.append((g, s, steps))
        buf = c.info.buffer_size
        acc: list[int] = []
        if buf:
            if refused:
                return None  # flow control runs across the groups: all or nothing
            acc = list(accumulate(run.charged, initial=c.outstanding))
            if acc[-2] >= buf:  # a message sent with the buffer full: an overrun, raised one by one
                return None
        refused.sort()

        def commit() -> None:
            if buf:
                if c.stalled_at is None and acc[-1] >= buf:
                    i = bisect_left(acc, buf, 1) - 1
                    c.stalled_at, c.stall_ts = run.number[i], run.ts[i]
                c.outstanding = acc[-1]
                samples = zip(repeat(c.info.conn), run.number, run.ts, islice(acc, 1, None), repeat("sent"), run.charged)
                self._flow.extend(map(_tnew, repeat(FlowSample), samples))
                self._flow_unordered = True
            for g, s, steps in plans:
                _commit(c, s, g, steps)
            c.info.producer_dir = run.direction
            c.last[run.direction] = Seen(run.number[-1], run.ts[-1])

        return ItemPlan(refused, commit)


# a group as steps: (the new snapshot a marker starts, or None: the current one), then its items [lo, hi) and their keys
_Step = tuple[Snapshot | None, int, int, dict[bytes, int] | None]


def _steps(s: Stream, g: ItemGroup, keys_of: Callable[[list[int]], list[bytes]]) -> list[_Step] | None:
    """The group's markers and items as steps, if feeding them one by one would raise nothing (``None``: it would)."""
    snap = s.snapshots[-1] if s.snapshots else None
    complete = snap.complete if snap is not None else False
    last = s.last_seqno
    end = s.end_seqno
    cuts = sorted(g.markers)
    steps: list[_Step] = []
    for j, at in enumerate([0, *cuts]):
        new = None
        lo = at
        if j:
            m, lo = at, at + 1
            start, stop, flags = g.markers[m]
            prev = snap
            if prev is not None:
                # the checks of StreamHandlers._marker, in its order (a change-stream backfill's two markers: one snapshot)
                pair = stop == prev.end and bool(flags & _HISTORY) and not prev.flags & _HISTORY
                if not pair and not complete and last is not None and last < prev.end:
                    return None
                if stop < prev.end or (last is not None and stop <= last):
                    return None
            snap = new = Snapshot(g.number[m], start, stop, flags, "v1")
            complete = False
        hi = cuts[j] if j < len(cuts) else len(g.number)
        seqs = g.seqno[lo:hi]
        keys = None
        if seqs:
            first, top = seqs[0], seqs[-1]
            if (last is not None and first <= last) or not all(map(lt, seqs, islice(seqs, 1, None))):
                return None
            if snap is not None:
                if first < snap.start or top > snap.end or (end is not None and top > end and snap.start > end):
                    return None
                if not snap.flags & DUPLICATES_ALLOWED:
                    keys = dict(zip(keys_of(g.positions[lo:hi]), g.number[lo:hi], strict=True))
                    known = snap.keys if new is None else None
                    if len(keys) != len(seqs) or (known and not known.keys().isdisjoint(keys)):
                        return None
                if top >= snap.end:
                    complete = True
            elif s.attempts or (end is not None and top > end):
                return None  # an item before any marker of a requested stream, or past its end
            last = top
        if new is not None or seqs:
            steps.append((new, lo, hi, keys))
    return steps


def _commit(c: Conn, s: Stream, g: ItemGroup, steps: list[_Step]) -> None:
    """Apply a proved group's steps to its stream (what feeding its records would have done)."""
    snaps = s.snapshots
    for new, lo, hi, keys in steps:
        if new is not None:
            if snaps:
                StreamHandlers._forget_keys(c, snaps[-1])
            snaps.append(new)
            s.oso = s.oso_ended = False
        if hi <= lo:
            continue
        idx = len(snaps) - 1
        seqs = g.seqno[lo:hi]
        s.items.extend(map(_tnew, repeat(Item), zip(g.number[lo:hi], g.ts[lo:hi], g.opcode[lo:hi], seqs, repeat(idx))))
        s.last_seqno = seqs[-1]
        if idx < 0:
            continue
        snap = snaps[idx]
        snap.items += len(seqs)
        if snap.first_seqno is None:
            snap.first_seqno = seqs[0]
        snap.last_seqno = seqs[-1]
        snap.last_frame = g.number[hi - 1]
        if seqs[-1] >= snap.end:
            snap.complete = True
        if keys is not None:
            if snap.keys is None:
                snap.keys = keys
            else:
                snap.keys.update(keys)
            c.key_room -= len(keys)
