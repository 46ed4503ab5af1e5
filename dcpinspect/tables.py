"""pandas views over the core (an edge module: imports pandas).

Only the protocol reference lives here for now; the frames and timeline
tables build on the same module.
"""

from __future__ import annotations

import pandas as pd

from .reference import reference_rows

__all__ = ["reference_frame"]


def reference_frame(*, dialect: str | None = None) -> pd.DataFrame:
    """Every opcode's layout (one row per command, role, variant and field) as a DataFrame."""
    df = pd.DataFrame(reference_rows())
    if dialect is not None:
        df = df[df["dialect"] == dialect].reset_index(drop=True)
    return df.astype({"offset": "string", "size": "string"})
