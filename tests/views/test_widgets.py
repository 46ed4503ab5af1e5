"""The widgets: thin views over the models (ipywidgets), escaping of wire text, what the browser front end renders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest
from paths import CAPTURES

import dcpinspect
from dcpinspect.capture.read import read_records
from dcpinspect.live.tap import LiveCapture
from dcpinspect.tables.export import frames_df
from dcpinspect.views.explorer import PNG_DPI, ExplorerModel
from dcpinspect.views.stepper import StepperModel

BRANCHES = str(CAPTURES / "live-failover-branches.pcap")
EVIL = "<script>alert(1)</script>"


def fresh(name: str = BRANCHES, **kw) -> ExplorerModel:
    return ExplorerModel.open(name, **kw)


def test_models_import_no_widgets() -> None:
    models = ", ".join(f"dcpinspect.views.{m}" for m in ("store", "background", "labels", "explorer", "stepper"))
    code = f"import sys, {models}; print('ipywidgets' in sys.modules, 'anywidget' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "False"]
    code = "import sys, dcpinspect; f = dcpinspect.explore; print('ipywidgets' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "True"


def test_explorer_view_reacts(failover) -> None:
    from dcpinspect.views.widgets import ExplorerView

    m = fresh(page_size=20)
    v = ExplorerView(m)
    assert len(v.frames.options) == 20
    v.vbucket.value = 0
    v.opcode.value = "DCP_STREAM_REQ"
    assert m.filters.vbucket == 0 and [f for _l, f in v.frames.options] == list(failover.vb0_requests)
    v.frames.value = failover.request
    assert m.selected == failover.request and f"frame {failover.request}" in v.annotation.value
    assert v.stream_img.value[:4] == b"\x89PNG" and len(v.jump.options) > 3
    v.jump.value = failover.rollback  # not in the filtered list: reached through the stream's key frames
    assert m.selected == failover.rollback and "Rollback" in v.annotation.value
    m.clear_filters()
    assert v.vbucket.value is None or m.filters.vbucket is None
    v.next_btn.click()
    assert m.page == 1 and v.frames.options[0][1] == 21
    bundle = v._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "<table" in bundle["text/html"]


def test_views_hold_no_state_of_their_own(failover) -> None:
    """Two views of one model show the same thing whichever is used: the state is the model's."""
    from dcpinspect.views.widgets import ExplorerView, StepperView

    m = fresh(page_size=20)
    a, b = ExplorerView(m), ExplorerView(m)
    a.vbucket.value = 0
    b.opcode.value = "DCP_STREAM_REQ"  # set in the other view
    a.frames.value = failover.request
    b.jump.value = failover.rollback
    for v in (a, b):
        assert v.vbucket.value == 0 and v.opcode.value == "DCP_STREAM_REQ" and v.model.selected == failover.rollback
        assert f"frame {failover.rollback}" in v.annotation.value
        assert [f for _l, f in v.frames.options] == [r["frame"] for r in m.page_rows()]
        assert v.stream_img.value == m.shown().png("stream") and v.branch_img.value == m.shown().png("branch")
        assert [f for _l, f in v.jump.options[1:]] == [f for _l, f in m.shown().jumps]
    import ipywidgets

    plain = set(vars(ipywidgets.VBox()))
    own = {k for k, val in vars(a).items() if k not in plain and not isinstance(val, ipywidgets.Widget)}
    assert own == {"model", "theme", "plots", "_syncing"}  # the model, how to draw, and the echo guard: nothing else
    s = StepperModel.open(str(CAPTURES / "live-rollback-retry.pcap"))
    sa, sb = StepperView(s), StepperView(s)
    sa.next_btn.click()
    sb.next_btn.click()
    assert s.position == 2 and sa.slider.value == sb.slider.value == 2 and sa.header.value == sb.header.value


def test_explore_entry_points(live_session, failover) -> None:
    v = dcpinspect.explore(BRANCHES, plots=False)
    assert v.model.store.rows == failover.frames
    v2 = dcpinspect.explore([BRANCHES])
    assert v2.model.total == failover.frames
    v3 = dcpinspect.explore(frames_df([BRANCHES]))
    assert v3.model.total == failover.frames
    cap = LiveCapture()
    v4 = dcpinspect.explore(cap)
    live_session(cap)
    v4.model.flush()
    assert v4.model.store.rows == 6 and len(v4.frames.options) == 6


def test_stepper_view() -> None:
    path = str(CAPTURES / "live-rollback-retry.pcap")
    v = dcpinspect.stepper(path)
    v.next_btn.click()
    assert v.model.position == 1 and v.slider.value == 1
    v.slider.value = 20
    frames = sum(1 for _ in read_records([path]))  # a step per frame
    assert v.model.position == 20 and f"step 21/{frames}" in v.header.value and frames > 21
    v.speed.value = 8
    assert v.play.interval == 125
    assert "text/html" in v._repr_mimebundle_()


def test_explorer_view_in_a_browser_front_end(failover) -> None:
    """What tests/views/test_browser.py found: state the front end renders, not only the Python values."""
    from dcpinspect.views.widgets import ExplorerView

    v = ExplorerView(fresh(page_size=20))
    filters = (v.conn, v.vbucket, v.stream, v.opcode, v.direction, v.jump)
    # ipywidgets maps a None value to no index, which a browser shows as an empty dropdown
    assert all(d.value is None and d.index == 0 and d.label == "any" for d in filters)
    v.vbucket.value = 0
    v.opcode.value = "DCP_STREAM_REQ"
    v.frames.value = failover.request  # a new stream: the jump list is rebuilt
    assert v.jump.value is None and v.jump.index == 0
    v.vbucket.index = 0  # "any" picked in the browser
    assert v.model.filters.vbucket is None and v.vbucket.index == 0
    # a missing figure hides its image instead of an empty one (a broken-image icon)
    assert v.stream_img.layout.display is None and v.branch_img.layout.display is None
    v2 = ExplorerView(fresh(str(CAPTURES / "live-plain.pcap")), plots=False)
    assert v2.stream_img.layout.display == "none" and v2.branch_img.layout.display == "none"
    # the grid lines up only in a fixed-width font on unwrapped lines (JupyterLab's output CSS gives pre neither)
    v.frames.value = failover.rollback
    assert "font-family:var(--jp-code-font-family,monospace);white-space:pre;" in v.annotation.value


def test_missing_branch_figure_hides_its_image(evil_capture: str) -> None:
    from dcpinspect.views.widgets import ExplorerView

    v = ExplorerView(ExplorerModel.open(evil_capture))
    assert v.model.branch_figure() is None
    assert v.stream_img.layout.display is None and v.branch_img.layout.display == "none" and v.branch_img.value == b""


# --- escaping ---------------------------------------------------------------------------


def test_wire_text_is_escaped(evil_capture: str) -> None:
    m = ExplorerModel.open(evil_capture)
    m.set_filters(key="script")
    assert m.total == 1
    frame = m.page_rows()[0]["frame"]
    m.select(frame)
    outputs = [m._repr_html_(), m.annotation_html(), m.page_html()]
    from dcpinspect.views.widgets import ExplorerView, StepperView

    v = ExplorerView(m)
    outputs += [v.annotation.value, v.status.value, v._repr_mimebundle_()["text/html"]]
    s = StepperModel.open(evil_capture)
    s.goto(next(st.index for st in s.steps if st.frame == frame))
    sv = StepperView(s)
    outputs += [s._repr_html_(), sv.annotation.value, sv.changes.value, sv.header.value]
    assert all(EVIL not in out and "<script" not in out for out in outputs)
    assert any("&lt;script&gt;" in out for out in outputs)
    assert EVIL in m.text()  # plain text keeps it as text


def test_a_click_on_a_plot_selects_its_frame(failover) -> None:
    """The browser sends the click's pixel on the PNG (FigureImage.click); the model hit-tests the figure it drew."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from dcpinspect.views import plots
    from dcpinspect.views.widgets import ExplorerView

    v = ExplorerView(fresh(page_size=20))
    v.model.select(failover.request)
    fig = v.model.shown().figures["stream"]
    req = next(a for a in fig.findobj(lambda a: a.get_gid() == "rollbacks"))
    fig.set_dpi(PNG_DPI)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ((x, y),) = req.get_offset_transform().transform(req.get_offsets())
    target = int(plots.frames_of(req)[0])
    assert target == failover.rollback != failover.request  # the rollback point is its answer's frame
    v.stream_img.click = [float(x), float(canvas.get_width_height()[1] - y), 1]
    assert v.model.selected == target and f"frame {target}" in v.annotation.value
    v.stream_img.click = [1.0, 1.0, 2]  # on nothing: the selection stays
    assert v.model.selected == target


def test_explore_and_step_a_capture_with_times_out_of_range(tmp_path: Path) -> None:
    """A packet time past 2262 (one flipped bit) crashed the explorer's columnar load; now the time is null and all is shown."""
    from pcapfactory import write_hostile_headers

    from dcpinspect.views.widgets import ExplorerView

    for name in ("pcapng_ts_out_of_range", "pcapng_bad_tsresol"):
        path = str(write_hostile_headers(tmp_path / name)[name])
        v = dcpinspect.explore(path)
        assert isinstance(v, ExplorerView) and v.model.total == 8
        v.frames.value = v.frames.options[-1][1]
        assert "frame" in v.annotation.value
        s = dcpinspect.stepper(path)
        assert len(s.model) == 8
        s.model.goto(len(s.model) - 1)
        assert s.model.current is not None and s.model.current.record.number == 8


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_theme_is_passed_to_the_model(theme: str, failover) -> None:
    from dcpinspect.views.widgets import ExplorerView

    v = ExplorerView(fresh(), theme=theme)
    v.model.select(failover.request)
    assert v.model.shown(theme=theme).key[-1] == theme and v.stream_img.value == v.model.shown(theme=theme).png("stream")


# --- full width, readable, a stream selector, the display filter (issue 16) -----------------


def test_the_pictures_are_full_width_and_drawn_at_the_width_the_browser_reports(failover) -> None:
    """Below the list and the annotation, as wide as the explorer; drawn again at the reported width, so 10 pt text is read at 10 pt."""
    import io

    from PIL import Image

    from dcpinspect.views.explorer import PNG_WIDTH
    from dcpinspect.views.widgets import PANE_HEIGHT, ExplorerView

    v = ExplorerView(fresh(page_size=20))
    assert v.layout.width == "100%" and v.stream_img.layout.width == "100%" and v.branch_img.layout.width == "100%"
    # the list and the annotation side by side in fixed-height panes (the annotation scrolls): the pictures follow in the first screen
    assert v.frames.layout.height == v.annotation.layout.height == PANE_HEIGHT and v.annotation.layout.overflow == "auto"
    panes = v.children.index(next(c for c in v.children if v.annotation in getattr(c, "children", ())))
    assert v.frames in v.children[panes].children and v.children[panes + 1].children[1] is v.stream_img
    assert "select a frame" in v.annotation.value
    v.model.select(failover.request)
    assert Image.open(io.BytesIO(v.stream_img.value)).size[0] == PNG_WIDTH  # until the browser says how wide it is
    v.stream_img.width = 1500  # what FigureImage's ResizeObserver reports
    assert Image.open(io.BytesIO(v.stream_img.value)).size[0] == 1500
    v.branch_img.width = 900
    assert Image.open(io.BytesIO(v.branch_img.value)).size[0] == 900
    assert "failover branches" in v.branch_img.alt and "seqnos per stream" in v.stream_img.alt


def test_the_stream_selector(failover) -> None:
    from dcpinspect.views.widgets import ExplorerView

    v = ExplorerView(fresh(page_size=20))
    m = v.model
    assert v.show.value is None and v.show.index == 0 and v.show.label.startswith("every stream")
    assert [i for _l, i in v.show.options[1:]] == [i for i, _l in m.streams()]
    m.select(failover.request)
    story = m.stream_of(failover.request)
    assert v.show.value == story  # the selector follows the selected frame's stream
    other = next(i for i, _l in m.streams() if i != story)
    before = v.stream_img.value
    v.show.value = other
    assert m.shown_stream() == other and m.selected == failover.request and v.stream_img.value != before
    v.show.index = 0  # every stream
    assert m.plot_stream is None and m.shown().key[0] is None


def test_the_filter_box_applies_a_display_filter_and_shows_its_error(failover) -> None:
    from dcpinspect.views.widgets import ExplorerView

    v = ExplorerView(fresh(page_size=200))
    v.text.value = "name == 'DCP_STREAM_REQ' and dir == 'c2s'"
    assert [f for _l, f in v.frames.options] == list(failover.requests) and v.filter_msg.value == ""
    v.text.value = "vbucket =="
    assert "syntax error" in v.filter_msg.value and len(v.frames.options) == failover.frames  # nothing hidden
    v.text.value = "<b>x</b> == 1"
    assert "<b>" not in v.filter_msg.value  # the message is escaped
    v.text.value = ""
    assert v.filter_msg.value == "" and v.model.filters.text == ""


def test_a_background_load_redraws_the_view_a_few_times_not_once_per_chunk(manual) -> None:
    """The frame list follows the load after the 1st, 2nd, 4th... chunk (O(log n)); the pictures are drawn once, at the end."""
    from dcpinspect.views.widgets import ExplorerView

    m = ExplorerModel(runner=manual, page_size=5)
    v = ExplorerView(m)
    drawn: list[int] = []
    real = m.shown

    def spy(**kw):
        drawn.append(m.store.rows)
        return real(**kw)

    m.shown = spy  # type: ignore[method-assign]
    pages: list[int] = []
    v.frames.observe(lambda _c: pages.append(m.store.rows), names="options")
    m.load([BRANCHES], background=True, rows=4)
    manual.run_jobs()
    assert m.chunks > 30 and 1 < len(set(pages)) <= m.chunks.bit_length() + 1
    assert drawn == [m.store.rows] and v.stream_img.value[:4] == b"\x89PNG"
    assert [i for _l, i in v.stream.options[1:]] == [i for i, _l in m.streams()]  # the streams, once the load is done
