"""Item runs: many item messages of one connection taken at once, exactly as one at a time would take them.

A bulk reader (the frames table's columns) finds runs of item messages -
DCP_MUTATION, DELETION, EXPIRATION, COMMIT: the messages whose handler only
adds an item - with nothing else of their connection between them, and hands
each run over grouped by stream.  :meth:`RunHandlers.take_items` first proves,
group by group, that feeding the run's records one by one would raise no
anomaly and change nothing but counters: the stream exists and simply takes
data, its seqnos rise and stay inside the current snapshot (and below the
requested end), no key repeats inside a snapshot that allows no duplicates,
flow control neither overruns nor meets an over-ack.  Then it applies the
run's effects in bulk (items, snapshot counts, last seqno, remembered keys,
flow samples, the stall point).  A group that fails the proof is handed back
through ``fallback`` to be fed as records, so the result is the same as
feeding every record: tested by feeding the same captures both ways.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate, islice, repeat
from operator import lt
from typing import NamedTuple

from ..protocol.enums import Magic, Opcode
from ..protocol.rules import DUPLICATES_ALLOWED, KEY_SPACES
from ..protocol.session import STREAM_MESSAGES
from .core import Seen
from .model import FlowSample, Item
from .streams import ITEM_LAYOUTS, TAKES_DATA, StreamHandlers, flow_charges

__all__ = ["ITEM_RUN_LAYOUTS", "RUN_MAGIC", "ItemGroup", "ItemPlan", "ItemRun", "RunHandlers", "flow_charges"]

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


class ItemGroup(NamedTuple):
    """A run's messages of one (vbucket, opaque), in record order."""

    vbucket: int
    opaque: int
    positions: list[int]  # indices into the run's row-order lists
    number: list[int]
    ts: list[int]
    opcode: list[int]
    seqno: list[int]


class ItemRun(NamedTuple):
    """Item messages of one connection and direction with nothing else of that connection between them."""

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
        plans = []
        refused: list[int] = []
        by_opaque, by_key = c.by_opaque, c.by_key
        for g in run.groups:
            s = by_opaque.get(g.opaque)
            if s is None or s.vbucket != g.vbucket:
                s = by_key.get((g.vbucket, None))
            if s is None or s.state not in TAKES_DATA:
                return None  # a stream to follow, or a state to move: may change how the other groups find theirs
            seqs = g.seqno
            first, hi = seqs[0], seqs[-1]
            if s.oso or (s.last_seqno is not None and first <= s.last_seqno) or not all(map(lt, seqs, islice(seqs, 1, None))):
                refused += g.positions
                continue
            end = s.end_seqno
            keys = None
            if s.snapshots:
                snap = s.snapshots[-1]
                if first < snap.start or hi > snap.end or (end is not None and hi > end and snap.start > end):
                    refused += g.positions
                    continue
                if not snap.flags & DUPLICATES_ALLOWED:
                    keys = dict(zip(run.keys(g.positions), g.number, strict=True))
                    if len(keys) != len(seqs) or (snap.keys and not snap.keys.keys().isdisjoint(keys)):
                        refused += g.positions
                        continue
            elif s.attempts or (end is not None and hi > end):
                refused += g.positions
                continue
            plans.append((g, s, keys))
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
            for g, s, keys in plans:
                snaps = s.snapshots
                idx = len(snaps) - 1
                s.items.extend(map(_tnew, repeat(Item), zip(g.number, g.ts, g.opcode, g.seqno, repeat(idx))))
                s.last_seqno = g.seqno[-1]
                if idx >= 0:
                    snap = snaps[idx]
                    snap.items += len(g.seqno)
                    if snap.first_seqno is None:
                        snap.first_seqno = g.seqno[0]
                    snap.last_seqno = g.seqno[-1]
                    snap.last_frame = g.number[-1]
                    if g.seqno[-1] >= snap.end:
                        snap.complete = True
                    if keys is not None:
                        if snap.keys is None:
                            snap.keys = keys
                        else:
                            snap.keys.update(keys)
                        c.key_room -= len(keys)
            c.info.producer_dir = run.direction
            c.last[run.direction] = Seen(run.number[-1], run.ts[-1])

        return ItemPlan(refused, commit)
