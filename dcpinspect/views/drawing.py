"""The drawing kit under :mod:`dcpinspect.views.plots`: figures without pyplot, themes, axes for seqnos and time, artists that know their frames.

* :func:`new_axes` makes a :class:`~matplotlib.figure.Figure` (never pyplot
  state: headless, safe in threads) or themes the ``ax`` it is given;
  :func:`legend` keeps a legend of hundreds of entries short.
* :class:`Clock` turns frame numbers into seconds since the first frame
  (interpolated where a frame's time is unknown); :class:`SeqAxis` puts the
  uint64 seqno 2^64-1 just above the largest real one and labels it ``max``.
* :func:`tag` marks an artist with the frame numbers of its points:
  :func:`frames_of` reads them back, :func:`frame_at` answers a matplotlib pick
  event and :func:`frame_at_pixel` a click on the figure's PNG.
"""

from __future__ import annotations

import io
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.collections import Collection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ..flows.reassembly import TS_UNKNOWN
from ..protocol.rules import MAX_SEQNO
from ..timeline import Timeline

__all__ = [
    "END",
    "MAX_POINTS",
    "OKABE_ITO",
    "ROLLBACK",
    "STALL",
    "THEMES",
    "Clock",
    "SeqAxis",
    "as_ns",
    "busiest",
    "display_points",
    "figure_png",
    "fit_margins",
    "frame_at",
    "frame_at_pixel",
    "frames_of",
    "legend",
    "new_axes",
    "say_empty",
    "tag",
    "thin",
    "timeline_clock",
    "widen_left",
]

#: Okabe-Ito, without black (unreadable on dark backgrounds)
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
ROLLBACK = "#D55E00"  # vermillion
END = "#999999"
STALL = "#CC79A7"
THEMES = {
    "light": {"face": "#ffffff", "fg": "#222222", "grid": "#dddddd"},
    "dark": {"face": "#1e1e1e", "fg": "#e6e6e6", "grid": "#444444"},
}
MAX_POINTS = 20_000  # points per line drawn (longer series are thinned evenly; the ends are kept)

_FRAMES: weakref.WeakKeyDictionary[Artist, np.ndarray] = weakref.WeakKeyDictionary()


def frames_of(artist: Artist) -> np.ndarray:
    """The frame numbers of an artist's points, in drawing order (empty if it stands for none)."""
    return _FRAMES.get(artist, np.zeros(0, dtype=np.int64))


def frame_at(event: Any) -> int | None:
    """The frame number under a matplotlib ``pick_event`` (``None``: the artist has no frames)."""
    frames = frames_of(event.artist)
    ind = getattr(event, "ind", None)
    if not len(frames):
        return None
    i = int(ind[0]) if ind is not None and len(ind) else 0
    return int(frames[min(i, len(frames) - 1)])


def frame_at_pixel(fig: Figure, x: float, y: float, *, dpi: float = 80) -> int | None:
    """The frame under a click on ``fig`` rendered as a PNG at ``dpi``: ``x``, ``y`` in image pixels from the top left.

    What a browser can report about a click on the picture of a figure: the
    figure is laid out at that ``dpi`` (as :meth:`~matplotlib.figure.Figure.savefig`
    does) and every artist that stands for frames is hit-tested like a
    ``pick_event`` (its pick radius); among the hits the point nearest the
    click wins.  ``None`` when the click is on nothing that stands for a frame.
    """
    from matplotlib.backend_bases import MouseButton, MouseEvent
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    old_dpi = fig.dpi
    try:
        fig.set_dpi(dpi)
        fit_margins(fig)
        canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
        canvas.draw()  # the layout (constrained/tight) of the saved picture
        _w, h = canvas.get_width_height()
        event = MouseEvent("button_press_event", canvas, x, h - y, button=MouseButton.LEFT)  # type: ignore[arg-type]  # floats work
        best: tuple[float, int] | None = None
        for artist in fig.findobj(lambda a: a in _FRAMES):
            frames = _FRAMES[artist]
            if not len(frames) or not artist.get_visible():
                continue
            hit, info = artist.contains(event)
            if not hit:
                continue
            ind = np.asarray(info.get("ind", []), dtype=np.int64)
            ind = ind[ind < len(frames)]
            if not len(ind):  # an area (a span): its first frame
                cand = (float("inf"), int(frames[0]))
            else:
                pts = display_points(artist, ind)
                if pts is None:
                    cand = (float("inf"), int(frames[ind[0]]))
                else:
                    d = np.hypot(pts[:, 0] - x, pts[:, 1] - (h - y))
                    k = int(np.argmin(d))
                    cand = (float(d[k]), int(frames[ind[k]]))
            if best is None or cand[0] < best[0]:
                best = cand
        return None if best is None else best[1]
    finally:
        fig.set_dpi(old_dpi)


def display_points(artist: Artist, ind: np.ndarray) -> np.ndarray | None:
    """Display coordinates of an artist's points ``ind`` (lines and scatter collections), else ``None``."""
    if isinstance(artist, Line2D):
        return artist.get_transform().transform(np.asarray(artist.get_xydata())[ind])
    if isinstance(artist, Collection):
        offsets = np.asarray(artist.get_offsets())
        if len(offsets) > int(ind.max()):
            return artist.get_offset_transform().transform(offsets[ind])
    return None


def tag(artist: Artist, frames: Iterable[int], gid: str) -> Artist:
    """Mark ``artist`` as standing for ``frames`` (one per point, in drawing order), named ``gid`` and pickable."""
    _FRAMES[artist] = np.asarray(list(frames), dtype=np.int64)
    artist.set_gid(gid)
    artist.set_picker(5)
    return artist


def figure_png(fig: Figure, dpi: float = 80) -> bytes:
    """A figure as PNG bytes (no pyplot involved), on its own face colour (fast compression: a picture is sent once)."""
    buf = io.BytesIO()
    fit_margins(fig)
    fig.savefig(buf, format="png", dpi=dpi, facecolor=fig.get_facecolor(), pil_kwargs={"compress_level": 1})
    return buf.getvalue()


#: margins (inches) of a figure laid out with ``layout="fixed"``: left, right, top, bottom, and between axes
FIXED_MARGINS = (1.05, 0.25, 0.45, 0.6, 0.75)


def widen_left(fig: Figure, labels: Sequence[str]) -> None:
    """Room on the left of a ``layout="fixed"`` figure for the longest of ``labels`` (y tick labels, small font)."""
    margins = getattr(fig, "dcpinspect_margins", None)
    if margins is None or not labels:
        return
    need = 0.35 + 0.075 * max(len(t) for t in labels)
    fig.dcpinspect_margins = (max(margins[0], need), *margins[1:])  # type: ignore[attr-defined]
    fit_margins(fig)


def fit_margins(fig: Figure) -> None:
    """A ``layout="fixed"`` figure's axes placed at :data:`FIXED_MARGINS` inches from its edges, at its present size.

    Constrained layout measures every label of every axis on each draw (tens
    of milliseconds); fixed margins cost nothing and keep their size in
    inches when the figure is made wider (the explorer draws it as wide as its place).
    """
    margins = getattr(fig, "dcpinspect_margins", None)
    if margins is None:
        return
    left, right, top, bottom, between = margins
    w, h = fig.get_size_inches()
    rows = max(1, len(fig.axes))
    fig.subplots_adjust(
        left=min(0.45, left / w),
        right=1 - min(0.2, right / w),
        top=1 - min(0.3, top / h),
        bottom=min(0.3, bottom / h),
        hspace=between / max(0.1, (h - top - bottom - between * (rows - 1)) / rows),
    )


def new_axes(
    ax: Axes | None, theme: str, *, rows: int = 1, size: tuple[float, float] = (9.0, 4.5), layout: str = "constrained"
) -> tuple[Figure, list[Axes]]:
    """``ax``'s figure and ``[ax]``, or a new figure of ``rows`` axes one above the other; every axes in the ``theme``'s colours.

    ``layout`` is ``"constrained"`` (matplotlib's) or ``"fixed"`` (:func:`fit_margins`: fast, for pictures drawn often).
    """
    colours = THEMES.get(theme, THEMES["light"])
    if ax is not None:
        fig = ax.get_figure()
        assert isinstance(fig, Figure)
        axes = [ax]
    else:
        fixed = layout == "fixed"
        fig = Figure(figsize=(size[0], size[1] * rows), layout=None if fixed else "constrained", facecolor=colours["face"])
        axes = list(np.atleast_1d(fig.subplots(rows, 1, squeeze=False)[:, 0]))
        if fixed:
            fig.dcpinspect_margins = FIXED_MARGINS  # type: ignore[attr-defined]
            fit_margins(fig)
    for a in axes:
        a.set_facecolor(colours["face"])
        a.grid(True, color=colours["grid"], linewidth=0.6)
        a.set_axisbelow(True)
        for spine in a.spines.values():
            spine.set_color(colours["fg"])
        a.tick_params(colors=colours["fg"])
        a.xaxis.label.set_color(colours["fg"])
        a.yaxis.label.set_color(colours["fg"])
        a.title.set_color(colours["fg"])
    return fig, axes


_BEST_LEGEND_POINTS = 20_000
_LEGEND_ENTRIES = 12


def legend(ax: Axes, theme: str) -> None:
    """The axes' legend in the theme's colours: its first entries when there are many, placed cheaply on a big figure."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    title = None
    if len(handles) > _LEGEND_ENTRIES:  # hundreds of streams: a legend of them all hides the plot
        title = f"{_LEGEND_ENTRIES} of {len(handles)}"
        handles, labels = handles[:_LEGEND_ENTRIES], labels[:_LEGEND_ENTRIES]
    colours = THEMES.get(theme, THEMES["light"])
    # "best" tests every candidate place against every point: seconds on a big figure
    points = sum(int(np.size(line.get_xdata())) for line in ax.get_lines())
    points += sum(int(np.shape(c.get_offsets())[0]) for c in ax.collections)
    leg = ax.legend(
        handles,
        labels,
        title=title,
        title_fontsize="small",
        loc="best" if points <= _BEST_LEGEND_POINTS else "upper left",
        fontsize="small",
        facecolor=colours["face"],
        edgecolor=colours["grid"],
        framealpha=0.85,
    )
    for text in (*leg.get_texts(), leg.get_title()):
        text.set_color(colours["fg"])


def as_ns(values: Any) -> np.ndarray:
    """Timestamps (ints, datetimes, or floats where a null made them NaN) as int64 ns; a null is :data:`TS_UNKNOWN`."""
    dtype = getattr(values, "dtype", None)
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        arr = np.asarray(values)
        out = np.full(len(arr), TS_UNKNOWN, np.int64)
        ok = np.isfinite(arr)
        out[ok] = arr[ok].astype(np.int64)
        return out
    try:
        return np.asarray(values, dtype=np.int64)  # ints; datetimes, zoned too (NaT is int64's minimum: TS_UNKNOWN)
    except (TypeError, ValueError):  # nullable integers with a null: one by one
        out = np.empty(len(values), np.int64)
        for i, v in enumerate(values):
            try:
                out[i] = v.value if hasattr(v, "value") else int(v)
            except (TypeError, ValueError):
                out[i] = TS_UNKNOWN
        return out


class Clock:
    """Frame number -> seconds since the first frame shown (exact where known, else interpolated).

    The known times are converted to the float arrays :func:`numpy.interp`
    takes once, when the clock is made (:attr:`conversions` counts it), not at
    every call: a plot calls its clock once per band and mark.
    """

    frames: np.ndarray
    ts: np.ndarray
    t0: int
    _fx: np.ndarray
    _fy: np.ndarray

    def __init__(self, known: Mapping[int, int] | tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray] | Clock, x: str) -> None:
        if isinstance(known, Clock):
            self.frames, self.ts, self.t0 = known.frames, known.ts, known.t0
            self._fx, self._fy = known._fx, known._fy
            self.conversions = 0
        else:
            if isinstance(known, Mapping):
                frames, ts = np.fromiter(known.keys(), dtype=np.int64), np.fromiter(known.values(), dtype=np.int64)
            else:
                frames, ts = np.asarray(known[0], dtype=np.int64), as_ns(known[1])
            known_ts = ts != TS_UNKNOWN  # frames whose time is unknown are placed between their neighbours
            if not known_ts.all():
                frames, ts = frames[known_ts], ts[known_ts]
            if len(frames) > 1 and not bool(np.all(frames[1:] >= frames[:-1])):  # a capture's frames are in order: no sort
                order = np.argsort(frames, kind="stable")
                frames, ts = frames[order], ts[order]
            self.frames, self.ts = frames, ts
            self.t0 = int(self.ts.min()) if len(self.ts) else 0
            self._fx = self.frames.astype(np.float64)
            self._fy = (self.ts - self.t0).astype(np.float64) / 1e9
            self.conversions = 1
        self.by_frame = x == "frame" or not len(self.frames)

    def __call__(self, frames: Sequence[int] | np.ndarray) -> np.ndarray:
        """The x coordinates of ``frames``."""
        f = np.asarray(frames, dtype=np.float64)
        if self.by_frame:
            return f
        return np.interp(f, self._fx, self._fy)

    @property
    def label(self) -> str:
        """What the x axis shows."""
        return "frame number" if self.by_frame else "seconds since the first frame"


def timeline_clock(t: Timeline) -> dict[int, int]:
    """Frame number -> timestamp (ns) for every frame the timeline knows the time of."""
    known: dict[int, int] = {}
    for s in t.streams:
        for a in s.attempts:
            known[a.frame] = a.ts
        for it in s.items:
            known[it.frame] = it.ts
    for f in t.flow:
        known[f.frame] = f.ts
    return known


class SeqAxis:
    """Maps uint64 seqnos to plot coordinates: 2^64-1 goes just above the largest real value."""

    def __init__(self, values: Iterable[int | None]) -> None:
        finite = [v for v in values if v is not None and v != MAX_SEQNO]
        top = max(finite, default=0)
        self.max_at = float(top + max(1, top // 10)) if top else 1.0
        self.used_max = False

    def __call__(self, v: int | None) -> float:
        """The coordinate of seqno ``v`` (NaN: unknown)."""
        if v is None:
            return float("nan")
        if v == MAX_SEQNO:
            self.used_max = True
            return self.max_at
        return float(v)

    def install(self, ax: Axes, axis: str = "y") -> None:
        """Integer ticks on ``axis`` of ``ax``, the top one labelled ``max`` when 2^64-1 was drawn."""
        max_at = self.max_at
        used = self.used_max

        def fmt(v: float, _pos: object) -> str:
            if used and abs(v - max_at) < 1e-9 * max(1.0, max_at):
                return "max"
            return f"{round(v) + 0:,}"  # never "-0"

        target = ax.yaxis if axis == "y" else ax.xaxis
        target.set_major_locator(MaxNLocator(integer=True))
        target.set_major_formatter(FuncFormatter(fmt))
        getter = ax.get_ylim if axis == "y" else ax.get_xlim
        setter = ax.set_ylim if axis == "y" else ax.set_xlim
        if used:
            lo, hi = getter()
            setter(lo, max(hi, max_at * 1.02 + 0.5))
        lo, hi = getter()
        if hi - lo < 2:  # one seqno (or none): a range of whole numbers around it, not "0 0 0" ticks of a sliver
            mid = round((lo + hi) / 2)
            setter(mid - 0.5, mid + 1.5)


def say_empty(ax: Axes, text: str, theme: str = "light") -> None:
    """An axes with nothing to draw: ``text`` in its middle and no ticks (an empty axis would be labelled ``-0``)."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.grid(False)
    colour = THEMES.get(theme, THEMES["light"])["fg"]
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize="large", color=colour, transform=ax.transAxes, gid="empty")


def busiest(by_conn: Mapping[int, Sequence[Any]], n: int) -> list[int]:
    """The ``n`` connections with the most entries, in connection order."""
    if len(by_conn) <= n:
        return sorted(by_conn)
    return sorted(sorted(by_conn, key=lambda c: (-len(by_conn[c]), c))[:n])


def thin(n: int, most: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most ``most`` (default :data:`MAX_POINTS`) of ``n`` points, evenly spread, the first and last kept."""
    if n <= most:
        return np.arange(n)
    idx = np.linspace(0, n - 1, max(2, most)).astype(np.int64)
    return np.unique(idx)
