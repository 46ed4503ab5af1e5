"""Plots of timelines and frames (an edge: matplotlib's object-oriented API only, never pyplot).

Every function takes a :class:`~dcpinspect.timeline.model.Timeline` (or the frames
table) and an optional ``ax``; without one it makes its own
:class:`matplotlib.figure.Figure` (no pyplot state, so it works headless and
in threads) and returns it.  With an ``ax`` it draws there and returns that
axes' figure.

* :func:`plot_seqnos` - seqno over time per stream, snapshot bands, stream
  requests, rollbacks and retries, stream ends;
* :func:`plot_branches` - the failover-log branch tree of a vbucket with the
  consumer's resume points and rollback targets;
* :func:`plot_flow` - bytes outstanding against the buffer size, acks and
  stalls (and :func:`plot_noops`, noop round trips);
* :func:`plot_opcodes` - frames per opcode over time.

Each draws a bounded number of things (a figure of 65,536 streams would take
minutes and show nothing): at most :data:`MAX_STREAMS` streams
(:func:`pick_streams`: those with anomalies or rollbacks first, then the
busiest), :data:`MAX_CONNS` connections and :data:`MAX_BRANCHES` branches per
vbucket, and the title says so (``showing 64 of 65,536 streams``).

Colours are Okabe-Ito (colour-blind safe); ``theme="dark"`` draws light on
dark (the default draws on an opaque white card, readable in both).  Seqnos
are uint64: 2^64-1 is drawn at the top of the axis and labelled ``max``.
Artists that stand for frames carry their frame numbers: :func:`frames_of`
gives them, :func:`frame_at` turns a matplotlib pick event into a frame
number (what the explorer uses to select the frame of a clicked point).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..flows.reassembly import TS_UNKNOWN
from ..protocol.rules import MAX_SEQNO
from ..timeline import Attempt, Branch, FlowSample, Stream, Timeline, stream_label
from .drawing import (
    END,
    MAX_POINTS,
    OKABE_ITO,
    ROLLBACK,
    STALL,
    THEMES,
    Clock,
    SeqAxis,
    busiest,
    figure_png,
    frame_at,
    frame_at_pixel,
    frames_of,
    legend,
    new_axes,
    say_empty,
    tag,
    thin,
    timeline_clock,
    widen_left,
)
from .labels import seqno_label

__all__ = [
    "MAX_BANDS",
    "MAX_BRANCHES",
    "MAX_CONNS",
    "MAX_ROLLBACK_ARROWS",
    "MAX_STREAMS",
    "OKABE_ITO",
    "figure_png",
    "frame_at",
    "frame_at_pixel",
    "frames_of",
    "pick_streams",
    "plot_branches",
    "plot_flow",
    "plot_noops",
    "plot_opcodes",
    "plot_seqnos",
    "seqno_label",
    "stream_label",
    "timeline_clock",
]

MAX_STREAMS = 64  # streams drawn per plot (about 10 ms each): see pick_streams
MAX_CONNS = 16  # connections drawn per flow-control / noop plot (the busiest)
MAX_BRANCHES = 64  # branch lanes drawn per vbucket (the last seen)
MAX_ROLLBACK_ARROWS = 200  # rollback arrows drawn per vbucket (the last ones)


# ---------------------------------------------------------------------------
# which streams


def _select(t: Timeline, vbucket: int | None, conn: int | None, streams: Iterable[int] | None) -> list[tuple[int, Stream]]:
    wanted = set(streams) if streams is not None else None
    return [
        (i, s)
        for i, s in enumerate(t.streams)
        if (wanted is None or i in wanted) and (vbucket is None or s.vbucket == vbucket) and (conn is None or s.conn == conn)
    ]


def _interest(s: Stream, items: int) -> tuple[int, int, int]:
    """Sort key of a stream, most interesting first: anomalies and rollbacks, then items."""
    rollbacks = sum(a.outcome == "rollback" for a in s.attempts)
    return (-(len(s.anomalies) + rollbacks > 0), -(len(s.anomalies) + rollbacks), -items)


def pick_streams(
    t: Timeline, n: int = MAX_STREAMS, *, among: Iterable[int] | None = None, items: Mapping[int, int] | None = None
) -> list[int]:
    """Indices of the ``n`` streams most worth drawing (of ``among``, default all), in order of interest.

    Streams with anomalies or rollbacks come first (most of them first), then
    the busiest (most items; ``items`` gives true counts by index where the
    timeline's items were thinned); ties keep the timeline's order.
    """
    idx = range(len(t.streams)) if among is None else among
    count = (lambda i: items.get(i, len(t.streams[i].items))) if items is not None else (lambda i: len(t.streams[i].items))
    return sorted(idx, key=lambda i: (*_interest(t.streams[i], count(i)), i))[: max(0, n)]


# ---------------------------------------------------------------------------
# seqnos


def plot_seqnos(
    t: Timeline,
    *,
    ax: Axes | None = None,
    vbucket: int | None = None,
    conn: int | None = None,
    streams: Iterable[int] | None = None,
    x: str = "time",
    clock: Mapping[int, int] | tuple[Sequence[int], Sequence[int]] | Clock | None = None,
    theme: str = "light",
    bands: bool = True,
    max_streams: int | None = MAX_STREAMS,
    stream_items: Mapping[int, int] | None = None,
    size: tuple[float, float] | None = None,
    layout: str = "constrained",
    max_points: int | None = None,
) -> Figure:
    """Seqno over time per stream, with snapshot bands, requests, rollbacks, retries and stream ends.

    ``streams`` are indices into ``t.streams`` (as in ``timeline_frames(t)["streams"]``);
    ``vbucket``/``conn`` narrow the choice; of more than ``max_streams`` (``None``:
    no limit) the ones :func:`pick_streams` picks are drawn (``stream_items``: true
    item counts by index where items were thinned) and the title says
    ``showing N of M streams``.  ``x`` is ``"time"`` (seconds since
    the first frame) or ``"frame"``.  ``clock`` maps frame numbers to
    timestamps (ns), e.g. ``(df.frame, df.ts)`` of the frames table, or is a
    :class:`~dcpinspect.views.drawing.Clock` made once for many plots; without it
    the times the timeline knows are used and the rest interpolated.
    ``size`` is the new figure's (width, height) in inches, ``layout`` its
    :func:`~dcpinspect.views.drawing.new_axes` layout, ``max_points`` the
    points drawn in all, shared by the streams drawn (at least 100 each; a
    picture N pixels wide shows little more than N per line); without it each
    stream gets :data:`~dcpinspect.views.drawing.MAX_POINTS`.

    Everything is drawn in bulk: a stream's items are thinned to
    :data:`~dcpinspect.views.drawing.MAX_POINTS`, its snapshots to at most
    :data:`MAX_BANDS` bands (neighbours merged), and the clock is asked once per
    stream and kind of mark.  With nothing to draw the axes say so in words.

    Artists (their ``gid``): one line per stream with items (``stream:I``), one
    band collection per stream with snapshots (``snapshots:I``), and one
    scatter each for stream requests (``requests``; retries are hollow),
    rollbacks (``rollbacks``: at the rollback seqno, joined to the request by a
    dotted line, ``rollback-link``) and stream ends (``ends``).
    """
    fig, (a,) = new_axes(ax, theme, size=size or (9.0, 4.5), layout=layout)
    chosen = _select(t, vbucket, conn, streams)
    total = len(chosen)
    if max_streams is not None and total > max_streams:
        keep = set(pick_streams(t, max_streams, among=[i for i, _s in chosen], items=stream_items))
        chosen = [(i, s) for i, s in chosen if i in keep]
    clk = Clock(clock if clock is not None else timeline_clock(t), x)
    seq = SeqAxis(
        [v for _i, s in chosen for v in (s.last_seqno, *(at.start for at in s.attempts), *(at.rollback_seqno for at in s.attempts))]
        + [v for _i, s in chosen for sn in s.snapshots[:1] + s.snapshots[-1:] for v in (sn.start, sn.end)]
        + [max((sn.end for sn in s.snapshots if sn.end != MAX_SEQNO), default=None) for _i, s in chosen]
    )
    marks = _Marks()
    points = 0
    per_stream = MAX_POINTS if max_points is None else max(100, max_points // max(1, len(chosen)))
    for k, (i, s) in enumerate(chosen):
        colour = OKABE_ITO[k % len(OKABE_ITO)]
        points += _stream_line(a, i, s, clk, seq, colour, per_stream, len(chosen) <= 4)
        if bands and s.snapshots:
            _snapshot_bands(a, i, s, clk, seq, colour)
        marks.add(s, seq)
    marks.draw(a, clk, THEMES.get(theme, THEMES["light"])["fg"])
    if not chosen:
        say_empty(a, "no streams", theme)
        a.set_title("seqnos per stream")
        return fig
    a.autoscale_view()
    seq.install(a)
    if not points:  # requests, markers or an end, but not one item: said in words
        what = "no items in this stream" if len(chosen) == 1 else "no items in these streams"
        colour = THEMES.get(theme, THEMES["light"])["fg"]
        a.text(0.5, 0.75, what, ha="center", va="center", fontsize="large", color=colour, transform=a.transAxes, gid="empty")
    a.set_xlabel(clk.label)
    a.set_ylabel("seqno")
    a.set_title(
        ("seqnos per stream" if chosen else "seqnos per stream (no streams)")
        + (
            f" (showing {len(chosen):,} of {total:,} streams: anomalies and rollbacks first, then the busiest)"
            if total > len(chosen)
            else ""
        )
    )
    legend(a, theme)
    return fig


MAX_BANDS = 400  # snapshot bands drawn per stream (more are merged with their neighbours)


def _stream_line(a: Axes, i: int, s: Stream, clk: Clock, seq: SeqAxis, colour: str, max_points: int = MAX_POINTS, few: bool = True) -> int:
    """Stream ``i``'s items (thinned to ``max_points``) as one line, ``stream:I``; how many points."""
    idx = thin(len(s.items), max_points)
    items = s.items
    picked = [items[j] for j in idx.tolist()]
    frames = np.fromiter((it.frame for it in picked), dtype=np.int64, count=len(picked))
    ys = np.fromiter((seq(it.seqno) for it in picked), dtype=np.float64, count=len(picked))
    known = ~np.isnan(ys)
    if not known.any():
        return 0
    frames, ys = frames[known], ys[known]
    dots = len(ys) < 400 and few  # a dot per item when few are drawn
    (line,) = a.plot(clk(frames), ys, marker="." if dots else None, color=colour, label=stream_label(s), linewidth=1.4)
    tag(line, frames, f"stream:{i}")
    return len(ys)


def _snapshot_bands(a: Axes, i: int, s: Stream, clk: Clock, seq: SeqAxis, colour: str) -> None:
    """Stream ``i``'s snapshots as bands (seqno range by the frames until the next marker), one collection ``snapshots:I``.

    Of more than :data:`MAX_BANDS` snapshots, runs of neighbours are merged
    into one band (lowest start to highest end); a band's frame is its first snapshot's.
    """
    n = len(s.snapshots)
    starts = np.fromiter((sn.frame for sn in s.snapshots), dtype=np.int64, count=n)
    lasts = np.fromiter((sn.last_frame or sn.frame for sn in s.snapshots), dtype=np.int64, count=n)
    lo = np.fromiter((seq(sn.start) for sn in s.snapshots), dtype=np.float64, count=n)
    hi = np.fromiter((seq(sn.end) for sn in s.snapshots), dtype=np.float64, count=n)
    ends_at = np.empty(n, dtype=np.int64)
    ends_at[:-1] = starts[1:]
    ends_at[-1] = s.end["frame"] if s.end is not None else (s.items[-1].frame if s.items else starts[-1])
    ends_at = np.maximum(ends_at, lasts)
    if n > MAX_BANDS:  # merge runs of neighbours: group g holds snapshots [cut[g], cut[g+1])
        cut = np.linspace(0, n, MAX_BANDS + 1).astype(np.int64)[:-1]
        starts, ends_at = starts[cut], np.maximum.reduceat(ends_at, cut)
        lo, hi = np.minimum.reduceat(lo, cut), np.maximum.reduceat(hi, cut)
    x0, x1 = clk(starts), clk(ends_at)
    polys = np.stack([np.stack([x0, lo], 1), np.stack([x1, lo], 1), np.stack([x1, hi], 1), np.stack([x0, hi], 1)], 1)
    band = PolyCollection(list(polys), facecolors=colour, alpha=0.15, edgecolors=colour, linewidths=0.5)
    a.add_collection(band)
    tag(band, starts, f"snapshots:{i}")


@dataclass
class _Marks:
    """The requests, rollbacks and ends of every stream drawn, gathered to be drawn as one scatter each (the clock asked once per kind)."""

    req: list[tuple[int, float, bool]] = field(default_factory=list)  # frame, y, retry
    rollback: list[tuple[int, float, int, float]] = field(default_factory=list)  # answer frame, y, request frame, request y
    end: list[tuple[int, float, str]] = field(default_factory=list)  # frame, y, end name

    def add(self, s: Stream, seq: SeqAxis) -> None:
        """One stream's marks."""
        for n, at in enumerate(s.attempts):
            self.req.append((at.frame, seq(at.start), n > 0))
            if at.outcome == "rollback" and at.rollback_seqno is not None:
                self.rollback.append((at.response_frame or at.frame, seq(at.rollback_seqno), at.frame, seq(at.start)))
        if s.end is not None:
            last = s.last_seqno if s.last_seqno is not None else (s.attempts[-1].start if s.attempts else 0)
            self.end.append((s.end["frame"], seq(last), str(s.end.get("name"))))

    def draw(self, a: Axes, clk: Clock, fg: str) -> None:
        """The three scatters: ``requests`` (retries hollow), ``rollbacks`` (dotted links from their requests), ``ends`` (named)."""
        if self.req:
            frames, ys, retry = zip(*self.req, strict=True)
            face = ["none" if r else "#0072B2" for r in retry]
            label = "stream request (hollow: retry)"
            sc = a.scatter(clk(frames), ys, marker="o", s=46, facecolors=face, edgecolors="#0072B2", zorder=4, label=label)
            tag(sc, frames, "requests")
        if self.rollback:
            frames, ys, req_frames, req_ys = zip(*self.rollback, strict=True)
            xs, pxs = clk(frames), clk(req_frames)
            for px, py, rx, ry in list(zip(pxs, req_ys, xs, ys, strict=True))[-MAX_ROLLBACK_ARROWS:]:
                (link,) = a.plot([px, rx], [py, ry], linestyle=":", color=ROLLBACK, linewidth=1)
                link.set_gid("rollback-link")
            sc = a.scatter(xs, ys, marker="v", s=70, color=ROLLBACK, zorder=5, label="rollback to")
            tag(sc, frames, "rollbacks")
        if self.end:
            frames, ys, names = zip(*self.end, strict=True)
            xs = clk(frames)
            sc = a.scatter(xs, ys, marker="s", s=46, color=END, edgecolors="#444444", zorder=5, label="stream end")
            tag(sc, frames, "ends")
            for ex, ey, name in list(zip(xs, ys, names, strict=True))[:MAX_STREAMS]:
                a.annotate(name, (ex, ey), textcoords="offset points", xytext=(4, 4), fontsize="x-small", color=fg)


# ---------------------------------------------------------------------------
# branch tree


def plot_branches(
    t: Timeline,
    vbucket: int | None = None,
    *,
    ax: Axes | None = None,
    theme: str = "light",
    max_vbuckets: int = 8,
    size: tuple[float, float] | None = None,
    layout: str = "constrained",
    losses: Any = None,
) -> Figure:
    """The failover-log branch tree of a vbucket, with the consumer's resume points and rollback targets.

    ``losses`` (:func:`~dcpinspect.tables.history.rollback_losses` of the same
    read) marks each rollback's lost segment: the items the consumer had above
    the rollback seqno on the branch it sent, a band labelled with their count
    (``rollback-loss:VB``; :func:`~dcpinspect.views.plots_history.draw_losses`).

    One lane per branch (a failover-log entry: uuid and the seqno it starts
    at), in order of first sight; a branch runs from its seqno to where a newer
    branch takes over (or to the highest seqno seen), forks are drawn as
    vertical links, branches a later log no longer had are dashed and end in
    an ``x``; where a consumer resumed on a branch past the point a newer
    branch forked off, that lost history is dotted (``lost:UUID``).  Each stream request on the vbucket is a resume point on the lane
    of the uuid it sent (a lane of its own, ``uuid in no log seen``, when the uuid is
    in no log seen; uuid 0, "no history", on the branch holding its start
    seqno); each rollback is a ``v`` at its target, linked to its request.

    Without ``vbucket`` every vbucket with a branch or a stream is drawn (up to
    ``max_vbuckets``, one axes each; an ``ax`` takes only one; the figure's
    title says how many were left out; ``size``: each axes' width and height in
    inches).  A vbucket with no log and no request says so in words.  Of a vbucket with more than
    :data:`MAX_BRANCHES` branches the last seen are drawn, and of its rollbacks
    the last :data:`MAX_ROLLBACK_ARROWS` get an arrow.  Artists:
    ``branch:UUID`` lines, ``resume:VB`` and ``rollback-target:VB`` scatters.
    """
    every = sorted(set(t.branches) | {s.vbucket for s in t.streams}) if vbucket is None else [vbucket]
    vbs = every[: 1 if ax is not None else max_vbuckets] or [0 if vbucket is None else vbucket]
    fig, axes = new_axes(ax, theme, rows=len(vbs), size=size or (9.0, 3.2), layout=layout)
    fg = THEMES.get(theme, THEMES["light"])["fg"]
    per_vb: dict[int, list[Stream]] = {vb: [] for vb in vbs}
    for s in t.streams:  # one pass over the streams, not one per vbucket
        if s.vbucket in per_vb:
            per_vb[s.vbucket].append(s)
    for a, vb in zip(axes, vbs, strict=True):
        if not t.branches.get(vb) and not any(s.attempts for s in per_vb[vb]):
            say_empty(a, f"no failover log and no stream request seen on vbucket {vb}", theme)
            a.set_title(f"vbucket {vb}: failover branches")
            continue
        _branch_tree(a, t, vb, fg, per_vb[vb])
        if losses is not None:
            from .plots_history import draw_losses

            draw_losses(a, vb, losses)
        legend(a, theme)
        widen_left(fig, [tl.get_text() for tl in a.get_yticklabels()])
    if len(every) > len(vbs) and ax is None:
        fig.suptitle(f"showing {len(vbs)} of {len(every):,} vbuckets", color=fg, fontsize="small")
    return fig


def _branch_tree(a: Axes, t: Timeline, vb: int, fg: str, streams: list[Stream]) -> None:
    every = sorted(t.branches.get(vb, []), key=lambda b: b.order)
    branches = every[-MAX_BRANCHES:]
    attempts = [at for s in streams for at in s.attempts]
    seen = [s.last_seqno for s in streams if s.last_seqno is not None]
    high = [t.high_seqnos[vb][1]] if vb in t.high_seqnos else []
    seq = SeqAxis([*(b.seqno for b in branches), *(at.start for at in attempts), *(at.rollback_seqno for at in attempts), *seen, *high])
    live = sorted((b for b in branches if b.cut_frame is None), key=lambda b: (b.seqno, b.order))
    horizon = max([b.seqno for b in branches] + seen + high + [0])
    for b in branches:
        _branch_lane(a, b, branches, live, attempts, seq, horizon)
    lanes = {b.uuid: b.order for b in branches}
    unknown = branches[-1].order + 1 if branches else 0  # the lane of uuids in no log seen, above the rest
    _resume_points(a, vb, lanes, branches, live, attempts, seq, fg, unknown)
    ticks = [b.order for b in branches]
    labels = [f"0x{b.uuid:016x} @ {seqno_label(b.seqno)}" for b in branches]  # uuids zero-padded, as everywhere
    if any(at.uuid not in lanes and not (at.uuid == 0 and branches) for at in attempts):
        ticks.append(unknown)
        labels.append("uuid in no log seen")
    a.set_yticks(ticks, labels, fontsize="small")
    a.set_ylim(min(ticks, default=0) - 0.6, max(ticks, default=0) + 0.6)
    a.autoscale_view(scaley=False)
    seq.install(a, "x")
    a.set_xlabel("seqno")
    a.set_title(
        f"vbucket {vb}: failover branches"
        + ("" if branches else " (no failover log seen)")
        + (f" (showing the last {len(branches)} of {len(every):,})" if len(every) > len(branches) else "")
    )


def _branch_lane(
    a: Axes, b: Branch, branches: list[Branch], live: list[Branch], attempts: list[Attempt], seq: SeqAxis, horizon: int
) -> None:
    """Branch ``b``'s lane: from its seqno to the next live branch above it (or the horizon), its fork link, the history lost."""
    later = [o.seqno for o in live if o.seqno > b.seqno]
    end = min(later) if b.cut_frame is None and later else horizon
    if b.cut_frame is not None and b.cut_by is not None:
        cutter = next((o for o in branches if o.uuid == b.cut_by), None)
        end = max(b.seqno, cutter.seqno) if cutter is not None else end
    end = max(end, b.seqno)
    colour = OKABE_ITO[b.order % len(OKABE_ITO)]
    style = "--" if b.cut_frame is not None else "-"
    (line,) = a.plot([seq(b.seqno), seq(end)], [b.order, b.order], linestyle=style, color=colour, linewidth=3, solid_capstyle="butt")
    tag(line, [b.first_frame], f"branch:{b.uuid:x}")
    if b.cut_frame is not None:
        a.plot([seq(end)], [b.order], marker="x", color=colour, markersize=9)
    # history a consumer had on this branch past where a newer branch forked off: lost in the failover
    tail = max((at.start for at in attempts if at.uuid == b.uuid), default=end)
    if tail > end:
        (lost,) = a.plot([seq(end), seq(tail)], [b.order, b.order], linestyle=":", color=colour, linewidth=2)
        lost.set_gid(f"lost:{b.uuid:x}")
    parents = [o for o in branches if o.uuid != b.uuid and o.seqno <= b.seqno and o.cut_frame is None and o.order != b.order]
    parent = max(parents, key=lambda o: (o.seqno, -o.order), default=None)
    if parent is not None:
        a.plot([seq(b.seqno)] * 2, [parent.order, b.order], color=colour, linewidth=1, linestyle=":")


def _resume_lane(at: Attempt, lanes: Mapping[int, int], branches: list[Branch], live: list[Branch], unknown: int) -> int:
    """The lane a stream request resumes on: its uuid's branch, else (uuid 0) the branch holding its start, else ``unknown``."""
    if at.uuid in lanes:
        return lanes[at.uuid]
    if at.uuid == 0 and branches:
        # uuid 0 asks for everything, from no history (kv_engine docs/dcp/documentation/commands/stream-request.md),
        # not an unknown branch: drawn on the branch holding its start seqno
        on = [b for b in live or branches if b.seqno <= at.start]
        return max(on, key=lambda b: (b.seqno, b.order)).order if on else min(branches, key=lambda b: (b.seqno, b.order)).order
    return unknown


def _resume_points(
    a: Axes,
    vb: int,
    lanes: Mapping[int, int],
    branches: list[Branch],
    live: list[Branch],
    attempts: list[Attempt],
    seq: SeqAxis,
    fg: str,
    unknown: int,
) -> None:
    """Every stream request as a resume point on its lane (``resume:VB``) and each rollback's target (``rollback-target:VB``)."""
    rx, ry, rf, tx, ty, tf = [], [], [], [], [], []
    arrows = [at for at in attempts if at.outcome == "rollback" and at.rollback_seqno is not None][-MAX_ROLLBACK_ARROWS:]
    arrowed = {id(at) for at in arrows}
    for at in attempts:
        y = _resume_lane(at, lanes, branches, live, unknown)
        rx.append(seq(at.start))
        ry.append(y)
        rf.append(at.frame)
        if at.outcome != "rollback" or at.rollback_seqno is None:
            continue
        on = [b for b in live if b.seqno <= at.rollback_seqno]
        target = max(on, key=lambda b: b.seqno).order if on else (live[0].order if live else y)
        tx.append(seq(at.rollback_seqno))
        ty.append(target)
        tf.append(at.response_frame or at.frame)
        if id(at) in arrowed:
            arrow = {"arrowstyle": "->", "color": ROLLBACK, "linestyle": ":", "shrinkA": 4, "shrinkB": 4}
            a.annotate("", (seq(at.rollback_seqno), target), (seq(at.start), y), arrowprops=arrow).set_gid(f"rollback-arrow:{vb}")
    if rf:
        sc = a.scatter(rx, ry, marker="o", s=50, facecolors="none", edgecolors=fg, linewidths=1.5, zorder=5, label="resume point (request)")
        tag(sc, rf, f"resume:{vb}")
    if tf:
        sc = a.scatter(tx, ty, marker="v", s=70, color=ROLLBACK, zorder=6, label="rollback target")
        tag(sc, tf, f"rollback-target:{vb}")


# ---------------------------------------------------------------------------
# flow control and noops


def plot_flow(
    t: Timeline,
    *,
    conn: int | None = None,
    ax: Axes | None = None,
    x: str = "time",
    clock: Mapping[int, int] | tuple[Sequence[int], Sequence[int]] | Clock | None = None,
    theme: str = "light",
    noops: bool = True,
) -> Figure:
    """Bytes outstanding against the buffer size per connection, with acks and stalls (and noop round trips below).

    Artists: a step line per connection (``outstanding:C``), its buffer size
    (``buffer:C``), acks (``acks:C``), one shaded span per stall
    (``stall:C``); with ``noops``, noops answered and no ``ax`` a second axes holds
    :func:`plot_noops`.  Of more than :data:`MAX_CONNS` connections the busiest are drawn.
    """
    fig, axes = new_axes(ax, theme, rows=2 if noops and t.noops and ax is None else 1, size=(9.0, 3.6))
    a = axes[0]
    clk = Clock(clock if clock is not None else timeline_clock(t), x)
    by_conn: dict[int, list[FlowSample]] = {}
    for f in t.flow:  # one pass, not one per connection
        if conn is None or f.conn == conn:
            by_conn.setdefault(f.conn, []).append(f)
    stalls: dict[int, list[dict[str, Any]]] = {}
    for st in t.stalls:
        stalls.setdefault(st["conn"], []).append(st)
    conns = busiest(by_conn, MAX_CONNS) if conn is None else [conn]
    for k, c in enumerate(conns):
        colour = OKABE_ITO[k % len(OKABE_ITO)]
        samples = by_conn.get(c, [])
        if not samples:
            continue
        idx = thin(len(samples))
        frames = np.fromiter((samples[j].frame for j in idx), dtype=np.int64, count=len(idx))
        ys = [samples[j].outstanding for j in idx]
        (line,) = a.step(clk(frames), ys, where="post", color=colour, label=f"conn {c} outstanding", linewidth=1.3)
        tag(line, frames, f"outstanding:{c}")
        size = t.connections[c].buffer_size if c in t.connections else None
        if size:
            buf = a.axhline(size, color=colour, linestyle="--", linewidth=1, label=f"conn {c} buffer {size:,} B")
            buf.set_gid(f"buffer:{c}")
        acks = [f for f in samples if f.event == "ack"]
        if acks:
            af = [f.frame for f in acks]
            sc = a.scatter(clk(af), [f.outstanding for f in acks], marker="^", s=28, color=colour, edgecolors="#444444", zorder=4)
            if k == 0:
                sc.set_label("buffer ack")
            tag(sc, af, f"acks:{c}")
        for st in stalls.get(c, ()):
            x0, x1 = clk([st["frame"], st["ack_frame"]])
            took = "?" if st["duration_ns"] is None else f"{st['duration_ns'] / 1e9:.2f}"
            span = a.axvspan(x0, x1, color=STALL, alpha=0.2, label=f"stall {took} s")
            tag(span, [st["frame"], st["ack_frame"]], f"stall:{c}")
    if not t.flow and not by_conn:
        say_empty(a, "no buffer size negotiated: no flow control to plot", theme)
    a.set_xlabel(clk.label)
    a.set_ylabel("bytes outstanding")
    a.set_title(
        "flow control"
        + ("" if t.flow else " (no buffer size negotiated: nothing to plot)")
        + (f" (showing the {len(conns)} busiest of {len(by_conn):,} connections)" if len(by_conn) > len(conns) else "")
    )
    a.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    legend(a, theme)
    if len(axes) > 1:
        axes[1].sharex(a)  # one time axis: a noop lines up with the flow it happened in
        plot_noops(t, ax=axes[1], conn=conn, x=x, clock=clock, theme=theme)
    return fig


def plot_noops(
    t: Timeline,
    *,
    conn: int | None = None,
    ax: Axes | None = None,
    x: str = "time",
    clock: Mapping[int, int] | tuple[Sequence[int], Sequence[int]] | Clock | None = None,
    theme: str = "light",
) -> Figure:
    """Noop round trips (ms) per connection, with twice the noop interval (the late threshold) when known.

    Artists: one scatter per connection (``noops:C``), ``late:C`` lines.  Of
    more than :data:`MAX_CONNS` connections the busiest are drawn.
    """
    fig, (a,) = new_axes(ax, theme)
    clk = Clock(clock if clock is not None else timeline_clock(t), x)
    rows = [n for n in t.noops if conn is None or n["conn"] == conn]
    by_conn: dict[int, list[dict[str, Any]]] = {}
    for n in rows:  # one pass, not one per connection
        by_conn.setdefault(n["conn"], []).append(n)
    conns = busiest(by_conn, MAX_CONNS)
    for k, c in enumerate(conns):
        colour = OKABE_ITO[k % len(OKABE_ITO)]
        mine = [n for n in by_conn[c] if n["rtt_ns"] is not None]  # a round trip with an unknown time is not drawn
        frames = [n["frame"] for n in mine]
        sc = a.scatter(clk(frames), [n["rtt_ns"] / 1e6 for n in mine], color=colour, s=30, label=f"conn {c} noop round trip")
        tag(sc, frames, f"noops:{c}")
        info = t.connections.get(c)
        if info is not None and info.noop_interval:
            late = a.axhline(2 * info.noop_interval * 1e3, color=colour, linestyle=":", label=f"conn {c}: 2 x noop interval")
            late.set_gid(f"late:{c}")
    if not rows:
        say_empty(a, "no noop answered", theme)
    a.set_xlabel(clk.label)
    a.set_ylabel("round trip (ms)")
    a.set_title(
        "noops"
        + ("" if rows else " (none answered)")
        + (f" (showing the {len(conns)} busiest of {len(by_conn):,} connections)" if len(by_conn) > len(conns) else "")
    )
    legend(a, theme)
    return fig


# ---------------------------------------------------------------------------
# frames per opcode


def plot_opcodes(
    frames: Any,
    *,
    ax: Axes | None = None,
    bins: int = 60,
    top: int = 7,
    theme: str = "light",
) -> Figure:
    """Frames per opcode over time from the frames table (a pandas DataFrame or an Arrow table).

    The ``top`` commonest names get a line each, the rest are summed as
    ``other``; garbage, truncated frames and gaps are one line (``capture
    problems``) when present.  Artists: one line per name, ``gid`` ``opcode:NAME``.
    """
    fig, (a,) = new_axes(ax, theme)
    ts, names = _ts_names(frames)
    if not len(ts):
        say_empty(a, "no frames", theme)
        a.set_title("frames per opcode (no frames)")
        return fig
    t0 = int(ts.min())
    secs = (ts - t0) / 1e9
    span = float(secs.max()) if len(secs) else 0.0
    edges = np.linspace(0.0, span if span > 0 else 1.0, max(2, bins + 1))
    width = edges[1] - edges[0]
    uniq, codes, counts = np.unique(names, return_inverse=True, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    keep = [int(i) for i in order if uniq[i] != "capture problems"][:top]
    groups: list[tuple[str, np.ndarray]] = [(str(uniq[i]), codes == i) for i in keep]
    rest = ~np.isin(codes, keep)
    problems = np.flatnonzero(uniq == "capture problems")
    if len(problems):
        mask = codes == problems[0]
        rest &= ~mask
        groups.append(("capture problems", mask))
    if rest.any():
        groups.append(("other", rest))
    centres = (edges[:-1] + edges[1:]) / 2
    for k, (name, mask) in enumerate(groups):
        hist, _ = np.histogram(secs[mask], bins=edges)
        colour = ROLLBACK if name == "capture problems" else OKABE_ITO[k % len(OKABE_ITO)]
        (line,) = a.plot(centres, hist / width, color=colour, label=f"{name} ({int(mask.sum()):,})", linewidth=1.4)
        line.set_gid(f"opcode:{name}")
    a.set_xlabel("seconds since the first frame")
    a.set_ylabel("frames per second")
    a.set_title(f"frames per opcode ({len(ts):,} frames, {span:.3g} s)")
    legend(a, theme)
    return fig


def _ts_names(frames: Any) -> tuple[np.ndarray, np.ndarray]:
    """(timestamps in ns, command names with non-frames as ``capture problems``) of a frames table."""
    if hasattr(frames, "column_names"):  # Arrow
        import pyarrow as pa
        import pyarrow.compute as pc

        ts = frames.column("ts").cast(pa.int64()).fill_null(TS_UNKNOWN).to_numpy(zero_copy_only=False)
        is_frame = pc.equal(frames.column("type"), "frame")
        names = pc.if_else(is_frame, frames.column("name"), pa.scalar("capture problems")).to_numpy(zero_copy_only=False)
    else:  # pandas
        ts = np.asarray(frames["ts"].values).astype("datetime64[ns]").view(np.int64)
        names = np.where(frames["type"].to_numpy() == "frame", frames["name"].astype(object).to_numpy(), "capture problems")
    names = np.asarray([n if isinstance(n, str) else "unknown" for n in names], dtype=object)
    ts = np.asarray(ts, dtype=np.int64)
    known = ts != TS_UNKNOWN  # a null time (out of range in the capture; NaT in pandas) cannot be placed
    return ts[known], names[known].astype(str)
