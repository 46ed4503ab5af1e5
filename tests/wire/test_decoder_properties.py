"""Property tests of the sans-IO frame decoder (and that nothing downstream of it raises).

The decoder's module docstring promises: it never raises on input bytes; every
input byte lands in exactly one event, in order; events do not depend on how
the input was chunked; garbage runs are cut at fixed ``garbage_chunk``
boundaries; a gap turns an incomplete frame into ``Truncated`` and decoding
resumes after it.  These tests hold it to that over generated streams of valid
frames (every table variant), alt-magic frames, garbage, truncated and
oversize frames, in both dialects.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from decoding import Program, assert_well_formed, rechunk, run, segments
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from strategies import (
    ALL_VARIANTS,
    any_mcbp_case,
    any_upr_case,
    chunks_of,
    contexts,
    decoder_options,
    fuzz_streams,
    iter_contexts,
    mcbp_case,
    mcbp_pieces,
    mutated_case_frame,
    streams,
    upr_pieces,
    variant_id,
)

from dcpinspect import (
    DissectContext,
    Frame,
    FrameDecoder,
    Gap,
    Garbage,
    Truncated,
    annotate,
    annotate_html,
    breakdown,
    decode,
    dissect,
    iter_decode,
    summary,
)
from dcpinspect.protocol import spec
from dcpinspect.protocol.fields import Command, Variant
from dcpinspect.protocol.flatbuf import build_table

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROPERTY_FEW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: the option sets the brief names, plus everything at once
OPTION_SETS = [
    pytest.param({}, id="defaults"),
    pytest.param({"garbage_chunk": 7}, id="garbage_chunk=7"),
    pytest.param({"aligned": False}, id="unaligned"),
    pytest.param({"max_body": 48}, id="max_body=48"),
    pytest.param({"garbage_chunk": 7, "aligned": False, "max_body": 48}, id="all"),
]


ALIGNED_REPRO = ("mcbp", bytes(30))  # garbage_chunk=7, fed as 28 + 2 bytes
UNALIGNED_REPRO = ("mcbp", b"\x80\xff" + bytes(28))  # same, with aligned=False
cut_lists = st.lists(st.integers(0, 10**6), max_size=16)


@pytest.mark.parametrize("options", OPTION_SETS)
@SETTINGS
@given(stream=streams(), cuts=cut_lists)
@example(stream=ALIGNED_REPRO, cuts=[28])
@example(stream=UNALIGNED_REPRO, cuts=[28])
def test_chunking_invariance(options: dict[str, Any], stream: tuple[str, bytes], cuts: list[int]) -> None:
    dialect, raw = stream
    expected = decode(raw, dialect=dialect, **options)
    assert run(chunks_of(raw, cuts), dialect, **options) == expected


@pytest.mark.parametrize("options", OPTION_SETS)
@FEW
@given(stream=streams())
@example(stream=ALIGNED_REPRO)
@example(stream=UNALIGNED_REPRO)
def test_byte_by_byte(options: dict[str, Any], stream: tuple[str, bytes]) -> None:
    dialect, raw = stream
    expected = decode(raw, dialect=dialect, **options)
    assert run([raw[i : i + 1] for i in range(len(raw))], dialect, **options) == expected


any_stream = streams() | st.tuples(st.sampled_from(("mcbp", "upr")), st.binary(max_size=300))


@SETTINGS
@given(stream=any_stream, options=decoder_options, cuts=st.lists(st.integers(0, 10**6), max_size=24))
@example(stream=ALIGNED_REPRO, options={"garbage_chunk": 7}, cuts=[28])
def test_chunking_invariance_any_options(stream: tuple[str, bytes], options: dict[str, Any], cuts: list[int]) -> None:
    dialect, raw = stream
    expected = decode(raw, dialect=dialect, **options)
    chunks = chunks_of(raw, cuts)
    assert run(chunks, dialect, **options) == expected
    assert list(iter_decode(iter(chunks), dialect=dialect, **options)) == expected


# ---------------------------------------------------------------------------
# 2. byte accounting


@SETTINGS
@given(stream=any_stream, options=decoder_options, cuts=st.lists(st.integers(0, 10**6), max_size=24))
def test_byte_accounting(stream: tuple[str, bytes], options: dict[str, Any], cuts: list[int]) -> None:
    dialect, raw = stream
    assert_well_formed(decode(raw, dialect=dialect, **options), [raw], dialect, **options)
    assert_well_formed(run(chunks_of(raw, cuts), dialect, **options), [raw], dialect, **options)


@FEW
@given(cases=st.lists(any_mcbp_case(), min_size=1, max_size=6))
def test_valid_frames_back_to_back_are_all_found(cases: list[Any]) -> None:
    raws = [c.encode() for c in cases]
    events = decode(b"".join(raws))
    assert [(e.type, e.raw) for e in events] == [("frame", r) for r in raws]


@FEW
@given(cases=st.lists(any_upr_case(), min_size=1, max_size=6))
def test_valid_upr_frames_back_to_back_are_all_found(cases: list[Any]) -> None:
    raws = [c.encode() for c in cases]
    events = decode(b"".join(raws), dialect="upr")
    assert [(e.type, e.raw) for e in events] == [("frame", r) for r in raws]


@FEW
@given(body=st.binary(min_size=49, max_size=120), tail=st.binary(max_size=30))
def test_oversize_body_is_garbage_not_buffered(body: bytes, tail: bytes) -> None:
    raw = spec.HEADER.pack(0x80, 0x57, 0, 0, 0, 0, len(body), 0, 0) + body + tail
    dec = FrameDecoder(max_body=48, garbage_chunk=7)
    events: list[Any] = []
    for i in range(len(raw)):
        events += dec.feed(raw[i : i + 1])
        assert dec.buffered < spec.HEADER_SIZE + 7, "an oversize body is being buffered"
    events += dec.close()
    assert not any(isinstance(e, Frame) and e.offset == 0 for e in events)
    assert isinstance(events[0], Garbage)
    assert "above the maximum 48" in events[0].reason
    assert_well_formed(events, [raw], max_body=48, garbage_chunk=7)


@PROPERTY_FEW
@given(case=any_mcbp_case(), delta=st.integers(-3, 3))
def test_max_body_boundary(case: Any, delta: int) -> None:
    raw = case.encode()
    body = len(raw) - spec.HEADER_SIZE
    max_body = max(0, body + delta)
    events = decode(raw, max_body=max_body)
    if body <= max_body:
        assert [(e.type, e.raw) for e in events] == [("frame", raw)]
    else:
        assert isinstance(events[0], Garbage)
        assert events[0].reason == f"declared body length {body} above the maximum {max_body}"
        assert_well_formed(events, [raw], max_body=max_body)


UNKNOWN_OPCODES = sorted(set(range(256)) - set(spec.COMMANDS))


@PROPERTY_FEW
@given(
    case=any_mcbp_case(),
    opcode=st.none() | st.sampled_from(UNKNOWN_OPCODES),
    datatype=st.none() | st.integers(spec.DATATYPE_MASK + 1, 255).filter(lambda d: d & ~spec.DATATYPE_MASK),
)
def test_resync_needs_known_opcode_and_datatype(case: Any, opcode: int | None, datatype: int | None) -> None:
    raw = bytearray(case.encode())
    if opcode is not None:
        raw[1] = opcode
    if datatype is not None:
        raw[5] = datatype
    raw = bytes(raw)
    # aligned: the first header is taken as it is
    assert [(e.type, e.raw) for e in decode(raw)] == [("frame", raw)]
    # resynchronising (unaligned, or after a gap): only a header with a known opcode and datatype bits
    plausible = opcode is None and datatype is None
    for events, off in ((decode(raw, aligned=False), 0), (run([3, raw]), 3)):
        frames = [e for e in events if isinstance(e, Frame)]
        if plausible:
            assert [(e.offset, e.raw) for e in frames] == [(off, raw)]
        else:
            assert all(e.offset != off for e in frames)
            first = events[1] if off else events[0]
            assert isinstance(first, Garbage)
            assert "while resynchronising" in first.reason


# ---------------------------------------------------------------------------
# 3. gaps


def programs(dialect: str) -> st.SearchStrategy[Program]:
    pieces = mcbp_pieces() if dialect == "mcbp" else upr_pieces()
    return st.lists(st.one_of(pieces, st.integers(0, 300)), max_size=10)


@SETTINGS
@given(dialect=st.sampled_from(("mcbp", "upr")), data=st.data(), options=decoder_options)
def test_gaps_byte_accounting(dialect: str, data: st.DataObject, options: dict[str, Any]) -> None:
    program = data.draw(programs(dialect), label="program")
    assert_well_formed(run(segments(program), dialect, **options), program, dialect, **options)
    cuts = data.draw(cut_lists, label="cuts")
    assert_well_formed(run(rechunk(program, cuts), dialect, **options), program, dialect, **options)


dialect_programs = st.sampled_from(("mcbp", "upr")).flatmap(lambda d: st.tuples(st.just(d), programs(d)))


@SETTINGS
@given(dialect_program=dialect_programs, options=decoder_options, cuts=cut_lists)
@example(dialect_program=("mcbp", [5, UNALIGNED_REPRO[1]]), options={"garbage_chunk": 7}, cuts=[28])
def test_gaps_chunking_invariance(dialect_program: tuple[str, Program], options: dict[str, Any], cuts: list[int]) -> None:
    dialect, program = dialect_program
    expected = run(segments(program), dialect, **options)
    assert run(rechunk(program, cuts), dialect, **options) == expected
    assert run(program, dialect, **options) == expected


def _no_candidates(dialect: str) -> st.SearchStrategy[bytes]:
    """Garbage in which no header can start (no magic byte / no UPR opcode byte)."""
    bad = set(spec.MAGICS) if dialect == "mcbp" else set(range(1, 8))
    return st.binary(max_size=40).map(lambda b: bytes(x for x in b if x not in bad))


@pytest.mark.parametrize("dialect", ["mcbp", "upr"])
@SETTINGS
@given(data=st.data(), gap=st.integers(1, 5000), options=decoder_options.map(lambda o: {k: v for k, v in o.items() if k != "max_body"}))
def test_gap_truncates_then_resyncs(dialect: str, data: st.DataObject, gap: int, options: dict[str, Any]) -> None:
    case = any_mcbp_case() if dialect == "mcbp" else any_upr_case()
    a = data.draw(case, label="a").encode()
    b_full = data.draw(case, label="b").encode()
    b = b_full[: data.draw(st.integers(1, len(b_full) - 1), label="cut")]
    garbage = data.draw(_no_candidates(dialect), label="garbage")
    c = data.draw(case, label="c").encode()
    program: Program = [a, b, gap, garbage, c]
    cuts = data.draw(st.lists(st.integers(0, 200), max_size=8), label="cuts")
    events = run(rechunk(program, cuts), dialect, **options)
    assert events == run(program, dialect, **options)
    assert_well_formed(events, program, dialect, **options)

    first, *after = events
    assert (first.type, first.offset, first.raw) == ("frame", 0, a)
    at_gap = next(i for i, e in enumerate(after) if isinstance(e, Gap))
    held, hole, rest = after[:at_gap], after[at_gap], after[at_gap + 1 :]
    assert b"".join(e.raw if isinstance(e, Frame) else e.data for e in held) == b
    if len(held) == 1:  # the cut frame, whole
        (trunc,) = held
        assert isinstance(trunc, Truncated) and (trunc.offset, trunc.data) == (len(a), b)
        assert "gap" in trunc.reason
    else:  # rule 6: a header inside b frames the bytes in step, so b's own header is taken back
        assert isinstance(held[0], Garbage) and "taken back" in held[0].reason and held[0].offset == len(a)
    assert hole == Gap(len(a) + len(b), gap)
    *junk, last = rest
    assert all(isinstance(e, Garbage) for e in junk)
    assert b"".join(e.data for e in junk) == garbage
    assert (last.type, last.offset, last.raw) == ("frame", len(a) + len(b) + gap + len(garbage), c)


def test_gap_misuse_raises() -> None:
    dec = FrameDecoder()
    with pytest.raises(ValueError):
        dec.feed_gap(-1)
    assert dec.feed_gap(0) == []
    dec.close()
    with pytest.raises(RuntimeError):
        dec.feed(b"\x80")
    with pytest.raises(RuntimeError):
        dec.feed_gap(1)
    assert dec.close() == []


# ---------------------------------------------------------------------------
# 4. never raises: decode, dissect and render anything


def _exercise(events: list[Any], ctxs: list[Any]) -> None:
    for e in events:
        if not isinstance(e, Frame):
            assert annotate(e)
            assert annotate_html(e)
            continue
        _ = (e.name, e.role, e.opcode, e.key, e.value, e.extras, e.framing, e.stream_id, e.vbucket, e.status, repr(e))
        for ctx in ctxs:
            d = dissect(e, ctx)
            n = len(e.raw)
            for f in d.fields:
                assert f.offset >= 0 and f.offset + f.length <= n, (f, n)
            for p in d.problems:
                assert p.offset >= 0 and p.offset + p.length <= n, (p, n)
            json.dumps(d.as_dict())
            _ = (d.header, d.key_text, repr(d), summary(d))
            assert breakdown(d).startswith(d.title)
            assert annotate(d)
            assert annotate_html(d)
            assert breakdown(e, context=ctx) and annotate(e, context=ctx) and annotate_html(e, context=ctx)


@SETTINGS
@given(
    dialect=st.sampled_from(("mcbp", "upr")),
    data=st.data(),
    options=decoder_options,
    ctxs=st.lists(contexts, min_size=1, max_size=3),
)
def test_never_raises(dialect: str, data: st.DataObject, options: dict[str, Any], ctxs: list[Any]) -> None:
    raw = data.draw(st.binary(max_size=300) | fuzz_streams(dialect), label="raw")
    events = decode(raw, dialect=dialect, **options)
    assert_well_formed(events, [raw], dialect, **options)  # every input byte in exactly one event
    _exercise(events, ctxs)


@FEW
@given(raw=st.binary(max_size=200), dialect=st.sampled_from(("mcbp", "upr")), ctxs=st.lists(contexts, min_size=1, max_size=2))
def test_never_raises_on_random_bytes(raw: bytes, dialect: str, ctxs: list[Any]) -> None:
    for options in ({}, {"aligned": False}):
        events = decode(raw, dialect=dialect, **options)
        assert_well_formed(events, [raw], dialect, **options)
        _exercise(events, ctxs)
    assert annotate(raw) is not None


@pytest.mark.parametrize(("cmd", "response", "v"), [pytest.param(*t, id=variant_id(*t)) for t in ALL_VARIANTS])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_never_raises_on_broken_frames_of_every_variant(cmd: Command, response: bool, v: Variant, data: st.DataObject) -> None:
    case = data.draw(mcbp_case(cmd, response, v), label="case")
    raw = data.draw(mutated_case_frame(case), label="raw")
    events = decode(raw)
    assert [e.type for e in events] == ["frame"]
    assert_well_formed(events, [raw])
    valid = case.encode()
    original = decode(valid)
    assert_well_formed(original, [valid])
    _exercise(original + events, data.draw(st.lists(contexts, min_size=1, max_size=2), label="contexts"))


FLATBUFFER_VARIANTS = [t for t in ALL_VARIANTS if isinstance(t[2].value, str) and t[2].value.startswith("flatbuffers:")]


@pytest.mark.parametrize(("cmd", "response", "v"), [pytest.param(*t, id=variant_id(*t)) for t in FLATBUFFER_VARIANTS])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_never_raises_on_broken_flatbuffers(cmd: Command, response: bool, v: Variant, data: st.DataObject) -> None:
    case = data.draw(mcbp_case(cmd, response, v), label="case")
    table = bytearray(build_table(case.kwargs["value"], spec.FLATBUFFER_TABLES[v.value.split(":", 1)[1]]))
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        table[data.draw(st.integers(0, len(table) - 1), label="at")] = data.draw(st.integers(0, 255), label="byte")
    table = table[: data.draw(st.integers(0, len(table)), label="keep")]
    raw = case.encode(value=bytes(table))
    events = decode(raw)
    assert_well_formed(events, [raw])
    _exercise(events, [DissectContext()])


ALL_CONTEXTS = list(iter_contexts())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=fuzz_streams("mcbp"))
def test_dissect_never_raises_in_any_context(raw: bytes) -> None:
    events = decode(raw)
    assert_well_formed(events, [raw])
    for e in events:
        if isinstance(e, Frame):
            for ctx in ALL_CONTEXTS:
                d = dissect(e, ctx)
                assert d.fields is not None
                breakdown(d)
