"""Hostile inputs for the frame decoder: resynchronising cost, headers whose body never comes, the fuzzer's contracts.

* Resynchronising over bytes that are all candidate headers (``0x80 0x80 ...``)
  must cost a small constant per byte: the number of headers the decoder
  judges in Python (``FrameDecoder._checks``) and of the reasons it formats is
  counted, not timed.
* A plausible header that declares a large body which never completes (the
  stream ends, or a gap cuts it) must not swallow the frames after it: when
  its bytes hold frames in step, the header is garbage and the rest is decoded.
  A genuinely truncated frame (no frames in step in its body) stays
  :class:`Truncated`.
* A deterministic slice of ``benchmarks/fuzz.py``'s decoder contracts (never
  raises, tiling, chunking, byte by byte, gaps).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from decoding import Program, assert_well_formed, rechunk, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripts import load_script
from strategies import chunks_of

from dcpinspect import Frame, FrameDecoder, Gap, Garbage, Truncated, decode, encode
from dcpinspect.protocol import spec
from dcpinspect.protocol.upr import UPR_HEADER_STRUCT
from dcpinspect.wire import decoder as decoder_module
from dcpinspect.wire.decoder import plausible_header

FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NOOP = spec.HEADER.pack(0x80, 0x5C, 0, 0, 0, 0, 0, 0, 0)  # DCP_NOOP request, no body
MUTATION = encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="doc-1", value=b'{"a":1}', vbucket=3, opaque=9)
#: a plausible header (DCP_MUTATION, no sections) declaring a 1 MiB body that never comes
BOGUS = spec.HEADER.pack(0x80, 0x57, 0, 0, 0, 0, 1 << 20, 0, 0)


# ---------------------------------------------------------------------------
# helpers


def counted(data: bytes, pieces: int = 1, **options: Any) -> tuple[list[Any], int, int]:
    """Decode ``data`` fed in ``pieces`` equal chunks: (events, headers judged in Python, reasons formatted)."""
    calls = 0
    real = decoder_module._implausible_mcbp

    def counting(h: tuple[Any, ...], max_body: int, strict: bool) -> str | None:
        nonlocal calls
        calls += 1
        return real(h, max_body, strict)

    mp = pytest.MonkeyPatch()
    mp.setattr(decoder_module, "_implausible_mcbp", counting)
    try:
        dec = FrameDecoder(**options)
        step = -(-len(data) // pieces)
        events = [e for i in range(0, len(data), step) for e in dec.feed(data[i : i + step])]
        events += dec.close()
    finally:
        mp.undo()
    return events, getattr(dec, "_checks", -1), calls


def kinds(events: list[Any]) -> list[tuple[str, int, int]]:
    return [(e.type, e.offset, e.length) for e in events]


def all_chunkings(program: Program, **options: Any) -> list[Any]:
    """The events of ``program`` - asserting they are the same fed whole, byte by byte and in odd chunks."""
    expected = run(program, **options)
    assert_well_formed(expected, program, **options)
    by_byte: Program = []
    for item in program:
        by_byte += [item] if isinstance(item, int) else [item[i : i + 1] for i in range(len(item))]
    assert run(by_byte, **options) == expected
    for cuts in ([1], [23, 24, 25], [5, 47, 100, 101, 102, 999], list(range(0, 2000, 37))):
        assert run(rechunk(program, cuts), **options) == expected
    return expected


# ---------------------------------------------------------------------------
# finding 1: resynchronising over candidate bytes costs a small constant per byte


@pytest.mark.parametrize("byte", [0x80, 0x81, 0x82, 0x83, 0x08, 0x18])
@pytest.mark.parametrize("aligned", [True, False])
def test_resync_over_magic_bytes_judges_few_headers(byte: int, aligned: bool) -> None:
    """Regression: 16 MiB of 0x80 resynchronised at 0.5 MiB/s (every byte unpacked, judged and given a reason in Python)."""
    for n in (240, 2400, 24_000):
        events, checks, reasons = counted(bytes([byte]) * n, aligned=aligned)
        # garbage, then the last 23 bytes: a header that never completed
        assert [e.type for e in events] == ["garbage"] * (len(events) - 1) + ["truncated"], events[:3]
        assert events[-1].length == 23 and sum(e.length for e in events) == n
        # no header made of one repeated magic byte passes the cheap filter, so none is judged in Python,
        # and only the reason of the garbage run's first byte is written out
        assert reasons <= 2, (n, reasons)
        assert checks == 0, (n, checks)


def test_resync_checks_are_linear_in_the_input() -> None:
    """Inputs that pass the cheap filter as often as possible: the checks grow linearly, at most one per candidate."""
    rng = random.Random(5)
    magics = tuple(spec.MAGICS)
    ops = tuple(spec.COMMANDS)

    def hostile(n: int) -> bytes:
        # a magic and a known opcode everywhere the cheap filter looks, zero datatype and body, so most candidates
        # are judged in full; the key length is larger than the (zero) body so none is plausible
        b = bytearray(n)
        for i in range(0, n - 24, 13):
            b[i] = rng.choice(magics)
            b[i + 1] = rng.choice(ops)
            b[i + 2] = 0xFF
        return bytes(b)

    per_byte = []
    for n in (1300, 13_000, 130_000):
        data = hostile(n)
        events, checks, _ = counted(data, aligned=False)
        assert all(isinstance(e, Garbage) for e in events[:-1])
        per_byte.append(checks / n)
        assert 0 < checks <= n // 13 + 1
        # the same checks fed in 100 pieces (a kept tail is judged again at most once per piece)
        assert counted(data, 100, aligned=False)[1] <= checks + 100
    assert max(per_byte) - min(per_byte) < 0.01, per_byte


def test_cheap_filter_agrees_with_the_strict_rules() -> None:
    """The resync pattern never rejects a header the strict rules accept (every magic, opcode and datatype class)."""
    rng = random.Random(3)
    max_body = 0x01234567
    pattern = FrameDecoder(max_body=max_body)._candidates
    for magic in range(256):
        for op in range(256):
            for dt in (0, 7, 8, 0xFF):
                body = rng.choice((0, 24, max_body, max_body + 1, 0x01FFFFFF, 0x02000000, 0xFFFFFFFF))
                raw = spec.HEADER.pack(magic, op, rng.choice((0, 3, 0x0203, 0xFFFF)), rng.randrange(256), dt, 0, body, 0, 0)
                if plausible_header(raw, max_body=max_body):
                    assert pattern(raw) is not None, raw.hex()
    upr = FrameDecoder("upr", max_body=max_body)._candidates
    for op in range(256):
        for reserved in (b"\0\0\0", b"\0\0\1", b"\1\0\0"):
            for length in (0, 5, max_body, max_body + 1, 0x01FFFFFF, 0xFFFFFFFF):
                raw = UPR_HEADER_STRUCT.pack(op, reserved, 7, length)
                if decoder_module._implausible_upr(UPR_HEADER_STRUCT.unpack_from(raw), max_body, True) is None:
                    assert upr(raw) is not None, raw.hex()


def test_length_pattern_is_exact() -> None:
    """``_at_most(limit, 4)`` matches a 4-byte big-endian number exactly when it is at most ``limit``."""
    import re

    rng = random.Random(6)
    limits = [0, 1, 255, 256, 0xFFFF, 0x01600000, 22 * 1024 * 1024, 0x00FF00FF, 0xFFFFFFFE, 0xFFFFFFFF, 1 << 40]
    limits += [rng.getrandbits(rng.choice((8, 16, 24, 32))) for _ in range(30)]
    for limit in limits:
        match = re.compile(b"^" + decoder_module._at_most(limit, 4) + b"$", re.DOTALL).match
        near = [limit + d for d in (-257, -256, -255, -1, 0, 1, 255, 256, 257)]
        values = {v for v in near + [0, 0xFFFFFFFF] + [rng.getrandbits(32) for _ in range(200)] if 0 <= v <= 0xFFFFFFFF}
        for v in values:
            assert (match(v.to_bytes(4, "big")) is not None) == (v <= limit), (hex(limit), hex(v))


def test_resync_judgement_is_the_strict_rules() -> None:
    """Pattern plus Python check accept exactly the headers the strict rules (``plausible_header``) accept."""
    rng = random.Random(4)
    starts = (*spec.MAGICS, 0x00, 0x7F, 0x84, 0xFF)
    for _ in range(6000):
        max_body = rng.choice((0, 23, 24, 300, (1 << 24) - 1, 1 << 24))
        body = rng.choice((0, 1, 23, 24, 25, 300))
        kl = rng.choice((0, 1, 0x0100, 0x0101, 0x0A0A, 0xFFFF, rng.getrandbits(16)))
        head = spec.HEADER.pack(
            rng.choice(starts), rng.randrange(256), kl, rng.choice((0, 1, 4, 24)), rng.choice((0, 3, 7, 8, 0x40)), 0, body, 0, 0
        )
        want = plausible_header(head, max_body=max_body)
        events = decode(head + bytes(body), aligned=False, max_body=max_body)  # zeros: no other header can start
        assert (events[0].type == "frame") == want, (head.hex(), max_body)
    for _ in range(2000):
        max_body = rng.choice((0, 11, 12, 300))
        length = rng.choice((0, 1, 12, 13, 300))
        head = UPR_HEADER_STRUCT.pack(rng.randrange(10), rng.choice((b"\0\0\0", b"\0\1\0")), 9, length)
        want = decoder_module._implausible_upr(UPR_HEADER_STRUCT.unpack_from(head), max_body, True) is None
        events = decode(head + bytes(length), dialect="upr", aligned=False, max_body=max_body)
        assert (events[0].type == "frame") == want, (head.hex(), max_body)


# ---------------------------------------------------------------------------
# finding 2: a header whose body never completes does not swallow the frames after it


def test_bogus_header_at_end_of_stream_gives_back_the_frames_after_it() -> None:
    """Regression: frames, a corrupt header declaring 1 MiB, frames, end: everything after the header was one Truncated."""
    after = NOOP * 3 + MUTATION * 2
    data = NOOP + BOGUS + after
    events = all_chunkings([data])
    assert kinds(events[:2]) == [("frame", 0, 24), ("garbage", 24, 24)]
    assert "taken back" in events[1].reason and "end of stream" in events[1].reason
    assert [(e.type, e.raw) for e in events[2:]] == [("frame", NOOP)] * 3 + [("frame", MUTATION)] * 2


def test_bogus_header_at_a_gap_gives_back_the_frames_after_it() -> None:
    after = MUTATION + NOOP * 4
    program: Program = [MUTATION + BOGUS + after, 100, NOOP]
    events = all_chunkings(program)
    n = len(MUTATION)
    assert kinds(events[:2]) == [("frame", 0, n), ("garbage", n, 24)]
    assert "gap of 100 bytes" in events[1].reason
    assert [(e.type, e.raw) for e in events[2:7]] == [("frame", MUTATION)] + [("frame", NOOP)] * 4
    assert events[7] == Gap(2 * n + 24 + 4 * 24, 100)
    assert (events[8].type, events[8].raw) == ("frame", NOOP)


def test_bogus_header_40_percent_in_loses_nothing_after_it() -> None:
    """The audit's case: a corrupt header 40% into a stream of frames, the stream ends before its declared body."""
    frames = [encode("DCP_MUTATION", extras={"by_seqno": i + 1, "rev_seqno": 1}, key=f"k{i}", value=bytes(i % 50)) for i in range(1000)]
    head = b"".join(frames[:400])
    bad = bytearray(frames[400])
    bad[8:12] = (20 << 20).to_bytes(4, "big")  # the body length field of one frame says 20 MiB
    data = head + bytes(bad) + b"".join(frames[401:])
    events = decode(data)
    got = [e.raw for e in events if isinstance(e, Frame)]
    assert got == frames[:400] + frames[401:]
    assert [e.type for e in events if not isinstance(e, Frame)] == ["garbage"]
    assert events[400].offset == len(head) and events[400].length == len(frames[400])
    assert_well_formed(events, [data])
    assert run(list(chunks_of(data, list(range(0, len(data), 4096))))) == events


def test_nested_bogus_headers_are_all_taken_back() -> None:
    data = NOOP + BOGUS + b"junk" + BOGUS + NOOP * 2
    events = all_chunkings([data])
    # one garbage run: the first header taken back, the junk, the second header taken back
    assert kinds(events) == [("frame", 0, 24), ("garbage", 24, 52), ("frame", 76, 24), ("frame", 100, 24)]
    assert events[1].reason == "header of a 1048600-byte frame taken back (end of stream after 100 bytes)"


def test_bogus_header_then_garbage_then_frames_at_end() -> None:
    data = BOGUS + bytes(range(0x20, 0x70)) + NOOP + MUTATION
    events = all_chunkings([data], aligned=False)
    assert [e.type for e in events] == ["garbage", "frame", "frame"]
    assert events[0].data == BOGUS + bytes(range(0x20, 0x70))


@pytest.mark.parametrize("garbage_chunk", [7, 64 * 1024])
def test_taken_back_up_to_a_genuinely_truncated_frame(garbage_chunk: int) -> None:
    """Frames in step after the bogus header, then junk and a frame cut at the end: that one stays Truncated."""
    junk = b"\x01" * 20
    cut_frame = MUTATION[:30]
    data = BOGUS + NOOP * 2 + junk + cut_frame
    events = all_chunkings([data], garbage_chunk=garbage_chunk)

    def run_of(offset: int, length: int) -> list[tuple[str, int, int]]:
        return [("garbage", offset + k, min(garbage_chunk, length - k)) for k in range(0, length, garbage_chunk)]

    assert kinds(events) == [*run_of(0, 24), ("frame", 24, 24), ("frame", 48, 24), *run_of(72, 20), ("truncated", 92, 30)]
    assert events[-1].reason == f"end of stream after 30 of {len(MUTATION)} bytes"
    assert [e.reason for e in events if e.offset == 72] == ["unknown magic 0x01"]


def test_chain_of_headers_running_past_the_end_costs_one_check_each() -> None:
    """A plausible header every 3 bytes, each declaring more than is left: taken back in one linear pass, then Truncated."""
    for n in (3000, 30_000, 300_000):
        data = b"\x80\x07\x00" * (n // 3)  # 80 07 0080 07 00 8007 00800700: a 8 MiB body, 0x87 bytes of key and extras
        events, checks, _ = counted(data)
        assert kinds(events) == [("truncated", 0, n)]
        assert checks <= n // 3
        assert counted(data, 50)[1] == checks


@pytest.mark.parametrize("cut", [1, 23, 24, 30, len(MUTATION) - 1])
def test_genuinely_truncated_last_frame_stays_truncated(cut: int) -> None:
    data = NOOP + MUTATION[:cut]
    events = all_chunkings([data])
    assert kinds(events) == [("frame", 0, 24), ("truncated", 24, cut)]
    assert "end of stream" in events[1].reason


def test_truncated_frame_with_a_frame_out_of_step_inside_stays_truncated() -> None:
    """A body holding one frame that is followed by neither a header nor the end is not evidence enough."""
    body = b"xx" + NOOP + b"\x00\x01\x02" * 10 + b"yy"
    header = spec.HEADER.pack(0x80, 0x57, 0, 0, 0, 0, len(body) + 100, 0, 0)
    for program in ([header + body], [header + body, 5, NOOP]):
        events = all_chunkings(program)  # type: ignore[arg-type]
        assert isinstance(events[0], Truncated) and events[0].data == header + body


def test_truncated_frame_whose_body_ends_in_a_frame_is_taken_back() -> None:
    """A frame that ends exactly where the bytes end is in step: the header before it is taken back."""
    body = b"\x00\x01" * 5 + NOOP
    header = spec.HEADER.pack(0x80, 0x57, 0, 0, 0, 0, 4096, 0, 0)
    events = all_chunkings([header + body])
    assert [(e.type, e.length) for e in events] == [("garbage", 34), ("frame", 24)]


@pytest.mark.parametrize("dialect", ["mcbp", "upr"])
@FEW
@given(data=st.data(), gap=st.integers(0, 300), garbage_chunk=st.sampled_from((7, 64 * 1024)))
def test_bogus_header_property(dialect: str, data: st.DataObject, gap: int, garbage_chunk: int) -> None:
    """Frames, a bogus header declaring more than the rest, frames (and maybe a gap): every frame after it is decoded."""
    if dialect == "mcbp":
        pool = [NOOP, MUTATION, encode("DCP_DELETION", extras={"by_seqno": 2, "rev_seqno": 1}, key="k", opaque=1)]
    else:
        pool = [UPR_HEADER_STRUCT.pack(op, b"\0\0\0", 1, 3) + b"abc" for op in (1, 2, 4)]
    before = data.draw(st.lists(st.sampled_from(pool), max_size=4), label="before")
    after = data.draw(st.lists(st.sampled_from(pool), min_size=2, max_size=12), label="after")
    tail = b"".join(after)
    starts = spec.MAGICS if dialect == "mcbp" else range(1, 8)
    # (a length field with a byte a header can start with could hold a header of its own, and resync there)
    body = len(tail) + data.draw(st.integers(1, 1 << 20).filter(lambda x: not set((len(tail) + x).to_bytes(4, "big")) & set(starts)))
    if dialect == "mcbp":
        bogus = spec.HEADER.pack(0x80, 0x57, 0, 0, 0, 0, body, 0, 0)
    else:
        bogus = UPR_HEADER_STRUCT.pack(4, b"\0\0\0", 0xAAAAAAAA, body)
    program: Program = [b"".join(before) + bogus + tail]
    if gap:
        program += [gap, pool[0]]
    cuts = data.draw(st.lists(st.integers(0, 400), max_size=8), label="cuts")
    opts = {"garbage_chunk": garbage_chunk}
    events = run(program, dialect, **opts)
    assert_well_formed(events, program, dialect, **opts)
    assert run(rechunk(program, cuts), dialect, **opts) == events
    frames = [e.raw for e in events if isinstance(e, Frame)]
    assert frames == before + after + ([pool[0]] if gap else [])
    assert not any(isinstance(e, Truncated) for e in events)


# ---------------------------------------------------------------------------
# finding 3: the fuzzer's decoder contracts, a deterministic slice


def _load_fuzz() -> Any:
    return load_script("benchmarks/fuzz.py")


def test_fuzz_decoder_contracts_slice() -> None:
    """A few thousand fuzz inputs through the decoder contracts only (the same checks as ``fuzz.py --decoder-only``)."""
    fuzz = _load_fuzz()
    fz = fuzz.Fuzzer(seed=11, per_variant=1)
    for _ in range(3000):
        data, dialect = fz.make_input()
        fz.check_decoder(data, dialect)
    s = fz.stats
    assert s.inputs == 3000
    assert s.exceptions == 0, [f.tb for f in s.failures]
    assert s.contract_violations == {}, [f.detail[:2000] for f in s.violations]
    assert s.contract_checks["byte-by-byte"] == 3000 and s.contract_checks["gaps"] > 100
