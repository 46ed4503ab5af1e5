"""The flow-control sizes notebook 04 teaches, as the project computes them (encode + flow_control_size).

kv_engine docs/dcp/documentation/flow-control.md and engines/ep/src/dcp/response.h:
the producer charges a stream message's whole packet (24 header bytes +
framing extras + extras + key + value), a prepare 2 bytes more (MB-46634),
a noop or a response nothing.  Notebook 04 builds its size table the same way;
these are the numbers it must show.
"""

from __future__ import annotations

import pytest

from dcpinspect import encode
from dcpinspect.protocol.rules import flow_control_size

# (message, variant, bytes charged with an empty key and value, charged per key byte, per value byte)
REFERENCE = [
    ("DCP_MUTATION", None, 55, 1, 1),
    ("DCP_DELETION", "v1", 42, 1, 1),
    ("DCP_DELETION", "v2", 45, 1, 1),
    ("DCP_EXPIRATION", None, 44, 1, 1),
    ("DCP_PREPARE", None, 57, 1, 1),
    ("DCP_COMMIT", None, 40, 1, 0),
    ("DCP_ABORT", None, 40, 1, 0),
    ("DCP_SNAPSHOT_MARKER", "v1", 44, 0, 0),
    ("DCP_SNAPSHOT_MARKER", "v2.0", 61, 0, 0),
    ("DCP_SNAPSHOT_MARKER", "v2.2", 77, 0, 0),
    ("DCP_STREAM_END", None, 28, 0, 0),
    ("DCP_OSO_SNAPSHOT", None, 28, 0, 0),
    ("DCP_SEQNO_ADVANCED", None, 32, 0, 0),
    ("DCP_SET_VBUCKET_STATE", None, 25, 0, 0),
    ("DCP_CACHE_TRANSFER_END", None, 24, 0, 0),
]


def _charged(name: str, variant: str | None, key: bytes = b"", value: bytes | None = None) -> tuple[int, int]:
    kw: dict[str, object] = {"key": key}
    if name == "DCP_SNAPSHOT_MARKER" and variant != "v1":
        kw["value"] = {}  # the v2.x marker's fixed value: every field 0
    elif value is not None:
        kw["value"] = value
    raw = encode(name, variant=variant, **kw)  # type: ignore[arg-type]
    return flow_control_size(raw[0], raw[1], len(raw)), len(raw)


@pytest.mark.parametrize(("name", "variant", "base", "per_key", "per_value"), REFERENCE, ids=[f"{n}-{v}" for n, v, *_ in REFERENCE])
def test_reference_sizes(name: str, variant: str | None, base: int, per_key: int, per_value: int) -> None:
    assert _charged(name, variant)[0] == base
    key = b"k" * 9 if per_key else b""
    value = b"v" * 35 if per_value else None
    assert _charged(name, variant, key, value)[0] == base + 9 * per_key + 35 * per_value


def test_only_a_prepare_is_charged_more_than_its_packet() -> None:
    for name, variant, *_ in REFERENCE:
        charged, wire = _charged(name, variant)
        assert charged - wire == (2 if name == "DCP_PREPARE" else 0), name


def test_a_stream_id_adds_its_three_byte_frame() -> None:
    plain = encode("DCP_MUTATION", key=b"doc")
    with_sid = encode("DCP_MUTATION", key=b"doc", stream_id=5)
    assert flow_control_size(with_sid[0], with_sid[1], len(with_sid)) - flow_control_size(plain[0], plain[1], len(plain)) == 3


@pytest.mark.parametrize(
    ("name", "response"),
    [("DCP_NOOP", False), ("DCP_NOOP", True), ("DCP_STREAM_REQ", True), ("DCP_CONTROL", True), ("DCP_GET_FAILOVER_LOG", True)],
)
def test_noops_and_responses_cost_nothing(name: str, response: bool) -> None:
    raw = encode(name, response=response)
    assert flow_control_size(raw[0], raw[1], len(raw)) == 0


def test_notebook_04_stop_point() -> None:
    """The exercise's arithmetic: a 44-byte marker, then 98- and 99-byte mutations, a 1024-byte window.

    The producer sends while bytes outstanding < the window, so the message that crosses it still goes out.
    """
    sizes = [44] + [_charged("DCP_MUTATION", None, b"\x00doc-0001", b"x" * (34 if s <= 3 else 35))[0] for s in range(1, 15)]
    outstanding, sent = 0, 0
    for size in sizes:
        if outstanding >= 1024:
            break
        outstanding += size
        sent += 1
    assert (sent - 1, outstanding) == (10, 1031)  # seqno 10 is the last sent (the marker is message 0)


def test_flow_control_frame_is_the_reference() -> None:
    from dcpinspect.tables.export import flow_control_frame

    df = flow_control_frame()
    got = {(r.message, r.variant or None): r.formula for r in df.itertuples() if r.counted}
    for name, variant, base, per_key, per_value in REFERENCE:
        formula = f"{base}" + (" + k" if per_key else "") + (" + v" if per_value else "")
        assert got[(name, variant)] == formula, (name, variant)
    free = df[~df["counted"]]
    assert set(free["message"]) == {"DCP_NOOP", "DCP_STREAM_REQ response", "DCP_CONTROL response"} and (free["charged"] == 0).all()
    prepare = df[df["message"] == "DCP_PREPARE"].iloc[0]
    assert prepare["charged"] - prepare["wire"] == 2
