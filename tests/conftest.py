"""Shared test set-up: the helpers' directory on the path, a headless matplotlib, and the session header."""

import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("MPLBACKEND", "Agg")

_SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def pytest_report_header(config: object) -> list[str]:
    """What the run can reach beside the project: said once, up front, rather than in dozens of skip lines."""
    lines = []
    if not _SHARED.is_dir():
        lines.append(f"*** {_SHARED} is absent: the tests marked 'shared' (the third-party captures, the seed documents) are SKIPPED ***")
    peers = {
        "tshark": shutil.which("tshark"),
        "memcached": shutil.which("memcached") or ("/usr/bin/memcached" if Path("/usr/bin/memcached").exists() else None),
        "chromium": "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None,
        "java": shutil.which("java"),
    }
    missing = [name for name, where in peers.items() if not where]
    if missing:
        lines.append(f"*** not installed: {', '.join(missing)} - the tests that need them are skipped (.ci/run installs them) ***")
    lines.append('fast inner loop: python -m pytest -m "not spark and not browser and not notebooks"')
    return lines
