"""``dcpinspect lag``: how far behind each consumer is, per vbucket (the tables of :mod:`dcpinspect.tables.progress`).

Rules:

1. One read of the captures: the parts feed the timeline, their frame
   numbers, capture sets and times are kept, and their GET_ALL_VB_SEQNOS and
   STAT answers are dissected for the high seqnos they report.
2. Text: the worst series first (``--top N``, default 10) under a ``== lag``
   line saying how many are shown of how many, each with its worst lag in
   items and in seconds, when (seconds since the first frame), and its lag at
   the end of the capture.  ``--vbucket V`` keeps that vbucket's series
   and adds its progress rows under a ``== progress`` line.
3. ``--json``: one object per row, its ``table`` key ``lag`` (a summary
   row) or ``progress``; times as seconds since the epoch, missing values null.
4. Wire text (consumer names) is escaped; no stream at all, or none of the
   asked vbucket, is a one-line error and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..flows.records import CaptureStats
from ..wire.render import plural, safe_text
from .capture import capture_arguments, read_capture_parts, report_files, timeline_builder
from .command import CliError, Console

__all__ = ["ARGUMENTS", "text_progress", "text_summary"]


def text_summary(summary: Any, series: int, t0: Any) -> str:
    """The summary as text: a title line saying how many series are shown, then the rows (times: seconds since ``t0``)."""
    head = f"== lag: the {plural(len(summary), 'series', 'series')} furthest behind, of {series:,}"
    if summary.empty:
        return head + "\n  (none)\n"
    return f"{head} (at_s: when the worst lag in items was seen, seconds since the first frame)\n{summary_text(summary, t0)}\n"


def summary_text(summary: Any, t0: Any) -> str:
    """The rows of a summary as an aligned text table."""
    from ..tables.progress import SUMMARY_TEXT, text_table

    return text_table(summary, SUMMARY_TEXT, t0, safe_text)


def text_progress(rows: Any, vbucket: int, t0: Any) -> str:
    """One vbucket's progress rows as text under their title line."""
    head = f"== progress of vbucket {vbucket}: {plural(len(rows), 'row')} (at_s: seconds since the first frame)"
    if rows.empty:
        return head + "\n  (none)\n"
    from ..tables.progress import PROGRESS_TEXT, text_table

    return f"{head}\n{text_table(rows, PROGRESS_TEXT, t0, safe_text)}\n"


def _json_lines(table: str, df: Any) -> str:
    from ..tables.stats import json_records

    return "".join(json.dumps({"table": table, **row}) + "\n" for row in json_records(df))


def _lag(args: argparse.Namespace, console: Console) -> int:
    from ..tables.progress import lag_summary, lag_tables, progress

    if args.top is not None and args.top < 1:
        raise CliError(f"--top {args.top}: give 1 or more")
    if args.vbucket is not None and not 0 <= args.vbucket < 1 << 16:
        raise CliError(f"--vbucket {args.vbucket}: a vbucket is 0-65535")
    stats = CaptureStats()
    frames, tables = lag_tables(read_capture_parts(args, stats), timeline_builder(args))
    bad = report_files(stats)
    if bad == len(stats.files):
        return 1
    rows = progress(frames, tables)
    if args.vbucket is not None:
        rows = rows[rows["vbucket"] == args.vbucket].reset_index(drop=True)
    if rows.empty:
        what = "no DCP stream in the capture" if args.vbucket is None else f"no DCP stream of vbucket {args.vbucket} in the capture"
        sys.stderr.write(f"dcpinspect: error: {what}\n")
        return 1
    every = lag_summary(rows, None)
    summary = every.head(args.top).reset_index(drop=True)
    out = console.out
    if args.json:
        out.write(_json_lines("lag", summary))
        if args.vbucket is not None:
            out.write(_json_lines("progress", rows))
        return 1 if bad else 0
    ts = frames["ts"].dropna()
    t0 = ts.min() if len(ts) else None
    out.write(text_summary(summary, len(every), t0))
    if args.vbucket is not None:
        out.write("\n" + text_progress(rows, args.vbucket, t0))
    return 1 if bad else 0


def _lag_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "How far behind each consumer is: per vbucket and consumer (connection, stream id), its last seqno against the "
        "producer's high seqno as last seen (GET_ALL_VB_SEQNOS, STAT vbucket-seqno, snapshot markers, SEQNO_ADVANCED, "
        "stream requests), the lag in items and in seconds; the worst first."
    )
    p.epilog = (
        "examples:\n"
        "  dcpinspect lag captures/live-flow-control.pcap\n"
        "  dcpinspect lag captures/live-stream-ends.pcap --top 3\n"
        "  dcpinspect lag captures/live-plain.pcap --vbucket 0 --json"
    )
    capture_arguments(p)
    p.add_argument("--top", type=int, default=10, help="show the N series furthest behind (default 10)")
    p.add_argument("--vbucket", type=int, help="only this vbucket, with its progress rows (one per change)")
    p.add_argument("--json", action="store_true", help="one JSON object per row, its 'table' key 'lag' or 'progress'")
    p.set_defaults(func=_lag)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"lag": _lag_arguments}
