"""The timeline builder's state machines as tables, sampled exhaustively (h2's ``test_state_machines`` style).

* every stream state x input through :func:`~dcpinspect.timeline.transitions.step`:
  nothing raises, a pair the table does not allow is an anomaly;
* the same pairs through the builder, from frames: a stream driven into each
  state, then the frame of each input - what the table allows moves the
  segment as it says, anything else raises an anomaly;
* every opcode x direction x magic fed to a builder in every state (all of
  them with empty or zeroed extras, and Hypothesis with random bodies):
  nothing raises, and an opcode the protocol table does not know is an anomaly;
* the dispatch tables cover every opcode of the protocol table.
"""

from __future__ import annotations

from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpinspect import encode
from dcpinspect.flows.records import Record
from dcpinspect.flows.session import FRESH
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Magic, Opcode, Status, StreamEndStatus
from dcpinspect.protocol.rules import MAX_SEQNO
from dcpinspect.protocol.session import STREAM_MESSAGES
from dcpinspect.timeline import AnomalyKind, StreamState, TimelineBuilder, builder, streams
from dcpinspect.timeline.transitions import TRANSITIONS, VIOLATIONS, Input, step
from dcpinspect.wire.events import Frame

T0 = 1_700_000_000_000_000_000
PAIRS = list(product(StreamState, Input))


def req(opaque: int = 0x10) -> bytes:
    extras = {"flags": 0, "reserved": 0, "start_seqno": 0, "end_seqno": MAX_SEQNO, "vb_uuid": 0, "snap_start_seqno": 0, "snap_end_seqno": 0}
    return encode("DCP_STREAM_REQ", extras=extras, opaque=opaque)


def answer(status: int, opaque: int = 0x10) -> bytes:
    value = {"failover_log": [{"vb_uuid": 1, "vb_seqno": 0}]} if status == Status.SUCCESS else None
    value = {"rollback_seqno": 0} if status == Status.ROLLBACK else value
    return encode("DCP_STREAM_REQ", response=True, status=status, opaque=opaque, value=value)


MUT = ("s2c", encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="k", value=b"v", opaque=0x10))
MARKER = ("s2c", encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 2, "end_seqno": 5, "flags": 1}, opaque=0x10))
END = ("s2c", encode("DCP_STREAM_END", extras={"status": StreamEndStatus.CLOSED}, opaque=0x10))
CLOSE = ("c2s", encode("DCP_CLOSE_STREAM", opaque=0x20))
CLOSED = ("s2c", encode("DCP_CLOSE_STREAM", response=True, opaque=0x20))
END_ON_CLOSE = [
    ("c2s", encode("DCP_CONTROL", key="send_stream_end_on_client_close_stream", value=b"true", opaque=3)),
    ("s2c", encode("DCP_CONTROL", response=True, opaque=3)),
]
OPENED = [("c2s", req()), ("s2c", answer(Status.SUCCESS))]

#: frames that drive the stream of vbucket 0 into each state (several ways where an input needs a request in flight)
PREFIXES: dict[StreamState, list[list[tuple[str, bytes]]]] = {
    StreamState.FOLLOWED: [[MUT]],
    StreamState.REQUESTED: [[("c2s", req())]],
    StreamState.OPEN: [OPENED],
    StreamState.ROLLED_BACK: [[("c2s", req()), ("s2c", answer(Status.ROLLBACK))]],
    StreamState.REFUSED: [[("c2s", req()), ("s2c", answer(Status.KEY_ENOENT))]],
    StreamState.CLOSING: [[*OPENED, CLOSE]],
    StreamState.CLOSED: [[*OPENED, CLOSE, CLOSED], [*OPENED, CLOSE, CLOSED, CLOSE]],
    StreamState.ENDED: [[("c2s", req()), END], [*OPENED, CLOSE, END], [*OPENED, END]],
}
#: the frame of each input (the answers answer the request of opaque 0x10, the close one the close of opaque 0x20)
INPUTS: dict[Input, list[tuple[str, bytes]]] = {
    Input.REQUEST: [("c2s", req(0x11))],
    Input.SUCCESS: [("s2c", answer(Status.SUCCESS))],
    Input.ROLLBACK: [("s2c", answer(Status.ROLLBACK))],
    Input.ERROR: [("s2c", answer(Status.KEY_ENOENT))],
    Input.CLOSE: [CLOSE],
    Input.CLOSE_ANSWERED: [CLOSED],
    Input.DATA: [MARKER],
    Input.END: [END],
    Input.CLOSE_DATA: [MARKER],
    Input.CLOSE_END: [END],
}
#: the inputs that exist only on a connection that asked for STREAM_END(Closed) after CLOSE_STREAM
ON_END_ON_CLOSE = (Input.CLOSE_DATA, Input.CLOSE_END)


def records(frames: list[tuple[str, bytes]]) -> list[Record]:
    return [Record(n, "f", 1, "c", d, T0 + n, T0 + n, n, n, Frame(0, raw), FRESH) for n, (d, raw) in enumerate(frames, 1)]


def test_the_tables_are_consistent() -> None:
    assert not set(TRANSITIONS) & set(VIOLATIONS)
    assert {s for s, _i in TRANSITIONS} == set(StreamState)  # every state takes some input
    assert {t for t in TRANSITIONS.values()} | {StreamState.FOLLOWED} == set(StreamState)  # and is reached (FOLLOWED: first sight)


@pytest.mark.parametrize(("state", "inp"), PAIRS, ids=[f"{s.name}-{i.name}" for s, i in PAIRS])
def test_step_every_state_and_input(state: StreamState, inp: Input) -> None:
    nxt, kind = step(state, inp)
    if (state, inp) in TRANSITIONS:
        assert (nxt, kind) == (TRANSITIONS[(state, inp)], None)
    else:
        assert isinstance(kind, AnomalyKind)
        assert nxt is None or isinstance(nxt, StreamState)


def feed(frames: list[tuple[str, bytes]]) -> TimelineBuilder:
    return TimelineBuilder().feed_all(records(frames))


@pytest.mark.parametrize(("state", "inp"), PAIRS, ids=[f"{s.name}-{i.name}" for s, i in PAIRS])
def test_builder_every_state_and_input(state: StreamState, inp: Input) -> None:
    """From frames: allowed pairs move the segment as the table says; any other pair raises an anomaly."""
    reached = False
    for prefix in PREFIXES[state]:
        setup = (END_ON_CLOSE if inp in ON_END_ON_CLOSE else []) + prefix
        before = feed(setup)
        segment = before.streams[-1]
        assert segment.state is state, (prefix, segment.state)
        n, raised = len(before.streams), before.anomaly_count
        before.feed_all(records(setup + INPUTS[inp])[len(setup) :])
        new = before.timeline(final=False).anomalies[raised:]
        if (state, inp) not in TRANSITIONS:
            assert new, f"{state} x {inp}: no anomaly"
            continue
        if [a.kind for a in new] == [AnomalyKind.RESPONSE_WITHOUT_REQUEST]:
            continue  # this prefix has no request in flight for the answer to reach
        assert not new, new
        assert segment.state is TRANSITIONS[(state, inp)]
        if inp is Input.REQUEST and segment.state is not StreamState.REQUESTED:
            assert len(before.streams) == n + 1 and before.streams[-1].state is StreamState.REQUESTED  # a new segment
        reached = True
    assert reached or (state, inp) not in TRANSITIONS, f"no prefix lets {inp} reach a {state} stream"


MAGICS = [int(m) for m in Magic]
REQUESTS = {int(Magic.CLIENT_REQUEST), int(Magic.ALT_CLIENT_REQUEST)}


@st.composite
def frame(draw: st.DrawFn) -> tuple[str, bytes]:
    """Any opcode, direction and magic, with extras, key and value of any length (mostly short)."""
    magic, op = draw(st.sampled_from(MAGICS)), draw(st.integers(0, 255))
    extras = draw(st.binary(max_size=32))
    key = draw(st.binary(max_size=8))
    value = draw(st.binary(max_size=32))
    vb_status, opaque = draw(st.sampled_from((0, 0x23, 1))), draw(st.sampled_from((0x10, 0x11, 0x20, 3)))
    body = extras + key + value
    header = spec.HEADER.pack(magic, op, len(key), len(extras), 0, vb_status, len(body), opaque, 0)
    return draw(st.sampled_from(("c2s", "s2c"))), header + body


@settings(max_examples=400, deadline=None)
@given(state=st.sampled_from(list(PREFIXES)), which=st.integers(0, 2), frames=st.lists(frame(), min_size=1, max_size=4))
def test_any_opcode_direction_and_magic_in_any_state(state: StreamState, which: int, frames: list[tuple[str, bytes]]) -> None:
    prefixes = PREFIXES[state]
    setup = END_ON_CLOSE + prefixes[which % len(prefixes)]
    recs = records(setup + frames)
    b = feed(setup)
    b.feed_all(recs[len(setup) :])
    t = b.timeline()
    for s in t.streams:
        s.as_dict()
    unknown = {r.event.opcode for r in recs[len(setup) :] if r.event.opcode not in spec.COMMANDS and r.event.magic in REQUESTS}
    reported = {int(a.message.split()[1], 16) for a in t.anomalies if a.kind == AnomalyKind.UNKNOWN_OPCODE}
    assert unknown == reported


@pytest.mark.parametrize("state", list(PREFIXES), ids=[s.name for s in PREFIXES])
def test_every_opcode_direction_and_magic_exhaustively(state: StreamState) -> None:
    """Each of 256 opcodes x 6 magics x 2 directions, header only and with 16 bytes of extras, after a stream reached ``state``."""
    setup = END_ON_CLOSE + PREFIXES[state][-1]
    frames = [
        (d, spec.HEADER.pack(magic, op, 0, ext, 0, 0, ext, 0x10, 0) + bytes(ext))
        for op in range(256)
        for magic in MAGICS
        for d in ("c2s", "s2c")
        for ext in (0, 16)
    ]
    b = feed(setup)
    b.feed_all(records(setup + frames)[len(setup) :])
    t = b.timeline()
    reported = {int(a.message.split()[1], 16): a.count for a in t.anomalies if a.kind == AnomalyKind.UNKNOWN_OPCODE}
    assert reported == {op: len(REQUESTS) * 2 * 2 for op in range(256) if op not in spec.COMMANDS}  # merged: one per opcode


def test_the_dispatch_tables_cover_every_opcode_of_the_table() -> None:
    assert set(builder._REQUEST) == set(builder._RESPONSE) == set(range(256))
    unknown = {op for op, h in builder._REQUEST.items() if h is TimelineBuilder._unknown}
    assert unknown == set(range(256)) - set(spec.COMMANDS)  # every opcode of the table has a handler of its own
    assert set(streams.STREAM) == STREAM_MESSAGES
    assert all(builder._REQUEST[op] is TimelineBuilder._stream_message for op in STREAM_MESSAGES)
    assert {int(op) for op in (Opcode.DCP_STREAM_REQ, Opcode.DCP_CLOSE_STREAM)} <= set(builder._RESPONSE)


def test_a_closed_stream_may_be_requested_again_and_drain() -> None:
    """kv_engine producer.cc: a closed stream is replaced by a new request at once; with send_stream_end_on_client_close_stream
    its queued messages follow the close response.  What stays an anomaly: a request for an open stream, data after the
    close response without that control, anything after the end."""
    for state in (StreamState.CLOSING, StreamState.CLOSED):
        assert step(state, Input.REQUEST) == (state, None)  # the old segment stays; the builder starts a new one
    assert step(StreamState.CLOSED, Input.CLOSE_DATA) == (StreamState.CLOSED, None)
    assert step(StreamState.CLOSED, Input.DATA) == (StreamState.CLOSED, AnomalyKind.AFTER_CLOSE_STREAM)
    assert step(StreamState.ENDED, Input.CLOSE_DATA) == (None, AnomalyKind.AFTER_STREAM_END)
    for state in (StreamState.FOLLOWED, StreamState.OPEN):
        assert step(state, Input.REQUEST) == (state, AnomalyKind.STREAM_ALREADY_OPEN)
    # elsewhere a stream message goes where it goes on any connection
    for state in StreamState:
        if state is not StreamState.CLOSED:
            assert step(state, Input.CLOSE_DATA) == step(state, Input.DATA)
