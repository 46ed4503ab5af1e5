"""Captures end to end: written by scapy (tests/pcapfactory.py), read by dcpinspect,
checked against the ground truth of what was sent and against tshark."""

from __future__ import annotations

import io
import json
import os
import re
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from paths import CAPTURES
from pcapfactory import Conn, Msg, pcap_records, write_bad_files, write_capture, write_hostile_headers
from tshark import needs_tshark, opaque_value, tshark_frames

from dcpinspect import decode, dissect, encode
from dcpinspect.capture import pcapfile as capture
from dcpinspect.capture.pcapfile import MAX_RECORD, TS_MAX, TS_UNKNOWN, CaptureReader
from dcpinspect.capture.read import read_records
from dcpinspect.cli.main import main
from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.columnar import read_batches
from dcpinspect.tables.export import frames_df, frames_table
from dcpinspect.tables.frames_vector import SCHEMA

LINKTYPES = ["ether", "ether-vlan", "sll", "sll2", "raw", "null", "loop"]
MUT = {"rev_seqno": 1, "flags": 0, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0}


def dcp_conversation(n: int = 30, *, vb: int = 3, opaque: int = 0x1000, hello: bool = False, collections: bool = False) -> list[Msg]:
    msgs = []
    if hello:
        feats = struct.pack(">H", 0x12) if collections else b""
        msgs += [
            Msg("c2s", encode("HELLO", key="test", value=feats, opaque=1)),
            Msg("s2c", encode("HELLO", response=True, value=feats, opaque=1)),
        ]
    msgs += [
        Msg("c2s", encode("DCP_OPEN", key="conn-a", extras={"flags": 1}, opaque=2)),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=2)),
        Msg("c2s", encode("DCP_STREAM_REQ", vbucket=vb, opaque=opaque, extras={"end_seqno": 2**64 - 1})),
        Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=opaque, value=[(0xFEEDDECA, 0)])),
    ]
    items = encode("DCP_SNAPSHOT_MARKER", vbucket=vb, opaque=opaque, extras={"start_seqno": 0, "end_seqno": n, "flags": 1})
    for i in range(n):
        key = f"doc-{i}"
        items += encode(
            "DCP_MUTATION",
            vbucket=vb,
            opaque=opaque,
            extras={**MUT, "by_seqno": i + 1},
            key=key,
            cid=8 if collections else None,
            value=b"v" * (50 + 37 * i % 400),
            cas=1000 + i,
        )
    msgs.append(Msg("s2c", items))
    return msgs


def records(path: Path, **kw: object) -> tuple[list[object], CaptureStats]:
    st = CaptureStats()
    return list(read_records([str(path)], stats=st, **kw)), st  # type: ignore[arg-type]


def truth(w: object, conn: int, direction: str) -> list[bytes]:
    return [e.raw for e in decode(w.stream(conn, direction))]  # type: ignore[attr-defined,union-attr]


def ours(recs: list[object], conn_id: int, direction: str) -> list[bytes]:
    return [r.event.raw for r in recs if r.conn == conn_id and r.direction == direction and r.event.type == "frame"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("linktype", LINKTYPES)
def test_every_link_layer_decodes_exactly(tmp_path: Path, fmt: str, ipv6: bool, linktype: str) -> None:
    conns = [Conn(msgs=dcp_conversation()), Conn(client=("10.0.0.5", 50001), msgs=dcp_conversation(vb=9, opaque=0x2000))]
    w = write_capture(tmp_path / f"c.{fmt}", conns, fmt=fmt, linktype=linktype, ipv6=ipv6, mss=500)
    recs, st = records(w.path)
    assert st.files[str(w.path)]["problems"] == [] and st.files[str(w.path)]["error"] is None
    assert [c.id for c in st.connections] == [1, 2]
    for ci, conn in enumerate(st.connections):
        assert conn.role_source == "syn" and conn.lost == 0
        assert conn.client[1] == w.addresses[ci][0][1] and conn.server[1] == 11210
        for d in ("c2s", "s2c"):
            assert ours(recs, conn.id, d) == truth(w, ci, d)
    assert all(r.event.type == "frame" for r in recs)  # type: ignore[attr-defined]
    assert all(dissect(r.event, r.context).problems == [] for r in recs)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("nanosecond", "big_endian"), [(False, False), (True, False), (False, True), (True, True)])
def test_pcap_byte_orders_and_resolutions(tmp_path: Path, nanosecond: bool, big_endian: bool) -> None:
    w = write_capture(tmp_path / "c.pcap", [Conn(msgs=dcp_conversation(5))], nanosecond=nanosecond, big_endian=big_endian, step=0.000000123)
    recs, _ = records(w.path)
    firsts = {s.frames[0]: s.ts_ns for s in w.segments}
    for r in recs:
        assert r.ts_first == firsts[r.packet_first]  # type: ignore[attr-defined]
        assert r.ts == firsts[r.packet]  # type: ignore[attr-defined]


def test_pcapng_interfaces_and_other_traffic(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcapng", [Conn(msgs=dcp_conversation(10))], fmt="pcapng", extra_interfaces=3, non_tcp=5)
    recs, st = records(w.path)
    assert ours(recs, 1, "s2c") == truth(w, 0, "s2c")
    assert sum(st.skipped.values()) >= 5
    firsts = {s.frames[0]: s.ts_ns for s in w.segments}
    assert all(r.ts_first == firsts[r.packet_first] for r in recs)  # type: ignore[attr-defined]


@pytest.mark.parametrize("fault", ["reorder", "duplicate", "both"])
def test_reordering_and_retransmission_change_nothing(tmp_path: Path, fault: str) -> None:
    conns = [Conn(msgs=dcp_conversation(40))]
    idx = list(range(5, 30, 3))  # data segments of the items message (0-3: the session)
    kw = (
        {"reorder": idx}
        if fault == "reorder"
        else {"duplicate": idx}
        if fault == "duplicate"
        else {"reorder": idx, "duplicate": [i + 1 for i in idx]}
    )
    w = write_capture(tmp_path / "c.pcap", conns, mss=300, **kw)  # type: ignore[arg-type]
    recs, st = records(w.path)
    assert ours(recs, 1, "s2c") == truth(w, 0, "s2c")
    assert st.connections[0].lost == 0


def test_conflicting_retransmission_is_counted(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcap", [Conn(msgs=dcp_conversation(20))], mss=300, overlap_conflict=[8])
    recs, st = records(w.path)
    assert ours(recs, 1, "s2c") == truth(w, 0, "s2c")  # the first copy wins
    assert sum(h.conflicts for h in st.connections[0].halves.values()) == 1
    where = [p for h in st.connections[0].halves.values() for p in h.conflict_packets]
    assert where == [f.number for f in w.frames if f.kind == "conflict"]


def test_dropped_segment_is_an_exact_gap_and_decoding_resumes(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcap", [Conn(msgs=dcp_conversation(60))], mss=300, drop=[10])
    recs, st = records(w.path)
    (hole,) = w.missing[0, "s2c"]
    gaps = [r.event for r in recs if r.event.type == "gap"]  # type: ignore[attr-defined]
    assert [(g.offset, g.length) for g in gaps] == [(hole[0], hole[1] - hole[0])]  # type: ignore[attr-defined]
    assert st.connections[0].lost == hole[1] - hole[0]
    full = decode(w.stream(0, "s2c"))
    got = ours(recs, 1, "s2c")
    before = [e.raw for e in full if e.offset + e.length <= hole[0]]  # type: ignore[union-attr]
    after = [e.raw for e in full if e.offset >= hole[1]]  # type: ignore[union-attr]
    assert got[: len(before)] == before
    assert got[-len(after) + 2 :] == after[2:]  # resynchronised within a couple of frames of the hole


def test_snaplen_cut_is_a_gap(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcap", [Conn(msgs=dcp_conversation(30))], mss=1400, snaplen=600)
    recs, st = records(w.path)
    missing = sum(b - a for a, b in w.missing[0, "s2c"])
    assert st.connections[0].halves["s2c"].lost == missing > 0
    assert not any(b"\0" * 64 in r.event.raw for r in recs if r.event.type == "frame")  # type: ignore[attr-defined]


def test_capture_starting_mid_connection(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcap", [Conn(msgs=dcp_conversation(40))], mss=500, start_offset=3000)
    recs, st = records(w.path)
    conn = st.connections[0]
    assert conn.role_source == "port" and conn.server[1] == 11210
    got = ours(recs, 1, "s2c")
    full = truth(w, 0, "s2c")
    assert len(got) > 20 and got == full[-len(got) :]
    assert all(r.context.collections is None for r in recs)  # type: ignore[attr-defined]


def test_sequence_wrap(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcap", [Conn(msgs=dcp_conversation(40), isn_s=2**32 - 700, isn_c=2**32 - 3)], mss=300)
    recs, _ = records(w.path)
    assert ours(recs, 1, "s2c") == truth(w, 0, "s2c") and ours(recs, 1, "c2s") == truth(w, 0, "c2s")


def test_port_reuse_is_two_connections(tmp_path: Path) -> None:
    conns = [Conn(msgs=dcp_conversation(3)), Conn(msgs=dcp_conversation(4), isn_c=90000, isn_s=70000)]
    w = write_capture(tmp_path / "c.pcap", conns, interleave=False)
    recs, st = records(w.path)
    assert [c.id for c in st.connections] == [1, 2]
    assert ours(recs, 2, "s2c") == truth(w, 1, "s2c")


def test_context_follows_each_connection(tmp_path: Path) -> None:
    conns = [
        Conn(msgs=dcp_conversation(5, hello=True, collections=True)),
        Conn(client=("10.0.0.7", 50007), msgs=dcp_conversation(5, hello=True, collections=False)),
    ]
    w = write_capture(tmp_path / "c.pcap", conns)
    recs, _ = records(w.path)
    muts = [dissect(r.event, r.context) for r in recs if r.event.type == "frame" and r.event.name == "DCP_MUTATION"]  # type: ignore[attr-defined]
    with_cid = [d for d in muts if d.cid is not None]
    assert len(with_cid) == 5 and all(d.cid == 8 and d.key_text.startswith("doc-") for d in with_cid)
    assert all(d.key_text.startswith("doc-") for d in muts if d.cid is None)


def test_bad_files(tmp_path: Path) -> None:
    bad = write_bad_files(tmp_path)
    for name in ("text", "empty", "bad_global_header", "short_global_header"):
        st = CaptureStats()
        assert list(read_records([str(bad[name])], stats=st)) == []
        err = st.files[str(bad[name])]["error"]
        assert err and str(bad[name]) in err and "byte offset" in err, (name, err)
    for name in ("truncated_record", "corrupt_record_length", "bad_pcapng_block_length"):
        st = CaptureStats()
        recs = list(read_records([str(bad[name])], stats=st))
        info = st.files[str(bad[name])]
        assert info["error"] is None and info["problems"], name
        assert "byte offset" in info["problems"][0]
        assert recs, name  # what came before is kept


# --- the independent decoder -------------------------------------------------------


@needs_tshark
@pytest.mark.parametrize("linktype", ["ether", "sll"])
def test_tshark_agrees_on_clean_captures(tmp_path: Path, linktype: str) -> None:
    conns = [Conn(msgs=dcp_conversation(40)), Conn(client=("10.0.0.5", 50001), msgs=dcp_conversation(25, vb=9, opaque=0x2000))]
    w = write_capture(tmp_path / "c.pcap", conns, mss=700, linktype=linktype)
    pdus = tshark_frames(w.path)
    recs, _ = records(w.path)
    mine = [r for r in recs if r.event.type == "frame"]  # type: ignore[attr-defined]
    assert len(pdus) == len(mine)
    # tshark lists PDUs in packet order; ours complete in the same packet order
    mine.sort(key=lambda r: (r.packet, r.event.offset))  # type: ignore[attr-defined]
    for p, r in zip(pdus, mine, strict=True):
        fr = r.event  # type: ignore[attr-defined]
        d = dissect(fr, r.context)  # type: ignore[attr-defined]
        assert int(p["couchbase.opcode"], 16) == fr.opcode
        assert opaque_value(p["couchbase.opaque"]) == fr.opaque  # tshark shows the opaque byte-swapped
        assert int(p["couchbase.total_bodylength"]) == fr.body_length
        if fr.is_response:
            assert int(p["couchbase.status"], 16) == fr.status
        else:
            assert int(p["couchbase.vbucket"], 16 if str(p["couchbase.vbucket"]).startswith("0x") else 10) == fr.vbucket
        # tshark guesses a collection id on every DCP key; with none negotiated the whole key is ours
        if d.key and fr.opcode != 0x57:
            assert p["couchbase.key"] == d.key_text
        if fr.opcode == 0x57:
            assert int(p["couchbase.extras.by_seqno"]) == d.extras["by_seqno"]


@needs_tshark
def test_tshark_stops_after_a_lost_segment_we_resync(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcap", [Conn(msgs=dcp_conversation(60))], mss=300, drop=[10])
    theirs = [p for p in tshark_frames(w.path) if int(p["couchbase.opcode"], 16) == 0x57]
    recs, _ = records(w.path)
    mine = [r for r in recs if r.event.type == "frame" and r.event.opcode == 0x57]  # type: ignore[attr-defined]
    assert len(mine) > len(theirs)  # a documented tshark defect: it cannot resync mid-PDU


def _split_pcap(src: Path, at: int, a: Path, b: Path) -> None:
    """Cut a pcap after ``at`` records into two files (a rotated capture)."""
    data = src.read_bytes()
    head, pos, n = data[:24], 24, 0
    cut = None
    while pos < len(data):
        caplen = struct.unpack_from("<I", data, pos + 8)[0]
        pos += 16 + caplen
        n += 1
        if n == at:
            cut = pos
    assert cut is not None
    a.write_bytes(data[:cut])
    b.write_bytes(head + data[cut:])


def test_rotated_captures_join_up(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "whole.pcap", [Conn(msgs=dcp_conversation(40))], mss=400)
    _split_pcap(w.path, w.packets // 2, tmp_path / "part1.pcap", tmp_path / "part2.pcap")
    st = CaptureStats()
    recs = list(read_records([str(tmp_path / "part1.pcap"), str(tmp_path / "part2.pcap")], stats=st))
    assert ours(recs, 1, "s2c") == truth(w, 0, "s2c")
    assert len(st.connections) == 1 and st.connections[0].lost == 0
    assert {r.file for r in recs} == {str(tmp_path / "part1.pcap"), str(tmp_path / "part2.pcap")}  # the file that completed each


# --- hostile headers: out-of-range times, lengths claiming more than the file ------


def _tables(paths: list[str]) -> tuple[list[object], CaptureStats, pa.Table, CaptureStats, pa.Table]:
    """Both paths: records (and the frames table built from them row by row), and the columnar table."""
    st_rows, st_cols = CaptureStats(), CaptureStats()
    recs = list(read_records(paths, stats=st_rows))
    by_rows = frames_table(recs)
    by_cols = pa.Table.from_batches(list(read_batches(paths, stats=st_cols, rows=3)), schema=SCHEMA)
    return recs, st_rows, by_rows, st_cols, by_cols


@pytest.mark.parametrize("name", ["pcapng_ts_out_of_range", "pcapng_bad_tsresol"])
def test_timestamp_out_of_range_is_a_problem_and_a_null_time(tmp_path: Path, name: str) -> None:
    bad = write_hostile_headers(tmp_path)
    path = str(bad[name])
    recs, st_rows, by_rows, st_cols, by_cols = _tables([path])
    assert len(recs) == 8  # every frame kept: the 14 records are all read
    for st in (st_rows, st_cols):
        info = st.files[path]
        assert info["error"] is None and info["packets"] == 14
        assert len(info["problems"]) == 1 and "timestamp out of range" in info["problems"][0] and "byte offset" in info["problems"][0]
    unknown = [r.ts == TS_UNKNOWN for r in recs]  # type: ignore[attr-defined]
    if name == "pcapng_ts_out_of_range":  # the 8th packet only
        assert unknown == [r.packet == 8 for r in recs] and any(unknown)  # type: ignore[attr-defined]
    else:  # every packet
        assert all(unknown) and "in 14 packets" in st_rows.files[path]["problems"][0]
    assert by_rows.equals(by_cols)
    ts = by_cols.column("ts").to_pylist()
    assert [t is None for t in ts] == [r.ts == TS_UNKNOWN for r in recs]  # type: ignore[attr-defined]
    assert [t is None for t in by_cols.column("ts_first").to_pylist()] == [r.ts_first == TS_UNKNOWN for r in recs]  # type: ignore[attr-defined]
    df = frames_df(path)
    assert len(df) == 8 and df["ts"].isna().tolist() == [t is None for t in ts]


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out, stdin=io.StringIO("")), out.getvalue()


@pytest.mark.parametrize("name", ["pcapng_ts_out_of_range", "pcapng_bad_tsresol"])
def test_cli_frames_with_out_of_range_timestamps(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write_hostile_headers(tmp_path / "bad")
    path = str(bad[name])
    nulls = 1 if name == "pcapng_ts_out_of_range" else 8
    code, out = _cli("frames", "--json", "--no-progress", path)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(rows) == 8 and sum(r["ts"] is None for r in rows) == nulls
    assert "timestamp out of range" in capsys.readouterr().err
    code, out = _cli("frames", "--no-progress", path)
    assert code == 0 and len(out.splitlines()) == 8
    assert _cli("frames", "--no-progress", "--parquet", str(tmp_path / "f.parquet"), path)[0] == 0
    table = pq.read_table(tmp_path / "f.parquet")
    assert table.num_rows == 8 and table.column("ts").null_count == nulls
    assert _cli("frames", "--no-progress", "--csv", str(tmp_path / "f.csv"), path)[0] == 0
    csv = pcsv.read_csv(tmp_path / "f.csv")
    assert csv.num_rows == 8 and csv.column("ts").null_count == nulls


def test_cli_show_and_summary_with_an_out_of_range_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write_hostile_headers(tmp_path / "bad")["pcapng_ts_out_of_range"])
    code, out = _cli("show", "--no-progress", path)
    heads = [line for line in out.splitlines() if line.startswith("== frame")]
    assert code == 0 and len(heads) == 8
    assert sum(" time ?  " in h for h in heads) == 1  # the unknown time is shown as such, not as a date in 1677
    assert all(re.search(r" time (\?|\d+\.\d{6})  ", h) for h in heads)
    err = capsys.readouterr().err
    assert err.count("timestamp out of range") == 1 and "frames before it were kept" not in err  # reading went on
    code, out = _cli("summary", "--no-progress", path)
    assert code == 0 and "timestamp out of range" in out + capsys.readouterr().err


@pytest.mark.parametrize("tsresol", [0, 1, 9, 10, 12, 0x7F, 0x80, 0x81, 0x9E, 0xA0, 0xFF])
def test_any_if_tsresol_is_exact_or_out_of_range(tmp_path: Path, tsresol: int) -> None:
    """Every 7-bit exponent of 10 or 2: the exact time (floored to ns), or a null time and a problem."""
    conn = Conn(msgs=[Msg("c2s", encode("DCP_NOOP", opaque=1)), Msg("s2c", encode("DCP_NOOP", response=True, opaque=1))])
    w = write_capture(tmp_path / "c.pcapng", [conn], fmt="pcapng", nanosecond=True)
    data = w.path.read_bytes()
    at = data.index(struct.pack("<HHB3x", 9, 1, 9))
    path = tmp_path / "r.pcapng"
    path.write_bytes(data[: at + 4] + bytes([tsresol]) + data[at + 5 :])
    base, exp = (2, tsresol & 0x7F) if tsresol & 0x80 else (10, tsresol)
    want = {f.number: f.ts_ns * 10**9 // base**exp for f in w.frames}  # the file holds ns ticks
    got = {p.number: p.ts for p in CaptureReader(str(path))}
    assert got == {n: t if t <= TS_MAX else TS_UNKNOWN for n, t in want.items()}
    recs, st, by_rows, _, by_cols = _tables([str(path)])
    assert by_rows.equals(by_cols) and len(recs) == 2
    assert bool(st.files[str(path)]["problems"]) == any(t > TS_MAX for t in want.values())


@pytest.mark.parametrize("nanosecond", [False, True])
def test_pcap_times_are_always_in_range(tmp_path: Path, nanosecond: bool) -> None:
    w = write_capture(tmp_path / "c.pcap", [Conn(msgs=[Msg("c2s", encode("DCP_NOOP", opaque=1))])], nanosecond=nanosecond)
    data = bytearray(w.path.read_bytes())
    for off, _ in pcap_records(bytes(data)):
        struct.pack_into("<II", data, off, 0xFFFFFFFF, 0xFFFFFFFF)  # the largest seconds and fraction
    w.path.write_bytes(bytes(data))
    recs, st, by_rows, _, by_cols = _tables([str(w.path)])
    assert st.files[str(w.path)]["problems"] == [] and recs and all(0 < r.ts <= TS_MAX for r in recs)  # type: ignore[attr-defined]
    assert by_rows.equals(by_cols) and by_cols.column("ts").null_count == 0


def _peak(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _good_pcapng(tmp_path: Path) -> bytes:
    conn = Conn(msgs=[Msg("c2s" if i % 2 else "s2c", encode("DCP_NOOP", opaque=i)) for i in range(4)])
    return write_capture(tmp_path / "good.pcapng", [conn], fmt="pcapng").path.read_bytes()


#: a block of each kind appended to a good pcapng, claiming more than the file holds
CLAIMS = {
    "shb": struct.pack("<IIIHHq", 0x0A0D0D0A, 0xFFFFFFFC, 0x1A2B3C4D, 1, 0, -1),
    "shb-max": struct.pack("<IIIHHq", 0x0A0D0D0A, MAX_RECORD, 0x1A2B3C4D, 1, 0, -1),
    "idb": struct.pack("<IIHHI", 1, MAX_RECORD, 1, 0, 65535),
    "epb": struct.pack("<IIIIIII", 6, MAX_RECORD, 0, 0, 0, MAX_RECORD - 32, MAX_RECORD - 32),
    "spb": struct.pack("<III", 3, MAX_RECORD, MAX_RECORD - 16),
    "other": struct.pack("<II", 0x0BAD, MAX_RECORD) + bytes(8),
}


def test_32_byte_pcapng_claiming_4_gib_reserves_nothing(tmp_path: Path) -> None:
    path = str(write_hostile_headers(tmp_path)["pcapng_shb_4gib"])
    st = CaptureStats()
    peak = _peak(lambda: list(read_records([path], stats=st)))
    assert peak < 8 << 20, peak
    err = st.files[path]["error"]
    assert err and "section header corrupt (block length 4294967292)" in err and "byte offset 0" in err


def test_pcap_record_claiming_256_mib_reserves_nothing(tmp_path: Path) -> None:
    path = str(write_hostile_headers(tmp_path)["pcap_record_256mib"])
    st = CaptureStats()
    recs: list[object] = []
    peak = _peak(lambda: recs.extend(read_records([path], stats=st)))
    assert peak < 8 << 20, peak
    info = st.files[path]
    assert info["packets"] == 14 and len(recs) == 8  # every record before it is kept
    assert info["problems"] == ["truncated record: 16 of 268435456 bytes: the capture was cut short (at byte offset 1204)"]


@pytest.mark.parametrize("kind", list(CLAIMS))
def test_pcapng_block_claiming_more_than_the_file_reserves_nothing(tmp_path: Path, kind: str) -> None:
    good = _good_pcapng(tmp_path)
    path = tmp_path / "claim.pcapng"
    path.write_bytes(good + CLAIMS[kind] + bytes(16))
    st = CaptureStats()
    recs: list[object] = []
    peak = _peak(lambda: recs.extend(read_records([str(path)], stats=st)))
    assert peak < 8 << 20, peak
    info = st.files[str(path)]
    assert info["error"] is None and info["packets"] == len(list(CaptureReader(str(tmp_path / "good.pcapng"))))
    assert len(recs) == 4  # what came before is kept
    left = len(CLAIMS[kind]) + 16
    want = "corrupt block: length 4294967292; reading stopped" if kind == "shb" else f"truncated block ({left} of {MAX_RECORD} bytes)"
    assert info["problems"] == [f"{want}{'' if kind == 'shb' else ': the capture was cut short'} (at byte offset {len(good)})"]


def test_long_reads_of_an_unknown_size_go_in_pieces(tmp_path: Path) -> None:
    """A file whose size is not known (a pipe): a claim is read a piece at a time, never reserved whole."""
    good = _good_pcapng(tmp_path)
    data = good + CLAIMS["epb"] + bytes(3 << 20)  # 3 MiB of the 256 MiB claimed
    reader = CaptureReader("pipe")  # size 0: not known
    packets: list[object] = []
    peak = _peak(lambda: packets.extend(reader._pcapng(io.BufferedReader(io.BytesIO(data)))))  # type: ignore[arg-type]
    assert len(packets) == 10 and peak < 12 << 20, peak
    assert reader.problems == [(len(good), f"truncated block ({len(data) - len(good)} of {MAX_RECORD} bytes): the capture was cut short")]


def test_read_error_keeps_what_was_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _good_pcapng(tmp_path)
    path = tmp_path / "c.pcapng"
    path.write_bytes(good)
    real_read = io.BufferedReader.read

    class Failing(io.BufferedReader):
        def read(self, n: int | None = -1) -> bytes:
            if self.tell() >= 300:
                raise OSError(5, "Input/output error")
            return real_read(self, n)

    monkeypatch.setattr(capture.Path, "open", lambda self, mode: Failing(io.FileIO(os.fspath(self))))
    reader = CaptureReader(str(path))
    packets = list(reader)
    assert packets and reader.problems and "read error (Input/output error); reading stopped" in reader.problems[0][1]


def test_a_bad_file_does_not_stop_the_others(tmp_path: Path) -> None:
    bad = write_bad_files(tmp_path / "bad") | write_hostile_headers(tmp_path / "hostile")
    good = [
        write_capture(tmp_path / f"good{i}.{fmt}", [Conn(client=(f"10.0.1.{i}", 40000 + i), msgs=dcp_conversation(6))], fmt=fmt).path
        for i, fmt in enumerate(("pcap", "pcapng"))
    ]
    paths = [str(good[0]), *(str(p) for p in bad.values()), str(good[1])]
    recs, st_rows, by_rows, st_cols, by_cols = _tables(paths)
    assert by_rows.equals(by_cols)
    assert st_rows.files == st_cols.files and list(st_rows.files) == paths
    for g in good:
        alone = [r.event.raw for r in read_records([str(g)])]  # type: ignore[attr-defined]
        assert [r.event.raw for r in recs if r.file == str(g)] == alone  # type: ignore[attr-defined]
        assert st_rows.files[str(g)]["problems"] == [] and st_rows.files[str(g)]["error"] is None
    for name in ("pcapng_shb_4gib", "text"):
        assert st_rows.files[str(bad[name])]["error"]
    for name in ("pcap_record_256mib", "pcapng_ts_out_of_range", "pcapng_bad_tsresol", "truncated_record"):
        assert st_rows.files[str(bad[name])]["problems"]


def test_one_path_may_be_given_alone() -> None:
    path = CAPTURES / "dcp-session.pcap"
    whole = [r.number for r in read_records([str(path)])]
    assert whole
    assert [r.number for r in read_records(str(path))] == whole
    assert [r.number for r in read_records(path)] == whole
