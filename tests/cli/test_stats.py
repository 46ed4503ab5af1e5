"""``dcpinspect stats`` and the tables of :mod:`dcpinspect.tables.stats`."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from clirun import run
from paths import CAPTURES, THIRD_PARTY

from dcpinspect.tables.export import frames_df
from dcpinspect.tables.stats import TABLES, conversations, response_times, status_counts, vbucket_progress
from dcpinspect.tables.timeline_feed import read_timeline
from dcpinspect.timeline.model import Attempt, Item, Snapshot, Stream, Timeline

SESSION = CAPTURES / "dcp-session.pcap"
RETRY = CAPTURES / "live-rollback-retry.pcap"


def _frame(**rows: list[object]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["ts"] = pd.to_datetime(df["ts"], unit="ms")
    return df


def test_response_times_pair_by_connection_opaque_and_opcode() -> None:
    f = _frame(
        frame=[1, 2, 3, 4, 5, 6, 7],
        conn_id=[1, 1, 2, 1, 2, 1, 1],
        dir=["c2s", "c2s", "c2s", "s2c", "s2c", "s2c", "c2s"],
        ts=[0, 1, 2, 5, 12, 13, 20],
        type=["frame"] * 7,
        role=["request", "request", "request", "response", "response", "response", "request"],
        opaque=[1, 2, 1, 2, 1, 1, 9],
        opcode=[0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10],
        name=["STAT"] * 7,
    )
    rtt = response_times(f).iloc[0]
    # frame 4 answers frame 2 (4 ms), 5 answers 3 on conn 2 (10 ms), 6 answers 1 (13 ms); frame 7 is unanswered
    assert (rtt["requests"], rtt["answered"], rtt["unanswered"]) == (4, 3, 1)
    assert (rtt["min_ms"], rtt["max_ms"], rtt["p50_ms"]) == (4.0, 13.0, 10.0)
    assert rtt["avg_ms"] == pytest.approx(9.0)


def test_a_request_answered_twice_counts_its_first_answer() -> None:
    f = _frame(
        frame=[1, 2, 3],
        conn_id=[1, 1, 1],
        dir=["c2s", "s2c", "s2c"],
        ts=[0, 2, 7],
        type=["frame"] * 3,
        role=["request", "response", "response"],
        opaque=[5, 5, 5],
        opcode=[0x10] * 3,
        name=["STAT"] * 3,
    )
    rtt = response_times(f).iloc[0]
    assert (rtt["answered"], rtt["max_ms"]) == (1, 2.0)


def test_tables_of_a_capture() -> None:
    df = frames_df(RETRY)
    rtt = response_times(df).set_index("name")
    assert rtt.loc["DCP_STREAM_REQ", "answered"] == 2 and rtt.loc["DCP_STREAM_REQ", "unanswered"] == 0
    st = status_counts(df).set_index("status_name")
    assert st.loc["Rollback", "responses"] == 1 and st.loc["Rollback", "commands"] == "DCP_STREAM_REQ 1"
    conv = conversations(df)
    assert len(conv) == 1 and conv.loc[0, "frames_c2s"] + conv.loc[0, "frames_s2c"] == (df["type"] == "frame").sum()
    assert conv.loc[0, "bytes_c2s"] + conv.loc[0, "bytes_s2c"] == df["length"].sum()
    assert conv.loc[0, "duration_s"] == pytest.approx((df["ts"].max() - df["ts"].min()).total_seconds(), abs=1e-6)


def test_vbucket_progress_and_lag() -> None:
    vb = vbucket_progress(read_timeline([str(RETRY)])).iloc[0]
    assert (vb["vbucket"], vb["items"], vb["last_seqno"], vb["high_seqno"], vb["lag"]) == (0, 12, 12, 12, 0)
    vb = vbucket_progress(read_timeline([str(CAPTURES / "live-flow-control.pcap")]))
    assert (vb["lag"] >= 0).all() and (vb["high_seqno"] >= vb["last_seqno"]).all()


def _timeline(streams: list[Stream], high: dict[int, tuple[int, int]]) -> Timeline:
    return Timeline(connections={}, streams=streams, branches={}, logs={}, flow=[], noops=[], anomalies=[], stalls=[], high_seqnos=high)


def test_lag_against_the_latest_marker_and_get_all_vb_seqnos() -> None:
    a = Attempt(frame=10, ts=0, opaque=1, flags=0, start=0, end=2**64 - 1, uuid=0, snap_start=0, snap_end=0, outcome="success")
    s = Stream(conn=1, vbucket=7, stream_id=None, segment=0, attempts=[a], snapshots=[Snapshot(frame=12, start=0, end=20, flags=0)])
    s.items = [Item(13 + k, 0, 0x57, k + 1, 0) for k in range(15)]
    s.last_seqno = 15
    row = vbucket_progress(_timeline([s], {})).iloc[0]
    assert (row["items"], row["last_seqno"], row["high_seqno"], row["high_from"], row["lag"]) == (15, 15, 20, "snapshot marker", 5)
    row = vbucket_progress(_timeline([s], {7: (40, 30)})).iloc[0]  # seen while the stream was open
    assert (row["high_seqno"], row["high_from"], row["lag"]) == (30, "GET_ALL_VB_SEQNOS", 15)
    row = vbucket_progress(_timeline([s], {7: (5, 30)})).iloc[0]  # seen before it was requested
    assert (row["high_seqno"], row["lag"]) == (20, 5)
    s.end = {"status": 0, "name": "OK", "frame": 35}
    row = vbucket_progress(_timeline([s], {7: (40, 30)})).iloc[0]  # seen after it ended
    assert (row["high_seqno"], row["lag"], row["end"]) == (20, 5, "OK")
    s.items, s.last_seqno = [], None
    row = vbucket_progress(_timeline([s], {})).iloc[0]  # no item: the requested start is where the consumer is
    assert (row["last_seqno"], row["high_seqno"], row["lag"]) == (0, 20, 20)


def test_lag_counts_what_a_marker_announced_and_never_came() -> None:
    code, out = run("stats", "--no-progress", "--json", "--table", "vbuckets", str(SESSION))
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and rows and all(r["table"] == "vbuckets" for r in rows)
    vb3 = next(r for r in rows if r["vbucket"] == 3)
    assert vb3["high_from"] in ("items", "snapshot marker", "GET_ALL_VB_SEQNOS")
    assert vb3["lag"] == vb3["high_seqno"] - vb3["last_seqno"]


def test_stats_text_lists_every_table() -> None:
    code, out = run("stats", "--no-progress", str(SESSION), str(RETRY))
    assert code == 0
    heads = [line.split(":")[0] for line in out.splitlines() if line.startswith("== ")]
    assert heads == [f"== {t}" for t in TABLES]
    assert "DCP_STREAM_REQ   0x53" in out and "Rollback" in out


def test_stats_json_one_object_per_row() -> None:
    code, out = run("stats", "--no-progress", "--json", "--table", "rtt", "--table", "conversations", str(SESSION))
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and {r["table"] for r in rows} == {"rtt", "conversations"}
    conv = next(r for r in rows if r["table"] == "conversations")
    assert isinstance(conv["first"], float) and conv["frames_c2s"] == 11


@pytest.mark.shared
@pytest.mark.skipif(not THIRD_PARTY.is_dir(), reason="../shared/captures/third-party is absent")
def test_stats_on_third_party_captures() -> None:
    for src in sorted(THIRD_PARTY.glob("*.pcap")):
        code, out = run("stats", "--no-progress", "--json", "--table", "rtt", "--table", "status", str(src))
        rows = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and any(r["table"] == "rtt" for r in rows), src
        quiet = [r for r in rows if r["table"] == "rtt" and r["name"] == "GETKQ"]
        assert all(r["unanswered"] >= 0 for r in quiet)


def test_conversations_list_a_tls_connection_and_lost_bytes() -> None:
    code, out = run("stats", "--no-progress", "--json", "--table", "conversations", str(CAPTURES / "messy.pcap"))
    rows = {r["conn_id"]: r for r in map(json.loads, out.splitlines())}
    assert code == 0 and sorted(rows) == [1, 2, 3, 4]
    assert rows[4]["note"] == "TLS, not decoded" and rows[4]["frames_c2s"] == rows[4]["frames_s2c"] == 0
    assert rows[4]["duration_s"] > 0 and rows[1]["bytes_lost"] == 1000
