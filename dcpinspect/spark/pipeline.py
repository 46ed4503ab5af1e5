"""The pipeline over one set of captures: each stage once, its output kept for the next (an edge: imports pyspark lazily).

Thin glue over the core - no second decoder.  Each stage is a function from
DataFrame to DataFrame (:mod:`~dcpinspect.spark.stages`,
:mod:`~dcpinspect.spark.passes`, :mod:`~dcpinspect.spark.frametable`);
:class:`Pipeline` runs them in order, persists the segment metadata once and
collects the small keys table once.

Capture sets (:mod:`dcpinspect.capture.sets`) are planned on the driver:
the files are listed set after set (each set's files in its reading order),
each set is read as a capture of its own (:mod:`~dcpinspect.spark.numbering`
rule 4), frames and connections are numbered on across the sets, and the
timelines are merged with each connection in its set - what the single
process gives, row for row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from ..capture.sets import CaptureSet, file_sets, plan_capture_sets
from ..timeline.merge import ConnPart
from .frametable import frames_numbered
from .numbering import DEFAULT_OPTIONS, CaptureEnd, Numbering, Options
from .passes import collect_keys, keys_pass, write_frames
from .session import expand_paths, files_frame
from .stages import DEFAULT_SPLIT_SIZE, STATUS_DDL, STATUS_INPUT, by_connection, connection_sizes, file_ends, segments, split, status_rows
from .timelines import merge_timelines

__all__ = ["Pipeline", "frames", "register_data_source"]


def frames(spark: Any, paths: Iterable[str], **kwargs: Any) -> Any:
    """The frames table of ``paths`` as a Spark DataFrame (see :class:`Pipeline` for the options)."""
    return Pipeline(spark, paths, **kwargs).frames()


class Pipeline:
    """The stages over one set of captures; the segment metadata is persisted once, the small keys table collected once.

    Args:
        spark: a SparkSession (classic or Connect).
        paths: capture files, globs or directories (each capture set read as one capture).
        split_size: bytes per range (a big file is read by many tasks).
        partitions: connection partitions for the frames stage (default: the session's shuffle partitions).
        options: decode options (ports, detection, secrets).
        capture_sets: ``auto``, ``one`` or ``per-file`` (:func:`~dcpinspect.capture.sets.plan_capture_sets`).
    """

    def __init__(
        self,
        spark: Any,
        paths: Iterable[str],
        *,
        split_size: int = DEFAULT_SPLIT_SIZE,
        partitions: int | None = None,
        options: Options = DEFAULT_OPTIONS,
        capture_sets: str = "auto",
    ) -> None:
        self.spark = spark
        self.sets: list[CaptureSet] = plan_capture_sets(expand_paths(paths), capture_sets)
        self.paths = [f for cs in self.sets for f in cs.files]  # set after set: positions order the sets
        self.file_set = tuple(cs.number for cs in self.sets for _f in cs.files)
        self.split_size = split_size
        self.partitions = partitions or int(spark.conf.get("spark.sql.shuffle.partitions") or 4)
        self.options = options
        self._segs: Any = None
        self._data: Any = None
        self._keys: tuple[Numbering, list[ConnPart], bool, int | None] | None = None
        self._timeline: tuple[Any, dict[int, int], int | None] | None = None
        self._sum: tuple[list[tuple[Any, ...]], tuple[list[tuple[str, int]], tuple[int, int]]] | None = None
        self._ends: dict[int, tuple[int, int]] = {}
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
                .select("kind", "file_index", "path", *STATUS_INPUT, "ckey", "missing", "poff", "gpos", "ts")
            )
            rows = t.toArrow()
            self._sum = (status_rows(rows, self.file_set), connection_sizes(rows))
            self._ends = file_ends(rows)
        return self._sum

    def status_rows(self) -> list[tuple[Any, ...]]:
        """The per-file status table's rows (:data:`STATUS_DDL`: the file's capture set last), on the driver."""
        return self._summary()[0]

    def set_first(self) -> dict[int, int]:
        """The number of each capture set's first frame."""
        return self.numbering().set_first(len(self.sets))

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

    def last(self) -> CaptureEnd:
        """Where the capture ends (ts, capture position of its last TCP segment: see :func:`capture_end`) and where each file starts."""
        summary = self._summary()
        ts, gpos = summary[1][1]
        if len(self.sets) <= 1:
            return CaptureEnd(ts, gpos, CaptureEnd.file_bases(summary[0]))
        fs = self.file_set
        return CaptureEnd(ts, gpos, CaptureEnd.file_bases(summary[0], fs), fs, CaptureEnd.set_ends_of(self._ends, fs))

    def keys(self, *, build: bool = False, max_items: int | None = None) -> tuple[Numbering, list[ConnPart]]:
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
        t, counts = merge_timelines(parts, num.frames_of, capture_sets=file_sets(self.sets))
        t.renumber(num.frame, num.conn_ids)
        t.set_first = num.set_first(len(self.sets))
        self._timeline = (t, counts, max_items)
        return t

    def stream_items(self, *, max_items: int | None = None) -> dict[int, int]:
        """The true item count of each stream of :meth:`timeline` (by index), however thinned its items are."""
        self.timeline(max_items=max_items)
        return dict(self._timeline[1]) if self._timeline is not None else {}

    def timeline_tables(self, *, max_items: int | None = None) -> dict[str, Any]:
        """The timeline DataFrames of :func:`dcpinspect.tables.timeline.timeline_frames` (pandas), with true item counts."""
        from ..tables.timeline import timeline_frames

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


def register_data_source(spark: Any) -> None:
    """Register ``spark.read.format("dcpinspect")`` (see :mod:`dcpinspect.spark.source`)."""
    from .source import DcpDataSource

    spark.dataSource.register(DcpDataSource)
