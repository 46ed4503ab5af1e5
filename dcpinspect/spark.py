"""The data pipeline on Spark: captures -> segments -> frames (an edge: imports pyspark lazily).

Thin glue over the core - no second decoder.  Each stage is a function from
DataFrame to DataFrame:

1. :func:`split`: each file into record-aligned byte ranges (pcap: record
   headers walked; pcapng: blocks walked), so one big file is read by many
   tasks.  Each range carries the file's header bytes (pcap global header;
   pcapng section header and interface blocks) so the core's
   :class:`~dcpinspect.capture.CaptureReader` reads it as a capture of its own.
2. :func:`segments`: the TCP segments of each range through the core's
   ``CaptureReader`` and :func:`~dcpinspect.packets.parse_packet` - small
   metadata columns (file index, packet number, time, endpoints, sequence
   number, flags) and the payload's byte offset and length in its file, not
   the payload.  Per-range status rows (format, error, problems) travel along.
3. :func:`frames`: repartition by connection, sort within partitions by
   capture position, and ``mapInArrow``: each task reads payload bytes straight
   from the files (``pyarrow.fs``, so cluster storage works the same) through a
   bounded window, runs the core's reassembler, decoder and context
   (:func:`~dcpinspect.records.iter_chunks`) and emits the frames table with
   :func:`~dcpinspect.batches.chunk_batch`.  Frame and connection numbers are
   then made global (the single-process numbering) with two small joins.

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
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import spec
from .batches import SCHEMA, chunk_batch
from .capture import _PCAP_MAGICS, _PCAPNG_SHB, MAX_RECORD, CaptureError, CaptureReader
from .columns import FRAME_COLUMNS
from .decoder import Frame
from .dissect import DissectContext
from .flows import DEFAULT_SERVER_PORTS, TLS_PORTS, Segment
from .packets import parse_packet
from .records import CaptureStats, Record, RecordChunk, iter_chunks

__all__ = [
    "DEFAULT_SPLIT_SIZE",
    "TIMELINE_TABLES",
    "Pipeline",
    "analyze",
    "arrow_for_spark",
    "command",
    "file_status",
    "files_frame",
    "frames",
    "get_session",
    "merge_timelines",
    "numbering",
    "register_data_source",
    "segments",
    "split",
    "timelines",
]

DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024
GPOS_SHIFT = 40  # capture position: file index << 40 | packet number
CLOSE_BASE = 1 << 61  # records emitted at the end of the capture sort after every packet
WINDOW = 256 * 1024  # payload bytes read at once per file in a frames task
_BLOCK_SHIFT = 16  # numbering blocks: 65,536 capture positions each

# --------------------------------------------------------------------------- session


def check_java() -> str:
    """The ``java`` on the path (JAVA_HOME first), or a clear error when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if not java:
        raise RuntimeError("Spark needs Java 17 or later: no 'java' found (install a JRE, e.g. apt-get install openjdk-17-jre-headless)")
    return java


def get_session(remote: str | None = None, *, master: str | None = None, cores: int | None = None, memory: str = "2g") -> Any:
    """A SparkSession: Spark Connect (``remote`` or ``SPARK_REMOTE``), an existing one, or a quiet local one.

    Under ``spark-submit --master ...`` the master given there is kept; otherwise a
    local session starts (``local[cores]``, ``local[*]`` by default) with no UI,
    Arrow on, a few shuffle partitions, and workers on this interpreter
    (``PYSPARK_PYTHON``), where the package is installed.
    """
    from pyspark.sql import SparkSession

    remote = remote or os.environ.get("SPARK_REMOTE")
    if remote:
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
    if not submitted:  # a local session: bind to loopback, and log errors only from the JVM's start
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        log4j = Path(__file__).with_name("log4j2.properties")
        b = b.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j.as_uri()}")
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
    ("kind", pa.int8()),  # 0 segment, 1 range status
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
            seg_cols = [cols[k] for k in ("ts", "src", "sport", "dst", "dport", "seq", "flags", "missing")]
            gpos, ckey, poff, plen = cols["gpos"], cols["ckey"], cols["poff"], cols["plen"]
            try:
                for pkt in _read_range(reader, fh):
                    seg = parse_packet(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, path, skipped)
                    if seg is None:
                        continue
                    block = fh.absolute(pkt.offset)
                    if reader.format == "pcap":
                        data_at = block + 16
                    else:
                        simple = fh.last8[:4] in (b"\x03\x00\x00\x00", b"\x00\x00\x00\x03")  # simple packet block
                        data_at = block + (12 if simple else 28)
                    payload, data = seg.payload, pkt.data
                    n = len(payload)
                    if not n:
                        at = 0
                    elif data.endswith(payload):
                        at = len(data) - n
                    else:  # Ethernet padding after the payload: any copy of the same bytes will do
                        at = data.find(payload)
                    gpos.append(base | pkt.number)
                    a, b2 = (seg.src, seg.sport), (seg.dst, seg.dport)
                    lo, hi = (a, b2) if a <= b2 else (b2, a)
                    ckey.append(f"{lo[0]}|{lo[1]}|{hi[0]}|{hi[1]}")
                    poff.append(data_at + at)
                    plen.append(n)
                    for col, v in zip(
                        seg_cols, (seg.ts, seg.src, seg.sport, seg.dst, seg.dport, seg.seq, seg.flags, seg.missing), strict=True
                    ):
                        col.append(v)
            except CaptureError as exc:
                error = str(exc)
    n = len(cols["gpos"])
    for name in ("kind", "file_index", "path", "range_index", "format", "error", "problems", "packets", "linktypes", "skipped"):
        cols[name] += [None] * n
    cols["kind"][:n] = [0] * n
    cols["file_index"][:n] = [file_index] * n
    problems = [f"{msg} (at byte offset {fh_abs})" for fh_abs, msg in _abs_problems(reader, prefix, start)]
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
    }
    for name, _ in _SEG_FIELDS:
        cols[name].append(status.get(name))
    return pa.RecordBatch.from_pydict(cols, schema=SEG_SCHEMA)


def _abs_problems(reader: CaptureReader, prefix: bytes, start: int) -> list[tuple[int, str]]:
    return [(start + off - len(prefix), msg) for off, msg in reader.problems]


def segments(ranges: Any) -> Any:
    """Stage 2: ranges -> TCP segment metadata (``kind`` 0) and one status row per range (``kind`` 1)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                yield range_segments(
                    row["file_index"], row["path"], row["range_index"], row["start"], row["end"], row["first_packet"], row["prefix"]
                )

    return ranges.mapInArrow(run, SEG_DDL)


def file_status(segs: Any) -> Any:
    """The per-file status table: format, packets, error, problems, link types (one row per file)."""
    from pyspark.sql import functions as F

    st = segs.filter("kind = 1")
    ordered = F.array_sort(F.collect_list(F.struct("range_index", "problems", "error", "linktypes")))
    agg = st.groupBy("file_index", "path").agg(
        F.max("format").alias("format"),
        F.sum("packets").alias("packets"),
        ordered.alias("_r"),
    )
    error = F.try_element_at(F.filter(F.transform("_r", lambda r: r["error"]), lambda e: e.isNotNull()), F.lit(1))
    problems = F.flatten(F.transform("_r", lambda r: r["problems"]))
    status = F.when(error.isNotNull(), F.lit("error")).when(F.size(problems) > 0, F.lit("problems")).otherwise(F.lit("ok"))
    return agg.select(
        "file_index",
        "path",
        status.alias("status"),
        "format",
        "packets",
        error.alias("error"),
        problems.alias("problems"),
        F.array_sort(F.array_distinct(F.flatten(F.transform("_r", lambda r: r["linktypes"])))).alias("linktypes"),
    ).orderBy("file_index")


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
_HELPERS = "_kind byte, _k1 bigint, _k2 bigint, _ck bigint"
RAW_DDL = FRAMES_DDL + ", " + _HELPERS
_COLTYPES = {name: t for name, t, _ in FRAME_COLUMNS}


def spark_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A frames-table Arrow batch (``batches.SCHEMA``) with Spark's types (uint64 -> decimal(20,0), ...)."""
    arrays, fields = [], []
    for f in SCHEMA:
        arr = batch.column(f.name)
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

    def chunks(self) -> Iterator[tuple[RecordChunk, list[int], list[int], list[int]]]:
        """(chunk with real file names, k1, k2, ck per record)."""
        o = self.options
        prev = [-1, 0]  # (k1, records so far at k1)
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
            counts = chunk.counts
            k1 = [k for k, n in zip(k1s, counts, strict=True) for _ in range(n)]
            k2 = []
            pk, pn = prev
            for k in k1:
                if k != pk:
                    pk, pn = k, 0
                k2.append(pn)
                pn += 1
            prev[:] = [pk, pn]
            ck = [adopted[c] for c, n in zip(chunk.conn, counts, strict=True) for _ in range(n)]
            yield chunk, k1, k2, ck
        self._sync()


_SEG_INPUT = ("file_index", "gpos", "ts", "src", "sport", "dst", "dport", "seq", "flags", "poff", "plen", "missing")


def frames_task(batches: Iterable[pa.RecordBatch], paths: list[str], last: tuple[int, int], options: Options) -> Iterator[pa.RecordBatch]:
    """Stage 3 in one task: segment metadata (in capture order) -> frames rows with numbering keys.

    The frames get ``_k1``, ``_k2`` and ``_ck`` (see :class:`_Keyed`);
    connection rows (``_kind`` 1) list every connection, records or not.
    """
    keyed = _Keyed(batches, paths, last, options)
    for chunk, k1, k2, ck in keyed.chunks():
        b = spark_batch(chunk_batch(chunk))
        n = b.num_rows
        yield _with_helpers(b, pa.array(np.zeros(n, np.int8)), pa.array(k1, pa.int64()), pa.array(k2, pa.int64()), pa.array(ck, pa.int64()))
    adopted, labels = keyed.adopted, keyed.labels
    if adopted:
        ids = sorted(adopted)
        n = len(ids)
        cols = {f.name: pa.nulls(n, _ARROW_OUT.get(_COLTYPES[f.name], f.type)) for f in SCHEMA}
        cols["conn"] = pa.array([labels[i] for i in ids], pa.string())
        b = pa.RecordBatch.from_arrays(list(cols.values()), names=list(cols))
        yield _with_helpers(
            b,
            pa.array([1] * n, pa.int8()),
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.int64()),
            pa.array([adopted[i] for i in ids], pa.int64()),
        )


def _with_helpers(b: pa.RecordBatch, kind: pa.Array, k1: pa.Array, k2: pa.Array, ck: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([*b.columns, kind, k1, k2, ck], names=[*b.schema.names, "_kind", "_k1", "_k2", "_ck"])


def capture_end(segs: Any) -> tuple[int, int]:
    """(ts, capture position) of the capture's last TCP segment: where the single-process read ends."""
    from pyspark.sql import functions as F

    row = segs.filter("kind = 0").agg(F.max_by(F.struct("ts", "gpos"), "gpos").alias("m")).collect()[0]["m"]
    if row is None:
        return 0, 0
    return int(row["ts"]), int(row["gpos"])


def frames_raw(segs: Any, paths: list[str], *, partitions: int, last: tuple[int, int], options: Options = Options()) -> Any:
    """Stage 3: shuffle segment metadata by connection, sort by capture position, reassemble and decode per task."""
    data = segs.filter("kind = 0").select(
        "file_index", "gpos", "ckey", "ts", "src", "sport", "dst", "dport", "seq", "flags", "poff", "plen", "missing"
    )
    data = data.repartition(partitions, "ckey").sortWithinPartitions("gpos")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from frames_task(batches, paths, last, options)

    return data.mapInArrow(run, RAW_DDL)


def numbering(raw: Any) -> tuple[Any, Any]:
    """(``_k1`` -> ``_c`` frames completed before that capture position, ``_ck`` -> ``_cid`` connection id) from stage 3's keys."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    conn_ids = raw.filter("_kind = 1").select("_ck").withColumn("_cid", F.row_number().over(Window.orderBy("_ck")).cast("int"))
    fr = raw.filter("_kind = 0")
    cnt = fr.groupBy("_k1").count().withColumn("_blk", F.shiftright("_k1", _BLOCK_SHIFT))
    before = Window.unboundedPreceding
    blocks = (
        cnt.groupBy("_blk")
        .agg(F.sum("count").alias("_n"))
        .withColumn("_bstart", F.coalesce(F.sum("_n").over(Window.orderBy("_blk").rowsBetween(before, -1)), F.lit(0)))
    )
    within = cnt.withColumn(
        "_wstart", F.coalesce(F.sum("count").over(Window.partitionBy("_blk").orderBy("_k1").rowsBetween(before, -1)), F.lit(0))
    )
    ctab = within.join(F.broadcast(blocks.select("_blk", "_bstart")), "_blk").select(
        "_k1", (F.col("_bstart") + F.col("_wstart")).alias("_c")
    )
    return ctab, conn_ids


def number(raw: Any, tables: tuple[Any, Any] | None = None) -> Any:
    """Global frame and connection numbers (those of the single-process path), from the task-local keys."""
    from pyspark.sql import functions as F

    ctab, conn_ids = tables if tables is not None else numbering(raw)
    fr = raw.filter("_kind = 0")
    out = fr.join(F.broadcast(ctab), "_k1").join(F.broadcast(conn_ids), "_ck")
    names = [name for name, _, _ in FRAME_COLUMNS]
    sel = []
    for name in names:
        if name == "frame":
            sel.append((F.col("_c") + F.col("_k2") + 1).cast("bigint").alias("frame"))
        elif name == "conn_id":
            sel.append(F.col("_cid").alias("conn_id"))
        else:
            sel.append(F.col(name))
    return out.select(*sel)


# --------------------------------------------------------------------------- stage 4: timelines
#
# Each connection's records are fed, in order, to a TimelineBuilder of its own
# on the task that decoded them (record numbers are the keys K = k1 << KSHIFT | k2,
# which sort exactly like the global frame numbers; connection ids are the
# positions ``ck`` that made them known, which sort like the global ids).
# What crosses connections - the failover branch tree of each vbucket (merged
# from every log of every connection, in capture order) and the replay of the
# producer's rollback rule (which reads those logs, the high and purge seqnos
# and the highest seqno seen on the vbucket) - is rebuilt on the driver by
# the same TimelineBuilder fed, in global order, only the records that can
# change it: requests that expect a response, every response, the markers
# that carried a purge seqno, and per rollback the highest seqno seen on each
# vbucket before it.  The pieces are then put in the single-process order and
# renumbered.

KSHIFT = 24  # records completed by one packet (or at the end of one connection) per k1: < 2**24
_ROLLBACK_STATUS = 0x23
TIMELINE_DDL = "ck bigint, blob binary"
_SYNTH_CONN = -1  # the driver's stand-in connection for "highest seqno seen" items


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
    highest: list[tuple[int, int, int]]  # (T, vbucket, highest seqno before T): T = -1 for the end


def _rec_tuple(r: Record) -> tuple[Any, ...]:
    ev: Any = r.event  # always a Frame here
    return (r.number, r.file, r.conn, r.conn_label, r.direction, r.ts, r.ts_first, r.packet, r.packet_first, tuple(ev), r.context)


def _rec_from(t: tuple[Any, ...]) -> Record:
    return Record(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], Frame(*t[9]), t[10])


def timelines_task(
    batches: Iterable[pa.RecordBatch],
    paths: list[str],
    last: tuple[int, int],
    options: Options,
    rollbacks: list[int],
    max_items: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stage 4 in one task: decode (as stage 3) and build one timeline per connection; one pickled part per connection.

    ``rollbacks`` are the keys of every rollback response of the capture (all
    connections); ``max_items`` thins each stream's items (and each
    connection's flow samples) kept for the driver, counts stay exact.
    """
    import pickle

    from .timeline import EXPECTS_RESPONSE, TimelineBuilder

    keyed = _Keyed(batches, paths, last, options)
    builders: dict[int, TimelineBuilder] = {}
    first: dict[int, int] = {}
    born: dict[int, list[int]] = {}
    raised: dict[int, list[int]] = {}
    control: dict[int, list[Record]] = {}
    markers: dict[int, dict[int, Record]] = {}
    responses = spec.RESPONSE_MAGICS
    for chunk, k1, k2, ck in keyed.chunks():
        for r0, a, b, c in zip(chunk.records(), k1, k2, ck, strict=True):
            rec = r0._replace(number=a << KSHIFT | b, conn=c)
            bl = builders.get(c)
            if bl is None:
                bl = builders[c] = TimelineBuilder()
                first[c], born[c], raised[c], control[c], markers[c] = rec.number, [], [], [], {}
            ns, na = len(bl._streams), len(bl._anomalies)
            bl.feed(rec)
            if len(bl._streams) != ns:
                born[c].append(rec.number)
            if len(bl._anomalies) != na:
                raised[c].extend([rec.number] * (len(bl._anomalies) - na))
            ev = rec.event
            if ev.__class__ is Frame and ev[2] == "mcbp":
                raw = ev[1]
                magic, op = raw[0], raw[1]
                if magic in responses and magic != 0x83:
                    control[c].append(rec)
                elif magic in (0x80, 0x08):
                    if op in EXPECTS_RESPONSE:
                        control[c].append(rec)
                    elif op == 0x56 and raw[4] != 20:  # a v2 marker: may carry the purge seqno
                        markers[c][rec.number] = rec
    ts_sorted = sorted(rollbacks)
    for c, bl in builders.items():
        t = bl.timeline()
        purge = {sn.frame for s in t.streams for sn in s.snapshots if isinstance(sn.purge_seqno, int)}
        ctl = control[c] + [r for k, r in markers[c].items() if k in purge]
        ctl.sort(key=lambda r: r.number)
        counts = [len(s.items) for s in t.streams]
        highest = _highest(t.streams, ts_sorted)
        flow = t.flow
        if max_items is not None:
            for s in t.streams:
                s.items = _thin(s.items, max_items)
            flow = _thin(flow, max_items)
        nrt = len(bl._anomalies)
        part = _ConnPart(
            c,
            first[c],
            t.connections[c],
            list(zip(born[c], t.streams, strict=True)),
            list(zip(raised[c], t.anomalies[:nrt], strict=True)),
            t.anomalies[nrt:],
            flow,
            t.noops,
            t.stalls,
            counts,
            [_rec_tuple(r) for r in ctl],
            highest,
        )
        yield pa.RecordBatch.from_arrays(
            [pa.array([c], pa.int64()), pa.array([pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)], pa.binary())], names=["ck", "blob"]
        )


def _thin(xs: list[Any], n: int) -> list[Any]:
    if len(xs) <= n:
        return xs
    step = len(xs) / n
    picked = [xs[int(i * step)] for i in range(n - 1)]
    return [*picked, xs[-1]]


def _highest(streams: list[Any], rollbacks: list[int]) -> list[tuple[int, int, int]]:
    """Per vbucket, the highest item seqno this connection had seen before each rollback (when it changed), and at the end."""
    from bisect import bisect_left

    per_vb: dict[int, list[tuple[int, int]]] = {}
    for s in streams:
        lst = per_vb.setdefault(s.vbucket, [])
        lst.extend((it.frame, it.seqno) for it in s.items if it.seqno is not None)
    out: list[tuple[int, int, int]] = []
    for vb, items in per_vb.items():
        if not items:
            continue
        items.sort()
        keys = [k for k, _ in items]
        best, run = [], -1
        for _, q in items:
            run = max(run, q)
            best.append(run)
        prev = None
        for t in rollbacks:
            i = bisect_left(keys, t)
            if i and best[i - 1] != prev:
                prev = best[i - 1]
                out.append((t, vb, prev))
        out.append((-1, vb, best[-1]))
    return out


def timelines(
    segs: Any,
    paths: list[str],
    *,
    partitions: int,
    last: tuple[int, int],
    rollbacks: list[int],
    options: Options = Options(),
    max_items: int | None = None,
) -> Any:
    """Stage 4: per connection, the core's TimelineBuilder on each task (``ck``, pickled part); merge with :func:`merge_timelines`."""
    data = segs.filter("kind = 0").select(*_SEG_INPUT, "ckey")
    data = data.repartition(partitions, "ckey").sortWithinPartitions("gpos").drop("ckey")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from timelines_task(batches, paths, last, options, rollbacks, max_items)

    return data.mapInArrow(run, TIMELINE_DDL)


def merge_timelines(parts: list[_ConnPart]) -> tuple[Any, dict[int, int]]:
    """The single-process :class:`~dcpinspect.timeline.Timeline` (still in keys) from the per-connection parts.

    Returns the timeline and the true item count of each stream (by index;
    items may have been thinned).  :func:`_renumber` then turns keys into
    frame numbers.
    """
    import heapq

    from .decoder import decode
    from .encode import encode
    from .timeline import Timeline, TimelineBuilder

    parts = sorted(parts, key=lambda p: p.first)
    # the cross-connection replay (failover branches, rollback explanations)
    replay = TimelineBuilder()
    highest = sorted((t, vb, q) for p in parts for t, vb, q in p.highest)
    pending_hi: dict[int, list[tuple[int, int]]] = {}
    end_hi: dict[int, int] = {}
    for t, vb, q in highest:
        if t < 0:
            end_hi[vb] = max(end_hi.get(vb, -1), q)
        else:
            pending_hi.setdefault(t, []).append((vb, q))
    seen: dict[int, int] = {}

    def synth(vb: int, q: int, number: int) -> None:
        if seen.get(vb, -1) >= q:
            return
        seen[vb] = q
        raw = encode(
            "DCP_MUTATION",
            vbucket=vb,
            extras={"by_seqno": q, "rev_seqno": 0, "flags": 0, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0},
        )
        ev = decode(raw)[0]
        replay.feed(Record(number, "", _SYNTH_CONN, "", "s2c", 0, 0, 0, 0, ev, DissectContext()))

    records = heapq.merge(*([_rec_from(t) for t in p.control] for p in parts), key=lambda r: r.number)
    for r in records:
        for vb, q in pending_hi.pop(r.number, ()):
            synth(vb, q, r.number)
        replay.feed(r)
    for vb, q in end_hi.items():
        synth(vb, q, 0)
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


def _renumber(t: Any, f: Any, conn_of: dict[int, int]) -> None:
    """Keys -> frame numbers and ``ck`` -> connection ids, in place, everywhere a Timeline holds them."""

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
        s.items = [it._replace(frame=f(it.frame)) for it in s.items]
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
    """The stages over one set of captures; intermediate tables are persisted once.

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
        self._raw: Any = None
        self._num: tuple[Any, Any] | None = None
        self._timeline: tuple[Any, dict[int, int], int | None] | None = None

    def ranges(self) -> Any:
        """Stage 1: the byte ranges."""
        r = split(files_frame(self.spark, self.paths), self.split_size)
        return r.repartition(max(1, self.partitions), "file_index", "range_index")

    def segments(self) -> Any:
        """Stage 2 (persisted): segment metadata and range status rows."""
        if self._segs is None:
            self._segs = segments(self.ranges()).persist()
        return self._segs

    def status(self) -> Any:
        """The per-file status table."""
        return file_status(self.segments())

    def raw(self) -> Any:
        """Stage 3 before numbering (persisted)."""
        if self._raw is None:
            segs = self.segments()
            self._raw = frames_raw(segs, self.paths, partitions=self.partitions, last=capture_end(segs), options=self.options).persist()
        return self._raw

    def numbering(self) -> tuple[Any, Any]:
        """The numbering tables (persisted; small: one row per capture position that completed frames, per connection)."""
        if self._num is None:
            ctab, conn_ids = numbering(self.raw())
            self._num = (ctab.persist(), conn_ids.persist())
        return self._num

    def frames(self) -> Any:
        """The frames table (global frame and connection numbers, Spark types)."""
        return number(self.raw(), self.numbering())

    def timelines(self, *, max_items: int | None = None) -> Any:
        """Stage 4 as a DataFrame: one pickled per-connection part per row (see :func:`timelines`)."""
        segs = self.segments()
        rb = self.raw().filter(f"_kind = 0 AND opcode = 83 AND magic IN (129, 24) AND status = {_ROLLBACK_STATUS}").select("_k1", "_k2")
        rollbacks = [r["_k1"] << KSHIFT | r["_k2"] for r in rb.collect()]
        return timelines(
            segs,
            self.paths,
            partitions=self.partitions,
            last=capture_end(segs),
            rollbacks=rollbacks,
            options=self.options,
            max_items=max_items,
        )

    def timeline(self, *, max_items: int | None = None) -> Any:
        """The timeline of the whole capture, exactly the single-process one (built per connection, merged on the driver).

        With ``max_items`` each stream keeps at most that many items (and each
        connection as many flow samples) - enough for plots, far less to
        collect; :meth:`timeline_tables` still reports the true counts.
        """
        import pickle

        if self._timeline is not None and self._timeline[2] == max_items:
            return self._timeline[0]
        parts = [pickle.loads(r["blob"]) for r in self.timelines(max_items=max_items).collect()]
        t, counts = merge_timelines(parts)
        keys: set[int] = set()

        def collect(k: int) -> int:
            keys.add(k >> KSHIFT)
            return k

        _renumber(t, collect, _Same())
        ctab, conn_ids = self.numbering()
        base: dict[int, int] = {}
        if keys:
            want = self.spark.createDataFrame([(k,) for k in sorted(keys)], "_k1 bigint")
            base = {r["_k1"]: r["_c"] for r in want.join(ctab, "_k1").collect()}
        conn_of = {r["_ck"]: r["_cid"] for r in conn_ids.collect()}
        mask = (1 << KSHIFT) - 1
        _renumber(t, lambda k: base[k >> KSHIFT] + (k & mask) + 1, conn_of)
        self._timeline = (t, counts, max_items)
        return t

    def timeline_tables(self, *, max_items: int | None = None) -> dict[str, Any]:
        """The timeline DataFrames of :func:`dcpinspect.timeline_tables.timeline_frames` (pandas), with true item counts."""
        from .timeline_tables import timeline_frames

        t = self.timeline(max_items=max_items)
        counts = self._timeline[1] if self._timeline is not None else {}
        tables = timeline_frames(t)
        if max_items is not None:
            st = tables["streams"]
            if len(st):
                st["items"] = [counts[i] for i in st["stream"]]
            tables.pop("items", None)
            tables.pop("flow", None)
        return tables

    def unpersist(self) -> None:
        """Drop the persisted stages."""
        for df in (self._raw, self._segs, *(self._num or ())):
            if df is not None:
                df.unpersist()
        self._raw = self._segs = self._num = None
        self._timeline = None


# --------------------------------------------------------------------------- the data source


def register_data_source(spark: Any) -> None:
    """Register ``spark.read.format("dcpinspect")`` (see :mod:`dcpinspect.spark_source`)."""
    from .spark_source import DcpDataSource

    spark.dataSource.register(DcpDataSource)


# --------------------------------------------------------------------------- command line


#: the timeline tables ``analyze`` writes (``items`` and ``flow`` too with ``items=True``)
TIMELINE_TABLES = ("connections", "streams", "attempts", "snapshots", "failover", "rollbacks", "noops", "stalls", "anomalies")
REPORT_ITEMS = 2000  # items per stream (and flow samples per connection) kept for the report when items are not written


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
        arrays.append(pc.cast(arr, _spark_type(arr.type)))
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


def _write_text(path: str, text: str) -> None:
    fs, p = _fs(path)
    with fs.open_output_stream(p) as f:
        f.write(text.encode("utf-8"))


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
) -> dict[str, Any]:
    """Run the whole pipeline; write parquet tables and ``report.html`` under ``out_dir``; return counts.

    Tables: ``frames``, ``file_status`` and the timeline tables of
    :data:`TIMELINE_TABLES` (plus ``items`` and ``flow`` with ``items``), each a
    directory of parquet files.  Without ``items`` each stream keeps at most
    :data:`REPORT_ITEMS` items for the plots (the counts stay exact).
    """
    out = str(out_dir).rstrip("/")
    p = Pipeline(spark, paths, split_size=split_size, partitions=partitions, options=options)
    try:
        status = p.status()
        rows = [r.asDict() for r in status.collect()]
        status.write.mode("overwrite").parquet(f"{out}/file_status")
        fr = p.frames()
        fr.write.mode("overwrite").parquet(f"{out}/frames")
        n = int(p.raw().filter("_kind = 0").count())
        max_items = None if items else REPORT_ITEMS
        tables = p.timeline_tables(max_items=max_items)
        direct = "://" not in out and not _is_connect(spark)  # the driver holds these small tables: write them itself
        for name, df in tables.items():
            if name in TIMELINE_TABLES or items:
                table = arrow_for_spark(df)
                if direct:
                    import pyarrow.parquet as pq

                    d = Path(out) / name
                    shutil.rmtree(d, ignore_errors=True)
                    d.mkdir(parents=True)
                    pq.write_table(table, d / "part-00000.parquet")
                else:
                    spark.createDataFrame(table).coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}")
        t = p.timeline(max_items=max_items)
        res: dict[str, Any] = {
            "files": len(rows),
            "frames": n,
            "connections": int(p.numbering()[1].count()),
            "streams": len(t.streams),
            "anomalies": len(t.anomalies),
            "status": rows,
        }
        if report:
            from pyspark.sql import functions as F

            limit = 200_000
            sample = fr.select((F.unix_micros("ts") * 1000).alias("ts"), "type", "name")
            sampled = n > limit
            if sampled:
                sample = sample.sample(fraction=limit / n, seed=1)
            from .report import render_report

            counts = {k: res[k] for k in ("files", "frames", "connections", "streams", "anomalies")}
            page = render_report(t, sample.toArrow(), rows, counts=counts, sampled=sampled)
            _write_text(f"{out}/report.html", page)
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
    ap.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per range of a big file")
    ap.add_argument("--partitions", type=int, help="connection partitions of the frames stage")
    ap.add_argument("--port", type=int, action="append", help="memcached server port (repeatable; default 11210, 11209, 11211)")
    ap.add_argument("--items", action="store_true", help="also write the items and flow tables (one row per data message)")
    ap.add_argument("--no-report", action="store_true", help="do not write report.html")
    args = ap.parse_args(argv)
    if not expand_paths(args.paths):
        sys.stderr.write("dcpinspect: error: no capture files match\n")
        return 2
    try:
        spark = get_session(args.remote, master=args.master)
    except RuntimeError as exc:
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
        return 2
    opts = Options(server_ports=tuple(args.port)) if args.port else Options()
    res = analyze(
        spark,
        args.paths,
        args.out,
        split_size=args.split_size,
        partitions=args.partitions,
        options=opts,
        items=args.items,
        report=not args.no_report,
    )
    out.write(
        f"{res['files']} files, {res['connections']} connections, {res['frames']} frames, {res['streams']} streams, "
        f"{res['anomalies']} anomalies -> {args.out}\n"
    )
    for st in res["status"]:
        if st["status"] != "ok":
            reason = st["error"] or "; ".join(st["problems"])
            out.write(f"  {st['path']}: {st['status']}: {reason}\n")
    return 0
