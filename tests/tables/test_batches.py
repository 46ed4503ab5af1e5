"""The columnar frames table (``batches.py``) equals the one built by dissecting every frame.

``chunk_batch`` reads most columns from numpy arrays and only dissects the
frames it cannot prove clean, so these tests compare it row for row with
:class:`~dcpinspect.tables.columns.FrameColumns` (which dissects every frame): on
real and shipped captures, on hostile generated streams, and under
Hypothesis with random frames, random damage and random connection contexts.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import ROOT
from strategies import ALL_VARIANTS, mcbp_case

from dcpinspect import DissectContext, encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.capture.read import read_chunks, read_records
from dcpinspect.flows.reassembly import TS_MAX, TS_UNKNOWN
from dcpinspect.flows.records import CaptureStats, Record, RecordChunk
from dcpinspect.tables.columnar import read_batches
from dcpinspect.tables.columns import FrameColumns
from dcpinspect.tables.frames_vector import SCHEMA, chunk_batch
from dcpinspect.wire.decoder import FrameDecoder

THIRD_PARTY = ROOT.parent / "shared" / "captures" / "third-party"
CAPTURES = sorted((ROOT / "captures").glob("*.pcap")) + sorted(THIRD_PARTY.glob("*.pcap*"))


def slow_table(records: list[Record]) -> pa.Table:
    cols = FrameColumns().extend(records)
    return pa.table({f.name: pa.array(cols.cols[f.name], type=f.type) for f in SCHEMA}, schema=SCHEMA)


def assert_same(expected: pa.Table, got: pa.Table) -> None:
    assert got.schema.equals(expected.schema)
    assert got.num_rows == expected.num_rows
    for name in expected.column_names:
        a, b = expected.column(name).to_pylist(), got.column(name).to_pylist()
        if a != b:
            i = next(i for i in range(len(a)) if a[i] != b[i])
            raise AssertionError(f"column {name!r} differs at row {i}: dissect {a[i]!r}, columnar {b[i]!r}")


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
@pytest.mark.parametrize("rows", [1, 5, 65536])
def test_captures_equal(path: Path, rows: int) -> None:
    expected = slow_table(list(read_records([str(path)])))
    got = pa.Table.from_batches([chunk_batch(c) for c in read_chunks([str(path)], rows=rows)], schema=SCHEMA)
    assert_same(expected, got)


def test_read_batches_reports_like_records(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"not a capture at all")
    st1, st2 = CaptureStats(), CaptureStats()
    paths = [str(bad), *(str(p) for p in CAPTURES[:2])]
    expected = slow_table(list(read_records(paths, stats=st1)))
    got = pa.Table.from_batches(list(read_batches(paths, stats=st2, rows=7)), schema=SCHEMA)
    assert_same(expected, got)
    assert st1.files == st2.files and st1.records == st2.records == got.num_rows


def _mutation(i: int, **kw: object) -> bytes:
    args: dict[str, object] = {
        "extras": {"by_seqno": i + 1, "rev_seqno": 1},
        "key": f"doc-{i}",
        "value": b'{"n":%d}' % i,
        "datatype": 1,
        "vbucket": i % 4,
        "opaque": 7,
        "cas": 1000 + i,
    }
    args.update(kw)
    return encode("DCP_MUTATION", **args)  # type: ignore[arg-type]


def test_hostile_stream_equal(tmp_path: Path) -> None:
    """Frames the columnar path must hand to dissect: every kind of damage it can see."""
    frames = [
        _mutation(0),
        _mutation(1, value=b'{"n":1'),  # not JSON
        _mutation(2, value=b'{"a":1}{"b":2}'),  # two documents
        _mutation(3, value=b'{"a":"\xff"}'),  # not UTF-8
        _mutation(4, value=b'{"a":"x\x01"}'),  # control byte in a string
        _mutation(5, value=b"[1,2]"),  # JSON, not an object
        _mutation(6, value=b"[" * 300 + b"]" * 300),  # deep
        _mutation(7, extras={"by_seqno": 0, "rev_seqno": 1}),  # by seqno 0
        _mutation(8, key=b""),  # no key
        _mutation(9, key=b"\xffkey"),  # key not UTF-8
        _mutation(10, datatype=0x0C),  # unknown datatype bit
        _mutation(11, value=b"", datatype=0),
        _mutation(12, datatype=0x02, value=b"\x00\x00\x00\x04abcd"),  # xattrs
        encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 9, "end_seqno": 3, "flags": 1}, opaque=7),  # start > end
        encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 3, "flags": 0x80}, opaque=7),
        encode("DCP_NOOP", opaque=1),
        encode("DCP_NOOP", response=True, opaque=1),
        encode("DCP_NOOP", opaque=1, key="k"),
        encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 4096}),
        encode("DCP_DELETION", extras={"by_seqno": 3, "rev_seqno": 2, "nmeta": 0}, key="gone", opaque=7),
        encode("DCP_STREAM_END", extras={"status": 0}, opaque=7),
        b"\x80\x57\x00\x03\x00\x00\x00\x00" + b"\x00" * 16,  # extras length 0 for a mutation
        b"\x00" * 40,  # garbage
        _mutation(13),
    ]
    path = tmp_path / "hostile.pcap"
    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210), mss=100)
        conv.open(1_700_000_000_000_000_000)
        ts = conv.send("s2c", b"".join(frames), 1_700_000_000_000_100_000)
        conv.close(ts)
    expected = slow_table(list(read_records([str(path)])))
    assert sum(bool(p) for p in expected.column("problems").to_pylist()) >= 10
    for rows in (1, 3, 100):
        got = pa.Table.from_batches([chunk_batch(c) for c in read_chunks([str(path)], rows=rows)], schema=SCHEMA)
        assert_same(expected, got)


CONTEXTS = [
    DissectContext(),
    DissectContext(collections=True, xattr=True, snappy=True, json=True, delete_times=True, stream_ids=False),
    DissectContext(collections=False, xattr=False, snappy=False, json=False, delete_times=False, stream_ids=False),
    DissectContext(collections=True, stream_ids=True, delete_times=False),
]
FAST_VARIANTS = [t for t in ALL_VARIANTS if t[0].opcode in (0x55, 0x56, 0x57, 0x58, 0x59, 0x5C, 0x5D, 0x5F, 0x60, 0x61, 0x62, 0x63, 0x64)]


@st.composite
def chunks(draw: st.DrawFn) -> RecordChunk:
    parts: list[bytes] = []
    for _ in range(draw(st.integers(1, 12))):
        cmd, response, v = draw(st.sampled_from(FAST_VARIANTS if draw(st.booleans()) else ALL_VARIANTS))
        case = draw(mcbp_case(cmd, response, v))
        raw = bytearray(case.encode())
        for _ in range(draw(st.integers(0, 2))):  # damage that keeps the length fields
            pos = draw(st.integers(0, len(raw) - 1))
            if pos >= 8 or pos in (1, 5, 6, 7):
                raw[pos] = draw(st.integers(0, 255))
        parts.append(bytes(raw))
    dec = FrameDecoder()
    events = dec.feed(b"".join(parts)) + dec.close()
    contexts = [draw(st.sampled_from(CONTEXTS)) for _ in events]
    times = st.one_of(st.integers(0, 2**62), st.sampled_from([TS_UNKNOWN, TS_UNKNOWN + 1, TS_MAX, TS_MAX + 1, 2**64 * 10**9, -1]))
    rng = random.Random(draw(st.integers(0, 2**16)))
    counts: list[int] = []
    left = len(events)
    while left:
        counts.append(min(left, rng.randint(1, 4)))
        left -= counts[-1]
    runs = len(counts)
    return RecordChunk(
        1,
        events=events,
        context=contexts,
        counts=counts,
        conn=[1 + i % 2 for i in range(runs)],
        direction=[("c2s", "s2c")[i % 2] for i in range(runs)],
        file=["a.pcap"] * runs,
        ts=[draw(times) for _ in range(runs)],
        packet=list(range(1, runs + 1)),
        heads={0: (draw(times), draw(times), 3, 4)},
        labels={1: "10.0.0.1:1 -> 10.0.0.2:11210", 2: "10.0.0.3:2 -> 10.0.0.2:11210"},
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks())
def test_property_columnar_equals_dissect(chunk: RecordChunk) -> None:
    assert_same(slow_table(list(chunk.records())), pa.Table.from_batches([chunk_batch(chunk)], schema=SCHEMA))


def test_chunk_record_matches_records() -> None:
    chunk = next(read_chunks([str(CAPTURES[0])]))
    assert [chunk.record(i) for i in range(len(chunk))] == list(chunk.records())


def test_collection_id_past_32_bits_is_a_problem_not_a_crash() -> None:
    # the LEB128 bytes 80 80 80 80 10 decode to 2**32: reported, and the uint32 column holds null
    raw = bytes.fromhex("80580005120000000000001700000000" + "00" * 26 + "8080808010")
    events = FrameDecoder().feed(raw)
    chunk = RecordChunk(
        1,
        events=events,
        context=[DissectContext(collections=True)],
        counts=[1],
        conn=[1],
        direction=["s2c"],
        file=["a.pcap"],
        ts=[0],
        packet=[1],
        heads={0: (1, 2, 3, 4)},
        labels={1: "10.0.0.1:1 -> 10.0.0.2:11210"},
    )
    expected = slow_table(list(chunk.records()))
    got = pa.Table.from_batches([chunk_batch(chunk)], schema=SCHEMA)
    assert_same(expected, got)
    assert got.column("cid").to_pylist() == [None]
    assert "exceeds 32 bits" in str(got.column("problems").to_pylist())


@pytest.mark.parametrize("late", [TS_UNKNOWN, TS_MAX + 1, 2**64 * 10**9])
def test_time_out_of_range_is_null_in_both_paths(late: int) -> None:
    """A packet time no timestamp[ns] holds (the capture reader's TS_UNKNOWN, or a huge int from elsewhere) is null, never a crash."""
    events = FrameDecoder().feed(encode("DCP_NOOP", opaque=1) * 3)
    chunk = RecordChunk(
        1,
        events=events,
        context=[DissectContext()] * 3,
        counts=[1, 1, 1],
        conn=[1, 1, 1],
        direction=["s2c"] * 3,
        file=["a.pcap"] * 3,
        ts=[5, late, TS_MAX],
        packet=[1, 2, 3],
        heads={2: (late, TS_MAX, 2, 3)},
        labels={1: "10.0.0.1:1 -> 10.0.0.2:11210"},
    )
    expected = slow_table(list(chunk.records()))
    got = pa.Table.from_batches([chunk_batch(chunk)], schema=SCHEMA)
    assert_same(expected, got)
    assert got.column("ts").cast(pa.int64()).to_pylist() == [5, None, TS_MAX]
    assert got.column("ts_first").cast(pa.int64()).to_pylist() == [5, None, None]
