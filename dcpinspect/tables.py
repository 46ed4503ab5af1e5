"""Arrow and pandas views over the core (an edge module: imports pyarrow and pandas).

``frames_table`` builds the frames table column by column (the columns are
defined once, in ``columns.py``) as one Arrow table; ``frames_df`` is the same
as a pandas DataFrame (uint64 columns as nullable ``UInt64``); parquet and CSV
exports write the same table.  ``reference_frame`` is the protocol reference.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa

from .columns import FRAME_COLUMNS, FrameColumns
from .records import CaptureStats, Record, read_records
from .reference import reference_rows

__all__ = ["arrow_schema", "frames_df", "frames_table", "reference_frame", "write_csv", "write_parquet"]

_TYPES = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "timestamp[ns]": pa.timestamp("ns", tz="UTC"),
    "list<string>": pa.list_(pa.string()),
}
_PANDAS = {
    pa.uint8(): pd.UInt8Dtype(),
    pa.uint16(): pd.UInt16Dtype(),
    pa.uint32(): pd.UInt32Dtype(),
    pa.uint64(): pd.UInt64Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
}


def arrow_schema() -> pa.Schema:
    """The frames table's Arrow schema."""
    return pa.schema([pa.field(name, _TYPES[typ], metadata={"description": desc}) for name, typ, desc in FRAME_COLUMNS])


def _records(source: str | Path | Iterable[str | Path] | Iterable[Record], stats: CaptureStats | None) -> Iterable[Record]:
    if isinstance(source, (str, Path)):
        return read_records([str(source)], stats=stats)
    items = list(source)
    if items and not isinstance(items[0], Record):
        return read_records([str(p) for p in items], stats=stats)
    return items  # type: ignore[return-value]


def frames_table(source: str | Path | Iterable[str | Path] | Iterable[Record], *, stats: CaptureStats | None = None) -> pa.Table:
    """The frames table (one row per frame, garbage run, truncated frame or gap) as Arrow."""
    cols = FrameColumns().extend(_records(source, stats))
    schema = arrow_schema()
    return pa.table({f.name: pa.array(cols.cols[f.name], type=f.type) for f in schema}, schema=schema)


def frames_df(source: str | Path | Iterable[str | Path] | Iterable[Record], *, stats: CaptureStats | None = None) -> pd.DataFrame:
    """The frames table as a pandas DataFrame (nullable integer dtypes, uint64 kept exact)."""
    return frames_table(source, stats=stats).to_pandas(types_mapper=_PANDAS.get)


def write_parquet(table: pa.Table, path: str | Path) -> None:
    """Write the frames table as parquet (uint64 columns stay uint64)."""
    import pyarrow.parquet as pq

    pq.write_table(table, str(path))


def write_csv(table: pa.Table, path: str | Path) -> None:
    """Write the frames table as CSV (problems joined with '; ')."""
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    joined = pc.binary_join(table.column("problems"), "; ")
    table = table.set_column(table.schema.get_field_index("problems"), "problems", joined)
    pcsv.write_csv(table, str(path))


def reference_frame(*, dialect: str | None = None) -> pd.DataFrame:
    """Every opcode's layout (one row per command, role, variant and field) as a DataFrame."""
    df = pd.DataFrame(reference_rows())
    if dialect is not None:
        df = df[df["dialect"] == dialect].reset_index(drop=True)
    return df.astype({"offset": "string", "size": "string"})
