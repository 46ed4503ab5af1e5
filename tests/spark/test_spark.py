"""The Spark pipeline (dcpinspect.spark) against the single-process path, row for row.

One local SparkSession for the whole run (its fixed cost is paid once); tiny
captures; tiny split sizes so one file becomes many ranges.
"""

from __future__ import annotations

import html
import io
import itertools
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from paths import CAPTURES
from pcapfactory import Conn, Msg, rotate, write_bad_files, write_capture, write_hostile_headers

from dcpinspect import encode
from dcpinspect.capture.read import read_records
from dcpinspect.capture.sets import file_sets, plan_capture_sets
from dcpinspect.cli.main import main as cli_main
from dcpinspect.flows import reassembly
from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.export import frames_table
from dcpinspect.tables.timeline import timeline_frames
from dcpinspect.timeline import build_timeline

pytest.importorskip("pyspark")
if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
    pytest.skip("Spark needs Java 17: no java found", allow_module_level=True)

from dcpinspect.spark import frametable, numbering
from dcpinspect.spark.analysis import TIMELINE_TABLES, analyze, arrow_for_spark
from dcpinspect.spark.frametable import renumber_task, spark_batch
from dcpinspect.spark.numbering import KSHIFT, CaptureEnd, Numbering, Options
from dcpinspect.spark.passes import connection_places, keys_task, read_keys
from dcpinspect.spark.pipeline import Pipeline, register_data_source
from dcpinspect.spark.session import expand_paths
from dcpinspect.spark.stages import PACKED_INPUT, range_packed, split_file, status_rows
from dcpinspect.tables.schema import SPARK_SCHEMA

pytestmark = pytest.mark.spark

SHIPPED = sorted(str(p) for p in CAPTURES.glob("*.pcap"))
MUT = {"rev_seqno": 1, "flags": 0, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0}


def conversation(n: int, *, vb: int, opaque: int, collections: bool = False) -> list[Msg]:
    msgs = []
    if collections:
        feats = struct.pack(">H", 0x12)
        msgs += [
            Msg("c2s", encode("HELLO", key="t", value=feats, opaque=1)),
            Msg("s2c", encode("HELLO", response=True, value=feats, opaque=1)),
        ]
    msgs += [
        Msg("c2s", encode("DCP_OPEN", key="conn", extras={"flags": 1}, opaque=2)),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=2)),
        Msg("c2s", encode("DCP_STREAM_REQ", vbucket=vb, opaque=opaque, extras={"end_seqno": 2**64 - 1})),
        Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=opaque, value=[(0xFEEDDECA, 0)])),
    ]
    items = b""
    for i in range(n):
        items += encode(
            "DCP_MUTATION",
            vbucket=vb,
            opaque=opaque,
            extras={**MUT, "by_seqno": i + 1},
            key=f"doc-{i}",
            cid=8 if collections else None,
            value=b'{"a": %d}' % i if i % 3 else b"v" * (40 + 37 * i % 300),
            cas=2**64 - 1 - i,
        )
    msgs.append(Msg("s2c", items))
    return msgs


def conns(k: int, n: int = 40) -> list[Conn]:
    return [
        Conn(
            client=(f"10.0.0.{10 + i}", 50000 + i),
            msgs=conversation(n, vb=i, opaque=0x1000 + i, collections=bool(i % 2)),
            close=None if i % 3 == 2 else "fin",
        )
        for i in range(k)
    ]


def single_timeline(paths: list[str], mode: str = "auto") -> Any:
    """The single-process timeline of ``paths``, each capture set apart (as the pipeline plans them)."""
    plan = plan_capture_sets(paths, mode)
    return build_timeline(read_records(paths, capture_sets=plan), file_sets(plan))


def reference(paths: list[str], capture_sets: str = "auto") -> tuple[list[dict[str, Any]], CaptureStats]:
    st = CaptureStats()
    t = frames_table(paths, stats=st, capture_sets=capture_sets)
    ref = pa.Table.from_batches([spark_batch(b) for b in t.to_batches()]) if t.num_rows else None
    return (ref.to_pylist() if ref is not None else []), st


def check(
    spark: Any, paths: list[str], *, split_size: int, partitions: int, options: Options | None = None, capture_sets: str = "auto"
) -> Pipeline:
    more: dict[str, Any] = {"options": options} if options else {}
    p = Pipeline(spark, paths, split_size=split_size, partitions=partitions, capture_sets=capture_sets, **more)
    got = p.frames().orderBy("frame").toArrow().to_pylist()
    want, st = reference(expand_paths(paths), capture_sets)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == w, {k: (g[k], w[k]) for k in g if g[k] != w[k]}
    check_written(p, want)
    status = {r["path"]: r for r in p.status().toArrow().to_pylist()}
    for path, info in st.files.items():
        s = status[path]
        assert s["error"] == info["error"]
        assert s["problems"] == info["problems"]
        assert s["format"] == info["format"]
        assert s["packets"] == info["packets"]
        assert s["status"] == ("error" if info["error"] else "problems" if info["problems"] else "ok")
        assert s["capture_set"] == file_sets(st.sets)[path]
    return p


def check_written(p: Pipeline, want: list[dict[str, Any]]) -> None:
    """The one-decode write (what analyze runs) gives the same table as parquet, committed, temporaries gone, numbering kept."""
    import tempfile

    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "frames"
        (out / "stale.parquet").parent.mkdir()
        (out / "stale.parquet").write_bytes(b"left by an earlier run")
        num, picked = p.write_frames(str(out), sample=7)
        got = pq.read_table(out).sort_by("frame")
        assert got.schema == SPARK_SCHEMA
        assert got.to_pylist() == want
        assert num.frames == len(want)
        assert (out / "_SUCCESS").exists()
        assert not (out / "stale.parquet").exists()
        assert sorted(x.name for x in Path(d).iterdir()) == ["frames"]  # no temporary directory left
        assert picked is not None and 0 < len(picked) <= 7 if want else len(picked) == 0
        stride = -(-len(want) // 7) if want else 1
        picked_frames = [w["frame"] for w in want if (w["frame"] - 1) % stride == 0]

        def when(ts: Any) -> tuple[bool, int]:  # a null time (out of range in the capture) sorts first
            return (ts is not None, ts or 0)

        got_ts = picked.column("ts").to_pylist()
        want_ts = [None if want[f - 1]["ts"] is None else int(want[f - 1]["ts"].timestamp() * 10**6) * 1000 for f in picked_frames]
        assert sorted(got_ts, key=when) == sorted(want_ts, key=when)


def check_timelines(p: Pipeline, paths: list[str]) -> None:
    """Every timeline table of the pipeline equals the single-process one, row for row."""
    import pandas as pd

    got = p.timeline_tables()
    want = timeline_frames(single_timeline(expand_paths(paths)))
    assert set(got) == set(want)
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], obj=name)


def test_shipped_captures_match_single_process(spark: Any) -> None:
    p = check(spark, SHIPPED, split_size=2048, partitions=3)
    assert p.ranges().count() > len(SHIPPED)  # files were cut into several ranges
    check_timelines(p, SHIPPED)
    p.unpersist()


def test_timelines_whatever_the_partitions(spark: Any) -> None:
    p = Pipeline(spark, SHIPPED, split_size=10**9, partitions=1)
    check_timelines(p, SHIPPED)
    p.unpersist()


def test_timelines_from_the_one_decode_write(spark: Any, tmp_path: Path) -> None:
    """write_frames(build=True) - analyze's single decode - gives the single-process timelines, with or without thinned items."""
    p = Pipeline(spark, SHIPPED, split_size=4096, partitions=3)
    p.write_frames(str(tmp_path / "f"), build=True)
    check_timelines(p, SHIPPED)
    p.write_frames(str(tmp_path / "f"), build=True, max_items=3)
    full = timeline_frames(single_timeline(expand_paths(SHIPPED)))
    thin = p.timeline_tables(max_items=3)
    assert thin["streams"]["items"].tolist() == full["streams"]["items"].tolist()  # true counts
    assert all(len(s.items) <= 3 for s in p.timeline(max_items=3).streams)
    p.unpersist()


def test_no_frames_still_writes_a_readable_table(spark: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    empty = write_capture(tmp_path / "e.pcap", [], mss=500).path
    p = Pipeline(spark, [str(empty)], partitions=2)
    num, picked = p.write_frames(str(tmp_path / "f"), sample=10)
    assert num.frames == 0
    assert picked is not None and picked.num_rows == 0
    t = pq.read_table(tmp_path / "f")
    assert t.num_rows == 0 and t.schema == SPARK_SCHEMA
    assert spark.read.parquet(str(tmp_path / "f")).count() == 0
    p.unpersist()


def _stream(
    vb: int, opaque: int, *, start: int, uuid: int, log: list[tuple[int, int]] | None, rollback: int | None, items: int
) -> list[Msg]:
    msgs = [
        Msg("c2s", encode("DCP_OPEN", key=f"c{opaque}", extras={"flags": 1}, opaque=1)),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=1)),
        Msg(
            "c2s",
            encode("DCP_STREAM_REQ", vbucket=vb, opaque=opaque, extras={"start_seqno": start, "vb_uuid": uuid, "end_seqno": 2**64 - 1}),
        ),
    ]
    if rollback is not None:
        msgs.append(Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=opaque, status=0x23, value={"rollback_seqno": rollback})))
        return msgs
    msgs.append(Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=opaque, value=log)))
    body = encode("DCP_SNAPSHOT_MARKER", vbucket=vb, opaque=opaque, extras={"start_seqno": 1, "end_seqno": items, "flags": 1})
    for i in range(items):
        body += encode("DCP_MUTATION", vbucket=vb, opaque=opaque, extras={**MUT, "by_seqno": i + 1}, key=f"k{i}", value=b"v")
    msgs.append(Msg("s2c", body))
    return msgs


def test_timelines_cross_connection(spark: Any, tmp_path: Path) -> None:
    """A rollback on one connection is explained from the failover log and seqnos another connection saw."""
    a = Conn(client=("10.0.0.1", 40001), msgs=_stream(0, 7, start=0, uuid=0, log=[(0xAB, 0)], rollback=None, items=30))
    b = Conn(client=("10.0.0.2", 40002), msgs=_stream(0, 9, start=90, uuid=0xAB, log=None, rollback=30, items=0))
    c = Conn(client=("10.0.0.3", 40003), msgs=_stream(0, 11, start=0, uuid=0, log=[(0xCD, 25), (0xAB, 0)], rollback=None, items=3))
    paths = [str(write_capture(tmp_path / "x.pcap", [a, b, c], mss=200).path)]
    p = Pipeline(spark, paths, split_size=300, partitions=3)
    check_timelines(p, paths)
    t = p.timeline()
    assert len(t.branches[0]) == 2  # merged from two connections' logs
    rb = next(at for s in t.streams for at in s.attempts if at.outcome == "rollback")
    assert not rb.explanation.startswith("cannot replay")  # the other connection's log was used
    p.unpersist()


@pytest.mark.parametrize(("fmt", "split_size", "partitions"), [("pcap", 1, 1), ("pcap", 3000, 4), ("pcapng", 700, 2)])
def test_big_file_many_ranges(spark: Any, tmp_path: Path, fmt: str, split_size: int, partitions: int) -> None:
    w = write_capture(tmp_path / f"big.{fmt}", conns(4), fmt=fmt, mss=300, reorder=[5, 30], drop=[12], duplicate=[20], non_tcp=4)
    ranges = split_file(str(w.path), split_size)
    assert len(ranges) > 5
    assert ranges[0][0] in (0, 24) and ranges[-1][1] == w.path.stat().st_size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    check(spark, [str(w.path)], split_size=split_size, partitions=partitions).unpersist()


def test_rotated_captures_join_up(spark: Any, tmp_path: Path) -> None:
    w = write_capture(tmp_path / "rot.pcap", conns(3), mss=400)
    files = rotate(w.path, 3)
    check(spark, files, split_size=1500, partitions=2).unpersist()


def test_capture_sets_read_apart_as_the_single_process(spark: Any, tmp_path: Path) -> None:
    """Rotated files (one set, holes and an open connection at its end) and, an hour later, the same 4-tuples again (another set)."""
    rot = rotate(write_capture(tmp_path / "one.pcap", conns(3), mss=300, drop=[4, 30]).path, 2)
    later = str(write_capture(tmp_path / "two.pcap", conns(3), mss=300, drop=[7], ts0=1_700_003_600.0).path)
    paths = [later, *rot]
    p = check(spark, paths, split_size=1500, partitions=2)
    assert [cs.files for cs in p.sets] == [(later,), tuple(rot)]
    frames = p.frames().select("frame", "capture_set", "set_frame", "conn_id").orderBy("frame").toArrow()
    assert sorted(set(frames.column("conn_id").to_pylist())) == list(range(1, 7))  # the same 4-tuples in two sets: six connections
    st = CaptureStats()
    list(read_records(paths, stats=st))
    assert p.set_first() == st.set_first and p.timeline().set_first == st.set_first and len(st.set_first) == 2
    check_timelines(p, paths)
    p.unpersist()
    check(spark, paths, split_size=1500, partitions=2, capture_sets="per-file").unpersist()


def test_holes_given_up_part_way_over_rotated_files(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Holes waited for two packets only: Spark's tasks place the rows after them as the single process does."""
    monkeypatch.setattr(reassembly, "MAX_HOLE_WAIT", 2)  # the single-process reference (the tasks get it as an option)
    w = write_capture(tmp_path / "holes.pcap", conns(3), mss=300, drop=[4, 17, 30], reorder=[9])
    check(spark, rotate(w.path, 3), split_size=1500, partitions=2, options=Options(hole_wait=2)).unpersist()


def test_bad_files_are_reported_and_never_fail_the_job(spark: Any, tmp_path: Path) -> None:
    bad = write_bad_files(tmp_path / "bad")
    hostile = write_hostile_headers(tmp_path / "hostile")  # absurd lengths; packet times past 2262 (null ts, one problem per file)
    good = write_capture(tmp_path / "good.pcap", conns(2, 10), mss=500).path
    paths = [str(good), *(str(p) for p in bad.values()), *(str(p) for p in hostile.values()), str(tmp_path / "missing.pcap")]
    p = check(spark, paths, split_size=200, partitions=2)
    status = {r["path"]: r["status"] for r in p.status().collect()}
    assert status[str(hostile["pcapng_bad_tsresol"])] == "problems"
    assert status[str(good)] == "ok"
    assert status[str(bad["text"])] == "error"
    assert status[str(bad["truncated_record"])] == "problems"
    assert status[str(tmp_path / "missing.pcap")] == "error"
    p.unpersist()


def test_data_source(spark: Any) -> None:
    register_data_source(spark)
    df = spark.read.format("dcpinspect").load(",".join(SHIPPED[:3]))
    want, _ = reference(SHIPPED[:3])
    assert df.orderBy("frame").toArrow().to_pylist() == want
    segs = spark.read.format("dcpinspect").option("table", "segments").option("split_size", "1024").load(SHIPPED[0])
    assert segs.filter("kind = 0").count() > 0
    st = spark.read.format("dcpinspect").option("table", "status").load(SHIPPED[0] + "," + __file__).collect()
    assert [r["status"] for r in st] == ["ok", "error"]


def test_analyze_command(spark: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    hostile = "<script>alert('x')</script>&"
    msgs = conversation(5, vb=3, opaque=0x77)
    msgs[0] = Msg("c2s", encode("DCP_OPEN", key=hostile, extras={"flags": 1}, opaque=2))
    good = str(write_capture(tmp_path / "good.pcap", [Conn(msgs=msgs)], mss=300).path)
    bad = write_bad_files(tmp_path / "bad")
    paths = [SHIPPED[1], good, str(bad["text"]), str(bad["truncated_record"])]
    out = io.StringIO()
    assert cli_main(["analyze", *paths, "--out", str(tmp_path / "o"), "--split-size", "4096"], out=out) == 1  # an input failed
    assert "frames" in out.getvalue()
    o = tmp_path / "o"
    want_frames, _ = reference(paths)
    assert spark.read.parquet(str(o / "frames")).orderBy("frame").toArrow().to_pylist() == want_frames
    status = {r["path"]: r["status"] for r in pq.read_table(o / "file_status").to_pylist()}
    assert status == {SHIPPED[1]: "ok", good: "ok", str(bad["text"]): "error", str(bad["truncated_record"]): "problems"}
    want = timeline_frames(single_timeline(paths))
    for name in TIMELINE_TABLES:
        t = pq.read_table(o / name)
        assert t.to_pylist() == arrow_for_spark(want[name]).to_pylist(), name
    page = (o / "report.html").read_text()
    assert hostile not in page
    assert html.escape(hostile, quote=True) in page
    assert "data:image/png;base64," in page
    assert "not a pcap or pcapng capture" in page


def test_analyze_items_and_flow(spark: Any, tmp_path: Path) -> None:
    """With items=True the items and flow tables (one row per data message and ack) equal the single-process ones."""
    import pyarrow.parquet as pq

    paths = sorted(str(p) for p in CAPTURES.glob("live-*.pcap"))
    res = analyze(spark, paths, str(tmp_path / "o"), split_size=4096, partitions=3, items=True, report=False)
    want = timeline_frames(single_timeline(paths))
    assert len(want["items"]) > 100 and len(want["flow"]) > 100
    for name, order in (("items", ["stream", "frame"]), ("flow", ["frame", "event"])):
        got = pq.read_table(tmp_path / "o" / name).sort_by([(c, "ascending") for c in order])
        ref = arrow_for_spark(want[name]).sort_by([(c, "ascending") for c in order])
        assert got.schema == ref.schema, name
        assert got.to_pylist() == ref.to_pylist(), name
    assert res["frames"] == len(reference(paths)[0])


def test_spark_connect(tmp_path: Path) -> None:
    """The same pipeline through Spark Connect (a local Connect server started from the installed pyspark)."""
    code = f"""
import sys
import dcpinspect.spark as sp
try:
    s = sp.get_session("local[2]")
except Exception as exc:
    print("NO-CONNECT", exc); sys.exit(0)
p = sp.Pipeline(s, {SHIPPED[:2]!r}, split_size=2048, partitions=2)
print("ROWS", p.frames().count(), len(p.timeline().streams), type(s).__module__)
res = sp.analyze(s, {SHIPPED[:2]!r}, {str(tmp_path / "o")!r}, split_size=2048, partitions=2, items=True)
print("ANALYZE", res["frames"], res["streams"])
"""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env, check=False)
    if "NO-CONNECT" in r.stdout:
        pytest.skip(f"a local Spark Connect server cannot start here: {r.stdout.strip()}")
    assert r.returncode == 0, r.stderr[-3000:]
    rows, streams = (int(v) for v in r.stdout.split("ROWS")[1].split()[:2])
    assert rows == len(reference(SHIPPED[:2])[0])
    assert streams == len(single_timeline(SHIPPED[:2]).streams)
    assert "connect" in r.stdout
    import pyarrow.parquet as pq

    frames, streams = (int(v) for v in r.stdout.split("ANALYZE")[1].split()[:2])
    want = timeline_frames(single_timeline(SHIPPED[:2]))
    assert (frames, streams) == (len(reference(SHIPPED[:2])[0]), len(want["streams"]))
    assert pq.read_table(tmp_path / "o" / "frames").sort_by("frame").to_pylist() == reference(SHIPPED[:2])[0]
    for name in (*TIMELINE_TABLES, "items"):  # written through Spark here (the client is not the cluster), empty ones too
        got = pq.read_table(tmp_path / "o" / name)
        ref = arrow_for_spark(want[name])
        assert got.num_rows == ref.num_rows, name
    assert len(want["stalls"]) == 0  # the case Connect could not infer a schema for (written, readable, empty)


def _in_process(paths: list[str]) -> tuple[pa.Table, CaptureEnd]:
    """The segment metadata of ``paths`` by connection, in capture order, and the capture end - as by_connection gives a task."""
    import pyarrow.compute as pc

    tables = []
    for fi, path in enumerate(paths):
        tables += [range_packed(fi, path, i, *r) for i, r in enumerate(split_file(path, 1 << 30))]
    every = pa.Table.from_batches(tables)
    segs = every.filter(pc.equal(every["kind"], 0)).sort_by([("ckey", "ascending"), ("gpos", "ascending")])
    ends = every.filter(pc.equal(every["kind"], 2))
    top = pc.max(ends["gpos"]).as_py()
    last = CaptureEnd(int(ends["ts"][pc.index(ends["gpos"], top).as_py()].as_py()), int(top), CaptureEnd.file_bases(status_rows(every)))
    return segs.select(list(PACKED_INPUT)), last


def test_items_written_in_small_batches_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """analyze --items' task side in process: items and flow in many tiny batches and files, renumbered, equal single process."""
    import pyarrow.parquet as pq

    monkeypatch.setattr(frametable, "_BATCH", 3)
    monkeypatch.setattr(frametable, "TMP_ROWS", 7)
    paths = sorted(str(p) for p in CAPTURES.glob("live-*.pcap"))
    data, last = _in_process(paths)
    keys = pa.Table.from_batches(
        list(
            keys_task(
                data.to_batches(max_chunksize=11), paths, last, Options(rows=9), build=True, max_items=2, items_to=str(tmp_path / "t")
            )
        )
    )
    num, parts, files = read_keys(keys)
    assert len(files["items"]) > 10 and len(files["flow"]) > 10
    outs = {"items": str(tmp_path / "items"), "flow": str(tmp_path / "flow")}
    for d in outs.values():
        Path(d).mkdir()
    born = sorted(k for part in parts for k, _ in part.streams)
    streams = {(k >> KSHIFT, k & ((1 << KSHIFT) - 1)): i for i, k in enumerate(born)}
    todo = [(i, path, table) for i, (path, table) in enumerate((p, t) for t in outs for p, _ in files[t])]
    batch = pa.RecordBatch.from_pydict({"index": [t[0] for t in todo], "path": [t[1] for t in todo], "table": [t[2] for t in todo]})
    list(renumber_task([batch], num, outs, 0, streams, connection_places(parts, num, paths, last)))
    want = timeline_frames(single_timeline(paths, "one"))  # one task's segments of every file, as one capture set
    for name, order in (("items", ["stream", "frame"]), ("flow", ["frame", "event"])):
        got = pq.read_table(outs[name]).sort_by([(c, "ascending") for c in order])
        assert got.to_pylist() == arrow_for_spark(want[name]).sort_by([(c, "ascending") for c in order]).to_pylist(), name
    assert all(len(cols[0]) <= 2 for part in parts for cols in part.item_columns or () if cols)  # the parts stay thin


def test_counts_packed_in_blocks_number_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys table's packed counts (many blocks, or one) give the same numbering; in process, no session."""
    import pyarrow.compute as pc

    path = str(write_capture(tmp_path / "c.pcap", conns(4, 30), mss=300).path)
    data, last = _in_process([path])

    def numbered() -> tuple[Numbering, int]:
        out = pa.Table.from_batches(list(keys_task(data.to_batches(max_chunksize=7), [path], last, Options(rows=5))))
        return read_keys(out)[0], pc.sum(pc.equal(out["kind"], 0)).as_py()

    one, blocks_one = numbered()
    monkeypatch.setattr(numbering, "COUNT_BLOCK", 3)
    many, blocks_many = numbered()
    assert blocks_one == 1 and blocks_many > 5
    assert one.frames == many.frames == len(reference([path])[0])
    assert one.keys.tolist() == many.keys.tolist() and one.base.tolist() == many.base.tolist()
    assert one.conn_ids == many.conn_ids
