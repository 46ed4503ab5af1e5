"""``analyze``'s edges that need no Spark job: the output directory it may write, and an unreachable Spark Connect server."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from paths import CAPTURES

from dcpinspect.cli.main import main as cli_main
from dcpinspect.spark.analysis import MANIFEST, OutputError, analyze_outputs, finish_output, prepare_output
from dcpinspect.spark.session import connect_endpoint

pytestmark = pytest.mark.spark
CAPTURE = str(CAPTURES / "seed-000-rollback-retry.pcap")
ENTRIES = analyze_outputs(items=False, report=True)


def test_a_missing_or_empty_directory_is_created_and_claimed(tmp_path: Path) -> None:
    for out in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        prepare_output(str(out), ENTRIES)
        manifest = json.loads((out / MANIFEST).read_text())
        assert manifest == {"tool": "dcpinspect analyze", "complete": False, "entries": ENTRIES}
        finish_output(str(out), ENTRIES, {"frames": 4})
        assert json.loads((out / MANIFEST).read_text())["complete"] is True


def test_a_foreign_non_empty_directory_is_refused_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "o"
    (out / "frames").mkdir(parents=True)
    (out / "frames" / "mine.txt").write_text("precious")
    with pytest.raises(OutputError, match=r"not empty and holds no earlier analyze output"):
        prepare_output(str(out), ENTRIES)
    assert (out / "frames" / "mine.txt").read_text() == "precious"
    assert not (out / MANIFEST).exists()


def test_an_earlier_output_is_replaced_but_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "o"
    prepare_output(str(out), [*ENTRIES, "items", "flow"])
    for name in ("frames", "streams", "items"):
        (out / name).mkdir()
        (out / name / "part-0.parquet").write_bytes(b"old")
    (out / "mine").mkdir()
    (out / "mine" / "notes.txt").write_text("keep")
    (out / "notes.txt").write_text("keep too")
    prepare_output(str(out), ENTRIES)
    # every entry the earlier run wrote is gone (its stale items table too); the user's files stay
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, "mine", "notes.txt"])
    assert (out / "mine" / "notes.txt").read_text() == "keep"


def test_an_entry_the_manifest_does_not_list_needs_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "o"
    prepare_output(str(out), ENTRIES)
    (out / "items").mkdir()
    (out / "items" / "mine.txt").write_text("precious")
    with pytest.raises(OutputError, match=r"items was not written by analyze; give --overwrite"):
        prepare_output(str(out), [*ENTRIES, "items"])
    assert (out / "items" / "mine.txt").exists()
    prepare_output(str(out), [*ENTRIES, "items"], overwrite=True)
    assert not (out / "items").exists()


def test_a_symlinked_entry_is_unlinked_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.txt").write_text("keep")
    out = tmp_path / "o"
    prepare_output(str(out), ENTRIES)
    (out / "streams").symlink_to(elsewhere, target_is_directory=True)
    prepare_output(str(out), ENTRIES)
    assert not (out / "streams").exists()
    assert (elsewhere / "data.txt").read_text() == "keep"


def test_overwrite_replaces_named_entries_in_a_foreign_directory(tmp_path: Path) -> None:
    out = tmp_path / "o"
    (out / "frames").mkdir(parents=True)
    (out / "keep").mkdir()
    prepare_output(str(out), ENTRIES, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, "keep"])


def test_a_file_or_a_broken_manifest_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(OutputError, match=r"exists and is not a directory"):
        prepare_output(str(f), ENTRIES)
    out = tmp_path / "o"
    out.mkdir()
    (out / MANIFEST).write_text("{not json")
    with pytest.raises(OutputError, match=r"unreadable"):
        prepare_output(str(out), ENTRIES)


def test_the_command_refuses_before_spark_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    (out / "frames").mkdir(parents=True)
    (out / "frames" / "mine.txt").write_text("precious")
    assert cli_main(["analyze", CAPTURE, "--out", str(out)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dcpinspect: error: --out ")
    assert "Traceback" not in err
    assert (out / "frames" / "mine.txt").exists()
    f = tmp_path / "afile"
    f.write_text("x")
    assert cli_main(["analyze", CAPTURE, "--out", str(f)], out=io.StringIO()) == 2
    assert "not a directory" in capsys.readouterr().err


def test_connect_urls() -> None:
    assert connect_endpoint("sc://127.0.0.1:15002") == ("127.0.0.1", 15002)
    assert connect_endpoint("sc://host") == ("host", 15002)
    assert connect_endpoint("sc://[::1]:99/;token=x") == ("::1", 99)
    for bad in ("http://h:1", "sc://h:port", "sc://"):
        with pytest.raises(RuntimeError):
            connect_endpoint(bad)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _analyze_remote(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("SPARK_REMOTE", None)
    return subprocess.run(
        [sys.executable, "-m", "dcpinspect", "analyze", CAPTURE, "--out", str(out), "--remote", url, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a safety net only: the command must end by itself
        check=False,
    )


def test_analyze_remote_with_no_server_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _analyze_remote(f"sc://127.0.0.1:{_free_port()}", tmp_path / "o")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("dcpinspect: error: cannot reach the Spark Connect server at 127.0.0.1:")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_analyze_remote_with_a_silent_server_gives_up_after_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as silent:  # takes connections (the kernel's backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        proc = _analyze_remote(f"sc://127.0.0.1:{port}", tmp_path / "o", "--connect-timeout", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"dcpinspect: error: the Spark Connect server at 127.0.0.1:{port} did not answer within 1 s"
