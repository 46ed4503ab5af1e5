"""Hostile capture files: any corruption is a reported problem or error, never a crash.

Both capture paths are checked: the row path (``read_records``, and the frames
table built from the records) and the table path (``read_batches``, the columnar
path, which ``frames``, ``frames_df``, ``analyze`` and the explorer
use); they must agree.  ``test_fuzz_slice`` runs a seeded slice of
benchmarks/fuzz_captures.py (the big run: ``--count 5000``).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pcapfactory import Conn, Msg, write_capture
from scripts import load_script

from dcpinspect import dissect, encode
from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.columnar import read_batches
from dcpinspect.tables.export import frames_table
from dcpinspect.tables.frames_vector import SCHEMA

MUT = {"by_seqno": 1, "rev_seqno": 1}
_CACHE: dict[str, bytes] = {}


def _sample(fmt: str, tmp: Path) -> bytes:
    if fmt not in _CACHE:
        items = b"".join(
            encode("DCP_MUTATION", extras={**MUT, "by_seqno": i + 1}, key=f"k{i}", value=bytes(40 + i), opaque=7) for i in range(12)
        )
        conn = Conn(msgs=[Msg("c2s", encode("DCP_OPEN", key="c", extras={"flags": 1}, opaque=1)), Msg("s2c", items)])
        w = write_capture(tmp / f"s.{fmt}", [conn], fmt=fmt, mss=200, linktype="ether-vlan", ipv6=fmt == "pcapng")
        _CACHE[fmt] = w.path.read_bytes()
    return _CACHE[fmt]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fmt=st.sampled_from(["pcap", "pcapng"]),
    edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=12),
    cut=st.one_of(st.none(), st.floats(0, 1)),
)
def test_corrupted_captures_never_crash(tmp_path: Path, fmt: str, edits: list[tuple[float, int]], cut: float | None) -> None:
    data = bytearray(_sample(fmt, tmp_path))
    for where, value in edits:
        data[int(where * (len(data) - 1))] = value
    if cut is not None:
        del data[int(cut * len(data)) :]
    path = tmp_path / f"bad.{fmt}"
    path.write_bytes(bytes(data))
    stats = CaptureStats()
    records = list(read_records([str(path)], stats=stats))
    info = stats.files[str(path)]
    assert info["error"] is None or "byte offset" in info["error"]
    by_rows = frames_table(records)  # the row path's table
    st2 = CaptureStats()
    by_cols = pa.Table.from_batches(list(read_batches([str(path)], stats=st2, rows=5)), schema=SCHEMA)  # the table path
    assert by_rows.equals(by_cols) and stats.files == st2.files
    for r in records:
        if r.event.type == "frame":
            dissect(r.event, r.context)  # type: ignore[arg-type]
    # every byte of each direction is accounted for: events tile it (gaps included)
    ends: dict[tuple[int, str], int] = {}
    for r in records:
        key = (r.conn, r.direction)
        assert r.event.offset == ends.get(key, r.event.offset)
        ends[key] = r.event.offset + r.event.length


def _fuzz_module() -> ModuleType:
    return load_script("benchmarks/fuzz_captures.py")


@pytest.mark.parametrize("seed", [101, 202, 303, 404, 505, 606])
def test_fuzz_slice(tmp_path: Path, seed: int) -> None:
    """50 mutated captures per seed (300 in all), each followed by an intact one, through both paths: no failure."""
    fuzz = _fuzz_module()
    tallies, disagree = fuzz.run(50, seed, tmp_path)
    for name, t in tallies.items():
        assert t.files == 50
        assert t.failures == 0, f"{name} path: " + "\n".join(t.first)
    assert disagree == 0
    assert tallies["row"].problems > 0 and tallies["row"].rows > 0  # the damage was seen, the frames read
