"""The explorer's question panels at the model: a key's history, what a rollback cost, consumer lag - known answers on shipped captures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from paths import CAPTURES

from dcpinspect import encode
from dcpinspect.live.tap import LiveCapture
from dcpinspect.tables.history import COLUMNS, ITEM_KINDS, key_absence, key_versions, read_tables
from dcpinspect.tables.progress import consumer_lag
from dcpinspect.views.explorer import ExplorerModel
from dcpinspect.views.panels import html_table, key_frames_table, lag_items, parse_collection

BRANCHES = str(CAPTURES / "live-failover-branches.pcap")
RETRY = str(CAPTURES / "live-rollback-retry.pcap")
EVIL = "<script>alert(1)</script>"  # as the views conftest writes it into evil_capture
SHOWN = ["conn", "stream", "vbucket", "frame", "name", "key", "cid", "seqno", "cas", "rev_seqno", "snapshot", "snap_type"]
FATE = ["fate", "fate_frame", "fate_seqno", "dedup_violation", "consumer", "lineage"]


def test_a_rolled_back_version(failover) -> None:
    """before-loss-004 reached the consumer at seqno 13 on the old branch; the Rollback to 12 took it away."""
    m = ExplorerModel.open(BRANCHES)
    h = m.key_history("before-loss-004")
    assert len(h) == 1
    row = h.iloc[0]
    assert (row["name"], int(row["seqno"]), row["fate"]) == ("DCP_MUTATION", 13, "rolled back")
    assert int(row["fate_frame"]) == failover.rollback and failover.rollback_seqno == 12
    assert h.attrs["absence"] == ""


@pytest.mark.parametrize("path", sorted(str(p) for p in CAPTURES.glob("*.pcap")))
def test_every_key_history_is_the_full_reads(path: str) -> None:
    """The model's answer (the key's frames only, items rebuilt from the store) is the pure function's on a full read."""
    m = ExplorerModel.open(path)
    full = read_tables(path)
    keys = sorted(set(full.frames.loc[full.frames["name"].isin(ITEM_KINDS), "key"].dropna()))[:40]
    for key in keys:
        mine, theirs = m.key_history(key), key_versions(full.frames, full.tables, key=key)
        pd.testing.assert_frame_equal(
            mine[SHOWN + FATE].reset_index(drop=True), theirs[SHOWN + FATE].reset_index(drop=True), check_dtype=False
        )


def test_a_key_never_seen_says_why() -> None:
    m = ExplorerModel.open(BRANCHES)
    full = read_tables(BRANCHES)
    none = m.key_history("no-such-key")
    assert not len(none) and none.attrs["absence"] == key_absence(full.frames, full.tables, "no-such-key")
    assert none.attrs["absence"].startswith("never seen on any stream (4 streams of vbuckets 0, 1")
    other = m.key_history("before-loss-004", collection=8)  # the key, in a collection no stream carried
    assert not len(other) and other.attrs["absence"].startswith("never seen")


def test_only_the_keys_frames_become_pandas_rows() -> None:
    """Bounded: the history reads the key's frames and the answers to its requests, nothing else."""
    m = ExplorerModel.open(str(CAPTURES / "live-sdk.pcap"))
    full = read_tables(str(CAPTURES / "live-sdk.pcap"))
    kv = full.frames[(full.frames["role"] == "request") & full.frames["key"].notna() & ~full.frames["name"].isin(ITEM_KINDS)]
    key = str(kv.iloc[0]["key"])
    got = key_frames_table(m, key, COLUMNS)
    assert list(got.columns) == list(COLUMNS)
    assert 0 < len(got) < m.store.rows
    assert ((got["key"] == key).fillna(False) | (got["role"] == "response")).all()
    assert (got["role"] == "response").any()  # the write's answer, for key_absence's status
    assert m.key_history(key).attrs["absence"] == key_absence(full.frames, full.tables, key)


def test_the_rollback_cost_of_the_selected_stream(failover) -> None:
    m = ExplorerModel.open(BRANCHES)
    assert m.rollback_costs() is None  # nothing selected: no stream
    m.select(failover.rollback)
    cost = m.rollback_costs()
    assert len(cost) == 1
    r = cost.iloc[0]
    assert (int(r["rollback_seqno"]), int(r["items"]), int(r["possibly_lost"]), int(r["redelivered"])) == (12, 3, 3, 0)
    assert "before-loss-004" in r["lost_keys"]
    assert "before-loss-004" in m.panel_html("rollback")
    m.select(failover.first_vb0)  # vbucket 0's first stream, another connection: no rollback of its own
    assert not len(m.rollback_costs()) and "had no rollback" in m.panel_html("rollback")


def test_the_branch_figure_marks_the_lost_segment_when_the_cost_is_asked(failover) -> None:
    m = ExplorerModel.open(BRANCHES)
    m.select(failover.rollback)

    def gids() -> set[str]:
        shown = m.shown()
        assert shown is not None
        return {str(a.get_gid()) for ax in shown.figures["branch"].axes for a in ax.get_children() if a.get_gid()}

    assert "rollback-loss:0" not in gids()  # not asked: not computed
    m.open_panel("rollback")
    assert "rollback-loss:0" in gids()
    m.open_panel("rollback", False)
    assert "rollback-loss:0" not in gids()


def test_a_rollback_to_0_that_cost_nothing() -> None:
    m = ExplorerModel.open(RETRY)
    t = m.timeline
    i = next(k for k, s in enumerate(t.streams) if any(a.outcome == "rollback" for a in s.attempts))
    cost = m.rollback_costs(i)
    assert len(cost) == 1 and int(cost.iloc[0]["rollback_seqno"]) == 0 and int(cost.iloc[0]["items"]) == 0


@pytest.mark.parametrize("path", sorted(str(p) for p in CAPTURES.glob("*.pcap")))
def test_the_lag_summary_is_the_full_tables(path: str) -> None:
    """panels rule 2: only the items that decide a lag are read, and the summary is what every item gives."""
    m = ExplorerModel.open(path)
    mine = m.lag_summary(None).drop(columns=["rows"]).reset_index(drop=True)
    full = consumer_lag(path, top=None)
    pd.testing.assert_frame_equal(mine, full.summary.drop(columns=["rows"]).reset_index(drop=True))
    assert len(m.lag()) <= len(full.progress)


def test_the_lag_of_a_retried_rollback() -> None:
    s = ExplorerModel.open(RETRY).lag_summary()
    assert len(s) == 1
    r = s.iloc[0]
    assert (int(r["max_lag_items"]), int(r["end_lag_items"]), int(r["end_consumer_seqno"])) == (12, 0, 12)


def test_the_lag_plot_is_of_the_selected_frames_vbucket(failover) -> None:
    m = ExplorerModel.open(BRANCHES)
    assert m.lag_figure().axes[0].get_title().startswith("consumer lag (") or "vbucket" not in m.lag_figure().axes[0].get_title()
    m.select(failover.rollback)
    shown = m.lag_shown()
    assert shown.figures["lag"].axes[0].get_title().startswith("consumer lag: vbucket 0")
    assert shown.png("lag").startswith(b"\x89PNG")


def test_lag_items_keeps_what_decides_a_lag() -> None:
    """Rule 2 on numbers: one snapshot 1-10 (marker at frame 1), items 1..10, the highs 0 and 10: the last of each band and the highest."""

    from types import SimpleNamespace

    t = SimpleNamespace(streams=[SimpleNamespace(snapshots=[SimpleNamespace(frame=1)])])
    frames = np.arange(2, 12, dtype=np.int64)
    seqnos = np.arange(1, 11, dtype=np.uint64)
    kept = lag_items(t, 0, frames, seqnos, np.zeros(10, bool), np.asarray([0, 10], np.uint64))  # type: ignore[arg-type]
    assert frames[kept].tolist() == [10, 11]  # seqno 9 (the last below 10) and 10
    mid = lag_items(t, 0, frames, seqnos, np.zeros(10, bool), np.asarray([0, 5, 10], np.uint64))  # type: ignore[arg-type]
    assert seqnos[mid].tolist() == [4, 9, 10]


def test_answers_are_computed_only_when_asked_and_again_after_a_live_fold(manual) -> None:
    cap = LiveCapture()
    m = ExplorerModel.live(cap, interval=0.25, runner=manual)
    conn = cap.connection(("127.0.0.1", 50000), ("127.0.0.1", 11210), ts=1)
    conn.data("c2s", encode("DCP_STREAM_REQ", opaque=7, vbucket=5, extras={"start_seqno": 0, "end_seqno": 2**64 - 1}), ts=2)
    conn.data("s2c", encode("DCP_STREAM_REQ", opaque=7, status=0), ts=3)

    def snapshot(first: int, keys: list[str], ts: int) -> None:
        last = first + len(keys) - 1
        conn.data(
            "s2c", encode("DCP_SNAPSHOT_MARKER", opaque=7, vbucket=5, extras={"start_seqno": first, "end_seqno": last, "flags": 1}), ts=ts
        )
        for n, k in enumerate(keys):
            conn.data(
                "s2c",
                encode("DCP_MUTATION", opaque=7, vbucket=5, extras={"by_seqno": first + n, "rev_seqno": 1}, key=k, value=b"v"),
                ts=ts + 1 + n,
            )

    snapshot(1, ["k0", "k1"], 4)
    manual.run_calls()
    m.set_key("k1")
    assert m._answers == {}  # the question is set; no answer until it is read
    first = m.key_rows()
    assert first["fate"].tolist() == ["current"]
    snapshot(3, ["k1"], 10)
    manual.run_calls()
    again = m.key_rows()
    assert again["fate"].tolist() == ["superseded", "current"] and again["seqno"].tolist() == [2, 3]
    assert int(m.lag_summary().iloc[0]["end_consumer_seqno"]) == 3


def test_the_panels_escape_wire_text(evil_capture: str) -> None:
    m = ExplorerModel.open(evil_capture)
    m.set_key(EVIL)
    m.open_panel("key")
    page = m._repr_html_()
    assert EVIL not in page and "&lt;script&gt;" in page
    assert len(m.key_rows()) == 1
    none = ExplorerModel.open(evil_capture)
    none.set_key(EVIL + "x")
    assert EVIL not in none.panel_html("key")
    df = pd.DataFrame({"frame": [1], "keys": [[EVIL]]})
    assert EVIL not in html_table(df, ["frame", "keys"])


def test_collection_ids_as_typed() -> None:
    assert parse_collection("") is None and parse_collection("0x8") == 8 and parse_collection("12") == 12
    for bad in ("x", "-1", "0x100000000"):
        with pytest.raises(ValueError):
            parse_collection(bad)


def test_no_such_panel() -> None:
    m = ExplorerModel.open(RETRY)
    with pytest.raises(KeyError):
        m.open_panel("nope")
