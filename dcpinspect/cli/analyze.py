"""``dcpinspect analyze``: the Spark pipeline's command line (Spark, numpy and pyarrow load only for it)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from .command import Console

__all__ = ["ARGUMENTS"]


def _analyze_arguments(ap: argparse.ArgumentParser) -> None:
    from ..spark.session import DEFAULT_CONNECT_TIMEOUT
    from ..spark.stages import DEFAULT_SPLIT_SIZE

    ap.description = "Run the captures -> frames -> timelines pipeline on Spark; write parquet tables and an HTML report."
    ap.add_argument("paths", nargs="+", help="capture files, globs or directories (read in order, as one capture)")
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
    ap.add_argument("--items", action="store_true", help="also write the items and flow tables (one row per data message)")
    ap.add_argument("--no-report", action="store_true", help="do not write report.html")
    ap.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --out that is not an earlier analyze output, replacing entries named like its tables",
    )
    ap.set_defaults(func=_analyze)


def _analyze(args: argparse.Namespace, console: Console) -> int:
    """``dcpinspect analyze PATH... --out DIR [--master URL | --remote sc://...] [--split-size BYTES]``."""
    from ..spark.analysis import OutputError, analyze, analyze_outputs, prepare_output
    from ..spark.numbering import DEFAULT_OPTIONS, Options
    from ..spark.session import ConnectTimeout, expand_paths, get_session

    out = console.out
    if not expand_paths(args.paths):
        sys.stderr.write("dcpinspect: error: no capture files match\n")
        return 2
    entries = analyze_outputs(items=args.items, report=not args.no_report)
    try:
        prepare_output(args.out, entries, overwrite=args.overwrite)  # refused before Spark starts
    except OutputError as exc:
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
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
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
        return 2
    opts = Options(server_ports=tuple(args.port)) if args.port else DEFAULT_OPTIONS
    started = time.perf_counter() - t0
    res = analyze(
        spark,
        args.paths,
        args.out,
        split_size=args.split_size,
        partitions=args.partitions,
        options=opts,
        items=args.items,
        report=not args.no_report,
        overwrite=args.overwrite,
    )
    out.write(
        f"{res['files']} files, {res['connections']} connections, {res['frames']} frames, {res['streams']} streams, "
        f"{res['anomalies']} anomalies -> {args.out}\n"
    )
    for st in res["status"]:
        if st["status"] != "ok":
            reason = st["error"] or "; ".join(st["problems"])
            out.write(f"  {st['path']}: {st['status']}: {reason}\n")
    out.write("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in {"session": started, **res["timings"]}.items()) + "\n")
    return 0


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"analyze": _analyze_arguments}
