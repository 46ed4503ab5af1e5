"""Pandas tables as Arrow with Spark's types: what ``analyze`` writes beside the frames (the timeline tables, the questions' tables).

1. uint64 -> ``decimal(20,0)`` (exact), smaller unsigned -> the next signed type.
2. Timestamps -> microseconds UTC (Spark's unit; the nanoseconds a pcapng may carry are dropped there only).
3. Failover logs -> ``list<struct<uuid, seqno>>``; all-null columns -> string.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["arrow_for_spark"]


def arrow_for_spark(df: Any) -> pa.Table:
    """A pandas table (e.g. a timeline DataFrame) as Arrow with Spark's conventions.

    uint64 -> ``decimal(20,0)``, smaller unsigned -> the next signed type,
    timestamps -> microseconds UTC, failover logs -> ``list<struct<uuid, seqno>>``,
    all-null columns -> string.
    """
    arrays, names = [], []
    for name in df.columns:
        col = df[name]
        if name == "failover_log":
            typ = pa.list_(pa.struct([("uuid", pa.uint64()), ("seqno", pa.uint64())]))
            arr = pa.array([None if v is None else [{"uuid": u, "seqno": q} for u, q in v] for v in col], typ)
        else:
            try:
                arr = pa.array(col, from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                arr = pa.array([None if v is None else str(v) for v in col], pa.string())
        # nanoseconds -> Spark's microseconds drops digits: allowed (only) there
        arrays.append(pc.cast(arr, _spark_type(arr.type), safe=not pa.types.is_timestamp(arr.type)))
        names.append(str(name))
    return pa.Table.from_arrays(arrays, names=names)


def _spark_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_uint64(t):
        return pa.decimal128(20, 0)
    if pa.types.is_uint32(t):
        return pa.int64()
    if pa.types.is_uint16(t):
        return pa.int32()
    if pa.types.is_uint8(t):
        return pa.int16()
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_list(t):
        return pa.list_(_spark_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _spark_type(f.type)) for f in t])
    return t
