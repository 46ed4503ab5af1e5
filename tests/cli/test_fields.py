"""``dcpinspect fields``: every column of every table, with its type and meaning, and the display filter's functions."""

from __future__ import annotations

import json

import pytest
from clirun import run
from paths import CAPTURES

from dcpinspect.tables.columns import FRAME_COLUMNS
from dcpinspect.tables.fields import FIELD_TABLES, TIMELINE_COLUMNS, fields
from dcpinspect.tables.filter import FILTER_FUNCTIONS
from dcpinspect.tables.timeline import timeline_frames
from dcpinspect.tables.timeline_feed import read_timeline


def test_every_frames_column_is_listed_with_its_type_and_meaning() -> None:
    code, out = run("fields", "--table", "frames")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "== frames table" and len(lines) == 1 + len(FRAME_COLUMNS)
    for (name, kind, meaning), line in zip(FRAME_COLUMNS, lines[1:], strict=True):
        assert line.split()[:2] == [name, kind] and line.endswith(meaning)


def test_json_and_every_table() -> None:
    code, out = run("fields", "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["table"] for r in rows} == set(FIELD_TABLES)
    assert all(set(r) == {"table", "name", "type", "meaning"} and r["meaning"] for r in rows)
    assert [r["name"] for r in rows if r["table"] == "filter"][: len(FILTER_FUNCTIONS)] == [s for s, _ in FILTER_FUNCTIONS]
    code, text = run("fields")
    assert code == 0 and sum(line.startswith("== ") for line in text.splitlines()) == len(FIELD_TABLES)
    assert len(fields()) == len(rows)


def test_an_unknown_table_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("fields", "--table", "nosuch")[0] == 2
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err


def test_the_timeline_declaration_is_what_the_tables_have() -> None:
    """The declared columns of every timeline table, in order, are the columns a build from real captures gives."""
    paths = [str(p) for p in sorted(CAPTURES.glob("live-*.pcap"))] + [str(CAPTURES / "seed-000-rollback-retry.pcap")]
    built = timeline_frames(read_timeline(paths))
    assert list(built) == list(TIMELINE_COLUMNS)
    for table, df in built.items():
        if len(df):  # an empty table has only its key columns
            assert list(df.columns) == [c[0] for c in TIMELINE_COLUMNS[table]], table
    assert sum(1 for df in built.values() if len(df)) >= len(built) - 1  # the captures fill (nearly) every table
