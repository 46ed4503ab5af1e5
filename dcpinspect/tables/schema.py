"""The tables' column types, defined once: the frames table in Arrow, in Spark and in pandas; the items and flow tables.

1. The frames table's columns are :data:`~dcpinspect.tables.columns.FRAME_COLUMNS`
   (name, type name, description); its Arrow schema is
   :data:`~dcpinspect.tables.frames_vector.SCHEMA`.
2. Spark has no unsigned integers and keeps microseconds: each type name maps
   to a Spark SQL type (:data:`SPARK_TYPES`) and to the Arrow type Spark
   takes for it (:data:`SPARK_ARROW`: uint64 -> ``decimal(20,0)``, uint32 ->
   int64, uint16 -> int32, uint8 -> int16, ``timestamp[ns]`` -> microseconds).
3. pandas gets nullable integer dtypes (:func:`pandas_dtype`), so uint64
   values stay exact; pandas is imported only when asked for.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pyarrow as pa

from .columns import FRAME_COLUMNS
from .frames_vector import SCHEMA

__all__ = [
    "COLUMN_TYPES",
    "FLOW_SCHEMA",
    "FRAMES_DDL",
    "ITEMS_SCHEMA",
    "SCHEMA",
    "SPARK_ARROW",
    "SPARK_SCHEMA",
    "SPARK_TYPES",
    "TIMESTAMP_US",
    "pandas_dtype",
]

#: a frames column's type name -> its Spark SQL type
SPARK_TYPES = {
    "string": "string",
    "int64": "bigint",
    "int32": "int",
    "uint8": "smallint",
    "uint16": "int",
    "uint32": "bigint",
    "uint64": "decimal(20,0)",
    "timestamp[ns]": "timestamp",
    "list<string>": "array<string>",
}
TIMESTAMP_US = pa.timestamp("us", tz="UTC")  # Spark's timestamps
#: a frames column's type name -> the Arrow type Spark holds it in (where that differs from the frames table's)
SPARK_ARROW = {
    "uint8": pa.int16(),
    "uint16": pa.int32(),
    "uint32": pa.int64(),
    "uint64": pa.decimal128(20, 0),
    "timestamp[ns]": TIMESTAMP_US,
}
#: a frames column's name -> its type name
COLUMN_TYPES = {name: t for name, t, _ in FRAME_COLUMNS}
#: the frames table in Spark (columns of :data:`~dcpinspect.tables.columns.FRAME_COLUMNS`, Spark types)
FRAMES_DDL = ", ".join(f"`{name}` {SPARK_TYPES[t]}" for name, t, _ in FRAME_COLUMNS)
#: the frames table's Arrow schema with Spark's types
SPARK_SCHEMA = pa.schema([pa.field(f.name, SPARK_ARROW.get(COLUMN_TYPES[f.name], f.type)) for f in SCHEMA])
#: the items and flow tables as ``analyze --items`` writes them (the timeline tables' ``items`` and ``flow`` in Spark's types)
ITEMS_SCHEMA = pa.schema(
    [(k, pa.int64()) for k in ("stream", "conn", "vbucket", "frame")]
    + [("ts", TIMESTAMP_US), ("name", pa.string()), ("seqno", pa.decimal128(20, 0)), ("snapshot", pa.int64())]
)
FLOW_SCHEMA = pa.schema(
    [
        ("conn", pa.int64()),
        ("frame", pa.int64()),
        ("ts", TIMESTAMP_US),
        ("outstanding", pa.int64()),
        ("event", pa.string()),
        ("size", pa.int64()),
    ]
)


@cache
def _pandas_types() -> dict[pa.DataType, Any]:
    import pandas as pd

    return {
        pa.uint8(): pd.UInt8Dtype(),
        pa.uint16(): pd.UInt16Dtype(),
        pa.uint32(): pd.UInt32Dtype(),
        pa.uint64(): pd.UInt64Dtype(),
        pa.int32(): pd.Int32Dtype(),
        pa.int64(): pd.Int64Dtype(),
    }


def pandas_dtype(t: pa.DataType) -> Any:
    """The nullable pandas dtype of an Arrow integer type, else None: ``table.to_pandas(types_mapper=pandas_dtype)``."""
    return _pandas_types().get(t)
