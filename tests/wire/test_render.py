"""Rendering: golden annotations, grid geometry, elision, non-frame events."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from dcpinspect import DissectContext, Frame, annotate, breakdown, byte_table, decode, dissect, encode
from dcpinspect.wire.examples import EXAMPLES
from dcpinspect.wire.render import summary

MUT = {"by_seqno": 0x2A, "rev_seqno": 1, "flags": 0, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0}
XATTR = struct.pack(">I", 12) + struct.pack(">I", 8) + b"_sy\0abc\0"

GOLDEN_CASES: dict[str, tuple[bytes, DissectContext | None]] = {
    "marker-v2.2-with-sid": (
        encode(
            "DCP_SNAPSHOT_MARKER",
            extras={"version": 2},
            value={
                "start_seqno": 1,
                "end_seqno": 9,
                "flags": 0x06,
                "max_visible_seqno": 9,
                "high_completed_seqno": 0,
                "purge_seqno": 3,
                "high_prepared_seqno": 0,
            },
            stream_id=5,
            opaque=0x1000,
            vbucket=3,
        ),
        DissectContext(collections=True, stream_ids=True),
    ),
    "mutation-collections-xattr": (
        encode(
            "DCP_MUTATION",
            extras=MUT,
            key="beer",
            cid=0x8A,
            value=XATTR + b'{"abv":5}',
            datatype=0x05,
            cas=0x17A0C5E8F2B40000,
            opaque=0x1000,
        ),
        DissectContext(collections=True, xattr=True),
    ),
    "sasl-plain-masked": (encode("SASL_AUTH", key="PLAIN", value=b"\0Administrator\0password"), None),
    "hello-request": (
        encode("HELLO", key='{"a":"dcpinspect","i":"00000001/00000002"}', value=struct.pack(">HHHH", 0x12, 0x10, 0x06, 0x0B)),
        None,
    ),
    "stream-end-with-problem": (encode("DCP_STREAM_END", extras={"status": 9}, cas=0, opaque=7), None),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_annotation(name: str, golden: Callable[[str, str], None]) -> None:
    data, ctx = GOLDEN_CASES[name]
    (frame,) = decode(data)
    golden(name, annotate(frame, context=ctx))


@pytest.mark.parametrize("ex", EXAMPLES, ids=lambda e: e.name)
def test_golden_seed_example(ex: object, golden: Callable[[str, str], None]) -> None:
    d = ex.dissect()  # type: ignore[attr-defined]
    golden("seed-" + ex.name, byte_table(d, max_rows=None) + "\n\n" + breakdown(d))  # type: ignore[attr-defined]


def test_grid_geometry() -> None:
    for n in (24, 25, 26, 27, 28, 1001):
        raw = encode("DCP_MUTATION", extras=MUT, key="k" * (n - 55) if n > 55 else "k", value=b"")
        raw = encode("GET", key="x" * (n - 24)) if n >= 25 else raw[:24]
        lines = byte_table(raw, max_rows=None).splitlines()
        rows = [ln for ln in lines[4:] if "|" in ln and "+" not in ln]
        assert len(rows) == (len(raw) + 3) // 4
        last = rows[-1]
        assert last.count("|") == (len(raw) - 1) % 4 + 2
        widths = {len(ln) for ln in lines[:4]}
        assert len(widths) == 1
        assert all(ln.index("|") == lines[2].index("|") for ln in rows)


def test_long_values_are_elided_but_fully_listed() -> None:
    raw = encode("DCP_MUTATION", extras=MUT, key="big", value=b"v" * 5000)
    (frame,) = decode(raw)
    grid = byte_table(frame)
    assert "bytes not shown" in grid
    assert len(grid.splitlines()) < 2 * 64 + 12
    full = byte_table(frame, max_rows=None)
    assert "bytes not shown" not in full and len(full.splitlines()) > 2000
    bd = breakdown(frame)
    assert "  nru" in bd and "Value" in bd and "(5000 chars)" in bd


def test_events_other_than_frames() -> None:
    events = decode(b"\x00\x01garbage!" + encode("DCP_NOOP")[:10])
    text = [annotate(e) for e in events]
    assert text[0].startswith("garbage: 10 bytes at offset 0 (unknown magic 0x00)")
    assert text[-1].startswith("truncated: 10 bytes at offset 10")
    from dcpinspect import FrameDecoder

    dec = FrameDecoder()
    gap = dec.feed_gap(100)[0]
    assert annotate(gap) == "gap: 100 bytes missing at offset 0"


def test_summary_line() -> None:
    (frame,) = decode(encode("DCP_MUTATION", extras=MUT, key="doc", vbucket=9, opaque=0x1000))
    assert summary(frame) == "@0 DCP_MUTATION command vb=9 opaque=0x00001000 key='doc' by_seqno=42"


def test_frame_repr_hooks() -> None:
    (frame,) = decode(encode("DCP_NOOP", opaque=5))
    assert isinstance(frame, Frame)
    assert "DCP_NOOP command" in frame._repr_html_()
    d = dissect(frame)
    assert "DCP_NOOP command" in d._repr_html_()
