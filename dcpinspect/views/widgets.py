"""Notebook widgets (ipywidgets 8): thin views over the models of :mod:`dcpinspect.views.explorer` and :mod:`dcpinspect.views.stepper`.

* :func:`explore` - the explorer: filters and a display-filter box (its
  error in one line beside it), a paged frame list and beside it the selected
  frame's annotation (grid and breakdown, the field under the pointer
  highlighted in both) in a pane of the list's height that scrolls (on a
  narrow page it wraps below the list), then, full width and so in the first
  screen however long the frame, a plot selector (every stream, or one; it follows
  the selected frame), the stream's timeline and its vbucket's branch tree -
  drawn as wide as the page shows them (:class:`FigureImage` reports its
  width), a click on a point of either selects its frame - and a "jump to"
  list of the stream's key frames (requests, rollbacks, snapshots, end,
  anomalies) that selects them; live sources update it as the session runs,
  and a background load updates the list a few times (the 1st, 2nd, 4th...
  chunk) and draws the pictures once, at its end.  Below, three folded
  question panels (one open at a time; a folded one costs nothing): a key's
  history (a key and an optional collection id; a version picked selects its
  frame), the shown stream's rollbacks and what they cost (the branch tree
  marks the lost segment while it is open), consumer lag (the worst
  first, and the plot of the shown stream's vbucket; a click selects a frame),
  and two consumers compared (two dropdowns of the capture's consumers, the
  story, the differences - one picked selects its first evidence frame - and
  the plot of both consumers' seqnos; a click on it selects a frame).
* :func:`stepper` - the teaching mode: play/next/previous/speed over a session,
  each frame's annotation and what it changed in the stream's state.

Every view also carries a static rendering (``text/html`` and ``text/plain``
in its mime bundle, from the model), so exported notebooks and terminals
without a widget front end still show the page, the annotation and the
changes.  All state lives in the models (the filters, the page, the
selection, the pictures shown and what a click on them hits); a view only
mirrors it and passes the user's actions on.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as w
import traitlets

from ..wire.render import plural, safe_text
from .explorer import ExplorerModel
from .labels import row_label
from .stepper import StepperModel

__all__ = ["PANE_HEIGHT", "ExplorerView", "FigureImage", "StepperView", "explore", "stepper"]

BIG = 32 << 20  # captures larger than this (bytes) are read in the background by default
_ANY = ("any", None)
_EVERY = ("every stream (the most interesting first)", None)
_PICK = ("(pick a consumer)", None)
_PANEL_TITLES = (
    "key history: every version of a key and its fate",
    "rollback cost: what the shown stream's rollbacks lost",
    "consumer lag",
    "compare consumers: why one has what the other has not",
)


def _show_any(d: w.Dropdown) -> None:
    """Show "any" for a dropdown whose value is ``None``.

    ipywidgets maps a ``None`` value to no index, so the browser would show an
    empty dropdown; index 0 is the ("any", None) option and keeps the value.
    """
    if d.value is None and d.options and d.index is None:
        d.index = 0


#: the height of the frame list and of the annotation's scrolling pane beside it (the pictures start below them)
PANE_HEIGHT = "380px"
_NO_SELECTION = '<i style="color:#666">select a frame: its bytes and fields show here</i>'

#: the frame list's labels are columns (frame number right-aligned, names, vbucket...): a fixed-width font lines them up
_LIST_CSS = "<style>.dcpinspect-explorer .widget-select select{font-family:var(--jp-code-font-family,monospace);white-space:pre}</style>"


class FigureImage(anywidget.AnyWidget):
    """A matplotlib figure as a PNG that reports clicks: ``click`` is ``[x, y, n]`` in image pixels (n counts clicks).

    The front end is a few lines of JavaScript (anywidget's ESM): an ``<img>``
    from the PNG bytes and a click listener that scales the pointer to the
    picture's own pixels, so the model can hit-test the figure it drew
    (:meth:`~dcpinspect.views.explorer.ExplorerModel.select_click`).
    """

    _esm = """
    function render({ model, el }) {
      const img = document.createElement("img");
      img.style.width = "100%";
      img.style.height = "auto";
      img.style.cursor = "crosshair";
      img.className = "dcpinspect-figure";
      el.style.width = "100%";
      const measure = () => {  // the picture is drawn as wide as its place, so its text is read at its own size
        const px = Math.round(el.clientWidth || 0);
        if (px > 0 && Math.abs(px - (model.get("width") || 0)) > 8) { model.set("width", px); model.save_changes(); }
      };
      if (typeof ResizeObserver !== "undefined") new ResizeObserver(measure).observe(el);
      setTimeout(measure, 0);
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
      const alt = () => { img.alt = model.get("alt") || ""; img.title = img.alt; };
      model.on("change:value", show);
      model.on("change:alt", alt);
      show();
      alt();
      el.appendChild(img);
    }
    export default { render };
    """
    value = traitlets.Bytes(b"").tag(sync=True)
    click: traitlets.List[float] = traitlets.List([]).tag(sync=True)
    width = traitlets.Int(0).tag(sync=True)  # the picture's place in the page, in CSS pixels (0: not known yet)
    alt = traitlets.Unicode("").tag(sync=True)  # the picture in words (its title; an empty plot's message)


def _set_png(img: FigureImage, png: bytes, alt: str = "") -> None:
    """Show a PNG, or hide the image when there is none (an empty image is a broken-image icon in a browser)."""
    img.alt = alt
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
    """The explorer widget over an :class:`~dcpinspect.views.explorer.ExplorerModel`."""

    def __init__(self, model: ExplorerModel, *, theme: str = "light", plots: bool = True) -> None:
        self.model = model
        self.theme = theme  # how it was asked to draw, not state
        self.plots = plots and model.builder is not None
        self._syncing = False  # set while mirroring the model: the widgets' echo is not the user's action
        small = w.Layout(width="150px")
        self.conn = w.Dropdown(description="conn", options=[_ANY], layout=small)
        self.vbucket = w.Dropdown(description="vbucket", options=[_ANY], layout=small)
        self.stream = w.Dropdown(description="stream", options=[_ANY], layout=w.Layout(width="220px"))
        self.opcode = w.Dropdown(description="opcode", options=[_ANY], layout=w.Layout(width="260px"))
        self.direction = w.Dropdown(description="dir", options=[_ANY, ("c2s", "c2s"), ("s2c", "s2c")], layout=small)
        self.key = w.Text(description="key", placeholder="text in the key", continuous_update=False, layout=w.Layout(width="220px"))
        self.problems = w.Checkbox(description="only problems/anomalies", indent=False)
        self.text = w.Text(
            description="filter",
            placeholder="display filter, e.g. vbucket == 3 and name contains 'MUTATION'",
            continuous_update=False,
            layout=w.Layout(width="60%"),
        )
        self.text.style.description_width = "55px"
        self.filter_msg = w.HTML()
        for d in (self.conn, self.vbucket, self.stream, self.opcode, self.direction):
            d.style.description_width = "55px"
        self.status = w.HTML()
        self.prev_btn = w.Button(description="◀ page", layout=w.Layout(width="90px"))
        self.next_btn = w.Button(description="page ▶", layout=w.Layout(width="90px"))
        # the list and the annotation side by side, each a fixed-height pane (the annotation scrolls in its own box), so the
        # pictures below them are in the first screen whatever the frame's size; on a narrow page the annotation wraps below
        self.frames = w.Select(
            options=[], rows=min(model.page_size, 18), layout=w.Layout(height=PANE_HEIGHT, flex="1 1 420px", min_width="300px")
        )
        self.annotation = w.HTML(_NO_SELECTION, layout=w.Layout(height=PANE_HEIGHT, overflow="auto", flex="1 1 600px", min_width="300px"))
        self.annotation.add_class("dcpinspect-annotation-pane")
        self.frames.add_class("dcpinspect-frame-list")
        self.jump = w.Dropdown(description="jump to", options=[_ANY], layout=w.Layout(width="45%"))
        self.show = w.Dropdown(description="plot", options=[_EVERY], layout=w.Layout(width="45%"))
        self.show.style.description_width = "55px"
        self.stream_img = FigureImage(layout=w.Layout(display="none", width="100%"))  # shown by _set_png once drawn
        self.branch_img = FigureImage(layout=w.Layout(display="none", width="100%"))
        full = w.Layout(width="100%")
        plots_box = w.VBox([w.HBox([self.show, self.jump], layout=full), self.stream_img, self.branch_img], layout=full)
        panes = w.HBox([self.frames, self.annotation], layout=w.Layout(width="100%", flex_flow="row wrap", align_items="flex-start"))
        self._build_panels()
        super().__init__(
            [
                w.HBox([self.conn, self.vbucket, self.stream, self.opcode, self.direction]),
                w.HBox([self.key, self.problems]),
                w.HBox([self.text, self.filter_msg]),
                w.HBox([self.prev_btn, self.next_btn, self.status]),
                w.HTML(_LIST_CSS, layout=w.Layout(display="none")),
                panes,
                *([plots_box] if self.plots else []),
                *([self.panel_box] if model.builder is not None else []),
            ],
            layout=full,
        )
        self.add_class("dcpinspect-explorer")
        for name in ("conn", "vbucket", "stream", "opcode", "direction", "key", "problems", "text"):
            getattr(self, name).observe(lambda change, name=name: self._on_filter(name, change["new"]), names="value")
        self.prev_btn.on_click(lambda _b: model.previous_page())
        self.next_btn.on_click(lambda _b: model.next_page())
        self.frames.observe(self._on_select, names="value")
        self.jump.observe(self._on_jump, names="value")
        self.show.observe(self._on_show, names="value")
        self.stream_img.observe(lambda c: self._on_click("stream", c["new"]), names="click")
        self.branch_img.observe(lambda c: self._on_click("branch", c["new"]), names="click")
        self.stream_img.observe(lambda _c: self._draw(), names="width")
        self.branch_img.observe(lambda _c: self._draw(), names="width")
        model.on_change(self.refresh)
        self.refresh("rows")

    def _build_panels(self) -> None:
        """The question panels (:mod:`dcpinspect.views.panels`), folded: the model computes a panel's answer only while it is open."""
        self.key_text = w.Text(
            description="key", placeholder="a document's key (exact)", continuous_update=False, layout=w.Layout(width="320px")
        )
        self.collection_text = w.Text(
            description="collection", placeholder="id, e.g. 0x8 (any)", continuous_update=False, layout=w.Layout(width="240px")
        )
        self.collection_text.style.description_width = "70px"
        self.key_msg = w.HTML()
        self.key_list = w.Select(options=[], rows=8, layout=w.Layout(width="100%"))
        self.key_list.add_class("dcpinspect-key-history")
        self.rollback_html = w.HTML()
        self.lag_html = w.HTML()
        self.lag_img = FigureImage(layout=w.Layout(display="none", width="100%"))
        self.compare_a = w.Dropdown(description="a", options=[_PICK], layout=w.Layout(width="45%"))
        self.compare_b = w.Dropdown(description="b", options=[_PICK], layout=w.Layout(width="45%"))
        self.compare_story = w.HTML()
        self.compare_list = w.Select(options=[], rows=8, layout=w.Layout(width="100%"))
        self.compare_list.add_class("dcpinspect-compare")
        self.compare_img = FigureImage(layout=w.Layout(display="none", width="100%"))
        boxes = [
            w.VBox([w.HBox([self.key_text, self.collection_text]), self.key_msg, self.key_list]),
            w.VBox([self.rollback_html]),
            w.VBox([self.lag_html, self.lag_img]),
            w.VBox([w.HBox([self.compare_a, self.compare_b]), self.compare_story, self.compare_list, self.compare_img]),
        ]
        self.panel_box = w.Accordion(children=boxes, titles=_PANEL_TITLES, selected_index=None, layout=w.Layout(width="100%"))
        self.panel_box.add_class("dcpinspect-panels")
        self.panel_box.observe(self._on_panel, names="selected_index")
        self.key_text.observe(lambda _c: self._on_key(), names="value")
        self.collection_text.observe(lambda _c: self._on_key(), names="value")
        self.key_list.observe(self._on_select, names="value")
        self.lag_img.observe(lambda c: self._on_lag_click(c["new"]), names="click")
        self.compare_a.observe(lambda _c: self._on_compare(), names="value")
        self.compare_b.observe(lambda _c: self._on_compare(), names="value")
        self.compare_list.observe(self._on_difference, names="value")
        self.compare_img.observe(lambda c: self._on_compare_click(c["new"]), names="click")

    # --- widget -> model -------------------------------------------------------
    def _on_panel(self, change: Any) -> None:
        """The user opened a panel (or folded them all): that one open in the model, the others closed."""
        if self._syncing:
            return
        from .panels import PANELS

        for k, name in enumerate(PANELS):
            if k != change["new"]:
                self.model.open_panel(name, False)
        if change["new"] is not None:
            self.model.open_panel(PANELS[change["new"]])

    def _on_key(self) -> None:
        """The user asked for a key (and maybe a collection id)."""
        if self._syncing:
            return
        from .panels import parse_collection

        try:
            collection = parse_collection(self.collection_text.value)
        except ValueError:
            self.key_msg.value = f'<span style="color:#D55E00">not a collection id: {html.escape(self.collection_text.value)}</span>'
            return
        self.model.set_key(self.key_text.value, collection)

    def _on_compare(self) -> None:
        """The user picked a consumer: both picked, that pair compared (one of them "any": the default pair)."""
        if not self._syncing:
            self.model.set_compare(self.compare_a.value, self.compare_b.value)

    def _on_difference(self, change: Any) -> None:
        """A difference picked: select its first evidence frame."""
        if not self._syncing and change["new"] is not None:
            self.model.select_difference(int(change["new"]))

    def _on_compare_click(self, click: list[float]) -> None:
        """A click on the comparison plot: select the frame of the band or tick under it."""
        if len(click) >= 2:
            self.model.select_compare_click(float(click[0]), float(click[1]))

    def _on_lag_click(self, click: list[float]) -> None:
        """A click on the lag plot: select the frame of the point under it (the lines carry their rows' frames)."""
        if len(click) >= 2:
            self.model.select_lag_click(float(click[0]), float(click[1]))

    def _on_filter(self, name: str, value: Any) -> None:
        """The user changed one filter: that one, and only that one, changes in the model."""
        if self._syncing:
            return
        if name in ("key", "text"):
            value = value or ""
        elif name == "problems":
            value = bool(value)
        self.model.set_filters(**{name: value})

    def _on_select(self, change: Any) -> None:
        if not self._syncing and change["new"] is not None:
            self.model.select(int(change["new"]))

    def _on_click(self, which: str, click: list[float]) -> None:
        """A click on a plot: select the frame of the point under it (nothing when it hit none)."""
        if len(click) >= 2:
            self.model.select_click(which, float(click[0]), float(click[1]))

    def _on_jump(self, change: Any) -> None:
        if not self._syncing and change["new"] is not None:
            self.model.select(int(change["new"]))

    def _on_show(self, change: Any) -> None:
        """The user picked a stream to plot (or every stream)."""
        if not self._syncing:
            self.model.show_stream(None if change["new"] is None else int(change["new"]))

    # --- model -> widget -------------------------------------------------------
    def refresh(self, what: str = "rows") -> None:
        """Mirror the model (called by the model on every change)."""
        m = self.model
        self._syncing = True
        try:
            if what == "rows":
                self._options()
            if what in ("rows", "filters"):
                self._mirror_filters()
            if what in ("rows", "filters", "page"):
                rows = m.page_rows()
                self.frames.options = [(row_label(r), r["frame"]) for r in rows]
                self.frames.value = m.selected if any(r["frame"] == m.selected for r in rows) else None
            if what == "selection":
                self.annotation.value = m.annotation_html() or _NO_SELECTION
                if any(v == m.selected for _l, v in self.frames.options):
                    self.frames.value = m.selected
            self.status.value = html.escape(m.summary()) + (f" <b>{html.escape(m.error)}</b>" if m.error else "")
            self.filter_msg.value = (
                f'<span class="dcpinspect-filter-error" style="color:#D55E00">{html.escape(m.filter_error)}</span>'
                if m.filter_error and m.filters.text
                else ""
            )
            if what in ("rows", "selection", "plot"):
                self._mirror_show()
            self.prev_btn.disabled = m.page == 0
            self.next_btn.disabled = m.page >= m.pages - 1
            for d in (self.conn, self.vbucket, self.stream, self.opcode, self.direction, self.show):
                _show_any(d)
        finally:
            self._syncing = False
        if self.plots and what in ("selection", "rows", "filters", "plot", "panels") and not (what == "rows" and m.loading):
            self._draw()  # a load's pictures are drawn once, at its end
        if what in ("rows", "selection", "plot", "panels", "key", "compare") and not m.loading and m.builder is not None:
            self._draw_panels(what)

    def _options(self) -> None:
        m = self.model
        self.conn.options = [_ANY] + [(f"conn {c}", c) for c in m.choices("conn_id")]
        self.vbucket.options = [_ANY] + [(str(v), v) for v in m.choices("vbucket", 1024)]
        self.opcode.options = [_ANY] + [(n, n) for n in m.choices("name")]
        streams = [] if m.loading else [(label, i) for i, label in m.streams()]  # the streams once the load is done
        self.stream.options = [_ANY, *streams]
        self.show.options = [_EVERY, *streams]

    def _mirror_filters(self) -> None:
        f = self.model.filters
        for name in ("conn", "vbucket", "opcode", "stream", "direction"):
            widget, value = getattr(self, name), getattr(f, name)
            widget.value = value if any(v == value for _l, v in widget.options) else None
        self.key.value = f.key
        self.problems.value = f.problems
        self.text.value = f.text

    def _mirror_show(self) -> None:
        i = self.model.shown_stream()
        self.show.value = i if any(v == i for _l, v in self.show.options) else None

    def _draw(self) -> None:
        """Show the model's pictures and jump list (the model draws them again only when the stream or the timeline changed)."""
        if not self.plots:
            return
        shown = self.model.shown(theme=self.theme)
        if shown is None:
            return
        _set_png(self.stream_img, shown.png("stream", self.stream_img.width or None), shown.describe("stream"))
        _set_png(self.branch_img, shown.png("branch", self.branch_img.width or None), shown.describe("branch"))
        jumps = (_ANY, *shown.jumps)
        self._syncing = True
        try:
            if tuple(self.jump.options) != jumps:  # another stream: its key frames, none picked
                self.jump.options = jumps
                self.jump.value = None
            _show_any(self.jump)
        finally:
            self._syncing = False

    def _draw_panels(self, what: str) -> None:
        """The open panel's answer (the model computes it now, once per timeline: a closed panel costs nothing)."""
        from .panels import PANELS

        m = self.model
        self._syncing = True
        try:
            self.panel_box.selected_index = next((k for k, n in enumerate(PANELS) if n in m.panels), None)
            if "key" in m.panels and what in ("rows", "panels", "key", "selection"):
                self._draw_key()
            if "rollback" in m.panels and what in ("rows", "panels", "selection", "plot"):
                self.rollback_html.value = m.panel_html("rollback")
            if "lag" in m.panels and what in ("rows", "panels", "selection", "plot"):
                self.lag_html.value = m.panel_html("lag")
                if self.plots:
                    shown = m.lag_shown(theme=self.theme)
                    _set_png(self.lag_img, shown.png("lag", self.lag_img.width or None), shown.describe("lag"))
            if "compare" in m.panels and what in ("rows", "panels", "compare"):
                self._draw_compare()
        finally:
            self._syncing = False

    def _draw_compare(self) -> None:
        """The compare panel: the consumers to pick, the story, the differences and the plot (computed now: the panel is open)."""
        m = self.model
        choices = [_PICK, *m.consumers()]
        for d in (self.compare_a, self.compare_b):
            if tuple(d.options) != tuple(choices):
                d.options = choices
        try:
            pair = m.compare_pair()
            c = m.comparison()
        except ValueError as exc:  # a selector naming nothing (a consumer of another capture)
            pair, c = None, None
            self.compare_story.value = f"<p>{html.escape(safe_text(str(exc), 300))}</p>"
        a, b = (pair[0], pair[1]) if pair is not None else (None, None)
        self.compare_a.value = a if any(v == a for _l, v in choices) else None
        self.compare_b.value = b if any(v == b for _l, v in choices) else None
        for d in (self.compare_a, self.compare_b):
            _show_any(d)
        if c is None:
            if pair is None:
                self.compare_story.value = "<i>pick two consumers: what each has that the other has not, and why, shows here</i>"
            self.compare_list.options = []
            _set_png(self.compare_img, b"")
            return
        from .panels import difference_label, story_html

        self.compare_story.value = story_html(c.story)
        self.compare_list.options = [(difference_label(r), k) for k, r in enumerate(c.table.to_dict("records"))]
        self.compare_list.value = None
        if self.plots:
            shown = m.compare_shown(theme=self.theme)
            _set_png(self.compare_img, shown.png("compare", self.compare_img.width or None), shown.describe("compare"))

    def _draw_key(self) -> None:
        m = self.model
        self.key_text.value, cid = m.key_query if m.key_query is not None else ("", None)
        self.collection_text.value = "" if cid is None else f"{cid:#x}"
        df = m.key_rows()
        if df is None:
            self.key_msg.value, self.key_list.options = "<i>type a key: every version of it and its fate show here</i>", []
            return
        what = html.escape(safe_text(m.key_query[0] if m.key_query else "", 200))
        self.key_msg.value = (
            f"<b>{what}</b>: {html.escape(df.attrs.get('absence', ''))}" if not len(df) else f"<b>{what}</b>: {plural(len(df), 'version')}"
        )
        self.key_list.options = [(history_label(r), int(r["frame"])) for r in df.to_dict("records")]
        self.key_list.value = m.selected if any(v == m.selected for _l, v in self.key_list.options) else None


def _cas_time(t: Any) -> str:
    """A CAS's HLC time in brackets (nothing when the CAS is no time)."""
    return "" if t is None or str(t) in ("NaT", "<NA>") else f" ({str(t)[:26]})"


def history_label(r: dict[str, Any]) -> str:
    """One version of a key's history as a line of the list (text off the wire made safe)."""
    import pandas as pd

    def v(x: Any) -> str:
        return "" if x is None or (not isinstance(x, str) and pd.isna(x)) else str(x)

    fate = v(r.get("fate")) + (f" (frame {v(r['fate_frame'])})" if v(r.get("fate_frame")) else "")
    text = (
        f"frame {v(r['frame']):>6}  {v(r.get('consumer'))} conn {v(r['conn'])} vb {v(r['vbucket'])}  {v(r['name'])}"
        f"  seqno {v(r['seqno'])}  cas {v(r.get('cas'))}{_cas_time(r.get('cas_time'))}  rev {v(r.get('rev_seqno'))}  {v(r.get('snap_type'))}  {fate}"
    )
    return safe_text(text, 300)


class StepperView(_Static, w.VBox):
    """The teaching view over a :class:`~dcpinspect.views.stepper.StepperModel`: play/next/previous/speed."""

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
        self.header.value = html.escape(m.header())
        self.annotation.value = st.annotation_html()
        self.changes.value = m.changes_html()


def _is_live(source: Any) -> bool:
    return source is None or hasattr(source, "on_record") or (hasattr(source, "capture") and hasattr(source, "upstream"))


def explore(
    source: Any = None, *, background: bool | None = None, page_size: int = 50, theme: str = "light", plots: bool = True
) -> ExplorerView:
    """The explorer over a capture path, a list of paths, a frames DataFrame/Arrow table, records, or a live session.

    A live session is a :class:`~dcpinspect.live.tap.LiveCapture`, a
    :class:`~dcpinspect.live.proxy.TapProxy` or a :class:`~dcpinspect.live.client.DcpClient`
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
