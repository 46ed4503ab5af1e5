"""The consumer-lag plot: consumer seqno and producer high seqno over time, the lag between them shaded (an edge: matplotlib).

Rules:

1. :func:`plot_lag` takes the progress table of
   :func:`dcpinspect.tables.progress.progress` (any subset of its rows) and
   draws each series (a consumer's view of one vbucket) as two step lines -
   its consumer seqno (solid) and the producer's high seqno as last seen
   (dashed) - with the lag between them shaded in the series' colour.
2. Bounded: at most ``max_series`` (default :data:`MAX_SERIES`) series, the
   furthest behind first (:func:`~dcpinspect.tables.progress.lag_summary`'s
   order), the title says how many of how many; each line has at most
   :data:`~dcpinspect.views.drawing.MAX_POINTS` points (:func:`~dcpinspect.views.drawing.thin`,
   the first and last kept).
3. x is seconds since the first row shown (``x="time"``; a row of unknown time
   is placed between its neighbours) or the frame number (``x="frame"``).
   Lines carry their rows' frame numbers (:func:`~dcpinspect.views.drawing.frames_of`):
   gids ``consumer:K`` and ``high:K``, the shading ``lag:K``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..flows.reassembly import TS_UNKNOWN
from .drawing import OKABE_ITO, SeqAxis, as_ns, legend, new_axes, say_empty, tag, thin

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["MAX_SERIES", "plot_lag"]

#: series drawn at most (the furthest behind)
MAX_SERIES = 8
_SERIES = ["capture_set", "conn", "consumer", "vbucket", "stream_id"]


def _label(key: tuple[Any, ...], vbucket_shown: bool) -> str:
    cs, conn, consumer, vb, sid = key
    who = f"{consumer}" if isinstance(consumer, str) and consumer else f"conn {conn}"
    parts = [who if vbucket_shown else f"vb {vb} {who}"]
    if sid is not None:
        parts.append(f"sid {sid}")
    if cs != 1:
        parts.append(f"set {cs}")
    from ..wire.render import safe_text

    return safe_text(" ".join(parts), 60)


def _key(values: Any) -> tuple[Any, ...]:
    """A series' key with its nulls (NA, NaN) as None: keys of the summary and of a groupby compare equal."""
    import pandas as pd

    return tuple(None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v for v in values)  # noqa: PLR0124 - NaN


def _positions(rows: Any, x: str) -> tuple[dict[int, float], str]:
    """Frame -> its x: the frame number, or seconds since the first known time (an unknown time interpolated by frame)."""
    frames = rows["frame"].to_numpy(dtype=np.int64)
    if x == "frame":
        return dict(zip(frames.tolist(), frames.astype(np.float64).tolist(), strict=True)), "frame number"
    ns = as_ns(rows["ts"])
    known = ns != TS_UNKNOWN
    if not known.any():
        return dict(zip(frames.tolist(), frames.astype(np.float64).tolist(), strict=True)), "frame number"
    order = np.argsort(frames[known], kind="stable")
    kf, kt = frames[known][order].astype(np.float64), (ns[known][order] - ns[known].min()) / 1e9
    return dict(
        zip(frames.tolist(), np.interp(frames.astype(np.float64), kf, kt).tolist(), strict=True)
    ), "seconds since the first frame shown"


def _values(series: Any) -> np.ndarray:
    return np.asarray(series.astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan))


def plot_lag(
    progress_df: pd.DataFrame,
    vbucket: int | None = None,
    *,
    ax: Axes | None = None,
    x: str = "time",
    theme: str = "light",
    max_series: int = MAX_SERIES,
) -> Figure:
    """Consumer seqno and producer high seqno over time per series, the lag shaded (rules 1-3); ``vbucket`` keeps one vbucket."""
    from ..tables.progress import lag_summary

    fig, (a,) = new_axes(ax, theme, size=(9.0, 4.2))
    rows = progress_df if vbucket is None else progress_df[progress_df["vbucket"] == vbucket]
    what = "consumer lag" + ("" if vbucket is None else f": vbucket {vbucket}")
    if rows.empty:
        say_empty(a, "no consumer progress to plot", theme)
        a.set_title(what + " (nothing to plot)")
        return fig
    worst = lag_summary(rows, None)
    picked = [_key(r) for r in worst[_SERIES].itertuples(index=False)][:max_series]
    at, xlabel = _positions(rows, x)  # no Clock: the report's clocks are its sets' (converted once each)
    seq = SeqAxis([int(v) for v in rows["producer_high"].dropna()] + [int(v) for v in rows["consumer_seqno"].dropna()])
    groups = {_key(k): g for k, g in rows.groupby(_SERIES, sort=False, dropna=False)}
    for k, key in enumerate(picked):
        g = groups.get(key)
        if g is None:
            continue
        colour = OKABE_ITO[k % len(OKABE_ITO)]
        idx = thin(len(g))
        part = g.iloc[idx]
        frames = part["frame"].to_numpy(dtype=np.int64)
        xs = np.array([at[f] for f in frames.tolist()], np.float64)
        mine = _values(part["consumer_seqno"])
        high = _values(part["producer_high"])
        label = _label(key, vbucket is not None)
        (line,) = a.step(xs, mine, where="post", color=colour, linewidth=1.4, label=label)
        tag(line, frames, f"consumer:{k}")
        (hline,) = a.step(
            xs,
            high,
            where="post",
            color=colour,
            linewidth=1.0,
            linestyle="--",
            label="producer high seqno (dashed)" if k == 0 else "_nolegend_",
        )
        tag(hline, frames, f"high:{k}")
        behind = np.isfinite(mine) & np.isfinite(high) & (high > mine)
        if behind.any():
            shade = a.fill_between(xs, mine, high, where=behind, step="post", color=colour, alpha=0.18, linewidth=0)
            tag(shade, frames, f"lag:{k}")
    seq.install(a)
    a.set_xlabel(xlabel)
    a.set_ylabel("seqno")
    shown = f" (showing the {len(picked)} furthest behind of {len(worst):,} series)" if len(worst) > len(picked) else ""
    a.set_title(what + shown)
    legend(a, theme)
    return fig
