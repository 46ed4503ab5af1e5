"""``spark.read.format("dcpinspect")``: a Spark 4 Python Data Source over capture files (an edge: imports pyspark).

Options:

* ``table``: ``frames`` (default), ``segments`` (stage 2 metadata, one
  partition per byte range), ``ranges`` or ``status`` (per-file status);
* ``ports``: comma-separated memcached server ports (default 11210,11209,11211);
* ``detect``: ``true``/``false`` - also decode other ports that look like memcached binary;
* ``reveal_secrets``: ``true`` to keep SASL secrets;
* ``split_size``: bytes per range (``segments``/``ranges``);
* ``capture_sets``: ``auto`` (default), ``one`` or ``per-file`` - which files
  are read as one capture (:mod:`dcpinspect.capture.sets`).

``load(path)`` takes a file, a glob or a directory; several paths may be
given comma-separated.  A data source reader cannot shuffle, so ``frames``
reads the files of one ``load`` in order in a single partition - exactly the
single-process frames table.  For big inputs use :class:`dcpinspect.spark.pipeline.Pipeline`
(split, shuffle by connection, decode in parallel), which gives the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..flows.reassembly import DEFAULT_SERVER_PORTS
from ..tables.schema import FRAMES_DDL
from .frametable import spark_batch
from .numbering import Options
from .session import expand_paths
from .stages import DEFAULT_SPLIT_SIZE, RANGE_DDL, SEG_DDL, STATUS_DDL, range_segments, split_file

__all__ = ["DcpDataSource"]


class _Part(InputPartition):
    def __init__(self, value: Any) -> None:
        super().__init__(value)


class DcpDataSource(DataSource):
    """The ``dcpinspect`` format (see the module docstring for the options)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "dcpinspect"

    def schema(self) -> str:
        """The DDL schema of the chosen table."""
        table = self.options.get("table", "frames").lower()
        if table == "segments":
            return SEG_DDL
        if table == "ranges":
            return RANGE_DDL
        if table == "status":
            return STATUS_DDL
        return FRAMES_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        """A batch reader."""
        return _Reader(dict(self.options))


def _paths(options: dict[str, str]) -> list[str]:
    raw = options.get("path") or options.get("paths") or ""
    if raw.startswith("["):
        import json

        items = json.loads(raw)
    else:
        items = [p for p in raw.split(",") if p]
    return expand_paths(items)


def _options(options: dict[str, str]) -> Options:
    ports = options.get("ports")
    return Options(
        server_ports=tuple(int(p) for p in ports.split(",")) if ports else tuple(sorted(DEFAULT_SERVER_PORTS)),
        detect=options.get("detect", "true").lower() != "false",
        reveal_secrets=options.get("reveal_secrets", "false").lower() == "true",
    )


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.table = options.get("table", "frames").lower()
        self.paths = _paths(options)
        self.split_size = int(options.get("split_size", DEFAULT_SPLIT_SIZE))

    def partitions(self) -> list[InputPartition]:
        if self.table in ("segments", "ranges"):
            return [_Part((i, p, ri, *r)) for i, p in enumerate(self.paths) for ri, r in enumerate(split_file(p, self.split_size))] or [
                _Part(None)
            ]
        return [_Part(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        v = partition.value
        if self.table == "ranges":
            if v is not None:
                yield tuple(v)
            return
        if self.table == "segments":
            if v is not None:
                yield range_segments(*v)
            return
        mode = self.options.get("capture_sets", "auto")
        if self.table == "status":
            yield from _status(self.paths, mode)
            return
        from ..tables.columnar import read_batches

        o = _options(self.options)
        for b in read_batches(self.paths, server_ports=o.server_ports, detect=o.detect, reveal_secrets=o.reveal_secrets, capture_sets=mode):
            yield spark_batch(b)


def _status(paths: list[str], mode: str = "auto") -> Iterator[tuple[Any, ...]]:
    from ..capture.read import capture_segments
    from ..capture.sets import file_sets, plan_capture_sets
    from ..flows.records import CaptureStats

    st = CaptureStats()
    for _ in capture_segments(paths, st):
        pass
    sets = file_sets(plan_capture_sets(paths, mode))
    for i, p in enumerate(paths):
        info = st.files.get(p, {})
        status = "error" if info.get("error") else "problems" if info.get("problems") else "ok"
        yield (
            i,
            p,
            status,
            info.get("format"),
            info.get("packets", 0),
            info.get("error"),
            info.get("problems", []),
            info.get("linktypes", []),
            sets.get(p, 1),
        )
