"""The timeline fed from the frames table: item messages in runs, everything else as records (an edge: numpy).

A capture's timeline costs, fed record by record, several times what its
frames table costs; almost all of it goes to item messages, which each only
add an item, and to the snapshot markers between them.  :func:`feed_part` reads every row's header with array
operations on the part's frame bytes (layouts from the protocol table, via
:data:`~dcpinspect.timeline.runs.ITEM_RUN_LAYOUTS` and ``RUN_MARKER``), finds
the runs of item messages and v1 markers with no other frame of their builder's scope between them - any
connection when one builder takes the whole capture, the same connection when
each connection has its own builder (Spark) - groups each run by connection,
direction and (vbucket, opaque), and hands it to
:meth:`~dcpinspect.timeline.builder.TimelineBuilder.take_items`.  The builder
proves the run raises nothing, and takes it in bulk, or hands back what it
cannot take, which is fed as records like every other row.  Runs shorter
than :data:`MIN_RUN` are fed as records: below that, grouping costs more than
it saves.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..capture.sets import Plan, file_sets, planned
from ..flows.records import CaptureStats, Record, gc_paused
from ..protocol import spec
from ..timeline import Timeline, TimelineBuilder
from ..timeline.runs import ITEM_RUN_LAYOUTS, RUN_MAGIC, RUN_MARKER, RUN_MARKER_FIELDS, ItemGroup, ItemRun, flow_charges
from .columnar import DIRECTIONS, TablePart, read_parts
from .frames_vector import header_array

__all__ = ["MIN_RUN", "feed_part", "feed_parts", "read_timeline"]

MIN_RUN = 16
_HEADER = spec.HEADER_SIZE


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ok = np.zeros(1 << 16, bool)
    offset = np.zeros(1 << 16, np.int64)
    for key, off in ITEM_RUN_LAYOUTS.items():
        ok[key], offset[key] = True, off
    ok[RUN_MARKER] = True  # its seqno column stays 0: the marker's own fields are read apart
    charge = np.zeros((256, 2), np.int64)
    for op, ab in flow_charges().items():
        charge[op] = ab
    return ok, offset, charge


_RUN_LAYOUT, _SEQNO_AT, _CHARGE = _tables()
_MARKER_OP = RUN_MARKER >> 8


def _field(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """Big-endian unsigned integers of ``width`` bytes at offsets ``at`` (uint64)."""
    return buf[at[:, None] + np.arange(width)].view(f">u{width}").reshape(-1).astype(np.uint64)


def feed_part(
    part: TablePart,
    builder_of: Callable[[int, int], TimelineBuilder],
    feed: Callable[[Record], None],
    *,
    numbers: Sequence[int] | np.ndarray | None = None,
    conns: np.ndarray | None = None,
    per_connection: bool = False,
    min_run: int = MIN_RUN,
) -> None:
    """Feed ``part``'s rows: item runs to ``builder_of(conn, number of its first row).take_items``, every other row to ``feed``.

    ``numbers`` and ``conns`` (one per row) number the records and name their
    connections (default: the part's frame numbers and connection ids).  With
    ``per_connection`` each connection has a builder of its own, so a run may
    span other connections' frames, and the rows are fed a connection at a time.
    """
    n = len(part)
    if not n:
        return
    arr = part.arrays()
    conn = arr.conn if conns is None else np.asarray(conns, np.int64)
    num: Sequence[int] | np.ndarray = np.arange(part.first, part.first + n, dtype=np.int64) if numbers is None else numbers
    num_np = num if isinstance(num, np.ndarray) else None
    buf = np.frombuffer(arr.joined, np.uint8)
    start = arr.start
    fr = np.flatnonzero(arr.framed)
    elig = np.zeros(n, bool)
    seqno = np.zeros(n, np.uint64)
    vb = np.zeros(n, np.int64)
    opaque = np.zeros(n, np.int64)
    op = np.zeros(n, np.int64)
    keypos = np.zeros(n, np.int64)
    keylen = np.zeros(n, np.int64)
    marker = np.zeros((n, len(RUN_MARKER_FIELDS)), np.uint64)  # a v1 marker's start, end and flags
    if len(fr):
        s = start[fr]
        h = header_array(buf, s)
        magic, opc, ext, kl = h["magic"], h["opcode"].astype(np.int64), h["extlen"].astype(np.int64), h["keylen"].astype(np.int64)
        layout = opc << 8 | ext
        ok = (magic == RUN_MAGIC) & _RUN_LAYOUT[layout] & (_HEADER + ext + kl <= arr.length[fr])
        rows = fr[ok]
        if len(rows):
            s, layout = s[ok], layout[ok]
            elig[rows] = True
            op[rows] = opc[ok]
            seqno[rows] = _field(buf, s + _HEADER + _SEQNO_AT[layout], 8)
            vb[rows] = h["vbs"][ok]
            opaque[rows] = h["opaque"][ok]
            keypos[rows] = s + _HEADER + ext[ok]
            keylen[rows] = kl[ok]
            mk = layout == RUN_MARKER
            if mk.any():
                at = s[mk] + _HEADER
                seqno[rows[mk]] = 0
                marker[rows[mk]] = np.stack([_field(buf, at + off, width) for off, width in RUN_MARKER_FIELDS], 1)
    if not elig.any():
        for r in part.records_at(range(n), numbers, conns):
            feed(r)
        return
    charged = _CHARGE[op, 0] * arr.length + _CHARGE[op, 1]
    order = np.argsort(conn, kind="stable") if per_connection else np.arange(n)
    ctl = ~elig[order]
    seg = np.cumsum(ctl)  # the segment of items each position is in (a control row starts the next one)
    short = ~ctl & (np.bincount(seg[~ctl], minlength=seg[-1] + 1)[seg] < min_run)
    as_record = np.flatnonzero(ctl | short)
    recs = part.records_at(order[as_record].tolist(), numbers, conns)
    joined = arr.joined

    def fallback_of(rows: np.ndarray) -> Callable[[Sequence[int]], None]:
        def fallback(positions: Sequence[int]) -> None:
            for r in part.records_at(rows[np.asarray(positions, np.int64)].tolist(), numbers, conns):
                feed(r)

        return fallback

    def runs(rows: np.ndarray) -> None:
        # what cannot be taken in bulk (a stream seen for the first time, an anomaly) goes as records, a head of the
        # segment at a time, the head doubling: a segment costs O(log) attempts whatever it holds
        head = 16 * min_run  # rows fed as records when a segment cannot be taken, doubling while it still cannot
        while len(rows) >= min_run and not taken(rows):
            fallback_of(rows)(range(min(head, len(rows))))
            rows = rows[head:]
            head *= 2
        if 0 < len(rows) < min_run:
            fallback_of(rows)(range(len(rows)))

    def taken(rows: np.ndarray) -> bool:
        """Whether the segment ``rows`` was taken (its refusals fed as records); ``False``: nothing of it was."""
        c, d = conn[rows], arr.direction[rows]
        if (c == c[0]).all():
            if (d != d[0]).any():
                return False  # both directions of one connection: as records
            run = _run(rows)
            return builder_of(run.conn, run.number[0]).take_items(run, fallback_of(rows))
        k = np.lexsort((c,))
        c_s, d_s = c[k], d[k]
        starts = [0, *(np.flatnonzero(c_s[1:] != c_s[:-1]) + 1).tolist()]
        if (np.add.reduceat(d_s, starts) % np.diff([*starts, len(k)])).any():
            return False  # a connection with both directions here: as records
        splits = np.split(rows[k], starts[1:])
        if per_connection:  # builders of their own: each run on its own
            for r in splits:
                runs(r)
            return True
        # one builder: a run's refusals would be fed after the other runs' items - all of it as records then
        made = [_run(r) for r in splits]
        plans = [builder_of(run.conn, run.number[0]).plan_items(run) for run in made]
        if not all(p is not None and not p.refused for p in plans):
            return False
        for p in plans:
            p.commit()  # type: ignore[union-attr]
        return True

    def _run(rows: np.ndarray) -> ItemRun:
        k = np.lexsort((opaque[rows], vb[rows]))
        v_s, o_s = vb[rows][k], opaque[rows][k]
        cut = np.flatnonzero((v_s[1:] != v_s[:-1]) | (o_s[1:] != o_s[:-1])) + 1
        bounds = [0, *cut.tolist(), len(k)]
        rs = rows[k]
        nums = num_np[rows].tolist() if num_np is not None else [num[i] for i in rows.tolist()]
        nums_s = [nums[i] for i in k.tolist()] if num_np is None else num_np[rs].tolist()
        ts = arr.ts[rows].tolist()
        ts_s, op_s, seq_s, pos_s = arr.ts[rs].tolist(), op[rs].tolist(), seqno[rs].tolist(), k.tolist()
        vbs, ops = v_s[bounds[:-1]].tolist(), o_s[bounds[:-1]].tolist()
        mk = np.flatnonzero(op[rs] == _MARKER_OP)
        marks: list[dict[int, tuple[int, int, int]]] = [{} for _ in vbs]
        if len(mk):
            fields = marker[rs[mk]].tolist()
            g_of = np.searchsorted(bounds, mk, side="right") - 1
            for i, g, f in zip(mk.tolist(), g_of.tolist(), fields, strict=True):
                marks[g][i - bounds[g]] = tuple(f)
        groups = [
            ItemGroup(vbs[i], ops[i], pos_s[a:b], nums_s[a:b], ts_s[a:b], op_s[a:b], seq_s[a:b], marks[i])
            for i, (a, b) in enumerate(itertools.pairwise(bounds))
        ]

        def keys(positions: list[int]) -> list[bytes]:
            at = rows[np.asarray(positions, np.int64)]
            return [joined[p : p + m] for p, m in zip(keypos[at].tolist(), keylen[at].tolist(), strict=True)]

        return ItemRun(int(conn[rows[0]]), DIRECTIONS[int(arr.direction[rows[0]])], nums, ts, charged[rows].tolist(), groups, keys)

    prev = 0
    for p, rec in zip([*as_record.tolist(), len(order)], [*recs, None], strict=True):
        if p > prev:
            runs(order[prev:p])
        if rec is not None:
            feed(rec)
        prev = p + 1


def feed_parts(parts: Iterable[TablePart], builder: TimelineBuilder) -> TimelineBuilder:
    """Feed every part to one builder (item runs in bulk); the cyclic collector is paused while a part is read and fed."""
    for part in gc_paused(parts):
        was = gc.isenabled()
        gc.disable()  # millions of items, none in a cycle: a full collection would walk them all, again and again
        try:
            feed_part(part, lambda _c, _n: builder, builder.feed)
        finally:
            if was:
                gc.enable()
    return builder


def read_timeline(paths: Iterable[str], *, stats: CaptureStats | None = None, capture_sets: Plan = "auto", **options: object) -> Timeline:
    """The timeline of capture files: what ``build_timeline(read_records(paths), file_sets(plan))`` gives, several times faster.

    ``capture_sets`` is ``auto``, ``one``, ``per-file`` or a plan
    (:mod:`dcpinspect.capture.sets`): histories never cross sets, and the
    timeline's ``set_first`` locates each frame in its set.  ``options`` are
    :func:`~dcpinspect.tables.columnar.read_parts`'s; ``stats`` gets what the
    read saw besides frames.
    """
    paths = [str(p) for p in paths]
    plan = planned(paths, capture_sets)
    st = stats if stats is not None else CaptureStats()
    builder = TimelineBuilder(file_sets(plan))
    t = feed_parts(read_parts(paths, stats=st, capture_sets=plan, **options), builder).timeline()  # type: ignore[arg-type]
    t.set_first = dict(st.set_first)
    return t
