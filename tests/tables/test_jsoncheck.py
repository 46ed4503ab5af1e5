"""The bulk JSON check never calls a document clean that ``dissect`` finds invalid, and calls most valid objects clean.

``valid`` is the dissector's own judgement (``json.loads`` on the bytes; ``ValueError`` or
``RecursionError`` mean invalid).  Documents are checked in batches bigger than
``LOADS_MAX`` (so Arrow reads them) and alone (so ``json.loads`` does), at odd
offsets of a buffer with non-JSON bytes around them, as in a frame.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpinspect.protocol.enums import Datatype, Magic, Opcode
from dcpinspect.tables import jsoncheck
from dcpinspect.tables.jsoncheck import LOADS_MAX, json_suspects, loads_ok, max_depth
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.events import Frame

FILLER = [b'{"type":"airline","id":%d,"name":"airline_%d"}' % (i, i) for i in range(LOADS_MAX + 1)]
WS = b" \t\n\r"


def valid(doc: bytes) -> bool:
    """What the dissector decides (``wire.values``): ``json.loads`` on the bytes."""
    try:
        json.loads(doc)
    except (ValueError, RecursionError):
        return False
    return True


def dissect_finds_valid(doc: bytes) -> bool:
    """The dissector itself, on a SET request whose value is ``doc``, flagged JSON."""
    ext, key = struct.pack(">II", 0, 0), b"k"
    header = struct.pack(
        ">BBHBBHIIQ", Magic.CLIENT_REQUEST, Opcode.SET, len(key), len(ext), Datatype.JSON, 0, len(ext) + len(key) + len(doc), 0, 0
    )
    problems = dissect(Frame(0, header + ext + key + doc)).problems
    return not any("not valid JSON" in p.message for p in problems)


def layout(docs: list[bytes], gap: bytes = b"\x80\x00}\n") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``docs`` in one buffer, ``gap`` around each (bytes that would spoil a careless gather)."""
    starts, pos, parts = [], len(gap), [gap]
    for d in docs:
        starts.append(pos)
        parts += [d, gap]
        pos += len(d) + len(gap)
    return np.frombuffer(b"".join(parts), np.uint8), np.array(starts, np.int64), np.array([len(d) for d in docs], np.int64)


def suspects(docs: list[bytes]) -> list[bool]:
    """The check's verdict on ``docs``, read in one batch (through Arrow when there are more than LOADS_MAX)."""
    return json_suspects(*layout(docs)).tolist()


def assert_never_clean_when_invalid(docs: list[bytes]) -> list[bool]:
    got = suspects(docs)
    for d, s in zip(docs, got, strict=True):
        assert s or valid(d), f"called clean but json.loads rejects it: {d[:120]!r}"
    return got


# ---------------------------------------------------------------------------
# strategies: JSON values, their dumps, and byte mutations of them

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
VALUES = st.recursive(
    SCALARS, lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids, max_size=5), max_leaves=25
)
OBJECTS = st.dictionaries(st.text(max_size=8), VALUES, max_size=8)
SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", "\t:\r\n"), (",\r\n  ", " : ")])
MUTATION_BYTES = st.sampled_from(list(b'{}[],:"\\ 0123456789eE.+-tfnulINaf\t\n\r\x00\x01\x7f\x80\xbf\xc0\xed\xef\xf4\xff'))


@st.composite
def dumps(draw: st.DrawFn, values: st.SearchStrategy[object] = VALUES) -> bytes:
    """A value as JSON text: any separators, indent, escapes, whitespace around, UTF-8 (lone surrogates passed through)."""
    v = draw(values)
    text = json.dumps(
        v, ensure_ascii=draw(st.booleans()), separators=draw(SEPARATORS), indent=draw(st.sampled_from([None, None, 0, 2, "\t"]))
    )
    around = st.text(alphabet=" \t\n\r", max_size=3)
    return (draw(around) + text + draw(around)).encode("utf-8", "surrogatepass")


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A dump with a few byte edits: replace, insert, delete, duplicate a slice, truncate, or append another dump."""
    b = bytearray(draw(dumps()))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["replace", "insert", "delete", "dup", "cut", "concat"]))
        i = draw(st.integers(0, len(b)))
        if op == "replace" and i < len(b):
            b[i] = draw(MUTATION_BYTES)
        elif op == "insert":
            b[i:i] = bytes([draw(MUTATION_BYTES)])
        elif op == "delete":
            del b[i : i + 1]
        elif op == "dup":
            j = draw(st.integers(i, len(b)))
            b[j:j] = b[i:j]
        elif op == "cut":
            del b[i:]
        elif op == "concat":
            b += draw(st.sampled_from([b"", b" ", b"\n"])) + draw(dumps())
    return bytes(b) or b"{"


DOCS = st.one_of(dumps(), dumps(OBJECTS), mutated(), mutated())


# ---------------------------------------------------------------------------
# the contract, on arbitrary documents


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(DOCS, min_size=1, max_size=40))
def test_a_document_called_clean_is_valid(docs: list[bytes]) -> None:
    assert_never_clean_when_invalid(docs + FILLER)  # through Arrow
    for d in docs[:3]:
        assert_never_clean_when_invalid([d])  # alone: json.loads


def triggers_a_scan(doc: bytes) -> bool:
    """Whether a rule-3 scan may mark ``doc`` (the only reasons a valid object may be called suspect)."""
    if re.search(rb"Inf(?!inity)|-NaN|[0-9]{%d}" % jsoncheck._DIGIT_BLOCK, doc):
        return True
    if doc.count(b"{") + doc.count(b"[") > max_depth():
        return True
    try:
        doc.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(DOCS, min_size=1, max_size=40))
def test_exact_on_objects_no_scan_marks(docs: list[bytes]) -> None:
    """Arrow's stricter verdicts are rescued by json.loads: an object no scan marks is suspect iff it is invalid."""
    got = suspects(docs + FILLER)[: len(docs)]
    for d, s in zip(docs, got, strict=True):
        core = d.strip(WS)
        if core[:1] == b"{" and core[-1:] == b"}" and not triggers_a_scan(d):
            assert s == (not valid(d)), d[:120]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(docs=st.lists(dumps(OBJECTS), min_size=LOADS_MAX + 1, max_size=30))
def test_most_valid_objects_are_clean(docs: list[bytes]) -> None:
    got = suspects(docs)
    assert sum(got) <= len(docs) // 5, [d[:80] for d, s in zip(docs, got, strict=True) if s]
    for d, s in zip(docs, got, strict=True):
        if not triggers_a_scan(d):
            assert not s, d[:120]


PLAIN = st.dictionaries(
    st.text(alphabet="abcdefgh_", min_size=1, max_size=8),
    st.integers(-(10**12), 10**12) | st.text(alphabet="abc xyz-é東", max_size=20) | st.booleans() | st.none(),
    max_size=12,
)


@settings(max_examples=100, deadline=None)
@given(docs=st.lists(PLAIN.map(lambda v: json.dumps(v).encode()), min_size=1, max_size=60))
def test_plain_objects_are_all_clean(docs: list[bytes]) -> None:
    assert not any(suspects(docs + FILLER))


def test_called_clean_means_the_dissector_finds_it_valid() -> None:
    docs = [*EDGE_CASES, *FILLER]
    for d, s in zip(docs, suspects(docs), strict=True):
        assert s or dissect_finds_valid(d), d[:80]


# ---------------------------------------------------------------------------
# edge cases: each is checked in a batch (Arrow) and alone (json.loads); some have a verdict the check must give

DEEP = b'{"a":' + b"[" * 1200 + b"]" * 1200 + b"}"
EDGE_CASES = {
    b'{"a":NaN}': False,
    b'{"a":Infinity,"b":-Infinity}': False,
    b'{"a":Inf}': True,  # RapidJSON accepts these three, Python does not
    b'{"a":-Inf}': True,
    b'{"a":-NaN}': True,
    b'{"a":-0,"b":-0.0,"c":0e0}': False,
    b'{"a":1e400}': False,  # Arrow refuses (too big for a double); json.loads gives inf
    b'{"a":-1e400}': False,
    b'{"a":' + b"9" * 300 + b"}": False,
    b'{"a":' + b"9" * 5000 + b"}": True,  # more digits than Python turns into an int
    b'{"a":1.' + b"9" * 5000 + b"}": None,  # a float: valid, may be marked
    DEEP: True,  # RecursionError in json.loads
    b'{"a":' + b"[" * 100 + b"]" * 100 + b"}": False,
    b'{"a":"\\ud800"}': False,  # lone surrogate escape: Arrow refuses, json.loads accepts
    b'{"a":"\\udc00\\ud800"}': False,
    b'{"a":"\\ud83d\\ude00"}': False,
    b'{"a":"\xed\xa0\x80"}': None,  # an encoded surrogate: json.loads decodes with surrogatepass
    b'{"a":"\xff"}': True,
    b'{"\xc0\x80":1}': True,
    b'{"a":"\xf4\x90\x80\x80"}': True,
    b'{"a":"\xe2\x82"}': True,
    b'\xef\xbb\xbf{"a":1}': None,  # UTF-8 BOM: json.loads accepts it on bytes
    b'{"a":"\x00"}': True,
    b'{"a":1}\x00': True,
    b'{\x00"\x00a\x00"\x00:\x001\x00}\x00': None,  # NUL makes json.loads read UTF-16: valid, Arrow refuses
    b"{}": False,
    b"{ }": False,
    b"[]": None,
    b"[1,2]": None,
    b"1": None,
    b'"x"': None,
    b"null": None,
    b"{": True,
    b"}": True,
    b'{"a":1}x': True,
    b'{"a":1}}': True,
    b'{"a":1} {"b":2}': True,
    b'{"a":1}\n{"b":2}': True,
    b"{}{}": True,
    b'{"a":\n1}': False,  # a newline as whitespace
    b'{"a":"x\ny"}': True,  # a raw newline in a string
    b'{"a":"x\\ny"}': False,
    b'{"a":"x\\\ny"}': True,  # a backslash before a raw newline
    b' \r\n{"a":1}\t\n': False,
    b'{"a":1,}': True,
    b'{"a":01}': True,
    b"{'a':1}": True,
    b'{"a":1 /* c */}': True,
    b'{"a":"\\x"}': True,
    b'{"a":"\\u12"}': True,
    b'{"a":1,"a":2}': False,  # duplicate keys: both parsers keep going
    b'{"a":"}': True,
    b'{"a":{}': True,
    b'{"a":"\\"}': True,
    b'{"a":"\\\\"}': False,
    b'{"a":\x0b1}': True,
    b'{"a":- 1}': True,
    b'{"a":- NaN}': True,
    b'{"Inf":"Infinity","x":"-NaN"}': None,  # in strings: valid, may be marked
}


@pytest.mark.parametrize("doc", list(EDGE_CASES), ids=lambda d: repr(d[:24]))
def test_edge_case(doc: bytes) -> None:
    want = EDGE_CASES[doc]
    for got in (suspects([doc, *FILLER])[0], suspects([*FILLER, doc, *FILLER])[LOADS_MAX + 1], suspects([doc])[0]):
        assert got or valid(doc)
        if want is not None:
            assert got == want


def test_the_edge_cases_verdicts_match_json_loads() -> None:
    """The table above says 'clean' only of documents json.loads accepts, 'suspect' mostly of ones it rejects."""
    for doc, want in EDGE_CASES.items():
        if want is False:
            assert valid(doc), doc
    # nesting past the recursion limit *now* (other tests, Hypothesis among them, may have raised it)
    deep = b'{"a":' + b"[" * (sys.getrecursionlimit() + 100) + b"]" * (sys.getrecursionlimit() + 100) + b"}"
    assert not valid(b'{"a":' + b"9" * 5000 + b"}") and not valid(deep)
    assert suspects([deep]) == [True]


def test_values_that_are_not_one_object_each_cannot_pass_by_the_row_count() -> None:
    """The old check read ``{"a":`` as clean when another value held two objects (Arrow's row count matched)."""
    docs = [b'{"a":', b'{"b":1}}', b"{}{}", *FILLER]
    assert suspects(docs)[:3] == [True, True, True]
    docs = [b'{"a":"}', b'{"}', b"{} {}", *FILLER]
    assert suspects(docs)[:3] == [True, True, True]


def test_what_arrow_read_before_a_failure_is_read_again() -> None:
    """A value holding two objects shifts Arrow's row number: the values before the named row are not trusted."""
    for lead in ([b"{}{}"], [b"{} {}", b'{"a":1}', b"{}\n{}"]):
        docs = [*lead, *FILLER, *FILLER, b'{"a":x}', *FILLER]
        want = [not valid(d) for d in docs]
        assert suspects(docs) == want
        assert want[0] and want[-len(FILLER) - 1]  # the data: two objects in one value, and a broken one


@contextmanager
def int_digits(limit: int) -> Iterator[None]:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(old)


def test_long_integers_are_marked_wherever_they_sit() -> None:
    """At Python's strictest limit (640 digits) every longer int is marked, at every alignment."""
    with int_digits(sys.int_info.str_digits_check_threshold):
        docs = [b'{"k":"' + b"x" * pad + b'","a":' + b"7" * jsoncheck.DIGIT_RUN + b"}" for pad in range(jsoncheck._DIGIT_BLOCK + 2)]
        assert not any(map(valid, docs))
        assert all(suspects(docs))
        short = b'{"a":' + b"7" * (jsoncheck.DIGIT_RUN - 1) + b"}"
        assert valid(short)
        assert suspects([short, *FILLER])[0] in (False, True)  # a long run may be marked; the contract holds either way


def test_every_utf8_lead_and_continuation_boundary() -> None:
    """Strings holding each lead byte with continuation bytes at the range edges: clean only if json.loads agrees."""
    edges = [0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0]
    docs = [
        b'{"a":"' + bytes([lead, c1, c2, c3]) + b'"}'
        for lead in range(0x80, 0x100)
        for c1 in edges
        for c2 in edges
        for c3 in (0x80, 0xBF, 0x41)
    ]
    got = assert_never_clean_when_invalid(docs)
    assert not all(got)  # the valid ones get through


def test_every_control_byte_in_every_place() -> None:
    """The old check scanned for control bytes; both parsers reject them the same way, so no scan is needed."""
    places = [b'{"a":"x%sy"}', b'{"a":%s1}', b'{%s"a":1}', b'{"a":1%s}', b'{"a"%s:1}', b'{"a":[1,%s2]}', b'{"a":1}%s', b'%s{"a":1}']
    docs = [p % bytes([c]) for p in places for c in [*range(0x20), 0x7F]]
    got = assert_never_clean_when_invalid([*docs, *FILLER])
    for d, s in zip(docs, got, strict=False):
        assert s == (not valid(d)) or not d.strip(WS).startswith(b"{"), d


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=12), min_size=1, max_size=30))
def test_any_bytes_in_a_string(chunks: list[bytes]) -> None:
    """Arbitrary bytes (quotes, backslashes and control bytes excepted) inside a string: UTF-8 or not, exactly."""
    docs = [b'{"a":"' + bytes(b if b >= 0x20 and b not in b'"\\' else 0x41 for b in c) + b'"}' for c in chunks]
    got = assert_never_clean_when_invalid(docs + FILLER)
    for d, s in zip(docs, got, strict=False):
        assert s == (not valid(d)) or triggers_a_scan(d)


# ---------------------------------------------------------------------------
# the machinery: gather, batches, the read-again path


def test_values_anywhere_in_the_buffer() -> None:
    """Unordered, overlapping, short (inline in a binary view), at the very start and end of the buffer."""
    blob = b'{"a":1}{"bb":[1,2,{"c":null}]}{"x":Inf}{}' + b"\xff" * 3 + b'{"a":"' + b"z" * 40 + b'"}'
    buf = np.frombuffer(blob, np.uint8)
    spans = [(0, 7), (7, 23), (30, 10), (40, 2), (45, 48), (7, 23), (0, 7), (1, 6), (0, 30), (30, 12), (45, 48), (40, 2)]
    starts = np.array([s for s, _ in spans], np.int64)
    lens = np.array([n for _, n in spans], np.int64)
    got = json_suspects(buf, starts, lens).tolist()
    want = [not valid(blob[s : s + n]) for s, n in spans]
    assert got == want


def test_out_of_range_or_empty_values_are_suspect() -> None:
    buf = np.frombuffer(b'{"a":1}' * 4, np.uint8)
    starts = np.array([0, 7, 14, 21, 25, -3, 0, 0, 0, 0], np.int64)
    lens = np.array([7, 7, 7, 7, 7, 7, 0, 7, 7, 7], np.int64)
    assert json_suspects(buf, starts, lens).tolist() == [False, False, False, False, True, True, True, False, False, False]
    assert json_suspects(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(DOCS, min_size=LOADS_MAX + 1, max_size=40), batch=st.integers(1, 400), region=st.sampled_from([64, 256, 1 << 30]))
def test_batches_and_buffer_windows_do_not_change_the_verdict(docs: list[bytes], batch: int, region: int) -> None:
    """Small batches, and binary views seen through small windows of the buffer (as a 2 GiB buffer would be)."""
    want = suspects(docs)
    saved = jsoncheck.BATCH_BYTES, jsoncheck._REGION
    jsoncheck.BATCH_BYTES, jsoncheck._REGION = batch, region
    try:
        got = suspects(docs)
    finally:
        jsoncheck.BATCH_BYTES, jsoncheck._REGION = saved
    for d, s, w in zip(docs, got, want, strict=True):
        assert s or valid(d)
        if len(d) < region:
            assert s == w, d[:80]


def test_without_binary_views_the_python_join_gives_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = [*EDGE_CASES, *FILLER]
    want = suspects(docs)
    monkeypatch.delattr(pa, "binary_view")
    assert suspects(docs) == want


def test_many_invalid_documents_among_valid_ones_are_each_judged() -> None:
    """Every third document broken: Arrow fails again and again; each is settled, the valid ones stay clean."""
    docs = []
    for i in range(600):
        d = b'{"id":%d,"name":"n%d","tags":["a","b"],"n":1.5}' % (i, i)
        docs.append(d.replace(b'"b"]', b'"b"') if i % 3 == 0 else d)
    got = suspects(docs)
    assert got == [not valid(d) for d in docs]


def test_the_reading_budget_ends_in_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = jsoncheck._read

    def counting(*args: object) -> tuple[bool, int | None]:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(jsoncheck, "_read", counting)
    docs = [b'{"a":x}' if i % 2 else b'{"a":1}' for i in range(4000)]
    assert suspects(docs) == [bool(i % 2) for i in range(4000)]
    assert len(calls) < 400  # not one Arrow read per bad document


def test_nesting_limit_follows_the_recursion_limit() -> None:
    old = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(200)
        assert max_depth() == 50
        doc = b'{"a":' + b"[" * 60 + b"]" * 60 + b"}"
        assert suspects([doc, *FILLER])[0] and not loads_ok(doc)
    finally:
        sys.setrecursionlimit(old)
    assert max_depth() == min(256, old // 4)
