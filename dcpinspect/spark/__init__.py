"""The captures -> frames -> timelines pipeline on Spark (the only package that imports pyspark).

Theory of operation: thin glue over the core - no second decoder.  Each
stage is a function from DataFrame to DataFrame:

1. :func:`~dcpinspect.spark.stages.split`: each file into record-aligned
   byte ranges (:func:`~dcpinspect.capture.pcapfile.split_ranges`), so one big
   file is read by many tasks; each range carries the file's header bytes and
   is read as a capture of its own.
2. :func:`~dcpinspect.spark.stages.segments`: the TCP segments of each range
   (:func:`~dcpinspect.tables.packets_vector.range_window`: the headers parsed
   with numpy, as the single-process path does) as metadata: capture
   position (file index << 40 | packet number), time, endpoints, sequence
   number, flags, and the payload's offset and length in its file - not the
   payload.  Spark moves one row per connection and range, its segments
   packed in a binary column (:func:`~dcpinspect.spark.stages.range_packed`),
   not a row per segment: persisting and shuffling rows cost more than
   reading the segments.  Per-range status rows travel along; their packet
   counts give each file's first position in the capture (the files read as
   one), which numbers rows and times holes as a single process does.
3. :func:`~dcpinspect.spark.stages.by_connection`: shuffle by connection
   (spread by size), sort by capture position.  Then each task reads the
   payload bytes straight from the files (``pyarrow.fs``, so cluster storage
   works the same) a window at a time and decodes them by the single-process
   columnar path (:func:`~dcpinspect.tables.columnar.decode_windows`: simple
   connections as arrays, the rest through the core's reassembler).
   A keys pass (:mod:`~dcpinspect.spark.passes`) counts the records each
   capture position completes: that small table, collected, gives every
   frame and connection its single-process number
   (:mod:`~dcpinspect.spark.numbering`).  Written to files, the frames leave
   the same decode with their keys and are renumbered into parquet
   (:mod:`~dcpinspect.spark.frametable`).
4. :mod:`~dcpinspect.spark.timelines`: each connection's timeline is built in
   the keys pass; what crosses connections is replayed on the driver.

Rules:

1. Rows are the single-process rows: the same frames table and timeline,
   number for number (tests compare them row for row).
2. Spark types: uint64 columns are ``decimal(20,0)``, uint32 ``long``, uint16
   ``int``, uint8 ``short``; timestamps are Spark timestamps (microseconds,
   UTC) - see :mod:`dcpinspect.tables.schema`.
3. Nothing crosses a task but small tables: segment metadata, the keys table,
   pickled timeline parts.  Payload bytes are read where they are decoded.
4. ``import dcpinspect.spark`` imports neither pyspark, numpy nor pyarrow:
   the names below load their module on first use.
5. Everything a task runs pickles (module-level functions and classes).
6. Capture sets (:mod:`dcpinspect.capture.sets`) are planned on the driver;
   the files are listed set after set and each set is read as a capture of
   its own (a task decodes each set's segments apart; the numbering keys
   order the sets), so frames, connections and timelines are the single
   process's, ``capture_set`` and ``set_frame`` included.
"""

from __future__ import annotations

from typing import Any

_PUBLIC = {
    "Pipeline": "pipeline",
    "frames": "pipeline",
    "register_data_source": "pipeline",
    "analyze": "analysis",
    "TIMELINE_TABLES": "analysis",
    "get_session": "session",
    "check_java": "session",
    "DEFAULT_SPLIT_SIZE": "stages",
}


def __getattr__(name: str) -> Any:
    """The Spark entry points, imported on first use (numpy and pyarrow load only then)."""
    module = _PUBLIC.get(name)
    if module is not None:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
