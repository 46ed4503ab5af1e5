"""Stage 3's output: the frames table in Spark's types, the temporary files the tasks write, and their renumbering into parquet.

Each frames task decodes its connections and writes what it decoded with the
record keys in place of the numbers (:class:`TmpFrames`: lz4 Arrow IPC files
under the output; the items and flow samples likewise, :class:`ItemsOut`);
once the keys table is collected, :func:`renumber_task` turns each file into
a parquet part with the global numbers.  Both write with pyarrow inside the
task, not through Spark's writer: the JVM's Arrow -> rows conversion and
parquet encoding were about half the CPU of the frames pass.
:func:`frames_numbered` is the other way: the frames table decoded once
more, straight to whatever consumes the DataFrame.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..flows.records import gc_paused
from ..protocol import spec
from ..tables.schema import COLUMN_TYPES, FLOW_SCHEMA, FRAMES_DDL, ITEMS_SCHEMA, SCHEMA, SPARK_ARROW, SPARK_SCHEMA, TIMESTAMP_US
from .numbering import DEFAULT_OPTIONS, KSHIFT, CaptureEnd, Keyed, Numbering, Options
from .session import filesystem

__all__ = [
    "FLOW_OUT",
    "ITEMS_OUT",
    "RENUMBER_DDL",
    "SAMPLE_COLUMNS",
    "SAMPLE_SCHEMA",
    "TMP_ROWS",
    "TMP_SCHEMA",
    "ItemsOut",
    "TmpFrames",
    "frames_numbered",
    "frames_task",
    "place_columns",
    "renumber_task",
    "spark_batch",
    "write_dataframe",
]

TMP_ROWS = 1 << 19  # rows per temporary file (and so per parquet part)
_KEY_FIELDS = [pa.field("_k1", pa.int64()), pa.field("_k2", pa.int64()), pa.field("_ck", pa.int64())]
#: the frames with their numbering keys, as the tasks write them
TMP_SCHEMA = pa.schema([*SPARK_SCHEMA, *_KEY_FIELDS])
_ITEMS_TMP = pa.schema(
    [(k, pa.int64()) for k in ("_b1", "_b2", "_ck", "vbucket", "_k1", "_k2", "ts")]
    + [("opcode", pa.int16()), ("seqno", pa.uint64()), ("snapshot", pa.int64())]
)
_FLOW_TMP = pa.schema(
    [(k, pa.int64()) for k in ("_ck", "_k1", "_k2", "ts", "outstanding")] + [("event", pa.string()), ("size", pa.int64())]
)
_BATCH = 1 << 16


def spark_batch(batch: pa.RecordBatch, **columns: pa.Array) -> pa.RecordBatch:
    """A frames-table Arrow batch (``batches.SCHEMA``) with Spark's types (uint64 -> decimal(20,0), ...); ``columns`` replace some."""
    arrays, fields = [], []
    for f in SCHEMA:
        arr = columns[f.name] if f.name in columns else batch.column(f.name)
        to = SPARK_ARROW.get(COLUMN_TYPES[f.name])
        if to is not None:
            arr = pc.cast(arr, to, safe=False)
        arrays.append(arr)
        fields.append(pa.field(f.name, arr.type))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


class TmpFrames:
    """Rows with their numbering keys (frames by default), into temporary Arrow IPC files of at most :data:`TMP_ROWS` rows."""

    def __init__(self, directory: str, schema: pa.Schema | None = None) -> None:
        self.directory = directory
        self.schema = TMP_SCHEMA if schema is None else schema
        self.files: list[tuple[str, int]] = []
        self._sink: Any = None
        self._writer: Any = None
        self._path = ""
        self._rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Append rows (a new file when the open one is full)."""
        if self._writer is None:
            import uuid

            self._path = f"{self.directory}/{uuid.uuid4().hex}.arrow"
            fs, p = filesystem(self._path)
            fs.create_dir(p.rpartition("/")[0], recursive=True)
            self._sink = fs.open_output_stream(p)
            self._writer = pa.ipc.new_file(self._sink, self.schema, options=pa.ipc.IpcWriteOptions(compression="lz4"))
        self._writer.write_batch(batch)
        self._rows += batch.num_rows
        if self._rows >= TMP_ROWS:
            self.close()

    def close(self) -> None:
        """Finish the open file (listed in ``files`` with its rows)."""
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self.files.append((self._path, self._rows))
            self._writer = self._sink = None
            self._rows = 0


class ItemsOut:
    """Every item and flow sample of a task's builders, with their keys, into temporary files (``analyze --items``).

    Each call's rows become Arrow arrays at once (from the tuples' columns, in
    C); a batch is written every :data:`_BATCH` rows.
    """

    def __init__(self, directory: str) -> None:
        self.items = TmpFrames(directory, _ITEMS_TMP)
        self.flow = TmpFrames(directory, _FLOW_TMP)
        self._i: list[list[pa.Array]] = []
        self._f: list[list[pa.Array]] = []
        self._ni = self._nf = 0

    def add_items(self, born: int, ck: int, vbucket: int, new: list[Any]) -> None:
        """Items ``new`` of one stream (created by record ``born``, on connection ``ck``)."""
        mask = (1 << KSHIFT) - 1
        n = len(new)
        frame, ts, opcode, seqno, snapshot = zip(*new, strict=True)
        k1, k2 = _split_keys(frame)
        const = [pa.array(np.full(n, v, np.int64)) for v in (born >> KSHIFT, born & mask, ck, vbucket)]
        types = _ITEMS_TMP.types[6:]
        self._i.append([*const, k1, k2, *(pa.array(c, t) for c, t in zip((ts, opcode, seqno, snapshot), types, strict=True))])
        self._ni += n
        if self._ni >= _BATCH:
            self._flush_items()

    def add_flow(self, new: list[Any]) -> None:
        """Flow samples ``new``."""
        conn, frame, ts, outstanding, event, size = zip(*new, strict=True)
        k1, k2 = _split_keys(frame)
        t = _FLOW_TMP.types
        self._f.append(
            [pa.array(conn, t[0]), k1, k2, pa.array(ts, t[3]), pa.array(outstanding, t[4]), pa.array(event, t[5]), pa.array(size, t[6])]
        )
        self._nf += len(new)
        if self._nf >= _BATCH:
            self._flush_flow()

    def _flush_items(self) -> None:
        if self._i:
            self.items.write(_batch(self._i, _ITEMS_TMP))
            self._i, self._ni = [], 0

    def _flush_flow(self) -> None:
        if self._f:
            self.flow.write(_batch(self._f, _FLOW_TMP))
            self._f, self._nf = [], 0

    def close(self) -> None:
        """Write what is held; finish both files."""
        self._flush_items()
        self._flush_flow()
        self.items.close()
        self.flow.close()


def _split_keys(keys: tuple[int, ...]) -> tuple[pa.Array, pa.Array]:
    """Keys K as their (k1, k2) columns."""
    mask = (1 << KSHIFT) - 1
    try:
        a = np.array(keys, np.int64)
    except OverflowError:  # a key past int64 (a connection's close rows, far beyond any packet position)
        return pa.array([k >> KSHIFT for k in keys], pa.int64()), pa.array([k & mask for k in keys], pa.int64())
    return pa.array(a >> KSHIFT), pa.array(a & mask)


def _batch(chunks: list[list[pa.Array]], schema: pa.Schema) -> pa.RecordBatch:
    """Chunks of columns as one batch."""
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c[i] for c in chunks]) for i in range(len(schema))], schema=schema)


def frames_task(
    batches: Iterable[pa.RecordBatch], paths: list[str], last: CaptureEnd, options: Options, numbering: Numbering
) -> Iterator[pa.RecordBatch]:
    """Stage 3b in one task: segment metadata (in capture order) -> frames rows with their global numbers (Spark types)."""
    keyed = Keyed(batches, paths, last, options)
    cks = np.array(sorted(numbering.conn_ids), np.int64)
    ids = np.array([numbering.conn_ids[c] for c in cks.tolist()], np.int32)
    for part in keyed.parts():
        k1, k2, ck = part.keys
        conn = ids[np.searchsorted(cks, ck)]
        frame = numbering.frame_numbers(k1, k2)
        set_frame = numbering.set_frames(frame, np.full(len(frame), part.place.capture_set, np.int64))
        yield spark_batch(part.batch, frame=pa.array(frame), set_frame=pa.array(set_frame), conn_id=pa.array(conn))


def frames_numbered(data: Any, paths: list[str], numbering: Numbering, *, last: CaptureEnd, options: Options = DEFAULT_OPTIONS) -> Any:
    """Stage 3b over :func:`by_connection` output: the frames table with global numbers, Spark types."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from gc_paused(frames_task(batches, paths, last, options, numbering))

    return data.mapInArrow(run, FRAMES_DDL)


#: the renumbering job's output: (index, rows) per file written, and the report's sample of frames (index null)
RENUMBER_DDL = "index int, rows long, ts long, type string, name string, frame long, capture_set int, set_frame long"
#: a sample row of the frames (``ts`` in ns)
SAMPLE_SCHEMA = pa.schema(
    [
        ("ts", pa.int64()),
        ("type", pa.string()),
        ("name", pa.string()),
        ("frame", pa.int64()),
        ("capture_set", pa.int32()),
        ("set_frame", pa.int64()),
    ]
)
SAMPLE_COLUMNS = tuple(SAMPLE_SCHEMA.names)


def renumber_task(
    batches: Iterable[pa.RecordBatch],
    numbering: Numbering,
    outs: dict[str, str],
    stride: int = 0,
    streams: dict[tuple[int, int], int] | None = None,
    placed: Mapping[int, tuple[int, str]] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Each temporary file (rows ``index``, ``path``, ``table``) -> ``outs[table]/part-<index>.parquet`` with the global numbers.

    Yields (index, rows) per file, and with ``stride`` the
    :data:`SAMPLE_COLUMNS` of every ``stride``-th frame (a sample for the
    report: ``ts`` in ns, the frame's number, its capture set and number in it).  Items name their stream by its index in the merged timeline:
    ``streams`` maps the key of the record that created each stream to it.
    Items and flow samples carry their connection's capture set and file
    (``placed``: connection id -> both; set 1 and no file for one not in it).
    """
    import pyarrow.parquet as pq

    cks = np.array(sorted(numbering.conn_ids), np.int64)
    ids = np.array([numbering.conn_ids[c] for c in cks.tolist()], np.int32)
    where = {name: i for i, name in enumerate(SPARK_SCHEMA.names)}
    schema = pa.schema([("index", pa.int32()), ("rows", pa.int64()), *SAMPLE_SCHEMA])
    schemas = {"frames": SPARK_SCHEMA, "items": ITEMS_OUT, "flow": FLOW_OUT}
    placed = placed or {}
    for batch in batches:
        for index, src, table in zip(*(batch.column(k).to_pylist() for k in ("index", "path", "table")), strict=True):
            fs, p = filesystem(src)
            dfs, dp = filesystem(f"{outs[table]}/part-{index:05d}.parquet")
            rows = 0
            with fs.open_input_file(p) as f, dfs.open_output_stream(dp) as sink, pq.ParquetWriter(sink, schemas[table]) as w:
                reader = pa.ipc.open_file(f)
                for i in range(reader.num_record_batches):
                    b = reader.get_batch(i)
                    frame = numbering.frame_numbers(b.column("_k1").to_numpy(), b.column("_k2").to_numpy())
                    conn = ids[np.searchsorted(cks, b.column("_ck").to_numpy())]
                    rows += b.num_rows
                    if table == "items":
                        w.write_batch(_items_batch(b, frame, conn, streams or {}, placed))
                        continue
                    if table == "flow":
                        cols = [
                            pa.array(conn, pa.int64()),
                            *place_columns(conn, placed),
                            pa.array(frame),
                            _us(b.column("ts")),
                            *b.columns[4:],
                        ]
                        w.write_batch(pa.RecordBatch.from_arrays(cols, schema=FLOW_OUT))
                        continue
                    cols = b.columns[: len(SPARK_SCHEMA)]
                    cols[where["frame"]] = pa.array(frame)
                    cols[where["set_frame"]] = pa.array(numbering.set_frames(frame, b.column("capture_set").to_numpy()))
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
                                *(out.column(k).take(pick) for k in SAMPLE_COLUMNS[3:]),
                            ],
                            schema=schema,
                        )
            yield pa.RecordBatch.from_arrays(
                [pa.array([index], pa.int32()), pa.array([rows], pa.int64()), *(pa.nulls(1, f.type) for f in list(schema)[2:])],
                schema=schema,
            )


def _us(ns: pa.Array) -> pa.Array:
    """Nanoseconds since the epoch as Spark's timestamps (microseconds, UTC; the digits below are dropped)."""
    return pa.array(ns.to_numpy() // 1000, TIMESTAMP_US)


@cache
def _opcode_names() -> pa.Array:
    names = []
    for op in range(1 << 8):
        cmd = spec.COMMANDS.get(op)
        names.append(cmd.name if cmd else hex(op))
    return pa.array(names)


def _with_place(s: pa.Schema) -> pa.Schema:
    """``s`` with ``capture_set`` and ``file`` after ``conn`` (as the single-process timeline tables have them)."""
    if "capture_set" in s.names:
        return s
    i = s.get_field_index("conn") + 1
    fields = list(s)
    return pa.schema([*fields[:i], pa.field("capture_set", pa.int64()), pa.field("file", pa.string()), *fields[i:]])


#: the items and flow tables as Spark writes them: with each row's capture set and file
ITEMS_OUT = _with_place(ITEMS_SCHEMA)
FLOW_OUT = _with_place(FLOW_SCHEMA)


def place_columns(conn: np.ndarray, placed: Mapping[int, tuple[int, str]]) -> tuple[pa.Array, pa.Array]:
    """The ``capture_set`` and ``file`` columns of rows of connections ``conn`` (``placed``: id -> both)."""
    ids, inv = np.unique(np.asarray(conn, np.int64), return_inverse=True)
    where = [placed.get(c, (1, "")) for c in ids.tolist()]
    take = pa.array(inv.reshape(-1))
    return pa.array([w[0] for w in where], pa.int64()).take(take), pa.array([w[1] for w in where], pa.string()).take(take)


def _items_batch(
    b: pa.RecordBatch, frame: np.ndarray, conn: np.ndarray, streams: dict[tuple[int, int], int], placed: Mapping[int, tuple[int, str]]
) -> pa.RecordBatch:
    pairs, inv = np.unique(np.stack([b.column("_b1").to_numpy(), b.column("_b2").to_numpy()], 1), axis=0, return_inverse=True)
    stream = np.array([streams[(int(x), int(y))] for x, y in pairs.tolist()], np.int64)[inv.reshape(-1)]
    cols = [
        pa.array(stream),
        pa.array(conn, pa.int64()),
        *place_columns(conn, placed),
        b.column("vbucket"),
        pa.array(frame),
        _us(b.column("ts")),
        _opcode_names().take(b.column("opcode")),
        pc.cast(b.column("seqno"), pa.decimal128(20, 0)),
        b.column("snapshot"),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=ITEMS_OUT)


def write_dataframe(spark: Any, fr: Any, path: str) -> None:
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
