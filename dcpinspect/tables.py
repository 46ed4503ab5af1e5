"""Arrow and pandas views over the core (an edge module: imports pyarrow and pandas).

``frames_table`` builds the frames table column by column (the columns are
defined once, in ``columns.py``) as one Arrow table; ``frames_df`` is the same
as a pandas DataFrame (uint64 columns as nullable ``UInt64``); parquet and CSV
exports write the same table.  ``reference_frame`` is the protocol reference.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from .batches import SCHEMA, arrow_schema, read_batches
from .columns import FrameColumns
from .records import CaptureStats, Record
from .reference import reference_rows

__all__ = ["arrow_schema", "frames_df", "frames_table", "reference_frame", "write_csv", "write_parquet"]

_PANDAS = {
    pa.uint8(): pd.UInt8Dtype(),
    pa.uint16(): pd.UInt16Dtype(),
    pa.uint32(): pd.UInt32Dtype(),
    pa.uint64(): pd.UInt64Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
}


Source = str | Path | Iterable[str | Path] | Iterable[Record]


def frames_table(source: Source, *, stats: CaptureStats | None = None, **options: Any) -> pa.Table:
    """The frames table (one row per frame, garbage run, truncated frame or gap) as Arrow.

    ``source`` is a capture path, several paths (read in order, as one
    capture), or records (from :func:`~dcpinspect.records.iter_records`, a
    proxy or a client).  ``options`` go to :func:`~dcpinspect.batches.read_batches`
    (``server_ports``, ``detect``, ``reveal_secrets``, ``progress``).
    """
    if isinstance(source, (str, Path)):
        source = [source]
    items = list(source)
    if items and isinstance(items[0], Record):
        cols = FrameColumns().extend(items)  # type: ignore[arg-type]
        return pa.table({f.name: pa.array(cols.cols[f.name], type=f.type) for f in SCHEMA}, schema=SCHEMA)
    batches = list(read_batches([str(p) for p in items], stats=stats, **options))
    return pa.Table.from_batches(batches, schema=SCHEMA)


def frames_df(source: Source, *, stats: CaptureStats | None = None, **options: Any) -> pd.DataFrame:
    """The frames table as a pandas DataFrame (nullable integer dtypes, uint64 kept exact)."""
    return frames_table(source, stats=stats, **options).to_pandas(types_mapper=_PANDAS.get)


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
