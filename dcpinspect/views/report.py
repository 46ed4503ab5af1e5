"""A small self-contained HTML report of an analysis (an edge: imports matplotlib).

:func:`render_report` takes what ``dcpinspect analyze`` computed - the merged
timeline, a sample of the frames table, the per-file status - and returns one
HTML page: summary counts, the files and their status, the connections, the
anomalies, and the key plots of :mod:`dcpinspect.views.plots` embedded as base64
PNG.  Every piece of text that came off the wire (keys, connection names,
labels, messages, paths) is HTML-escaped.

The page stays small whatever the capture: the seqno plot draws at most
:data:`~dcpinspect.views.plots.MAX_STREAMS` streams (those with anomalies or
rollbacks first, then the busiest) and says ``showing N of M streams``; the
others are a table of at most :data:`MAX_ROWS` rows, as is every other table
(a line says how many rows were left out), and a cell holds at most
:data:`MAX_CELL` characters.
"""

from __future__ import annotations

import base64
import html
import io
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["MAX_CELL", "MAX_ROWS", "render_report"]

MAX_ROWS = 2000  # rows of the table of streams not plotted
MAX_CELL = 300  # characters per table cell (a DCP_OPEN name or key may be 64 KiB)

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:90%}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2} .bad{color:#b00} img{max-width:100%;display:block;margin:0.5em 0 1.5em}
code{font-size:90%}
"""


def _e(v: Any, limit: int | None = None) -> str:
    text = "" if v is None else str(v)
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit:,} more characters)"
    return html.escape(text, quote=True)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], limit: int = 200, more: str = "in the parquet table") -> str:
    out = ["<table><tr>", *(f"<th>{_e(h)}</th>" for h in header), "</tr>"]
    n = 0
    for row in rows:
        n += 1
        if n > limit:
            continue
        out.append("<tr>" + "".join(f"<td>{_e(v, MAX_CELL)}</td>" for v in row) + "</tr>")
    out.append("</table>")
    if n > limit:
        out.append(f"<p>... {n - limit:,} more rows {_e(more)}.</p>")
    return "".join(out)


def _streams(t: Any, items: Mapping[int, int] | None) -> str:
    """What the seqno plot left out (it picks as :func:`~dcpinspect.views.plots.pick_streams` does): a line and a table."""
    from .plots import MAX_STREAMS, pick_streams

    n = len(t.streams)
    if n <= MAX_STREAMS:
        return ""
    order = pick_streams(t, n, items=items)
    shown, rest = order[:MAX_STREAMS], order[MAX_STREAMS:]

    def row(i: int) -> tuple[Any, ...]:
        s = t.streams[i]
        end = s.end["name"] if s.end is not None else ""
        rollbacks = sum(a.outcome == "rollback" for a in s.attempts)
        count = items.get(i, len(s.items)) if items is not None else len(s.items)
        return (
            i,
            s.conn,
            s.vbucket,
            s.stream_id,
            s.segment,
            len(s.attempts),
            rollbacks,
            len(s.snapshots),
            count,
            s.last_seqno,
            end,
            len(s.anomalies),
        )

    note = (
        f"<p>showing {len(shown):,} of {n:,} streams (those with anomalies or rollbacks first, then the busiest); "
        f"the other {len(rest):,} below, in the same order.</p>"
    )
    header = [
        "stream",
        "conn",
        "vbucket",
        "stream id",
        "segment",
        "attempts",
        "rollbacks",
        "snapshots",
        "items",
        "last seqno",
        "end",
        "anomalies",
    ]
    table = _table(header, map(row, rest[:MAX_ROWS]), limit=MAX_ROWS)
    if len(rest) > MAX_ROWS:
        table += f"<p>... {len(rest) - MAX_ROWS:,} more streams left out here (every stream is in the streams table).</p>"
    return note + table


def _figure(make: Callable[[], Any]) -> str:
    """A matplotlib figure as an embedded PNG (or a note when it could not be drawn)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    try:
        fig = make()
    except Exception as exc:
        return f"<p class='bad'>plot failed: {_e(exc)}</p>"
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # layout notes from matplotlib
        fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return f"<img alt='plot' src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode('ascii')}'>"


def render_report(
    timeline: Any,
    frames: Any,
    status: Sequence[Mapping[str, Any]],
    *,
    counts: Mapping[str, Any],
    title: str = "dcpinspect analysis",
    sampled: bool = False,
    stream_items: Mapping[int, int] | None = None,
) -> str:
    """The report page.

    Args:
        timeline: the merged :class:`~dcpinspect.timeline.model.Timeline`.
        frames: the frames table's ``ts``/``type``/``name`` columns (Arrow or pandas; may be a sample).
        status: the per-file status rows (``path``, ``status``, ``format``, ``packets``, ``error``, ``problems``).
        counts: summary numbers shown at the top (name -> value).
        title: the page title.
        sampled: whether ``frames`` is a sample (said under the plot).
        stream_items: the true item count of each stream (by index) where the timeline's items were thinned.
    """
    from .plots import plot_branches, plot_flow, plot_noops, plot_opcodes, plot_seqnos

    t = timeline
    others = _streams(t, stream_items)
    vbs = len(set(t.branches) | {s.vbucket for s in t.streams})
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        _table(["what", "count"], counts.items()),
        "<h2>Files</h2>",
        _table(
            ["path", "status", "format", "packets", "reason"],
            (
                (s.get("path"), s.get("status"), s.get("format"), s.get("packets"), s.get("error") or "; ".join(s.get("problems") or []))
                for s in status
            ),
        ),
        "<h2>Connections</h2>",
        _table(
            ["conn", "label", "DCP_OPEN name", "side", "features", "bucket", "bytes lost"],
            ((c.conn, c.label, c.name, c.side, ", ".join(c.features), c.bucket, c.lost) for c in t.connections.values()),
        ),
        "<h2>Anomalies</h2>",
        _table(
            ["kind", "conn", "vbucket", "count", "uncertain", "first frames", "message"],
            ((a.kind, a.conn, a.vbucket, a.count, a.uncertain, ", ".join(map(str, a.frames[:5])), a.message) for a in t.anomalies),
        )
        if t.anomalies
        else "<p>none</p>",
        "<h2>Frames per opcode</h2>",
        _figure(lambda: plot_opcodes(frames)),
        "<p>(from a sample of the frames table)</p>" if sampled else "",
        "<h2>Seqnos per stream</h2>",
        _figure(lambda: plot_seqnos(t, stream_items=stream_items)) if t.streams else "<p>no streams</p>",
        others,
        "<h2>Failover branches</h2>",
        _figure(lambda: plot_branches(t, max_vbuckets=4)) if t.branches else "<p>no failover logs seen</p>",
        f"<p>showing 4 of {vbs:,} vbuckets (every branch is in the failover table)</p>" if t.branches and vbs > 4 else "",
        "<h2>Flow control and noops</h2>",
        _figure(lambda: plot_flow(t)) if (t.flow or t.noops) else "<p>no flow control or noops seen</p>",
        _figure(lambda: plot_noops(t)) if t.noops else "",
        "</body></html>",
    ]
    return "\n".join(parts)
