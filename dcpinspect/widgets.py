"""Notebook widgets (ipywidgets 8): thin views over the models of :mod:`dcpinspect.explorer`.

* :func:`explore` - the explorer: filters, a paged frame list, the selected
  frame's annotation (grid and breakdown, the field under the pointer
  highlighted in both), the selected stream's timeline and its vbucket's
  branch tree - a click on a point of either selects its frame - and a
  "jump to" list of the stream's key frames (requests, rollbacks, snapshots,
  end, anomalies) that selects them; live sources update it as the session
  runs.
* :func:`stepper` - the teaching mode: play/next/previous/speed over a session,
  each frame's annotation and what it changed in the stream's state.

Every view also carries a static rendering (``text/html`` and ``text/plain``
in its mime bundle, from the model), so exported notebooks and terminals
without a widget front end still show the page, the annotation and the
changes.  All state lives in the models; the views only mirror it.
"""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as w
import traitlets

from .explorer import ExplorerModel, StepperModel
from .plots import frame_at_pixel

__all__ = ["ExplorerView", "FigureImage", "StepperView", "explore", "figure_png", "stepper"]

BIG = 32 << 20  # captures larger than this (bytes) are read in the background by default
_ANY = ("any", None)


def figure_png(fig: Any, dpi: int = 80) -> bytes:
    """A matplotlib figure as PNG bytes (no pyplot involved)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor=fig.get_facecolor())
    return buf.getvalue()


def _label(r: dict[str, Any]) -> str:
    """One frame list entry (plain text: the Select widget renders it as text, never HTML)."""
    bits = [f"{r['frame']:>8}", r["dir"] or "", r["name"] or r["type"] or ""]
    if r["vbucket"] is not None:
        bits.append(f"vb {r['vbucket']}")
    if r["status_name"]:
        bits.append(str(r["status_name"]))
    if r["key"]:
        key = str(r["key"])
        bits.append(repr(key[:40] + ("..." if len(key) > 40 else "")))
    if r["seqno"] is not None:
        bits.append(f"seqno {'max' if r['seqno'] == 2**64 - 1 else r['seqno']}")
    if r["problems"]:
        bits.append(f"! {len(r['problems'])} problem(s)")
    return "  ".join(bits)


def _show_any(d: w.Dropdown) -> None:
    """Show "any" for a dropdown whose value is ``None``.

    ipywidgets maps a ``None`` value to no index, so the browser would show an
    empty dropdown; index 0 is the ("any", None) option and keeps the value.
    """
    if d.value is None and d.options and d.index is None:
        d.index = 0


#: the frame list's labels are columns (frame number right-aligned, names, vbucket...): a fixed-width font lines them up
_LIST_CSS = "<style>.dcpinspect-explorer .widget-select select{font-family:var(--jp-code-font-family,monospace);white-space:pre}</style>"
PNG_DPI = 80  # the resolution plots are sent to the browser at (clicks are mapped back at the same one)


class FigureImage(anywidget.AnyWidget):
    """A matplotlib figure as a PNG that reports clicks: ``click`` is ``[x, y, n]`` in image pixels (n counts clicks).

    The front end is a few lines of JavaScript (anywidget's ESM): an ``<img>``
    from the PNG bytes and a click listener that scales the pointer to the
    picture's own pixels, so the Python side can hit-test the figure with
    :func:`~dcpinspect.plots.frame_at_pixel`.
    """

    _esm = """
    function render({ model, el }) {
      const img = document.createElement("img");
      img.style.maxWidth = "100%";
      img.style.cursor = "crosshair";
      img.className = "dcpinspect-figure";
      let url = null, clicks = 0;
      const show = () => {
        const v = model.get("value");
        if (url) URL.revokeObjectURL(url);
        url = v && v.byteLength ? URL.createObjectURL(new Blob([v], { type: "image/png" })) : null;
        if (url) img.src = url; else img.removeAttribute("src");
      };
      img.addEventListener("click", (e) => {
        const r = img.getBoundingClientRect();
        if (!r.width || !r.height) return;
        clicks += 1;
        model.set("click", [(e.clientX - r.left) * img.naturalWidth / r.width, (e.clientY - r.top) * img.naturalHeight / r.height, clicks]);
        model.save_changes();
      });
      model.on("change:value", show);
      show();
      el.appendChild(img);
    }
    export default { render };
    """
    value = traitlets.Bytes(b"").tag(sync=True)
    click: traitlets.List[float] = traitlets.List([]).tag(sync=True)


def _set_png(img: FigureImage, png: bytes) -> None:
    """Show a PNG, or hide the image when there is none (an empty image is a broken-image icon in a browser)."""
    img.value = png
    img.layout.display = None if png else "none"


class _Static:
    """Adds the model's static rendering to a widget's mime bundle."""

    model: Any

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})  # type: ignore[misc]
        bundle["text/html"] = self.model._repr_html_()
        bundle["text/plain"] = self.model.text()
        return bundle


class ExplorerView(_Static, w.VBox):
    """The explorer widget over an :class:`~dcpinspect.explorer.ExplorerModel`."""

    def __init__(self, model: ExplorerModel, *, theme: str = "light", plots: bool = True) -> None:
        self.model = model
        self.theme = theme
        self.plots = plots and model.builder is not None
        self._syncing = False
        self._plot_key: Any = None
        small = w.Layout(width="150px")
        self.conn = w.Dropdown(description="conn", options=[_ANY], layout=small)
        self.vbucket = w.Dropdown(description="vbucket", options=[_ANY], layout=small)
        self.stream = w.Dropdown(description="stream", options=[_ANY], layout=w.Layout(width="220px"))
        self.opcode = w.Dropdown(description="opcode", options=[_ANY], layout=w.Layout(width="260px"))
        self.direction = w.Dropdown(description="dir", options=[_ANY, ("c2s", "c2s"), ("s2c", "s2c")], layout=small)
        self.key = w.Text(description="key", placeholder="text in the key", continuous_update=False, layout=w.Layout(width="220px"))
        self.problems = w.Checkbox(description="only problems/anomalies", indent=False)
        for d in (self.conn, self.vbucket, self.stream, self.opcode, self.direction):
            d.style.description_width = "55px"
        self.status = w.HTML()
        self.prev_btn = w.Button(description="◀ page", layout=w.Layout(width="90px"))
        self.next_btn = w.Button(description="page ▶", layout=w.Layout(width="90px"))
        self.frames = w.Select(options=[], rows=min(model.page_size, 18), layout=w.Layout(width="100%"))
        self.annotation = w.HTML()
        self.jump = w.Dropdown(description="jump to", options=[_ANY], layout=w.Layout(width="480px"))
        self.stream_img = FigureImage(layout=w.Layout(display="none"))  # shown by _set_png once drawn
        self.branch_img = FigureImage(layout=w.Layout(display="none"))
        self._figs: dict[str, Any] = {}  # the figures now shown, to map clicks back to frames
        plots_box = w.VBox([self.jump, self.stream_img, self.branch_img]) if self.plots else w.VBox([])
        super().__init__(
            [
                w.HBox([self.conn, self.vbucket, self.stream, self.opcode, self.direction]),
                w.HBox([self.key, self.problems]),
                w.HBox([self.prev_btn, self.next_btn, self.status]),
                w.HTML(_LIST_CSS, layout=w.Layout(display="none")),
                self.frames,
                w.HBox([self.annotation, plots_box]),
            ]
        )
        self.add_class("dcpinspect-explorer")
        for name in ("conn", "vbucket", "stream", "opcode", "direction", "key", "problems"):
            getattr(self, name).observe(self._on_filter, names="value")
        self.prev_btn.on_click(lambda _b: model.previous_page())
        self.next_btn.on_click(lambda _b: model.next_page())
        self.frames.observe(self._on_select, names="value")
        self.jump.observe(self._on_jump, names="value")
        self.stream_img.observe(lambda c: self._on_click("stream", c["new"]), names="click")
        self.branch_img.observe(lambda c: self._on_click("branch", c["new"]), names="click")
        model.on_change(self.refresh)
        self.refresh("rows")

    # --- widget -> model -------------------------------------------------------
    def _on_filter(self, _change: Any) -> None:
        if self._syncing:
            return
        self.model.set_filters(
            conn=self.conn.value,
            vbucket=self.vbucket.value,
            stream=self.stream.value,
            opcode=self.opcode.value,
            direction=self.direction.value,
            key=self.key.value or "",
            problems=bool(self.problems.value),
        )

    def _on_select(self, change: Any) -> None:
        if not self._syncing and change["new"] is not None:
            self.model.select(int(change["new"]))

    def _on_click(self, which: str, click: list[float]) -> None:
        """A click on a plot: select the frame of the point under it (nothing when it hit none)."""
        fig = self._figs.get(which)
        if fig is None or len(click) < 2:
            return
        frame = frame_at_pixel(fig, float(click[0]), float(click[1]), dpi=PNG_DPI)
        if frame is not None and self.model.store.row_of(frame) is not None:
            self.model.select(frame)

    def _on_jump(self, change: Any) -> None:
        if not self._syncing and change["new"] is not None:
            self.model.select(int(change["new"]))

    # --- model -> widget -------------------------------------------------------
    def refresh(self, what: str = "rows") -> None:
        """Mirror the model (called by the model on every change)."""
        m = self.model
        self._syncing = True
        try:
            if what == "rows":
                self._options()
            if what in ("rows", "filters", "page"):
                rows = m.page_rows()
                self.frames.options = [(_label(r), r["frame"]) for r in rows]
                self.frames.value = m.selected if any(r["frame"] == m.selected for r in rows) else None
            if what == "selection":
                self.annotation.value = m.annotation_html()
                if any(v == m.selected for _l, v in self.frames.options):
                    self.frames.value = m.selected
            self.status.value = html.escape(m.summary()) + (f" <b>{html.escape(m.error)}</b>" if m.error else "")
            self.prev_btn.disabled = m.page == 0
            self.next_btn.disabled = m.page >= m.pages - 1
            for d in (self.conn, self.vbucket, self.stream, self.opcode, self.direction):
                _show_any(d)
        finally:
            self._syncing = False
        if self.plots and what in ("selection", "rows"):
            self._draw()

    def _options(self) -> None:
        m = self.model
        self.conn.options = [_ANY] + [(f"conn {c}", c) for c in m.choices("conn_id")]
        self.vbucket.options = [_ANY] + [(str(v), v) for v in m.choices("vbucket", 1024)]
        self.opcode.options = [_ANY] + [(n, n) for n in m.choices("name")]
        self.stream.options = [_ANY] + [(label, i) for i, label in m.streams()]
        f = m.filters
        for name, value in (("conn", f.conn), ("vbucket", f.vbucket), ("opcode", f.opcode), ("stream", f.stream)):
            widget = getattr(self, name)
            widget.value = value if any(v == value for _l, v in widget.options) else None

    def _draw(self) -> None:
        m = self.model
        t = m.timeline
        if t is None:
            return
        i = m.stream_of(m.selected) if m.selected is not None else m.filters.stream
        key = (i, id(t))
        if key == self._plot_key:
            return
        self._plot_key = key
        fig = m.stream_figure(theme=self.theme)
        if fig is not None:
            self._figs["stream"] = fig
            _set_png(self.stream_img, figure_png(fig, PNG_DPI))
        bfig = m.branch_figure(theme=self.theme)
        self._figs["branch"] = bfig
        _set_png(self.branch_img, figure_png(bfig, PNG_DPI) if bfig is not None else b"")
        self._syncing = True
        try:
            self.jump.options = [_ANY] + (_key_frames(t.streams[i], t) if i is not None else [])
            self.jump.value = None
            _show_any(self.jump)
        finally:
            self._syncing = False


def _key_frames(s: Any, t: Any) -> list[tuple[str, int]]:
    """The frames worth jumping to in a stream: requests, answers, snapshots (first 100), end, anomalies."""
    out: list[tuple[str, int]] = []
    for a in s.attempts:
        out.append((f"frame {a.frame}: stream request from {a.start}", a.frame))
        if a.response_frame is not None:
            what = f"rollback to {a.rollback_seqno}" if a.outcome == "rollback" else (a.status_name or a.outcome or "")
            out.append((f"frame {a.response_frame}: {what}", a.response_frame))
    for sn in s.snapshots[:100]:
        out.append((f"frame {sn.frame}: snapshot {sn.start}-{sn.end}", sn.frame))
    if s.end is not None:
        out.append((f"frame {s.end['frame']}: stream end {s.end.get('name')}", s.end["frame"]))
    for an in s.anomalies[:50]:
        if an.frames:
            out.append((f"frame {an.frames[-1]}: {an.kind}", an.frames[-1]))
    seen: set[int] = set()
    return [(label, f) for label, f in sorted(out, key=lambda x: x[1]) if not (f in seen or seen.add(f))]  # type: ignore[func-returns-value]


class StepperView(_Static, w.VBox):
    """The teaching view over a :class:`~dcpinspect.explorer.StepperModel`: play/next/previous/speed."""

    def __init__(self, model: StepperModel) -> None:
        self.model = model
        last = max(0, len(model) - 1)
        self.play = w.Play(min=0, max=last, step=1, interval=int(1000 / max(model.speed, 0.1)), description="play")
        self.slider = w.IntSlider(min=0, max=last, description="frame", continuous_update=False, layout=w.Layout(width="420px"))
        w.jslink((self.play, "value"), (self.slider, "value"))
        self.prev_btn = w.Button(description="◀ previous", layout=w.Layout(width="110px"))
        self.next_btn = w.Button(description="next ▶", layout=w.Layout(width="110px"))
        self.speed = w.FloatLogSlider(value=model.speed, base=2, min=-2, max=5, description="frames/s", readout_format=".2g")
        self.header = w.HTML()
        self.annotation = w.HTML()
        self.changes = w.HTML()
        super().__init__(
            [
                w.HBox([self.play, self.slider, self.prev_btn, self.next_btn, self.speed]),
                self.header,
                w.HBox([self.annotation, self.changes]),
            ]
        )
        self.add_class("dcpinspect-stepper")
        self.slider.observe(lambda ch: model.goto(int(ch["new"])), names="value")
        self.play.observe(lambda ch: model.goto(int(ch["new"])), names="value")
        self.speed.observe(self._on_speed, names="value")
        self.prev_btn.on_click(lambda _b: model.previous())
        self.next_btn.on_click(lambda _b: model.next())
        model.on_change(self.refresh)
        self.refresh()

    def _on_speed(self, change: Any) -> None:
        self.model.speed = float(change["new"])
        self.play.interval = int(1000 / max(self.model.speed, 0.1))

    def refresh(self, _what: str = "position") -> None:
        """Mirror the model's position."""
        m = self.model
        st = m.current
        if self.slider.value != m.position:
            self.slider.value = m.position
        if st is None:
            self.header.value = "(no frames)"
            return
        self.header.value = html.escape(f"step {st.index + 1}/{len(m)}: frame {st.frame} ({st.record.direction}, conn {st.record.conn})")
        self.annotation.value = st.annotation_html()
        self.changes.value = m.changes_html()


def _is_live(source: Any) -> bool:
    return source is None or hasattr(source, "on_record") or (hasattr(source, "capture") and hasattr(source, "upstream"))


def explore(
    source: Any = None, *, background: bool | None = None, page_size: int = 50, theme: str = "light", plots: bool = True
) -> ExplorerView:
    """The explorer over a capture path, a list of paths, a frames DataFrame/Arrow table, records, or a live session.

    A live session is a :class:`~dcpinspect.live.LiveCapture`, a
    :class:`~dcpinspect.proxy.TapProxy` or a :class:`~dcpinspect.client.DcpClient`
    (its record callback is chained), or ``None``: pass the view's
    ``model.on_record`` as the ``on_record`` of whatever produces records.
    ``background`` (default: captures over 32 MiB) reads the capture in a
    thread; the first page shows as soon as the first chunk is read.
    """
    if _is_live(source):
        model = ExplorerModel.live(source, page_size=page_size)
    else:
        if background is None:
            paths = [source] if isinstance(source, (str, Path)) else (source if isinstance(source, (list, tuple)) else [])
            background = sum(Path(p).stat().st_size for p in paths if isinstance(p, (str, Path)) and Path(p).is_file()) > BIG
        model = ExplorerModel.open(source, background=background, page_size=page_size)
    return ExplorerView(model, theme=theme, plots=plots)


def stepper(source: Any, *, speed: float = 2.0) -> StepperView:
    """The teaching mode over capture path(s), records, or a LiveCapture that kept its records."""
    return StepperView(StepperModel.open(source, speed=speed))
