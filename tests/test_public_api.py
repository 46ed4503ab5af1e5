"""The public surface: ``dcpinspect.__all__`` as it was, and the lazy notebook names resolve without loading anything early."""

import subprocess
import sys

import pytest

import dcpinspect

ALL = [
    "DEFAULT_MAX_BODY",
    "DissectContext",
    "Dissection",
    "EncodeError",
    "Event",
    "FieldValue",
    "Frame",
    "FrameDecoder",
    "Gap",
    "Garbage",
    "Problem",
    "Truncated",
    "annotate",
    "annotate_html",
    "breakdown",
    "byte_table",
    "decode",
    "dissect",
    "encode",
    "iter_decode",
    "summary",
]


def test_all_is_unchanged() -> None:
    assert dcpinspect.__all__ == ALL
    assert all(hasattr(dcpinspect, n) for n in ALL)


@pytest.mark.parametrize("name", sorted(dcpinspect._LAZY))
def test_lazy_name_resolves_in_a_fresh_interpreter(name: str) -> None:
    code = f"import dcpinspect, sys\nobj = dcpinspect.{name}\nfrom dcpinspect import {name} as again\nassert obj is again\nprint(type(obj).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out


def test_import_dcpinspect_loads_nothing_heavy() -> None:
    code = "import dcpinspect, sys\nprint(sorted(m for m in ('numpy', 'pandas', 'pyarrow', 'matplotlib', 'pyspark', 'scapy', 'asyncio') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = dcpinspect.no_such_name
