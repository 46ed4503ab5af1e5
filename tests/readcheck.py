"""Both capture paths over the same files: the exact one (per-packet reassembly) and the columnar one, compared row for row."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from dcpinspect.capture.read import read_chunks
from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.columnar import read_batches
from dcpinspect.tables.frames_vector import SCHEMA, record_batches


def _conns(stats: CaptureStats) -> list[tuple[Any, ...]]:
    return [
        (
            c.id,
            c.label,
            c.file,
            c.last_file,
            c.packets,
            c.closed,
            c.role_source,
            c.tls,
            c.syn_seen,
            c.first_ts,
            c.last_ts,
            c.lost,
            {d: (h.bytes, h.segments, h.lost, h.conflicts, h.after_close) for d, h in c.halves.items()},
        )
        for c in stats.connections
    ]


def _states(stats: CaptureStats) -> dict[int, Any]:
    return {k: (v.context, v.features, v.open_flags, v.open_name, v.controls, v.bucket, v.sasl_mechanism) for k, v in stats.states.items()}


def assert_same_read(paths: list[str], **options: Any) -> pa.Table:
    """Both paths over ``paths``: equal tables and equal statistics; the columnar table."""
    window = options.pop("window", None)
    s1, s2 = CaptureStats(), CaptureStats()
    exact = pa.Table.from_batches(list(record_batches(read_chunks(paths, stats=s1, **options))), schema=SCHEMA)
    more = {"window": window} if window else {}
    got = pa.Table.from_batches(list(read_batches(paths, stats=s2, **options, **more)), schema=SCHEMA)
    assert got.num_rows == exact.num_rows, (got.num_rows, exact.num_rows)
    for name in exact.column_names:
        a, b = exact.column(name).to_pylist(), got.column(name).to_pylist()
        if a != b:
            i = next(i for i in range(len(a)) if a[i] != b[i])
            raise AssertionError(f"column {name!r} differs at row {i}: exact {a[i]!r}, columnar {b[i]!r}")
    assert s2.files == s1.files
    assert s2.sets == s1.sets and s2.set_first == s1.set_first
    assert s2.skipped == s1.skipped
    assert s2.packets == s1.packets
    assert s2.records == s1.records
    assert _conns(s2) == _conns(s1)
    assert _states(s2) == _states(s1)
    return got
