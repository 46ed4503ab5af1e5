"""Explorer and stepper: models without a browser, views with ipywidgets, escaping of wire text."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest

import dcpinspect
from dcpinspect import encode
from dcpinspect.explorer import ExplorerModel, StepperModel
from dcpinspect.live import LiveCapture
from dcpinspect.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.tables import frames_df

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
BRANCHES = str(CAPTURES / "live-failover-branches.pcap")
EVIL = "<script>alert(1)</script>"


def fresh(name: str = BRANCHES, **kw) -> ExplorerModel:
    return ExplorerModel.open(name, **kw)


# --- models ----------------------------------------------------------------------


def test_models_import_no_widgets() -> None:
    code = "import sys, dcpinspect.explorer; print('ipywidgets' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
    code = "import sys, dcpinspect; f = dcpinspect.explore; print('ipywidgets' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "True"


def test_filtering() -> None:
    m = fresh()
    assert m.total == m.store.rows == 66
    m.set_filters(vbucket=0, opcode="DCP_STREAM_REQ")
    assert [r["frame"] for r in m.page_rows()] == [19, 33, 46, 48]
    m.set_filters(direction="s2c")
    assert m.total == 0  # the requests travel c2s
    m.clear_filters()
    m.set_filters(stream=2)
    assert set(r["frame"] for r in m.page_rows()) == set(m.stream_frames(2).tolist())
    assert {46, 47, 48, 49, 66} <= {r["frame"] for r in m.page_rows()}
    m.clear_filters()
    m.set_filters(conn=1, direction="c2s")
    assert all(r["dir"] == "c2s" and r["conn_id"] == 1 for r in m.page_rows())


def test_key_search_and_problems() -> None:
    m = fresh(str(CAPTURES / "live-plain.pcap"))
    key = next(r["key"] for r in m.page_rows() if r["name"] == "DCP_MUTATION")
    m.set_filters(key=key.upper())
    assert m.total >= 1 and all(key.lower() in (r["key"] or "").lower() for r in m.page_rows())
    messy = fresh(str(CAPTURES / "messy.pcap"))
    messy.set_filters(problems=True)
    t = messy.timeline
    anomaly_frames = {f for a in t.anomalies for f in a.frames}
    rows = messy.page_rows()
    assert rows and all(r["problems"] or r["frame"] in anomaly_frames for r in rows)
    assert any(r["type"] == "gap" for r in rows)


def test_paging() -> None:
    m = fresh(page_size=10)
    assert m.pages == 7
    first = [r["frame"] for r in m.page_rows()]
    m.next_page()
    second = [r["frame"] for r in m.page_rows()]
    assert first == list(range(1, 11)) and second == list(range(11, 21))
    m.goto_page(99)
    assert m.page == 6 and len(m.page_rows()) == 6
    m.previous_page()
    assert m.page == 5
    m.set_filters(vbucket=0)
    assert m.page == 0  # a filter change goes back to the first page


def test_selection_annotation() -> None:
    m = fresh()
    seen: list[str] = []
    m.on_change(seen.append)
    m.select(47)  # the rollback response
    assert seen == ["selection"]
    page = m.annotation_html()
    assert "DCP_STREAM_REQ response" in page and "0x0023 (Rollback)" in page
    assert "0x000000000000000c" in page  # rollback to 12
    assert m.stream_of(47) == 2 and m.stream_of(19) == 0 and m.stream_of(1) is None
    with pytest.raises(KeyError):
        m.select(10_000)
    fig = m.stream_figure()
    assert [a.get_gid() for a in fig.axes[0].get_children() if (a.get_gid() or "").startswith("stream:")] == ["stream:2"]
    assert m.branch_figure() is not None


def test_dataframe_source_refetches_bytes() -> None:
    df = frames_df([BRANCHES])
    m = ExplorerModel.open(df)
    assert m.total == 66
    m.select(47)
    assert "0x0023 (Rollback)" in m.annotation_html()
    assert m.timeline is not None and len(m.timeline.streams) == 3


def test_pick_selects() -> None:
    from types import SimpleNamespace

    m = fresh()
    fig = m.stream_figure()
    rb = next(a for a in fig.axes[0].get_children() if a.get_gid() == "rollbacks")
    assert m.select_pick(SimpleNamespace(artist=rb, ind=[0])) == 47
    assert m.selected == 47


def test_background_load() -> None:
    m = ExplorerModel.open(BRANCHES, background=True)
    m.wait(30)
    assert not m.loading and m.store.rows == 66 and m.error is None


def test_static_fallbacks() -> None:
    m = fresh()
    m.select(19)
    page = m._repr_html_()
    assert "<table" in page and "DCP_STREAM_REQ" in page and "frame 19" in page
    assert "66 frames" in m.text()


# --- live -------------------------------------------------------------------------


def _live_session(cap: LiveCapture, items: int = 3) -> None:
    conn = cap.connection(("127.0.0.1", 50000), ("127.0.0.1", 11210), ts=1)
    conn.data("c2s", encode("DCP_STREAM_REQ", opaque=7, vbucket=5, extras={"start_seqno": 0, "end_seqno": 2**64 - 1}), ts=2)
    conn.data("s2c", encode("DCP_STREAM_REQ", opaque=7, status=0), ts=3)
    conn.data("s2c", encode("DCP_SNAPSHOT_MARKER", opaque=7, vbucket=5, extras={"start_seqno": 1, "end_seqno": items, "flags": 1}), ts=4)
    for i in range(items):
        conn.data(
            "s2c",
            encode("DCP_MUTATION", opaque=7, vbucket=5, extras={"by_seqno": i + 1, "rev_seqno": 1}, key=f"k{i}", value=b"v"),
            ts=5 + i,
        )


def test_live_append_thread_timer() -> None:
    m = ExplorerModel.live(interval=0.01)
    seen: list[str] = []
    m.on_change(seen.append)
    cap = LiveCapture(on_record=m.on_record)
    _live_session(cap)
    deadline = time.time() + 5
    while m.store.rows < 6 and time.time() < deadline:
        time.sleep(0.01)
    assert m.store.rows == 6 and "rows" in seen
    assert m.timeline.streams[0].last_seqno == 3
    m.select(6)
    assert "DCP_MUTATION" in m.annotation_html()


def test_live_attach_on_event_loop() -> None:
    async def run() -> ExplorerModel:
        cap = LiveCapture()
        m = ExplorerModel.live(cap, interval=0.01)
        _live_session(cap, items=5)
        assert m.store.rows == 0  # nothing folded in yet: the callback only queued
        await asyncio.sleep(0.1)
        return m

    m = asyncio.run(run())
    assert m.store.rows == 8
    m.set_filters(opcode="DCP_MUTATION")
    assert m.total == 5


# --- stepper ------------------------------------------------------------------------


def kinds(s: StepperModel) -> list[set[str]]:
    return [{c.kind for c in st.changes} for st in s.steps]


def test_stepper_rollback_story() -> None:
    s = StepperModel.open(str(CAPTURES / "live-rollback-retry.pcap"))
    assert len(s) == 38
    ks = kinds(s)
    order = [k for step in ks for k in sorted(step) if k in ("request", "rollback", "accepted", "snapshot", "item", "end")]
    first = {k: order.index(k) for k in reversed(order)}
    assert first["request"] < first["rollback"] < first["accepted"] < first["snapshot"] < first["item"] < first["end"]
    rb = next(st for st in s.steps if any(c.kind == "rollback" for c in st.changes))
    assert "rollback to seqno 0" in " ".join(c.text for c in rb.changes)
    retry = s.steps[rb.index + 1]
    assert any("retry" in c.text for c in retry.changes)
    accepted = next(st for st in s.steps if any(c.kind == "accepted" for c in st.changes))
    assert any(c.kind == "failover-log" for c in accepted.changes)
    assert accepted.state["last outcome"] == "success"


def test_stepper_flow_control_and_navigation() -> None:
    s = StepperModel.open(str(CAPTURES / "live-flow-control.pcap"), speed=100)
    all_kinds = set().union(*kinds(s))
    assert {"ack", "stall", "sent", "session"} <= all_kinds
    moves: list[str] = []
    s.on_change(moves.append)
    s.previous()
    assert s.position == 0 and not moves
    s.next()
    s.next()
    assert s.position == 2 and moves == ["position", "position"]
    s.goto(10_000)
    assert s.position == len(s) - 1
    s.next()
    assert s.position == len(s) - 1 and not s.playing
    s.goto(0)
    slept: list[float] = []
    steps = list(s.run(sleep=slept.append))
    assert len(steps) == len(s) and slept and slept[0] == pytest.approx(0.01)
    assert "step" in s.text() and "<ul>" in s._repr_html_()


# --- views -----------------------------------------------------------------------------


def test_explorer_view_reacts() -> None:
    from dcpinspect.widgets import ExplorerView

    m = fresh(page_size=20)
    v = ExplorerView(m)
    assert len(v.frames.options) == 20
    v.vbucket.value = 0
    v.opcode.value = "DCP_STREAM_REQ"
    assert m.filters.vbucket == 0 and [f for _l, f in v.frames.options] == [19, 33, 46, 48]
    v.frames.value = 46
    assert m.selected == 46 and "frame 46" in v.annotation.value
    assert v.stream_img.value[:4] == b"\x89PNG" and len(v.jump.options) > 3
    v.jump.value = 47
    assert m.selected == 47 and "Rollback" in v.annotation.value
    m.clear_filters()
    assert v.vbucket.value is None or m.filters.vbucket is None
    v.next_btn.click()
    assert m.page == 1 and v.frames.options[0][1] == 21
    bundle = v._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "<table" in bundle["text/html"]


def test_explore_entry_points() -> None:
    v = dcpinspect.explore(BRANCHES, plots=False)
    assert v.model.store.rows == 66
    v2 = dcpinspect.explore([BRANCHES])
    assert v2.model.total == 66
    v3 = dcpinspect.explore(frames_df([BRANCHES]))
    assert v3.model.total == 66
    cap = LiveCapture()
    v4 = dcpinspect.explore(cap)
    _live_session(cap)
    v4.model.flush()
    assert v4.model.store.rows == 6 and len(v4.frames.options) == 6


def test_stepper_view() -> None:
    v = dcpinspect.stepper(str(CAPTURES / "live-rollback-retry.pcap"))
    v.next_btn.click()
    assert v.model.position == 1 and v.slider.value == 1
    v.slider.value = 20
    assert v.model.position == 20 and "step 21/38" in v.header.value
    v.speed.value = 8
    assert v.play.interval == 125
    assert "text/html" in v._repr_mimebundle_()


def test_explorer_view_in_a_browser_front_end() -> None:
    """What tests/test_browser.py found: state the front end renders, not only the Python values."""
    from dcpinspect.widgets import ExplorerView

    v = ExplorerView(fresh(page_size=20))
    filters = (v.conn, v.vbucket, v.stream, v.opcode, v.direction, v.jump)
    # ipywidgets maps a None value to no index, which a browser shows as an empty dropdown
    assert all(d.value is None and d.index == 0 and d.label == "any" for d in filters)
    v.vbucket.value = 0
    v.opcode.value = "DCP_STREAM_REQ"
    v.frames.value = 46  # a new stream: the jump list is rebuilt
    assert v.jump.value is None and v.jump.index == 0
    v.vbucket.index = 0  # "any" picked in the browser
    assert v.model.filters.vbucket is None and v.vbucket.index == 0
    # a missing figure hides its image instead of an empty one (a broken-image icon)
    assert v.stream_img.layout.display is None and v.branch_img.layout.display is None
    v2 = ExplorerView(fresh(str(CAPTURES / "live-plain.pcap")), plots=False)
    assert v2.stream_img.layout.display == "none" and v2.branch_img.layout.display == "none"
    # the grid lines up only in a fixed-width font on unwrapped lines (JupyterLab's output CSS gives pre neither)
    v.frames.value = 47
    assert "font-family:var(--jp-code-font-family,monospace);white-space:pre;" in v.annotation.value


def test_missing_branch_figure_hides_its_image(evil_capture: str) -> None:
    from dcpinspect.widgets import ExplorerView

    v = ExplorerView(ExplorerModel.open(evil_capture))
    assert v.model.branch_figure() is None
    assert v.stream_img.layout.display is None and v.branch_img.layout.display == "none" and v.branch_img.value == b""


# --- escaping ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def evil_capture(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("evil") / "evil.pcap"
    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210))
        conv.open(1_000_000)
        ts = 2_000_000
        ts = conv.send("c2s", encode("DCP_STREAM_REQ", opaque=1, vbucket=0, extras={"start_seqno": 0, "end_seqno": 2**64 - 1}), ts)
        ts = conv.send("s2c", encode("DCP_STREAM_REQ", opaque=1, status=0), ts)
        ts = conv.send("s2c", encode("DCP_SNAPSHOT_MARKER", opaque=1, vbucket=0, extras={"start_seqno": 1, "end_seqno": 1, "flags": 1}), ts)
        mut = encode("DCP_MUTATION", opaque=1, vbucket=0, extras={"by_seqno": 1, "rev_seqno": 1}, key=EVIL, value=EVIL.encode())
        ts = conv.send("s2c", mut, ts)
        conv.close(ts)
    return str(path)


def test_wire_text_is_escaped(evil_capture: str) -> None:
    m = ExplorerModel.open(evil_capture)
    m.set_filters(key="script")
    assert m.total == 1
    frame = m.page_rows()[0]["frame"]
    m.select(frame)
    outputs = [m._repr_html_(), m.annotation_html(), m.page_html()]
    from dcpinspect.widgets import ExplorerView, StepperView

    v = ExplorerView(m)
    outputs += [v.annotation.value, v.status.value, v._repr_mimebundle_()["text/html"]]
    s = StepperModel.open(evil_capture)
    s.goto(next(st.index for st in s.steps if st.frame == frame))
    sv = StepperView(s)
    outputs += [s._repr_html_(), sv.annotation.value, sv.changes.value, sv.header.value]
    assert all(EVIL not in out and "<script" not in out for out in outputs)
    assert any("&lt;script&gt;" in out for out in outputs)
    assert EVIL in m.text()  # plain text keeps it as text


def test_a_click_on_a_plot_selects_its_frame() -> None:
    """The browser sends the click's pixel on the PNG (FigureImage.click); the view hit-tests the figure shown."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from dcpinspect import plots
    from dcpinspect.widgets import PNG_DPI, ExplorerView

    v = ExplorerView(fresh(page_size=20))
    v.model.select(46)
    fig = v._figs["stream"]
    req = next(a for a in fig.findobj(lambda a: a.get_gid() == "rollbacks"))
    fig.set_dpi(PNG_DPI)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ((x, y),) = req.get_offset_transform().transform(req.get_offsets())
    target = int(plots.frames_of(req)[0])
    assert target != 46
    v.stream_img.click = [float(x), float(canvas.get_width_height()[1] - y), 1]
    assert v.model.selected == target and f"frame {target}" in v.annotation.value
    v.stream_img.click = [1.0, 1.0, 2]  # on nothing: the selection stays
    assert v.model.selected == target


def test_explore_and_step_a_capture_with_times_out_of_range(tmp_path: Path) -> None:
    """A packet time past 2262 (one flipped bit) crashed the explorer's columnar load; now the time is null and all is shown."""
    from pcapfactory import write_hostile_headers

    from dcpinspect.widgets import ExplorerView

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
