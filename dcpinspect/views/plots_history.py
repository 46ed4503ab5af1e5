"""What each rollback cost, drawn on the branch tree of :func:`dcpinspect.views.plots.plot_branches`.

Rules:

1. The lost segment of a rollback (a row of
   :func:`~dcpinspect.tables.history.rollback_losses` with items) is drawn on
   the lane of the branch its request sent (the lane whose tick names that
   uuid), from the rollback seqno to the highest seqno lost: a wide,
   translucent band in the rollback colour, labelled with the counts
   (``3 items cut: 1 key possibly lost``); its artist's gid is
   ``rollback-loss:VB``.
2. A rollback whose uuid has no lane (a uuid in no log seen) is drawn on the
   ``uuid in no log seen`` lane when there is one, else not at all; nothing
   else of the figure changes.
"""

from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes

from ..wire.render import plural
from .drawing import ROLLBACK

__all__ = ["draw_losses"]


def _lanes(a: Axes) -> dict[int | None, float]:
    """The lane (y) of each uuid from the branch tree's tick labels (``0x%016x @ seqno``; ``uuid in no log seen``: None)."""
    out: dict[int | None, float] = {}
    for y, label in zip(a.get_yticks(), a.get_yticklabels(), strict=False):
        text = label.get_text()
        if text == "uuid in no log seen":
            out[None] = float(y)
        elif text.startswith("0x"):
            try:
                out[int(text.split(" ", 1)[0], 16)] = float(y)
            except ValueError:
                continue
    return out


def draw_losses(a: Axes, vbucket: int, losses: Any) -> int:
    """Draw the lost segment of each rollback of ``vbucket`` in ``losses`` on ``a`` (rule 1); returns how many were drawn."""
    if losses is None or not len(losses):
        return 0
    lanes = _lanes(a)
    drawn = 0
    for r in losses[(losses["vbucket"] == vbucket) & (losses["items"] > 0)].to_dict("records"):
        uuid = None if r["uuid"] is None or r["uuid"] != r["uuid"] else int(r["uuid"])
        y = lanes.get(uuid, lanes.get(None))
        if y is None or r["last_seqno"] is None:
            continue
        lo, hi = float(r["rollback_seqno"]), float(r["last_seqno"])
        (band,) = a.plot([lo, hi], [y, y], color=ROLLBACK, linewidth=9, alpha=0.35, solid_capstyle="butt", zorder=2)
        band.set_gid(f"rollback-loss:{vbucket}")
        if not drawn:
            band.set_label("items a rollback cut")
        words = f"{plural(int(r['items']), 'item')} cut: {plural(int(r['possibly_lost']), 'key')} possibly lost"
        a.annotate(words, ((lo + hi) / 2, y), xytext=(0, 7), textcoords="offset points", ha="center", fontsize="x-small", color=ROLLBACK)
        drawn += 1
    return drawn
