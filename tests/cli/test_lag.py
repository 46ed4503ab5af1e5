"""``dcpinspect lag``: the worst series as text and JSON, one vbucket's progress rows, and its errors."""

from __future__ import annotations

import json

import pytest
from clirun import run
from paths import CAPTURES

from dcpinspect.tables.progress import SUMMARY_COLUMNS, consumer_lag

SHIPPED = sorted(CAPTURES.glob("*.pcap"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_json_on_every_shipped_capture(path) -> None:  # type: ignore[no-untyped-def]
    code, out = run("lag", str(path), "--json", "--top", "100", "--no-progress")
    rows = [json.loads(line) for line in out.splitlines()]
    want = consumer_lag(str(path), top=100).summary
    if want.empty:  # no DCP stream at all
        assert code == 1 and not rows
        return
    assert code == 0 and all(r["table"] == "lag" for r in rows)
    assert [list(r)[1:] for r in rows] == [list(SUMMARY_COLUMNS)] * len(want)
    assert [(r["conn"], r["vbucket"], r["max_lag_items"], r["end_lag_items"]) for r in rows] == [
        (int(r.conn), int(r.vbucket), int(r.max_lag_items), int(r.end_lag_items)) for r in want.itertuples()
    ]


def test_text_worst_first_and_top() -> None:
    code, out = run("lag", str(CAPTURES / "live-stream-ends.pcap"), "--top", "2", "--no-progress")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("== lag: the 2 series furthest behind, of 6 (at_s:")
    assert lines[1].split()[:5] == ["consumer", "conn", "vbucket", "stream_id", "max_items"]
    first, second = lines[2].split(), lines[3].split()
    assert first[:4] == ["live-stream-ends-legacy", "3", "2", "21"] and second[:4] == ["live-stream-ends", "1", "6", "12"]
    assert len(lines) == 4


def test_one_vbucket_with_its_progress_rows() -> None:
    path = str(CAPTURES / "live-rollback-retry.pcap")
    code, out = run("lag", path, "--vbucket", "0", "--no-progress")
    assert code == 0
    _head, _, rows = out.partition("\n\n")
    assert "== progress of vbucket 0: 15 rows" in rows
    table = rows.splitlines()[2:]
    assert table[0].split()[-7:] == ["stream", "request", "12", "12", "GET_ALL_VB_SEQNOS", "0", "0.000"]
    assert table[1].split()[-6:] == ["rollback", "0", "12", "GET_ALL_VB_SEQNOS", "12", table[1].split()[-1]]
    assert table[-1].split()[-6:] == ["end", "12", "12", "GET_ALL_VB_SEQNOS", "0", "0.000"]
    code, out = run("lag", path, "--vbucket", "0", "--json", "--no-progress")
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["table"] for o in objs] == ["lag"] + ["progress"] * 15
    assert objs[2]["event"] == "rollback" and objs[2]["lag_items"] == 12 and objs[2]["high_source"] == "GET_ALL_VB_SEQNOS"
    assert isinstance(objs[2]["ts"], float) and objs[1]["stream_id"] is None


def test_errors(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CAPTURES / "live-plain.pcap")
    assert run("lag", path, "--vbucket", "9", "--no-progress") == (1, "")
    assert "dcpinspect: error: no DCP stream of vbucket 9 in the capture" in capsys.readouterr().err
    assert run("lag", path, "--top", "0", "--no-progress")[0] == 2
    assert "dcpinspect: error: --top 0: give 1 or more" in capsys.readouterr().err
    assert run("lag", path, "--vbucket", "70000", "--no-progress")[0] == 2
    assert "a vbucket is 0-65535" in capsys.readouterr().err
    assert run("lag", "/nonexistent.pcap", "--no-progress")[0] == 1
    assert "dcpinspect: error: /nonexistent.pcap" in capsys.readouterr().err
    assert run("lag", path, "--top", "x")[0] == 2


def test_consumer_names_are_escaped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pcapfactory import Conn, Msg, write_capture
    from producerpeer import stream_extras

    from dcpinspect import encode

    msgs = [
        Msg("c2s", encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key="bad\x1b[31mname", opaque=1)),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=1)),
        Msg("c2s", encode("DCP_STREAM_REQ", extras=stream_extras(start=0), vbucket=0, opaque=0x10)),
        Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=0x10, value=[(0xAB, 0)])),
        Msg("s2c", encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 3, "flags": 1}, opaque=0x10)),
    ]
    path = tmp_path / "esc.pcap"
    write_capture(path, [Conn(msgs=msgs)])
    code, out = run("lag", str(path), "--no-progress")
    assert code == 0 and "\x1b" not in out and "bad" in out
    assert out.splitlines()[2].split()[1:4] == ["1", "0", "3"]  # conn 1, vbucket 0, three items behind


def test_a_failed_input_exits_1_after_the_rest(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nosuch.pcap"
    code, out = run("lag", "--no-progress", str(CAPTURES / "live-plain.pcap"), str(missing))
    err = capsys.readouterr().err
    assert code == 1 and out.startswith("== lag: the 4 series furthest behind, of 4")
    line = next(line for line in err.splitlines() if "nosuch.pcap" in line)
    assert "cannot open: No such file or directory" in line and line.count(str(missing)) == 1 and "Traceback" not in err
