"""``analyze`` on a real standalone cluster, and the command's edges: exit statuses, one-line errors, a quiet start.

The cluster is Spark's own: a master and a worker (one core, 1 GiB) started
from the installed pyspark's ``bin/spark-class`` on 127.0.0.1, each on ports
it picks itself (port 0) and announces in its log - the fixture waits on
those log lines, never on a sleep.  The worker's executors run in their own
working directory, so the README's relative paths (``captures/*.pcap``)
only work if the driver resolves them (:func:`dcpinspect.spark.session.expand_paths`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import CAPTURES, ROOT
from pcapfactory import write_bad_files

pyspark = pytest.importorskip("pyspark")
if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
    pytest.skip("Spark needs Java 17: no java found", allow_module_level=True)

SHIPPED = sorted(p.relative_to(ROOT).as_posix() for p in CAPTURES.glob("*.pcap"))
START_TIMEOUT = 120.0  # a bound on a daemon's start, not a synchronisation: the log line is waited on
NOISE = ("Using incubator modules", "Setting default log level", "sc.setLogLevel", "NativeCodeLoader", "Setting Spark log level")


class Daemon:
    """A Spark daemon (master or worker) in its own process group; its log read by a thread and matched against patterns."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("w") as f:
            for line in self.proc.stdout:
                f.write(line)
                f.flush()
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # EOF
            self._changed.notify_all()

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first log line matching ``pattern``; fails (with the log) when the daemon exits or does not say it in time."""
        rx = re.compile(pattern)
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if line == "":
                        pytest.fail(f"{self.log.name}: exited before {pattern!r}:\n{''.join(self.lines)[-3000:]}")
                    if m := rx.search(line):
                        return m
                seen = len(self.lines)
                if not self._changed.wait(START_TIMEOUT):
                    pytest.fail(f"{self.log.name}: no {pattern!r} in {START_TIMEOUT:g} s:\n{''.join(self.lines)[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to the process group (spark-class execs java), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and one worker on 127.0.0.1: the master's ``spark://`` URL."""
    tmp = tmp_path_factory.mktemp("cluster")
    home = Path(pyspark.__file__).parent
    spark_class = str(home / "bin" / "spark-class")
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp),
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # its REST server has a fixed port (6066)
    }
    daemons: list[Daemon] = []
    try:
        master = Daemon(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            env,
            tmp / "master.log",
        )
        daemons.append(master)
        url = master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
        master.wait_for(r"New state: ALIVE")
        worker = Daemon(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(tmp / "work"),
            ],
            env,
            tmp / "worker.log",
        )
        daemons.append(worker)
        worker.wait_for(r"Successfully registered with master")
        yield url
    finally:
        for d in reversed(daemons):
            d.stop()


def dcpinspect(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``dcpinspect ARGS`` as a user runs it, from ``cwd`` (the checkout: the README's relative paths)."""
    return subprocess.run(
        [sys.executable, "-m", "dcpinspect", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def single_process_frames(paths: list[str]) -> int:
    from dcpinspect.tables.export import frames_table

    return frames_table([str(ROOT / p) for p in paths]).num_rows


def parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.read_table(path).num_rows


@pytest.mark.spark
def test_analyze_on_a_standalone_cluster_with_relative_paths(cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "analysis"
    proc = dcpinspect("analyze", *SHIPPED, "--master", cluster, "--out", str(out), "--no-report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = single_process_frames(SHIPPED)
    assert want > 0
    assert f"{len(SHIPPED)} files," in proc.stdout
    assert f" {want} frames," in proc.stdout, proc.stdout
    assert parquet_rows(out / "frames") == want
    assert "error" not in proc.stdout, proc.stdout


@pytest.mark.spark
def test_analyze_local_session_starts_quietly(tmp_path: Path) -> None:
    proc = dcpinspect("analyze", SHIPPED[0], "--out", str(tmp_path / "o"), "--no-report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    noisy = [line for line in proc.stderr.splitlines() if any(n in line for n in NOISE)]
    assert noisy == [], proc.stderr
    assert proc.stderr == "", proc.stderr


@pytest.mark.spark
def test_analyze_with_some_inputs_failed_writes_the_rest_and_exits_1(tmp_path: Path) -> None:
    bad = write_bad_files(tmp_path / "bad")["text"]
    out = tmp_path / "o"
    proc = dcpinspect("analyze", SHIPPED[0], str(bad), "--out", str(out), "--no-report")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "dcpinspect: error: 1 of 2 input files could not be read"
    assert parquet_rows(out / "frames") == single_process_frames(SHIPPED[:1])
    line = next(ln for ln in proc.stdout.splitlines() if str(bad) in ln)
    assert line.startswith(f"  {bad}: error: ")
    assert line.count(str(bad)) == 1  # the file is named once


def test_analyze_on_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = dcpinspect("analyze", "captures/no-such.pcap", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert proc.stderr == "dcpinspect: error: cannot open captures/no-such.pcap: no such file\n"
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_analyze_out_being_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "taken"
    f.write_text("mine")
    proc = dcpinspect("analyze", SHIPPED[0], "--out", str(f))
    assert proc.returncode == 2
    assert proc.stderr == f"dcpinspect: error: --out {f}: exists and is not a directory\n"
    assert f.read_text() == "mine"


def test_expand_paths_resolves_local_paths_on_the_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dcpinspect.spark.session import expand_paths

    monkeypatch.chdir(ROOT)
    got = expand_paths(["captures/*.pcap", "captures", SHIPPED[0], "hdfs://nn/x.pcap"])
    assert all(os.path.isabs(p) for p in got[:-1])
    assert got[-1] == "hdfs://nn/x.pcap"
    assert got[: len(SHIPPED)] == [str(ROOT / p) for p in SHIPPED]
    assert got[-2] == str(ROOT / SHIPPED[0])


def test_expand_paths_reads_a_directorys_captures_gzipped_too(tmp_path: Path) -> None:
    from dcpinspect.spark.session import expand_paths

    for name in ("b.pcap", "a.pcapng.gz", "notes.txt", "c.cap"):
        (tmp_path / name).write_bytes(b"")
    assert expand_paths([str(tmp_path)]) == [str(tmp_path / n) for n in ("a.pcapng.gz", "b.pcap", "c.cap")]
