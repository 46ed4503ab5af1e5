"""The notebooks ship executed, run top to bottom on a fresh kernel, and their exercises' answers hold."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
from nbclient import NotebookClient
from paths import ROOT
from scripts import load_script

HERE = ROOT / "notebooks"
NOTEBOOKS = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
MIN_EXERCISES = 3
REPORT = "import json as _j\nfrom dcpinspect.views.exercises import report as _r\nprint(_j.dumps(_r(), default=str))"


def _build_module() -> ModuleType:
    return load_script("notebooks/build.py")


def _code(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 7


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_ships_executed_with_its_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    counts = [c.get("execution_count") for c in _code(nb)]
    assert counts == list(range(1, len(counts) + 1)), "run python notebooks/build.py: the stored notebook was not executed top to bottom"
    assert any(c.outputs for c in _code(nb))
    for cell in _code(nb):
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source[:80]
        assert "Traceback" not in json.dumps(cell.outputs)
        if cell.source.lstrip().startswith("quiz.answer("):
            assert cell.metadata.get("jupyter", {}).get("source_hidden") is True
            assert "answer" in cell.metadata.get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_cites_no_private_notes(path: Path) -> None:
    text = path.read_text()
    for private in ("FACTS", "../shared", "/work/"):
        assert private not in text, private


@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_its_answers_hold(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    html = "".join(o.get("data", {}).get("text/html", "") for c in _code(nb) for o in c.outputs)
    assert "<script>alert" not in html
    rows = json.loads("".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream"))
    assert len(rows) >= MIN_EXERCISES, f"{len(rows)} exercises"
    assert all(r["answered"] and r["checked"] and r["held"] for r in rows), rows


def test_build_hides_and_tags_answer_cells() -> None:
    build = _build_module()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("quiz.answer(1, 2)"), nbformat.v4.new_code_cell("quiz.check(1, 2)")])
    build.mark_answers(nb)
    assert nb.cells[0].metadata["jupyter"]["source_hidden"] is True and nb.cells[0].metadata["tags"] == ["answer"]
    assert "tags" not in nb.cells[1].metadata
    assert build.notebooks(["03"]) == [p for p in NOTEBOOKS if p.name.startswith("03")]
