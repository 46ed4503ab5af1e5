"""Consumer lag (``dcpinspect.tables.progress``): progress rows and their summary, with answers known from the frames or the simulator."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from paths import CAPTURES
from pcapfactory import Conn, Msg, write_capture
from producerpeer import stream_extras

from dcpinspect import encode
from dcpinspect.capture.read import read_records
from dcpinspect.live.client import DcpClient
from dcpinspect.live.consumer import ConsumerConfig
from dcpinspect.live.sim import Simulator
from dcpinspect.live.tap import LiveCapture
from dcpinspect.tables.export import frames_df
from dcpinspect.tables.fields import LAG_COLUMNS
from dcpinspect.tables.progress import (
    HIGH_SEQNO_COLUMNS,
    PROGRESS_COLUMNS,
    SUMMARY_COLUMNS,
    consumer_lag,
    high_seqnos,
    lag_summary,
    progress,
    timeline_high_seqnos,
)
from dcpinspect.tables.timeline import timeline_frames
from dcpinspect.timeline import build_timeline
from dcpinspect.views.drawing import MAX_POINTS, frames_of
from dcpinspect.views.plots_lag import plot_lag

T0 = 1_700_000_000.0


def series(df: pd.DataFrame, consumer: str, vbucket: int = 0) -> pd.DataFrame:
    return df[(df["consumer"] == consumer) & (df["vbucket"] == vbucket)].reset_index(drop=True)


# --------------------------------------------------------------------------- a capture with every time known


def _synthetic(tmp_path: Path) -> str:
    """One consumer of vbucket 0: STAT says 5 (t+1), the stream starts at 0 (t+2), a marker 1-8 (t+3), items 5 (t+4) and 8 (t+5),
    STAT says 6 (t+6: a failover lowered it), GET_ALL_VB_SEQNOS says 10 (t+7), a noop ends the capture (t+9)."""
    mut = [encode("DCP_MUTATION", extras={"by_seqno": q, "rev_seqno": 1}, key=f"k{q}", value=b"v", opaque=0x10) for q in (5, 8)]
    msgs = [
        Msg("c2s", encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key="syn", opaque=1), T0),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=1), T0 + 0.5),
        Msg("c2s", encode("STAT", key="vbucket-seqno", opaque=2), T0 + 0.9),
        Msg("s2c", encode("STAT", response=True, key="vb_0:high_seqno", value=b"5", opaque=2), T0 + 1),
        Msg("s2c", encode("STAT", response=True, opaque=2), T0 + 1.1),
        Msg("c2s", encode("DCP_STREAM_REQ", extras=stream_extras(start=0), vbucket=0, opaque=0x10), T0 + 1.5),
        Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=0x10, value=[(0xAB, 0)]), T0 + 2),
        Msg("s2c", encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 8, "flags": 1}, opaque=0x10), T0 + 3),
        Msg("s2c", mut[0], T0 + 4),
        Msg("s2c", mut[1], T0 + 5),
        Msg("c2s", encode("STAT", key="vbucket-seqno", opaque=3), T0 + 5.5),
        Msg("s2c", encode("STAT", response=True, key="vb_0:high_seqno", value=b"6", opaque=3), T0 + 6),
        Msg("s2c", encode("STAT", response=True, opaque=3), T0 + 6.1),
        Msg("c2s", encode("GET_ALL_VB_SEQNOS", opaque=4), T0 + 6.5),
        Msg("s2c", encode("GET_ALL_VB_SEQNOS", response=True, value=[(0, 10)], opaque=4), T0 + 7),
        Msg("s2c", encode("DCP_NOOP", opaque=5), T0 + 9),
    ]
    path = tmp_path / "lag.pcap"
    write_capture(path, [Conn(msgs=msgs, close=None)], nanosecond=True, ts0=T0 - 1)
    return str(path)


def test_every_source_and_the_lag_in_seconds(tmp_path: Path) -> None:
    path = _synthetic(tmp_path)
    result = consumer_lag(path)
    rows = result.progress
    assert list(rows.columns) == list(PROGRESS_COLUMNS)
    got = [
        (r.event, r.consumer_seqno, r.producer_high, r.high_source, r.lag_items, round(r.lag_seconds, 6), round(r.ts.timestamp() - T0, 6))
        for r in rows.itertuples()
    ]
    assert got == [
        ("stream request", 0, 5, "STAT vbucket-seqno", 5, 1.0, 2.0),  # above 0 since STAT at t+1
        ("snapshot marker", 0, 8, "snapshot marker", 8, 2.0, 3.0),
        ("item", 5, 8, "snapshot marker", 3, 1.0, 4.0),  # above 5 since the marker at t+3
        ("item", 8, 8, "snapshot marker", 0, 0.0, 5.0),
        ("STAT vbucket-seqno", 8, 6, "STAT vbucket-seqno", 0, 0.0, 6.0),  # an exact report lowers it
        ("GET_ALL_VB_SEQNOS", 8, 10, "GET_ALL_VB_SEQNOS", 2, 0.0, 7.0),
        ("end of capture", 8, 10, "GET_ALL_VB_SEQNOS", 2, 2.0, 9.0),
    ]
    assert set(rows["consumer"]) == {"syn"} and rows["stream_id"].isna().all()
    highs = high_seqnos(read_records([path]))
    assert list(highs.columns) == list(HIGH_SEQNO_COLUMNS)
    assert highs[["vbucket", "high_seqno", "source"]].values.tolist() == [
        [0, 5, "STAT vbucket-seqno"],
        [0, 6, "STAT vbucket-seqno"],
        [0, 10, "GET_ALL_VB_SEQNOS"],
    ]
    s = result.summary.iloc[0]
    assert (s["max_lag_items"], s["max_lag_seconds"], s["end_lag_items"], s["end_lag_seconds"]) == (8, 2.0, 2, 2.0)
    assert s["max_lag_items_at"].timestamp() == pytest.approx(T0 + 3)


def test_without_the_reports_only_the_lower_bounds_remain(tmp_path: Path) -> None:
    """The frames table keeps neither answer's values: without the high_seqnos table only markers and items count."""
    recs = list(read_records([_synthetic(tmp_path)]))
    tables = timeline_frames(build_timeline(recs))
    rows = progress(frames_df(recs), tables)
    assert "STAT vbucket-seqno" not in set(rows["high_source"]) and rows["producer_high"].max() == 8
    assert rows["lag_items"].iloc[-1] == 0


def test_records_and_paths_give_the_same_table(tmp_path: Path) -> None:
    path = _synthetic(tmp_path)
    a, b = consumer_lag(path).progress, consumer_lag(list(read_records([path]))).progress
    pd.testing.assert_frame_equal(a, b)


def test_the_declared_columns_are_the_tables(tmp_path: Path) -> None:
    result = consumer_lag(_synthetic(tmp_path))
    assert [c[0] for c in LAG_COLUMNS["progress"]] == list(result.progress.columns) == list(PROGRESS_COLUMNS)
    assert [c[0] for c in LAG_COLUMNS["lag"]] == list(result.summary.columns) == list(SUMMARY_COLUMNS)
    assert [c[0] for c in LAG_COLUMNS["high_seqnos"]] == list(HIGH_SEQNO_COLUMNS)


# --------------------------------------------------------------------------- shipped captures: hostile cases


def test_get_all_vb_seqnos_of_a_to_latest_client() -> None:
    """live-plain: the client (to_latest) asked GET_ALL_VB_SEQNOS first; every stream starts that far behind."""
    path = str(CAPTURES / "live-plain.pcap")
    df = frames_df(path)
    highs = high_seqnos(read_records([path]))
    answer = df[(df["name"] == "GET_ALL_VB_SEQNOS") & (df["role"] == "response")]["frame"].tolist()
    assert set(highs["frame"]) == set(answer) and len(highs) == 4
    rows = consumer_lag(path).progress
    for vb, high in zip(highs["vbucket"], highs["high_seqno"], strict=True):
        mine = rows[rows["vbucket"] == vb]
        first = mine.iloc[0]
        assert (first["event"], first["consumer_seqno"], first["producer_high"], first["lag_items"]) == ("stream request", 0, high, high)
        assert first["high_source"] == "GET_ALL_VB_SEQNOS" and first["high_frame"] == answer[0]
        items = df[(df["name"] == "DCP_MUTATION") & (df["vbucket"] == vb)]
        assert mine["lag_items"].iloc[-1] == 0 and mine["consumer_seqno"].iloc[-1] == items["seqno"].max() == high


def test_seqno_advanced_on_a_filtered_stream() -> None:
    """live-collections: the filtered consumer skips to the marker's end with SEQNO_ADVANCED: no lag left."""
    path = str(CAPTURES / "live-collections.pcap")
    df = frames_df(path)
    adv = df[(df["name"] == "DCP_SEQNO_ADVANCED") & (df["vbucket"] == 0)].iloc[0]
    marker = df[(df["name"] == "DCP_SNAPSHOT_MARKER") & (df["vbucket"] == 0) & (df["frame"] < adv["frame"])].iloc[-1]
    rows = series(consumer_lag(path).progress, "live-collections-filtered")
    at = rows[rows["frame"] == adv["frame"]].iloc[0]
    before = rows[rows["frame"] < adv["frame"]].iloc[-1]
    assert at["event"] == "DCP_SEQNO_ADVANCED" and at["consumer_seqno"] == adv["seqno"] == marker["snap_end"]
    assert at["lag_items"] == 0 and before["lag_items"] == marker["snap_end"] - before["consumer_seqno"] > 0


def test_a_rollback_to_zero_puts_the_consumer_back() -> None:
    """live-purge-rollback: the resumed consumer claimed 10, was rolled back to 0, and was the whole vbucket behind."""
    path = str(CAPTURES / "live-purge-rollback.pcap")
    tl = timeline_frames(build_timeline(read_records([path])))
    back = tl["rollbacks"].iloc[0]
    rows = series(consumer_lag(path).progress, "live-purge-resume")
    req = rows[rows["frame"] == back["frame"]].iloc[0]
    rb = rows[rows["frame"] == back["response_frame"]].iloc[0]
    assert (req["event"], req["consumer_seqno"]) == ("stream request", back["start"])
    assert (rb["event"], rb["consumer_seqno"], back["rollback_seqno"]) == ("rollback", 0, 0)
    assert rb["lag_items"] == rb["producer_high"] > 0 and rb["high_source"] == "GET_ALL_VB_SEQNOS"
    assert rows["lag_items"].iloc[-1] == 0


def test_a_capture_starting_mid_stream() -> None:
    """live-flow-control from its snapshot marker on: no request, no open; the consumer seqno is unknown until the first item."""
    recs = list(read_records([str(CAPTURES / "live-flow-control.pcap")]))
    df = frames_df(recs)
    marker = df[df["name"] == "DCP_SNAPSHOT_MARKER"].iloc[0]
    cut = recs[int(marker["frame"]) - 1 :]
    rows = consumer_lag(cut).progress
    first, second = rows.iloc[0], rows.iloc[1]
    assert first["event"] == "snapshot marker" and pd.isna(first["consumer_seqno"]) and pd.isna(first["lag_items"])
    assert first["producer_high"] == marker["snap_end"] and pd.isna(first["consumer"])
    item = df[df["name"] == "DCP_MUTATION"].iloc[0]
    assert (second["consumer_seqno"], second["lag_items"]) == (item["seqno"], marker["snap_end"] - item["seqno"])
    since = (second["ts"] - first["ts"]).total_seconds()  # the scope's first frame: a lower bound
    assert second["lag_seconds"] == pytest.approx(since, abs=1e-6)


def test_stream_ids_are_series_of_their_own() -> None:
    rows = consumer_lag(str(CAPTURES / "live-stream-ids.pcap"), top=None)
    tl = timeline_frames(build_timeline(read_records([str(CAPTURES / "live-stream-ids.pcap")])))
    want = {(int(v), int(s)) for v, s in zip(tl["streams"]["vbucket"], tl["streams"]["stream_id"], strict=True)}
    assert {(int(v), int(s)) for v, s in zip(rows.summary["vbucket"], rows.summary["stream_id"], strict=True)} == want


def test_summary_worst_first_and_top() -> None:
    rows = consumer_lag(str(CAPTURES / "live-stream-ends.pcap"), top=None)
    s = rows.summary
    assert list(s["max_lag_items"]) == sorted(s["max_lag_items"], reverse=True)
    assert len(lag_summary(rows.progress, 2)) == 2 and lag_summary(rows.progress.iloc[0:0]).empty
    for r in s.itertuples():
        mine = rows.progress[(rows.progress["conn"] == r.conn) & (rows.progress["vbucket"] == r.vbucket)]
        assert r.max_lag_items == mine["lag_items"].max() and r.end_lag_items == mine["lag_items"].iloc[-1] and r.rows == len(mine)


def test_timeline_high_seqnos_from_the_frames() -> None:
    path = str(CAPTURES / "live-plain.pcap")
    t = build_timeline(read_records([path]))
    got = timeline_high_seqnos(t.high_seqnos, frames_df(path))
    assert got[["vbucket", "high_seqno"]].values.tolist() == [[vb, q] for vb, (_f, q) in sorted(t.high_seqnos.items())]
    assert timeline_high_seqnos(t.high_seqnos, frames_df(path).iloc[0:0]).empty  # a sample without the answer


# --------------------------------------------------------------------------- a live session: a consumer stalls while writes go on


def run(coro: Awaitable[Any], timeout: float = 120) -> Any:
    """The deadline only turns a hang into a failure."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0.01)


def config(**kw: Any) -> ConsumerConfig:
    return ConsumerConfig(bucket="default", user="Administrator", password="password", **kw)


def _stalled_session() -> tuple[list[Any], dict[str, int]]:
    """A consumer (buffer 1 KiB, acks held) stalls on vbucket 0 while another keeps up and 60 writes land; then it acks and catches up.
    Then a to_latest consumer of vbuckets 0 and 1 asks GET_ALL_VB_SEQNOS."""

    async def main() -> tuple[list[Any], dict[str, int]]:
        capture = LiveCapture()
        async with Simulator(vbuckets=4, items=160, seed=2) as sim:
            vb0 = sim.bucket.vbuckets[0]
            slow = DcpClient(sim.host, sim.port, config(vbuckets=(0,), buffer_size=1024, name="slow"), capture=capture, hold_acks=True)
            await slow.start()
            await until(lambda: slow.consumer is not None and slow.consumer.unacked >= 1024)
            stalled_at = slow.streams[0].position.seqno
            fast = DcpClient(sim.host, sim.port, config(vbuckets=(0,), name="fast"), capture=capture)
            await fast.start()
            keys = (k for k in (f"lag-{i}" for i in range(100_000)) if sim.bucket.vbucket_of(k).id == 0)
            for _ in range(60):
                seqno = sim.mutate(next(keys), {"n": 1})
            await until(lambda: 0 in fast.streams and fast.streams[0].position.seqno >= seqno)
            assert slow.streams[0].position.seqno == stalled_at  # still stalled
            slow.hold_acks = False
            await until(lambda: slow.streams[0].position.seqno >= seqno)
            await slow.stop()
            await fast.stop()
            latest = DcpClient(sim.host, sim.port, config(vbuckets=(0, 1), to_latest=True, name="latest"), capture=capture)
            await latest.start()
            await latest.wait()
            return capture.records, {"stalled_at": stalled_at, "high": vb0.high_seqno, "high1": sim.bucket.vbuckets[1].high_seqno}

    return run(main())


@pytest.fixture(scope="module")
def stalled() -> tuple[list[Any], dict[str, int]]:
    return _stalled_session()


def test_lag_grows_while_a_consumer_stalls_and_shrinks_when_it_acks(stalled: tuple[list[Any], dict[str, int]]) -> None:
    records, known = stalled
    result = consumer_lag(records, top=None)
    rows = series(result.progress, "slow")
    at, high = known["stalled_at"], known["high"]
    worst = rows["lag_items"].idxmax()
    assert rows["lag_items"].max() == high - at
    assert (rows.loc[worst, "consumer_seqno"], rows.loc[worst, "producer_high"]) == (at, high)
    df = frames_df(records)
    conn_of = dict(zip(df["frame"], df["conn_id"], strict=True))
    fast_conn = result.progress.loc[result.progress["consumer"] == "fast", "conn"].iloc[0]
    assert conn_of[rows.loc[worst, "high_frame"]] == fast_conn  # the other consumer's stream told it what the producer had
    after = rows.loc[worst:, "lag_items"].astype(int).tolist()
    assert after == sorted(after, reverse=True) and after[-1] == 0  # it only shrinks, to nothing
    assert rows["consumer_seqno"].iloc[-1] == high
    # lag_seconds: since the first frame of the server that showed a seqno above `at` (a marker's end or an item)
    vb0 = df[(df["vbucket"] == 0) & (df["dir"] == "s2c")]
    above = vb0[((vb0["name"] == "DCP_SNAPSHOT_MARKER") & (vb0["snap_end"] > at)) | ((vb0["name"] == "DCP_MUTATION") & (vb0["seqno"] > at))]
    since = above["ts"].iloc[0]
    assert rows.loc[worst, "lag_seconds"] == pytest.approx((rows.loc[worst, "ts"] - since).total_seconds(), abs=1e-6)
    assert rows.loc[worst, "lag_seconds"] > 0
    summary = result.summary
    slow = summary[summary["consumer"] == "slow"].iloc[0]
    assert (slow["max_lag_items"], slow["end_lag_items"], slow["end_lag_seconds"]) == (high - at, 0, 0.0)
    assert list(summary["max_lag_items"]) == sorted(summary["max_lag_items"], reverse=True)
    fast = series(result.progress, "fast")
    assert fast["lag_items"].iloc[-1] == 0 and fast["consumer_seqno"].iloc[-1] == high


def test_get_all_vb_seqnos_on_a_live_to_latest_consumer(stalled: tuple[list[Any], dict[str, int]]) -> None:
    records, known = stalled
    highs = high_seqnos(records)
    latest = highs[highs["source"] == "GET_ALL_VB_SEQNOS"]
    got = dict(zip(latest["vbucket"], latest["high_seqno"], strict=True))
    assert got[0] == known["high"] and got[1] == known["high1"]
    rows = series(consumer_lag(records).progress, "latest", vbucket=1)
    first = rows.iloc[0]
    assert (first["event"], first["consumer_seqno"], first["producer_high"], first["high_source"]) == (
        "stream request",
        0,
        known["high1"],
        "GET_ALL_VB_SEQNOS",
    )
    assert rows["lag_items"].iloc[-1] == 0 and rows["event"].iloc[-1] == "end"


def test_plot_lag(stalled: tuple[list[Any], dict[str, int]]) -> None:
    records, _known = stalled
    rows = consumer_lag(records).progress
    fig = plot_lag(rows, 0)
    ax = fig.axes[0]
    gids = [line.get_gid() for line in ax.get_lines()]
    assert gids[:6] == ["consumer:0", "high:0", "consumer:1", "high:1", "consumer:2", "high:2"]
    worst = lag_summary(rows[rows["vbucket"] == 0]).iloc[0]  # the furthest behind is drawn first
    assert list(frames_of(ax.get_lines()[0])) == series(rows, worst["consumer"])["frame"].tolist()
    assert any(c.get_gid() == "lag:0" for c in ax.collections)
    assert ax.get_title() == "consumer lag: vbucket 0"
    few = plot_lag(rows, max_series=1)
    assert "showing the 1 furthest behind of" in few.axes[0].get_title() and len(few.axes[0].get_lines()) == 2
    empty = plot_lag(rows, 999)
    assert "nothing to plot" in empty.axes[0].get_title()


def test_plot_lag_is_bounded() -> None:
    """Each line has at most MAX_POINTS points, the first and the last kept."""
    n = 3 * MAX_POINTS
    rows = pd.DataFrame(
        {
            "capture_set": 1,
            "conn": 1,
            "consumer": "big",
            "vbucket": 0,
            "stream_id": pd.array([None] * n, dtype="Int64"),
            "frame": range(1, n + 1),
            "ts": pd.to_datetime([T0 + i / 1000 for i in range(n)], unit="s", utc=True),
            "event": "item",
            "consumer_seqno": pd.array(range(n), dtype="UInt64"),
            "producer_high": pd.array([n] * n, dtype="UInt64"),
            "high_source": "snapshot marker",
            "high_frame": pd.array([1] * n, dtype="Int64"),
            "lag_items": pd.array([n - i for i in range(n)], dtype="UInt64"),
            "lag_seconds": pd.array([i / 1000 for i in range(n)], dtype="Float64"),
        }
    )
    line = plot_lag(rows).axes[0].get_lines()[0]
    drawn = frames_of(line)
    assert len(drawn) <= MAX_POINTS and drawn[0] == 1 and drawn[-1] == n


def test_the_report_has_a_consumer_lag_section() -> None:
    """The report lists the series furthest behind (the capture's own numbers) and draws the worst one's vbucket."""
    from dcpinspect.views.report import MAX_LAG_ROWS, report_from_captures

    paths = [str(CAPTURES / "live-stream-ends.pcap"), str(CAPTURES / "live-flow-control.pcap")]
    page = report_from_captures(paths)
    assert "<li><a href='#lag'>Consumer lag</a></li>" in page
    section = page[page.index("<section id='lag'>") : page.index("</section>", page.index("<section id='lag'>"))]
    rows = re.findall(r"<tr id='lag-\d+'>(.*?)</tr>", section)
    want = sum(len(consumer_lag(p, top=None).summary) for p in paths)
    assert len(rows) == want == 7 < MAX_LAG_ROWS and "Showing all 7 series" in section
    cells = [re.findall(r"<td>(.*?)</td>", r) for r in rows]
    assert cells[0][1:4] == ["live-flow-control", "4", "0"] and cells[0][5] == "40"  # 40 items behind, the worst
    worst = [int(c[5].replace(",", "")) for c in cells]
    assert worst == sorted(worst, reverse=True)
    assert "<img class='plot' alt='consumer lag, vbucket 0'" in section


def test_the_report_lag_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from dcpinspect.views import report

    monkeypatch.setattr(report, "MAX_LAG_ROWS", 2)
    page = report.report_from_captures([str(CAPTURES / "live-stream-ends.pcap")])
    section = page[page.index("<section id='lag'>") :]
    assert "Showing the 2 furthest behind of 6 series" in section
    assert len(re.findall(r"<tr id='lag-\d+'>", section)) == 2
