"""HTML pieces of the report page: escaping, plurals, tables, figures as inline PNG, the style sheet.

Rules:

1. Every value put in the page goes through :func:`esc` (``html.escape``
   with quotes) after :func:`~dcpinspect.wire.render.safe_text` (control
   characters shown, not sent); markup is only ever made here or in
   :mod:`dcpinspect.views.report` from literals.
2. A table shows at most its ``limit`` rows and says how many it left out; a
   cell at most :data:`MAX_CELL` characters.
3. Figures are PNG data URIs (no file beside the page, no script): the page is one self-contained file.
"""

from __future__ import annotations

import base64
import html
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..wire.render import safe_text

__all__ = ["MAX_CELL", "STYLE", "Cell", "esc", "figure_img", "plural", "table"]

MAX_CELL = 300  # characters per table cell (a DCP_OPEN name or a key may be 64 KiB)


class Cell:
    """Markup made by the report itself (a link, a badge), put in a table cell as it is."""

    __slots__ = ("markup", "text")

    def __init__(self, markup: str, text: str = "") -> None:
        self.markup = markup
        self.text = text

    def __str__(self) -> str:
        return self.text


def esc(v: Any, limit: int | None = None) -> str:
    """``v`` as HTML text: control characters shown as escapes, at most ``limit`` characters, escaped."""
    text = "" if v is None else safe_text(str(v))
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit:,} more characters)"
    return html.escape(text, quote=True)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 connection``, ``2 connections``, ``1,234 frames`` (``many``: an irregular plural)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def _cell(v: Any) -> str:
    if isinstance(v, Cell):
        return v.markup
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, int):
        return f"{v:,}"
    return esc(v, MAX_CELL)


def _td(v: Any) -> str:
    text = v.text if isinstance(v, Cell) else "" if v is None else str(v)
    long = len(text) > 40 and max(map(len, text.split()), default=0) > 40  # a word too long to wrap: break it anywhere
    return f"<td class='long'>{_cell(v)}</td>" if long else f"<td>{_cell(v)}</td>"


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    limit: int = 200,
    more: str = "in the parquet tables",
    row_ids: Sequence[str | None] | None = None,
    cls: str = "",
) -> str:
    """A table of at most ``limit`` rows (a line says how many more there were, and where they are).

    ``row_ids`` gives rows an ``id`` (an anchor to link to).  Numbers print
    with thousands separators, ``True`` as ``yes``; :class:`Cell` markup goes in as it is.
    """
    out = [f"<div class='scroll'><table class='{esc(cls)}'><thead><tr>", *(f"<th>{esc(h)}</th>" for h in header), "</tr></thead><tbody>"]
    n = 0
    for row in rows:
        if n < limit:
            rid = row_ids[n] if row_ids is not None and n < len(row_ids) else None
            attr = f" id='{esc(rid)}'" if rid else ""
            out.append(f"<tr{attr}>" + "".join(map(_td, row)) + "</tr>")
        n += 1
    out.append("</tbody></table></div>")
    if n > limit:
        out.append(f"<p class='note'>... and {plural(n - limit, 'more row')} {esc(more)}.</p>")
    return "".join(out)


def figure_img(make: Callable[[], Any], alt: str, *, dpi: float = 80, cls: str = "plot") -> str:
    """The figure ``make()`` returns as an inline PNG ``<img>`` (or a line saying why it could not be drawn)."""
    from .drawing import figure_png

    try:
        fig = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # layout notes from matplotlib
            png = figure_png(fig, dpi=dpi)
    except Exception as exc:  # a plot that fails must not lose the rest of the report
        return f"<p class='bad'>plot failed: {esc(type(exc).__name__)}: {esc(exc)}</p>"
    data = base64.b64encode(png).decode("ascii")
    return f"<img class='{esc(cls)}' alt='{esc(alt)}' src='data:image/png;base64,{data}'>"


STYLE = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--head:#f6f8fa;--accent:#0969da;--bad:#b3261e;--warn:#9a6700}
*{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);margin:0;background:#fff}
main{max-width:1280px;margin:0 auto;padding:0 24px 48px}
header.top{background:#0d1117;color:#e6edf3;padding:20px 24px;margin-bottom:16px}
header.top h1{margin:0 0 6px;font-size:26px;font-weight:600;max-width:1232px;margin-left:auto;margin-right:auto}
.counts{display:flex;flex-wrap:wrap;gap:8px;max-width:1232px;margin:0 auto}
.count{background:#161b22;border:1px solid #30363d;border-radius:6px;padding:4px 12px}
.count b{font-size:18px;margin-right:4px}
.count.bad b{color:#ff7b72}
nav.toc{border:1px solid var(--line);border-radius:6px;padding:8px 16px;background:var(--head);margin:16px 0}
nav.toc ol{margin:4px 0;padding-left:22px;columns:2;column-gap:32px}
nav.toc li{break-inside:avoid}
h2{border-bottom:1px solid var(--line);padding-bottom:4px;margin-top:36px}
h3{margin:24px 0 8px}
section.set{border-left:4px solid var(--accent);padding-left:16px;margin-top:36px}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:6px 0 14px;font-size:13px}
td,th{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}
td.long{overflow-wrap:anywhere;min-width:14em}
th{background:var(--head);font-weight:600;white-space:nowrap}
tbody tr:nth-child(even){background:#fafbfc}
tr:target{background:#fff8c5 !important;outline:2px solid #d4a72c}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:var(--head);padding:1px 4px;border-radius:4px}
a{color:var(--accent);text-decoration:none} a:hover{text-decoration:underline}
.bad{color:var(--bad)} .warn{color:var(--warn)}
.note{color:var(--muted);font-size:14px}
.subset{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:6px 12px}
.meta{color:var(--muted);margin:4px 0 12px}
img.plot{display:block;max-width:100%;height:auto;margin:6px 0 14px;border:1px solid var(--line);border-radius:6px}
.pair{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:16px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:14px}
figure.stream{margin:0;border:1px solid var(--line);border-radius:6px;padding:6px;background:#fff}
figure.stream img{display:block;width:100%;height:auto}
figure.stream.flag{border-color:var(--bad)}
figure.stream figcaption{font-size:12.5px;color:var(--muted);padding:2px 4px}
.key{font-size:13px;color:var(--muted)}
a.up{float:right;font-size:13px;font-weight:400;margin-top:8px}
.tag{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;background:#ffebe9;color:var(--bad);margin-left:4px}
"""
