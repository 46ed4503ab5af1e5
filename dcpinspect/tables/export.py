"""Arrow and pandas views over the core (an edge module: imports pyarrow and pandas).

``frames_table`` builds the frames table column by column (the columns are
defined once, in ``columns.py``) as one Arrow table; ``frames_df`` is the same
as a pandas DataFrame (uint64 columns as nullable ``UInt64``); parquet and CSV
exports write the same table.  ``reference_frame`` is the protocol reference.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..flows.records import CaptureStats, Record
from ..protocol.reference import reference_rows
from .columnar import read_batches
from .columns import COLUMN_NAMES, DICTIONARY_COLUMNS, STATISTICS_COLUMNS, FrameColumns
from .frames_vector import SCHEMA, arrow_schema
from .schema import pandas_dtype

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FramesWriter",
    "OutputError",
    "arrow_schema",
    "csv_table",
    "flow_control_frame",
    "frame_counts",
    "frame_rows",
    "frames_df",
    "frames_table",
    "query_frames",
    "reference_frame",
    "write_csv",
    "write_parquet",
]

Source = str | Path | Iterable[str | Path] | Iterable[Record]


def frames_table(source: Source, *, stats: CaptureStats | None = None, **options: Any) -> pa.Table:
    """The frames table (one row per frame, garbage run, truncated frame or gap) as Arrow.

    ``source`` is a capture path, several paths (read in order, as one
    capture), or records (from :func:`~dcpinspect.flows.records.iter_records`, a
    proxy or a client).  ``options`` go to :func:`~dcpinspect.tables.columnar.read_parts`
    (``server_ports``, ``detect``, ``reveal_secrets``, ``json_check``, ``progress``).
    """
    if isinstance(source, (str, Path)):
        source = [source]
    items = list(source)
    if items and isinstance(items[0], Record):
        cols = FrameColumns().extend(items)  # type: ignore[arg-type]
        return pa.table({f.name: pa.array(cols.cols[f.name], type=f.type) for f in SCHEMA}, schema=SCHEMA)
    batches = list(read_batches([str(p) for p in items], stats=stats, **options))
    return pa.Table.from_batches(batches, schema=SCHEMA)


def frames_df(source: Source, *, stats: CaptureStats | None = None, **options: Any) -> pd.DataFrame:  # pandas: imported by to_pandas
    """The frames table as a pandas DataFrame (nullable integer dtypes, uint64 kept exact)."""
    return frames_table(source, stats=stats, **options).to_pandas(types_mapper=pandas_dtype)


def write_parquet(table: pa.Table, path: str | Path) -> None:
    """Write the frames table as parquet (uint64 columns stay uint64)."""
    import pyarrow.parquet as pq

    pq.write_table(table, str(path), use_dictionary=list(DICTIONARY_COLUMNS), write_statistics=_statistics(table.schema))


def _statistics(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` whose statistics are written (:data:`STATISTICS_COLUMNS`; any column not of the frames table)."""
    plain = set(COLUMN_NAMES) - set(STATISTICS_COLUMNS)
    return [n for n in schema.names if n not in plain]


def write_csv(table: pa.Table, path: str | Path) -> None:
    """Write the frames table as CSV (problems joined with '; ')."""
    import pyarrow.csv as pcsv

    pcsv.write_csv(csv_table(table), str(path))


def csv_table(table: pa.Table) -> pa.Table:
    """The frames table as CSV holds it: each row's ``problems`` joined with '; ' (CSV has no lists)."""
    import pyarrow.compute as pc

    joined = pc.binary_join(table.column("problems"), "; ")
    return table.set_column(table.schema.get_field_index("problems"), "problems", joined)


def _table(frames: pa.Table | pa.RecordBatch) -> pa.Table:
    return frames if isinstance(frames, pa.Table) else pa.Table.from_batches([frames], schema=frames.schema)


def query_frames(frames: pa.Table | pa.RecordBatch, expr: str) -> pa.Table:
    """The rows of ``frames`` for which the pandas query ``expr`` holds (evaluated as Python: pass only trusted text).

    Raises what pandas raises for a bad expression.
    """
    table = _table(frames)
    df = table.to_pandas(types_mapper=pandas_dtype).query(expr, engine="python")
    return pa.Table.from_pandas(df, schema=table.schema, preserve_index=False)


def frame_counts(frames: pa.Table | pa.RecordBatch) -> tuple[dict[str, int], dict[str, int], int]:
    """Rows per ``type``, frames per ``"NAME role"``, and the problems on frames, of a frames table (what ``summary`` prints)."""
    import pyarrow.compute as pc

    def counts(values: pa.Array | pa.ChunkedArray) -> dict[str, int]:
        vc = pc.value_counts(values).flatten()
        return dict(zip(vc[0].to_pylist(), vc[1].to_pylist(), strict=True))

    table = _table(frames)
    types = table.column("type")
    kinds = counts(types)
    framed = table.filter(pc.equal(types, "frame"))
    if not framed.num_rows:
        return kinds, {}, 0
    ops = pc.binary_join_element_wise(framed.column("name"), framed.column("role"), " ")
    problems = pc.sum(pc.list_value_length(framed.column("problems"))).as_py() or 0
    return kinds, counts(ops), int(problems)


def frame_rows(frames: pa.Table | pa.RecordBatch, columns: Iterable[str]) -> list[dict[str, Any]]:
    """The rows of ``frames`` as dicts of ``columns``, ``ts`` as integer nanoseconds (the rows the CLI prints)."""
    table = _table(frames).select(list(columns))
    if "ts" in table.column_names:
        i = table.schema.get_field_index("ts")
        table = table.set_column(i, "ts", table.column(i).cast(pa.int64()))
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


class OutputError(Exception):
    """An output file cannot be written (the text says which and why, in one line)."""


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


class FramesWriter:
    """The frames table written to one parquet or CSV file as it comes, table by table.

    Rules: the file is created at once (a path that cannot be written fails
    before any capture is read); a run with no rows still leaves a valid file
    of the frames table's columns; every error of the file is an
    :class:`OutputError` naming the path and the reason.
    """

    def __init__(self, path: str | Path, fmt: str, schema: pa.Schema = SCHEMA) -> None:
        if fmt not in ("parquet", "csv"):
            raise ValueError(f"no frames writer for {fmt!r} (parquet or csv)")
        self.path = str(path)
        self.fmt = fmt
        self.rows = 0
        self.schema = schema
        try:
            self._file: Any = Path(self.path).open("wb")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {_why(exc)}") from None
        try:
            self._writer: Any = self._open(schema)
        except (OSError, pa.ArrowException) as exc:
            self._file.close()
            raise OutputError(f"cannot write {self.path}: {exc}") from None

    def _open(self, schema: pa.Schema) -> Any:
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetWriter(self._file, schema, use_dictionary=list(DICTIONARY_COLUMNS), write_statistics=_statistics(schema))
        import pyarrow.csv as pcsv

        return pcsv.CSVWriter(self._file, csv_table(schema.empty_table()).schema)

    def write(self, frames: pa.Table | pa.RecordBatch) -> None:
        """Append the rows of ``frames`` (of the frames table's schema)."""
        table = _table(frames)
        if not table.schema.equals(self.schema):
            table = table.select(self.schema.names).cast(self.schema)
        if self.fmt == "csv":
            table = csv_table(table)
        try:
            self._writer.write_table(table)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {_why(exc)}") from None
        self.rows += table.num_rows

    def close(self) -> None:
        """Finish the file (a valid file, also with no rows)."""
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        try:
            writer.close()
            self._file.close()
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {_why(exc)}") from None


def flow_control_frame() -> pd.DataFrame:
    """What each DCP message costs the producer's flow-control window, one row per message and variant.

    Computed, not typed: each frame is built by :func:`~dcpinspect.wire.encode.encode`
    with an empty key and value and priced by
    :func:`~dcpinspect.protocol.rules.flow_control_size` (kv_engine
    docs/dcp/documentation/flow-control.md).  ``charged`` is the cost of that
    frame and ``formula`` adds ``+ k`` / ``+ v`` where the key and value count
    too; ``wire`` is its length, so ``charged - wire`` shows a prepare's 2 extra
    bytes.  Every system event costs alike (one row).  The last rows are what
    costs nothing: a noop and the responses to the consumer's own requests.
    """
    import pandas as pd

    from ..protocol import spec
    from ..protocol.enums import Opcode
    from ..protocol.rules import flow_control_size
    from ..protocol.session import STREAM_MESSAGES
    from ..wire.encode import encode

    def priced(name: str, variant: str | None = None, **kw: Any) -> tuple[int, int]:
        raw = encode(name, variant=variant, **kw)
        return flow_control_size(raw[0], raw[1], len(raw)), len(raw)

    rows: list[dict[str, Any]] = []
    for op in sorted(STREAM_MESSAGES):
        cmd = spec.COMMANDS[op]
        variants = cmd.request[:1] if op == Opcode.DCP_SYSTEM_EVENT else cmd.request
        for v in variants:
            marker_v2 = op == Opcode.DCP_SNAPSHOT_MARKER and v.name != "v1"
            charged, wire = priced(cmd.name, v.name or None, value={} if marker_v2 else None)
            counts_value = v.value != "none" and op != Opcode.DCP_SNAPSHOT_MARKER  # a marker's value is fixed
            formula = f"{charged}" + (" + k" if v.key != "none" else "") + (" + v" if counts_value else "")
            variant = "any event" if op == Opcode.DCP_SYSTEM_EVENT else v.name
            rows.append({"message": cmd.name, "variant": variant, "counted": True, "formula": formula, "charged": charged, "wire": wire})
    for name, response in (("DCP_NOOP", False), ("DCP_STREAM_REQ", True), ("DCP_CONTROL", True)):
        charged, wire = priced(name, response=response)
        label = name + (" response" if response else "")
        rows.append({"message": label, "variant": "", "counted": charged > 0, "formula": f"{charged}", "charged": charged, "wire": wire})
    return pd.DataFrame(rows)


def reference_frame(*, dialect: str | None = None) -> pd.DataFrame:
    """Every opcode's layout (one row per command, role, variant and field) as a DataFrame.

    ``reply`` says, on a DCP request's rows, whether its receiver answers it
    (:data:`dcpinspect.protocol.rules.REPLIES`: e.g. a DCP_NOOP always, a
    DCP_MUTATION only on an error, a DCP_SNAPSHOT_MARKER only with the Ack flag).
    """
    import pandas as pd

    df = pd.DataFrame(reference_rows())
    if dialect is not None:
        df = df[df["dialect"] == dialect].reset_index(drop=True)
    return df.astype({"offset": "string", "size": "string"})
