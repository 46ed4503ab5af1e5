"""``dcpinspect key``: a document's versions and fates on the shipped captures, text and ``--json``, and its exit codes."""

from __future__ import annotations

import json

import pytest
from clirun import run
from paths import CAPTURES

from dcpinspect.tables.fields import HISTORY_COLUMNS
from dcpinspect.tables.history import key_versions, read_tables, rollback_losses, rollback_lost_keys


def lines(*argv: str) -> tuple[int, list[dict]]:
    code, out = run("key", *argv, "--json")
    return code, [json.loads(line) for line in out.splitlines()]


def test_a_version_the_failover_rolled_back() -> None:
    code, rows = lines(str(CAPTURES / "live-failover-branches.pcap"), "before-loss-004")
    assert code == 0
    *versions, summary = rows
    assert [(r["conn"], r["seqno"], r["fate"], r["fate_seqno"], r["fate_frame"]) for r in versions] == [(1, 13, "rolled back", 12, 104)]
    assert versions[0]["consumer"] == "live-failover-branches" and versions[0]["snap_type"] == "memory"
    assert summary["seen"] and "holds no version of 'before-loss-004'" in summary["summary"][0]
    code, text = run("key", str(CAPTURES / "live-failover-branches.pcap"), "before-loss-004")
    assert code == 0 and "-> rolled back (to 12, frame 104)" in text and "HLC 2022-07-08" in text


def test_the_purge_rollback_and_the_retry() -> None:
    code, rows = lines(str(CAPTURES / "live-purge-rollback.pcap"), "doc-0001")
    *versions, summary = rows
    assert code == 0 and [(r["consumer"], r["fate"]) for r in versions] == [
        ("live-purge-first", "rolled back"),
        ("live-purge-resume", "current"),
    ]
    assert versions[0]["fate_seqno"] == 0 and {r["lineage"] for r in versions} == {"live-purge-first"}
    assert "consumer 'live-purge-resume' (vbucket 0, resuming 'live-purge-first') holds version 'doc-0001' seqno 2" in summary["summary"][0]


def test_the_rollback_retry_capture() -> None:
    code, rows = lines(str(CAPTURES / "live-rollback-retry.pcap"), "doc-0001")
    assert code == 0 and [r["fate"] for r in rows[:-1]] == ["current"] and rows[-1]["seen"]


@pytest.mark.parametrize(("collection", "cids"), [(None, {8}), ("airlines", {8}), ("8", {8}), ("0x8", {8}), ("_default", set())])
def test_collections_by_id_or_name(collection: str | None, cids: set[int]) -> None:
    extra = () if collection is None else ("--collection", collection)
    code, rows = lines(str(CAPTURES / "live-collections.pcap"), "airline-001", *extra)
    assert {r["cid"] for r in rows[:-1]} == cids and code == (0 if cids else 1)


def test_never_seen_exits_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run("key", str(CAPTURES / "live-collections.pcap"), "nosuch")
    assert code == 1 and out == "'nosuch' never seen on any stream (4 streams of vbuckets 0, 1)\n"
    code, rows = lines(str(CAPTURES / "live-collections.pcap"), "nosuch")
    assert code == 1 and rows == [{"summary": [out.strip()], "key": "nosuch", "collection": None, "seen": False}]


def test_an_unknown_collection_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run("key", str(CAPTURES / "live-collections.pcap"), "k", "--collection", "nosuch")
    assert code == 2 and out == ""
    assert "dcpinspect: error: --collection 'nosuch': no collection of that name" in capsys.readouterr().err
    assert run("key", str(CAPTURES / "live-collections.pcap"), "k", "--collection", "0x1ffffffff")[0] == 2


def test_the_declared_columns_are_the_tables() -> None:
    r = read_tables([str(CAPTURES / "live-failover-branches.pcap")])
    built = {
        "key_versions": key_versions(r.frames, r.tables),
        "rollback_losses": rollback_losses(r.frames, r.tables),
        "rollback_lost_keys": rollback_lost_keys(r.frames, r.tables),
    }
    assert list(built) == list(HISTORY_COLUMNS)
    for name, df in built.items():
        assert len(df) and list(df.columns) == [c[0] for c in HISTORY_COLUMNS[name]], name


def test_sync_writes_are_marked_and_a_commit_supersedes_its_prepare() -> None:
    code, rows = lines(str(CAPTURES / "live-sync-writes.pcap"), "sync-00")
    *versions, summary = rows
    assert code == 0 and [(r["name"], r["sync_write"], r["fate"]) for r in versions] == [
        ("DCP_PREPARE", True, "superseded"),
        ("DCP_COMMIT", True, "current"),
    ]
    assert "holds version 'sync-00' seqno 6" in summary["summary"][0]
    code, rows = lines(str(CAPTURES / "live-sync-writes.pcap"), "sync-02")
    assert "holds the abort of a prepare of 'sync-02' seqno 10" in rows[-1]["summary"][0]


def test_the_timeline_story_says_what_each_rollback_cost() -> None:
    code, out = run("timeline", str(CAPTURES / "live-failover-branches.pcap"))
    assert code == 0
    assert "cost: the rollback cost 3 items above seqno 12 (keys: before-loss-004, before-loss-006, before-loss-008" in out
    code, out = run("timeline", str(CAPTURES / "live-plain.pcap"))
    assert code == 0 and "cost:" not in out  # no rollback, no cost line


def test_timeline_json_has_each_rollbacks_cost() -> None:
    code, out = run("timeline", str(CAPTURES / "live-failover-branches.pcap"), "--json")
    assert code == 0
    (loss,) = [json.loads(line)["rollback_loss"] for line in out.splitlines() if '"rollback_loss"' in line]
    assert (loss["rollback_seqno"], loss["items"], loss["possibly_lost"]) == (12, 3, 3)
    assert loss["lost_keys"] == ["before-loss-004", "before-loss-006", "before-loss-008"]
