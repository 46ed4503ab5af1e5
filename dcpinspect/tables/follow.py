"""Rows of the frames table for ``follow`` and ``frames --conn/--pcap``: one connection, one DCP stream, packet spans (an edge: pyarrow).

Rules:

1. A connection's rows are those whose ``conn_id`` is its number.
2. A stream segment's rows are the frames the timeline names for it, and the
   rows of its connection with one of its opaques, inside its span (from its
   first named frame to the first frame of the next segment of the same
   connection and stream id), of its stream id (or none) - what the timeline
   did not take is listed too.
3. Tables or batches in, Arrow tables out, sorted by frame where it matters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["as_table", "concat", "conn_rows", "packet_spans", "segment_rows", "stream_candidates"]


def as_table(frames: pa.Table | pa.RecordBatch) -> pa.Table:
    """A batch as a table (a table as it is)."""
    return frames if isinstance(frames, pa.Table) else pa.Table.from_batches([frames])


def conn_rows(frames: pa.Table | pa.RecordBatch, conn: int | None) -> pa.Table:
    """The rows of connection ``conn`` (all rows when None)."""
    table = as_table(frames)
    return table if conn is None else table.filter(pc.equal(table.column("conn_id"), conn))


def packet_spans(frames: pa.Table | pa.RecordBatch) -> list[tuple[int, int, str, int, int]]:
    """``(capture_set, conn_id, dir, packet_first, packet)`` of each row: the packets that carry its bytes (set 1 without sets)."""
    table = as_table(frames)
    n = table.num_rows
    sets = table.column("capture_set").to_pylist() if "capture_set" in table.column_names else [1] * n
    cols = [table.column(c).to_pylist() for c in ("conn_id", "dir", "packet_first", "packet")]
    return list(zip(sets, *cols, strict=True))


def stream_candidates(frames: pa.Table | pa.RecordBatch, vbucket: int) -> pa.Table:
    """The rows a stream of ``vbucket`` can name: requests of the vbucket, and every response (a stream's by their opaque)."""
    table = as_table(frames)
    mask = pc.or_kleene(pc.equal(table.column("vbucket"), vbucket), pc.equal(table.column("role"), "response"))
    return table.filter(pc.fill_null(mask, False))


def concat(tables: Iterable[pa.Table]) -> pa.Table | None:
    """The tables one after another (None for none)."""
    parts = list(tables)
    return pa.concat_tables(parts, promote_options="default") if parts else None


def segment_rows(
    table: pa.Table, conn: int, stream_id: int | None, named: set[int], opaques: set[int], lo: int, hi: int | None
) -> pa.Table:
    """The rows of one stream segment (rule 2), in frame order."""
    frame = table.column("frame")
    same = pc.and_(pc.equal(table.column("conn_id"), conn), pc.is_in(table.column("opaque"), pa.array(sorted(opaques), pa.uint32())))
    span = pc.greater_equal(frame, lo)
    if hi is not None:
        span = pc.and_(span, pc.less(frame, hi))
    sids = table.column("stream_id")
    own: Any = pc.or_(pc.is_null(sids), pc.equal(sids, stream_id)) if stream_id is not None else pc.is_null(sids)
    mask = pc.or_kleene(pc.is_in(frame, pa.array(sorted(named), pa.int64())), pc.and_kleene(pc.and_kleene(same, span), own))
    picked = table.filter(pc.fill_null(mask, False))
    return picked.take(pc.sort_indices(picked.column("frame")))
