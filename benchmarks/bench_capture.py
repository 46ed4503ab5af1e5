"""Capture -> frames: dcpinspect against tshark, in CPU time, on the same generated capture in one run.

    python benchmarks/bench_capture.py [--frames 1000000] [--runs 3] [--big] [--keep DIR] [--quick] [--no-tshark]

Writes a pcap of N DCP_MUTATION frames (4 connections, interleaved segment by
segment, TCP segments cut every 1448 bytes without regard to frame
boundaries; about 175 MiB for 1M frames), then measures, each as CPU time
(user + sys; a child process's from ``getrusage(RUSAGE_CHILDREN)``), best of
``--runs`` runs, the runs interleaved so that a change of load hits every
measurement alike:

* tshark ``-T fields -e couchbase.opcode -e couchbase.vbucket`` with TCP
  desegmentation (Wireshark's couchbase dissector) - the reference;
* ``python -m dcpinspect frames CAPTURE --parquet OUT --no-progress``, a
  whole process, with JSON checking and with ``--no-json-check``
  (targets >= 5x and >= 8x tshark);
* the in-process table: ``dcpinspect.tables.columnar.read_batches``
  consumed (every column), with and without JSON checking (target >= 6x
  with);
* the streaming records, ``dcpinspect.capture.read.read_records``
  (target >= 4x);
* peak RSS (``VmHWM`` of the child, read at its exit) of the
  ``frames --parquet`` process on this capture and (``--big``) on one 12
  times larger, about 2 GiB: target flat, under 400 MiB;
* start-up, wall time, best of 5: ``python -m dcpinspect decode <DCP_NOOP
  hex>`` and ``dcpinspect summary captures/dcp-session.pcap`` (target < 0.5 s).

Every row gives tshark's figure from the same run and the ratio, and how
noisy the runs were: the CPU time's min/max over the runs and the range of
the per-run ratios (each run's figure against that run's tshark).  The
process and its children are pinned to one core.  ``--keep DIR`` writes the
captures there and reuses them in later runs (the 2 GiB one takes a few
minutes to write).

A benchmark, not a test: it prints and exits 0 (1 only when something failed
to run).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation

ROOT = Path(__file__).resolve().parents[1]
MSS = 1448
CONNS = 4
BIG = 12  # the --big capture has BIG times the frames (about 2 GiB for 1M)
STARTUP_RUNS = 5

# --------------------------------------------------------------------------- the capture


def _templates() -> list[bytes]:
    out = []
    for i in range(256):
        key = f"doc-{i:06d}"
        value = b'{"type":"beer","name":"n%d","abv":%d.%d,"notes":"%s"}' % (i, i % 13, i % 10, b"x" * (40 * (i % 4)))
        out.append(
            encode(
                "DCP_MUTATION",
                extras={"by_seqno": 1, "rev_seqno": 1},
                key=key,
                value=value,
                datatype=1,
                vbucket=i % 64,
                opaque=0x1000 + i % CONNS,
                cas=0x17A0C5E8F2B40000 + i,
            )
        )
    return out


def _segments(c: int, frames: int, templates: list[bytes]) -> Iterator[bytes]:
    """Connection ``c``'s stream (frames c, c + CONNS, ...; by_seqno = frame number + 1) cut every MSS bytes."""
    buf = bytearray()
    for n in range(c, frames, CONNS):
        t = templates[n % 256]
        buf += t[:24]
        buf += (n + 1).to_bytes(8, "big")
        buf += t[32:]
        if len(buf) >= MSS:
            cut = len(buf) - len(buf) % MSS
            for off in range(0, cut, MSS):
                yield bytes(buf[off : off + MSS])
            del buf[:cut]
    if buf:
        yield bytes(buf)


def write_capture(path: Path, frames: int) -> int:
    """Write ``frames`` mutations over CONNS interleaved connections (streamed: memory stays small); return the pcap's size."""
    templates = _templates()
    ts = 1_700_000_000_000_000_000
    tmp = path.with_name(path.name + ".part")
    with PcapWriter(tmp) as w:
        convs = [TcpConversation(w, (f"10.0.{c}.1", 40000 + c), ("10.0.0.2", 11210), mss=MSS) for c in range(CONNS)]
        for conv in convs:
            conv.open(ts)
            ts += 10_000
        segs = {c: _segments(c, frames, templates) for c in range(CONNS)}
        while segs:  # interleave the connections segment by segment
            for c in list(segs):
                chunk = next(segs[c], None)
                if chunk is None:
                    del segs[c]
                    continue
                ts = convs[c].send("s2c", chunk, ts)
        for conv in convs:
            conv.close(ts)
    os.replace(tmp, path)  # a capture cut short by an interrupt is never reused
    return path.stat().st_size


def capture(work: Path, frames: int) -> Path:
    path = work / f"mutations-{frames}.pcap"
    if path.exists():
        print(f"capture: {frames:,} mutations, {path.stat().st_size / 2**20:,.0f} MiB, reused {path}")
        return path
    t = time.perf_counter()
    size = write_capture(path, frames)
    print(f"capture: {frames:,} mutations, {CONNS} connections, {size / 2**20:,.0f} MiB, written in {time.perf_counter() - t:.1f}s: {path}")
    return path


# --------------------------------------------------------------------------- measuring


@dataclass
class Sample:
    cpu: float  # user + sys, seconds
    wall: float
    frames: int
    rss_mib: float | None = None


@dataclass
class Measure:
    label: str
    target: float | None  # ratio to tshark
    run: Callable[[], Sample]
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None

    def best(self) -> Sample:
        return min(self.samples, key=lambda s: s.cpu)


class Failed(Exception):
    pass


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


#: the children run with Python's bytecode cache, as an installed package does (pip compiles it at install time): an
#: environment with PYTHONDONTWRITEBYTECODE set (this machine's) would make every process compile the package again
#: (about 0.1 s); the cache goes to a directory of its own (PYTHONPYCACHEPREFIX), never into the source tree
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {
    "PYTHONPYCACHEPREFIX": str(Path(tempfile.gettempdir()) / "dcpinspect-bench-pycache")
}


def run_child(cmd: list[str], **kw: object) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``cmd`` to its end (in :data:`CHILD_ENV`); (the result, its CPU time, its wall time)."""
    c0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=CHILD_ENV, **kw)  # type: ignore[call-overload]
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if proc.returncode != 0:
        raise Failed(f"exit {proc.returncode}: {' '.join(cmd[:6])} ...: {proc.stderr.strip()[-400:]}")
    return proc, cpu, wall


def tshark(path: Path, exe: str) -> Sample:
    cmd = [exe, "-r", str(path), "-o", "tcp.desegment_tcp_streams:TRUE", "-d", "tcp.port==11210,couchbase"]
    cmd += ["-T", "fields", "-e", "couchbase.opcode", "-e", "couchbase.vbucket", "-E", "occurrence=a"]
    proc, cpu, wall = run_child(cmd)
    pdus = 0
    for line in proc.stdout.splitlines():
        ops = line.split("\t")[0]
        if ops:
            pdus += len(ops.split(","))
    return Sample(cpu, wall, pdus)


# ``python -m dcpinspect ...`` exactly (runpy, as -m does), reporting its VmHWM at exit: VmHWM, not
# ru_maxrss, which Linux carries over from the parent across fork and exec
_CLI = (
    "import atexit, runpy, sys\n"
    "def _hwm():\n"
    "    kb = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
    "    sys.stderr.write(f'\\nVmHWM-kB {kb}\\n')\n"
    "atexit.register(_hwm)\n"
    "sys.argv = ['dcpinspect'] + sys.argv[1:]\n"
    "runpy.run_module('dcpinspect', run_name='__main__', alter_sys=True)\n"
)


def frames_parquet(path: Path, out: Path, json_check: bool) -> Sample:
    cmd = [sys.executable, "-c", _CLI, "frames", str(path), "--parquet", str(out), "--no-progress"]
    if not json_check:
        cmd.append("--no-json-check")
    try:
        proc, cpu, wall = run_child(cmd)
    finally:
        out.unlink(missing_ok=True)
    rows = re.search(r"wrote (\d+) rows", proc.stderr)
    hwm = re.search(r"VmHWM-kB (\d+)", proc.stderr)
    if rows is None or hwm is None:
        raise Failed(f"frames --parquet: unexpected stderr {proc.stderr[-400:]!r}")
    return Sample(cpu, wall, int(rows.group(1)), int(hwm.group(1)) / 1024)


RSS_POLL = 0.01


@dataclass
class Rss:
    frames: int
    cpu: float
    hwm: float  # MiB: VmHWM at exit
    anon: float  # MiB: the highest RssAnon sampled
    file: float  # MiB: the highest RssFile sampled


def _status(pid: int) -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if k in ("RssAnon", "RssFile")}
    except (OSError, ValueError):
        return {}


def rss_profile(path: Path, out: Path) -> Rss:
    """``frames --parquet`` once, its RssAnon and RssFile sampled every RSS_POLL seconds."""
    cmd = [sys.executable, "-c", _CLI, "frames", str(path), "--parquet", str(out), "--no-progress"]
    anon = file = 0
    c0 = _children_cpu()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=CHILD_ENV)
        while proc.poll() is None:
            st = _status(proc.pid)
            anon, file = max(anon, st.get("RssAnon", 0)), max(file, st.get("RssFile", 0))
            time.sleep(RSS_POLL)
        err.seek(0)
        text = err.read()
    out.unlink(missing_ok=True)
    cpu = _children_cpu() - c0
    rows, hwm = re.search(r"wrote (\d+) rows", text), re.search(r"VmHWM-kB (\d+)", text)
    if proc.returncode or rows is None or hwm is None:
        raise Failed(f"frames --parquet: exit {proc.returncode}: {text[-400:]!r}")
    return Rss(int(rows.group(1)), cpu, int(hwm.group(1)) / 1024, anon / 1024, file / 1024)


def table(path: Path, json_check: bool) -> Sample:
    from dcpinspect.tables.columnar import read_batches

    c0, t0 = time.process_time(), time.perf_counter()
    n = 0
    for batch in read_batches([str(path)], json_check=json_check):
        n += batch.num_rows
    return Sample(time.process_time() - c0, time.perf_counter() - t0, n)


def records(path: Path) -> Sample:
    from dcpinspect.capture.read import read_records

    c0, t0 = time.process_time(), time.perf_counter()
    n = sum(1 for _ in read_records([str(path)]))
    return Sample(time.process_time() - c0, time.perf_counter() - t0, n)


def startup(cmd: list[str]) -> Sample:
    best: Sample | None = None
    for _ in range(STARTUP_RUNS):
        _, cpu, wall = run_child(cmd, cwd=ROOT)
        if best is None or wall < best.wall:
            best = Sample(cpu, wall, 0)
    assert best is not None
    return best


# --------------------------------------------------------------------------- report


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}x"


def report(measures: list[Measure], ts: Measure | None, runs: int) -> None:
    ts_ok = ts is not None and ts.samples and not ts.error
    print()
    print(f"CPU time (user+sys), best of {runs}; noise = CPU min-max over the runs; per-run = each run against that run's tshark")
    head = f"{'measurement':<44} {'frames':>10} {'CPU s':>7} {'wall s':>7} {'frames/s':>11} {'vs tshark':>9} {'target':>7} {'met':>4}  {'CPU min-max (spread)':<22} per-run ratio"
    print(head)
    print("-" * len(head))
    for m in measures:
        if m.error or not m.samples:
            print(f"{m.label:<44} FAILED: {m.error}")
            continue
        b = m.best()
        rate = b.frames / b.cpu
        ratio = per_run = None
        if ts_ok and ts is not None and m is not ts:
            tb = ts.best()
            ratio = rate / (tb.frames / tb.cpu)
            rr = [(s.frames / s.cpu) / (t.frames / t.cpu) for s, t in zip(m.samples, ts.samples, strict=False)]
            per_run = f"{min(rr):.1f}x-{max(rr):.1f}x"
        cpus = [s.cpu for s in m.samples]
        noise = f"{min(cpus):.2f}-{max(cpus):.2f} ({(max(cpus) / min(cpus) - 1) * 100:.0f}%)"
        met = "-" if m.target is None or ratio is None else ("yes" if ratio >= m.target else "NO")
        print(
            f"{m.label:<44} {b.frames:>10,} {b.cpu:>7.2f} {b.wall:>7.2f} {rate:>11,.0f} {_fmt_ratio(ratio) if m is not ts else '1.0x':>9}"
            f" {_fmt_ratio(m.target):>7} {met:>4}  {noise:<22} {per_run or '-'}"
        )


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--frames", type=int, default=1_000_000, help="mutations in the capture (default 1,000,000: about 175 MiB)")
    p.add_argument("--runs", type=int, default=3, help="best of this many runs (default 3)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 100,000 frames (and 1.2M with --big)")
    p.add_argument("--big", action="store_true", help=f"also peak RSS on a capture {BIG}x larger (about 2 GiB)")
    p.add_argument("--keep", metavar="DIR", help="write the captures here, keep them, and reuse them next time")
    p.add_argument("--no-tshark", action="store_true", help="do not run tshark (no ratios)")
    args = p.parse_args(argv)
    n = 100_000 if args.quick else args.frames
    runs = max(1, args.runs)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # children inherit it
    exe = None if args.no_tshark else shutil.which("tshark")
    tv = subprocess.run([exe, "--version"], check=False, capture_output=True, text=True).stdout.splitlines()[0] if exe else "no tshark"
    import numpy
    import pyarrow

    print(
        f"python {platform.python_version()}, numpy {numpy.__version__}, pyarrow {pyarrow.__version__}, {tv}; "
        f"{os.cpu_count()} cores, pinned to one; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"children: Python's bytecode cache on (in {CHILD_ENV['PYTHONPYCACHEPREFIX']}), as after an install; warmed by one run first")
    with tempfile.TemporaryDirectory() as warm:
        session = str(ROOT / "captures" / "dcp-session.pcap")
        run_child([sys.executable, "-m", "dcpinspect", "frames", session, "--parquet", f"{warm}/w.parquet", "--no-progress"])
        run_child([sys.executable, "-m", "dcpinspect", "summary", session])
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dcpinspect-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="dcpinspect-bench-out-"))
    failed = 0
    try:
        cap = capture(work, n)
        out = scratch / "frames.parquet"
        ts = Measure("tshark -T fields (opcode, vbucket)", None, lambda: tshark(cap, exe)) if exe else None
        measures = [ts] if ts else []
        parquet = [
            Measure("frames --parquet, process, JSON checked", 5, lambda: frames_parquet(cap, out, True)),
            Measure("frames --parquet, process, --no-json-check", 8, lambda: frames_parquet(cap, out, False)),
        ]
        measures += [
            *parquet,
            Measure("table in-process (read_batches), JSON checked", 6, lambda: table(cap, True)),
            Measure("table in-process, json_check=False", None, lambda: table(cap, False)),
            Measure("streaming records (read_records)", 4, lambda: records(cap)),
        ]
        for r in range(runs):
            for m in measures:
                if m.error:
                    continue
                try:
                    m.samples.append(m.run())
                except Exception as exc:  # a benchmark: report and go on
                    m.error = f"{type(exc).__name__}: {exc}"
            print(f"run {r + 1}/{runs} done, load average {os.getloadavg()[0]:.2f}", flush=True)
        report(measures, ts, runs)
        failed += sum(1 for m in measures if m.error)

        print()
        print("peak RSS of `dcpinspect frames --parquet` (one more run each, JSON checked; target flat, < 400 MiB)")
        print("  VmHWM counts the pages of the capture the reader maps (file-backed, reclaimable); anon is the process's own memory,")
        print(f"  sampled every {RSS_POLL * 1000:.0f} ms from outside (a peak shorter than that can be missed)")
        paths = [cap]
        if args.big:
            paths.append(capture(work, BIG * n))
        for path in paths:
            try:
                prof = rss_profile(path, out)
            except Exception as exc:
                failed += 1
                print(f"  {path.name}: FAILED: {exc}")
                continue
            print(
                f"  {path.stat().st_size / 2**20:>7,.0f} MiB capture, {prof.frames:>11,} rows: VmHWM {prof.hwm:,.0f} MiB;"
                f" peak RssAnon {prof.anon:,.0f} MiB, peak RssFile {prof.file:,.0f} MiB; {prof.cpu:.1f} s CPU, {prof.frames / prof.cpu:,.0f} frames/s"
            )
        hwm = [s.rss_mib or 0.0 for m in parquet for s in m.samples]
        if hwm:
            print(
                f"  (VmHWM over the timed runs on the {cap.stat().st_size / 2**20:,.0f} MiB capture: {min(hwm):,.0f}-{max(hwm):,.0f} MiB)"
            )

        print()
        print(f"start-up, wall time, best of {STARTUP_RUNS} (target < 0.5 s)")
        cli = Path(sys.executable).with_name("dcpinspect")  # the entry script itself, not a pyenv shim in front of it
        noop = encode("DCP_NOOP").hex()
        for label, cmd in [
            (f"python -m dcpinspect decode {noop}", [sys.executable, "-m", "dcpinspect", "decode", noop]),
            (
                "dcpinspect summary captures/dcp-session.pcap",
                [str(cli) if cli.exists() else "dcpinspect", "summary", "captures/dcp-session.pcap"],
            ),
        ]:
            try:
                s = startup(cmd)
                print(f"  {label:<78} {s.wall:.3f} s wall ({s.cpu:.3f} s CPU)  {'yes' if s.wall < 0.5 else 'NO'}")
            except Exception as exc:
                failed += 1
                print(f"  {label}: FAILED: {exc}")
        print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
