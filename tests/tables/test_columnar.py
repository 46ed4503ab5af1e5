"""The columnar capture path equals the exact one, row for row and column for column.

:func:`~dcpinspect.tables.columnar.read_batches` proves per connection that
its TCP directions are simple and reads those as arrays; everything else goes
through the exact reassembler.  These tests compare it with the exact path
(:func:`~dcpinspect.capture.read.read_chunks`: per-packet reassembly, then
:func:`~dcpinspect.tables.frames_vector.record_batches`) on every capture we have and on Hypothesis-generated
captures with every fault the capture factory can inject: lost, reordered,
duplicated and conflicting segments, snaplen cuts, mid-connection starts,
resets, port reuse, unknown ports, garbage and frames cut at the end, session
commands that change what later frames mean - and with windows and batches
cut anywhere.  The tables, the per-file reports, the skipped packets, the
connections and what each negotiated must all be equal.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from paths import CAPTURES, THIRD_PARTY
from pcapfactory import LINKTYPES, Conn, Msg, write_capture
from readcheck import assert_same_read

from dcpinspect import encode
from dcpinspect.protocol.enums import Datatype, Feature
from dcpinspect.tables.columnar import frame_walk, read_batches
from dcpinspect.tables.frames_vector import SCHEMA
from dcpinspect.wire.decoder import DEFAULT_MAX_BODY, FrameDecoder, plausible_header

SHIPPED = sorted(CAPTURES.glob("*.pcap"))
THIRD = sorted(THIRD_PARTY.glob("*.pcap*"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_captures(path: Path) -> None:
    assert_same_read([str(path)])


def test_shipped_captures_as_one_capture_in_small_windows() -> None:
    paths = [str(p) for p in SHIPPED]
    t = assert_same_read(paths, rows=7, window=4096, capture_sets="one")
    assert set(t.column("capture_set").to_pylist()) == {1} and t.column("set_frame") == t.column("frame")


def test_shipped_captures_as_capture_sets_in_small_windows() -> None:
    """Each shipped capture a set of its own: both paths number, place and count alike, set by set."""
    paths = [str(p) for p in SHIPPED]
    t = assert_same_read(paths, rows=7, window=4096)
    assert set(t.column("capture_set").to_pylist()) == set(range(1, len(paths) + 1))


@pytest.mark.shared
@pytest.mark.parametrize("path", THIRD, ids=lambda p: p.name)
def test_third_party_captures(path: Path) -> None:
    assert_same_read([str(path)])


def test_frame_walk_accepts_what_the_decoder_accepts() -> None:
    frames = [encode("DCP_NOOP", opaque=i) for i in range(3)] + [encode("GET", key="k")]
    buf = b"".join(frames)
    starts, stop, bad = frame_walk(buf + frames[3][:20])
    assert starts.tolist() == [0, 24, 48, 72] and stop == len(buf) and not bad
    starts, stop, bad = frame_walk(buf + b"\x00" * 24)
    assert stop == len(buf) and bad
    events = FrameDecoder().feed(buf + b"\x00" * 24)
    assert [e.offset for e in events if e.type == "frame"] == starts.tolist()


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(
        st.one_of(
            st.sampled_from([encode("DCP_NOOP", opaque=1), encode("GET", key="k"), encode("DCP_NOOP", magic=0x08, opaque=2)]),
            st.binary(min_size=0, max_size=40),
            st.builds(lambda b, n: b[:n], st.sampled_from([encode("SET", key="k", value=b"v" * 30)]), st.integers(0, 60)),
        ),
        max_size=12,
    ),
    max_body=st.sampled_from([DEFAULT_MAX_BODY, 20, 0]),
)
def test_frame_walk_equals_the_decoder(pieces: list[bytes], max_body: int) -> None:
    """The array judgement of the chain of body lengths equals a walk that asks the decoder's own rule of each header, on any bytes."""
    buf = b"".join(pieces)
    starts: list[int] = []
    pos, want = 0, None
    while pos + 24 <= len(buf):
        if not plausible_header(buf[pos : pos + 24], max_body=max_body, strict=False):  # what the aligned decoder loop accepts
            want = (starts, pos, True)
            break
        end = pos + 24 + int.from_bytes(buf[pos + 8 : pos + 12], "big")
        if end > len(buf):
            break
        starts.append(pos)
        pos = end
    want = want or (starts, pos, False)
    for b in (buf, memoryview(buf)):
        got, stop, bad = frame_walk(b, max_body)
        assert (got.tolist(), stop, bad) == want


# --------------------------------------------------------------------------- generated captures

_COLLECTIONS = {"features": [{"feature": int(Feature.COLLECTIONS)}]}


def _frame(kind: str, i: int, draw: st.DrawFn) -> bytes:
    if kind == "mutation":
        value = draw(st.sampled_from([b'{"a": 1}', b'{"a": [1, 2', b"plain", b"", b'{"name": "x\\u00e9"}']))
        dt = int(Datatype.JSON) if draw(st.booleans()) else 0
        return encode("DCP_MUTATION", extras={"by_seqno": i + 1, "rev_seqno": 1}, key=f"k{i}", value=value, datatype=dt, opaque=7)
    if kind == "noop":
        return encode("DCP_NOOP", opaque=i)
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=40))
    return encode("GET", key=f"key{i}", opaque=i)


@st.composite
def conversations(draw: st.DrawFn) -> list[Conn]:
    conns = []
    for c in range(draw(st.integers(1, 3))):
        port = draw(st.sampled_from([11210, 11211, 40000 + c]))
        msgs: list[Msg] = []
        if draw(st.booleans()):  # HELLO collections: keys carry a collection id from then on
            msgs.append(Msg("c2s", encode("HELLO", key="x", value=_COLLECTIONS, opaque=1)))
            msgs.append(Msg("s2c", encode("HELLO", response=True, value=_COLLECTIONS, opaque=1)))
        for i in range(draw(st.integers(0, 6))):
            direction = draw(st.sampled_from(["c2s", "s2c"]))
            kinds = draw(st.lists(st.sampled_from(["mutation", "noop", "get", "mutation", "garbage"]), min_size=1, max_size=5))
            data = b"".join(_frame(k, i * 10 + j, draw) for j, k in enumerate(kinds))
            if draw(st.integers(0, 9)) == 0:
                data = data[: draw(st.integers(1, len(data)))]  # a frame cut short
            msgs.append(Msg(direction, data))
        conns.append(
            Conn(
                client=(f"10.0.0.{c + 1}", 50000 + c),
                server=("10.0.1.1", port),
                msgs=msgs,
                handshake=draw(st.integers(0, 7)) > 0,
                close=draw(st.sampled_from(["fin", "rst", None])),
                isn_c=draw(st.sampled_from([1000, 2**32 - 30])),
                isn_s=5000,
            )
        )
    if draw(st.integers(0, 5)) == 0 and conns:  # the same 4-tuple again: port reuse
        conns.append(Conn(client=conns[0].client, server=conns[0].server, msgs=conns[0].msgs[:2], isn_c=777, isn_s=888))
    return conns


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(conns=conversations(), data=st.data())
def test_generated_captures(tmp_path_factory: pytest.TempPathFactory, conns: list[Conn], data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("col")
    nseg = 6
    faults = {
        k: data.draw(st.lists(st.integers(0, nseg), max_size=2), label=k) if data.draw(st.integers(0, 3), label=k + "?") == 0 else []
        for k in ("drop", "reorder", "duplicate", "overlap_conflict")
    }
    path = tmp / "x.pcap"
    try:
        write_capture(
            path,
            conns,
            fmt=data.draw(st.sampled_from(["pcap", "pcapng"]), label="fmt"),
            linktype=data.draw(st.sampled_from(sorted(LINKTYPES)), label="link"),
            mss=data.draw(st.sampled_from([7, 40, 100, 1460]), label="mss"),
            snaplen=data.draw(st.sampled_from([65535, 65535, 80]), label="snaplen"),
            start_offset=data.draw(st.sampled_from([0, 0, 0, 5]), label="start"),
            interleave=data.draw(st.booleans(), label="interleave"),
            **faults,
        )
    except ValueError:  # a fault on a segment the conversation does not have (or cannot take)
        assume(False)
    assert_same_read(
        [str(path)],
        rows=data.draw(st.sampled_from([3, 65536]), label="rows"),
        window=data.draw(st.sampled_from([0, 200, 5000]), label="window") or None,
        detect=data.draw(st.booleans(), label="detect"),
    )


# --------------------------------------------------------------------------- JSON checking is a choice


def _json_capture(path: Path) -> Path:
    good = encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="good", value=b'{"a": 1}', datatype=int(Datatype.JSON))
    bad = encode("DCP_MUTATION", extras={"by_seqno": 2, "rev_seqno": 1}, key="bad", value=b'{"a": ', datatype=int(Datatype.JSON))
    plain = encode("DCP_MUTATION", extras={"by_seqno": 3, "rev_seqno": 1}, key="plain", value=b"text")
    write_capture(path, [Conn(msgs=[Msg("s2c", good + bad + plain)])])
    return path


def test_json_check_on_and_off(tmp_path: Path) -> None:
    path = str(_json_capture(tmp_path / "j.pcap"))
    on = assert_same_read([path])  # on by default: exactly the exact path's table
    assert on.column("key").to_pylist() == ["good", "bad", "plain"]
    assert on.column("json_check").to_pylist() == ["valid", "invalid", None]
    assert on.column("problems").to_pylist()[1][0].startswith("datatype says JSON but the document is not valid JSON")
    off = pa.Table.from_batches(list(read_batches([path], json_check=False)), schema=SCHEMA)
    assert off.column("json_check").to_pylist() == ["not checked", "not checked", None]
    assert off.column("problems").to_pylist() == [[], [], []]  # not checked, so nothing is claimed
    assert off.drop_columns(["json_check", "problems"]).equals(on.drop_columns(["json_check", "problems"]))


def test_cli_no_json_check(tmp_path: Path) -> None:
    import io

    import pyarrow.parquet as pq

    from dcpinspect.cli.main import main

    path = str(_json_capture(tmp_path / "j.pcap"))
    for flags, expected in (((), ["valid", "invalid", None]), (("--no-json-check",), ["not checked", "not checked", None])):
        out = tmp_path / "f.parquet"
        assert main(["frames", "--no-progress", *flags, "--parquet", str(out), path], out=io.StringIO(), stdin=io.StringIO("")) == 0
        assert pq.read_table(out).column("json_check").to_pylist() == expected


@pytest.mark.parametrize("detect", [False, True])
def test_port_reuse_on_an_unknown_port(tmp_path: Path, detect: bool) -> None:
    """A 4-tuple first seen mid-connection on an unknown port, then opened again by a SYN: the exact path's rows, as they are.

    Without detection the reassembler never adopts that second connection and
    still emits its rows, under connection id 0; the columnar path says the same.
    """
    m = encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="k0", value=b'{"a": 1}', datatype=int(Datatype.JSON))
    a, b = ("10.0.0.1", 50000), ("10.0.1.1", 40000)
    conns = [
        Conn(client=a, server=b, msgs=[Msg("c2s", m)], handshake=False),
        Conn(client=("10.0.0.2", 50001), server=("10.0.1.1", 11210), msgs=[], handshake=False),
        Conn(client=a, server=b, msgs=[Msg("c2s", m)], isn_c=777, isn_s=888),
    ]
    write_capture(tmp_path / "r.pcap", conns, mss=100)
    got = assert_same_read([str(tmp_path / "r.pcap")], detect=detect, rows=3)
    assert got.column("conn_id").to_pylist() == ([1, 1] if detect else [0, 0])
