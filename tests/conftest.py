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


# ---------------------------------------------------------------------------
# shared fixtures

import pytest  # noqa: E402
from paths import CAPTURES, GOLDEN  # noqa: E402

UPDATE_GOLDENS = os.environ.get("DCPINSPECT_UPDATE_GOLDENS") == "1"


@pytest.fixture
def golden_dir() -> Path:
    """Where the goldens live."""
    return GOLDEN


@pytest.fixture
def golden(golden_dir: Path) -> object:
    """``golden(name, text)``: compare with tests/golden/NAME.txt (DCPINSPECT_UPDATE_GOLDENS=1 rewrites after review)."""

    def check(name: str, text: str) -> None:
        path = golden_dir / f"{name}.txt"
        if UPDATE_GOLDENS or not path.exists():
            path.write_text(text + "\n")
            if not UPDATE_GOLDENS:
                pytest.fail(f"golden {path.name} was missing and has been written: review and commit it")
        assert text + "\n" == path.read_text(), f"{path.name} differs (DCPINSPECT_UPDATE_GOLDENS=1 to rewrite after review)"

    return check


@pytest.fixture
def frame() -> object:
    """A frame factory built on the table: ``frame("DCP_MUTATION", key="k", ...)`` is the decoded Frame of ``encode(...)``."""
    from dcpinspect import Frame, decode, encode

    def make(command: str, **fields: object) -> Frame:
        (event,) = decode(encode(command, **fields))  # type: ignore[arg-type]
        assert isinstance(event, Frame)
        return event

    return make


@pytest.fixture(scope="session")
def shipped_captures() -> list[Path]:
    """The captures shipped in captures/ (pcap files)."""
    return sorted(CAPTURES.glob("*.pcap"))


@pytest.fixture
def sim_node() -> object:
    """``async with sim_node(cluster) as node``: a loopback data node serving ``cluster`` on 127.0.0.1 (tests/simnode.py).

    Event-driven: its producer runs when the client's bytes arrive (or on ``node.kick()``), never on a timer.
    """
    from simnode import SimNode

    return SimNode
