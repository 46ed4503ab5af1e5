"""Capture commands on real third-party captures: frames (text, JSON, parquet, CSV), show, summary."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from clirun import run
from paths import THIRD_PARTY

from dcpinspect.tables.columns import COLUMN_NAMES, JSON_COLUMNS

STATS = THIRD_PARTY / "packetbeat_memcache_bin_tcp_stats.pcap"
COUNTER = THIRD_PARTY / "packetbeat_memcache_bin_tcp_counter_ops.pcap"
pytestmark = [pytest.mark.shared, pytest.mark.skipif(not THIRD_PARTY.is_dir(), reason="../shared/captures/third-party is absent")]


def test_frames_json_lines() -> None:
    code, out = run("frames", "--json", "--no-progress", str(COUNTER))
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 10
    for row in rows:
        assert tuple(row) == JSON_COLUMNS
        assert isinstance(row["problems"], list) and row["problems"] == []
        assert isinstance(row["opaque"], int) and isinstance(row["ts"], float)
    assert [r["name"] for r in rows[:4]] == ["SET", "SET", "INCREMENT", "INCREMENT"]
    assert rows[0]["dir"] == "c2s" and rows[1]["dir"] == "s2c"
    assert rows[0]["vbucket"] == 0 and rows[0]["status"] is None and rows[1]["status"] == 0 and rows[1]["vbucket"] is None
    assert rows[0]["key"] == "cnt" and rows[0]["opaque"] == 0x10000


def test_frames_filter_and_text() -> None:
    code, out = run("frames", "--no-progress", "--filter", "name == 'STAT' and role == 'response'", str(STATS))
    assert code == 0 and len(out.splitlines()) == 53
    code, _ = run("frames", "--no-progress", "--filter", "no_such_column > 1", str(STATS))
    assert code == 2


def test_frames_parquet_and_csv(tmp_path: Path) -> None:
    pq_path = tmp_path / "f.parquet"
    csv_path = tmp_path / "f.csv"
    assert run("frames", "--no-progress", "--parquet", str(pq_path), str(STATS), str(COUNTER))[0] == 0
    table = pq.read_table(pq_path)
    assert table.num_rows == 70 and tuple(table.column_names) == COLUMN_NAMES
    assert str(table.schema.field("cas").type) == "uint64"
    assert run("frames", "--no-progress", "--csv", str(csv_path), str(COUNTER))[0] == 0
    lines = csv_path.read_text().splitlines()
    assert len(lines) == 11 and lines[0].startswith('"file","frame"')


def test_show_and_summary() -> None:
    code, out = run("show", "--no-progress", "--opcode", "INCREMENT", str(COUNTER))
    assert code == 0 and out.count("INCREMENT command") == 1 and out.count("INCREMENT response") == 1
    assert "  counter    (24-31): 0x0000000000000002" in out
    code, out = run("summary", "--no-progress", str(STATS))
    assert code == 0
    assert "53  STAT response" in out and "0 bytes lost" in out and "roles from syn" in out


def test_not_a_capture_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    code, _ = run("frames", "--no-progress", str(bad))
    assert code == 1
    err = capsys.readouterr().err
    assert "notes.txt" in err and "not a pcap or pcapng capture" in err and "byte offset 0" in err
    # one bad file among good ones: the good ones still decode, and the run says that something failed
    code, out = run("frames", "--json", "--no-progress", str(bad), str(COUNTER))
    assert code == 1 and len(out.splitlines()) == 10


def test_truncated_capture_keeps_what_was_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut.pcap"
    data = STATS.read_bytes()
    cut.write_bytes(data[:-40])
    code, out = run("frames", "--json", "--no-progress", str(cut))
    assert code == 0
    err = capsys.readouterr().err
    assert "truncated record" in err and "frames before it were kept" in err
    rows = [json.loads(line) for line in out.splitlines()]
    assert 50 <= len(rows) <= 60
