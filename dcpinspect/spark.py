"""The data pipeline on Spark: captures -> segments -> frames (an edge: imports pyspark lazily).

Thin glue over the core - no second decoder.  Each stage is a function from
DataFrame to DataFrame:

1. :func:`split`: each file into record-aligned byte ranges (pcap: record
   headers walked; pcapng: blocks walked), so one big file is read by many
   tasks.  Each range carries the file's header bytes (pcap global header;
   pcapng section header and interface blocks) so the core's
   :class:`~dcpinspect.capture.CaptureReader` reads it as a capture of its own.
2. :func:`segments`: the TCP segments of each range through the core's
   ``CaptureReader`` and :func:`~dcpinspect.packets.locate_segment` - small
   metadata columns (file index, packet number, time, endpoints, sequence
   number, flags) and the payload's byte offset and length in its file, not
   the payload.  Per-range status rows (format, error, problems) travel along.
3. :func:`frames`: repartition by connection, sort within partitions by
   capture position, and ``mapInArrow``: each task reads payload bytes straight
   from the files (``pyarrow.fs``, so cluster storage works the same) through a
   bounded window, runs the core's reassembler, decoder and context
   (:func:`~dcpinspect.records.iter_chunks`) and emits the frames table with
   :func:`~dcpinspect.batches.chunk_batch`.  Frame and connection numbers are
   global (the single-process numbering) from the start: a keys pass over the
   same sorted metadata first counts the records each capture position
   completes (a small table, collected), and - for the timelines - builds each
   connection's timeline on the way (stage 4 costs no decode of its own).

Spark types: uint64 columns are ``decimal(20,0)``, uint32 ``long``, uint16
``int``, uint8 ``short``; timestamps are Spark timestamps (microseconds).
"""

from __future__ import annotations

import argparse
import glob as _glob
import os
import shutil
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from operator import itemgetter
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import spec
from .batches import SCHEMA, chunk_batch
from .capture import _PCAP_MAGICS, _PCAPNG_SHB, MAX_RECORD, CaptureError, CaptureReader, time_problem
from .columns import FRAME_COLUMNS
from .decoder import Frame
from .flows import DEFAULT_SERVER_PORTS, TLS_PORTS, Segment
from .packets import locate_segment
from .records import CaptureStats, Record, RecordChunk, gc_paused, iter_chunks

__all__ = [
    "DEFAULT_SPLIT_SIZE",
    "TIMELINE_TABLES",
    "Numbering",
    "Pipeline",
    "analyze",
    "arrow_for_spark",
    "by_connection",
    "collect_keys",
    "command",
    "file_status",
    "files_frame",
    "frames",
    "get_session",
    "keys_pass",
    "merge_timelines",
    "register_data_source",
    "segments",
    "split",
    "timelines",
    "write_frames",
]

DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024
GPOS_SHIFT = 40  # capture position: file index << 40 | packet number
CLOSE_BASE = 1 << 61  # records emitted at the end of the capture sort after every packet
WINDOW = 256 * 1024  # payload bytes read at once per file in a frames task

# --------------------------------------------------------------------------- session


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
        "spark.sql.shuffle.partitions": str(max(2, 2 * n)),
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


# --------------------------------------------------------------------------- inputs


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


def _fs(path: str) -> tuple[Any, str]:
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


# --------------------------------------------------------------------------- stage 1: split

_RANGE_SCHEMA = pa.schema(
    [
        ("file_index", pa.int32()),
        ("path", pa.string()),
        ("range_index", pa.int32()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("first_packet", pa.int64()),
        ("prefix", pa.binary()),
    ]
)
RANGE_DDL = "file_index int, path string, range_index int, start long, end long, first_packet long, prefix binary"


class _Blocks:
    """Random reads through a bounded buffer (headers are walked, payloads skipped)."""

    def __init__(self, f: Any, size: int, block: int = 1 << 20) -> None:
        self.f, self.size, self.block = f, size, block
        self.lo, self.buf = 0, b""

    def get(self, pos: int, n: int) -> bytes:
        if not (self.lo <= pos and pos + n <= self.lo + len(self.buf)):
            self.lo = pos
            self.buf = self.f.read_at(max(n, self.block), pos)
        return self.buf[pos - self.lo : pos - self.lo + n]


def split_file(path: str, split_size: int) -> list[tuple[int, int, int, bytes]]:
    """``(start, end, first_packet, prefix)`` ranges of one file, cut at record boundaries.

    The walk stops at the first record that looks wrong (the core reader, reading
    the last range, reports it exactly); a file that is not a readable capture
    is one range from byte 0.
    """
    fs, p = _fs(path)
    try:
        f = fs.open_input_file(p)
    except (OSError, FileNotFoundError):
        return [(0, 0, 1, b"")]
    with f:
        size = f.size()
        whole = [(0, size, 1, b"")]
        b = _Blocks(f, size)
        head = b.get(0, 4)
        if head in _PCAP_MAGICS:
            return _split_pcap(b, size, head, split_size) or whole
        if head == _PCAPNG_SHB:
            return _split_pcapng(b, size, split_size) or whole
        return whole


def _split_pcap(b: _Blocks, size: int, magic: bytes, split_size: int) -> list[tuple[int, int, int, bytes]]:
    endian, _ns = _PCAP_MAGICS[magic]
    hdr = b.get(0, 24)
    if len(hdr) < 24:
        return []
    vmaj, _vmin, _tz, _sig, snaplen, _lt = struct.unpack(endian + "HHiIII", hdr[4:])
    if vmaj != 2:
        return []
    limit = max(snaplen, 262_144) if 0 < snaplen <= MAX_RECORD else MAX_RECORD
    rec = struct.Struct(endian + "IIII")
    out: list[tuple[int, int, int, bytes]] = []
    start, first, pos, number = 24, 1, 24, 0
    while pos + 16 <= size:
        _s, _f, caplen, wirelen = rec.unpack(b.get(pos, 16))
        if caplen > limit or (wirelen and caplen > wirelen and caplen > snaplen) or pos + 16 + caplen > size:
            break
        if pos - start >= split_size:
            out.append((start, pos, first, hdr))
            start, first = pos, number + 1
        number += 1
        pos += 16 + caplen
    out.append((start, size, first, hdr))
    return out


def _split_pcapng(b: _Blocks, size: int, split_size: int) -> list[tuple[int, int, int, bytes]]:
    out: list[tuple[int, int, int, bytes]] = []
    endian = "<"
    prefix: list[bytes] = []  # the section header and interface blocks in force
    ifaces = 0
    start, first, pos, number, head = 0, 1, 0, 0, b""
    while pos + 12 <= size:
        h = b.get(pos, 12)
        if h[:4] == _PCAPNG_SHB:
            bom = h[8:12]
            if bom not in (b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d"):
                break
            endian = "<" if bom == b"\x4d\x3c\x2b\x1a" else ">"
        btype, blen = struct.unpack(endian + "II", h[:8])
        if blen < 12 or blen % 4 or blen > MAX_RECORD or pos + blen > size:
            break
        if struct.unpack(endian + "I", b.get(pos + blen - 4, 4))[0] != blen:
            break
        if btype == 0x0A0D0D0A:
            prefix, ifaces = [b.get(pos, blen)], 0
        elif btype == 1:
            prefix.append(b.get(pos, blen))
            ifaces += 1
        elif btype in (6, 2) and blen - 12 >= 20:
            body = b.get(pos + 8, 20)
            iid = struct.unpack(endian + ("H" if btype == 2 else "I"), body[: 2 if btype == 2 else 4])[0]
            caplen = struct.unpack(endian + "I", body[12:16])[0]
            if iid >= ifaces or caplen > blen - 12 - 20:
                break
            if pos - start >= split_size:
                out.append((start, pos, first, head))
                start, first, head = pos, number + 1, b"".join(prefix)
            number += 1
        elif btype == 3 and blen - 12 >= 4 and ifaces:
            number += 1
        pos += blen
    out.append((start, size, first, head))
    return out


def split(files: Any, split_size: int = DEFAULT_SPLIT_SIZE) -> Any:
    """Stage 1: files (``file_index``, ``path``) -> record-aligned byte ranges (one row each)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            cols: dict[str, list[Any]] = {f.name: [] for f in _RANGE_SCHEMA}
            for fi, path in zip(batch.column("file_index").to_pylist(), batch.column("path").to_pylist(), strict=True):
                for ri, (start, end, first, prefix) in enumerate(split_file(path, split_size)):
                    for k, v in zip(_RANGE_SCHEMA.names, (fi, path, ri, start, end, first, prefix), strict=True):
                        cols[k].append(v)
            yield pa.RecordBatch.from_pydict(cols, schema=_RANGE_SCHEMA)

    return files.mapInArrow(run, RANGE_DDL)


# --------------------------------------------------------------------------- stage 2: segments

_SEG_FIELDS = [
    (
        "kind",
        pa.int8(),
    ),  # 0 segment, 1 range status, 2 a connection's summary in a range (weight in ``missing``, segments in ``packets``, its last ``gpos`` and ``ts``)
    ("file_index", pa.int32()),
    ("path", pa.string()),
    ("gpos", pa.int64()),  # file_index << 40 | packet number
    ("ckey", pa.string()),  # the connection's 4-tuple, either direction
    ("ts", pa.int64()),
    ("src", pa.string()),
    ("sport", pa.int32()),
    ("dst", pa.string()),
    ("dport", pa.int32()),
    ("seq", pa.int64()),
    ("flags", pa.int32()),
    ("poff", pa.int64()),  # payload offset in the file
    ("plen", pa.int32()),
    ("missing", pa.int64()),
    # range status (kind 1)
    ("range_index", pa.int32()),
    ("format", pa.string()),
    ("error", pa.string()),
    ("problems", pa.list_(pa.string())),
    ("packets", pa.int64()),
    ("linktypes", pa.list_(pa.int32())),
    ("skipped", pa.string()),
]
SEG_SCHEMA = pa.schema(_SEG_FIELDS)
SEG_DDL = (
    "kind byte, file_index int, path string, gpos long, ckey string, ts long, src string, sport int, dst string, dport int, "
    "seq long, flags int, poff long, plen int, missing long, range_index int, format string, error string, "
    "problems array<string>, packets long, linktypes array<int>, skipped string"
)


class _RangeFile:
    """A file-like view: ``prefix`` bytes, then the file's bytes ``[start, end)``, read in blocks."""

    def __init__(self, f: Any, prefix: bytes, start: int, end: int, block: int = 4 << 20) -> None:
        self.f, self.prefix, self.start, self.end, self.block = f, prefix, start, end, block
        self.vpos = 0  # virtual position
        self.buf, self.blo = b"", start
        self.last8 = b""

    def read(self, n: int) -> bytes:
        out = b""
        if self.vpos < len(self.prefix):
            out = self.prefix[self.vpos : self.vpos + n]
            self.vpos += len(out)
            n -= len(out)
            if not n:
                if len(out) == 8:
                    self.last8 = out
                return out
        apos = self.start + self.vpos - len(self.prefix)
        n = min(n, self.end - apos)
        if n <= 0:
            return out
        if not (self.blo <= apos and apos + n <= self.blo + len(self.buf)):
            self.blo = apos
            self.buf = self.f.read_at(min(max(n, self.block), self.end - apos), apos)
        got = self.buf[apos - self.blo : apos - self.blo + n]
        self.vpos += len(got)
        out = out + got if out else got
        if len(out) == 8:
            self.last8 = out
        return out

    def absolute(self, vpos: int) -> int:
        return self.start + vpos - len(self.prefix)


def _read_range(reader: CaptureReader, fh: _RangeFile) -> Iterator[Any]:
    """The core reader's record loop on a range (the dispatch of ``CaptureReader.__iter__``)."""
    head = fh.prefix[:4] if fh.prefix else fh.read(4)
    if fh.prefix:
        fh.vpos = 4
    if head in _PCAP_MAGICS:
        reader.format = "pcap"
        yield from reader._pcap(fh, head)  # type: ignore[arg-type]
    elif head == _PCAPNG_SHB:
        reader.format = "pcapng"
        fh.vpos = 0
        yield from reader._pcapng(fh)  # type: ignore[arg-type]
    elif not head:
        raise CaptureError(reader.path, 0, "empty file: not a pcap or pcapng capture")
    else:
        raise CaptureError(reader.path, 0, f"not a pcap or pcapng capture (starts with {head.hex()})")


def range_segments(file_index: int, path: str, range_index: int, start: int, end: int, first_packet: int, prefix: bytes) -> pa.RecordBatch:
    """Stage 2 for one range: segment metadata rows and one status row."""
    cols: dict[str, list[Any]] = {name: [] for name, _ in _SEG_FIELDS}
    reader = CaptureReader(path)
    reader.packets = first_packet - 1
    skipped: Counter[str] = Counter()
    error = None
    fs, p = _fs(path)
    base = file_index << GPOS_SHIFT
    try:
        f = fs.open_input_file(p)
    except (OSError, FileNotFoundError) as exc:
        f = None
        reason = os.strerror(exc.errno) if isinstance(exc.errno, int) else str(exc)
        error = str(CaptureError(path, 0, f"cannot open: {reason}"))
    if f is not None:
        with f:
            fh = _RangeFile(f, prefix, start, end)
            c_ts, c_src, c_sport, c_dst, c_dport, c_seq, c_flags, c_missing = (
                cols[k] for k in ("ts", "src", "sport", "dst", "dport", "seq", "flags", "missing")
            )
            gpos, ckey, poff, plen = cols["gpos"], cols["ckey"], cols["poff"], cols["plen"]
            keys: dict[tuple[str, int, str, int], str] = {}
            pcap = None
            try:
                for pkt in _read_range(reader, fh):
                    found = locate_segment(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, path, skipped)
                    if found is None:
                        continue
                    seg, _tcp, at = found
                    if pcap is None:
                        pcap = reader.format == "pcap"
                    block = fh.absolute(pkt.offset)
                    if pcap:
                        data_at = block + 16
                    else:
                        simple = fh.last8[:4] in (b"\x03\x00\x00\x00", b"\x00\x00\x00\x03")  # simple packet block
                        data_at = block + (12 if simple else 28)
                    four = (seg.src, seg.sport, seg.dst, seg.dport)
                    ck = keys.get(four)
                    if ck is None:
                        a, b2 = (seg.src, seg.sport), (seg.dst, seg.dport)
                        lo, hi = (a, b2) if a <= b2 else (b2, a)
                        ck = keys[four] = f"{lo[0]}|{lo[1]}|{hi[0]}|{hi[1]}"
                    n = len(seg.payload)
                    gpos.append(base | pkt.number)
                    ckey.append(ck)
                    poff.append(data_at + at)
                    plen.append(n)
                    c_ts.append(seg.ts)
                    c_src.append(seg.src)
                    c_sport.append(seg.sport)
                    c_dst.append(seg.dst)
                    c_dport.append(seg.dport)
                    c_seq.append(seg.seq)
                    c_flags.append(seg.flags)
                    c_missing.append(seg.missing)
            except CaptureError as exc:
                error = str(exc)
    n = len(cols["gpos"])
    for name in ("kind", "file_index", "path", "range_index", "format", "error", "problems", "packets", "linktypes", "skipped"):
        cols[name] += [None] * n
    cols["kind"][:n] = [0] * n
    cols["file_index"][:n] = [file_index] * n
    # one row per connection: its weight here and where it was last seen (for by_connection)
    seen: dict[str, list[int]] = {}
    for ck, g, t, pl in zip(cols["ckey"], cols["gpos"], cols["ts"], cols["plen"], strict=True):
        e = seen.get(ck)
        if e is None:
            seen[ck] = [pl + 64, 1, g, t]
        else:
            e[0] += pl + 64
            e[1] += 1
            e[2], e[3] = g, t
    for ck, (w, k, g, t) in seen.items():
        row = {"kind": 2, "file_index": file_index, "range_index": range_index, "ckey": ck, "missing": w, "packets": k, "gpos": g, "ts": t}
        for name, _ in _SEG_FIELDS:
            cols[name].append(row.get(name))
    # out-of-range packet times are one problem per file: this range's count and first offset travel as numbers (see status_rows)
    late = time_problem(reader.bad_times) if reader.bad_times else None
    abs_problems = _abs_problems(reader, prefix, start)
    late_at = next((off for off, msg in abs_problems if msg == late), None)
    problems = [f"{msg} (at byte offset {fh_abs})" for fh_abs, msg in abs_problems if msg != late]
    status = {
        "kind": 1,
        "file_index": file_index,
        "path": path,
        "range_index": range_index,
        "format": reader.format or None,
        "error": error,
        "problems": problems,
        "packets": reader.packets - (first_packet - 1),
        "linktypes": sorted(reader.linktypes),
        "skipped": ",".join(f"{k}={v}" for k, v in sorted(skipped.items())),
        "missing": reader.bad_times,  # packets with an out-of-range time in this range
        "poff": late_at,  # where the first of them is
    }
    for name, _ in _SEG_FIELDS:
        cols[name].append(status.get(name))
    return pa.RecordBatch.from_pydict(cols, schema=SEG_SCHEMA)


def _abs_problems(reader: CaptureReader, prefix: bytes, start: int) -> list[tuple[int, str]]:
    return [(start + off - len(prefix), msg) for off, msg in reader.problems]


def segments(ranges: Any) -> Any:
    """Stage 2: ranges -> TCP segment metadata (``kind`` 0) and one status row per range (``kind`` 1)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def each() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for row in batch.to_pylist():
                    yield range_segments(
                        row["file_index"], row["path"], row["range_index"], row["start"], row["end"], row["first_packet"], row["prefix"]
                    )

        yield from gc_paused(each())

    return ranges.mapInArrow(run, SEG_DDL)


STATUS_DDL = (
    "file_index int, path string, status string, format string, packets long, error string, problems array<string>, linktypes array<int>"
)


def status_rows(ranges: pa.Table) -> list[tuple[Any, ...]]:
    """The per-file status rows (:data:`STATUS_DDL`) from the range status rows (``kind`` 1) of the segments."""
    files: dict[int, list[dict[str, Any]]] = {}
    for r in ranges.to_pylist():
        if r["kind"] == 1:
            files.setdefault(r["file_index"], []).append(r)
    out = []
    for fi in sorted(files):
        rs = sorted(files[fi], key=itemgetter("range_index"))
        error = next((r["error"] for r in rs if r["error"] is not None), None)
        problems = []
        late = sum(r["missing"] or 0 for r in rs)
        for r in rs:
            if late and r["poff"] is not None:  # the file's one out-of-range-time problem, in the first range that has one
                problems.append(f"{time_problem(late)} (at byte offset {r['poff']})")
                late = 0
            problems += r["problems"] or ()
        formats = [r["format"] for r in rs if r["format"] is not None]
        packets = [r["packets"] for r in rs if r["packets"] is not None]
        status = "error" if error is not None else "problems" if problems else "ok"
        linktypes = sorted({lt for r in rs for lt in r["linktypes"] or ()})
        out.append((fi, rs[0]["path"], status, max(formats, default=None), sum(packets) if packets else None, error, problems, linktypes))
    return out


def file_status(segs: Any) -> Any:
    """The per-file status table: format, packets, error, problems, link types (one row per file; aggregated on the driver)."""
    rows = status_rows(segs.filter("kind = 1").select("kind", "file_index", "path", "missing", "poff", *_STATUS_INPUT).toArrow())
    return segs.sparkSession.createDataFrame(rows, STATUS_DDL)


_STATUS_INPUT = ("range_index", "format", "error", "problems", "packets", "linktypes")
STATUS_NAMES = ("file_index", "path", "status", "format", "packets", "error", "problems", "linktypes")


def _status_table(rows: list[dict[str, Any]]) -> pa.Table:
    types = [pa.int32(), pa.string(), pa.string(), pa.string(), pa.int64(), pa.string(), pa.list_(pa.string()), pa.list_(pa.int32())]
    return pa.table({k: pa.array([r[k] for r in rows], t) for k, t in zip(STATUS_NAMES, types, strict=True)})


def connection_sizes(rows: pa.Table) -> tuple[list[tuple[str, int]], tuple[int, int]]:
    """From the connection summaries (``kind`` 2) of the segments: (ckey, weight) per connection, and :func:`capture_end`."""
    weight: dict[str, int] = {}
    end = (0, 0)
    kind = rows.column("kind").to_pylist()
    for k, ck, w, g, t in zip(kind, *(rows.column(c).to_pylist() for c in ("ckey", "missing", "gpos", "ts")), strict=True):
        if k == 2:
            weight[ck] = weight.get(ck, 0) + w
            end = max(end, (g, t))
    return sorted(weight.items()), (int(end[1]), int(end[0]))


# --------------------------------------------------------------------------- stage 3: frames

_SPARK_TYPES = {
    "string": "string",
    "int64": "bigint",
    "int32": "int",
    "uint8": "smallint",
    "uint16": "int",
    "uint32": "bigint",
    "uint64": "decimal(20,0)",
    "timestamp[ns]": "timestamp",
    "list<string>": "array<string>",
}
_ARROW_OUT = {
    "uint8": pa.int16(),
    "uint16": pa.int32(),
    "uint32": pa.int64(),
    "uint64": pa.decimal128(20, 0),
    "timestamp[ns]": pa.timestamp("us", tz="UTC"),
}
#: the frames table in Spark (columns of :data:`~dcpinspect.columns.FRAME_COLUMNS`, Spark types)
FRAMES_DDL = ", ".join(f"`{name}` {_SPARK_TYPES[t]}" for name, t, _ in FRAME_COLUMNS)
_COLTYPES = {name: t for name, t, _ in FRAME_COLUMNS}


def spark_batch(batch: pa.RecordBatch, **columns: pa.Array) -> pa.RecordBatch:
    """A frames-table Arrow batch (``batches.SCHEMA``) with Spark's types (uint64 -> decimal(20,0), ...); ``columns`` replace some."""
    arrays, fields = [], []
    for f in SCHEMA:
        arr = columns[f.name] if f.name in columns else batch.column(f.name)
        to = _ARROW_OUT.get(_COLTYPES[f.name])
        if to is not None:
            arr = pc.cast(arr, to, safe=False)
        arrays.append(arr)
        fields.append(pa.field(f.name, arr.type))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


class _Payloads:
    """Payload bytes read from the files (``pyarrow.fs``) through one bounded window."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.fi = -1
        self.f: Any = None
        self.lo, self.buf = 0, b""

    def get(self, fi: int, path: str, off: int, n: int) -> bytes:
        if not n:
            return b""
        if fi != self.fi:
            self.close()
            fs, p = _fs(path)
            self.f, self.fi, self.lo, self.buf = fs.open_input_file(p), fi, 0, b""
        lo = self.lo
        if lo <= off and off + n <= lo + len(self.buf):
            return self.buf[off - lo : off - lo + n]
        self.buf = self.f.read_at(max(n, self.window), off)
        self.lo = off
        return self.buf[:n]

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
        self.f, self.fi, self.buf = None, -1, b""


@dataclass(frozen=True)
class Options:
    """What the decode takes besides the captures."""

    server_ports: tuple[int, ...] = tuple(sorted(DEFAULT_SERVER_PORTS))
    detect: bool = True
    tls_ports: tuple[int, ...] = tuple(sorted(TLS_PORTS))
    reveal_secrets: bool = False
    rows: int = 65536


_CLOSE = "C"


class _Keyed:
    """The records of one frames task with their numbering keys (shared by the frames and timelines stages).

    Each segment's ``file`` carries its capture position, so every run of a
    chunk knows which packet (or the end of the capture) completed it: a
    record's ``k1`` is that position, ``k2`` its order within it, and ``ck``
    the position that made its connection known.  Global frame numbers follow
    (k1, k2) order, connection ids ``ck`` order.
    """

    def __init__(self, batches: Iterable[pa.RecordBatch], paths: list[str], last: tuple[int, int], options: Options) -> None:
        self.batches, self.paths, self.last, self.options = batches, paths, last, options
        self.stats = CaptureStats()
        self.adopted: dict[int, int] = {}
        self.labels: dict[int, str] = {}
        self._cur = 0
        self._seen = 0

    def _sync(self) -> None:
        conns = self.stats.connections
        while self._seen < len(conns):
            c = conns[self._seen]
            self.adopted[c.id] = self._cur
            self.labels[c.id] = c.label
            self._seen += 1

    def _segs(self) -> Iterator[Segment]:
        payloads = _Payloads()
        paths = self.paths
        mask = (1 << GPOS_SHIFT) - 1
        for batch in self.batches:
            cols = [batch.column(k).to_numpy(zero_copy_only=False).tolist() for k in _SEG_INPUT]
            cols[3] = batch.column("src").to_pylist()
            cols[5] = batch.column("dst").to_pylist()
            for fi, gpos, ts, src, sport, dst, dport, seq, flags, poff, plen, missing in zip(*cols, strict=True):
                path = paths[fi]
                payload = payloads.get(fi, path, poff, plen)
                if self._seen < len(self.stats.connections):
                    self._sync()
                self._cur = gpos
                yield Segment(ts, src, sport, dst, dport, seq, flags, payload, missing, gpos & mask, f"{path}\0{gpos}")
        self._sync()
        payloads.close()
        ts, gpos = self.last
        path = paths[gpos >> GPOS_SHIFT] if paths else ""
        # the sentinel sets the reassembler's end of capture
        yield Segment(ts, "0.0.0.0", 0, "0.0.0.0", 0, 0, 0, b"", 0, gpos & mask, f"{path}\0{_CLOSE}")
        # what follows are the records held to the end: each names the file its connection was last seen in,
        # tagged here as emitted at the end (so they number after every packet)
        for c in self.stats.connections:
            last_file = getattr(c, "last_file", "")
            if last_file:
                c.last_file = f"{last_file.rpartition(chr(0))[0]}\0{_CLOSE}"

    def chunks(self) -> Iterator[tuple[RecordChunk, list[int], list[int]]]:
        """(chunk with real file names, ``k1`` per run, ``ck`` per run) - see :class:`_RecordKeys` for ``k2``."""
        o = self.options
        for chunk in iter_chunks(
            self._segs(),
            rows=o.rows,
            server_ports=o.server_ports,
            detect=o.detect,
            tls_ports=o.tls_ports,
            stats=self.stats,
            reveal_secrets=o.reveal_secrets,
        ):
            self._sync()
            files, k1s = [], []
            adopted = self.adopted
            for run, tagged in enumerate(chunk.file):
                path, _, token = tagged.rpartition("\0")
                files.append(path)
                k1s.append(CLOSE_BASE + adopted[chunk.conn[run]] if token == _CLOSE else int(token))
            chunk.file = files
            yield chunk, k1s, [adopted[c] for c in chunk.conn]
        self._sync()


class _RecordKeys:
    """Per record ``k1`` (what completed it) and ``k2`` (its order among the records of that ``k1``), across chunks."""

    def __init__(self) -> None:
        self.k1, self.n = -1, 0

    def keys(self, run_k1: list[int], counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        k1 = np.repeat(np.array(run_k1, np.int64), np.array(counts, np.int64))
        n = len(k1)
        if not n:
            return k1, k1.copy()
        change = np.empty(n, bool)
        change[0] = True
        np.not_equal(k1[1:], k1[:-1], out=change[1:])
        starts = np.flatnonzero(change)
        k2 = np.arange(n, dtype=np.int64) - np.repeat(starts, np.diff(np.append(starts, n)))
        if k1[0] == self.k1:  # the run of the previous chunk goes on
            k2[: starts[1] if len(starts) > 1 else n] += self.n
        self.k1, self.n = int(k1[-1]), int(k2[-1]) + 1
        return k1, k2


_SEG_INPUT = ("file_index", "gpos", "ts", "src", "sport", "dst", "dport", "seq", "flags", "poff", "plen", "missing")

# --------------------------------------------------------------------------- stage 3a: the keys pass
#
# Global frame numbers follow completion order over the whole capture, but each
# task sees only its connections.  A first pass over the same sorted segment
# metadata (reassembly and decoder, no frames table) counts the records each
# capture position completed (``k1``: the packet, or the end of the capture for
# one connection) and lists the connections with the position that made them
# known (``ck``).  That small table, collected, numbers everything: the frames
# pass emits final frame and connection numbers straight to the writer (no
# wide table persisted, no joins).  With ``build`` the same pass also builds
# each connection's timeline (stage 4), so the timelines cost no decode of
# their own.

KEYS_DDL = "kind byte, k1 bigint, n bigint, label string, blob binary"
_KEYS_SCHEMA = pa.schema([("kind", pa.int8()), ("k1", pa.int64()), ("n", pa.int64()), ("label", pa.string()), ("blob", pa.binary())])


def _keys_batch(kind: int, k1: Any, n: Any = None, label: list[str] | None = None, blob: list[bytes] | None = None) -> pa.RecordBatch:
    m = len(k1)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(m, kind, np.int8)),
            pa.array(k1, pa.int64()),
            pa.nulls(m, pa.int64()) if n is None else pa.array(n, pa.int64()),
            pa.nulls(m, pa.string()) if label is None else pa.array(label, pa.string()),
            pa.nulls(m, pa.binary()) if blob is None else pa.array(blob, pa.binary()),
        ],
        schema=_KEYS_SCHEMA,
    )


class _Counts:
    """Records per capture position, packed for the driver: ``kind`` 0 rows of at most :data:`COUNT_BLOCK` positions each.

    ``k1`` is the number of positions, ``blob`` the positions (delta-coded:
    they rise within a task) then their counts, as int64, zlib-compressed -
    a few bytes per position instead of a row of its own (a capture has about
    0.7 million positions with records per GiB).
    """

    def __init__(self) -> None:
        self.k1: list[np.ndarray] = []
        self.n: list[np.ndarray] = []
        self.size = 0

    def add(self, k1: np.ndarray, n: np.ndarray) -> Iterator[pa.RecordBatch]:
        self.k1.append(k1)
        self.n.append(n)
        self.size += len(k1)
        if self.size >= COUNT_BLOCK:
            yield from self.flush()

    def flush(self) -> Iterator[pa.RecordBatch]:
        if not self.size:
            return
        import zlib

        k1, n = np.concatenate(self.k1).astype(np.int64), np.concatenate(self.n).astype(np.int64)
        self.k1, self.n, self.size = [], [], 0
        yield _keys_batch(0, [len(k1)], blob=[zlib.compress(np.concatenate((np.diff(k1, prepend=0), n)).tobytes(), 1)])


def _uncount(m: int, blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    import zlib

    a = np.frombuffer(zlib.decompress(blob), np.int64)
    return np.cumsum(a[:m]), a[m:]


COUNT_BLOCK = 1 << 18


def keys_task(
    batches: Iterable[pa.RecordBatch],
    paths: list[str],
    last: tuple[int, int],
    options: Options,
    *,
    build: bool = False,
    max_items: int | None = None,
    frames_to: str | None = None,
    items_to: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stage 3a in one task: records per capture position (``kind`` 0, packed: see :class:`_Counts`), connections (1), and with ``build`` timeline parts (2).

    With ``frames_to`` (a directory) it is stage 3 in one decode: the frames
    are written there too, with their keys in place of the numbers (see
    :func:`write_frames`), and each file is listed (``kind`` 3: path, rows);
    with ``items_to`` every item and flow sample likewise (``kind`` 5 and 6).
    """
    keyed = _Keyed(batches, paths, last, options)
    rk = _RecordKeys()
    parts = _Parts(max_items, items_to) if build else None
    out = _TmpFrames(frames_to) if frames_to is not None else None
    counts = _Counts()
    for chunk, run_k1, run_ck in keyed.chunks():
        k1, k2 = rk.keys(run_k1, chunk.counts)
        if len(k1):
            starts = np.flatnonzero(np.concatenate(([True], k1[1:] != k1[:-1])))
            yield from counts.add(k1[starts], np.diff(np.append(starts, len(k1))))
            if out is not None:
                ck = np.repeat(np.array(run_ck, np.int64), np.array(chunk.counts, np.int64))
                b = spark_batch(chunk_batch(chunk))
                out.write(pa.RecordBatch.from_arrays([*b.columns, pa.array(k1), pa.array(k2), pa.array(ck)], schema=_TMP_SCHEMA))
        if parts is not None:
            parts.feed(chunk, k1, k2, run_ck)
    if out is not None:
        out.close()
    yield from counts.flush()
    adopted, labels = keyed.adopted, keyed.labels
    if adopted:
        ids = sorted(adopted)
        yield _keys_batch(1, [adopted[i] for i in ids], label=[labels[i] for i in ids])
    if parts is not None:
        for c, blob in parts.parts(max_items):
            yield _keys_batch(2, [c], blob=[blob])
    written = [(3, out)] if out is not None else []
    if parts is not None and parts.out is not None:
        parts.out.close()
        written += [(5, parts.out.items), (6, parts.out.flow)]
    for kind, w in written:
        if w.files:
            yield _keys_batch(kind, [0] * len(w.files), [n for _, n in w.files], label=[p for p, _ in w.files])


@dataclass
class Numbering:
    """Global frame and connection numbers from the keys pass (small: one entry per capture position with records)."""

    keys: np.ndarray  # sorted k1
    base: np.ndarray  # records completed at capture positions before each key
    conn_ids: dict[int, int]  # ck -> connection id (1-based, single-process order)
    labels: dict[int, str]  # connection id -> label
    frames: int  # records in all

    @classmethod
    def from_rows(cls, k1: np.ndarray, n: np.ndarray, cks: list[int], labels: list[str]) -> Numbering:
        """From the keys table's rows: records per ``k1`` (repeats add up), connections' ``ck`` and labels."""
        keys, inv = np.unique(k1, return_inverse=True)
        counts = np.zeros(len(keys), np.int64)
        np.add.at(counts, inv, n)
        base = np.cumsum(counts) - counts
        order = sorted(range(len(cks)), key=cks.__getitem__)
        conn_ids = {cks[j]: i + 1 for i, j in enumerate(order)}
        return cls(keys, base, conn_ids, {i + 1: labels[j] for i, j in enumerate(order)}, int(counts.sum()))

    def frame_numbers(self, k1: np.ndarray, k2: np.ndarray) -> np.ndarray:
        """The 1-based frame numbers of records ``(k1, k2)``."""
        return self.base[np.searchsorted(self.keys, k1)] + k2 + 1

    def frames_of(self, keys: list[int]) -> list[int]:
        """The frame numbers of many record keys ``k1 << KSHIFT | k2``."""
        n = len(keys)
        try:
            k = np.array(keys, np.int64)
            k1, k2 = k >> KSHIFT, k & ((1 << KSHIFT) - 1)
        except OverflowError:  # keys of records held to the end of the capture: past int64
            k1 = np.fromiter((k >> KSHIFT for k in keys), np.int64, n)
            k2 = np.fromiter((k & ((1 << KSHIFT) - 1) for k in keys), np.int64, n)
        out: list[int] = self.frame_numbers(k1, k2).tolist()
        return out

    def frame(self, key: int) -> int:
        """The frame number of one record key ``k1 << KSHIFT | k2``."""
        i = int(np.searchsorted(self.keys, key >> KSHIFT))
        return int(self.base[i]) + (key & ((1 << KSHIFT) - 1)) + 1


# --------------------------------------------------------------------------- stage 3b: frames


def frames_task(
    batches: Iterable[pa.RecordBatch], paths: list[str], last: tuple[int, int], options: Options, numbering: Numbering
) -> Iterator[pa.RecordBatch]:
    """Stage 3b in one task: segment metadata (in capture order) -> frames rows with their global numbers (Spark types)."""
    keyed = _Keyed(batches, paths, last, options)
    rk = _RecordKeys()
    cid = numbering.conn_ids
    for chunk, run_k1, run_ck in keyed.chunks():
        k1, k2 = rk.keys(run_k1, chunk.counts)
        conn = np.repeat(np.array([cid[c] for c in run_ck], np.int32), np.array(chunk.counts, np.int64))
        yield spark_batch(chunk_batch(chunk), frame=pa.array(numbering.frame_numbers(k1, k2)), conn_id=pa.array(conn))


def capture_end(segs: Any) -> tuple[int, int]:
    """(ts, capture position) of the capture's last TCP segment: where the single-process read ends."""
    from pyspark.sql import functions as F

    row = segs.filter("kind = 0").agg(F.max_by(F.struct("ts", "gpos"), "gpos").alias("m")).collect()[0]["m"]
    if row is None:
        return 0, 0
    return int(row["ts"]), int(row["gpos"])


def by_connection(
    segs: Any, partitions: int, sizes: tuple[list[tuple[str, int]], tuple[int, int]] | None = None
) -> tuple[Any, tuple[int, int]]:
    """Segment metadata shuffled by connection and sorted by capture position (the input of stages 3 and 4), and :func:`capture_end`.

    Connections are spread over the partitions by size (payload bytes and
    segments, largest first to the lightest partition), not by hash: a capture
    has few connections, and a hash puts two big ones on one task as often as
    not.  The sizes and the capture's end are :func:`connection_sizes` of the
    segments' connection summaries (one small job, unless ``sizes`` are given).
    """
    from pyspark.sql import functions as F

    if sizes is None:
        sizes = connection_sizes(segs.filter("kind = 2").select("kind", "ckey", "missing", "gpos", "ts").toArrow())
    weights, last = sizes
    load = [0] * partitions
    target = []
    for ckey, w in sorted(weights, key=lambda x: (-x[1], x[0])):
        p = min(range(partitions), key=load.__getitem__)
        load[p] += w
        target.append((ckey, p))
    spark = segs.sparkSession
    where = spark.createDataFrame(target or [("", 0)], "ckey string, _p int")
    data = segs.filter("kind = 0").select(*_SEG_INPUT, "ckey").join(F.broadcast(where), "ckey")
    return data.repartitionById(partitions, "_p").sortWithinPartitions("gpos").drop("ckey", "_p"), last


def keys_pass(
    data: Any, paths: list[str], *, last: tuple[int, int], options: Options = Options(), build: bool = False, max_items: int | None = None
) -> Any:
    """Stage 3a over :func:`by_connection` output: the keys table (see :func:`keys_task`); collect it and :func:`collect_keys`."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from gc_paused(keys_task(batches, paths, last, options, build=build, max_items=max_items))

    return data.mapInArrow(run, KEYS_DDL)


def collect_keys(keys: Any) -> tuple[Numbering, list[_ConnPart]]:
    """The keys table on the driver: the numbering, and the timeline parts (if built)."""
    num, parts, _files = _collect(keys.toArrow())
    return num, parts


def _collect(t: pa.Table) -> tuple[Numbering, list[_ConnPart], dict[str, list[tuple[str, int]]]]:
    import pickle

    kind = t.column("kind").to_numpy(zero_copy_only=False)
    k1 = t.column("k1").to_numpy(zero_copy_only=False)
    counts = kind == 0
    conns = np.flatnonzero(kind == 1)
    labels = t.column("label").take(pa.array(conns)).to_pylist()
    packed = [_uncount(m, b) for m, b in zip(k1[counts].tolist(), t.column("blob").filter(pa.array(counts)).to_pylist(), strict=True)]
    empty = np.zeros(0, np.int64)
    num = Numbering.from_rows(
        np.concatenate([p[0] for p in packed]) if packed else empty,
        np.concatenate([p[1] for p in packed]) if packed else empty,
        k1[conns].tolist(),
        labels,
    )
    blobs = t.column("blob").filter(pa.array(kind == 2)).to_pylist()
    written = {}
    for name, k in _WRITTEN.items():
        files = pa.array(kind == k)
        written[name] = list(zip(t.column("label").filter(files).to_pylist(), t.column("n").filter(files).to_pylist(), strict=True))
    return num, [pickle.loads(b) for b in blobs], written


_WRITTEN = {"frames": 3, "items": 5, "flow": 6}  # keys table kinds listing the temporary files of each table


def frames_numbered(data: Any, paths: list[str], numbering: Numbering, *, last: tuple[int, int], options: Options = Options()) -> Any:
    """Stage 3b over :func:`by_connection` output: the frames table with global numbers, Spark types."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from gc_paused(frames_task(batches, paths, last, options, numbering))

    return data.mapInArrow(run, FRAMES_DDL)


# --------------------------------------------------------------------------- stage 3, one decode: the frames table to files
#
# The keys pass and the frames pass decode every connection twice because the
# frames leave the task with their final numbers.  When the table goes to
# files (what ``analyze`` does) one decode is enough: the task writes its
# frames with their keys in place of the numbers to temporary Arrow files
# (lz4) under the output, and returns the keys table as above (with the
# timeline parts) plus the list of those files; a small second job renumbers
# each file into a parquet part.  Both write with pyarrow inside the task, not
# through Spark's writer: the JVM's Arrow -> rows conversion and parquet
# encoding were about half the CPU of the frames pass.  The commit: only the
# files listed by successful tasks are renumbered (a retried or speculative
# attempt writes files of its own that nothing lists), the temporary
# directory is removed, and ``_SUCCESS`` marks a complete table.

TMP_ROWS = 1 << 19  # rows per temporary file (and so per parquet part)
_KEY_FIELDS = [pa.field("_k1", pa.int64()), pa.field("_k2", pa.int64()), pa.field("_ck", pa.int64())]
#: the frames table's Arrow schema with Spark's types (what :func:`spark_batch` makes)
SPARK_SCHEMA = pa.schema([pa.field(f.name, _ARROW_OUT.get(_COLTYPES[f.name], f.type)) for f in SCHEMA])
_TMP_SCHEMA = pa.schema([*SPARK_SCHEMA, *_KEY_FIELDS])


class _TmpFrames:
    """Rows with their numbering keys (frames by default), into temporary Arrow IPC files of at most :data:`TMP_ROWS` rows."""

    def __init__(self, directory: str, schema: pa.Schema | None = None) -> None:
        self.directory = directory
        self.schema = _TMP_SCHEMA if schema is None else schema
        self.files: list[tuple[str, int]] = []
        self._sink: Any = None
        self._writer: Any = None
        self._path = ""
        self._rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            import uuid

            self._path = f"{self.directory}/{uuid.uuid4().hex}.arrow"
            fs, p = _fs(self._path)
            fs.create_dir(p.rpartition("/")[0], recursive=True)
            self._sink = fs.open_output_stream(p)
            self._writer = pa.ipc.new_file(self._sink, self.schema, options=pa.ipc.IpcWriteOptions(compression="lz4"))
        self._writer.write_batch(batch)
        self._rows += batch.num_rows
        if self._rows >= TMP_ROWS:
            self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self.files.append((self._path, self._rows))
            self._writer = self._sink = None
            self._rows = 0


_TS = pa.timestamp("us", tz="UTC")
_ITEMS_TMP = pa.schema(
    [(k, pa.int64()) for k in ("_b1", "_b2", "_ck", "vbucket", "_k1", "_k2", "ts")]
    + [("opcode", pa.int16()), ("seqno", pa.uint64()), ("snapshot", pa.int64())]
)
_FLOW_TMP = pa.schema(
    [(k, pa.int64()) for k in ("_ck", "_k1", "_k2", "ts", "outstanding")] + [("event", pa.string()), ("size", pa.int64())]
)
#: the items and flow tables as ``analyze --items`` writes them (what :func:`arrow_for_spark` makes of the timeline tables)
ITEMS_SCHEMA = pa.schema(
    [(k, pa.int64()) for k in ("stream", "conn", "vbucket", "frame")]
    + [("ts", _TS), ("name", pa.string()), ("seqno", pa.decimal128(20, 0)), ("snapshot", pa.int64())]
)
FLOW_SCHEMA = pa.schema(
    [("conn", pa.int64()), ("frame", pa.int64()), ("ts", _TS), ("outstanding", pa.int64()), ("event", pa.string()), ("size", pa.int64())]
)
_BATCH = 1 << 16


class _ItemsOut:
    """Every item and flow sample of a task's builders, with their keys, into temporary files (``analyze --items``)."""

    def __init__(self, directory: str) -> None:
        self.items = _TmpFrames(directory, _ITEMS_TMP)
        self.flow = _TmpFrames(directory, _FLOW_TMP)
        self._i: list[list[Any]] = [[] for _ in _ITEMS_TMP]
        self._f: list[list[Any]] = [[] for _ in _FLOW_TMP]

    def add_items(self, born: int, ck: int, vbucket: int, new: list[Any]) -> None:
        mask = (1 << KSHIFT) - 1
        n = len(new)
        frame, ts, opcode, seqno, snapshot = zip(*new, strict=True)
        cols = self._i
        for col, v in zip(cols[:4], (born >> KSHIFT, born & mask, ck, vbucket), strict=True):
            col.extend([v] * n)
        cols[4] += [f >> KSHIFT for f in frame]
        cols[5] += [f & mask for f in frame]
        for col, vs in zip(cols[6:], (ts, opcode, seqno, snapshot), strict=True):
            col.extend(vs)
        if len(cols[0]) >= _BATCH:
            self._flush_items()

    def add_flow(self, new: list[Any]) -> None:
        mask = (1 << KSHIFT) - 1
        conn, frame, ts, outstanding, event, size = zip(*new, strict=True)
        cols = self._f
        cols[0] += conn
        cols[1] += [f >> KSHIFT for f in frame]
        cols[2] += [f & mask for f in frame]
        for col, vs in zip(cols[3:], (ts, outstanding, event, size), strict=True):
            col.extend(vs)
        if len(cols[0]) >= _BATCH:
            self._flush_flow()

    def _flush_items(self) -> None:
        if self._i[0]:
            self.items.write(
                pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(self._i, _ITEMS_TMP, strict=True)], schema=_ITEMS_TMP)
            )
            self._i = [[] for _ in _ITEMS_TMP]

    def _flush_flow(self) -> None:
        if self._f[0]:
            self.flow.write(
                pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(self._f, _FLOW_TMP, strict=True)], schema=_FLOW_TMP)
            )
            self._f = [[] for _ in _FLOW_TMP]

    def close(self) -> None:
        self._flush_items()
        self._flush_flow()
        self.items.close()
        self.flow.close()


RENUMBER_DDL = "index int, rows long, ts long, type string, name string"


def renumber_task(
    batches: Iterable[pa.RecordBatch],
    numbering: Numbering,
    outs: dict[str, str],
    stride: int = 0,
    streams: dict[tuple[int, int], int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Each temporary file (rows ``index``, ``path``, ``table``) -> ``outs[table]/part-<index>.parquet`` with the global numbers.

    Yields (index, rows) per file, and with ``stride`` the ``ts`` (ns),
    ``type`` and ``name`` of every ``stride``-th frame (a sample for the
    report).  Items name their stream by its index in the merged timeline:
    ``streams`` maps the key of the record that created each stream to it.
    """
    import pyarrow.parquet as pq

    cks = np.array(sorted(numbering.conn_ids), np.int64)
    ids = np.array([numbering.conn_ids[c] for c in cks.tolist()], np.int32)
    where = {name: i for i, name in enumerate(SPARK_SCHEMA.names)}
    schema = pa.schema([("index", pa.int32()), ("rows", pa.int64()), ("ts", pa.int64()), ("type", pa.string()), ("name", pa.string())])
    schemas = {"frames": SPARK_SCHEMA, "items": ITEMS_SCHEMA, "flow": FLOW_SCHEMA}
    for batch in batches:
        for index, src, table in zip(*(batch.column(k).to_pylist() for k in ("index", "path", "table")), strict=True):
            fs, p = _fs(src)
            dfs, dp = _fs(f"{outs[table]}/part-{index:05d}.parquet")
            rows = 0
            with fs.open_input_file(p) as f, dfs.open_output_stream(dp) as sink, pq.ParquetWriter(sink, schemas[table]) as w:
                reader = pa.ipc.open_file(f)
                for i in range(reader.num_record_batches):
                    b = reader.get_batch(i)
                    frame = numbering.frame_numbers(b.column("_k1").to_numpy(), b.column("_k2").to_numpy())
                    conn = ids[np.searchsorted(cks, b.column("_ck").to_numpy())]
                    rows += b.num_rows
                    if table == "items":
                        w.write_batch(_items_batch(b, frame, conn, streams or {}))
                        continue
                    if table == "flow":
                        cols = [pa.array(conn, pa.int64()), pa.array(frame), _us(b.column("ts")), *b.columns[4:]]
                        w.write_batch(pa.RecordBatch.from_arrays(cols, schema=FLOW_SCHEMA))
                        continue
                    cols = b.columns[: len(SPARK_SCHEMA)]
                    cols[where["frame"]] = pa.array(frame)
                    cols[where["conn_id"]] = pa.array(conn)
                    out = pa.RecordBatch.from_arrays(cols, schema=SPARK_SCHEMA)
                    w.write_batch(out)
                    if stride:
                        pick = pa.array(np.flatnonzero((frame - 1) % stride == 0))
                        m = len(pick)
                        ts = pc.multiply(pc.cast(out.column("ts").take(pick), pa.int64()), 1000)
                        yield pa.RecordBatch.from_arrays(
                            [
                                pa.nulls(m, pa.int32()),
                                pa.nulls(m, pa.int64()),
                                ts,
                                out.column("type").take(pick),
                                out.column("name").take(pick),
                            ],
                            schema=schema,
                        )
            yield pa.RecordBatch.from_arrays(
                [pa.array([index], pa.int32()), pa.array([rows], pa.int64()), *(pa.nulls(1, f.type) for f in list(schema)[2:])],
                schema=schema,
            )


def _us(ns: pa.Array) -> pa.Array:
    """Nanoseconds since the epoch as Spark's timestamps (microseconds, UTC; the digits below are dropped)."""
    return pa.array(ns.to_numpy() // 1000, _TS)


@cache
def _opcode_names() -> pa.Array:
    names = []
    for op in range(1 << 8):
        cmd = spec.COMMANDS.get(op)
        names.append(cmd.name if cmd else hex(op))
    return pa.array(names)


def _items_batch(b: pa.RecordBatch, frame: np.ndarray, conn: np.ndarray, streams: dict[tuple[int, int], int]) -> pa.RecordBatch:
    pairs, inv = np.unique(np.stack([b.column("_b1").to_numpy(), b.column("_b2").to_numpy()], 1), axis=0, return_inverse=True)
    stream = np.array([streams[(int(x), int(y))] for x, y in pairs.tolist()], np.int64)[inv.reshape(-1)]
    cols = [
        pa.array(stream),
        pa.array(conn, pa.int64()),
        b.column("vbucket"),
        pa.array(frame),
        _us(b.column("ts")),
        _opcode_names().take(b.column("opcode")),
        pc.cast(b.column("seqno"), pa.decimal128(20, 0)),
        b.column("snapshot"),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=ITEMS_SCHEMA)


def _rmtree(path: str) -> None:
    fs, p = _fs(path)
    from pyarrow import fs as pafs

    if fs.get_file_info(p).type != pafs.FileType.NotFound:
        fs.delete_dir(p)


def write_frames(
    data: Any,
    paths: list[str],
    out_dir: str,
    *,
    last: tuple[int, int],
    options: Options = Options(),
    build: bool = False,
    max_items: int | None = None,
    partitions: int = 2,
    sample: int = 0,
    items_out: tuple[str, str] | None = None,
) -> tuple[Numbering, list[_ConnPart], pa.Table | None]:
    """Stage 3 over :func:`by_connection` output, one decode: the frames table as parquet under ``out_dir`` (replaced).

    Returns what :func:`collect_keys` returns for the keys pass (with
    ``build``, every connection's timeline part), and with ``sample`` the
    ``ts`` (ns), ``type`` and ``name`` of at most that many frames, evenly
    spaced (for the report).  With ``items_out`` (two directories; needs
    ``build`` and ``max_items``) the items and flow tables are written there
    the same way, every row, while the parts keep ``max_items`` items per
    stream.  The directories are local paths or any URIs ``pyarrow.fs`` opens
    that the executors share.
    """
    import uuid

    out = str(out_dir).rstrip("/")
    tmp = f"{out.rpartition('/')[0] or '.'}/_dcpinspect-tmp-{uuid.uuid4().hex}"
    items_to = tmp if items_out is not None else None

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from gc_paused(keys_task(batches, paths, last, options, build=build, max_items=max_items, frames_to=tmp, items_to=items_to))

    outs = {"frames": out}
    if items_out is not None:
        outs |= {"items": str(items_out[0]).rstrip("/"), "flow": str(items_out[1]).rstrip("/")}
    schemas = {"frames": SPARK_SCHEMA, "items": ITEMS_SCHEMA, "flow": FLOW_SCHEMA}
    picked = None
    try:
        num, parts, files = _collect(data.mapInArrow(run, KEYS_DDL).toArrow())
        for d in outs.values():
            _rmtree(d)
            fs, p = _fs(d)
            fs.create_dir(p, recursive=True)
        todo = [(path, table) for table in outs for path, _ in files[table]]
        if todo:
            spark = data.sparkSession
            jobs = spark.createDataFrame([(i, path, table) for i, (path, table) in enumerate(todo)], "index int, path string, table string")
            jobs = jobs.repartition(max(1, min(len(todo), partitions)), "index")
            stride = -(-num.frames // sample) if sample else 0
            mask = (1 << KSHIFT) - 1
            born = sorted(k for part in parts for k, _ in part.streams) if items_out is not None else []
            streams = {(k >> KSHIFT, k & mask): i for i, k in enumerate(born)}

            def renumber(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                yield from renumber_task(batches, num, outs, stride, streams)

            done = jobs.mapInArrow(renumber, RENUMBER_DDL).toArrow()
            written = pc.is_valid(done.column("index"))
            if sorted(done.column("index").filter(written).to_pylist()) != list(range(len(todo))):
                raise RuntimeError("the frames table was not written whole")
            if sample:
                picked = done.filter(pc.invert(written)).select(["ts", "type", "name"]).sort_by("ts")
        for table, d in outs.items():
            fs, p = _fs(d)
            if not files[table]:
                import pyarrow.parquet as pq

                with fs.open_output_stream(f"{p}/part-00000.parquet") as sink:
                    pq.write_table(schemas[table].empty_table(), sink)
            with fs.open_output_stream(f"{p}/_SUCCESS"):
                pass
    finally:
        _rmtree(tmp)
    if sample and picked is None:
        picked = pa.table({"ts": pa.array([], pa.int64()), "type": pa.array([], pa.string()), "name": pa.array([], pa.string())})
    return num, parts, picked


# --------------------------------------------------------------------------- stage 4: timelines
#
# Each connection's records are fed, in order, to a TimelineBuilder of its own
# in the keys pass (record numbers are the keys K = k1 << KSHIFT | k2, which
# sort exactly like the global frame numbers; connection ids are the positions
# ``ck`` that made them known, which sort like the global ids).  What crosses
# connections - the failover branch tree of each vbucket (merged from every
# log of every connection, in capture order) and the replay of the producer's
# rollback rule (which reads those logs, the high and purge seqnos and the
# highest seqno seen on the vbucket) - is rebuilt on the driver by the same
# TimelineBuilder fed, in global order, only the records that can change it:
# requests that expect a response, every response, the markers that carried a
# purge seqno, and per rollback the highest seqno seen on each vbucket before
# it (``TimelineBuilder.observe_seqno``, from each connection's compressed
# history of item seqnos).  The pieces are then put in the single-process
# order and renumbered.

KSHIFT = 24  # records completed by one packet (or at the end of one connection) per k1: < 2**24
_ROLLBACK_STATUS = 0x23


@dataclass
class _ConnPart:
    """One connection's timeline as built on an executor (keys, not frame numbers)."""

    ck: int
    first: int  # K of its first record
    info: Any
    streams: list[tuple[int, Any]]  # (K of the record that created it, Stream)
    runtime: list[tuple[int, Any]]  # (K of the record that raised it, Anomaly)
    final: list[Any]  # end-of-input anomalies, in the builder's order
    flow: list[Any]
    noops: list[dict[str, Any]]
    stalls: list[dict[str, Any]]
    items: list[int]  # item count per stream, in the order of ``streams`` (items may be thinned)
    control: list[tuple[Any, ...]]  # records the driver replays (Record fields, the frame as (offset, raw, dialect))
    history: dict[int, bytes]  # vbucket -> the highest item seqno so far, where it rose (see :func:`_history`)
    item_columns: list[tuple[list[Any], ...]] | None = None  # per stream its items as columns (pickle far faster than Items)


def _rec_tuple(r: Record) -> tuple[Any, ...]:
    ev: Any = r.event  # always a Frame here
    return (r.number, r.file, r.conn, r.conn_label, r.direction, r.ts, r.ts_first, r.packet, r.packet_first, tuple(ev), r.context)


def _rec_from(t: tuple[Any, ...]) -> Record:
    return Record(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], Frame(*t[9]), t[10])


class _Thinner:
    """Bounded memory for the items (and flow samples) of one connection's builder while a task runs.

    Keeps at most ``2 n`` evenly spaced items per stream (every ``stride``-th,
    the stride doubling as the stream grows), the true count and the last item
    of each, and - before anything is dropped - where each vbucket's highest
    item seqno rose (what :func:`_history` reads from the whole list).
    """

    def __init__(self, n: int, out: _ItemsOut | None = None, born: list[int] | None = None, ck: int = 0) -> None:
        self.n = n
        self.out, self.born, self.ck = out, born, ck  # with ``out``, every item and flow sample is written there first
        self.state: dict[int, list[Any]] = {}  # id(stream) -> [done, seen, stride, last]
        self.best: dict[int, int] = {}  # vbucket -> highest item seqno so far
        self.rises: dict[int, tuple[list[int], list[int]]] = {}  # vbucket -> (K, seqno) where it rose
        self.flow = [0, 0, 1]  # done, seen, stride

    def step(self, builder: Any) -> None:
        """After each chunk: thin what the builder added."""
        new_by_vb: dict[int, list[list[Any]]] = {}
        out = self.out
        for i, s in enumerate(builder._streams):
            st = self.state.get(id(s))
            if st is None:
                st = self.state[id(s)] = [0, 0, 1, None]
            done, seen, stride, _last = st
            items = s.items
            if len(items) == done:
                continue
            new = items[done:]
            if out is not None and self.born is not None:
                out.add_items(self.born[i], self.ck, s.vbucket, new)
            new_by_vb.setdefault(s.vbucket, []).append(new)
            kept = items[:done] + new[(-seen) % stride :: stride]
            while len(kept) > 2 * self.n:
                stride *= 2
                kept = kept[::2]
            s.items = kept
            st[:] = [len(kept), seen + len(new), stride, new[-1]]
        for vb, lists in new_by_vb.items():
            its = lists[0] if len(lists) == 1 else sorted((it for x in lists for it in x), key=_FRAME)
            best = self.best.get(vb, -1)
            ks, qs = self.rises.setdefault(vb, ([], []))
            for it in its:
                q = it[3]
                if q is not None and q > best:
                    best = q
                    ks.append(it[0])
                    qs.append(q)
            self.best[vb] = best
        flow = builder._flow
        done, seen, stride = self.flow
        if len(flow) > done:
            new = flow[done:]
            if out is not None:
                out.add_flow(new)
            kept = flow[:done] + new[(-seen) % stride :: stride]
            while len(kept) > 2 * self.n:
                stride *= 2
                kept = kept[::2]
            builder._flow = kept
            self.flow = [len(kept), seen + len(new), stride]

    def finish(self, builder: Any) -> None:
        """Before the builder's timeline: each stream's true last item back at its end (the end-of-input checks read it)."""
        self.step(builder)
        for s in builder._streams:
            st = self.state.get(id(s))
            if st is not None and st[3] is not None and (not s.items or s.items[-1] is not st[3]):
                s.items.append(st[3])

    def count(self, s: Any) -> int:
        """The true number of items of stream ``s``."""
        st = self.state.get(id(s))
        return len(s.items) if st is None else st[1]

    def history(self) -> dict[int, bytes]:
        """:func:`_history` of everything fed, kept or not."""
        return {vb: _rises_blob(ks, qs) for vb, (ks, qs) in self.rises.items() if ks}


class _Parts:
    """The per-connection TimelineBuilders of one task (with ``max_items``, their items thinned as they come: bounded memory)."""

    def __init__(self, max_items: int | None = None, items_to: str | None = None) -> None:
        from .timeline import TimelineBuilder

        if items_to is not None and max_items is None:
            raise ValueError("items_to needs max_items")
        self._new = TimelineBuilder
        self.max_items = max_items
        self.out = _ItemsOut(items_to) if items_to is not None else None
        self.thinners: dict[int, _Thinner] = {}
        self.builders: dict[int, Any] = {}
        self.first: dict[int, int] = {}
        self.born: dict[int, list[int]] = {}
        self.raised: dict[int, list[int]] = {}
        self.control: dict[int, list[Record]] = {}
        self.markers: dict[int, dict[int, Record]] = {}

    def feed(self, chunk: RecordChunk, k1: np.ndarray, k2: np.ndarray, run_ck: list[int]) -> None:
        from .timeline import EXPECTS_RESPONSE

        responses = spec.RESPONSE_MAGICS
        keys = (
            ((k1 << KSHIFT) | k2).tolist()
            if len(k1) and int(k1.max()) < 1 << (63 - KSHIFT)
            else [a << KSHIFT | b for a, b in zip(k1.tolist(), k2.tolist(), strict=True)]
        )
        builders = self.builders
        events, contexts, heads = chunk.events, chunk.context, chunk.heads
        i = 0
        for run, n in enumerate(chunk.counts):
            c = run_ck[run]
            bl = builders.get(c)
            if bl is None:
                bl = builders[c] = self._new()
                self.first[c], self.born[c], self.raised[c], self.control[c], self.markers[c] = keys[i], [], [], [], {}
            streams, anomalies, born, raised, control = bl._streams, bl._anomalies, self.born[c], self.raised[c], self.control[c]
            feed = bl.feed
            f, label, d, ts, packet = chunk.file[run], chunk.labels[chunk.conn[run]], chunk.direction[run], chunk.ts[run], chunk.packet[run]
            for j in range(i, i + n):
                key = keys[j]
                tf, tl, pf, pl = heads.get(j, (ts, ts, packet, packet)) if heads else (ts, ts, packet, packet)
                ev = events[j]
                rec = Record(key, f, c, label, d, tl, tf, pl, pf, ev, contexts[j])
                ns, na = len(streams), len(anomalies)
                feed(rec)
                if len(streams) != ns:
                    born.append(key)
                if len(anomalies) != na:
                    raised.extend([key] * (len(anomalies) - na))
                if ev.__class__ is Frame and ev[2] == "mcbp":
                    raw = ev[1]
                    magic, op = raw[0], raw[1]
                    if magic in responses and magic != 0x83:
                        control.append(rec)
                    elif magic in (0x80, 0x08):
                        if op in EXPECTS_RESPONSE:
                            control.append(rec)
                        elif op == 0x56 and raw[4] != 20:  # a v2 marker: may carry the purge seqno
                            self.markers[c][key] = rec
            i += n
        if self.max_items is not None:
            for c in set(run_ck):
                th = self.thinners.get(c)
                if th is None:
                    th = self.thinners[c] = _Thinner(self.max_items, self.out, self.born[c], c)
                th.step(builders[c])

    def parts(self, max_items: int | None) -> Iterator[tuple[int, bytes]]:
        import pickle

        for c, bl in self.builders.items():
            th = self.thinners.get(c)
            if th is not None:
                th.finish(bl)
            t = bl.timeline()
            purge = {sn.frame for s in t.streams for sn in s.snapshots if isinstance(sn.purge_seqno, int)}
            ctl = self.control[c] + [r for k, r in self.markers[c].items() if k in purge]
            ctl.sort(key=lambda r: r.number)
            counts = [len(s.items) if th is None else th.count(s) for s in t.streams]
            history = _history(t.streams) if th is None else th.history()
            flow = t.flow
            if max_items is not None:
                for s in t.streams:
                    s.items = _thin(s.items, max_items)
                flow = _thin(flow, max_items)
            nrt = len(bl._anomalies)
            part = _ConnPart(
                c,
                self.first[c],
                t.connections[c],
                list(zip(self.born[c], t.streams, strict=True)),
                list(zip(self.raised[c], t.anomalies[:nrt], strict=True)),
                t.anomalies[nrt:],
                flow,
                t.noops,
                t.stalls,
                counts,
                [_rec_tuple(r) for r in ctl],
                history,
                [tuple(map(list, zip(*s.items, strict=True))) if s.items else () for s in t.streams],
            )
            for s in t.streams:
                s.items = []
            yield c, pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)


def _thin(xs: list[Any], n: int) -> list[Any]:
    if len(xs) <= n:
        return xs
    step = len(xs) / n
    picked = [xs[int(i * step)] for i in range(n - 1)]
    return [*picked, xs[-1]]


def _history(streams: list[Any]) -> dict[int, bytes]:
    """Per vbucket, where the highest item seqno seen on this connection rose: ``(K, seqno)`` pairs, delta-coded and compressed.

    The driver reads, for every rollback of the capture, the highest seqno each
    connection had seen on the vbucket before it (:func:`_highest_before`).
    """
    per_vb: dict[int, list[Any]] = {}
    for s in streams:
        per_vb.setdefault(s.vbucket, []).append(s.items)
    out: dict[int, bytes] = {}
    for vb, lists in per_vb.items():
        its = lists[0] if len(lists) == 1 else sorted((it for x in lists for it in x), key=_FRAME)
        ks = [it[0] for it in its if it[3] is not None]
        if not ks:
            continue
        q = np.array([it[3] for it in its if it[3] is not None], np.uint64)
        best = np.maximum.accumulate(q)
        rose = np.flatnonzero(np.concatenate(([True], best[1:] > best[:-1])))  # where the highest seqno so far went up
        out[vb] = _rises_blob([ks[i] for i in rose.tolist()], q[rose])
    return out


def _rises_blob(ks: list[int], qs: Any) -> bytes:
    """(K, seqno) pairs where a vbucket's highest seqno rose, delta-coded and compressed (read by :func:`_unhistory`)."""
    import zlib

    mask = (1 << KSHIFT) - 1
    q = np.asarray(qs, np.uint64)
    k1 = np.array([k >> KSHIFT for k in ks], np.int64)
    k2 = np.array([k & mask for k in ks], np.int64)
    blob = np.concatenate((np.diff(k1, prepend=0), k2, np.diff(q, prepend=np.uint64(0)).view(np.int64)))
    return zlib.compress(blob.tobytes(), 1)


_FRAME = itemgetter(0)


def _unhistory(blob: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import zlib

    a = np.frombuffer(zlib.decompress(blob), np.int64)
    n = len(a) // 3
    return np.cumsum(a[:n]), a[n : 2 * n], np.cumsum(a[2 * n :].view(np.uint64))


def _highest_before(parts: list[_ConnPart], rollbacks: list[int]) -> tuple[dict[int, list[tuple[int, int]]], dict[int, int]]:
    """(rollback K -> [(vbucket, highest seqno seen before it on any connection)], vbucket -> highest at the end)."""
    at: dict[int, list[tuple[int, int]]] = {}
    end: dict[int, int] = {}
    mask = (1 << KSHIFT) - 1
    best: dict[tuple[int, int], int] = {}
    for p in parts:
        for vb, blob in p.history.items():
            k1, k2, q = _unhistory(blob)
            end[vb] = max(end.get(vb, -1), int(q[-1]))
            for t in rollbacks:
                t1, t2 = t >> KSHIFT, t & mask
                lo, hi = int(np.searchsorted(k1, t1, "left")), int(np.searchsorted(k1, t1, "right"))
                i = lo + int(np.searchsorted(k2[lo:hi], t2, "left"))
                if i:
                    v = int(q[i - 1])
                    if v > best.get((t, vb), -1):
                        best[(t, vb)] = v
    for (t, vb), v in sorted(best.items()):
        at.setdefault(t, []).append((vb, v))
    return at, end


def timelines(
    segs: Any,
    paths: list[str],
    *,
    partitions: int,
    last: tuple[int, int],
    options: Options = Options(),
    max_items: int | None = None,
) -> Any:
    """Stage 3a with timelines built (stage 4): the keys table with one pickled part per connection; see :func:`collect_keys`."""
    return keys_pass(by_connection(segs, partitions)[0], paths, last=last, options=options, build=True, max_items=max_items)


def merge_timelines(parts: list[_ConnPart], frames_of: Any = None) -> tuple[Any, dict[int, int]]:
    """The single-process :class:`~dcpinspect.timeline.Timeline` (still in keys) from the per-connection parts.

    Returns the timeline and the true item count of each stream (by index;
    items may have been thinned).  :func:`_renumber` then turns keys into
    frame numbers; with ``frames_of`` (many keys -> frame numbers) the items
    get theirs here, made once.
    """
    import heapq

    from .timeline import Item, Timeline, TimelineBuilder

    parts = sorted(parts, key=lambda p: p.first)
    for p in parts:
        if p.item_columns is not None:
            for (_, st), cols in zip(p.streams, p.item_columns, strict=True):
                made = (frames_of(cols[0]), *cols[1:]) if cols and frames_of is not None else cols
                st.items = list(map(Item._make, zip(*made, strict=True))) if made else []
            p.item_columns = None
    # the cross-connection replay (failover branches, rollback explanations)
    replay = TimelineBuilder()
    controls = [[_rec_from(t) for t in p.control] for p in parts]
    raws: list[tuple[int, bytes]] = [(r.number, r.event[1]) for recs in controls for r in recs]  # type: ignore[index]
    rollbacks = sorted(
        k for k, raw in raws if raw[0] in (0x81, 0x18) and raw[1] == 0x53 and int.from_bytes(raw[6:8], "big") == _ROLLBACK_STATUS
    )
    pending_hi, end_hi = _highest_before(parts, rollbacks)
    records = heapq.merge(*controls, key=lambda r: r.number)
    for r in records:
        for vb, q in pending_hi.pop(r.number, ()):
            replay.observe_seqno(vb, q)
        replay.feed(r)
    for vb, q in sorted(end_hi.items()):
        replay.observe_seqno(vb, q)
    rt = replay.timeline(final=False)
    explained = {(s.conn, a.frame): (a.explanation, a.predicted) for s in rt.streams for a in s.attempts if a.outcome == "rollback"}
    # the single-process order
    streams = [s for _, s in sorted(((k, s) for p in parts for k, s in p.streams), key=lambda x: x[0])]
    for s in streams:
        for a in s.attempts:
            if a.outcome == "rollback" and (s.conn, a.frame) in explained:
                a.explanation, a.predicted = explained[(s.conn, a.frame)]
    order = {id(s): i for i, s in enumerate(streams)}
    runtime = [a for _, a in sorted(((k, a) for p in parts for k, a in p.runtime), key=lambda x: x[0])]
    group_a = [a for p in parts for a in p.final if a.kind in ("request never answered", "noop unanswered")]
    last_attempt = {(s.conn, s.attempts[-1].frame): order[id(s)] for s in streams if s.attempts}
    group_b = sorted(
        (a for p in parts for a in p.final if a.kind == "stream never ended"), key=lambda a: last_attempt.get((a.conn, a.frames[0]), 0)
    )
    group_c = [a for p in parts for a in p.final if a.kind not in ("request never answered", "noop unanswered", "stream never ended")]
    anomalies = runtime + group_a + group_b + group_c
    flow = list(heapq.merge(*(p.flow for p in parts), key=lambda f: f.frame))
    noops = list(heapq.merge(*(p.noops for p in parts), key=lambda n: n["reply_frame"]))
    stalls = list(heapq.merge(*(p.stalls for p in parts), key=lambda n: n["ack_frame"]))
    merged = Timeline({p.ck: p.info for p in parts}, streams, rt.branches, rt.logs, flow, noops, anomalies, stalls, dict(rt.high_seqnos))
    counts: dict[int, int] = {}
    for p in parts:
        for (_, st), n in zip(p.streams, p.items, strict=True):
            counts[order[id(st)]] = n
    return merged, counts


class _Same(dict[int, int]):
    """A mapping that maps every key to itself."""

    def __missing__(self, key: int) -> int:
        return key


def _renumber(t: Any, f: Any, conn_of: dict[int, int], many: Any = None) -> None:
    """Keys -> frame numbers and ``ck`` -> connection ids, in place, everywhere a Timeline holds them (items only with ``many``)."""

    def g(v: int | None) -> int | None:
        return None if v is None else f(v)

    t.connections = {conn_of[k]: c for k, c in t.connections.items()}
    for c in t.connections.values():
        c.conn = conn_of[c.conn]
        c.closed_frame = g(c.closed_frame)
    done: set[int] = set()

    def anomaly(a: Any) -> None:
        if id(a) in done:
            return
        done.add(id(a))
        a.frames = [f(x) for x in a.frames]
        if a.conn is not None:
            a.conn = conn_of[a.conn]

    for s in t.streams:
        s.conn = conn_of[s.conn]
        for a in s.attempts:
            a.frame, a.response_frame = f(a.frame), g(a.response_frame)
        for sn in s.snapshots:
            sn.frame, sn.last_frame = f(sn.frame), g(sn.last_frame)
        if s.items and many is not None:
            items = s.items
            new = many([it[0] for it in items])
            make = type(items[0])._make
            s.items = [make((k, *it[1:])) for k, it in zip(new, items, strict=True)]
        if s.end is not None:
            s.end = {**s.end, "frame": f(s.end["frame"])}
        s.closed_frame, s.close_answered = g(s.closed_frame), g(s.close_answered)
        for a in s.anomalies:
            anomaly(a)
    for a in t.anomalies:
        anomaly(a)
    for branches in t.branches.values():
        for b in branches:
            b.first_frame, b.cut_frame = f(b.first_frame), g(b.cut_frame)
    t.logs = {vb: [(f(k), log) for k, log in logs] for vb, logs in t.logs.items()}
    t.flow = [x._replace(conn=conn_of[x.conn], frame=f(x.frame)) for x in t.flow]
    t.noops = [{**n, "conn": conn_of[n["conn"]], "frame": f(n["frame"]), "reply_frame": f(n["reply_frame"])} for n in t.noops]
    t.stalls = [{**n, "conn": conn_of[n["conn"]], "frame": f(n["frame"]), "ack_frame": f(n["ack_frame"])} for n in t.stalls]
    t.high_seqnos = {vb: (f(k), q) for vb, (k, q) in t.high_seqnos.items()}


def frames(spark: Any, paths: Iterable[str], **kwargs: Any) -> Any:
    """The frames table of ``paths`` as a Spark DataFrame (see :class:`Pipeline` for the options)."""
    return Pipeline(spark, paths, **kwargs).frames()


# --------------------------------------------------------------------------- the pipeline


class Pipeline:
    """The stages over one set of captures; the segment metadata is persisted once, the small keys table collected once.

    Args:
        spark: a SparkSession (classic or Connect).
        paths: capture files, globs or directories (read in this order, as one capture).
        split_size: bytes per range (a big file is read by many tasks).
        partitions: connection partitions for the frames stage (default: the session's shuffle partitions).
        options: decode options (ports, detection, secrets).
    """

    def __init__(
        self,
        spark: Any,
        paths: Iterable[str],
        *,
        split_size: int = DEFAULT_SPLIT_SIZE,
        partitions: int | None = None,
        options: Options = Options(),
    ) -> None:
        self.spark = spark
        self.paths = expand_paths(paths)
        self.split_size = split_size
        self.partitions = partitions or int(spark.conf.get("spark.sql.shuffle.partitions") or 4)
        self.options = options
        self._segs: Any = None
        self._data: Any = None
        self._keys: tuple[Numbering, list[_ConnPart], bool, int | None] | None = None
        self._timeline: tuple[Any, dict[int, int], int | None] | None = None
        self._sum: tuple[list[tuple[Any, ...]], tuple[list[tuple[str, int]], tuple[int, int]]] | None = None
        self._persisted = False

    def ranges(self) -> Any:
        """Stage 1: the byte ranges."""
        r = split(files_frame(self.spark, self.paths), self.split_size)
        return r.repartition(max(1, self.partitions), "file_index", "range_index")

    def segments(self) -> Any:
        """Stage 2 (persisted): segment metadata and range status rows."""
        if self._segs is None:
            self._segs = segments(self.ranges()).persist()
        return self._segs

    def _summary(self) -> tuple[list[tuple[Any, ...]], tuple[list[tuple[str, int]], tuple[int, int]]]:
        """One small job over the persisted segments: the per-file status rows, and the connections' sizes and capture end."""
        if self._sum is None:
            t = (
                self.segments()
                .filter("kind != 0")
                .select("kind", "file_index", "path", *_STATUS_INPUT, "ckey", "missing", "poff", "gpos", "ts")
            )
            rows = t.toArrow()
            self._sum = (status_rows(rows), connection_sizes(rows))
        return self._sum

    def status_rows(self) -> list[tuple[Any, ...]]:
        """The per-file status table's rows (:data:`STATUS_DDL`), on the driver."""
        return self._summary()[0]

    def status(self) -> Any:
        """The per-file status table."""
        return self.spark.createDataFrame(self.status_rows(), STATUS_DDL)

    def by_connection(self, *, persist: bool = True) -> Any:
        """Segment metadata by connection, in capture order (persisted unless ``persist`` is false: the keys and frames passes both read it)."""
        if self._data is None or (persist and not self._persisted):
            sizes = self._summary()[1]
            data, _last = by_connection(self.segments(), self.partitions, sizes)
            self._data = data.persist() if persist else data
            self._persisted = persist
        return self._data

    def last(self) -> tuple[int, int]:
        """Where the capture ends (ts, capture position of its last TCP segment): see :func:`capture_end`."""
        return self._summary()[1][1]

    def keys(self, *, build: bool = False, max_items: int | None = None) -> tuple[Numbering, list[_ConnPart]]:
        """Stage 3a, collected: the numbering (and with ``build`` the timeline part of each connection)."""
        k = self._keys
        if k is not None and (not build or (k[2] and k[3] == max_items)):
            return k[0], k[1]
        df = keys_pass(self.by_connection(), self.paths, last=self.last(), options=self.options, build=build, max_items=max_items)
        num, parts = collect_keys(df)
        self._keys = (num, parts, build, max_items)
        return num, parts

    def write_frames(
        self,
        out_dir: str,
        *,
        build: bool = False,
        max_items: int | None = None,
        sample: int = 0,
        items_out: tuple[str, str] | None = None,
    ) -> tuple[Numbering, pa.Table | None]:
        """The frames table as parquet under ``out_dir``, in one decode (see :func:`write_frames`); with ``build`` the timelines too."""
        num, parts, picked = write_frames(
            self.by_connection(persist=self._persisted),
            self.paths,
            out_dir,
            last=self.last(),
            options=self.options,
            build=build,
            max_items=max_items,
            partitions=self.partitions,
            sample=sample,
            items_out=items_out,
        )
        self._keys = (num, parts, build, max_items)
        self._timeline = None
        return num, picked

    def numbering(self) -> Numbering:
        """Global frame and connection numbers (from the keys pass)."""
        return self.keys()[0]

    def frames(self) -> Any:
        """The frames table (global frame and connection numbers, Spark types): decoded once more, straight to whatever consumes it."""
        return frames_numbered(self.by_connection(), self.paths, self.numbering(), last=self.last(), options=self.options)

    def timeline(self, *, max_items: int | None = None) -> Any:
        """The timeline of the whole capture, exactly the single-process one (built per connection, merged on the driver).

        With ``max_items`` each stream keeps at most that many items (and each
        connection as many flow samples) - enough for plots, far less to
        collect; :meth:`timeline_tables` still reports the true counts.
        """
        if self._timeline is not None and self._timeline[2] == max_items:
            return self._timeline[0]
        num, parts = self.keys(build=True, max_items=max_items)
        t, counts = merge_timelines(parts, num.frames_of)
        _renumber(t, num.frame, num.conn_ids)
        self._timeline = (t, counts, max_items)
        return t

    def stream_items(self, *, max_items: int | None = None) -> dict[int, int]:
        """The true item count of each stream of :meth:`timeline` (by index), however thinned its items are."""
        self.timeline(max_items=max_items)
        return dict(self._timeline[1]) if self._timeline is not None else {}

    def timeline_tables(self, *, max_items: int | None = None) -> dict[str, Any]:
        """The timeline DataFrames of :func:`dcpinspect.timeline_tables.timeline_frames` (pandas), with true item counts."""
        from .timeline_tables import timeline_frames

        t = self.timeline(max_items=max_items)
        counts = self._timeline[1] if self._timeline is not None else {}
        tables = timeline_frames(t, items=max_items is None)
        if max_items is not None:
            st = tables["streams"]
            if len(st):
                st["items"] = [counts[i] for i in st["stream"]]
        return tables

    def unpersist(self) -> None:
        """Drop the persisted stages."""
        for df in (self._data, self._segs):
            if df is not None:
                df.unpersist()
        self._data = self._segs = None
        self._keys = self._timeline = self._sum = None
        self._persisted = False


# --------------------------------------------------------------------------- the data source


def register_data_source(spark: Any) -> None:
    """Register ``spark.read.format("dcpinspect")`` (see :mod:`dcpinspect.spark_source`)."""
    from .spark_source import DcpDataSource

    spark.dataSource.register(DcpDataSource)


# --------------------------------------------------------------------------- command line


#: the timeline tables ``analyze`` writes (``items`` and ``flow`` too with ``items=True``)
TIMELINE_TABLES = ("connections", "streams", "attempts", "snapshots", "failover", "rollbacks", "noops", "stalls", "anomalies")
REPORT_ITEMS = 500  # items per stream (and flow samples per connection) kept for the report when items are not written


def arrow_for_spark(df: Any) -> pa.Table:
    """A pandas table (e.g. a timeline DataFrame) as Arrow with Spark's conventions.

    uint64 -> ``decimal(20,0)``, smaller unsigned -> the next signed type,
    timestamps -> microseconds UTC, failover logs -> ``list<struct<uuid, seqno>>``,
    all-null columns -> string.
    """
    arrays, names = [], []
    for name in df.columns:
        col = df[name]
        if name == "failover_log":
            typ = pa.list_(pa.struct([("uuid", pa.uint64()), ("seqno", pa.uint64())]))
            arr = pa.array([None if v is None else [{"uuid": u, "seqno": q} for u, q in v] for v in col], typ)
        else:
            try:
                arr = pa.array(col, from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                arr = pa.array([None if v is None else str(v) for v in col], pa.string())
        # nanoseconds -> Spark's microseconds drops digits: allowed (only) there
        arrays.append(pc.cast(arr, _spark_type(arr.type), safe=not pa.types.is_timestamp(arr.type)))
        names.append(str(name))
    return pa.Table.from_arrays(arrays, names=names)


def _spark_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_uint64(t):
        return pa.decimal128(20, 0)
    if pa.types.is_uint32(t):
        return pa.int64()
    if pa.types.is_uint16(t):
        return pa.int32()
    if pa.types.is_uint8(t):
        return pa.int16()
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_list(t):
        return pa.list_(_spark_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _spark_type(f.type)) for f in t])
    return t


def _is_connect(spark: Any) -> bool:
    return "connect" in type(spark).__module__


MANIFEST = ".dcpinspect-analyze.json"  # marks a directory analyze wrote, and lists what it wrote there
_TMP_PREFIX = "_dcpinspect-tmp-"


class OutputError(RuntimeError):
    """``analyze --out`` names a place it must not write to (one line, for the user)."""


def analyze_outputs(*, items: bool, report: bool) -> list[str]:
    """The entries ``analyze`` writes under its output directory."""
    names = ["frames", "file_status", *TIMELINE_TABLES]
    if items:
        names += ["items", "flow"]
    if report:
        names.append("report.html")
    return names


def _remove(fs: Any, path: str) -> None:
    """Remove one entry: a symbolic link itself (never what it points to), a directory tree or a file."""
    from pyarrow import fs as pafs

    if isinstance(fs, pafs.LocalFileSystem) and os.path.islink(path):
        os.unlink(path)
        return
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif kind != pafs.FileType.NotFound:
        fs.delete_file(path)


def prepare_output(out_dir: str, entries: list[str], *, overwrite: bool = False) -> None:
    """Make ``out_dir`` ready for ``entries``, never deleting what analyze did not write, unless ``overwrite``.

    A missing or empty directory is created and claimed.  A directory that holds
    an earlier analyze output (its :data:`MANIFEST`) has the entries listed there
    replaced; anything else in it stays.  Any other non-empty directory, or an
    entry to be written that the manifest does not list, is refused with
    :class:`OutputError` unless ``overwrite``.  The manifest is written first
    (``complete: false``) so that an interrupted run can be re-run, and
    completed by :func:`finish_output`.
    """
    import json

    from pyarrow import fs as pafs

    out = str(out_dir).rstrip("/") or "/"
    fs, p = _fs(out)
    try:
        info = fs.get_file_info(p)
        if info.type == pafs.FileType.NotFound:
            fs.create_dir(p, recursive=True)
            present: dict[str, Any] = {}
        elif info.type != pafs.FileType.Directory:
            raise OutputError(f"--out {out}: exists and is not a directory")
        else:
            present = {e.base_name: e for e in fs.get_file_info(pafs.FileSelector(p, recursive=False))}
        ours: set[str] = set()
        if MANIFEST in present:
            try:
                with fs.open_input_stream(f"{p}/{MANIFEST}") as f:
                    ours = set(json.loads(f.read().decode("utf-8"))["entries"])
            except (ValueError, KeyError, TypeError, OSError):
                raise OutputError(f"--out {out}: its {MANIFEST} is unreadable; use another directory or --overwrite") from None
        elif present and not overwrite:
            raise OutputError(
                f"--out {out}: the directory is not empty and holds no earlier analyze output ({MANIFEST}); "
                "name a new or empty directory, or give --overwrite"
            )
        foreign = [n for n in entries if n in present and n not in ours]
        if foreign and not overwrite:
            raise OutputError(f"--out {out}: {', '.join(foreign)} was not written by analyze; give --overwrite to replace it")
        stale = [n for n in present if n in ours or n in entries or (n.startswith(_TMP_PREFIX) and MANIFEST in present)]
        for name in stale:
            _remove(fs, f"{p}/{name}")
        _write_text(f"{out}/{MANIFEST}", json.dumps({"tool": "dcpinspect analyze", "complete": False, "entries": entries}) + "\n")
    except OSError as exc:
        raise OutputError(f"--out {out}: {exc.strerror or exc}") from None


def finish_output(out_dir: str, entries: list[str], counts: dict[str, Any]) -> None:
    """Mark ``out_dir``'s manifest complete, with the run's counts."""
    import json

    doc = {"tool": "dcpinspect analyze", "complete": True, "entries": entries, "counts": counts}
    _write_text(f"{str(out_dir).rstrip('/')}/{MANIFEST}", json.dumps(doc) + "\n")


def _write_text(path: str, text: str) -> None:
    fs, p = _fs(path)
    with fs.open_output_stream(p) as f:
        f.write(text.encode("utf-8"))


def _write_frames(spark: Any, fr: Any, path: str) -> None:
    """The frames table as parquet, timestamps as ``TIMESTAMP_MICROS`` (not Spark's legacy INT96: ~15 % less writer CPU, and standard)."""
    key = "spark.sql.parquet.outputTimestampType"
    old = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        fr.write.mode("overwrite").parquet(path)
    finally:
        if old is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, old)


def analyze(
    spark: Any,
    paths: Iterable[str],
    out_dir: str,
    *,
    split_size: int = DEFAULT_SPLIT_SIZE,
    partitions: int | None = None,
    options: Options = Options(),
    items: bool = False,
    report: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the whole pipeline; write parquet tables and ``report.html`` under ``out_dir``; return counts.

    ``out_dir`` must be new, empty or an earlier analyze output (see
    :func:`prepare_output`; ``overwrite`` replaces whatever is in the way).

    Tables: ``frames``, ``file_status`` and the timeline tables of
    :data:`TIMELINE_TABLES` (plus ``items`` and ``flow`` with ``items``), each a
    directory of parquet files.  The merged timeline keeps at most
    :data:`REPORT_ITEMS` items per stream for the plots (the counts stay
    exact); with ``items`` every item and flow sample is written by the tasks
    that decode them, as the frames are.
    """
    out = str(out_dir).rstrip("/")
    entries = analyze_outputs(items=items, report=report)
    prepare_output(out, entries, overwrite=overwrite)
    p = Pipeline(spark, paths, split_size=split_size, partitions=partitions, options=options)
    limit = 200_000  # frames sampled for the report's plot
    direct = "://" not in out and not _is_connect(spark)  # the driver holds the small tables: write them itself

    def small(name: str, table: pa.Table) -> None:
        if direct:
            import pyarrow.parquet as pq

            d = Path(out) / name
            d.mkdir(parents=True)  # prepare_output cleared the way
            pq.write_table(table, d / "part-00000.parquet")
        else:
            from pyspark.sql.pandas.types import from_arrow_schema

            # the schema given: Spark Connect cannot infer one from an empty table
            spark.createDataFrame(table, schema=from_arrow_schema(table.schema)).coalesce(1).write.mode("overwrite").parquet(
                f"{out}/{name}"
            )

    timings: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        timings[name] = round(now - clock[0], 3)
        clock[0] = now

    try:
        rows = [dict(zip(STATUS_NAMES, r, strict=True)) for r in p.status_rows()]
        small("file_status", _status_table(rows))
        lap("read and segments")
        max_items = REPORT_ITEMS
        # one decode: frames, numbering, timelines (and the report's sample of frames; every item and flow sample with items)
        num, picked = p.write_frames(
            f"{out}/frames",
            build=True,
            max_items=max_items,
            sample=limit if report else 0,
            items_out=(f"{out}/items", f"{out}/flow") if items else None,
        )
        n = num.frames
        lap("shuffle, decode, frames written")
        t = p.timeline(max_items=max_items)
        lap("timelines merged")
        tables = p.timeline_tables(max_items=max_items)
        for name, df in tables.items():
            if name in TIMELINE_TABLES:
                small(name, arrow_for_spark(df))
        lap("timeline tables written")
        res: dict[str, Any] = {
            "files": len(rows),
            "frames": n,
            "connections": len(num.conn_ids),
            "streams": len(t.streams),
            "anomalies": len(t.anomalies),
            "status": rows,
            "timings": timings,
        }
        if report:
            from .report import render_report

            counts = {k: res[k] for k in ("files", "frames", "connections", "streams", "anomalies")}
            page = render_report(t, picked, rows, counts=counts, sampled=n > limit, stream_items=p.stream_items(max_items=max_items))
            _write_text(f"{out}/report.html", page)
            lap("report")
        finish_output(out, entries, {k: res[k] for k in ("files", "frames", "connections", "streams", "anomalies")})
    finally:
        p.unpersist()
    return res


def command(argv: list[str], *, out: TextIO) -> int:
    """``dcpinspect analyze PATH... --out DIR [--master URL | --remote sc://...] [--split-size BYTES]``."""
    ap = argparse.ArgumentParser(
        prog="dcpinspect analyze",
        description="Run the captures -> frames -> timelines pipeline on Spark; write parquet tables and an HTML report.",
    )
    ap.add_argument("paths", nargs="+", help="capture files, globs or directories (read in order, as one capture)")
    ap.add_argument("--out", required=True, help="output directory: parquet tables (frames/, file_status/, streams/, ...) and report.html")
    ap.add_argument("--master", help="Spark master (default: local[*]; leave out under spark-submit)")
    ap.add_argument("--remote", help="Spark Connect URL, e.g. sc://127.0.0.1:15002 (default: $SPARK_REMOTE)")
    ap.add_argument(
        "--connect-timeout",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long a Spark Connect server has to answer (default: {DEFAULT_CONNECT_TIMEOUT:g})",
    )
    ap.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per range of a big file")
    ap.add_argument("--partitions", type=int, help="connection partitions of the frames stage")
    ap.add_argument("--port", type=int, action="append", help="memcached server port (repeatable; default 11210, 11209, 11211)")
    ap.add_argument("--items", action="store_true", help="also write the items and flow tables (one row per data message)")
    ap.add_argument("--no-report", action="store_true", help="do not write report.html")
    ap.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --out that is not an earlier analyze output, replacing entries named like its tables",
    )
    args = ap.parse_args(argv)
    if not expand_paths(args.paths):
        sys.stderr.write("dcpinspect: error: no capture files match\n")
        return 2
    entries = analyze_outputs(items=args.items, report=not args.no_report)
    try:
        prepare_output(args.out, entries, overwrite=args.overwrite)  # refused before Spark starts
    except OutputError as exc:
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
        return 2
    t0 = time.perf_counter()
    try:
        spark = get_session(args.remote, master=args.master, connect_timeout=args.connect_timeout)
    except ConnectTimeout as exc:
        # Spark's Connect client goes on retrying in threads that hold the process open for minutes: leave now
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
        sys.stderr.flush()
        out.flush()
        os._exit(2)
    except RuntimeError as exc:
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
        return 2
    opts = Options(server_ports=tuple(args.port)) if args.port else Options()
    started = time.perf_counter() - t0
    res = analyze(
        spark,
        args.paths,
        args.out,
        split_size=args.split_size,
        partitions=args.partitions,
        options=opts,
        items=args.items,
        report=not args.no_report,
        overwrite=args.overwrite,
    )
    out.write(
        f"{res['files']} files, {res['connections']} connections, {res['frames']} frames, {res['streams']} streams, "
        f"{res['anomalies']} anomalies -> {args.out}\n"
    )
    for st in res["status"]:
        if st["status"] != "ok":
            reason = st["error"] or "; ".join(st["problems"])
            out.write(f"  {st['path']}: {st['status']}: {reason}\n")
    out.write("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in {"session": started, **res["timings"]}.items()) + "\n")
    return 0
