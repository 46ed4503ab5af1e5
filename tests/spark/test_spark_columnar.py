"""The Spark tasks on the columnar path, in process (no session): stage 2 against the per-packet reader, stage 3 against the single-process table.

Stage 2 (:func:`~dcpinspect.spark.stages.range_segments`) must give, row for
row, what :func:`~dcpinspect.capture.pcapfile.read_range` and
:func:`~dcpinspect.capture.packets.locate_segment` give.  Stage 3's tasks
(:func:`~dcpinspect.spark.passes.keys_task`, then
:func:`~dcpinspect.spark.frametable.frames_task` with the numbering they
made) must give the single-process frames table, whatever connections each
task holds, however small its windows.
"""

from __future__ import annotations

import gzip
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from paths import CAPTURES, THIRD_PARTY
from pcapfactory import Conn, Msg, rotate, write_bad_files, write_capture, write_hostile_headers

from dcpinspect import encode
from dcpinspect.capture.packets import locate_segment
from dcpinspect.capture.pcapfile import CaptureError, CaptureRange, CaptureReader, read_range
from dcpinspect.capture.sets import plan_capture_sets
from dcpinspect.flows import reassembly
from dcpinspect.flows.records import CaptureStats
from dcpinspect.spark import numbering
from dcpinspect.spark.frametable import frames_task, spark_batch
from dcpinspect.spark.numbering import CaptureEnd, Options, TaskSegments
from dcpinspect.spark.passes import keys_task, read_keys
from dcpinspect.spark.stages import GPOS_SHIFT, PACKED_INPUT, file_ends, range_packed, range_segments, split_file, status_rows
from dcpinspect.tables.columnar import decode_windows
from dcpinspect.tables.export import frames_table
from dcpinspect.tables.packets_vector import segment_windows

pytestmark = pytest.mark.spark

SHIPPED = sorted(str(p) for p in CAPTURES.glob("*.pcap"))


# --------------------------------------------------------------------------- stage 2


def reference_segments(fi: int, path: str, rng: CaptureRange) -> tuple[list[tuple[Any, ...]], str | None, Counter[str]]:
    """The segment rows of one range as the per-packet reader makes them; the error that stopped it; the skipped packets."""
    reader = CaptureReader(path)
    reader.packets = rng.first_packet - 1
    skipped: Counter[str] = Counter()
    rows = []
    error = None
    try:
        with open(path, "rb") as f:
            for pkt in read_range(reader, f, rng):
                found = locate_segment(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, path, skipped)
                if found is None:
                    continue
                seg, _tcp, at = found
                a, b = (seg.src, seg.sport), (seg.dst, seg.dport)
                lo, hi = (a, b) if a <= b else (b, a)
                ck = f"{lo[0]}|{lo[1]}|{hi[0]}|{hi[1]}"
                where = (fi << GPOS_SHIFT | pkt.number, ck, seg.ts)
                tcp = (seg.src, seg.sport, seg.dst, seg.dport, seg.seq, seg.flags)
                rows.append((*where, *tcp, pkt.data_offset + at, len(seg.payload), seg.missing))
    except CaptureError as exc:
        error = str(exc)
    return rows, error, skipped


_ROW = ("gpos", "ckey", "ts", "src", "sport", "dst", "dport", "seq", "flags", "poff", "plen", "missing")


def _same_packed(fi: int, path: str, ri: int, rng: CaptureRange, rows: list[dict[str, Any]]) -> None:
    """range_packed holds range_segments' rows: the segments packed a connection per row, the summaries and status alike."""
    packed = TaskSegments.of([range_packed(fi, path, ri, *rng).filter(pc.equal(range_packed(fi, path, ri, *rng)["kind"], 0))])
    segs = [r for r in rows if r["kind"] == 0]
    got = [
        (packed.addresses[s], sp, packed.addresses[d], dp, g, t, q, fl, po, pl, mi)
        for s, sp, d, dp, g, t, q, fl, po, pl, mi in zip(
            *(packed.cols[k].tolist() for k in ("src", "sport", "dst", "dport", "gpos", "ts", "seq", "flags", "poff", "plen", "missing")),
            strict=True,
        )
    ]
    want = [tuple(r[k] for k in ("src", "sport", "dst", "dport", "gpos", "ts", "seq", "flags", "poff", "plen", "missing")) for r in segs]
    assert got == want, (path, ri)
    others = [{k: v for k, v in r.items() if k != "blob"} for r in range_packed(fi, path, ri, *rng).to_pylist() if r["kind"] != 0]
    assert others == [r for r in rows if r["kind"] != 0]


def check_ranges(paths: list[str], split_size: int) -> int:
    """Every range's segments, errors and skipped counts equal the per-packet reader's; the ranges read."""
    n = 0
    for fi, path in enumerate(paths):
        for ri, rng in enumerate(split_file(path, split_size)):
            got = range_segments(fi, path, ri, *rng).to_pylist()
            _same_packed(fi, path, ri, rng, got)
            (status,) = [r for r in got if r["kind"] == 1]
            if not Path(path).exists():
                assert len(got) == 1 and "cannot open" in status["error"]
                continue
            want, error, skipped = reference_segments(fi, path, rng)
            assert [tuple(r[k] for k in _ROW) for r in got if r["kind"] == 0] == want, (path, ri)
            assert status["error"] == error, (path, ri)
            assert status["skipped"] == ",".join(f"{k}={v}" for k, v in sorted(skipped.items()))
            summaries = [r for r in got if r["kind"] == 2]
            assert sum(r["packets"] for r in summaries) == len(want)
            for r in summaries:  # where each connection was last seen in the range, and its weight
                mine = [w for w in want if w[1] == r["ckey"]]
                assert (r["gpos"], r["ts"], r["missing"]) == (mine[-1][0], mine[-1][2], sum(w[10] + 64 for w in mine))
            n += 1
    return n


def _pcapng_with_bad_section(tmp: Path) -> str:
    """A pcapng whose second section header is corrupt (its byte-order magic): the reader raises there, midway."""
    good = write_capture(tmp / "a.pcapng", [Conn(msgs=[Msg("c2s", encode("NOOP", opaque=i)) for i in range(6)])], fmt="pcapng")
    data = good.path.read_bytes()
    blen = struct.unpack_from("<I", data, 4)[0]
    shb = bytearray(data[:blen])
    shb[8:12] = b"\x01\x02\x03\x04"
    p = tmp / "bad-section.pcapng"
    p.write_bytes(data + bytes(shb) + data[blen:])
    return str(p)


@pytest.mark.parametrize("split_size", [1, 700, 1 << 30])
def test_range_segments_are_the_per_packet_readers(tmp_path: Path, split_size: int) -> None:
    w = write_capture(tmp_path / "c.pcapng", _conns(3), fmt="pcapng", mss=300, reorder=[5], drop=[9], duplicate=[12], non_tcp=3)
    v6 = write_capture(tmp_path / "v6.pcap", _conns(2), ipv6=True, linktype="sll", mss=200).path
    bad = [str(p) for p in write_bad_files(tmp_path / "bad").values()]
    hostile = [str(p) for p in write_hostile_headers(tmp_path / "hostile").values()]
    paths = [*SHIPPED, str(w.path), str(v6), *bad, *hostile, _pcapng_with_bad_section(tmp_path), str(tmp_path / "missing.pcap")]
    n = check_ranges(paths, split_size)
    assert n > len(paths) if split_size < 1000 else n == len(paths) - 1  # every file but the missing one read


@pytest.mark.shared
def test_range_segments_third_party() -> None:
    paths = sorted(str(p) for p in THIRD_PARTY.glob("*.pcap*"))
    if not paths:
        pytest.skip("no third-party captures here")
    check_ranges(paths, 64 << 10)


# --------------------------------------------------------------------------- stage 3


def _conns(k: int, n: int = 20) -> list[Conn]:
    out = []
    for i in range(k):
        msgs = [
            Msg("c2s", encode("DCP_OPEN", key=f"c{i}", extras={"flags": 1}, opaque=1)),
            Msg("s2c", encode("DCP_OPEN", response=True, opaque=1)),
            Msg("c2s", encode("DCP_STREAM_REQ", vbucket=i, opaque=7 + i, extras={"end_seqno": 2**64 - 1})),
            Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=7 + i, value=[(0xAB, 0)])),
        ]
        body = b"".join(
            encode("DCP_MUTATION", vbucket=i, opaque=7 + i, extras={"by_seqno": j + 1, "rev_seqno": 1}, key=f"k{j}", value=b'{"a":1}')
            for j in range(n)
        )
        msgs.append(Msg("s2c", body))
        out.append(Conn(client=(f"10.0.0.{10 + i}", 50000 + i), msgs=msgs, close=None if i % 3 == 2 else "fin"))
    return out


def task_data(paths: list[str], tasks: int, capture_sets: str = "one") -> tuple[list[pa.Table], CaptureEnd]:
    """The segment metadata of ``paths`` dealt to ``tasks`` tasks by connection, each in capture order, and the capture's end.

    ``paths`` are in the order of their capture sets (as the pipeline lists them).
    """
    plan = plan_capture_sets(paths, capture_sets)
    assert paths == [f for cs in plan for f in cs.files]
    file_set = tuple(cs.number for cs in plan for _f in cs.files) if len(plan) > 1 else ()
    every = pa.Table.from_batches([range_packed(fi, p, i, *r) for fi, p in enumerate(paths) for i, r in enumerate(split_file(p, 4096))])
    bases = CaptureEnd.file_bases(status_rows(every), file_set)
    segs = every.filter(pc.equal(every["kind"], 0))
    ends = every.filter(pc.equal(every["kind"], 2))  # each connection's last segment in each range
    last = CaptureEnd(0, 0, bases)
    if ends.num_rows:
        i = pc.index(ends["gpos"], pc.max(ends["gpos"])).as_py()
        set_ends = CaptureEnd.set_ends_of(file_ends(every), file_set) if file_set else ()
        last = CaptureEnd(int(ends["ts"][i].as_py()), int(ends["gpos"][i].as_py()), bases, file_set, set_ends)
    keys = sorted(set(segs["ckey"].to_pylist()))
    deal = pa.array([keys.index(k) % tasks for k in segs["ckey"].to_pylist()], pa.int32())
    return [segs.filter(pc.equal(deal, t)).sort_by("gpos").select(list(PACKED_INPUT)) for t in range(tasks)], last


def check_tasks(paths: list[str], tasks: int, rows: int = 65536, hole_wait: int | None = None, capture_sets: str = "one") -> int:
    """keys_task then frames_task over ``tasks`` tasks give the single-process table; its rows."""
    data, last = task_data(paths, tasks, capture_sets)
    o = Options(rows=rows, hole_wait=hole_wait)
    keys = pa.Table.from_batches([b for d in data for b in keys_task(d.to_batches(max_chunksize=50), paths, last, o)])
    num = read_keys(keys)[0]
    got = [b for d in data for b in frames_task(d.to_batches(max_chunksize=50), paths, last, o, num)]
    t = frames_table(paths, capture_sets=capture_sets)
    want = pa.Table.from_batches([spark_batch(b) for b in t.to_batches()]).to_pylist() if t.num_rows else []
    have = pa.Table.from_batches(got).sort_by("frame").to_pylist() if got else []
    assert len(have) == len(want) == num.frames
    for g, w in zip(have, want, strict=True):
        assert g == w, {k: (g[k], w[k]) for k in g if g[k] != w[k]}
    return len(want)


@pytest.mark.parametrize("tasks", [1, 2, 5])
def test_tasks_number_as_the_single_process_table(tmp_path: Path, tasks: int) -> None:
    w = write_capture(tmp_path / "c.pcap", _conns(5), mss=300, reorder=[5, 30], drop=[12], duplicate=[20], non_tcp=2)
    assert check_tasks([str(w.path)], tasks) > 100
    assert check_tasks(SHIPPED, tasks) > 100


@pytest.mark.parametrize("hole_wait", [1, 3, 40])
def test_tasks_place_rows_after_holes_as_the_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hole_wait: int) -> None:
    """Holes given up part-way (a few packets after they opened), over rotated files: each task places its rows as one process does."""
    monkeypatch.setattr(reassembly, "MAX_HOLE_WAIT", hole_wait)  # the single-process reference
    w = write_capture(tmp_path / "c.pcap", _conns(4), mss=200, reorder=[14, 25], drop=[5, 18, 30], duplicate=[20])
    files = rotate(w.path, 3)
    for tasks in (1, 2, 3):
        assert check_tasks(files, tasks, rows=11, hole_wait=hole_wait) > 80


@pytest.mark.parametrize("capture_sets", ["auto", "per-file"])
def test_tasks_number_capture_sets_as_the_single_process(tmp_path: Path, capture_sets: str) -> None:
    """Rotated files (holes, a connection open at the end) and the same 4-tuples again an hour later: each set apart, numbered on."""
    rot = rotate(write_capture(tmp_path / "c.pcap", _conns(4), mss=200, reorder=[14], drop=[5, 30], duplicate=[20]).path, 3)
    later = write_capture(tmp_path / "d.pcap", _conns(3), mss=300, drop=[7], ts0=1_700_003_600.0).path
    paths = [f for cs in plan_capture_sets([*rot, str(later)], capture_sets) for f in cs.files]
    for tasks in (1, 2, 3):
        assert check_tasks(paths, tasks, rows=13, capture_sets=capture_sets) > 80
    t = frames_table(paths, capture_sets=capture_sets)
    assert len(set(t.column("capture_set").to_pylist())) == (2 if capture_sets == "auto" else 4)


def test_tasks_read_a_gzipped_capture_as_the_single_process(tmp_path: Path) -> None:
    """A .pcap.gz is one range; the tasks read its payloads at offsets into the decompressed bytes, as the reader does."""
    w = write_capture(tmp_path / "c.pcap", _conns(3), mss=300, reorder=[5], drop=[12])
    gz = tmp_path / "c.pcap.gz"
    gz.write_bytes(gzip.compress(w.path.read_bytes()))
    assert check_tasks([str(gz)], 2) > 50


def test_a_connection_with_no_rows_keeps_its_id(tmp_path: Path) -> None:
    """A connection that emitted nothing (handshake and close only) still numbers the connections after it, from any task."""
    quiet = [Conn(client=("10.0.1.1", 41000 + i), msgs=[]) for i in range(2)]
    c = _conns(3)
    w = write_capture(tmp_path / "q.pcap", [c[0], quiet[0], c[1], quiet[1], c[2]], mss=300, interleave=False)
    for tasks in (1, 2, 3):
        check_tasks([str(w.path)], tasks)
    st = CaptureStats()
    known: dict[int, int] = {}
    rows = sum(
        p.batch.num_rows
        for p in decode_windows(lambda _f: segment_windows([str(w.path)], CaptureStats()), [str(w.path)], stats=st, known_at=known)
    )
    assert rows and len(st.connections) == 5 and sorted(known) == [1, 2, 3, 4, 5]  # the quiet ones too
    assert list(known.values()) == sorted(known.values())  # known in that order


def test_small_windows_and_spans_give_the_same_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of a few hundred bytes (one segment each, or more) and payloads read piece by piece: the same rows."""
    monkeypatch.setattr(numbering, "WINDOW", 700)
    monkeypatch.setattr(numbering, "GAP", 0)
    w = write_capture(tmp_path / "c.pcap", _conns(4), mss=250, drop=[7], duplicate=[15])
    a = write_capture(tmp_path / "a.pcap", _conns(2), mss=400).path
    assert check_tasks([str(a), str(w.path)], 2, rows=7) > 50


def test_rotated_and_bad_files(tmp_path: Path) -> None:
    bad = [str(p) for p in write_bad_files(tmp_path / "bad").values()]
    good = str(write_capture(tmp_path / "g.pcap", _conns(2, 5), mss=500).path)
    check_tasks([good, *bad, str(tmp_path / "missing.pcap")], 2)
