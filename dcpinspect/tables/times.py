"""The reference time of each row of a frames table, for the text output's time column (``-t r`` and ``-t d``).

Rules:

1. ``r``: a row's reference is the start of its capture set - when the set's
   first frame with a known time began (its ``ts_first``, else its ``ts``) -
   remembered across tables in ``start`` (capture set -> ns).
2. ``d``: a row's reference is the previous row's ``ts`` (the last row of
   the table before, ``previous``, for the first).
3. The references are taken from every row read, before any filter drops
   rows, so a filter never moves a frame's time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["with_time_reference"]

_SET = "capture_set"


def _ints(table: pa.Table | pa.RecordBatch, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table.column(name).cast(pa.int64())
    return pc.fill_null(col, 0).to_numpy(zero_copy_only=False), pc.is_valid(col).to_numpy(zero_copy_only=False)


def with_time_reference(
    table: pa.Table | pa.RecordBatch, mode: str, start: dict[Any, int], previous: int | None, column: str
) -> tuple[pa.Table | pa.RecordBatch, int | None]:
    """``table`` with the int64 ``column`` of each row's reference (null: unknown), and the ``previous`` for the next table.

    ``mode`` is ``"r"`` (``start`` is read and filled) or ``"d"``.
    """
    n = table.num_rows
    ts, known = _ints(table, "ts")
    if mode == "d":
        ref = np.zeros(n, np.int64)
        has = np.zeros(n, bool)
        if n:
            ref[0], has[0] = (previous or 0), previous is not None
            ref[1:], has[1:] = ts[:-1], known[:-1]
            previous = int(ts[-1]) if known[-1] else None
    else:
        first, first_known = _ints(table, "ts_first") if "ts_first" in table.column_names else (ts, known)
        begun = np.where(first_known, first, ts)
        timed = first_known | known
        sets = table.column(_SET).to_pylist() if _SET in table.column_names else [None] * n
        for key in dict.fromkeys(sets):
            if key not in start:
                rows = np.flatnonzero(np.fromiter((s == key for s in sets), bool, n) & timed)
                if len(rows):
                    start[key] = int(begun[rows[0]])
        ref = np.array([start.get(s, 0) for s in sets], np.int64)
        has = np.array([s in start for s in sets], bool)
    return table.append_column(column, pa.array(ref, pa.int64(), mask=~has)), previous
