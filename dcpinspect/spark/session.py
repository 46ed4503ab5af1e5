"""The Spark session and the inputs: Java, a local, submitted or Spark Connect session, capture paths, file systems.

Rules:

1. Imports neither pyspark nor pyarrow until a function needs them (the base
   install has no pyspark: see :mod:`dcpinspect.cli.extras`).
2. Local paths, globs and directories are resolved on the driver, to
   absolute paths (:func:`expand_paths`): a cluster's executors run in
   working directories of their own.  URIs pass through.
3. A JVM this module starts is quiet: Spark logs errors only
   (``log4j2.properties``, Spark's loggers included, so the shell's
   "Setting default log level" banner is not printed either), and the one
   line the JVM itself always prints for the incubator module Spark's
   launcher adds is filtered out of its stderr (:data:`JVM_NOISE`); every
   other line of it reaches our stderr.
4. A Spark Connect server answers within the connect timeout, or the
   caller gets one line saying why.
"""

from __future__ import annotations

import contextlib
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
    submitted = "spark.master" in _submit_conf()
    n = cores or os.cpu_count() or 2
    conf = {
        "spark.app.name": "dcpinspect",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(max(4, 4 * n)),  # the frames stage: tasks of a connection or two balance the cores
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
        "spark.driver.memory": memory,
        "spark.python.worker.reuse": "true",
        "spark.sql.session.timeZone": "UTC",
    }
    if master or not submitted:
        conf["spark.master"] = master or f"local[{cores or '*'}]"
    if submitted:
        conf["spark.log.level"] = "ERROR"  # spark-submit's JVM is up already: its log4j configuration stands
    else:
        # our own JVM: bind to loopback; log errors only, from the JVM's start (log4j2.properties); and only the
        # JVM's quick compiler - the JVM mostly moves Arrow batches here, and its optimising compiler cost more
        # CPU (3-4 s of a 2-core run) than it gave back
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        log4j = Path(__file__).with_name("log4j2.properties")
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={log4j.as_uri()} -XX:TieredStopAtLevel=1"
        if _start_quiet_context(conf):
            return SparkSession.builder.getOrCreate()  # takes the context just started, its configuration whole
    b = SparkSession.builder
    for k, v in conf.items():
        b = b.config(k, v)
    return b.getOrCreate()


#: lines of the JVM's stderr that say nothing to a user: Spark's launcher always adds
#: ``--add-modules=jdk.incubator.vector`` and the JVM then always prints this (no JVM option turns it off)
JVM_NOISE = (b"WARNING: Using incubator modules:",)


def _start_quiet_context(conf: dict[str, str]) -> bool:
    """Start the driver JVM with its stderr through :func:`_forward_stderr` (pyspark's ``popen_kwargs``), and its SparkContext.

    False (and nothing started) when a JVM is up already: a stopped context's, which Spark reuses.
    """
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or SparkContext._active_spark_context is not None:
        return False
    sc_conf = SparkConf().setAll(list(conf.items()))
    r, w = os.pipe()
    threading.Thread(target=_forward_stderr, args=(r,), name="dcpinspect-spark-stderr", daemon=True).start()
    try:
        gateway = launch_gateway(sc_conf, popen_kwargs={"stderr": w})
    finally:
        os.close(w)  # the JVM (and the Python workers it forks) hold the write end now
    SparkContext(conf=sc_conf, gateway=gateway)
    return True


def _forward_stderr(fd: int) -> None:
    """Copy the JVM's stderr to ours line by line, less :data:`JVM_NOISE`, until the JVM and its children close it."""
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:
            if not line.startswith(JVM_NOISE):
                with contextlib.suppress(OSError):  # our stderr is gone: keep draining, or the JVM would block on a full pipe
                    os.write(2, line)


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


#: the names of a directory's files that are read as captures (gzip'ed ones too)
CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz", ".cap.gz")


def expand_paths(paths: Iterable[str]) -> list[str]:
    """Globs and directories to capture files, in order (each glob sorted; a directory's files sorted), local ones absolute.

    Paths are resolved here, on the driver: a cluster's executors run in
    their own working directories, where ``captures/x.pcap`` names nothing.
    URIs (``scheme://...``) pass through as given.
    """
    out: list[str] = []
    for item in paths:
        p = str(item)
        if "://" in p:
            out.append(p)
        elif any(ch in p for ch in "*?["):
            out += sorted(os.path.abspath(q) for q in _glob.glob(p) if Path(q).is_file())
        elif Path(p).is_dir():
            out += sorted(os.path.abspath(q) for q in Path(p).iterdir() if q.is_file() and q.name.endswith(CAPTURE_SUFFIXES))
        else:
            out.append(os.path.abspath(p))
    return out


def filesystem(path: str) -> tuple[Any, str]:
    """The ``pyarrow.fs`` file system of ``path`` (a local path or any URI it opens) and the path within it."""
    from pyarrow import fs

    if "://" in path:
        return fs.FileSystem.from_uri(path)
    return fs.LocalFileSystem(), str(Path(path).absolute())


def files_frame(spark: Any, paths: Iterable[str]) -> Any:
    """One row per input file: ``file_index``, ``path`` (after :func:`expand_paths`: local paths absolute)."""
    files = expand_paths(paths)
    if len(files) >= 1 << 20:
        raise ValueError("at most 2^20 files per run")
    return spark.createDataFrame([(i, p) for i, p in enumerate(files)], "file_index int, path string")
