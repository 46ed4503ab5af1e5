"""``dcpinspect frames | show | summary | timeline``: capture files in, tables, byte tables and stories out."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from ..flows.reassembly import DEFAULT_SERVER_PORTS
from ..flows.records import CaptureStats, Record
from ..protocol import spec
from ..protocol.enums import Opcode
from ..wire.render import DEFAULT_MAX_ROWS, annotate, safe_text
from .command import CliError, Console

__all__ = ["ARGUMENTS"]


class _Progress:
    """A tqdm bar over the bytes of the capture files, only on an interactive terminal."""

    def __init__(self, paths: list[str], enabled: bool) -> None:
        self.bar = None
        self.done: dict[str, int] = {}
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            total = sum(os.path.getsize(p) for p in paths if os.path.exists(p))
            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="reading", leave=False)

    def __call__(self, path: str, offset: int) -> None:
        if self.bar is not None:
            self.bar.update(offset - self.done.get(path, 0))
            self.done[path] = offset

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _read_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "server_ports": args.port or DEFAULT_SERVER_PORTS,
        "detect": not args.no_detect,
        "reveal_secrets": getattr(args, "reveal_secrets", False),
        "json_check": not getattr(args, "no_json_check", False),
    }


def _parts(args: argparse.Namespace, stats: CaptureStats, rows: int = 20_000) -> Iterator[Any]:
    """The frames table of the captures, part by part (the columnar path: one decoding path for every command)."""
    from ..tables.columnar import read_parts

    progress = _Progress(args.captures, not args.no_progress)
    try:
        yield from read_parts(args.captures, rows=rows, stats=stats, progress=progress, **_read_options(args))
    finally:
        progress.close()


def _read(args: argparse.Namespace, stats: CaptureStats) -> Iterator[Record]:
    for part in _parts(args, stats):
        yield from part.records()


def _read_batches(args: argparse.Namespace, stats: CaptureStats, rows: int = 20_000) -> Iterator[Any]:
    for part in _parts(args, stats, rows):
        yield part.batch


class _NoPandas:
    """An import finder that says pandas is not installed (pyarrow's supported configuration)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"no module named {name!r} (not needed by this command)", name=name)


def _without_pandas(args: argparse.Namespace) -> None:
    """Commands that never use pandas keep pyarrow from importing it (0.2-0.4 s at start-up, on its first array).

    pyarrow imports pandas to ask whether an input is a pandas object; without
    it, it asks nothing - and remembers, for the rest of the process.  So only
    when the process is the command line itself (``main()`` called without
    arguments), never in a caller's Python, and only before pandas was imported.
    """
    if not getattr(args, "own_process", False):
        return
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())


def _report_files(stats: CaptureStats) -> int:
    bad = 0
    for path, info in stats.files.items():
        if info["error"]:
            bad += 1
            sys.stderr.write(f"dcpinspect: error: {info['error']}\n")
        for problem in info["problems"]:
            kept = "" if problem.startswith("timestamp out of range") else "; frames before it were kept"  # reading went on
            sys.stderr.write(f"dcpinspect: warning: {path}: {problem}{kept}\n")
    return bad


def _frames(args: argparse.Namespace, console: Console) -> int:
    if not args.filter:
        _without_pandas(args)
    from ..tables.export import FramesWriter, frame_rows, query_frames
    from .output import JSON_COLUMNS, TEXT_COLUMNS, json_line, text_line

    out = console.out
    stats = CaptureStats()
    path = args.parquet or args.csv
    writer = FramesWriter(path, "parquet" if args.parquet else "csv") if path else None
    shown = 0
    try:
        for batch in _read_batches(args, stats, 65_536 if writer is not None else 20_000):  # a file: parquet row groups of 64k
            if not batch.num_rows:
                continue
            frames = batch
            if args.filter:
                try:
                    frames = query_frames(batch, args.filter)
                except Exception as exc:
                    raise CliError(f"bad --filter expression {args.filter!r}: {exc}") from exc
            shown += frames.num_rows
            if writer is not None:
                writer.write(frames)
            elif args.json:
                out.write("".join(json_line(row) + "\n" for row in frame_rows(frames, JSON_COLUMNS)))
            else:
                out.write("".join(text_line(row) + "\n" for row in frame_rows(frames, TEXT_COLUMNS)))
    finally:
        if writer is not None:
            writer.close()
    bad = _report_files(stats)
    if path:
        sys.stderr.write(f"wrote {shown} rows to {path}\n")
    return 1 if bad == len(stats.files) and bad else 0


def _show(args: argparse.Namespace, console: Console) -> int:
    from ..flows.reassembly import TS_UNKNOWN

    out = console.out
    stats = CaptureStats()
    wanted = set(args.frame or [])
    names = {n.upper() for n in args.opcode or []}
    for rec in _read(args, stats):
        ev = rec.event
        if wanted and rec.number not in wanted:
            continue
        if args.conn is not None and rec.conn != args.conn:
            continue
        if names and (ev.type != "frame" or ev.name not in names):  # type: ignore[union-attr]
            continue
        ts = "?" if rec.ts == TS_UNKNOWN else f"{rec.ts / 1e9:.6f}"
        out.write(
            f"== frame {rec.number}  conn {rec.conn} {rec.conn_label}  {rec.direction}  ts {ts}  packets {rec.packet_first}-{rec.packet}\n"
        )
        out.write(annotate(ev, context=rec.context, max_rows=None if args.max_rows == 0 else args.max_rows) + "\n\n")
    _report_files(stats)
    return 0


def _timeline(args: argparse.Namespace, console: Console) -> int:
    from ..tables.timeline import story
    from ..tables.timeline_feed import feed_parts
    from ..timeline import TimelineBuilder

    out = console.out
    stats = CaptureStats()
    t = feed_parts(_parts(args, stats), TimelineBuilder()).timeline()
    bad = _report_files(stats)
    if args.json:
        for s in t.streams:
            if (args.vbucket is None or s.vbucket == args.vbucket) and (args.conn is None or s.conn == args.conn):
                out.write(json.dumps(s.as_dict()) + "\n")
        for vb, branches in sorted(t.branches.items()):
            if args.vbucket is None or vb == args.vbucket:
                tree = [
                    {"uuid": b.uuid, "seqno": b.seqno, "first_frame": b.first_frame, "cut_frame": b.cut_frame, "cut_by": b.cut_by}
                    for b in branches
                ]
                out.write(json.dumps({"vbucket": vb, "branches": tree}) + "\n")
    else:
        out.write("".join(safe_text(line) + "\n" for line in story(t, vbucket=args.vbucket, conn=args.conn).splitlines()))
    return 1 if bad == len(stats.files) and bad else 0


def _summary(args: argparse.Namespace, console: Console) -> int:
    _without_pandas(args)
    from ..tables.export import frame_counts

    stats = CaptureStats()
    per_op: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    problems = 0
    for batch in _read_batches(args, stats):
        k, ops, p = frame_counts(batch)
        kinds.update(k)
        per_op.update(ops)
        problems += p
    lines = ["files:"]
    for path, info in stats.files.items():
        state = info["error"] or f"{info['format']}, {info['packets']} packets" + (
            f"; {'; '.join(info['problems'])}" if info["problems"] else ""
        )
        lines.append(f"  {path}: {state}")
    lines.append(f"events: {dict(sorted(kinds.items(), key=lambda kv: _KIND_ORDER.get(kv[0], 9)))}; problems on frames: {problems}")
    if any(stats.skipped.values()):
        lines.append("skipped packets: " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.skipped.items()) if v))
    lines.append("connections:")
    for conn in stats.connections:
        lines += _connection_lines(conn, stats.states.get(conn.id))
    lines.append("frames per command:")
    lines += [f"  {n:>8}  {name}" for name, n in sorted(per_op.items(), key=lambda kv: (-kv[1], kv[0]))]
    console.out.write("\n".join(lines) + "\n")
    return 1 if stats.files and all(info["error"] for info in stats.files.values()) else 0


_KIND_ORDER = {"frame": 0, "garbage": 1, "truncated": 2, "gap": 3}


def _connection_lines(conn: Any, st: Any) -> list[str]:
    """A connection of ``summary``: its label, how it was read, and what its session negotiated."""
    notes = [
        "TLS, not decoded" if conn.tls else "memcached binary",
        f"roles from {conn.role_source}",
        f"{conn.packets} packets",
        f"{conn.lost} bytes lost",
    ]
    conflicts = sum(h.conflicts for h in conn.halves.values())
    late = sum(h.after_close for h in conn.halves.values())
    if conflicts:
        where = sorted(p for h in conn.halves.values() for p in h.conflict_packets)
        shown = ", ".join(map(str, where[:10])) + (", ..." if len(where) > 10 or conflicts > len(where) else "")
        notes.append(f"{conflicts} retransmissions with different bytes (packets {shown})")
    if late:
        notes.append(f"{late} bytes after the end ignored")
    lines = [f"  {conn.id}: {conn.label}  ({'; '.join(notes)})"]
    if st is not None:
        if st.features:
            lines.append("     HELLO: " + ", ".join(spec.FEATURES.get(f, hex(f)) for f in st.features))
        if st.sasl_mechanism:
            lines.append(f"     SASL: {st.sasl_mechanism}")
        if st.bucket:
            lines.append(f"     bucket: {safe_text(st.bucket)}")
        if st.open_flags is not None:
            lines.append(f"     DCP_OPEN {safe_text(st.open_name)!r}: {_OPEN_FLAGS_FIELD.meaning(st.open_flags)}")
        for k, v in st.controls.items():
            lines.append(f"     control {safe_text(k)}={safe_text(v)}")
    return lines


_OPEN_FLAGS_FIELD = next(f for f in spec.COMMANDS[Opcode.DCP_OPEN].request[0].extras if f.name == "flags")  # the table's own meanings


def _capture_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("captures", nargs="+", help="pcap or pcapng files (read in order as one capture)")
    p.add_argument("--port", type=int, action="append", help="server port(s) carrying memcached binary (default 11210, 11209, 11211)")
    p.add_argument("--no-detect", action="store_true", help="do not detect the protocol on other ports")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _frames_arguments(fr: argparse.ArgumentParser) -> None:
    _capture_args(fr)
    g = fr.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="one JSON object per line per frame")
    g.add_argument("--parquet", metavar="OUT", help="write the table as parquet")
    g.add_argument("--csv", metavar="OUT", help="write the table as CSV")
    fr.add_argument(
        "--no-json-check",
        action="store_true",
        help="do not check that values flagged JSON are JSON (faster; their json_check column says 'not checked')",
    )
    fr.add_argument(
        "--filter",
        metavar="EXPR",
        help="a pandas query over the columns, e.g. \"name == 'DCP_MUTATION' and vbucket == 3\"; evaluated as Python: pass only trusted text",
    )
    fr.set_defaults(func=_frames)


def _show_arguments(sh: argparse.ArgumentParser) -> None:
    _capture_args(sh)
    sh.add_argument("--frame", type=int, action="append", help="frame number (repeatable)")
    sh.add_argument("--conn", type=int, help="connection number")
    sh.add_argument("--opcode", action="append", help="command name, e.g. DCP_STREAM_REQ (repeatable)")
    sh.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets")
    sh.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, help="grid rows before long frames are elided (0: never)")
    sh.set_defaults(func=_show)


def _summary_arguments(sm: argparse.ArgumentParser) -> None:
    _capture_args(sm)
    sm.set_defaults(func=_summary)


def _timeline_arguments(tl: argparse.ArgumentParser) -> None:
    _capture_args(tl)
    tl.add_argument("--json", action="store_true", help="one JSON object per stream, then one per vbucket branch tree")
    tl.add_argument("--vbucket", type=int, help="only this vbucket")
    tl.add_argument("--conn", type=int, help="only this connection")
    tl.set_defaults(func=_timeline)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "frames": _frames_arguments,
    "show": _show_arguments,
    "summary": _summary_arguments,
    "timeline": _timeline_arguments,
}
