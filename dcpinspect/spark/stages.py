"""Stages 1 and 2 on Spark: captures -> record-aligned byte ranges -> TCP segment metadata; per-file status; the shuffle by connection.

The capture format is the core's business (:func:`~dcpinspect.capture.pcapfile.split_ranges`;
each range's packets parsed with arrays by :func:`~dcpinspect.tables.packets_vector.range_window`,
which equals :func:`~dcpinspect.capture.pcapfile.read_range` and
:func:`~dcpinspect.capture.packets.locate_segment`); this module opens the
files through ``pyarrow.fs`` (so cluster storage works the same) and moves
rows, built from those arrays without a Python object per packet.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..capture.packets import locate_segment
from ..capture.pcapfile import CaptureError, CaptureRange, CaptureReader, read_range, split_ranges, time_problem
from ..flows.records import gc_paused
from ..tables.packets_vector import SegmentWindow, range_window
from .session import filesystem

__all__ = [
    "DEFAULT_SPLIT_SIZE",
    "GPOS_SHIFT",
    "PACKED",
    "PACKED_DDL",
    "PACKED_INPUT",
    "PACKED_SCHEMA",
    "RANGE_DDL",
    "SEG_DDL",
    "SEG_INPUT",
    "SEG_SCHEMA",
    "STATUS_DDL",
    "STATUS_INPUT",
    "STATUS_NAMES",
    "by_connection",
    "capture_end",
    "connection_sizes",
    "file_ends",
    "file_status",
    "range_packed",
    "range_segments",
    "segments",
    "split",
    "split_file",
    "status_rows",
    "status_table",
]

DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024
GPOS_SHIFT = 40  # capture position: file index << 40 | packet number

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


def split_file(path: str, split_size: int) -> list[CaptureRange]:
    """The record-aligned ranges of one file (see :func:`~dcpinspect.capture.pcapfile.split_ranges`), opened through ``pyarrow.fs``."""
    fs, p = filesystem(path)
    try:
        f = fs.open_input_file(p)
    except (OSError, FileNotFoundError):
        return [CaptureRange(0, 0, 1, b"")]
    with f:
        return split_ranges(f, split_size)


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
PACKED_SCHEMA = SEG_SCHEMA.append(pa.field("blob", pa.binary()))
PACKED_DDL = SEG_DDL + ", blob binary"


def range_segments(file_index: int, path: str, range_index: int, start: int, end: int, first_packet: int, prefix: bytes) -> pa.RecordBatch:
    """Stage 2 for one range, a row per segment: segment metadata rows, one summary row per connection and one status row.

    The range's bytes are read at once and parsed with arrays
    (:func:`~dcpinspect.tables.packets_vector.range_window`); a range whose
    read stops on an error midway (a corrupt pcapng section header) is read
    again packet by packet, so the segments before the error are kept as
    :func:`~dcpinspect.capture.pcapfile.read_range` keeps them.  (The
    ``segments`` table of the data source; the pipeline moves
    :func:`range_packed` rows.)
    """
    seg, summaries, status = _range_parts(file_index, path, range_index, start, end, first_packet, prefix)
    n = len(seg["gpos"])
    parts = [_rows_batch(n, kind=np.zeros(n, np.int8), file_index=np.full(n, file_index, np.int32), **seg), summaries, status]
    return pa.Table.from_batches(parts, schema=SEG_SCHEMA).combine_chunks().to_batches()[0]


def range_packed(file_index: int, path: str, range_index: int, start: int, end: int, first_packet: int, prefix: bytes) -> pa.RecordBatch:
    """Stage 2 for one range as the pipeline moves it: a row per connection holding its segments packed (:data:`PACKED`).

    Spark handles a few rows per range instead of one per segment (the
    segments' metadata crossing the JVM, persisted and shuffled row by row,
    cost more than reading them); :meth:`~dcpinspect.spark.numbering.TaskSegments.of`
    unpacks them.  A ``kind`` 0 row names its connection's endpoints (the
    lower first, as in ``ckey``: ``src``/``sport`` and ``dst``/``dport``),
    its first segment's ``gpos`` and ``ts``, and its number of segments
    (``packets``); then the summary and status rows of :func:`range_segments`.
    """
    seg, summaries, status = _range_parts(file_index, path, range_index, start, end, first_packet, prefix)
    parts = [_packed_rows(seg, file_index, path), summaries.append_column("blob", pa.nulls(summaries.num_rows, pa.binary()))]
    parts.append(status.append_column("blob", pa.nulls(1, pa.binary())))
    return pa.Table.from_batches(parts, schema=PACKED_SCHEMA).combine_chunks().to_batches()[0]


#: one segment of a :func:`range_packed` row: ``swap`` is 1 when it went from the higher endpoint to the lower
PACKED = np.dtype(
    [("gpos", "<i8"), ("ts", "<i8"), ("seq", "<i8"), ("poff", "<i8"), ("missing", "<i8"), ("flags", "<i4"), ("plen", "<i4"), ("swap", "i1")]
)


def _packed_rows(seg: dict[str, Any], file_index: int, path: str) -> pa.RecordBatch:
    """A range's segments, a row per connection (in order of first sight), each packed."""
    ck = seg["ckey"] if isinstance(seg["ckey"], pa.Array) else pa.array(seg["ckey"], pa.string())
    n = len(ck)
    if not n:
        return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in PACKED_SCHEMA], schema=PACKED_SCHEMA)
    enc = ck.dictionary_encode()
    code = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    keys = enc.dictionary.to_pylist()
    lo = [_key_endpoints(k) for k in keys]  # lo ip, lo port, hi ip, hi port
    src = seg["src"] if isinstance(seg["src"], pa.Array) else pa.array(seg["src"], pa.string())
    sport = np.asarray(seg["sport"], np.int64)
    lo_ip = pa.array([x[0] for x in lo], pa.string()).take(pa.array(code))
    lo_port = np.array([x[1] for x in lo], np.int64)[code]
    same = pc.equal(src, lo_ip).to_numpy(zero_copy_only=False) & (sport == lo_port)
    rec = np.empty(n, PACKED)
    for name in ("gpos", "ts", "seq", "poff", "missing", "flags", "plen"):
        rec[name] = np.asarray(seg[name])
    rec["swap"] = ~same
    order = np.argsort(code, kind="stable")
    sc = code[order]
    starts = np.flatnonzero(np.concatenate(([True], sc[1:] != sc[:-1])))
    ends = np.append(starts[1:], n)
    rows = sc[starts]
    first = order[starts]  # each connection's first segment
    by_sight = np.argsort(first, kind="stable")
    packed = rec[order]
    blobs = [packed[a:b].tobytes() for a, b in zip(starts[by_sight].tolist(), ends[by_sight].tolist(), strict=True)]
    conns = rows[by_sight].tolist()
    m = len(conns)
    return _rows_batch(
        m,
        schema=PACKED_SCHEMA,
        kind=np.zeros(m, np.int8),
        file_index=np.full(m, file_index, np.int32),
        path=[path] * m,
        gpos=np.asarray(seg["gpos"], np.int64)[first[by_sight]],
        ts=np.asarray(seg["ts"], np.int64)[first[by_sight]],
        ckey=[keys[c] for c in conns],
        src=[lo[c][0] for c in conns],
        sport=[lo[c][1] for c in conns],
        dst=[lo[c][2] for c in conns],
        dport=[lo[c][3] for c in conns],
        packets=(ends - starts)[by_sight],
        blob=pa.array(blobs, pa.binary()),
    )


def _range_parts(
    file_index: int, path: str, range_index: int, start: int, end: int, first_packet: int, prefix: bytes
) -> tuple[dict[str, Any], pa.RecordBatch, pa.RecordBatch]:
    """One range read: its segments as columns, the per-connection summary rows and the status row."""
    rng = CaptureRange(start, end, first_packet, prefix)
    skipped: Counter[str] = Counter()
    error = None
    seg: dict[str, np.ndarray] | None = None
    reader = CaptureReader(path)
    reader.packets = first_packet - 1
    fs, p = filesystem(path)
    try:
        f = fs.open_input_file(p)
    except (OSError, FileNotFoundError) as exc:
        reason = os.strerror(exc.errno) if isinstance(exc.errno, int) else str(exc)
        error = str(CaptureError(path, None, f"cannot open: {reason}"))
    else:
        with f:
            data = f.read_at(end - start, start) if end > start else b""
            try:
                w, reader = range_window(path, file_index, data, rng, skipped)
                seg = _window_rows(w, file_index << GPOS_SHIFT)
            except CaptureError:
                skipped.clear()
                reader = CaptureReader(path)
                reader.packets = first_packet - 1
                seg, error = _slow_rows(reader, f, rng, file_index << GPOS_SHIFT, skipped)
    if seg is None:
        seg = {k: np.zeros(0, np.int64) for k in _SEG_ARRAYS} | {
            "ckey": np.zeros(0, object),
            "src": np.zeros(0, object),
            "dst": np.zeros(0, object),
        }
    status = _rows_batch(
        1, **{k: [v] for k, v in _range_status(reader, skipped, error, file_index, path, range_index, first_packet).items()}
    )
    return seg, _summaries(seg, file_index, range_index), status


_SEG_ARRAYS = ("gpos", "ts", "sport", "dport", "seq", "flags", "poff", "plen", "missing")


def _rows_batch(n: int, schema: pa.Schema | None = None, **cols: Any) -> pa.RecordBatch:
    """``n`` rows of :data:`SEG_SCHEMA` (or ``schema``): the columns given, nulls in the others."""
    schema = SEG_SCHEMA if schema is None else schema
    return pa.RecordBatch.from_arrays(
        [pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema], schema=schema
    )


def _window_rows(w: SegmentWindow, base: int) -> dict[str, Any]:
    """A range's segments as columns (``kind`` 0 rows): endpoints as text, the connection key of each 4-tuple made once."""
    n = len(w.number)
    addrs = pa.array(w.addresses, pa.string())
    a = (w.src.astype(np.int64) << 16) | w.sport
    b = (w.dst.astype(np.int64) << 16) | w.dport
    four = np.empty(n, dtype=[("a", "i8"), ("b", "i8")])
    four["a"], four["b"] = a, b
    uniq, inv = np.unique(four, return_inverse=True)
    keys = []
    for ua, ub in zip(uniq["a"].tolist(), uniq["b"].tolist(), strict=True):
        keys.append(_conn_key((w.addresses[ua >> 16], ua & 0xFFFF), (w.addresses[ub >> 16], ub & 0xFFFF)))
    return {
        "gpos": base | w.number,
        "ckey": pa.array(keys, pa.string()).take(pa.array(inv.reshape(-1))),
        "ts": w.ts,
        "src": addrs.take(pa.array(w.src)),
        "sport": w.sport,
        "dst": addrs.take(pa.array(w.dst)),
        "dport": w.dport,
        "seq": w.seq,
        "flags": w.flags,
        "poff": w.poff,
        "plen": w.plen.astype(np.int32),
        "missing": w.missing,
    }


def _conn_key(x: tuple[str, int], y: tuple[str, int]) -> str:
    """A connection's key (``ckey``): its two endpoints, the lower first, whichever way the segment went."""
    lo, hi = (x, y) if x <= y else (y, x)
    return f"{lo[0]}|{lo[1]}|{hi[0]}|{hi[1]}"


def _key_endpoints(key: str) -> tuple[str, int, str, int]:
    """A :func:`_conn_key` back as (lower ip, port, higher ip, port)."""
    a, ap, b, bp = key.split("|")
    return a, int(ap), b, int(bp)


def _slow_rows(reader: CaptureReader, f: Any, rng: CaptureRange, base: int, skipped: Counter[str]) -> tuple[dict[str, Any], str | None]:
    """The TCP segments of one range packet by packet (a range whose read stops on an error); the error."""
    path = reader.path
    rows: list[tuple[Any, ...]] = []
    keys: dict[tuple[str, int, str, int], str] = {}
    error = None
    try:
        for pkt in read_range(reader, f, rng):
            found = locate_segment(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, path, skipped)
            if found is None:
                continue
            seg, _tcp, at = found
            four = (seg.src, seg.sport, seg.dst, seg.dport)
            ck = keys.get(four)
            if ck is None:
                ck = keys[four] = _conn_key((seg.src, seg.sport), (seg.dst, seg.dport))
            rows.append((base | pkt.number, ck, seg.ts, seg.src, seg.sport, seg.dst, seg.dport, seg.seq, seg.flags))
            rows[-1] += (pkt.data_offset + at, len(seg.payload), seg.missing)
    except CaptureError as exc:
        error = str(exc)
    names = ("gpos", "ckey", "ts", "src", "sport", "dst", "dport", "seq", "flags", "poff", "plen", "missing")
    cols = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in names]
    out: dict[str, Any] = dict(zip(names, cols, strict=True))
    for k in _SEG_ARRAYS:
        out[k] = np.array(out[k], np.int32 if k == "plen" else np.int64)
    return out, error


def _summaries(seg: dict[str, Any], file_index: int, range_index: int) -> pa.RecordBatch:
    """One row per connection (``kind`` 2), in order of first sight: its weight in this range and where it was last seen (for :func:`by_connection`)."""
    ck = seg["ckey"] if isinstance(seg["ckey"], pa.Array) else pa.array(seg["ckey"], pa.string())
    enc = ck.dictionary_encode()
    code = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64) if len(ck) else np.zeros(0, np.int64)
    m = len(enc.dictionary)
    weight = np.bincount(code, weights=seg["plen"].astype(np.int64) + 64, minlength=m).astype(np.int64)
    count = np.bincount(code, minlength=m).astype(np.int64)
    last = len(code) - 1 - np.unique(code[::-1], return_index=True)[1]  # each connection's last segment
    return _rows_batch(
        m,
        kind=np.full(m, 2, np.int8),
        file_index=np.full(m, file_index, np.int32),
        range_index=np.full(m, range_index, np.int32),
        ckey=enc.dictionary,
        missing=weight,
        packets=count,
        gpos=np.asarray(seg["gpos"], np.int64)[last],
        ts=np.asarray(seg["ts"], np.int64)[last],
    )


def _range_status(
    reader: CaptureReader, skipped: Counter[str], error: str | None, file_index: int, path: str, range_index: int, first_packet: int
) -> dict[str, Any]:
    """The range's status row (``kind`` 1).

    Out-of-range packet times are one problem per file: this range's count
    and first offset travel as numbers (``missing``, ``poff``; see :func:`status_rows`).
    """
    late = time_problem(reader.bad_times) if reader.bad_times else None
    late_at = next((off for off, msg in reader.problems if msg == late), None)
    return {
        "kind": 1,
        "file_index": file_index,
        "path": path,
        "range_index": range_index,
        "format": reader.format or None,
        "error": error,
        "problems": [f"{msg} (at byte offset {off})" for off, msg in reader.problems if msg != late],
        "packets": reader.packets - (first_packet - 1),
        "linktypes": sorted(reader.linktypes),
        "skipped": ",".join(f"{k}={v}" for k, v in sorted(skipped.items())),
        "missing": reader.bad_times,  # packets with an out-of-range time in this range
        "poff": late_at,  # where the first of them is
    }


def segments(ranges: Any) -> Any:
    """Stage 2: ranges -> TCP segment metadata (``kind`` 0) and one status row per range (``kind`` 1)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def each() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for row in batch.to_pylist():
                    yield range_packed(
                        row["file_index"], row["path"], row["range_index"], row["start"], row["end"], row["first_packet"], row["prefix"]
                    )

        yield from gc_paused(each())

    return ranges.mapInArrow(run, PACKED_DDL)


STATUS_DDL = (
    "file_index int, path string, status string, format string, packets long, error string, problems array<string>, linktypes array<int>, "
    "capture_set int"
)


def status_rows(ranges: pa.Table, file_set: tuple[int, ...] = ()) -> list[tuple[Any, ...]]:
    """The per-file status rows (:data:`STATUS_DDL`) from the range status rows (``kind`` 1) of the segments (``file_set``: each file's capture set, else 1)."""
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
        cs = file_set[fi] if fi < len(file_set) else 1
        out.append(
            (fi, rs[0]["path"], status, max(formats, default=None), sum(packets) if packets else None, error, problems, linktypes, cs)
        )
    return out


def file_status(segs: Any) -> Any:
    """The per-file status table: format, packets, error, problems, link types (one row per file; aggregated on the driver)."""
    rows = status_rows(segs.filter("kind = 1").select("kind", "file_index", "path", "missing", "poff", *STATUS_INPUT).toArrow())
    return segs.sparkSession.createDataFrame(rows, STATUS_DDL)


STATUS_INPUT = ("range_index", "format", "error", "problems", "packets", "linktypes")
STATUS_NAMES = ("file_index", "path", "status", "format", "packets", "error", "problems", "linktypes", "capture_set")


def status_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The per-file status table (:data:`STATUS_NAMES`) in Arrow, from its rows as dicts."""
    types = [
        pa.int32(),
        pa.string(),
        pa.string(),
        pa.string(),
        pa.int64(),
        pa.string(),
        pa.list_(pa.string()),
        pa.list_(pa.int32()),
        pa.int32(),
    ]
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


def file_ends(rows: pa.Table) -> dict[int, tuple[int, int]]:
    """From the connection summaries (``kind`` 2) of the segments: each file's last TCP segment, ``(gpos, ts)``."""
    out: dict[int, tuple[int, int]] = {}
    cols = (rows.column(c).to_pylist() for c in ("kind", "file_index", "gpos", "ts"))
    for k, fi, g, t in zip(*cols, strict=True):
        if k == 2:
            out[fi] = max(out.get(fi, (0, 0)), (int(g), int(t)))
    return out


SEG_INPUT = ("file_index", "gpos", "ts", "src", "sport", "dst", "dport", "seq", "flags", "poff", "plen", "missing")
#: what a frames task reads of a :func:`range_packed` row
PACKED_INPUT = ("file_index", "gpos", "src", "sport", "dst", "dport", "blob")


def capture_end(segs: Any) -> tuple[int, int]:
    """(ts, capture position) of the capture's last TCP segment: where the single-process read ends."""
    from pyspark.sql import functions as F

    row = segs.filter("kind = 2").agg(F.max_by(F.struct("ts", "gpos"), "gpos").alias("m")).collect()[0]["m"]
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
    data = segs.filter("kind = 0").select(*PACKED_INPUT, "ckey").join(F.broadcast(where), "ckey")
    return data.repartitionById(partitions, "_p").sortWithinPartitions("gpos").drop("ckey", "_p"), last
