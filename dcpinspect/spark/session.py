"""The Spark session and the inputs: Java, a local, submitted or Spark Connect session, capture paths, file systems.

Imports neither pyspark nor pyarrow until a function needs them.
"""

from __future__ import annotations

import glob as _glob
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "ConnectTimeout",
    "check_java",
    "connect_endpoint",
    "expand_paths",
    "files_frame",
    "filesystem",
    "get_session",
]


def check_java() -> str:
    """The ``java`` on the path (JAVA_HOME first), or a clear error when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if not java:
        raise RuntimeError("Spark needs Java 17 or later: no 'java' found (install a JRE, e.g. apt-get install openjdk-17-jre-headless)")
    return java


DEFAULT_CONNECT_TIMEOUT = 30.0  # seconds a Spark Connect server has to answer before analyze gives up


def get_session(
    remote: str | None = None,
    *,
    master: str | None = None,
    cores: int | None = None,
    memory: str = "2g",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> Any:
    """A SparkSession: Spark Connect (``remote`` or ``SPARK_REMOTE``), an existing one, or a quiet local one.

    Under ``spark-submit --master ...`` the master given there is kept; otherwise a
    local session starts (``local[cores]``, ``local[*]`` by default) with no UI,
    Arrow on, a few shuffle partitions, and workers on this interpreter
    (``PYSPARK_PYTHON``), where the package is installed.  A Spark Connect
    server must answer within ``connect_timeout`` seconds, or this raises
    :class:`RuntimeError` with one line saying why (Spark's own client would
    retry for about ten minutes).
    """
    from pyspark.sql import SparkSession

    remote = remote or os.environ.get("SPARK_REMOTE")
    if remote and remote.startswith("sc://"):
        return _connect_session(remote, connect_timeout)
    if remote:  # "local[N]": Spark starts a Connect server in this process
        return SparkSession.builder.remote(remote).getOrCreate()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    b = SparkSession.builder.appName("dcpinspect")
    submitted = "spark.master" in _submit_conf()
    if master:
        b = b.master(master)
    elif not submitted:
        b = b.master(f"local[{cores or '*'}]")
    n = cores or os.cpu_count() or 2
    if not submitted:
        # a local session: bind to loopback; log errors only from the JVM's start; and only the JVM's quick
        # compiler - the JVM mostly moves Arrow batches here, and its optimising compiler cost more CPU
        # (3-4 s of a 2-core run) than it gave back
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        log4j = Path(__file__).with_name("log4j2.properties")
        b = b.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j.as_uri()} -XX:TieredStopAtLevel=1")
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(max(4, 4 * n)),  # the frames stage: tasks of a connection or two balance the cores
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
        "spark.driver.memory": memory,
        "spark.python.worker.reuse": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.log.level": "ERROR",
    }
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    return spark


def connect_endpoint(url: str) -> tuple[str, int]:
    """The host and port of a Spark Connect URL (``sc://host[:port][/;params]``; port 15002 by default)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "sc" or not parts.netloc:
        raise RuntimeError(f"not a Spark Connect URL (sc://host:port): {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise RuntimeError(f"bad port in Spark Connect URL {url!r}") from None
    return parts.hostname or "localhost", port if port is not None else 15002


class ConnectTimeout(RuntimeError):
    """A Spark Connect server took the connection but did not answer in time (its client's threads may still be waiting)."""


def _connect_session(url: str, timeout: float) -> Any:
    """A Spark Connect session whose server answered within ``timeout`` seconds, or a one-line RuntimeError."""
    import socket
    import threading

    from pyspark.sql import SparkSession

    host, port = connect_endpoint(url)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise RuntimeError(f"cannot reach the Spark Connect server at {host}:{port}: {reason}") from None
    result: dict[str, Any] = {}
    done = threading.Event()

    def probe() -> None:
        try:
            spark = SparkSession.builder.remote(url).getOrCreate()
            spark.version  # noqa: B018 - the first call that needs the server
            result["spark"] = spark
        except Exception as exc:  # reported on the caller's thread
            result["error"] = exc
        finally:
            done.set()

    threading.Thread(target=probe, name="dcpinspect-spark-connect", daemon=True).start()
    if not done.wait(timeout):
        raise ConnectTimeout(f"the Spark Connect server at {host}:{port} did not answer within {timeout:g} s")
    if "error" in result:
        first = (str(result["error"]).strip().splitlines() or [type(result["error"]).__name__])[0]
        raise RuntimeError(f"Spark Connect server at {host}:{port}: {first}")
    return result["spark"]


def _submit_conf() -> dict[str, str]:
    """``--conf``/``--master`` given to ``spark-submit`` (passed to Python as PYSPARK_SUBMIT_ARGS or spark.* properties)."""
    out: dict[str, str] = {}
    args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if "--master" in args:
        out["spark.master"] = args.split("--master", 1)[1].split()[0]
    if os.environ.get("SPARK_ENV_LOADED") and os.environ.get("MASTER"):
        out["spark.master"] = os.environ["MASTER"]
    if os.environ.get("PYSPARK_GATEWAY_PORT") and "spark.master" not in out:
        out["spark.master"] = ""  # a JVM started by spark-submit: its --master (or default) stands
    return out


def expand_paths(paths: Iterable[str]) -> list[str]:
    """Globs and directories to capture files, in order (each glob sorted; a directory's files sorted)."""
    out: list[str] = []
    for item in paths:
        p = str(item)
        if "://" in p:
            out.append(p)
        elif any(ch in p for ch in "*?["):
            out += sorted(q for q in _glob.glob(p) if Path(q).is_file())
        elif Path(p).is_dir():
            out += sorted(str(q) for q in Path(p).iterdir() if q.is_file() and q.suffix in (".pcap", ".pcapng", ".cap"))
        else:
            out.append(p)
    return out


def filesystem(path: str) -> tuple[Any, str]:
    """The ``pyarrow.fs`` file system of ``path`` (a local path or any URI it opens) and the path within it."""
    from pyarrow import fs

    if "://" in path:
        return fs.FileSystem.from_uri(path)
    return fs.LocalFileSystem(), str(Path(path).absolute())


def files_frame(spark: Any, paths: Iterable[str]) -> Any:
    """One row per input file: ``file_index``, ``path`` (as given, after glob expansion)."""
    files = expand_paths(paths)
    if len(files) >= 1 << 20:
        raise ValueError("at most 2^20 files per run")
    return spark.createDataFrame([(i, p) for i, p in enumerate(files)], "file_index int, path string")
