"""``analyze --items`` writes the questions' tables (key_versions, rollback_losses, rollback_lost_keys, progress, lag, comparisons) exactly as the single process computes them."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from paths import CAPTURES

from dcpinspect.capture.read import read_records
from dcpinspect.capture.sets import file_sets, plan_capture_sets
from dcpinspect.spark.analysis import MANIFEST, analyze, analyze_outputs
from dcpinspect.spark.questions import QUESTION_TABLES, SCHEMAS, split_tables
from dcpinspect.tables.compare import compare_consumers, consumer_names
from dcpinspect.tables.export import frames_df
from dcpinspect.tables.fields import COMPARE_COLUMNS, HISTORY_COLUMNS, LAG_COLUMNS
from dcpinspect.tables.history import key_versions, rollback_losses, rollback_lost_keys
from dcpinspect.tables.progress import consumer_lag, high_seqnos, lag_summary, progress
from dcpinspect.tables.timeline import timeline_frames
from dcpinspect.timeline import build_timeline

pytestmark = pytest.mark.spark
# every shipped capture (16 files, capture sets apart): rollbacks to 0 and above it, failover branches, a purge, two collections,
# stream ids, streams ended and re-requested, sync writes, OSO, captures starting mid-stream
PATHS = sorted(str(p) for p in CAPTURES.glob("*.pcap"))
_SORT = {
    "key_versions": ["capture_set", "frame"],
    "rollback_losses": ["capture_set", "frame"],
    "rollback_lost_keys": ["capture_set", "frame", "cid", "key"],
    "progress": ["capture_set", "conn", "vbucket", "stream_id", "frame", "event"],
    "lag": ["capture_set", "conn", "vbucket", "stream_id"],
    "comparisons": ["capture_set", "consumer_a", "consumer_b", "vbucket", "only_in", "seqno_from", "reason"],
    "comparisons_vbuckets": ["capture_set", "consumer_a", "consumer_b", "vbucket"],
}


def _pairwise(frames: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The single process's answer to question 4 for every pair of consumers of every (capture set, vbucket): compare_consumers, pairs in name order."""
    named = dict(consumer_names(tables))
    rows, counts = [], []
    for (cs, vb), streams in tables["streams"].groupby(["capture_set", "vbucket"]):
        consumers: dict[str, list[int]] = {}
        for c in sorted(set(streams["conn"])):
            consumers.setdefault(named.get(int(c), f"conn {int(c)}"), []).append(int(c))
        names = sorted(consumers)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                pick = [
                    (
                        frames[frames["conn_id"].isin(consumers[n])],
                        {k: df[df["conn"].isin(consumers[n])] if "conn" in df else df for k, df in tables.items()},
                    )
                    for n in (a, b)
                ]
                c = compare_consumers(pick[0], pick[1], vbucket=int(vb))
                pair = {"capture_set": int(cs), "consumer_a": a, "consumer_b": b}
                rows.append(c.table.assign(**pair))
                counts.append(c.per_vbucket.assign(**pair, consumers=len(names), skipped=0))
    return pd.concat(rows, ignore_index=True), pd.concat(counts, ignore_index=True)


@pytest.fixture(scope="module")
def answers(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame], Any]:
    """One analyze run and the single process's answers on the same files."""
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("q") / "o"
    res = analyze(spark, PATHS, str(out), split_size=4096, partitions=2, items=True, report=False)
    got = {name: pq.read_table(out / name).to_pandas() for name in QUESTION_TABLES}
    plan = plan_capture_sets(PATHS, "auto")
    records = list(read_records(PATHS, capture_sets=plan))
    t = build_timeline(records, file_sets(plan))
    frames = frames_df(records)
    frames["ts"] = frames["ts"].dt.floor("us")  # Spark keeps microseconds (a pcap in ns has more): lag_seconds from the same times
    tables = timeline_frames(t)
    tables["high_seqnos"] = high_seqnos(records)  # every GET_ALL_VB_SEQNOS answer, as `dcpinspect lag` reads them
    want = {
        "key_versions": key_versions(frames, tables),
        "rollback_losses": rollback_losses(frames, tables),
        "rollback_lost_keys": rollback_lost_keys(frames, tables),
        "progress": progress(frames, tables),
    }
    want["lag"] = lag_summary(want["progress"], top=None)
    want["comparisons"], want["comparisons_vbuckets"] = _pairwise(frames, tables)
    return got, want, (out, res)


def _plain(v: Any) -> Any:
    """One cell as a comparable Python value: decimals and numpy scalars as Python ones, timestamps as us, lists as tuples, nulls as None."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(_plain(x) for x in v)
    if v is None or v is pd.NaT or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, pd.Timestamp):
        return v.tz_convert("UTC").floor("us").value
    if isinstance(v, Decimal):
        return int(v)
    if isinstance(v, np.generic):
        return _plain(v.item())
    if isinstance(v, float):
        return round(v, 6)
    return v


def _rows(df: pd.DataFrame, name: str, columns: list[str] | None = None) -> list[tuple[Any, ...]]:
    cols = columns or list(SCHEMAS[name].names)
    rows = [tuple(_plain(v) for v in r) for r in df[cols].itertuples(index=False, name=None)]
    at = [cols.index(c) for c in _SORT[name]]
    return sorted(rows, key=lambda r: tuple((x is None, x if x is not None else 0) for x in (r[i] for i in at)))


def test_the_question_tables_are_declared_and_documented(answers: Any) -> None:
    out, res = answers[2]
    for name in QUESTION_TABLES:
        assert name in analyze_outputs(items=True, report=False)
        assert name not in analyze_outputs(items=False, report=True)
        assert (out / name).is_dir()
        documented = {**HISTORY_COLUMNS, **LAG_COLUMNS, **COMPARE_COLUMNS}[name]
        assert [c[0] for c in documented] == SCHEMAS[name].names, name
    assert set(QUESTION_TABLES) <= set(__import__("json").loads((out / MANIFEST).read_text())["entries"])
    assert res["questions"] == {name: len(answers[0][name]) for name in QUESTION_TABLES}


@pytest.mark.parametrize("name", QUESTION_TABLES)
def test_each_question_table_equals_the_single_process_one(answers: Any, name: str) -> None:
    got, want = answers[0][name], answers[1][name]
    assert list(got.columns) == list(SCHEMAS[name].names)
    assert len(want) > 0, name  # the captures answer every question
    assert _rows(got, name) == _rows(want, name)


def test_progress_reads_every_high_seqno_answer_as_dcpinspect_lag_does(answers: Any) -> None:
    """Spark's progress is ``dcpinspect lag``'s (consumer_lag: every GET_ALL_VB_SEQNOS answer), not only the timeline's last one per vbucket."""
    lag = consumer_lag(PATHS, top=None).progress
    cols = [c for c in SCHEMAS["progress"].names if c != "lag_seconds"]  # lag uses the capture's ns, Spark's frames us
    got = answers[0]["progress"]
    assert _rows(got, "progress", cols) == _rows(lag, "progress", cols)
    assert "GET_ALL_VB_SEQNOS" in set(got["high_source"])


def test_the_captures_hold_the_hostile_cases(answers: Any) -> None:
    """What makes the comparison worth it: rollbacks to 0 and above it, items lost and re-delivered, rows at the end of capture."""
    want = answers[1]
    losses = want["rollback_losses"]
    assert (losses["rollback_seqno"].astype("Int64") == 0).any()
    assert (losses["items"] > 0).any()
    assert set(want["rollback_lost_keys"]["status"]) >= {"redelivered"}
    assert "rolled back" in set(want["key_versions"]["fate"])
    assert "end of capture" in set(want["progress"]["event"]) or "end" in set(want["progress"]["event"])


def test_a_capture_without_items_still_gets_every_table(spark: Any, tmp_path: Path) -> None:
    """No item at all: the key and rollback tables are empty but readable with their schema; a stream without items still has its progress rows."""
    import pyarrow.parquet as pq
    from pcapfactory import Conn, Msg, write_capture

    from dcpinspect import encode

    opened = [
        Msg("c2s", encode("DCP_OPEN", key="idle", extras={"flags": 1}, opaque=2)),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=2)),
    ]
    request = [
        Msg("c2s", encode("DCP_STREAM_REQ", vbucket=3, opaque=9, extras={"start_seqno": 5, "end_seqno": 2**64 - 1})),
        Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=9, value=[(0xFEEDDECA, 0)])),
    ]
    path = tmp_path / "no-items.pcap"
    write_capture(path, [Conn(client=("10.0.0.1", 40001), msgs=[*opened, *request]), Conn(client=("10.0.0.1", 40002), msgs=opened)])
    out = tmp_path / "o"
    res = analyze(spark, [str(path)], str(out), split_size=4096, partitions=2, items=True, report=False)
    got = {name: pq.read_table(out / name) for name in QUESTION_TABLES}
    for name in ("key_versions", "rollback_losses", "rollback_lost_keys"):
        assert got[name].num_rows == 0 and got[name].schema == SCHEMAS[name], name
    records = list(read_records([str(path)]))
    tables = timeline_frames(build_timeline(records))
    want = progress(frames_df(records), tables)
    assert list(want["event"])[:1] == ["stream request"]  # a series that only the seed row of its vbucket brings to a group
    assert _rows(got["progress"].to_pandas(), "progress") == _rows(want, "progress")
    assert res["questions"]["progress"] == len(want) and res["questions"]["lag"] == 1


def test_two_consumers_of_one_capture_are_compared_per_vbucket(answers: Any) -> None:
    """live-collections.pcap: conn 1 streams every collection, conn 2 collection 0x8 only: what only conn 1 has is the filter's doing."""
    got = answers[0]["comparisons"]
    versions = answers[1]["key_versions"]
    cs = int(versions.loc[versions["file"].str.endswith("live-collections.pcap"), "capture_set"].iloc[0])
    mine = got[got["capture_set"] == cs]
    assert set(zip(mine["consumer_a"], mine["consumer_b"], strict=True)) == {("live-collections-all", "live-collections-filtered")}
    only_a = mine[mine["only_in"] == "a"]
    assert len(only_a) and set(only_a["reason"]) == {"filter"}
    assert all("filtered on collections 0x8" in e for e in only_a["explanation"])
    counts = answers[0]["comparisons_vbuckets"]
    counts = counts[counts["capture_set"] == cs]
    assert sorted(counts["vbucket"]) == [0, 1] and set(counts["consumers"]) == {2} and set(counts["skipped"]) == {0}
    assert (counts["items_a"] > counts["items_b"]).all()


def test_a_connection_without_dcp_open_is_named_by_its_number(answers: Any) -> None:
    """messy.pcap's connections 2 and 3 were captured without their DCP_OPEN: they are compared as ``conn N`` (their numbers in the read)."""
    versions = answers[1]["key_versions"]
    cs = int(versions.loc[versions["file"].str.endswith("messy.pcap"), "capture_set"].iloc[0])
    counts = answers[0]["comparisons_vbuckets"]
    mine = counts[(counts["capture_set"] == cs) & (counts["consumers"] == 3)]
    names = set(mine["consumer_a"]) | set(mine["consumer_b"])
    assert len(mine) == 3 and "lossy" in names and sum(n.startswith("conn ") and n[5:].isdigit() for n in names) == 2


def test_at_most_max_consumers_of_a_vbucket_are_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """live-stream-ends.pcap's vbucket 2 has three consumers: three pairs, or with a bound of two the first pair, one consumer skipped."""
    import dcpinspect.spark.questions as questions

    records = list(read_records([str(CAPTURES / "live-stream-ends.pcap")]))
    frames, tables = frames_df(records), timeline_frames(build_timeline(records))
    part = split_tables(tables, high_seqnos(records))[(1, 2)]
    part["items"] = tables["items"][tables["items"]["vbucket"] == 2]
    last = {int(c): int(f) for c, f in frames.groupby("conn_id")["frame"].max().items()}
    table, per_vb = questions.comparisons(1, 2, part["items"], frames[["frame", "key", "cid"]], part, last)
    assert list(zip(per_vb["consumer_a"], per_vb["consumer_b"], strict=True)) == [
        ("live-stream-ends", "live-stream-ends-close"),
        ("live-stream-ends", "live-stream-ends-legacy"),
        ("live-stream-ends-close", "live-stream-ends-legacy"),
    ]
    assert set(per_vb["skipped"]) == {0} and set(per_vb["consumers"]) == {3}
    monkeypatch.setattr(questions, "MAX_CONSUMERS", 2)
    table, per_vb = questions.comparisons(1, 2, part["items"], frames[["frame", "key", "cid"]], part, last)
    assert list(zip(per_vb["consumer_a"], per_vb["consumer_b"], per_vb["skipped"], strict=True)) == [
        ("live-stream-ends", "live-stream-ends-close", 1)
    ]
    assert table is None or set(table["consumer_b"]) == {"live-stream-ends-close"}
