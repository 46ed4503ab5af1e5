"""Decoder property helpers: a program of byte chunks and gaps, run through FrameDecoder, and the well-formedness check."""

from __future__ import annotations

import itertools
from typing import Any

from strategies import (
    chunks_of,
)

from dcpinspect import (
    Frame,
    FrameDecoder,
    Gap,
    Garbage,
    Truncated,
)
from dcpinspect.protocol import spec
from dcpinspect.protocol.upr import UPR_HEADER_SIZE, UPR_HEADER_STRUCT
from dcpinspect.wire.decoder import DEFAULT_GARBAGE_CHUNK, DEFAULT_MAX_BODY

Program = list[bytes | int]  # bytes are fed, ints are feed_gap() lengths


# ---------------------------------------------------------------------------
# helpers


def run(program: Program, dialect: str = "mcbp", **options: Any) -> list[Any]:
    """Feed a program (data chunks and gaps) to a fresh decoder, then close it."""
    dec = FrameDecoder(dialect, **options)
    out: list[Any] = []
    for item in program:
        out += dec.feed_gap(item) if isinstance(item, int) else dec.feed(item)
    out += dec.close()
    assert dec.closed
    return out


def segments(program: Program) -> list[bytes | int]:
    """The stream a program describes: adjacent data merged, empty data and zero gaps dropped."""
    out: list[bytes | int] = []
    for item in program:
        if isinstance(item, int):
            if item:
                out.append(item)
        elif item:
            if out and isinstance(out[-1], bytes):
                out[-1] += item
            else:
                out.append(bytes(item))
    return out


def assert_well_formed(events: list[Any], program: Program, dialect: str = "mcbp", **options: Any) -> None:
    """Byte accounting: the events tile the stream, in order, and give back exactly its bytes."""
    max_body = options.get("max_body", DEFAULT_MAX_BODY)
    chunk = options.get("garbage_chunk", DEFAULT_GARBAGE_CHUNK)
    got: list[bytes | int] = []
    pos = 0
    for i, e in enumerate(events):
        assert e.offset == pos, f"event {i} {e!r} starts at {e.offset}, previous ended at {pos}"
        assert e.length > 0, f"empty event {e!r}"
        if isinstance(e, Gap):
            assert e.type == "gap"
            got.append(e.length)
        else:
            if isinstance(e, Frame):
                assert e.type == "frame"
                data = e.raw
                hs = spec.HEADER_SIZE if dialect == "mcbp" else UPR_HEADER_SIZE
                assert e.dialect == dialect
                assert e.header == (spec.HEADER if dialect == "mcbp" else UPR_HEADER_STRUCT).unpack_from(data, 0)
                assert len(data) == hs + e.body_length
                assert e.body_length <= max_body
            else:
                assert isinstance(e, (Garbage, Truncated)), e
                assert e.type == ("garbage" if isinstance(e, Garbage) else "truncated")
                data = e.data
                if isinstance(e, Garbage):
                    assert e.length <= chunk
                else:  # only the end of the stream or a gap leaves a frame incomplete
                    assert i == len(events) - 1 or isinstance(events[i + 1], Gap), f"Truncated in mid-stream: {events[i : i + 2]}"
            assert e.length == len(data)
            if got and isinstance(got[-1], bytes):
                got[-1] += data
            else:
                got.append(data)
        pos += e.length
    assert got == segments(program), "events do not reproduce the input"
    # garbage runs are cut at garbage_chunk boundaries: every piece of a run but its last is full
    for a, b in itertools.pairwise(events):
        if isinstance(a, Garbage) and isinstance(b, Garbage):
            assert a.length == chunk, f"garbage run cut at {a.length}, not at garbage_chunk={chunk}: {a!r} {b!r}"


def rechunk(program: Program, cuts: list[int]) -> Program:
    """Split every data item of a program at the given positions (gaps stay where they are)."""
    out: Program = []
    for item in program:
        out += [item] if isinstance(item, int) else chunks_of(item, cuts)
    return out


# ---------------------------------------------------------------------------
# 1. chunking invariance

# Regression examples: a garbage_chunk boundary that falls exactly on a feed()
# boundary (garbage_chunk=7, fed as 28 + 2 bytes) once gave the next garbage
# piece the reason of its own first byte instead of the run's.
