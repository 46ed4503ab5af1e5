"""``analyze --items``: the questions' tables (key_versions, rollback_losses, rollback_lost_keys, progress, lag, comparisons), exact, by the single process's pandas functions.

Theory of operation: the answers are pure functions of the frames table and
the timeline's tables (:mod:`dcpinspect.tables.history`,
:mod:`dcpinspect.tables.progress`), and every one of them is local to a
(capture set, vbucket): a consumer (rule 2 of history), a resume, a series
and a scope (rules 1 and 3 of progress) never span two vbuckets.  So:

1. The input is the ``items`` table the tasks wrote (every item, with its
   stream and snapshot: only ``--items`` has it, the merged timeline keeps a
   sample) left-joined on ``frame`` with the item frames' key columns of the
   ``frames`` table (``name``, ``key``, ``cid``, ``cas``, ``rev_seqno``; a
   system event's ``key`` and ``cid`` too, for rule 5, its ``name`` null), plus
   one seed row per (capture set, vbucket) that has a stream, so a vbucket
   whose streams carried no item still gets its progress rows.
2. The small timeline tables (connections, streams, attempts, snapshots,
   rollbacks) and ``high_seqnos`` are split per (capture set, vbucket) on the
   driver and travel in the closure; the times of the frames they name, and
   each capture set's last frame and last known time, are read once from the
   frames table (rule 3).  ``high_seqnos`` is exact, every GET_ALL_VB_SEQNOS
   and STAT ``vbucket-seqno`` answer, as ``dcpinspect lag`` reads it
   (:func:`part_high_seqnos`): the tasks return every response to a client's
   request with their timelines (the records the merge replays), and the
   driver dissects those answers once, numbered as the frames are.
3. Spark groups the input by (capture set, vbucket) (``applyInArrow``);
   each group calls the very same pandas functions -
   :func:`~dcpinspect.tables.history.key_versions`,
   :func:`~dcpinspect.tables.history.rollback_losses`,
   :func:`~dcpinspect.tables.history.rollback_lost_keys`,
   :func:`~dcpinspect.tables.progress.progress` - on its rows and its tables,
   and writes each non-empty result as one parquet file
   ``out/<table>/part-<set>-<vbucket>.parquet`` (a retried task rewrites
   the same file) with the fixed Spark types of :data:`SCHEMAS` (uint64 ->
   ``decimal(20,0)``, timestamps in microseconds UTC); a table no group wrote
   gets one empty file of its schema.  Progress times are the frames'
   microseconds (Spark's), so ``lag_seconds`` is exact to the microsecond.
4. Only with ``--items``: they need every item, and ``key_versions`` is as
   long as the items table; its replay is most of their cost (README, Spark).
5. Question 4 per group: the consumers of the vbucket are the connections
   with a stream of it, one per DCP_OPEN name (``conn N`` for a connection
   whose DCP_OPEN was not captured); every pair of them, in name order
   (``consumer_a`` < ``consumer_b``), is compared by
   :func:`~dcpinspect.tables.compare.compare_consumers` on the group's items
   (their keys joined as in rule 1, and each connection's last frame, read
   once from the frames table).  ``comparisons`` is each pair's
   ``Comparison.table``, ``comparisons_vbuckets`` its ``per_vbucket`` row,
   with ``consumers`` (how many the vbucket had) and ``skipped`` (how many
   were left out: only the first :data:`MAX_CONSUMERS` in name order are
   compared, the pairs grow as their square).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "MAX_CONSUMERS",
    "QUESTION_TABLES",
    "SCHEMAS",
    "comparisons",
    "consumer_labels",
    "part_high_seqnos",
    "split_tables",
    "write_questions",
]

#: the tables written, in order
QUESTION_TABLES = ("key_versions", "rollback_losses", "rollback_lost_keys", "progress", "lag", "comparisons", "comparisons_vbuckets")
#: at most this many consumers of one vbucket are compared pairwise (the first in name order; rule 5)
MAX_CONSUMERS = 16

_DEC = pa.decimal128(20, 0)
_TS = pa.timestamp("us", tz="UTC")
_I, _S, _B = pa.int64(), pa.string(), pa.bool_()
_ROLLBACK_ID = [
    ("capture_set", _I),
    ("file", _S),
    ("conn", _I),
    ("consumer", _S),
    ("stream", _I),
    ("vbucket", _I),
    ("stream_id", _I),
    ("frame", _I),
    ("response_frame", _I),
    ("uuid", _DEC),
    ("rollback_seqno", _DEC),
]
#: each table's Spark (parquet) schema
SCHEMAS: dict[str, pa.Schema] = {
    "key_versions": pa.schema(
        [
            ("capture_set", _I),
            ("file", _S),
            ("conn", _I),
            ("consumer", _S),
            ("lineage", _S),
            ("stream", _I),
            ("vbucket", _I),
            ("stream_id", _I),
            ("frame", _I),
            ("ts", _TS),
            ("name", _S),
            ("sync_write", _B),
            ("key", _S),
            ("cid", _I),
            ("seqno", _DEC),
            ("cas", _DEC),
            ("cas_time", _TS),
            ("rev_seqno", _DEC),
            ("snapshot", _I),
            ("snap_type", _S),
            ("snap_start", _DEC),
            ("snap_end", _DEC),
            ("fate", _S),
            ("fate_frame", _I),
            ("fate_seqno", _DEC),
            ("dedup_violation", _B),
        ]
    ),
    "rollback_losses": pa.schema(
        [
            *_ROLLBACK_ID,
            ("items", _I),
            ("keys", pa.list_(_S)),
            ("first_seqno", _DEC),
            ("last_seqno", _DEC),
            ("redelivered", _I),
            ("possibly_lost", _I),
            ("lost_keys", pa.list_(_S)),
        ]
    ),
    "rollback_lost_keys": pa.schema(
        [
            *_ROLLBACK_ID,
            ("key", _S),
            ("cid", _I),
            ("versions", _I),
            ("lost_seqno", _DEC),
            ("lost_cas", _DEC),
            ("lost_frame", _I),
            ("status", _S),
            ("new_seqno", _DEC),
            ("new_frame", _I),
            ("new_name", _S),
            ("same_version", _B),
            ("reason", _S),
        ]
    ),
    "progress": pa.schema(
        [
            ("capture_set", _I),
            ("conn", _I),
            ("consumer", _S),
            ("vbucket", _I),
            ("stream_id", _I),
            ("frame", _I),
            ("ts", _TS),
            ("event", _S),
            ("consumer_seqno", _DEC),
            ("producer_high", _DEC),
            ("high_source", _S),
            ("high_frame", _I),
            ("lag_items", _DEC),
            ("lag_seconds", pa.float64()),
        ]
    ),
    "comparisons": pa.schema(
        [
            ("capture_set", _I),
            ("consumer_a", _S),
            ("consumer_b", _S),
            ("vbucket", _I),
            ("only_in", _S),
            ("seqno_from", _DEC),
            ("seqno_to", _DEC),
            ("items", _I),
            ("keys", pa.list_(_S)),
            ("reason", _S),
            ("explanation", _S),
            ("evidence_a", pa.list_(_I)),
            ("evidence_b", pa.list_(_I)),
        ]
    ),
    "comparisons_vbuckets": pa.schema(
        [
            ("capture_set", _I),
            ("consumer_a", _S),
            ("consumer_b", _S),
            ("vbucket", _I),
            ("items_a", _I),
            ("items_b", _I),
            ("common", _I),
            ("only_a", _I),
            ("only_b", _I),
            ("last_a", _DEC),
            ("last_b", _DEC),
            ("diverge_at", _DEC),
            ("branches_a", _S),
            ("branches_b", _S),
            ("consumers", _I),
            ("skipped", _I),
        ]
    ),
    "lag": pa.schema(
        [
            ("capture_set", _I),
            ("conn", _I),
            ("consumer", _S),
            ("vbucket", _I),
            ("stream_id", _I),
            ("rows", _I),
            ("max_lag_items", _DEC),
            ("max_lag_items_at", _TS),
            ("max_lag_seconds", pa.float64()),
            ("max_lag_seconds_at", _TS),
            ("end_consumer_seqno", _DEC),
            ("end_producer_high", _DEC),
            ("end_lag_items", _DEC),
            ("end_lag_seconds", pa.float64()),
        ]
    ),
}
_PER_STREAM = ("attempts", "snapshots", "rollbacks")
_KEY_COLUMNS = ("name", "key", "cid", "cas", "rev_seqno")  # the frames' columns history reads, joined to the items on frame
_ITEM_COLUMNS = ("stream", "conn", "capture_set", "file", "vbucket", "frame", "ts", "name", "seqno", "snapshot")
_COUNTS = pa.schema([("capture_set", pa.int64()), ("vbucket", pa.int64()), ("table", pa.string()), ("rows", pa.int64())])


def split_tables(tables: Mapping[str, Any], high: Any) -> dict[tuple[int, int], dict[str, Any]]:
    """The timeline tables of each (capture set, vbucket) with a stream (rule 2): its streams, their attempts, snapshots and rollbacks, its ``high_seqnos``; every connection."""
    streams = tables["streams"]
    out: dict[tuple[int, int], dict[str, Any]] = {}
    if not len(streams):
        return out
    for (cs, vb), mine in streams.groupby(["capture_set", "vbucket"], sort=True):
        ids = set(mine["stream"].tolist())
        part: dict[str, Any] = {"connections": tables["connections"], "streams": mine.reset_index(drop=True)}
        for name in _PER_STREAM:
            df = tables[name]
            part[name] = df[df["stream"].isin(ids)].reset_index(drop=True) if len(df) and "stream" in df.columns else df
        part["high_seqnos"] = high[(high["capture_set"] == cs) & (high["vbucket"] == vb)].reset_index(drop=True)
        out[(int(cs), int(vb))] = part
    return out


def part_high_seqnos(num: Any, parts: list[Any]) -> Any:
    """The ``high_seqnos`` table (:func:`dcpinspect.tables.progress.high_seqnos`) of the records the tasks returned (:attr:`ConnPart.control`).

    ``num`` (:class:`~dcpinspect.spark.numbering.Numbering`) gives each
    record's frame number and connection id; its capture set is its connection's.
    """
    from ..tables.progress import high_seqnos
    from ..timeline.merge import record_from

    records = [
        record_from(t)._replace(number=num.frame(t[0]), conn=num.conn_ids[p.ck], capture_set=p.info.capture_set)
        for p in parts
        for t in p.control
    ]
    return high_seqnos(sorted(records, key=lambda r: r.number))


def _control_frames(tables: Mapping[str, Any]) -> list[int]:
    """The frames the small tables name (requests, responses, markers, ends, reports): their times are read from the frames table."""
    wanted: set[int] = set()
    for name, cols in (("attempts", ("frame", "response_frame")), ("snapshots", ("frame",)), ("streams", ("end_frame",))):
        df = tables[name]
        for c in cols:
            if c in df.columns:
                wanted |= {int(v) for v in df[c].dropna().tolist()}
    return sorted(wanted)


def _frame_times(spark: Any, frames: Any, wanted: list[int]) -> pa.Table:
    """(frame, capture_set, ts) of the ``wanted`` frames and of each capture set's last frame and latest-stamped frame (rule 2)."""
    from pyspark.sql import functions as F

    ends = frames.groupBy("capture_set").agg(
        F.max("frame").alias("a"), F.max_by("frame", F.struct(F.col("ts").isNotNull(), F.col("ts"))).alias("b")
    )
    last = [int(v) for r in ends.collect() for v in (r["a"], r["b"]) if v is not None]
    keys = spark.createDataFrame([(f,) for f in sorted(set(wanted) | set(last))], "frame long")
    got = frames.select("frame", "capture_set", "conn_id", "ts").join(F.broadcast(keys), "frame")
    return got.toArrow() if hasattr(got, "toArrow") else pa.Table.from_pandas(got.toPandas())


def _pandas(t: pa.Table, columns: tuple[str, ...]) -> Any:
    """Columns of ``t`` as pandas: decimals as nullable UInt64 (exact), integers nullable, timestamps in ns UTC."""
    from ..tables.schema import pandas_dtype

    cols = {c: (pc.cast(t.column(c), pa.uint64()) if pa.types.is_decimal(t.schema.field(c).type) else t.column(c)) for c in columns}
    return pa.table(cols).to_pandas(types_mapper=pandas_dtype)


def _spark_table(df: Any, schema: pa.Schema) -> pa.Table:
    from .arrow import arrow_for_spark

    t = arrow_for_spark(df)
    return pa.Table.from_arrays([pc.cast(t.column(f.name), f.type) for f in schema], schema=schema)


_LOADED: list[Any] = [None, None]  # the payload last unpickled in this worker, and what it holds


def _loaded(payload: bytes) -> Any:
    """The small tables of ``payload``, unpickled once per task (every group of a task gets the same bytes object)."""
    if _LOADED[0] is not payload:
        _LOADED[:] = [payload, pickle.loads(payload)]
    return _LOADED[1]


def _group(payload: bytes, out: str) -> Any:
    """The function each (capture set, vbucket) group runs (rule 3)."""

    def run(key: tuple[Any, ...], g: pa.Table) -> pa.Table:
        import pandas as pd

        from ..tables.history import key_versions, rollback_losses, rollback_lost_keys
        from ..tables.progress import lag_summary, progress

        by_group, times, last_frames = _loaded(payload)
        cs, vb = int(key[0].as_py()), int(key[1].as_py())
        g = g.filter(pc.is_valid(g.column("frame")))  # the seed row goes
        tables = dict(by_group.get((cs, vb)) or {})
        items = _pandas(g, _ITEM_COLUMNS).astype({"stream": "int64", "conn": "int64", "capture_set": "int64", "frame": "int64"})
        items["snapshot"] = items["snapshot"].astype("int64")
        tables["items"] = items
        every = _pandas(g, ("frame", *(f"_{c}" for c in _KEY_COLUMNS)))
        every = every.rename(columns={f"_{c}": c for c in _KEY_COLUMNS}).astype({"frame": "int64"})
        keys = every[every["name"].notna()]  # the items of ITEM_KINDS (history's)
        mine = times[times["capture_set"] == cs] if len(times) else times
        when = pd.concat([items[["frame", "capture_set", "ts"]], mine[["frame", "capture_set", "ts"]]], ignore_index=True)
        when = when.drop_duplicates("frame").sort_values("frame", ignore_index=True)
        results: dict[str, pd.DataFrame | None] = dict.fromkeys(QUESTION_TABLES)
        if "streams" in tables:
            lag = progress(when, tables)
            results = {
                "key_versions": key_versions(keys, tables),
                "rollback_losses": rollback_losses(keys, tables),
                "rollback_lost_keys": rollback_lost_keys(keys, tables),
                "progress": lag,
                "lag": lag_summary(lag, top=None),  # a series lies in one group: the union is every series' summary
            }
            results["comparisons"], results["comparisons_vbuckets"] = comparisons(cs, vb, items, every, tables, last_frames)
        counts = []
        for name, df in results.items():
            n = 0 if df is None else len(df)
            if n:
                _write(_spark_table(df, SCHEMAS[name]), f"{out}/{name}/part-{cs:04d}-{vb:05d}.parquet")
            counts.append((cs, vb, name, n))
        return pa.Table.from_pylist([dict(zip(_COUNTS.names, r, strict=True)) for r in counts], schema=_COUNTS)

    return run


def consumer_labels(tables: Mapping[str, Any], conns: Any) -> dict[str, list[int]]:
    """Rule 5: each consumer of the connections ``conns`` (its DCP_OPEN name, or ``conn N`` without a captured DCP_OPEN) -> its connections."""
    from ..tables.compare import consumer_names

    named = dict(consumer_names(tables))
    out: dict[str, list[int]] = {}
    for c in sorted({int(c) for c in conns}):
        out.setdefault(named.get(c, f"conn {c}"), []).append(c)
    return out


def _pick(frames: Any, tables: Mapping[str, Any], conns: list[int]) -> Any:
    """The rows of the connections ``conns`` (as :func:`~dcpinspect.tables.compare.select_consumer` picks a consumer)."""
    picked = {name: df[df["conn"].isin(conns)] if "conn" in df.columns else df for name, df in tables.items()}
    return frames[frames["conn_id"].isin(conns)], picked


def comparisons(cs: int, vb: int, items: Any, keys: Any, tables: Mapping[str, Any], last_frames: Mapping[int, int]) -> tuple[Any, Any]:
    """Rule 5: every pair of the vbucket's consumers compared by :func:`~dcpinspect.tables.compare.compare_consumers` -> (comparisons, comparisons_vbuckets).

    ``items``/``keys``: the group's items and their frames' ``key`` and ``cid`` (system events' too);
    ``last_frames``: each connection's last frame (what rule 2 "ended" of
    :mod:`~dcpinspect.tables.compare` names when a stream has no end).
    """
    import pandas as pd

    from ..tables.compare import compare_consumers

    consumers = consumer_labels(tables, tables["streams"]["conn"])
    names = sorted(consumers)
    kept, skipped = names[:MAX_CONSUMERS], max(0, len(names) - MAX_CONSUMERS)
    frames = items[["frame", "conn"]].rename(columns={"conn": "conn_id"}).merge(keys[["frame", "key", "cid"]], on="frame", how="left")
    conns = [c for n in kept for c in consumers[n]]
    ends = pd.DataFrame(
        {"frame": [int(last_frames[c]) for c in conns if c in last_frames], "conn_id": [c for c in conns if c in last_frames]}
    )
    if len(ends):
        frames = pd.concat([frames, ends], ignore_index=True).drop_duplicates("frame", ignore_index=True)
    frames = frames.astype({"frame": "int64", "conn_id": "int64"})
    picked = {n: _pick(frames, tables, consumers[n]) for n in kept}
    rows, counts = [], []
    for i, a in enumerate(kept):
        for b in kept[i + 1 :]:
            c = compare_consumers(picked[a], picked[b], vbucket=vb)
            pair = {"capture_set": cs, "consumer_a": a, "consumer_b": b}
            if len(c.table):
                rows.append(c.table.assign(**pair))
            if len(c.per_vbucket):
                counts.append(c.per_vbucket.assign(**pair, consumers=len(names), skipped=skipped))
    return (pd.concat(rows, ignore_index=True) if rows else None), (pd.concat(counts, ignore_index=True) if counts else None)


def _write(table: pa.Table, path: str) -> None:
    import pyarrow.parquet as pq

    from .session import filesystem

    fs, p = filesystem(path)
    parent = p.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(p) as sink:
        pq.write_table(table, sink)


def write_questions(spark: Any, out: str, t: Any, tables: Mapping[str, Any], high: Any = None) -> dict[str, int]:
    """Write :data:`QUESTION_TABLES` under ``out`` from its ``frames`` and ``items`` tables and the merged timeline ``t`` and its ``tables``; their row counts.

    ``high``: the ``high_seqnos`` table (:func:`part_high_seqnos`); without it
    the timeline's last GET_ALL_VB_SEQNOS answer per vbucket
    (:func:`~dcpinspect.tables.progress.timeline_high_seqnos`).
    """
    from pyspark.sql import functions as F

    from ..protocol.enums import Opcode
    from ..tables.history import ITEM_KINDS
    from ..tables.progress import timeline_high_seqnos

    frames = spark.read.parquet(f"{out}/frames")
    items = spark.read.parquet(f"{out}/items")
    highs = getattr(t, "high_seqnos", None) or {}
    named = {int(f) for f, _q in highs.values()} if high is None else {int(f) for f in high["frame"].tolist()}
    small = _frame_times(spark, frames, sorted(set(_control_frames(tables)) | named))
    if high is None:
        high = timeline_high_seqnos(highs, _pandas(small, ("frame", "capture_set", "conn_id", "ts")))
    by_group = split_tables(tables, high)
    times = _pandas(small, ("frame", "capture_set", "ts")).astype({"frame": "int64", "capture_set": "int64"})
    keyed = F.col("name").isin(list(ITEM_KINDS))
    key_cols = frames.where(keyed | (F.col("name") == Opcode.DCP_SYSTEM_EVENT.name)).select(
        "frame", F.when(keyed, F.col("name")).alias("_name"), *(F.col(c).alias(f"_{c}") for c in _KEY_COLUMNS if c != "name")
    )
    rows = items.select(*_ITEM_COLUMNS).join(key_cols, "frame", "left")
    seeds = spark.createDataFrame([(cs, vb) for cs, vb in by_group], "capture_set int, vbucket int")
    for c, typ in ((c, rows.schema[c].dataType) for c in rows.columns if c not in ("capture_set", "vbucket")):
        seeds = seeds.withColumn(c, F.lit(None).cast(typ))
    rows = rows.withColumn("capture_set", F.col("capture_set").cast("int")).withColumn("vbucket", F.col("vbucket").cast("int"))
    rows = rows.unionByName(seeds.select(*rows.columns))
    last_frames = {int(r[0]): int(r[1]) for r in frames.groupBy("conn_id").agg(F.max("frame")).collect() if r[0] is not None}
    payload = pickle.dumps((by_group, times, last_frames), protocol=pickle.HIGHEST_PROTOCOL)
    from pyspark.sql.pandas.types import from_arrow_schema

    done = rows.groupBy("capture_set", "vbucket").applyInArrow(_group(payload, out), from_arrow_schema(_COUNTS)).collect()
    counts = {name: 0 for name in QUESTION_TABLES}
    for r in done:
        counts[r["table"]] += int(r["rows"])
    for name in QUESTION_TABLES:
        if not counts[name]:
            _write(SCHEMAS[name].empty_table(), f"{out}/{name}/part-empty.parquet")
    return counts
