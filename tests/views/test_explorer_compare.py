"""The explorer's compare panel: two consumers of the loaded capture compared at the model, and its widget without a front end.

Known answers: ``live-collections.pcap`` (conn 1 filtered on collection 0x8,
conn 2 took every collection), ``live-failover-branches.pcap`` (conn 1
streamed both vbuckets through the failover, conn 2 only vbucket 1 before
it), and a two-connection capture with HTML in a key.  The model's answer
(items rebuilt from the store, four columns of the frames table) must be
:func:`~dcpinspect.tables.compare.compare`'s on the capture.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from pathlib import Path

import pandas as pd
import pytest
from paths import CAPTURES

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.tables.compare import Comparison, compare
from dcpinspect.views import explorer
from dcpinspect.views.explorer import ExplorerModel
from dcpinspect.views.panels import PANELS, compare_frames_table, first_evidence, item_table
from dcpinspect.views.widgets import explore

COLLECTIONS = str(CAPTURES / "live-collections.pcap")
BRANCHES = str(CAPTURES / "live-failover-branches.pcap")
EVIL = "<script>alert(1)</script>"
ORDER = ["side", "vbucket", "seqno", "frame"]


def same(mine: Comparison, theirs: Comparison) -> None:
    """The model's comparison is the pure function's on the full read: table, counts, story and the plotted items."""
    pd.testing.assert_frame_equal(mine.table, theirs.table)
    pd.testing.assert_frame_equal(mine.per_vbucket, theirs.per_vbucket)
    assert mine.story == theirs.story
    assert mine.items is not None and theirs.items is not None
    pd.testing.assert_frame_equal(
        mine.items.sort_values(ORDER).reset_index(drop=True), theirs.items.sort_values(ORDER).reset_index(drop=True), check_dtype=False
    )


def test_the_consumers_listed_are_the_open_names_then_the_connections() -> None:
    m = ExplorerModel.open(COLLECTIONS)
    assert [v for _label, v in m.consumers()] == ["live-collections-filtered", "live-collections-all", 1, 2]
    b = ExplorerModel.open(BRANCHES)
    assert [v for _label, v in b.consumers()] == ["live-failover-branches", 1, 2, 3]  # one name, three connections


def test_a_collections_filter_explains_what_the_filtered_consumer_lacks() -> None:
    m = ExplorerModel.open(COLLECTIONS)
    m.set_compare("live-collections-filtered", "live-collections-all")
    c = m.comparison()
    same(c, compare(COLLECTIONS, consumer_a="live-collections-filtered", consumer_b="live-collections-all"))
    only_b = c.table[c.table["only_in"] == "b"]
    assert set(only_b["reason"]) == {"filter"} and len(only_b) == 6
    first = only_b.iloc[0]
    assert (int(first["vbucket"]), int(first["seqno_from"]), int(first["seqno_to"])) == (0, 1, 3)
    assert list(first["keys"]) == ["doc-0001", "doc-0003", "doc-0004"]
    assert "collections 0x8" in first["explanation"] and "collection 0x0 filtered out" in first["explanation"]
    assert first_evidence(first.to_dict()) == 75  # b's first item of the run
    assert list(c.per_vbucket["items_a"]) == [6, 6] and list(c.per_vbucket["items_b"]) == [9, 9]


def test_connections_compare_as_the_names_do_and_the_default_pair_is_the_two_names() -> None:
    m = ExplorerModel.open(COLLECTIONS)
    assert m.compare_pair() == ("live-collections-filtered", "live-collections-all", None)  # nothing picked: the two names
    by_name = m.comparison()
    m.set_compare(1, 2)
    by_conn = m.comparison()
    same(by_conn, compare(COLLECTIONS, conn_a=1, conn_b=2))
    pd.testing.assert_frame_equal(by_name.table, by_conn.table)
    m.set_compare(1, 2, vbucket=1)
    one = m.comparison()
    assert set(one.table["vbucket"]) == {1}
    same(one, compare(COLLECTIONS, conn_a=1, conn_b=2, vbucket=1))


def test_two_connections_of_one_name_across_a_failover() -> None:
    m = ExplorerModel.open(BRANCHES)
    assert m.compare_pair() is None and m.comparison() is None  # one DCP_OPEN name: no default pair
    m.open_panel("compare")
    assert "pick two consumers" in m.panel_html("compare")
    m.set_compare(1, 2)
    c = m.comparison()
    same(c, compare(BRANCHES, conn_a=1, conn_b=2))
    rows = [(int(r["vbucket"]), r["only_in"], int(r["seqno_from"]), int(r["seqno_to"]), r["reason"]) for _i, r in c.table.iterrows()]
    assert rows == [(0, "a", 1, 15, "start"), (1, "a", 9, 20, "ended"), (1, "b", 1, 8, "start")]
    assert int(c.per_vbucket.loc[c.per_vbucket["vbucket"] == 1, "diverge_at"].iloc[0]) == 8
    assert "histories diverge at seqno 8" in m.panel_html("compare")


def test_a_name_that_names_nobody_is_said_not_raised_in_the_panel() -> None:
    m = ExplorerModel.open(COLLECTIONS)
    m.set_compare("nobody", 2)
    with pytest.raises(ValueError, match="no consumer named 'nobody'"):
        m.comparison()
    assert "no consumer named" in m.panel_html("compare")


@pytest.mark.parametrize(
    ("path", "a", "b"),
    [(COLLECTIONS, 1, 2), (BRANCHES, 1, 2), (BRANCHES, 2, 3), (str(CAPTURES / "live-purge-rollback.pcap"), 1, 2)],
)
def test_a_thinned_timeline_gives_the_full_reads_answer(monkeypatch: pytest.MonkeyPatch, path: str, a: int, b: int) -> None:
    """The explorer's timeline keeps a sample of each stream's items; the comparison rebuilds every one from the store."""
    monkeypatch.setattr(explorer, "MAX_ITEMS", 2)
    m = ExplorerModel.open(path)
    t = m.timeline
    assert t is not None and any(len(s.items) < m.items_seen()[i] for i, s in enumerate(t.streams))  # really thinned
    m.set_compare(a, b)
    same(m.comparison(), compare(path, conn_a=a, conn_b=b))


def test_the_frames_read_are_the_items_rows_and_each_connections_last() -> None:
    m = ExplorerModel.open(COLLECTIONS)
    t = m.timeline
    assert t is not None
    items = item_table(m, range(len(t.streams)))
    frames = compare_frames_table(m, items["frame"].to_numpy(), [1, 2])
    assert list(frames.columns) == ["frame", "conn_id", "key", "cid"]
    assert len(frames) <= len(items) + 2 < m.store.rows
    last = m.store.compact.to_pandas().groupby("conn_id")["frame"].max()
    assert {int(last[1]), int(last[2])} <= set(frames["frame"].astype(int))


def test_the_plot_and_a_click_on_a_difference() -> None:
    from dcpinspect.views.explorer import PNG_DPI

    m = ExplorerModel.open(BRANCHES)
    m.set_compare(1, 2)
    fig = m.compare_figure()
    assert fig.axes[0].get_title() == "consumers compared"
    shown = m.compare_shown()
    assert shown.png("compare").startswith(b"\x89PNG")
    band = next(a for a in shown.figures["compare"].axes[0].collections if str(a.get_gid()) == "diff:2")  # only in b: seqnos 1-8
    fig = shown.figures["compare"]
    fig.canvas.draw()
    ax = fig.axes[0]
    x0, y0, x1, y1 = band.get_datalim(ax.transData).extents
    px, py = ax.transData.transform(((x0 + x1) / 2, (y0 + y1) / 2))
    height = fig.get_size_inches()[1] * PNG_DPI
    frame = m.select_compare_click(float(px), float(height - py))
    assert frame in {57, 58, 59, 60, 61, 62, 63, 64} and m.selected == frame
    assert m.select_difference(0) == int(m.comparison().table.iloc[0]["evidence_a"][0]) == m.selected


def test_the_widget_computes_only_while_open_and_a_row_selects_its_evidence() -> None:
    v = explore(COLLECTIONS)
    m = v.model
    assert "compare" in PANELS
    assert not any(k[0] == "compare" for k in m._answers)  # folded: nothing computed
    v.panel_box.selected_index = PANELS.index("compare")
    assert m.panels == {"compare"}
    assert [o[1] for o in v.compare_a.options] == [None, "live-collections-filtered", "live-collections-all", 1, 2]
    assert (v.compare_a.value, v.compare_b.value) == ("live-collections-filtered", "live-collections-all")  # the default pair
    assert "collection 0x0 filtered out" in v.compare_story.value
    assert len(v.compare_list.options) == 8 and v.compare_img.value.startswith(b"\x89PNG")
    label, k = v.compare_list.options[1]
    assert "only in b" in label and "filter" in label
    v.compare_list.value = k
    assert m.selected == 75
    v.compare_b.value = 1  # a filtered consumer against itself: nothing differs
    assert m.compare_query == ("live-collections-filtered", 1, None) and v.compare_list.options == ()
    bundle = v._repr_mimebundle_()
    assert "dcpinspect-compare-story" in bundle["text/html"]
    v.panel_box.selected_index = None
    assert m.panels == frozenset()


@pytest.fixture(scope="module")
def evil_pair(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two connections of one vbucket: conn 1 from seqno 0 (seqno 1's key is :data:`EVIL`), conn 2 from seqno 1."""
    path = tmp_path_factory.mktemp("evil-compare") / "evil-pair.pcap"
    ts = 1_000_000
    with PcapWriter(path) as w:
        for port, start in ((40000, 0), (40001, 1)):
            conv = TcpConversation(w, ("10.0.0.1", port), ("10.0.0.2", 11210))
            conv.open(ts)
            ts += 10_000
            extras = {"start_seqno": start, "end_seqno": 2**64 - 1, "snap_start_seqno": start, "snap_end_seqno": start}
            ts = conv.send("c2s", encode("DCP_STREAM_REQ", opaque=1, vbucket=0, extras=extras), ts)
            ts = conv.send("s2c", encode("DCP_STREAM_REQ", opaque=1, status=0), ts)
            marker = encode("DCP_SNAPSHOT_MARKER", opaque=1, vbucket=0, extras={"start_seqno": start + 1, "end_seqno": 2, "flags": 1})
            ts = conv.send("s2c", marker, ts)
            for seqno, key in ((1, EVIL), (2, "plain")):
                if seqno > start:
                    mut = encode("DCP_MUTATION", opaque=1, vbucket=0, extras={"by_seqno": seqno, "rev_seqno": 1}, key=key, value=b"v")
                    ts = conv.send("s2c", mut, ts)
            conv.close(ts)
            ts += 10_000
    return str(Path(path))


def test_wire_text_is_escaped_everywhere_it_is_shown(evil_pair: str) -> None:
    m = ExplorerModel.open(evil_pair)
    m.set_compare(1, 2)
    c = m.comparison()
    same(c, compare(evil_pair, conn_a=1, conn_b=2))
    ((_i, row),) = list(c.table.iterrows())
    assert (row["only_in"], list(row["keys"]), row["reason"]) == ("a", [EVIL], "start")  # the known answer, unescaped in the table
    m.open_panel("compare")
    page = m.panel_html("compare") + m._repr_html_()
    assert EVIL not in page and "&lt;script&gt;" in page
    v = explore(evil_pair)
    v.model.set_compare(1, 2)
    v.panel_box.selected_index = PANELS.index("compare")
    assert EVIL not in v.compare_story.value and "&lt;script&gt;" in v.compare_story.value
