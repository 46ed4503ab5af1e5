"""The base install works without the extras; a command that needs a missing extra says so in one line.

Each check runs ``dcpinspect`` in a fresh interpreter whose first meta-path
finder hides the extras' packages (pyspark and its py4j, scapy, Jupyter), as
if ``pip install dcpinspect`` had been run without ``[spark]``, ``[live]`` or
``[notebook]``.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from paths import CAPTURES, ROOT

HIDDEN = ("pyspark", "py4j", "scapy", "jupyterlab", "jupyter_server", "voila", "ipykernel", "nbclient", "nbformat")

PRELUDE = f"""
import importlib.abc, sys
HIDDEN = {HIDDEN!r}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""

CAPTURE = str(CAPTURES / "live-plain.pcap")
SEED_HEX = "81 53 00 00 00 00 00 23 00 00 00 08 00 00 10 00" + " 00" * 16


def run_hidden(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PRELUDE + code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def cli_hidden(*args: str) -> subprocess.CompletedProcess[str]:
    return run_hidden(f"from dcpinspect.cli.main import main\nraise SystemExit(main({list(args)!r}))\n")


def test_the_finder_really_hides() -> None:
    proc = run_hidden("import pyspark")
    assert proc.returncode != 0
    assert "No module named 'pyspark'" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("decode", SEED_HEX),
        ("frames", CAPTURE),
        ("frames", CAPTURE, "--json"),
        ("summary", CAPTURE),
        ("timeline", CAPTURE),
        ("show", CAPTURE, "--frame", "1"),
    ],
    ids=lambda a: a[0] if isinstance(a, tuple) else str(a),
)
def test_base_commands_run_without_the_extras(args: tuple[str, ...]) -> None:
    proc = cli_hidden(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout
    assert "Traceback" not in proc.stderr


def test_base_library_imports_and_plots_without_the_extras(tmp_path: object) -> None:
    code = f"""
import dcpinspect, dcpinspect.spark, dcpinspect.live, dcpinspect.capture, dcpinspect.tables.export, dcpinspect.views
from dcpinspect.tables.export import frames_df
from dcpinspect.views.plots import plot_seqnos
from dcpinspect.timeline import build_timeline
from dcpinspect.capture.read import read_records
t = build_timeline(read_records([{CAPTURE!r}]))
df = frames_df([{CAPTURE!r}])
fig = plot_seqnos(t)
print(len(df), type(fig).__name__, sorted(m for m in sys.modules if m.split('.')[0] in HIDDEN))
"""
    proc = run_hidden(code)
    assert proc.returncode == 0, proc.stderr
    n, fig, loaded = proc.stdout.split(" ", 2)
    assert int(n) > 0
    assert fig == "Figure"
    assert loaded.strip() == "[]"


def test_analyze_without_spark_says_which_extra_in_one_line(tmp_path: object) -> None:
    proc = cli_hidden("analyze", CAPTURE, "--out", "unused-out")
    assert proc.returncode == 2
    assert proc.stderr == "dcpinspect: error: 'analyze' needs Spark: pip install 'dcpinspect[spark]'\n"
    assert not (ROOT / "unused-out").exists()


def test_analyze_help_works_without_spark() -> None:
    proc = cli_hidden("analyze", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--master" in proc.stdout


def test_sniff_without_scapy_says_which_extra_in_one_line() -> None:
    proc = cli_hidden("sniff", "--iface", "lo", "--count", "1")
    assert proc.returncode == 2
    assert proc.stderr == "dcpinspect: error: 'sniff' needs scapy: pip install 'dcpinspect[live]'\n"


def test_the_extras_are_declared_as_the_readme_says() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    extras = project["optional-dependencies"]
    for heavy in ("pyspark", "scapy", "jupyterlab", "voila"):
        assert heavy not in base
    assert any(r.startswith("pyspark[connect]") for r in extras["spark"])
    assert any(r.startswith("scapy") for r in extras["live"])
    assert {r.split(">")[0] for r in extras["notebook"]} >= {"jupyterlab", "voila", "ipykernel"}
    assert "dcpinspect[spark,live,notebook]" in extras["dev"]
    readme = (ROOT / "README.md").read_text()
    first, second = [line for line in readme.splitlines() if line.startswith("python -m pip install -e")][:2]
    assert '".[spark]"' in first
    assert "dcpinspect analyze" in first
    assert '".[dev]"' in second
    assert "pytest" in second
    ci = (ROOT / ".ci" / "run").read_text()
    assert second.split("&&")[0].split("pip install")[1].strip() in ci
