"""Two consumers compared, drawn: per vbucket two lanes (a above b) with the seqnos each received, differences marked (an edge: matplotlib).

Rules:

1. :func:`plot_compare` takes a :class:`~dcpinspect.tables.compare.Comparison`;
   each vbucket (at most ``max_vbuckets``, those with differences first, the
   title says how many of how many) gets two lanes: a's items and b's, one
   tick per seqno (a dropped item - received, then rolled back - as an x).
2. Each difference row is a band on the lane of the consumer that has the
   items, from ``seqno_from`` to ``seqno_to``, coloured by its reason
   (the legend names them); the band carries the row's evidence frames of
   that consumer (:func:`~dcpinspect.views.drawing.frames_of`, gid ``diff:N``),
   the ticks their items' frames (gid ``items:VB:SIDE``).
3. A histories' divergence seqno is a dashed vertical line across the vbucket's lanes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .drawing import END, OKABE_ITO, THEMES, legend, new_axes, say_empty, tag

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["MAX_VBUCKETS", "REASON_COLOURS", "plot_compare"]

#: vbuckets drawn at most
MAX_VBUCKETS = 16
#: reason -> band colour (Okabe-Ito)
REASON_COLOURS = {
    "rollback": OKABE_ITO[5],
    "branch": OKABE_ITO[3],
    "start": OKABE_ITO[0],
    "filter": OKABE_ITO[2],
    "ended": OKABE_ITO[1],
    "dedup": OKABE_ITO[4],
    "unknown": END,
}
_LANE = {"a": 0.0, "b": 1.0}


def _seqno(v: Any) -> int | None:
    """A nullable seqno cell as an int (None for a null)."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _picked(comparison: Any, max_vbuckets: int) -> list[int]:
    """The vbuckets drawn: those with differences first (most items first), then the rest, in vbucket order."""
    per = comparison.per_vbucket
    order = sorted(per.itertuples(), key=lambda r: (-(int(r.only_a) + int(r.only_b)), int(r.vbucket)))
    return [int(r.vbucket) for r in order[:max_vbuckets]]


def plot_compare(comparison: Any, *, ax: Axes | None = None, theme: str = "light", max_vbuckets: int = MAX_VBUCKETS) -> Figure:
    """Rule 1-3's picture of ``comparison`` (on ``ax``, or on a new figure)."""
    vbs = _picked(comparison, max_vbuckets)
    fig, (a,) = new_axes(ax, theme, size=(9.0, 1.0 + 0.9 * max(len(vbs), 1)))
    if not vbs or comparison.items is None:
        say_empty(a, "no vbucket was streamed by either consumer", theme)
        return fig
    fg = THEMES[theme]["fg"]
    items, table = comparison.items, comparison.table
    labels: list[tuple[float, str]] = []
    seen: set[str] = set()
    for row, vb in enumerate(vbs):
        base = row * 3.0
        for side, lane in _LANE.items():
            y = base + lane
            labels.append((y, f"vb {vb} {side}"))
            mine = items[(items["vbucket"] == vb) & (items["side"] == side)]
            held, dropped = mine[~mine["dropped"]], mine[mine["dropped"]]
            (pts,) = a.plot([int(s) for s in held["seqno"]], [y] * len(held), "|", color=fg, markersize=9, linestyle="none")
            tag(pts, [int(f) for f in held["frame"]], f"items:{vb}:{side}")
            if len(dropped):
                (xs,) = a.plot(
                    [int(s) for s in dropped["seqno"]], [y] * len(dropped), "x", color=REASON_COLOURS["rollback"], linestyle="none"
                )
                tag(xs, [int(f) for f in dropped["frame"]], f"dropped:{vb}:{side}")
        for i, r in table[table["vbucket"] == vb].iterrows():
            y = base + _LANE[str(r["only_in"])]
            lo, hi = int(r["seqno_from"]), int(r["seqno_to"])
            reason = str(r["reason"])
            band = a.broken_barh(
                [(lo - 0.4, hi - lo + 0.8)],
                (y - 0.35, 0.7),
                color=REASON_COLOURS.get(reason, END),
                alpha=0.45,
                label=reason if reason not in seen else None,
            )
            seen.add(reason)
            tag(band, list(r["evidence_a"] if r["only_in"] == "a" else r["evidence_b"]), f"diff:{i}")
        per = comparison.per_vbucket[comparison.per_vbucket["vbucket"] == vb]
        at = _seqno(per["diverge_at"].iloc[0]) if len(per) else None
        if at is not None:
            a.plot(
                [at, at],
                [base - 0.5, base + 1.5],
                "--",
                color=REASON_COLOURS["branch"],
                label=None if "diverge" in seen else "histories diverge",
            )
            seen.add("diverge")
    a.set_yticks([y for y, _ in labels], [t for _, t in labels])
    a.set_ylim(-1.0, 3.0 * len(vbs) - 1.0)
    a.invert_yaxis()
    a.set_xlabel("seqno")
    total = len(comparison.per_vbucket)
    a.set_title("consumers compared" + (f" (showing {len(vbs)} of {total} vbuckets)" if total > len(vbs) else ""), color=fg)
    legend(a, theme)
    return fig
