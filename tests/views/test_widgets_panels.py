"""The explorer widget's question panels without a front end: folded until opened, each a thin mirror of the model."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from paths import CAPTURES

from dcpinspect.views.panels import PANELS
from dcpinspect.views.widgets import ExplorerView, explore, history_label

BRANCHES = str(CAPTURES / "live-failover-branches.pcap")
EVIL = "<script>alert(1)</script>"  # as the views conftest writes it into evil_capture


def test_the_panels_are_folded_and_compute_nothing_until_opened(failover) -> None:
    v = explore(BRANCHES)
    m = v.model
    assert isinstance(v, ExplorerView) and v.panel_box in v.children
    assert v.panel_box.selected_index is None and m.panels == frozenset()
    m.select(failover.rollback)
    assert not any(k[0] in ("key", "losses", "lag") for k in m._answers)  # folded: no answer computed
    for k, name in enumerate(PANELS):
        v.panel_box.selected_index = k
        assert m.panels == {name}  # one open at a time, in the model
    v.panel_box.selected_index = None
    assert m.panels == frozenset()


def test_the_key_panel_lists_versions_and_selects_their_frame(failover) -> None:
    v = explore(BRANCHES)
    m = v.model
    v.panel_box.selected_index = PANELS.index("key")
    v.key_text.value = "before-loss-004"
    assert m.key_query == ("before-loss-004", None)
    assert "1 version" in v.key_msg.value
    ((label, frame),) = v.key_list.options
    assert "rolled back" in label and f"frame {failover.rollback}" in label and "seqno 13" in label
    v.key_list.value = frame
    assert m.selected == frame
    v.collection_text.value = "0x8"
    assert m.key_query == ("before-loss-004", 8) and v.key_list.options == () and "never seen" in v.key_msg.value
    v.collection_text.value = "zz"
    assert "not a collection id" in v.key_msg.value and m.key_query == ("before-loss-004", 8)


def test_the_rollback_and_lag_panels_follow_the_selection(failover) -> None:
    v = explore(BRANCHES)
    m = v.model
    v.panel_box.selected_index = PANELS.index("rollback")
    assert "select a frame" in v.rollback_html.value
    m.select(failover.rollback)
    assert "before-loss-004" in v.rollback_html.value
    assert any(k[0] == "losses" for k in m._answers)
    v.panel_box.selected_index = PANELS.index("lag")
    assert "live-failover-branches" in v.lag_html.value
    assert v.lag_img.value.startswith(b"\x89PNG") and v.lag_img.alt.startswith("consumer lag: vbucket 0")
    bundle = v._repr_mimebundle_()
    assert "consumer lag, worst first" in bundle["text/html"]


def test_a_click_on_the_lag_plot_selects_its_frame(failover) -> None:
    from dcpinspect.views.explorer import PNG_DPI

    v = explore(BRANCHES)
    m = v.model
    m.select(failover.rollback)
    v.panel_box.selected_index = PANELS.index("lag")
    fig = m.lag_shown().figures["lag"]
    line = next(a for a in fig.axes[0].get_lines() if str(a.get_gid()).startswith("consumer:"))
    x, y = line.get_xdata()[-1], line.get_ydata()[-1]
    fig.canvas.draw()
    px, py = fig.axes[0].transData.transform((x, y))
    height = fig.get_size_inches()[1] * PNG_DPI
    v.lag_img.click = [float(px), float(height - py), 1]
    assert m.selected is not None and m.selected != failover.rollback


def test_the_key_panel_escapes_wire_text(evil_capture: str) -> None:
    v = explore(evil_capture)
    v.panel_box.selected_index = PANELS.index("key")
    v.key_text.value = EVIL
    assert EVIL not in v.key_msg.value and "&lt;script&gt;" in v.key_msg.value
    ((label, _frame),) = v.key_list.options
    assert "current" in label
    assert EVIL not in v._repr_mimebundle_()["text/html"]


def test_history_label_makes_control_characters_safe() -> None:
    row = {"frame": 1, "conn": 1, "vbucket": 0, "name": "DCP_MUTATION", "seqno": 1, "fate": "current\x1b[31m", "fate_frame": None}
    assert "\x1b" not in history_label(row)
