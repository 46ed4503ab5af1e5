"""``dcpinspect stats``: tshark-like statistics of captures (the tables of :mod:`dcpinspect.tables.stats`).

Rules:

1. One read of the captures: the columns the tables need are kept from
   every part of the frames table, and the parts feed the timeline (only
   when the ``vbuckets`` table is asked for).
2. Text: each table under a ``== name: what`` line, times in ms with three
   decimals.  ``--json``: one object per row, its ``table`` key naming the
   table; times as seconds since the epoch (as ``frames --json``), missing
   values null.
3. ``--table`` picks tables (repeatable; default all, in :data:`TABLES` order).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from typing import Any

from ..flows.records import CaptureStats
from ..wire.render import safe_text
from .capture import capture_arguments, read_capture_parts, report_files, timeline_builder
from .command import Console

__all__ = ["ARGUMENTS", "TABLES", "TITLES"]

#: table -> the line above it in text
TITLES = {
    "rtt": "response times per command (ms): requests paired with responses by connection, opaque and opcode",
    "status": "responses per status",
    "conversations": "conversations: frames and bytes each way per connection",
    "vbuckets": "vbucket progress: last item seqno delivered, highest seqno seen, lag",
}
#: the tables, in the order printed (those of :mod:`dcpinspect.tables.stats`)
TABLES = tuple(TITLES)


def _kept(parts: Iterator[Any], batches: list[Any], columns: tuple[str, ...]) -> Iterator[Any]:
    for part in parts:
        batches.append(part.batch.select(list(columns)))
        yield part


def compute(args: argparse.Namespace, stats: CaptureStats, tables: list[str]) -> dict[str, Any]:
    """The DataFrames of ``tables`` for the captures of ``args`` (what the read saw goes to ``stats``)."""
    from ..tables.stats import STATS_COLUMNS, conversations, response_times, stats_frame, status_counts, vbucket_progress

    batches: list[Any] = []
    parts = _kept(read_capture_parts(args, stats), batches, STATS_COLUMNS)
    timeline = builder = None
    if "vbuckets" in tables:
        from ..tables.timeline_feed import feed_parts

        builder = feed_parts(parts, timeline_builder(args))
        timeline = builder.timeline()
        timeline.set_first = dict(stats.set_first)
    else:
        for _ in parts:
            pass
    frames = stats_frame(batches)
    out: dict[str, Any] = {}
    for name in tables:
        if name == "rtt":
            out[name] = response_times(frames)
        elif name == "status":
            out[name] = status_counts(frames)
        elif name == "conversations":
            out[name] = conversations(frames, stats.connections)
        elif timeline is not None and builder is not None:
            out[name] = vbucket_progress(timeline, builder.items_seen)
    return out


def json_rows(name: str, df: Any) -> list[str]:
    """The JSON lines of one table: one object per row, ``table`` first."""
    from ..tables.stats import json_records

    return [json.dumps({"table": name, **row}) for row in json_records(df)]


def text_block(name: str, df: Any) -> str:
    """One table as text: its title line, then the rows (or ``(none)``)."""
    from ..tables.stats import text_table

    return f"== {name}: {TITLES[name]}\n{text_table(df, safe_text)}\n"


def _stats(args: argparse.Namespace, console: Console) -> int:
    tables = [t for t in TABLES if t in (args.table or TABLES)]
    stats = CaptureStats()
    result = compute(args, stats, tables)
    bad = report_files(stats)
    if bad == len(stats.files):
        return 1
    out = console.out
    for name in tables:
        df = result[name]
        if args.json:
            out.write("".join(line + "\n" for line in json_rows(name, df)))
        else:
            out.write(text_block(name, df) + "\n")
    return 1 if bad else 0


def _stats_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Statistics of captures, like tshark -z: response times, statuses, conversations, vbucket progress and lag."
    p.epilog = (
        "examples:\n"
        "  dcpinspect stats captures/live-rollback-retry.pcap\n"
        "  dcpinspect stats captures/live-purge-rollback.pcap --table vbuckets\n"
        "  dcpinspect stats captures/dcp-session.pcap --table rtt --json"
    )
    capture_arguments(p)
    p.add_argument(
        "--table",
        action="append",
        choices=TABLES,
        help="only this table (repeatable; default all): rtt (response times), status, conversations, vbuckets (progress and lag)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per row, its 'table' key naming the table")
    p.set_defaults(func=_stats)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"stats": _stats_arguments}
