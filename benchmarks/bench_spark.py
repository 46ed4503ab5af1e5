"""The Spark pipeline (dcpinspect.spark) against the single-process path, on generated captures.

    python benchmarks/bench_spark.py [--mb 1024] [--keep DIR] [--cores 1,2] [--big-file [--conns 8]] [--spark-only] [--no-tshark]

Writes ``--mb`` MiB of captures (one big file of 40 % and six smaller ones,
4 interleaved connections each, the generator of ``bench_capture.py``; with
``--big-file`` one file of ``--mb`` MiB over ``--conns`` connections), then
measures in one run:

* the single-process paths over all files: the frames table
  (``columnar.read_batches``, what ``frames_table`` reads, streamed), the
  same written as parquet, the timeline (record by record: ``read_records`` +
  ``TimelineBuilder``; item runs in bulk: ``read_timeline``), and both in one
  decode (the columnar parts to parquet and to ``feed_parts``) - frames/s
  (``--spark-only`` skips them);
* a local Spark run per core count in a fresh process (``local[N]``): session
  start, an empty job, the first Python job; then ``analyze`` end to end
  (every table and ``report.html``; the number the issue asks for) with peak
  RSS of the whole process tree (driver JVM and Python workers) and of the
  largest Python worker; then the stages one by one on a new Pipeline (split
  + segments persisted, the status/sizes job, the one-decode frames write
  alone, the same with the timelines built, the driver's merge) - frames/s
  and the ratios to the single-process paths; with ``--dataframe`` also the
  frames DataFrame through Spark's parquet writer (keys + frames passes);
* tshark on the smallest file - frames/s, for the ratio.

A benchmark, not a test: it prints and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_capture import Failed, tshark, write_capture


def time_tshark(path: Path) -> tuple[float, int] | None:
    """(CPU seconds, frames) of tshark on ``path`` (bench_capture's command), or None without tshark."""
    import shutil

    exe = shutil.which("tshark")
    if exe is None:
        return None
    try:
        s = tshark(path, exe)
    except Failed as exc:
        print(f"tshark failed: {exc}")
        return None
    return s.cpu, s.frames


BYTES_PER_FRAME = 183  # bench_capture's mutations with TCP overhead, measured


def generate(directory: Path, mb: int, *, big_file: bool = False, conns: int = 8) -> list[Path]:
    total = mb * 1024 * 1024 // BYTES_PER_FRAME
    if big_file:
        import bench_capture

        p = directory / f"big-{mb}mb-{conns}conns.pcap"
        if not p.exists():
            bench_capture.CONNS = conns  # the generator's interleaved connections
            write_capture(p, total)
        return [p]
    sizes = [int(total * 0.4)] + [int(total * 0.1)] * 6
    paths = []
    for i, n in enumerate(sizes):
        p = directory / f"cap-{i:02d}.pcap"
        if not p.exists():
            write_capture(p, n)
        paths.append(p)
    return paths


def tree_rss() -> tuple[int, int]:
    """(sum of RSS of this process's descendants, largest python descendant) in bytes."""
    me = os.getpid()
    kids: dict[int, list[int]] = {}
    info: dict[int, tuple[int, str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            ppid, rss = int(parts[1]), int(parts[21]) * 4096
            with open(f"/proc/{d}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        kids.setdefault(ppid, []).append(int(d))
        info[int(d)] = (rss, comm)
    total, biggest, todo = 0, 0, list(kids.get(me, []))
    while todo:
        p = todo.pop()
        rss, comm = info.get(p, (0, ""))
        total += rss
        if comm.startswith("python"):
            biggest = max(biggest, rss)
        todo += kids.get(p, [])
    return total, biggest


def spark_run(paths: list[str], cores: int, split_size: int, out_dir: str, dataframe: bool) -> dict[str, float]:
    """One local Spark run in this process (called in a fresh child)."""
    peak = [0, 0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            t, b = tree_rss()
            peak[0], peak[1] = max(peak[0], t), max(peak[1], b)
            time.sleep(0.25)

    threading.Thread(target=sample, daemon=True).start()
    import dcpinspect.spark as sp
    from dcpinspect.spark.analysis import REPORT_ITEMS
    from dcpinspect.spark.frametable import write_dataframe

    out: dict[str, float] = {}
    t0 = time.perf_counter()
    spark = sp.get_session(cores=cores, memory="4g")
    out["session"] = time.perf_counter() - t0
    t = time.perf_counter()
    spark.range(1).count()
    out["empty_job"] = time.perf_counter() - t
    t = time.perf_counter()
    spark.createDataFrame([(1,)], "a int").mapInArrow(lambda it: it, "a int").count()
    out["first_python_job"] = time.perf_counter() - t
    t = time.perf_counter()
    res = sp.analyze(spark, paths, out_dir + "-analyze", split_size=split_size)  # the session's partitions, as the command uses
    out["analyze_end_to_end"] = time.perf_counter() - t
    t = time.perf_counter()
    sp.analyze(spark, paths, out_dir + "-analyze2", split_size=split_size)
    out["analyze_again"] = time.perf_counter() - t  # the same session once more: its JVM and workers warm
    out["frames"] = float(res["frames"])
    out["streams"] = float(res["streams"])
    out["peak_rss_tree_mb"] = peak[0] / 2**20
    out["peak_rss_python_worker_mb"] = peak[1] / 2**20
    # the stages one by one
    p = sp.Pipeline(spark, paths, split_size=split_size)
    t = time.perf_counter()
    out["segments"] = float(p.segments().count())
    out["split+segments"] = time.perf_counter() - t
    t = time.perf_counter()
    p.last()
    out["status+sizes"] = time.perf_counter() - t
    t = time.perf_counter()
    num, _ = p.write_frames(out_dir)
    out["frames+write"] = time.perf_counter() - t
    assert num.frames == res["frames"]
    t = time.perf_counter()
    p.write_frames(out_dir, build=True, max_items=REPORT_ITEMS)
    out["frames+timelines+write"] = time.perf_counter() - t
    t = time.perf_counter()
    p.timeline(max_items=REPORT_ITEMS)
    out["merge"] = time.perf_counter() - t
    out["pipeline"] = out["split+segments"] + out["status+sizes"] + out["frames+write"]
    out["analyze"] = out["split+segments"] + out["status+sizes"] + out["frames+timelines+write"] + out["merge"]
    if dataframe:
        p.by_connection().count()
        t = time.perf_counter()
        p.numbering()
        out["keys"] = time.perf_counter() - t
        t = time.perf_counter()
        write_dataframe(spark, p.frames(), out_dir + "-spark")
        out["frames+spark write"] = time.perf_counter() - t
    out["total"] = time.perf_counter() - t0
    stop.set()
    spark.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--keep", help="keep the captures in this directory (reused when present)")
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--split-size", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--dataframe", action="store_true", help="also time the frames DataFrame through Spark's writer (keys + frames passes)")
    ap.add_argument("--big-file", action="store_true", help="one capture of --mb MiB over --conns connections instead of seven files")
    ap.add_argument("--conns", type=int, default=8, help="connections of the --big-file capture")
    ap.add_argument(
        "--spark-only", action="store_true", help="skip the single-process measures (e.g. to time another checkout's Spark path)"
    )
    ap.add_argument("--no-tshark", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        cfg = json.loads(args.child)
        print(json.dumps(spark_run(cfg["paths"], cfg["cores"], cfg["split_size"], cfg["out"], cfg["dataframe"])))
        return 0
    directory = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-spark-"))
    directory.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    paths = generate(directory, args.mb, big_file=args.big_file, conns=args.conns)
    size = sum(p.stat().st_size for p in paths)
    print(f"captures: {len(paths)} files, {size / 2**20:.0f} MiB ({time.perf_counter() - t:.0f} s to write) in {directory}")
    single, dt_single, dt_single_pq, dt_tl, dt_fused = 0, 0.0, 0.0, 0.0, 0.0
    if not args.spark_only:
        single, dt_single, dt_single_pq, dt_tl, dt_fused = single_process([str(p) for p in paths], directory)
    fps_single = single / dt_single if dt_single else 0.0
    fps_both = single / dt_fused if dt_fused else 0.0

    small = min(paths, key=lambda p: p.stat().st_size)
    ts = None if args.no_tshark else time_tshark(small)
    fps_tshark = ts[1] / ts[0] if ts else None
    if ts:
        print(f"tshark on {small.name}: {ts[1]:,} frames in {ts[0]:.1f} s CPU = {fps_tshark:,.0f} frames/s")

    for cores in (int(c) for c in args.cores.split(",")):
        cfg = json.dumps(
            {
                "paths": [str(p) for p in paths],
                "cores": cores,
                "split_size": args.split_size,
                "out": str(directory / "out-frames"),
                "dataframe": args.dataframe,
            }
        )
        proc = subprocess.run([sys.executable, __file__, "--child", cfg], capture_output=True, text=True, check=False)
        if proc.returncode:
            print(f"local[{cores}]: failed\n{proc.stderr[-2000:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        assert not single or int(r["frames"]) == single, (r["frames"], single)
        if not single:  # --spark-only: the ratios to the single-process paths are left out
            print(
                f"local[{cores}]: session {r['session']:.1f} s; analyze end to end (no session): {r['analyze_end_to_end']:.1f} s = "
                f"{r['frames'] / r['analyze_end_to_end']:,.0f} frames/s; stages: split+segments {r['split+segments']:.1f} s, "
                f"status+sizes {r['status+sizes']:.1f} s, frames+write {r['frames+write']:.1f} s, "
                f"frames+timelines+write {r['frames+timelines+write']:.1f} s, merge {r['merge']:.1f} s",
                flush=True,
            )
            continue
        fps = r["frames"] / r["pipeline"]
        fps_an = r["frames"] / r["analyze_end_to_end"]
        fps_again = r["frames"] / r["analyze_again"]
        print(
            f"local[{cores}]: session {r['session']:.1f} s, empty job {r['empty_job']:.1f} s, first Python job {r['first_python_job']:.1f} s\n"
            f"  analyze end to end (no session; every table, report.html): {r['analyze_end_to_end']:.1f} s = {fps_an:,.0f} frames/s: "
            f"{fps_an / fps_both:.2f}x single process one decode ({dt_fused:.1f} s), "
            f"{fps_an * (dt_single_pq + dt_tl) / single:.2f}x single process frames parquet + timeline ({dt_single_pq + dt_tl:.1f} s)"
            f"{f', {fps_an / fps_tshark:.1f}x tshark' if fps_tshark else ''}; "
            f"peak RSS tree {r['peak_rss_tree_mb']:.0f} MiB, largest Python worker {r['peak_rss_python_worker_mb']:.0f} MiB\n"
            f"  analyze again in the same session (warm JVM and workers): {r['analyze_again']:.1f} s = "
            f"{fps_again / fps_both:.2f}x single process one decode"
            f"{f', {fps_again / fps_tshark:.1f}x tshark' if fps_tshark else ''}\n"
            f"  stages: split+segments {r['split+segments']:.1f} s, status+sizes {r['status+sizes']:.1f} s, "
            f"frames+timelines+write {r['frames+timelines+write']:.1f} s, merge {r['merge']:.1f} s; "
            f"frames table alone (frames+write {r['frames+write']:.1f} s): {fps:,.0f} frames/s ({fps / fps_single:.2f}x single process, "
            f"{fps * dt_single_pq / single:.2f}x single process + parquet"
            f"{f', {fps / fps_tshark:.1f}x tshark' if fps_tshark else ''})",
            flush=True,
        )
        if "keys" in r:
            fps_df = r["frames"] / (r["split+segments"] + r["status+sizes"] + r["keys"] + r["frames+spark write"])
            print(
                f"  DataFrame path: keys {r['keys']:.1f} s, frames + Spark's parquet writer {r['frames+spark write']:.1f} s: {fps_df:,.0f} frames/s"
            )
    return 0


def single_process(paths: list[str], directory: Path) -> tuple[int, float, float, float, float]:
    """The single-process paths: (frames, table s, table + parquet s, timeline s, table parquet + timeline in one decode s)."""
    import pyarrow.parquet as pq

    from dcpinspect.capture.read import read_records
    from dcpinspect.tables.columnar import read_batches, read_parts
    from dcpinspect.tables.frames_vector import SCHEMA
    from dcpinspect.tables.timeline_feed import feed_parts, read_timeline
    from dcpinspect.timeline import TimelineBuilder, build_timeline

    t = time.perf_counter()
    c = time.process_time()
    single = sum(b.num_rows for b in read_batches(paths))
    dt_single = time.perf_counter() - t
    print(
        f"single process (columnar read_batches = frames_table, streamed): {single:,} frames in {dt_single:.1f} s "
        f"({time.process_time() - c:.1f} s CPU) = {single / dt_single:,.0f} frames/s"
    )
    t = time.perf_counter()
    with pq.ParquetWriter(directory / "single-frames.parquet", SCHEMA) as w:
        for b in read_batches(paths):
            w.write_batch(b)
    dt_single_pq = time.perf_counter() - t
    print(f"single process + parquet write (pyarrow): {dt_single_pq:.1f} s = {single / dt_single_pq:,.0f} frames/s")
    t = time.perf_counter()
    build_timeline(read_records(paths))
    dt_records = time.perf_counter() - t
    print(f"single process timeline, record by record (read_records + TimelineBuilder): {dt_records:.1f} s")
    t = time.perf_counter()
    read_timeline(paths)
    dt_tl = time.perf_counter() - t
    print(f"single process timeline, item runs in bulk (read_timeline): {dt_tl:.1f} s ({dt_records / dt_tl:.2f}x record by record)")
    t = time.perf_counter()
    builder = TimelineBuilder()
    with pq.ParquetWriter(directory / "single-frames.parquet", SCHEMA) as w:
        for part in read_parts(paths):
            w.write_batch(part.batch)
            feed_parts([part], builder)
    builder.timeline()
    dt_fused = time.perf_counter() - t
    print(f"single process, one decode: frames parquet + timeline: {dt_fused:.1f} s = {single / dt_fused:,.0f} frames/s")
    return single, dt_single, dt_single_pq, dt_tl, dt_fused


if __name__ == "__main__":
    raise SystemExit(main())
