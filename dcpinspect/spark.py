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

import pyarrow as pa
import pyarrow.compute as pc

from .batches import SCHEMA, chunk_batch
from .capture import _PCAP_MAGICS, _PCAPNG_SHB, MAX_RECORD, CaptureError, CaptureReader
from .columns import FRAME_COLUMNS
from .flows import DEFAULT_SERVER_PORTS, TLS_PORTS, Segment
from .packets import parse_packet
from .records import CaptureStats, iter_chunks

__all__ = [
    "DEFAULT_SPLIT_SIZE",
    "Pipeline",
    "analyze",
    "command",
    "file_status",
    "files_frame",
    "frames",
    "get_session",
    "register_data_source",
    "segments",
    "split",
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


def frames_task(batches: Iterable[pa.RecordBatch], paths: list[str], last: tuple[int, int], options: Options) -> Iterator[pa.RecordBatch]:
    """Stage 3 in one task: segment metadata (in capture order) -> frames rows with numbering keys.

    Each segment's ``file`` carries its capture position, so every run of a
    chunk knows which packet (or the end of the capture) completed it; the
    frames get ``_k1`` (that position), ``_k2`` (order within it) and ``_ck``
    (the position that made the connection known).  Connection rows
    (``_kind`` 1) list every connection, records or not.
    """
    stats = CaptureStats()
    payloads = _Payloads()
    adopted: dict[int, int] = {}
    labels: dict[int, str] = {}
    cur = [0]
    seen = [0]

    def sync() -> None:
        conns = stats.connections
        while seen[0] < len(conns):
            c = conns[seen[0]]
            adopted[c.id] = cur[0]
            labels[c.id] = c.label
            seen[0] += 1

    def segs() -> Iterator[Segment]:
        for batch in batches:
            d = batch.to_pydict()
            for fi, gpos, ts, src, sport, dst, dport, seq, flags, poff, plen, missing in zip(
                d["file_index"],
                d["gpos"],
                d["ts"],
                d["src"],
                d["sport"],
                d["dst"],
                d["dport"],
                d["seq"],
                d["flags"],
                d["poff"],
                d["plen"],
                d["missing"],
                strict=True,
            ):
                path = paths[fi]
                payload = payloads.get(fi, path, poff, plen)
                sync()
                cur[0] = gpos
                yield Segment(ts, src, sport, dst, dport, seq, flags, payload, missing, gpos & ((1 << GPOS_SHIFT) - 1), f"{path}\0{gpos}")
        sync()
        payloads.close()
        ts, gpos = last
        path = paths[gpos >> GPOS_SHIFT] if paths else ""
        yield Segment(
            ts, "0.0.0.0", 0, "0.0.0.0", 0, 0, 0, b"", 0, gpos & ((1 << GPOS_SHIFT) - 1), f"{path}\0{_CLOSE}"
        )  # sets the reassembler's end of capture

    prev = [-1, 0]  # (k1, records so far at k1)
    chunks = iter_chunks(
        segs(),
        rows=options.rows,
        server_ports=options.server_ports,
        detect=options.detect,
        tls_ports=options.tls_ports,
        stats=stats,
        reveal_secrets=options.reveal_secrets,
    )
    for chunk in chunks:
        sync()
        files, k1s = [], []
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
        b = spark_batch(chunk_batch(chunk))
        n = b.num_rows
        yield _with_helpers(b, pa.array([0] * n, pa.int8()), pa.array(k1, pa.int64()), pa.array(k2, pa.int64()), pa.array(ck, pa.int64()))
    sync()
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


def number(raw: Any) -> Any:
    """Global frame and connection numbers (those of the single-process path), from the task-local keys."""
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

    def frames(self) -> Any:
        """The frames table (global frame and connection numbers, Spark types)."""
        return number(self.raw())

    def unpersist(self) -> None:
        """Drop the persisted stages."""
        for df in (self._raw, self._segs):
            if df is not None:
                df.unpersist()
        self._raw = self._segs = None


# --------------------------------------------------------------------------- the data source


def register_data_source(spark: Any) -> None:
    """Register ``spark.read.format("dcpinspect")`` (see :mod:`dcpinspect.spark_source`)."""
    from .spark_source import DcpDataSource

    spark.dataSource.register(DcpDataSource)


# --------------------------------------------------------------------------- command line


def analyze(
    spark: Any,
    paths: Iterable[str],
    out_dir: str,
    *,
    split_size: int = DEFAULT_SPLIT_SIZE,
    partitions: int | None = None,
    options: Options = Options(),
) -> dict[str, Any]:
    """Run the pipeline and write ``frames`` and ``file_status`` parquet tables under ``out_dir``; return counts."""
    p = Pipeline(spark, paths, split_size=split_size, partitions=partitions, options=options)
    try:
        status = p.status()
        status.write.mode("overwrite").parquet(str(Path(out_dir) / "file_status"))
        fr = p.frames()
        fr.write.mode("overwrite").parquet(str(Path(out_dir) / "frames"))
        rows = status.collect()
        n = fr.count()
        conns = p.raw().filter("_kind = 1").count()
    finally:
        p.unpersist()
    return {"files": len(rows), "frames": n, "connections": conns, "status": [r.asDict() for r in rows]}


def command(argv: list[str], *, out: TextIO) -> int:
    """``dcpinspect analyze PATH... --out DIR [--master URL | --remote sc://...] [--split-size BYTES]``."""
    ap = argparse.ArgumentParser(
        prog="dcpinspect analyze", description="Run the captures -> frames pipeline on Spark and write parquet tables."
    )
    ap.add_argument("paths", nargs="+", help="capture files, globs or directories (read in order, as one capture)")
    ap.add_argument("--out", required=True, help="output directory (frames/, file_status/ as parquet)")
    ap.add_argument("--master", help="Spark master (default: local[*]; leave out under spark-submit)")
    ap.add_argument("--remote", help="Spark Connect URL, e.g. sc://127.0.0.1:15002 (default: $SPARK_REMOTE)")
    ap.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per range of a big file")
    ap.add_argument("--partitions", type=int, help="connection partitions of the frames stage")
    ap.add_argument("--port", type=int, action="append", help="memcached server port (repeatable; default 11210, 11209, 11211)")
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
    res = analyze(spark, args.paths, args.out, split_size=args.split_size, partitions=args.partitions, options=opts)
    out.write(f"{res['files']} files, {res['connections']} connections, {res['frames']} frames -> {args.out}\n")
    for st in res["status"]:
        if st["status"] != "ok":
            reason = st["error"] or "; ".join(st["problems"])
            out.write(f"  {st['path']}: {st['status']}: {reason}\n")
    return 0
