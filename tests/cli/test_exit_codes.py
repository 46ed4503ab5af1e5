"""Exit codes and one-line errors of the capture commands: failed inputs, unknown selections, output files that cannot be written."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from clirun import run
from paths import CAPTURES

from dcpinspect.tables.columns import COLUMN_NAMES

GOOD = CAPTURES / "dcp-session.pcap"


def _empty_pcap(path: Path) -> Path:
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["frames"],
        ["show"],
        ["summary"],
        ["timeline"],
        ["follow", "--conn", "1"],
        ["stats"],
    ],
)
def test_a_failed_input_exits_1_after_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    missing = tmp_path / "nosuch.pcap"
    code, out = run(*command, "--no-progress", str(GOOD), str(missing))
    err = capsys.readouterr().err
    assert code == 1
    assert out.strip(), "the readable file was still processed"
    line = next(line for line in (err + out).splitlines() if "nosuch.pcap" in line)
    assert "cannot open: No such file or directory" in line and "byte offset" not in line
    assert line.count(str(missing)) == 1, "the file is named once"
    assert "Traceback" not in err


def test_every_input_good_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["frames"], ["summary"], ["timeline"], ["stats"], ["follow", "--conn", "1"]):
        assert run(*command, "--no-progress", str(GOOD))[0] == 0, command
    assert capsys.readouterr().err == ""


def test_show_an_unknown_frame(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run("show", "--no-progress", str(GOOD), "--frame", "1", "--frame", "9999")
    err = capsys.readouterr().err
    assert code == 1 and "== frame 1 " in out
    assert err.strip() == "dcpinspect: error: no frame 9999 shown (the capture has 25 frames)"


def test_show_an_unknown_opcode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run("show", "--no-progress", str(GOOD), "--opcode", "NOSUCH")
    err = capsys.readouterr().err
    assert code == 2 and out == ""
    assert err.startswith("dcpinspect: error: unknown command name NOSUCH") and len(err.splitlines()) == 1


def test_show_an_opcode_not_in_the_capture(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run("show", "--no-progress", str(GOOD), "--opcode", "DCP_EXPIRATION")
    assert code == 1 and out == ""
    assert capsys.readouterr().err.strip() == "dcpinspect: error: no frame matches the selection"


def test_show_an_unknown_connection(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run("show", "--no-progress", str(GOOD), "--conn", "7")
    assert code == 1 and out == ""
    assert "no connection 7 (the capture has 1 connection)" in capsys.readouterr().err


def test_show_an_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a capture\n")
    code, out = run("show", "--no-progress", str(notes))
    err = capsys.readouterr().err
    assert code == 1 and out == ""
    assert err.strip() == f"dcpinspect: error: {notes}: not a pcap or pcapng capture (starts with 6e6f7420) (at byte offset 0)"


def test_summary_names_a_failed_file_once(tmp_path: Path) -> None:
    missing = tmp_path / "gone.pcap"
    code, out = run("summary", "--no-progress", str(GOOD), str(missing))
    assert code == 1
    assert f"  {missing}: cannot open: No such file or directory\n" in out


@pytest.mark.parametrize("flag", ["--parquet", "--csv"])
def test_an_unwritable_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    for target in (tmp_path / "no" / "such" / "dir" / "out", tmp_path):  # a missing directory; a directory
        code, _out = run("frames", "--no-progress", str(GOOD), flag, str(target))
        err = capsys.readouterr().err
        assert code == 2, (flag, target)
        assert len(err.splitlines()) == 1 and err.startswith(f"dcpinspect: error: cannot write {target}: "), err
        assert "Traceback" not in err


def test_parquet_of_a_capture_without_frames_is_a_valid_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = _empty_pcap(tmp_path / "empty.pcap")
    out = tmp_path / "frames.parquet"
    assert run("frames", "--no-progress", str(empty), "--parquet", str(out))[0] == 0
    table = pq.read_table(out)
    assert table.num_rows == 0 and tuple(table.column_names) == COLUMN_NAMES
    assert "wrote 0 rows" in capsys.readouterr().err


def test_csv_of_a_capture_without_frames_has_the_header(tmp_path: Path) -> None:
    empty = _empty_pcap(tmp_path / "empty.pcap")
    out = tmp_path / "frames.csv"
    assert run("frames", "--no-progress", str(empty), "--csv", str(out))[0] == 0
    assert out.read_text().splitlines() == [",".join(f'"{c}"' for c in COLUMN_NAMES)]


def test_follow_and_stats_on_unreadable_input_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "x.pcap")
    assert run("follow", "--no-progress", missing, "--conn", "1")[0] == 1
    assert run("stats", "--no-progress", missing)[0] == 1
    err = capsys.readouterr().err
    assert err.count("cannot open") == 2 and "Traceback" not in err
