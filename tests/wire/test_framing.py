"""The two variable-length codes, both ways: LEB128 collection ids and flexible-framing frame infos."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpinspect import EncodeError, Frame, decode, encode
from dcpinspect.wire.framing import (
    LEB128_MAX_BYTES,
    FrameInfo,
    FramingProblem,
    decode_leb128,
    encode_frame_infos,
    encode_leb128,
    parse_frame_infos,
)

PROPERTY = settings(max_examples=300, deadline=None)
frame_infos = st.lists(st.tuples(st.integers(0, 15 + 255), st.binary(max_size=15 + 255)), max_size=4)

# ---------------------------------------------------------------------------
# LEB128


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (0x7F, "7f"),
        (0x80, "8001"),
        (0x555, "d50a"),
        (0xFFFF, "ffff03"),
        (0x5555, "d5aa01"),
        (0xCAFEF00D, "8de0fbd70c"),
        (0xFFFFFFFF, "ffffffff0f"),
        (555, "ab04"),
    ],
)
def test_leb128_examples(value: int, encoded: str) -> None:
    assert encode_leb128(value).hex() == encoded
    assert decode_leb128(bytes.fromhex(encoded)) == (value, len(encoded) // 2, None)


def test_leb128_too_long() -> None:
    v, n, problem = decode_leb128(b"\xff\xff\xff\xff\xff\x01")
    assert v is None and n == LEB128_MAX_BYTES and problem and "longer than 5" in problem
    v, n, problem = decode_leb128(b"\xff\xff\xff\xff\x1f")
    assert v == 0x1FFFFFFFF and problem and "exceeds 32 bits" in problem


def test_leb128_cut_short_and_over_long() -> None:
    assert decode_leb128(b"\x80\x80") == (None, 2, "key ends inside its LEB128 collection id")
    assert decode_leb128(b"\x80\x80\x01", 0, 2) == (None, 2, "key ends inside its LEB128 collection id")  # the limit cuts it
    v, n, problem = decode_leb128(b"\x81\x00")
    assert (v, n) == (1, 2) and problem and "non-canonical" in problem


def test_negative_leb128_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="unsigned"):
        encode_leb128(-1)
    with pytest.raises(EncodeError):  # encode() says so in its own error
        encode("DCP_MUTATION", cid=-1)


@PROPERTY
@given(value=st.integers(0, 2**32 - 1), prefix=st.binary(max_size=4), tail=st.binary(max_size=4))
def test_leb128_round_trip(value: int, prefix: bytes, tail: bytes) -> None:
    enc = encode_leb128(value)
    assert len(enc) <= LEB128_MAX_BYTES
    assert decode_leb128(prefix + enc + tail, len(prefix)) == (value, len(enc), None)


@PROPERTY
@given(raw=st.binary(max_size=8), pos=st.integers(0, 8), limit=st.none() | st.integers(0, 10))
def test_leb128_decoding_never_raises_and_stays_in_bounds(raw: bytes, pos: int, limit: int | None) -> None:
    value, n, problem = decode_leb128(raw, pos, limit)
    end = len(raw) if limit is None else min(limit, len(raw))
    assert 0 <= n <= max(0, min(LEB128_MAX_BYTES, end - pos))
    assert value is not None or problem is not None
    if value is not None and problem is None:
        assert encode_leb128(value) == raw[pos : pos + n]  # a clean decoding is the canonical encoding


# ---------------------------------------------------------------------------
# frame infos


@pytest.mark.parametrize(("fid", "length"), [(0, 0), (2, 2), (14, 14), (15, 0), (20, 3), (3, 15), (200, 40), (270, 270)])
def test_frame_info_nibble_escapes(fid: int, length: int) -> None:
    payload = bytes(i % 256 for i in range(length))
    enc = encode_frame_infos([(fid, payload), (2, b"\x00\x07")])
    infos, problem = parse_frame_infos(enc)
    assert problem is None
    assert [(i.id, i.payload) for i in infos] == [(fid, payload), (2, b"\x00\x07")]
    escapes = (fid >= 15) + (length >= 15)
    assert infos[0] == FrameInfo(fid, payload, 0, 1 + escapes)
    assert infos[1].offset == 1 + escapes + length


def test_frame_info_escape_bytes_missing() -> None:
    assert parse_frame_infos(b"\xf0") == ([], FramingProblem("frame info id escape byte missing", 0, 1))
    assert parse_frame_infos(b"\x0f") == ([], FramingProblem("frame info length escape byte missing", 0, 1))
    infos, problem = parse_frame_infos(b"\x22\x00\x07\x23\x01")
    assert [i.id for i in infos] == [2] and problem == FramingProblem("frame info 2 (3 bytes) overruns the framing extras", 3, 2)


@pytest.mark.parametrize(("fid", "length"), [(-1, 0), (15 + 256, 0), (0, 15 + 256)])
def test_frame_infos_out_of_range_cannot_be_encoded(fid: int, length: int) -> None:
    with pytest.raises(ValueError, match="cannot be encoded"):
        encode_frame_infos([(fid, bytes(length))])


@PROPERTY
@given(infos=frame_infos)
def test_frame_infos_round_trip(infos: list[tuple[int, bytes]]) -> None:
    enc = encode_frame_infos(infos)
    parsed, problem = parse_frame_infos(enc)
    assert problem is None
    assert [(i.id, i.payload) for i in parsed] == infos
    # they tile the framing extras: each starts where the previous one ended
    pos = 0
    for info in parsed:
        assert info.offset == pos
        pos += info.header_length + len(info.payload)
    assert pos == len(enc)


@PROPERTY
@given(raw=st.binary(max_size=40))
def test_frame_infos_parsing_never_raises_and_accounts_for_every_byte(raw: bytes) -> None:
    infos, problem = parse_frame_infos(raw)
    pos = 0
    for info in infos:
        assert info.offset == pos and raw[pos + info.header_length : pos + info.header_length + len(info.payload)] == info.payload
        pos += info.header_length + len(info.payload)
    if problem is None:
        assert pos == len(raw)
    else:  # the problem covers the rest
        assert (problem.offset, problem.offset + problem.length) == (pos, len(raw))
    assert encode_frame_infos((i.id, i.payload) for i in infos) == raw[:pos]


@PROPERTY
@given(sid=st.integers(0, 0xFFFF), others=st.lists(st.tuples(st.sampled_from((0, 1, 5, 20)), st.binary(max_size=3)), max_size=2))
def test_frame_stream_id_is_read_through_the_codec(sid: int, others: list[tuple[int, bytes]]) -> None:
    (frame,) = decode(encode("DCP_MUTATION", key="k", frame_infos=others, stream_id=sid))
    assert isinstance(frame, Frame) and frame.stream_id == sid
    (resp,) = decode(encode("DCP_MUTATION", response=True, frame_infos=[(2, b"\x00\x07")]))
    assert isinstance(resp, Frame) and resp.stream_id is None  # in responses frame info 2 is WriteUnits


def test_docstring_examples() -> None:
    import doctest

    from dcpinspect.wire import framing

    result = doctest.testmod(framing)
    assert result.attempted > 0 and result.failed == 0
