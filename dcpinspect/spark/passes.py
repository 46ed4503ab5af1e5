"""Stage 3 on Spark: the keys pass (numbering, and each connection's timeline on the way) and the one-decode frames writer.

Global frame numbers follow completion order over the whole capture, but each
task sees only its connections.  A first pass over the same sorted segment
metadata (the columnar decode of :class:`~dcpinspect.spark.numbering.Keyed`) counts the records each
capture position completed and lists the connections (see
:mod:`~dcpinspect.spark.numbering`).  That small table, collected, numbers
everything.  With ``build`` the same pass also builds each connection's
timeline (stage 4, :mod:`~dcpinspect.spark.timelines`), so the timelines
cost no decode of their own.

When the frames table goes to files (what ``analyze`` does) one decode is
enough: :func:`write_frames` runs the keys pass with every task writing its
frames with their keys in place of the numbers (see
:mod:`~dcpinspect.spark.frametable`), then a small second job renumbers each
file into a parquet part.  The commit: only the files listed by successful
tasks are renumbered (a retried or speculative attempt writes files of its
own that nothing lists), the temporary directory is removed, and
``_SUCCESS`` marks a complete table.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..flows.records import gc_paused
from ..tables.schema import SPARK_SCHEMA
from ..timeline.merge import ConnPart
from .frametable import FLOW_OUT, ITEMS_OUT, RENUMBER_DDL, SAMPLE_COLUMNS, SAMPLE_SCHEMA, TMP_SCHEMA, TmpFrames, renumber_task, spark_batch
from .numbering import DEFAULT_OPTIONS, KEYS_DDL, KSHIFT, CaptureEnd, Counts, Keyed, Numbering, Options, keys_batch, uncount
from .session import filesystem
from .stages import by_connection
from .timelines import Parts

__all__ = ["collect_keys", "connection_places", "file_sets_of", "keys_pass", "keys_task", "read_keys", "timelines", "write_frames"]

_WRITTEN = {"frames": 3, "items": 5, "flow": 6}  # keys table kinds listing the temporary files of each table


def keys_task(
    batches: Iterable[pa.RecordBatch],
    paths: list[str],
    last: CaptureEnd,
    options: Options,
    *,
    build: bool = False,
    max_items: int | None = None,
    frames_to: str | None = None,
    items_to: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stage 3a in one task: records per capture position (``kind`` 0, packed: see :class:`Counts`), connections (1), and with ``build`` timeline parts (2).

    A connection's row (``kind`` 1) is its ``ck`` (``k1``), whether it is
    TLS (``n``: 1 or 0), its label and the file of its first segment
    (``blob``, UTF-8).

    With ``frames_to`` (a directory) it is stage 3 in one decode: the frames
    are written there too, with their keys in place of the numbers (see
    :func:`write_frames`), and each file is listed (``kind`` 3: path, rows);
    with ``items_to`` every item and flow sample likewise (``kind`` 5 and 6).
    """
    keyed = Keyed(batches, paths, last, options)
    parts = Parts(max_items, items_to) if build else None
    out = TmpFrames(frames_to) if frames_to is not None else None
    counts = Counts()
    for part in keyed.parts():
        k1, k2, ck = part.keys
        if not len(k1):
            continue
        starts = np.flatnonzero(np.concatenate(([True], k1[1:] != k1[:-1])))
        yield from counts.add(k1[starts], np.diff(np.append(starts, len(k1))))
        if out is not None:
            b = spark_batch(part.batch)
            out.write(pa.RecordBatch.from_arrays([*b.columns, pa.array(k1), pa.array(k2), pa.array(ck)], schema=TMP_SCHEMA))
        if parts is not None:
            parts.feed(part, k1, k2, ck)
    if out is not None:
        out.close()
    yield from counts.flush()
    adopted, labels = keyed.adopted, keyed.labels
    if adopted:
        ids = sorted(adopted)
        yield keys_batch(
            1,
            [adopted[i] for i in ids],
            [int(keyed.tls[i]) for i in ids],
            label=[labels[i] for i in ids],
            blob=[keyed.files[i].encode("utf-8", "surrogateescape") for i in ids],
        )
    if parts is not None:
        for c, blob in parts.parts(max_items):
            yield keys_batch(2, [c], blob=[blob])
    written = [(3, out)] if out is not None else []
    if parts is not None and parts.out is not None:
        parts.out.close()
        written += [(5, parts.out.items), (6, parts.out.flow)]
    for kind, w in written:
        if w.files:
            yield keys_batch(kind, [0] * len(w.files), [n for _, n in w.files], label=[p for p, _ in w.files])


def keys_pass(
    data: Any,
    paths: list[str],
    *,
    last: CaptureEnd,
    options: Options = DEFAULT_OPTIONS,
    build: bool = False,
    max_items: int | None = None,
) -> Any:
    """Stage 3a over :func:`by_connection` output: the keys table (see :func:`keys_task`); collect it and :func:`collect_keys`."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from gc_paused(keys_task(batches, paths, last, options, build=build, max_items=max_items))

    return data.mapInArrow(run, KEYS_DDL)


def collect_keys(keys: Any) -> tuple[Numbering, list[ConnPart]]:
    """The keys table on the driver: the numbering, and the timeline parts (if built)."""
    num, parts, _files = read_keys(keys.toArrow())
    return num, parts


def read_keys(t: pa.Table) -> tuple[Numbering, list[ConnPart], dict[str, list[tuple[str, int]]]]:
    """The collected keys table: the numbering, the timeline parts (if built), and the temporary files written per table."""
    kind = t.column("kind").to_numpy(zero_copy_only=False)
    k1 = t.column("k1").to_numpy(zero_copy_only=False)
    counts = kind == 0
    conns = np.flatnonzero(kind == 1)
    labels = t.column("label").take(pa.array(conns)).to_pylist()
    files = [b.decode("utf-8", "surrogateescape") if b is not None else "" for b in t.column("blob").take(pa.array(conns)).to_pylist()]
    tls = [bool(v) for v in t.column("n").take(pa.array(conns)).to_pylist()]
    packed = [uncount(m, b) for m, b in zip(k1[counts].tolist(), t.column("blob").filter(pa.array(counts)).to_pylist(), strict=True)]
    empty = np.zeros(0, np.int64)
    num = Numbering.from_rows(
        np.concatenate([p[0] for p in packed]) if packed else empty,
        np.concatenate([p[1] for p in packed]) if packed else empty,
        k1[conns].tolist(),
        labels,
        files,
        tls,
    )
    blobs = t.column("blob").filter(pa.array(kind == 2)).to_pylist()
    written = {}
    for name, k in _WRITTEN.items():
        files = pa.array(kind == k)
        written[name] = list(zip(t.column("label").filter(files).to_pylist(), t.column("n").filter(files).to_pylist(), strict=True))
    return num, [pickle.loads(b) for b in blobs], written


def _rmtree(path: str) -> None:
    fs, p = filesystem(path)
    from pyarrow import fs as pafs

    if fs.get_file_info(p).type != pafs.FileType.NotFound:
        fs.delete_dir(p)


def timelines(
    segs: Any,
    paths: list[str],
    *,
    partitions: int,
    last: CaptureEnd,
    options: Options = DEFAULT_OPTIONS,
    max_items: int | None = None,
) -> Any:
    """Stage 3a with timelines built (stage 4): the keys table with one pickled part per connection; see :func:`collect_keys`."""
    return keys_pass(by_connection(segs, partitions)[0], paths, last=last, options=options, build=True, max_items=max_items)


def write_frames(
    data: Any,
    paths: list[str],
    out_dir: str,
    *,
    last: CaptureEnd,
    options: Options = DEFAULT_OPTIONS,
    build: bool = False,
    max_items: int | None = None,
    partitions: int = 2,
    sample: int = 0,
    items_out: tuple[str, str] | None = None,
) -> tuple[Numbering, list[ConnPart], pa.Table | None]:
    """Stage 3 over :func:`by_connection` output, one decode: the frames table as parquet under ``out_dir`` (replaced).

    Returns what :func:`collect_keys` returns for the keys pass (with
    ``build``, every connection's timeline part), and with ``sample`` the
    ``ts`` (ns), ``type``, ``name``, ``frame``, ``capture_set`` and
    ``set_frame`` of at most that many frames, evenly spaced (for the
    report: its opcode plots per capture set).  With ``items_out`` (two directories; needs
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
    picked = None
    try:
        num, parts, files = read_keys(data.mapInArrow(run, KEYS_DDL).toArrow())
        for d in outs.values():
            _rmtree(d)
            fs, p = filesystem(d)
            fs.create_dir(p, recursive=True)
        todo = [(path, table) for table in outs for path, _ in files[table]]
        if todo:
            born = sorted(k for part in parts for k, _ in part.streams) if items_out is not None else []
            placed = connection_places(parts, num, paths, last)
            picked = _renumber_files(data.sparkSession, todo, num, outs, born, placed, partitions=partitions, sample=sample)
        _commit(outs, files)
    finally:
        _rmtree(tmp)
    if sample and picked is None:
        picked = SAMPLE_SCHEMA.empty_table()
    return num, parts, picked


def connection_places(parts: list[ConnPart], num: Numbering, paths: list[str], last: CaptureEnd) -> dict[int, tuple[int, str]]:
    """Connection id -> (its capture set, its file): every connection numbered (the file of its first segment), the timeline parts' file first."""
    file_set = file_sets_of(paths, last)
    placed = num.places(file_set)
    placed.update({num.conn_ids[p.ck]: (file_set.get(p.info.file, 1), p.info.file) for p in parts if p.ck in num.conn_ids})
    return placed


def file_sets_of(paths: list[str], last: CaptureEnd) -> dict[str, int]:
    """File -> its capture set (every file in set 1 without a plan)."""
    return dict(zip(paths, last.file_set, strict=False)) if last.file_set else dict.fromkeys(paths, 1)


def _renumber_files(
    spark: Any,
    todo: list[tuple[str, str]],
    num: Numbering,
    outs: dict[str, str],
    born: list[int],
    placed: dict[int, tuple[int, str]],
    *,
    partitions: int,
    sample: int,
) -> pa.Table | None:
    """The second job of :func:`write_frames`: each temporary file (path, table) into its parquet part; the sample of frames."""
    jobs = spark.createDataFrame([(i, path, table) for i, (path, table) in enumerate(todo)], "index int, path string, table string")
    jobs = jobs.repartition(max(1, min(len(todo), partitions)), "index")
    stride = -(-num.frames // sample) if sample else 0
    mask = (1 << KSHIFT) - 1
    streams = {(k >> KSHIFT, k & mask): i for i, k in enumerate(born)}

    def renumber(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from renumber_task(batches, num, outs, stride, streams, placed)

    done = jobs.mapInArrow(renumber, RENUMBER_DDL).toArrow()
    written = pc.is_valid(done.column("index"))
    if sorted(done.column("index").filter(written).to_pylist()) != list(range(len(todo))):
        raise RuntimeError("the frames table was not written whole")
    if not sample:
        return None
    return done.filter(pc.invert(written)).select(list(SAMPLE_COLUMNS)).sort_by("ts")


def _commit(outs: dict[str, str], files: dict[str, list[tuple[str, int]]]) -> None:
    """Each table complete: an empty part where nothing was written, then ``_SUCCESS``."""
    import pyarrow.parquet as pq

    schemas = {"frames": SPARK_SCHEMA, "items": ITEMS_OUT, "flow": FLOW_OUT}
    for table, d in outs.items():
        fs, p = filesystem(d)
        if not files[table]:
            with fs.open_output_stream(f"{p}/part-00000.parquet") as sink:
                pq.write_table(schemas[table].empty_table(), sink)
        with fs.open_output_stream(f"{p}/_SUCCESS"):
            pass
