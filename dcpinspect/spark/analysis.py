"""``analyze``: the whole pipeline into an output directory - parquet tables and an HTML report (its command line: :mod:`dcpinspect.cli.analyze`).

The output directory is claimed with a manifest (:data:`MANIFEST`), so a
re-run replaces only what an earlier run wrote (see :func:`prepare_output`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from .arrow import arrow_for_spark
from .numbering import DEFAULT_OPTIONS, Numbering, Options
from .pipeline import Pipeline
from .questions import QUESTION_TABLES, part_high_seqnos, write_questions
from .session import filesystem
from .stages import DEFAULT_SPLIT_SIZE, STATUS_NAMES, status_table

__all__ = [
    "MANIFEST",
    "REPORT_ITEMS",
    "TIMELINE_TABLES",
    "OutputError",
    "analyze",
    "analyze_outputs",
    "arrow_for_spark",
    "finish_output",
    "prepare_output",
    "unheld_connections",
]


TIMELINE_TABLES = ("connections", "streams", "attempts", "snapshots", "failover", "rollbacks", "noops", "stalls", "anomalies")
REPORT_ITEMS = 500  # items per stream (and flow samples per connection) kept for the report when items are not written


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
        names += ["items", "flow", *QUESTION_TABLES]
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
    fs, p = filesystem(out)
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
    fs, p = filesystem(path)
    with fs.open_output_stream(p) as f:
        f.write(text.encode("utf-8"))


_COUNTS = ("files", "frames", "connections", "streams", "anomalies")
_SAMPLED = 200_000  # frames sampled for the report's plot


def analyze(
    spark: Any,
    paths: Iterable[str],
    out_dir: str,
    *,
    split_size: int = DEFAULT_SPLIT_SIZE,
    partitions: int | None = None,
    options: Options = DEFAULT_OPTIONS,
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
    that decode them, as the frames are, and the questions' tables
    (:data:`~dcpinspect.spark.questions.QUESTION_TABLES`: key_versions,
    rollback_losses, rollback_lost_keys, progress, lag, comparisons,
    comparisons_vbuckets) are computed from them,
    exact, by the single process's functions (:mod:`dcpinspect.spark.questions`).
    """
    out = str(out_dir).rstrip("/")
    entries = analyze_outputs(items=items, report=report)
    prepare_output(out, entries, overwrite=overwrite)
    p = Pipeline(spark, paths, split_size=split_size, partitions=partitions, options=options)
    try:
        res = _run(p, out, items=items, report=report)
        finish_output(out, entries, {k: res[k] for k in (*_COUNTS, "questions") if k in res})
    finally:
        p.unpersist()
    return res


class _Laps:
    """Seconds per step, for the summary line."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.clock = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self.clock, 3)
        self.clock = now


def _run(p: Pipeline, out: str, *, items: bool, report: bool) -> dict[str, Any]:
    """The steps of :func:`analyze`: status, one decode (frames, numbering, timelines), timeline tables, report."""
    lap = _Laps()
    rows = [dict(zip(STATUS_NAMES, r, strict=True)) for r in p.status_rows()]
    _write_small(p.spark, out, "file_status", status_table(rows))
    lap("read and segments")
    max_items = REPORT_ITEMS
    # one decode: frames, numbering, timelines (and the report's sample of frames; every item and flow sample with items)
    num, picked = p.write_frames(
        f"{out}/frames",
        build=True,
        max_items=max_items,
        sample=_SAMPLED if report else 0,
        items_out=(f"{out}/items", f"{out}/flow") if items else None,
    )
    n = num.frames
    lap("shuffle, decode, frames written")
    t = p.timeline(max_items=max_items)
    lap("timelines merged")
    tables = p.timeline_tables(max_items=max_items)
    connections = tables["connections"]
    unheld = unheld_connections(num, t, dict(zip(p.paths, p.file_set, strict=True)))
    if unheld and "connections" in tables:
        tables["connections"] = _with_unheld(tables["connections"], unheld)
    for name, df in tables.items():
        if name in TIMELINE_TABLES:
            _write_small(p.spark, out, name, arrow_for_spark(df))
    lap("timeline tables written")
    answered: dict[str, int] = {}
    if items:
        high = part_high_seqnos(num, p.keys(build=True, max_items=max_items)[1])  # the parts of the decode above: no job
        answered = write_questions(p.spark, out, t, {**tables, "connections": connections}, high)
        lap("questions written")
    res: dict[str, Any] = {
        "files": len(rows),
        "frames": n,
        "connections": len(num.conn_ids),
        "streams": len(t.streams),
        "anomalies": len(t.anomalies),
        **({"questions": answered} if items else {}),
        "status": rows,
        "timings": lap.timings,
    }
    if report:
        page = _report(p, out, t, picked, rows, res, unheld=unheld, sampled=n > _SAMPLED, max_items=max_items)
        _write_text(f"{out}/report.html", page)
        lap("report")
    return res


def unheld_connections(num: Numbering, t: Any, file_set: Mapping[str, int]) -> list[dict[str, Any]]:
    """The connections numbered that the timeline ``t`` does not hold (TLS ones, those without memcached frames), as the report lists them.

    Rows of ``conn``, ``capture_set``, ``file`` (of its first segment),
    ``label`` and ``note`` - what
    :func:`dcpinspect.views.report.report_from_captures` gives; ``file_set``
    maps each file to its capture set.
    """
    places = num.places(file_set)
    return [
        {
            "conn": c,
            "capture_set": places.get(c, (1, ""))[0],
            "file": places.get(c, (1, ""))[1],
            "label": label,
            "note": "TLS: not decoded" if c in num.tls else "no memcached frames decoded",
        }
        for c, label in sorted(num.labels.items())
        if c not in t.connections
    ]


def _with_unheld(df: Any, unheld: list[dict[str, Any]]) -> Any:
    """The connections table with a row for each connection of ``unheld`` (its other columns null), in connection order."""
    import pandas as pd

    more = pd.DataFrame([{k: r[k] for k in ("conn", "capture_set", "file", "label")} for r in unheld])
    if not len(df):
        return more
    # integers and flags stay so where the new rows have nulls (not float64)
    nullable = {
        k: "boolean" if d.kind == "b" else f"{'U' if d.kind == 'u' else ''}Int{d.itemsize * 8}"
        for k, d in df.dtypes.items()
        if d.kind in "iub"
    }
    df = df.astype(nullable)
    both = pd.concat([df, more.astype({k: df[k].dtype for k in more.columns if k in df.columns})], ignore_index=True)
    return both.sort_values("conn", kind="stable").reset_index(drop=True)


def _report(
    p: Pipeline,
    out: str,
    t: Any,
    picked: Any,
    rows: list[dict[str, Any]],
    res: dict[str, Any],
    *,
    unheld: list[dict[str, Any]],
    sampled: bool,
    max_items: int,
) -> str:
    """``report.html`` (:func:`dcpinspect.views.report.render_report`) of the run.

    The frames the anomalies name and each set's first frame are read back
    from the frames table just written (one small job); every connection
    numbered is listed with its file and set, TLS ones too (``unheld``).
    The sample of frames carries their numbers and sets, so a big run gets
    its opcode plots per set too.
    """
    from ..views.report import named_frames, render_report

    wanted = sorted(set(named_frames(t)) | set((getattr(t, "set_first", None) or {}).values()))
    named = _named_rows(p.spark, out, wanted) if wanted else None
    counts = {k: res[k] for k in _COUNTS}
    return render_report(
        t,
        picked,
        rows,
        counts=counts,
        sampled=sampled,
        stream_items=p.stream_items(max_items=max_items),
        connections=unheld,
        named=named,
    )


def _local(spark: Any, out: str) -> bool:
    """Whether the driver can read ``out`` itself (a local path, not Spark Connect)."""
    return "://" not in out and not _is_connect(spark)


def _named_rows(spark: Any, out: str, frames: list[int]) -> pa.Table:
    """The rows of ``frames`` (frame numbers) in the frames table just written: read by the driver where it can, else by Spark."""
    from ..views.report import FRAME_COLUMNS as REPORT_COLUMNS  # the columns the report reads

    if _local(spark, out):
        import pyarrow.dataset as ds

        data = ds.dataset(f"{out}/frames", format="parquet")
        cols = [c for c in REPORT_COLUMNS if c in data.schema.names]
        return data.to_table(columns=cols, filter=ds.field("frame").isin(frames))
    from pyspark.sql import functions as F

    df = spark.read.parquet(f"{out}/frames")
    cols = [c for c in REPORT_COLUMNS if c in df.columns]
    return df.where(F.col("frame").isin(frames)).select(*cols).toArrow()


def _write_small(spark: Any, out: str, name: str, table: pa.Table) -> None:
    """A small table (on the driver) as ``out/name``: written by the driver itself where it can, else through Spark."""
    if "://" not in out and not _is_connect(spark):
        import pyarrow.parquet as pq

        d = Path(out) / name
        d.mkdir(parents=True)  # prepare_output cleared the way
        pq.write_table(table, d / "part-00000.parquet")
    else:
        from pyspark.sql.pandas.types import from_arrow_schema

        # the schema given: Spark Connect cannot infer one from an empty table
        spark.createDataFrame(table, schema=from_arrow_schema(table.schema)).coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}")
