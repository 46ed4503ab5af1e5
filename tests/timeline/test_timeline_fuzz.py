"""The timeline builder's contract on hostile input: whatever the frames and their order, it never raises.

A seeded slice of ``benchmarks/fuzz_timeline.py`` (mutated shipped captures and
hand-built sessions through records -> builder), and Hypothesis sequences of
frames of every DCP opcode (and the session commands the builder follows), in
any order, on a few vbuckets and opaques so that they meet.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from scripts import load_script
from strategies import ALL_VARIANTS, fuzz_mcbp_frame, mcbp_case

from dcpinspect.flows.records import Record
from dcpinspect.flows.session import FRESH
from dcpinspect.protocol import spec
from dcpinspect.protocol.session import EXPECTS_RESPONSE
from dcpinspect.timeline import TimelineBuilder
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.dissection import DissectContext
from dcpinspect.wire.events import Frame

fuzz_timeline = load_script("benchmarks/fuzz_timeline.py")

#: every DCP command and every other command the builder reads
FOLLOWED = sorted({op for op, cmd in spec.COMMANDS.items() if cmd.name.startswith("DCP_")} | EXPECTS_RESPONSE)
VARIANTS = [(cmd, response, v) for cmd, response, v in ALL_VARIANTS if cmd.opcode in FOLLOWED]


def test_every_followed_opcode_has_a_variant() -> None:
    assert {cmd.opcode for cmd, _r, _v in VARIANTS} == set(FOLLOWED) & set(spec.COMMANDS)


def test_mutated_captures_never_raise() -> None:
    """300 seeded mutations (drop, lose, duplicate, move, bit flips, windows) of the shipped captures and built sessions."""
    rng = random.Random(20261124)
    sessions = [*fuzz_timeline.capture_sessions(), *fuzz_timeline.built_sessions()]
    records = streams = 0
    for n in range(300):
        s = sessions[n % len(sessions)]
        pieces, lost, syn = fuzz_timeline.mutate(s.pieces, rng)
        recs = fuzz_timeline.records_of(pieces, lost, syn)
        t = fuzz_timeline.run(recs, tables=n % 10 == 0)
        records += len(recs)
        streams += len(t.streams)
    assert records > 5_000 and streams > 200  # the mutations left enough to chew on


@st.composite
def frame(draw: st.DrawFn) -> tuple[str, bytes]:
    """A frame of a followed command (within its table variant, or mutated) on vbucket 0-1, opaque 1-3, status success/rollback/any."""
    if draw(st.integers(0, 9)) == 0:
        raw = bytearray(draw(fuzz_mcbp_frame()))
    else:
        case = draw(st.sampled_from(VARIANTS).flatmap(lambda t: mcbp_case(*t)))
        raw = bytearray(case.encode())
        if case.response:
            raw[6:8] = draw(st.sampled_from((0, 0, 0x23, 0x01, 0x22))).to_bytes(2, "big")
        else:
            raw[6:8] = draw(st.integers(0, 1)).to_bytes(2, "big")
        raw[12:16] = draw(st.sampled_from((1, 2, 3, 0x10))).to_bytes(4, "big")
        if draw(st.integers(0, 7)) == 0 and len(raw) > 24:
            raw[draw(st.integers(24, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
    return draw(st.sampled_from(("c2s", "s2c"))), bytes(raw)


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.tuples(st.integers(1, 2), frame()), max_size=30), fresh=st.booleans())
def test_any_frames_in_any_order_never_raise(frames: list[tuple[int, tuple[str, bytes]]], fresh: bool) -> None:
    """Each frame as the decoder gives it (what does not frame is garbage: skipped), fed straight to the builder."""
    b = TimelineBuilder()
    for n, (conn, (direction, raw)) in enumerate(frames, 1):
        for ev in FrameDecoder().feed(raw):
            if isinstance(ev, Frame):
                b.feed(Record(n, "f", conn, f"c{conn}", direction, n * 1000, n * 1000, n, n, ev, FRESH if fresh else DissectContext()))
        if n % 7 == 0:
            b.timeline(final=False)
    t = b.timeline()
    for s in t.streams:
        s.as_dict()
