"""The seed documents' byte tables as golden test vectors: kept in tests/golden/seeds/, read from there.

The documents this project was created from draw packets as byte tables
(the kv_engine docs/dcp style) followed by a field breakdown.  Their bytes,
their grid lines and their breakdown lines are facts the tests check the
decoder and the renderer against, so they are extracted into
``tests/golden/seeds/<seed>.json`` and a fresh clone runs those tests
without the documents.

Rules:

1. :func:`golden_grids` reads the extracted files (what the tests use).
2. :func:`grids` parses a document itself (when ``../shared/seeds`` is
   present); a ``shared`` test checks that the two agree.
3. ``python tests/seedparse.py`` rewrites the extracted files from the
   documents (after a deliberate change to the parser).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from paths import GOLDEN, SEEDS

GOLDEN_SEEDS = GOLDEN / "seeds"
#: the documents that draw byte tables (001 specifies the stream request's JSON value and draws none)
PREFIXES = ("000", "002", "003", "004")
_ROW = re.compile(r"^\s*(\d+)\|(.*)\|\s*$")
_CELL = re.compile(r"^\s*(?:0x)?([0-9a-fA-F]{2})\b")


@dataclass
class SeedGrid:
    seed: str
    index: int
    lines: list[str]  # the grid as drawn, dedented, tabs expanded, right-stripped
    data: bytes
    title: str = ""
    breakdown: list[str] = field(default_factory=list)  # title + Field line + rows, dedented


def seed_path(prefix: str) -> Path:
    matches = sorted(SEEDS.glob(f"{prefix}_*.txt"))
    if not matches:
        raise FileNotFoundError(prefix)
    return matches[0]


def grids(prefix: str) -> list[SeedGrid]:
    """Every grid holding bytes in seed ``prefix`` (layout-only diagrams are skipped)."""
    lines = [ln.expandtabs(4).rstrip() for ln in seed_path(prefix).read_text().splitlines()]
    out: list[SeedGrid] = []
    i = 0
    while i < len(lines):
        if "Byte/" not in lines[i]:
            i += 1
            continue
        indent = lines[i].index("Byte/") - 2
        j = i
        block: list[str] = []
        while j < len(lines) and lines[j].strip() and ("|" in lines[j] or "+" in lines[j]):
            block.append(lines[j][indent:] if indent >= 0 else " " * -indent + lines[j])
            j += 1
        data = bytearray()
        has_bytes = True
        for row in block[4:]:
            m = _ROW.match(row)
            if not m:
                continue
            for cell in m.group(2).split("|"):
                c = _CELL.match(cell)
                if not c:
                    has_bytes = False
                    break
                data.append(int(c.group(1), 16))
        if has_bytes and data:
            g = SeedGrid(prefix, len(out), block, bytes(data))
            _attach_breakdown(g, lines, j)
            out.append(g)
        i = j
    return out


def _attach_breakdown(g: SeedGrid, lines: list[str], j: int) -> None:
    k = j
    while k < len(lines) and not lines[k].strip().startswith("Field"):
        if "Byte/" in lines[k]:
            return
        k += 1
    if k >= len(lines):
        return
    field_line = lines[k]
    indent = len(field_line) - len(field_line.lstrip())
    g.title = lines[k - 1].strip()
    body = [lines[k - 1][indent:], field_line[indent:]]
    k += 1
    while k < len(lines) and lines[k].strip():
        body.append(lines[k][indent:] if lines[k][:indent].strip() == "" else lines[k].strip())
        k += 1
    g.breakdown = body


def golden_path(prefix: str) -> Path:
    """The extracted byte tables of seed ``prefix``."""
    return GOLDEN_SEEDS / f"{prefix}.json"


def to_json(prefix: str, gs: list[SeedGrid]) -> str:
    """The extracted form of a seed's grids: bytes as hex, lines as drawn."""
    rows = [{**asdict(g), "data": g.data.hex(" ")} for g in gs]
    return json.dumps({"seed": prefix, "grids": rows}, indent=1) + "\n"


def golden_grids(prefix: str) -> list[SeedGrid]:
    """The grids of seed ``prefix`` as extracted into tests/golden/seeds/ (no need of the document)."""
    doc = json.loads(golden_path(prefix).read_text())
    return [SeedGrid(**{**g, "data": bytes.fromhex(g["data"])}) for g in doc["grids"]]


def main() -> int:
    """Rewrite tests/golden/seeds/ from ../shared/seeds."""
    if not SEEDS.is_dir():
        sys.stderr.write(f"seedparse: {SEEDS} is absent: nothing to extract from\n")
        return 2
    GOLDEN_SEEDS.mkdir(parents=True, exist_ok=True)
    for prefix in PREFIXES:
        golden_path(prefix).write_text(to_json(prefix, grids(prefix)))
        print(golden_path(prefix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
