"""Execute the notebooks and store their outputs: ``python notebooks/build.py [NAME ...]``.

The notebooks ship executed, so they read well on a code host and in a viewer
without running.  This runs each one top to bottom on a fresh kernel (in the
notebooks folder, as a reader would) and writes it back with its outputs.

1. ``NAME`` selects notebooks by prefix (``03``, ``07_topics``); none: all.
2. A cell whose source starts with ``quiz.answer(`` is an exercise's answer:
   its source is hidden (``jupyter.source_hidden``) and it is tagged
   ``answer``; its output is collapsed by itself.
3. Run timings are dropped from the cell metadata, so a rebuild's diff is the
   outputs that changed.
4. A notebook that fails is not written back; the error is one line and the
   exit status is 1 after the others ran.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = Path(__file__).resolve().parent
ANSWER = "quiz.answer("


def notebooks(names: list[str]) -> list[Path]:
    """The notebooks whose file names start with one of ``names`` (all of them if none)."""
    every = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in every if not names or any(p.name.startswith(n) for n in names)]


def mark_answers(nb: nbformat.NotebookNode) -> None:
    """Hide and tag the exercises' answer cells (rule 2)."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = list(cell.metadata.get("tags", []))
        if cell.source.lstrip().startswith(ANSWER):
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
            if "answer" not in tags:
                cell.metadata["tags"] = [*tags, "answer"]


def tidy(nb: nbformat.NotebookNode) -> None:
    """Drop run timings (rule 3)."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)


def build(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """Execute ``path`` on a fresh kernel and return it with its outputs."""
    nb = nbformat.read(path, as_version=4)
    mark_answers(nb)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    tidy(nb)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute the notebooks and store their outputs.")
    parser.add_argument("names", nargs="*", help="notebook name prefixes (default: every notebook)")
    args = parser.parse_args(argv)
    paths = notebooks(args.names)
    if not paths:
        print(f"build.py: error: no notebook starts with {' or '.join(args.names)}", file=sys.stderr)
        return 1
    failed = 0
    for path in paths:
        try:
            nb = build(path)
        except CellExecutionError as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            print(f"build.py: error: {path.name}: {last}", file=sys.stderr)
            failed += 1
            continue
        nbformat.write(nb, path)
        print(f"{path.name}: executed, outputs stored")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
