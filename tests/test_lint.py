"""ruff is part of the test suite: lint and format are checked on every run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lint
ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["dcpinspect", "tests", "benchmarks", "captures"]


@pytest.mark.skipif(
    shutil.which("ruff") is None
    and subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, check=False).returncode,
    reason="ruff not installed",
)
@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", *args, *TARGETS], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True, check=False).returncode != 0,
    reason="mypy not installed",
)
def test_mypy() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
