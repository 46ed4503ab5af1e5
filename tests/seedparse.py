"""Read the byte-table diagrams and breakdowns out of the seed documents."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

SEEDS = Path(__file__).resolve().parents[1].parent / "shared" / "seeds"
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
