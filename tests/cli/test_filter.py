"""The display filter: its language, its errors, the two evaluators proven equal, and ``frames | show | timeline --filter``."""

from __future__ import annotations

import string
from typing import Any

import pyarrow as pa
import pytest
from clirun import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import CAPTURES

from dcpinspect.tables.columns import FRAME_COLUMNS
from dcpinspect.tables.export import frames_table
from dcpinspect.tables.filter import FilterError, compile_filter

MESSY = CAPTURES / "messy.pcap"
RETRY = CAPTURES / "seed-000-rollback-retry.pcap"


def rows_of(text: str, table: pa.Table) -> list[int]:
    """The frame numbers ``text`` selects, checked to be the same by both evaluators."""
    f = compile_filter(text)
    mask = f.mask(table).to_pylist()
    assert mask == [f.matches_row(r) for r in table.to_pylist()], text
    return [n for n, hit in zip(table.column("frame").to_pylist(), mask, strict=True) if hit]


@pytest.fixture(scope="module")
def messy() -> pa.Table:
    return frames_table(MESSY)


def test_lists_and_nulls(messy: pa.Table) -> None:
    """The issue's cases: ``problems`` is a list, ``key`` has nulls, a comparison with a null is false."""
    rows = messy.to_pylist()
    with_problems = [r["frame"] for r in rows if r["problems"]]
    assert with_problems and rows_of("has_problem", messy) == with_problems == rows_of("problems", messy)
    assert rows_of("not has_problem", messy) == [r["frame"] for r in rows if not r["problems"]]
    assert rows_of("has_problem('PLAUSIBLE')", messy) == [r["frame"] for r in rows if any("plausible" in p for p in r["problems"])]
    assert rows_of("problems.contains('plausible')", messy) == rows_of("has_problem('plausible')", messy)
    keyed = [r["frame"] for r in rows if r["key"] is not None and "k1" in r["key"]]
    assert keyed and rows_of("key.contains('k1')", messy) == keyed
    assert rows_of("key.matches('^k[0-9]$')", messy) == [r["frame"] for r in rows if r["key"] and len(r["key"]) == 2]
    assert rows_of("key is None", messy) == [r["frame"] for r in rows if r["key"] is None]
    # vbucket is null on responses and non-frames: neither == nor != holds there, 'not' negates
    vb = [r["frame"] for r in rows if r["vbucket"] is not None]
    assert sorted(rows_of("vbucket == 1", messy) + rows_of("vbucket != 1", messy)) == vb
    assert rows_of("not vbucket == 1", messy) == [r["frame"] for r in rows if r["vbucket"] != 1]
    assert rows_of("vbucket not in [1]", messy) == [r["frame"] for r in rows if r["vbucket"] is not None and r["vbucket"] != 1]


def test_comparisons_and_combinations(messy: pa.Table) -> None:
    rows = messy.to_pylist()
    mut = [r["frame"] for r in rows if r["name"] == "DCP_MUTATION" and r["vbucket"] == 1]
    assert mut and rows_of("name == 'DCP_MUTATION' and vbucket == 1", messy) == mut
    assert rows_of("3 < seqno <= 10", messy) == [r["frame"] for r in rows if r["seqno"] is not None and 3 < r["seqno"] <= 10]
    assert rows_of("seqno > 5 or (type in ['gap', 'garbage'] and not conn_id == 2)", messy) == [
        r["frame"] for r in rows if (r["seqno"] is not None and r["seqno"] > 5) or (r["type"] in ("gap", "garbage") and r["conn_id"] != 2)
    ]
    assert rows_of("opcode == 0x57", messy) == [r["frame"] for r in rows if r["opcode"] == 0x57]
    # constants out of a column's range: the answer every value gives
    assert rows_of("vbucket > -1", messy) == vb_rows(rows) == rows_of("vbucket < 70000", messy)
    assert rows_of("seqno == 18446744073709551616", messy) == []
    assert rows_of("ts >= '2000-01-01'", messy) == [r["frame"] for r in rows if r["ts"] is not None]
    assert rows_of("ts > 4102444800", messy) == []  # 2100 in epoch seconds


def vb_rows(rows: list[dict[str, Any]]) -> list[int]:
    return [r["frame"] for r in rows if r["vbucket"] is not None]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("vbukcet == 3", "unknown field 'vbukcet' (did you mean 'vbucket'?)"),
        ("problems != ''", "problems is a list: use has_problem"),
        ("key == None", "write 'key is None'"),
        ("vbucket == 'x'", "vbucket is a number (uint16)"),
        ("name == 3", "name is text"),
        ("seqno + 1 > 2", "operator '+' is not supported"),
        ("vbucket == 1 & seqno == 2", "operator '&' is not supported in a filter (write 'and', 'or', 'not')"),
        ("key.contain('x')", "unknown function 'contain' (did you mean 'contains'?)"),
        ("hasproblem", "unknown field 'hasproblem' (did you mean 'has_problem'?)"),
        ("key.matches('(')", "bad regular expression '('"),
        ("vbucket.contains('1')", "vbucket is not text (uint16)"),
        ("__import__('os').system('true')", "unknown function 'system'"),
        ("__import__('os')", "unknown function '__import__'"),
        ("key.__class__", "not a condition"),
        ("name ==", "syntax error"),
        ("", "empty filter"),
        ("ts > 'yesterday'", "'yesterday' is not an ISO time"),
        ("vbucket in 3", "'in' takes a list of constants"),
        ("seqno > 1.5", "1.5 is not one"),
        ("name = 'x'", "(compare with '==', not '=')"),
        ("not " * 5000 + "key", "nested too deeply"),
    ],
)
def test_errors_name_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(FilterError) as err:
        compile_filter(text)
    message = str(err.value)
    assert says in message and "\n" not in message


def test_fields_come_from_the_table_definition() -> None:
    """Every column of the frames table is a field (none hard-coded); other tables give their own columns."""
    for name, _type, _ in FRAME_COLUMNS:
        assert name in compile_filter(f"{name} is not None" if _type != "list<string>" else name).fields
    f = compile_filter("outcome == 'rollback' and start > 5", {"outcome": "string", "start": "uint64"})
    assert f.matches_row({"outcome": "rollback", "start": 6}) and not f.matches_row({"outcome": "rollback", "start": None})
    with pytest.raises(FilterError, match="has_problem needs"):
        compile_filter("has_problem", {"outcome": "string"})


# --- the two evaluators agree: a differential test over random tables and random filters --------------------------

COLUMNS = {
    "frame": "int64",
    "vbucket": "uint16",
    "seqno": "uint64",
    "name": "string",
    "key": "string",
    "problems": "list<string>",
    "ts": "timestamp[ns]",
}
_words = st.text("abcAB:-_.é\n", max_size=4)
_maybe = st.one_of(st.none(), _words)
_rows = st.lists(
    st.fixed_dictionaries(
        {
            "vbucket": st.one_of(st.none(), st.integers(0, 0xFFFF)),
            "seqno": st.one_of(st.none(), st.integers(0, 2**64 - 1), st.integers(0, 20)),
            "name": st.one_of(st.none(), st.sampled_from(["DCP_MUTATION", "DCP_DELETION", "GET", "a"])),
            "key": _maybe,
            "problems": st.lists(_words, max_size=3),
            "ts": st.one_of(st.none(), st.integers(0, 2**62)),
        }
    ),
    max_size=30,
)
_ints = st.one_of(st.integers(-3, 25), st.sampled_from([0xFFFF, 0x10000, 2**64 - 1, 2**64, -(2**63)]))
_ops = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])
_regex = st.sampled_from(["^a", "b$", "a|B", "[:-]", "^$", ".", "é", r"\n", "(?i)AB"])


@st.composite
def _atom(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 9))
    col = draw(st.sampled_from(["vbucket", "seqno"]))
    text = draw(st.sampled_from(["name", "key"]))
    lit = repr(draw(_words))
    if kind == 0:
        return f"{col} {draw(_ops)} {draw(_ints)}"
    if kind == 1:
        return f"{draw(_ints)} {draw(_ops)} {col}"
    if kind == 2:
        return f"{text} {draw(_ops)} {draw(st.one_of(_words, st.sampled_from(['DCP_MUTATION', 'GET'])))!r}"
    if kind == 3:
        return f"{col} {draw(st.sampled_from(['in', 'not in']))} {draw(st.lists(_ints, max_size=3))}"
    if kind == 4:
        method = draw(st.sampled_from(["contains", "startswith", "endswith"]))
        return f"{draw(st.sampled_from(['key', 'name', 'problems']))}.{method}({lit})"
    if kind == 5:
        return f"{draw(st.sampled_from(['key', 'problems']))}.matches({draw(_regex)!r})"
    if kind == 6:
        return draw(st.sampled_from(["has_problem", f"has_problem({lit})", "problems", "key", "seqno"]))
    if kind == 7:
        return f"{draw(st.sampled_from(['key', 'vbucket', 'ts']))} {draw(st.sampled_from(['is', 'is not']))} None"
    if kind == 8:
        return f"ts {draw(_ops)} {draw(st.integers(0, 2**32))}"
    return f"{text} {draw(st.sampled_from(['in', 'not in']))} {[draw(_words) for _ in range(draw(st.integers(0, 2)))]}"


_filters = st.recursive(
    _atom(),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from([" and ", " or "]), inner).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
        inner.map(lambda t: f"not ({t})"),
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_rows, text=_filters)
def test_mask_equals_matches_row(rows: list[dict[str, Any]], text: str) -> None:
    """``FrameFilter.mask`` (Arrow compute) and ``FrameFilter.matches_row`` (Python) give the same answer on every row."""
    for i, r in enumerate(rows):
        r["frame"] = i + 1
    schema = pa.schema([(n, pa.list_(pa.string()) if t == "list<string>" else pa.type_for_alias(t)) for n, t in COLUMNS.items()])
    table = pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()
    f = compile_filter(text, COLUMNS)
    mask = f.mask(table)
    assert mask.type == pa.bool_() and mask.null_count == 0 and len(mask) == len(rows)
    assert mask.to_pylist() == [f.matches_row(r) for r in rows]
    assert f.filter(table.to_batches()[0] if rows else table).num_rows == sum(mask.to_pylist())


def test_nothing_is_evaluated() -> None:
    """The language is parsed, never run: names that would reach Python's builtins are unknown fields."""
    for text in ("open('x')", "eval('1')", "(lambda: 1)()", "[x for x in key]", "key[0] == 'a'", "f'{key}' == 'a'"):
        with pytest.raises(FilterError):
            compile_filter(text)
    assert set(string.ascii_lowercase) & set(compile_filter("name == 'a'").fields) == set()


# --- the commands ---------------------------------------------------------------------------------------------------


def test_frames_filter(messy: pa.Table) -> None:
    code, out = run("frames", "--no-progress", "--filter", "has_problem", str(MESSY))
    assert code == 0
    assert [int(line.split()[0]) for line in out.splitlines()] == rows_of("has_problem", messy)
    code, out = run("frames", "--no-progress", "-Y", "name == 'DCP_MUTATION' and key.contains('k1')", "--json", str(MESSY))
    assert code == 0 and len(out.splitlines()) == len(rows_of("name == 'DCP_MUTATION' and key.contains('k1')", messy)) > 0


def test_a_bad_filter_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("frames", "show", "timeline"):
        code, out = run(command, "--no-progress", "--filter", "vbukcet == 3", str(MESSY))
        err = capsys.readouterr().err
        assert code == 2 and out == ""
        assert (
            err
            == "dcpinspect: error: bad --filter 'vbukcet == 3': unknown field 'vbukcet' (did you mean 'vbucket'?); 'dcpinspect fields' lists them\n"
        )


def test_show_filter() -> None:
    code, out = run("show", "--no-progress", "--filter", "status == 0x23", str(RETRY))
    assert code == 0
    heads = [line for line in out.splitlines() if line.startswith("== frame")]
    assert len(heads) == 1 and heads[0].startswith("== frame 2 ") and "Status       (6,7)  : 0x0023 (Rollback)" in out
    code, out = run("show", "--no-progress", "--filter", "role == 'response'", "--frame", "2", str(RETRY))
    assert code == 0 and [line.split()[2] for line in out.splitlines() if line.startswith("== frame")] == ["2"]


def test_timeline_filter_selects_streams_built_from_every_frame() -> None:
    """The filter picks the streams with a matching frame; the stream is told whole, from every frame."""
    paths = [str(RETRY), str(CAPTURES / "live-plain.pcap")]
    code, everything = run("timeline", "--no-progress", *paths)
    assert code == 0
    code, out = run("timeline", "--no-progress", "--filter", "name == 'DCP_STREAM_REQ' and status == 0x23", *paths)
    assert code == 0
    streams = [line for line in out.splitlines() if line.startswith("stream ")]
    assert streams == ["stream conn 1 vbucket 0"]
    assert "-> ROLLBACK to 0 (frame 2)" in out and "-> success (frame 4)" in out  # the retry, which does not match, too
    assert len(everything.splitlines()) > len(out.splitlines())
    code, out = run("timeline", "--no-progress", "--json", "--filter", "seqno > 10**30 or vbucket == 9999", *paths)
    assert code == 2  # ** is no operator of the language
    code, out = run("timeline", "--no-progress", "--json", "--filter", "vbucket == 9999", *paths)
    assert code == 0 and out == ""
