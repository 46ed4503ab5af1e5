"""``dcpinspect analyze``: the Spark pipeline's command line (Spark, numpy and pyarrow load only for it)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from ..wire.render import plural
from .command import Console
from .extras import require

__all__ = ["ARGUMENTS"]


def _analyze_arguments(ap: argparse.ArgumentParser) -> None:
    from ..spark.session import DEFAULT_CONNECT_TIMEOUT
    from ..spark.stages import DEFAULT_SPLIT_SIZE

    ap.description = (
        "Run the captures -> frames -> timelines pipeline on Spark; write parquet tables and an HTML report. "
        "Needs the spark extra (pip install 'dcpinspect[spark]'). Exits 1 when some input could not be read "
        "(after writing the rest), 2 when none exists or --out cannot be used."
    )
    ap.add_argument(
        "paths",
        nargs="+",
        help="capture files, globs or directories, read in order (local paths are resolved here, so relative ones work on a cluster)",
    )
    ap.add_argument("--out", required=True, help="output directory: parquet tables (frames/, file_status/, streams/, ...) and report.html")
    ap.add_argument("--master", help="Spark master (default: local[*]; leave out under spark-submit)")
    ap.add_argument("--remote", help="Spark Connect URL, e.g. sc://127.0.0.1:15002 (default: $SPARK_REMOTE)")
    ap.add_argument(
        "--connect-timeout",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long a Spark Connect server has to answer (default: {DEFAULT_CONNECT_TIMEOUT:g})",
    )
    ap.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per range of a big file")
    ap.add_argument("--partitions", type=int, help="connection partitions of the frames stage")
    ap.add_argument("--port", type=int, action="append", help="memcached server port (repeatable; default 11210, 11209, 11211)")
    ap.add_argument(
        "--items",
        action="store_true",
        help="also write the items and flow tables (one row per data message) and, from them, the questions' tables: "
        "key_versions, rollback_losses, rollback_lost_keys, progress and lag (exact)",
    )
    ap.add_argument("--no-report", action="store_true", help="do not write report.html")
    ap.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --out that is not an earlier analyze output, replacing entries named like its tables",
    )
    ap.set_defaults(func=_analyze)


def _analyze(args: argparse.Namespace, console: Console) -> int:
    """``dcpinspect analyze PATH... --out DIR [--master URL | --remote sc://...] [--split-size BYTES]``.

    Exits 2 before Spark starts when Spark is not installed, no input exists or
    ``--out`` cannot be used; 1 when some input could not be read (after the
    others are written); 0 otherwise.
    """
    require("analyze", "spark")
    from ..spark.analysis import OutputError, analyze, analyze_outputs, prepare_output
    from ..spark.numbering import DEFAULT_OPTIONS, Options
    from ..spark.session import ConnectTimeout, expand_paths, get_session

    out = console.out
    files = expand_paths(args.paths)  # local paths absolute: a cluster's executors do not share our working directory
    if not files:
        sys.stderr.write("dcpinspect: error: no capture files match\n")
        return 2
    missing = [p for p in files if "://" not in p and not os.path.exists(p)]
    if len(missing) == len(files):
        for p in missing:
            sys.stderr.write(f"dcpinspect: error: cannot open {_shown(p)}: no such file\n")
        return 2
    entries = analyze_outputs(items=args.items, report=not args.no_report)
    try:
        prepare_output(args.out, entries, overwrite=args.overwrite)  # refused before Spark starts
    except (OutputError, OSError) as exc:
        sys.stderr.write(f"dcpinspect: error: {_one_line(exc)}\n")
        return 2
    t0 = time.perf_counter()
    try:
        spark = get_session(args.remote, master=args.master, connect_timeout=args.connect_timeout)
    except ConnectTimeout as exc:
        # Spark's Connect client goes on retrying in threads that hold the process open for minutes: leave now
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
        sys.stderr.flush()
        out.flush()
        os._exit(2)
    except RuntimeError as exc:
        sys.stderr.write(f"dcpinspect: error: {_one_line(exc)}\n")
        return 2
    opts = Options(server_ports=tuple(args.port)) if args.port else DEFAULT_OPTIONS
    started = time.perf_counter() - t0
    res = analyze(
        spark,
        files,
        args.out,
        split_size=args.split_size,
        partitions=args.partitions,
        options=opts,
        items=args.items,
        report=not args.no_report,
        overwrite=args.overwrite,
    )
    counted = (("files", "file"), ("connections", "connection"), ("frames", "frame"), ("streams", "stream"), ("anomalies", "anomaly"))
    out.write(", ".join(plural(res[k], one, k) for k, one in counted) + f" -> {args.out}\n")
    if "questions" in res:
        out.write(_questions_line(res["questions"]))
    failed = 0
    for st in res["status"]:
        if st["status"] != "ok":
            reason = st["error"] or "; ".join(st["problems"])
            reason = reason.removeprefix(f"{st['path']}: ")  # the reader's message may name the file: name it once
            out.write(f"  {_shown(st['path'])}: {st['status']}: {reason}\n")
            failed += st["status"] == "error"
    out.write("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in {"session": started, **res["timings"]}.items()) + "\n")
    if failed:
        out.flush()
        sys.stderr.write(f"dcpinspect: error: {failed} of {res['files']} input files could not be read\n")
        return 1
    return 0


def _questions_line(n: dict[str, int]) -> str:
    """The questions' tables' row counts, one line."""
    return (
        f"questions: {plural(n['key_versions'], 'key version')}, {plural(n['rollback_losses'], 'rollback')} "
        f"({plural(n['rollback_lost_keys'], 'document')} cut), {plural(n['progress'], 'progress row')}, "
        f"{plural(n['lag'], 'lag series', 'lag series')}, "
        f"{plural(n.get('comparisons', 0), 'comparison row')} ({plural(n.get('comparisons_vbuckets', 0), 'compared vbucket pair')})\n"
    )


def _shown(path: str) -> str:
    """A path as a user would type it: relative to the working directory when it lies below it."""
    if "://" in path or not os.path.isabs(path):
        return path
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _one_line(exc: BaseException) -> str:
    """The first line of an error's message (Spark's errors carry a JVM stack trace)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"analyze": _analyze_arguments}
