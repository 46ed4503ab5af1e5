"""The shared fixtures of conftest.py do what they say."""

from collections.abc import Callable
from pathlib import Path

import pytest

from dcpinspect import Frame, dissect


def test_frame_factory_builds_from_the_table(frame: Callable[..., Frame]) -> None:
    f = frame("DCP_STREAM_END", extras={"status": 1}, opaque=7)
    assert f.name == "DCP_STREAM_END" and f.opaque == 7
    assert dissect(f).extras["status"] == 1


@pytest.fixture
def golden_dir(tmp_path: Path) -> Path:
    return tmp_path


def test_golden_compares_with_the_file(golden: Callable[[str, str], None], tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("same\n")
    golden("x", "same")
    with pytest.raises(AssertionError):
        golden("x", "different")


def test_shipped_captures_are_found(shipped_captures: list[Path]) -> None:
    assert len(shipped_captures) >= 10 and all(p.suffix == ".pcap" for p in shipped_captures)
