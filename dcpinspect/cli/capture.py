"""``dcpinspect frames | show | summary | timeline``: capture files in, tables, byte tables and stories out."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..flows.reassembly import DEFAULT_SERVER_PORTS
from ..flows.records import CaptureStats, Record
from ..protocol import spec
from ..protocol.enums import Opcode
from ..wire.render import DEFAULT_MAX_ROWS, annotate, plural, safe_text
from .command import CliError, Console

__all__ = ["ARGUMENTS", "capture_arguments", "capture_plan", "file_state", "read_capture_parts", "report_files"]


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
        "capture_sets": capture_plan(args),
    }


def capture_plan(args: argparse.Namespace) -> Any:
    """The capture sets of the run (:func:`~dcpinspect.capture.sets.plan_capture_sets`), planned once per command."""
    plan = getattr(args, "capture_plan", None)
    if plan is None:
        from ..capture.sets import plan_capture_sets

        mode = "one" if getattr(args, "one_capture", False) else "per-file" if getattr(args, "per_file", False) else "auto"
        plan = args.capture_plan = plan_capture_sets(args.captures, mode)
    return plan


def timeline_builder(args: argparse.Namespace) -> Any:
    """A :class:`~dcpinspect.timeline.TimelineBuilder` that keeps the run's capture sets apart (histories never cross them)."""
    from ..capture.sets import file_sets
    from ..timeline import TimelineBuilder

    return TimelineBuilder(file_sets(capture_plan(args)))


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
    """One line on stderr per file that failed (an error) and per problem (a warning); returns how many files failed.

    A command whose run had a failed file exits 1, after processing the rest.
    """
    bad = 0
    for path, info in stats.files.items():
        if info["error"]:
            bad += 1
            sys.stderr.write(f"dcpinspect: error: {_named(path, info['error'])}\n")
        for problem in info["problems"]:
            kept = "" if problem.startswith("timestamp out of range") else "; frames before it were kept"  # reading went on
            sys.stderr.write(f"dcpinspect: warning: {path}: {problem}{kept}\n")
    return bad


def _named(path: str, error: str) -> str:
    """``error`` naming ``path`` once: the reader's errors start with it."""
    return error if error.startswith(f"{path}: ") else f"{path}: {error}"


def file_state(path: str, error: str) -> str:
    """A file's error without its name (for lines that already start with it)."""
    return error.removeprefix(f"{path}: ")


# what the other capture commands' modules (follow, stats) share with these: the arguments, the read, the report of files
def capture_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments every capture command takes (the files, ports, detection, progress)."""
    _capture_args(p)


read_capture_parts = _parts
report_files = _report_files


def _display_filter(text: str | None) -> Any:
    """The compiled ``--filter`` (``None`` without one); a bad filter is a one-line user error naming what is wrong."""
    if not text:
        return None
    from ..tables.filter import FilterError, compile_filter

    try:
        return compile_filter(text)
    except FilterError as exc:
        raise CliError(f"bad --filter {text!r}: {exc}") from None


def _frames(args: argparse.Namespace, console: Console) -> int:
    flt = _display_filter(args.filter)
    _without_pandas(args)  # the display filter is Arrow compute: no command here needs pandas
    from ..tables.export import FramesWriter, OutputError, frame_rows
    from .export import PcapExport, only_connection
    from .output import JSON_COLUMNS, TEXT_COLUMNS, TS_REF, Clock, json_line, text_line

    out = console.out
    stats = CaptureStats()
    path = args.parquet or args.csv
    try:
        writer = FramesWriter(path, "parquet" if args.parquet else "csv") if path else None
    except OutputError as exc:
        raise CliError(str(exc)) from None
    pcap = PcapExport(args) if args.pcap else None
    clock = Clock(args.time)
    text = writer is None and not args.json
    shown = 0
    try:
        for batch in _read_batches(args, stats, 65_536 if writer is not None else 20_000):  # a file: parquet row groups of 64k
            if not batch.num_rows:
                continue
            frames = clock.prepare(batch) if text else batch  # the time reference of every row read, before the filter
            if flt is not None:
                frames = frames.filter(flt.mask(frames))
            frames = only_connection(frames, args.conn)
            shown += frames.num_rows
            if pcap is not None:
                pcap.take(frames)
            elif writer is not None:
                writer.write(frames)
            elif args.json:
                out.write("".join(json_line(row) + "\n" for row in frame_rows(frames, JSON_COLUMNS)))
            else:
                rows = frame_rows(frames, (*TEXT_COLUMNS, TS_REF) if TS_REF in frames.schema.names else TEXT_COLUMNS)
                out.write("".join(text_line(row, clock) + "\n" for row in rows))
        if writer is not None:
            writer.close()
    except OutputError as exc:
        raise CliError(str(exc)) from None
    bad = _report_files(stats)
    if pcap is not None:
        pcap.finish(stats)
    if path:
        sys.stderr.write(f"wrote {plural(shown, 'row')} to {path}\n")
    return 1 if bad else 0


def _filtered_records(args: argparse.Namespace, stats: CaptureStats, flt: Any, clock: Any) -> Iterator[tuple[Record, dict[str, Any]]]:
    """The records read (only those whose frames-table row matches ``flt``), each with the row its time is told from.

    With a filter, the time reference of every row read comes from
    ``clock.prepare`` on the part's table (column ``ts_ref``) before the
    filter drops rows; without one, every record is handed out and the
    clock sees them all.
    """
    from ..flows.reassembly import TS_MAX, TS_UNKNOWN
    from .output import TS_REF

    def row(rec: Record) -> dict[str, Any]:
        known = [t if TS_UNKNOWN < t <= TS_MAX else None for t in (rec.ts, rec.ts_first)]
        return {"ts": known[0], "ts_first": known[1], "capture_set": rec.capture_set}

    for part in _parts(args, stats):
        if flt is None:
            yield from ((rec, row(rec)) for rec in part.records())
            continue
        batch = clock.prepare(part.batch)
        matched = batch.filter(flt.mask(batch))
        refs = (
            dict(zip(matched.column("frame").to_pylist(), matched.column(TS_REF).to_pylist(), strict=True))
            if TS_REF in matched.schema.names
            else {}
        )
        hits = set(matched.column("frame").to_pylist())
        for rec in part.records():
            if rec.number in hits:
                r = row(rec)
                if rec.number in refs:
                    r[TS_REF] = refs[rec.number]
                yield rec, r


def frame_ref(text: str) -> tuple[str | None, int]:
    """``show --frame``: ``N`` or ``FILE:N`` -> (FILE or None, N)."""
    file, sep, num = text.rpartition(":")
    try:
        n = int(num)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a frame number: {text!r} (N or FILE:N)") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"frame numbers start at 1: {text!r}")
    return (file if sep else None), n


def _wanted_frames(args: argparse.Namespace) -> dict[tuple[int | None, int], str]:
    """``show``'s frames: (capture set, set frame) - or (None, run frame) - -> how the user named it."""
    plan = capture_plan(args)
    where = {os.path.realpath(f): cs.number for cs in plan for f in cs.files}
    out: dict[tuple[int | None, int], str] = {}
    for named, n in args.frame or []:
        file = named or args.file
        if file is None:
            out[(None, n)] = str(n)
            continue
        cs = where.get(os.path.realpath(file))
        if cs is None:
            raise CliError(f"--frame {file}:{n}: {file} is not one of the captures")
        out[(cs, n)] = f"{file}:{n}"
    return out


def _show(args: argparse.Namespace, console: Console) -> int:
    from .output import Clock

    out = console.out
    stats = CaptureStats()
    wanted = _wanted_frames(args)
    found: set[tuple[int | None, int]] = set()
    names = {n.upper() for n in args.opcode or []}
    flt = _display_filter(args.filter)
    clock = Clock(args.time)
    _known_opcodes(names)
    shown: list[int] = []
    for rec, row in _filtered_records(args, stats, flt, clock):
        ev = rec.event
        when = clock.value(row) if clock.needs_every_row and flt is None else None  # r, d: told from every record read
        if wanted:
            hit = [k for k in ((None, rec.number), (rec.capture_set, rec.set_frame)) if k in wanted]
            if not hit:
                continue
        if args.conn is not None and rec.conn != args.conn:
            continue
        if names and (ev.type != "frame" or ev.name not in names):  # type: ignore[union-attr]
            continue
        when = clock.value(row) if when is None else when
        if wanted:
            found.update(hit)
        shown.append(rec.number)
        out.write(
            f"== frame {rec.number}  ({safe_text(rec.file)}, set {rec.capture_set} frame {rec.set_frame})  conn {rec.conn} {rec.conn_label}"
            f"  {rec.direction}  time {when}  packets {rec.packet_first}-{rec.packet}\n"
        )
        out.write(annotate(ev, context=rec.context, max_rows=None if args.max_rows == 0 else args.max_rows) + "\n\n")
    return _show_status(args, stats, shown, names, [v for k, v in wanted.items() if k not in found])


def _known_opcodes(names: set[str]) -> None:
    """``show --opcode``: every name must be a command the table knows (a user error otherwise)."""
    unknown = sorted(names - {op.name for op in Opcode})
    if unknown:
        raise CliError(f"unknown command name {', '.join(unknown)} (names as 'dcpinspect reference' lists them, e.g. DCP_STREAM_REQ)")


def _show_status(args: argparse.Namespace, stats: CaptureStats, shown: list[int], names: set[str], missing: list[str]) -> int:
    """``show``'s exit status: 1 when a file failed, or a frame or connection asked for is not there, or nothing matched."""
    bad = _report_files(stats)
    readable = any(not info["error"] for info in stats.files.values())
    if readable and missing:
        what = "frame" if len(missing) == 1 else "frames"
        sys.stderr.write(
            f"dcpinspect: error: no {what} {', '.join(map(str, missing))} shown (the capture has {plural(stats.records, 'frame')})\n"
        )
    if readable and args.conn is not None and all(c.id != args.conn for c in stats.connections):
        sys.stderr.write(f"dcpinspect: error: no connection {args.conn} (the capture has {plural(len(stats.connections), 'connection')})\n")
    elif readable and not shown and not missing:
        sys.stderr.write("dcpinspect: error: no frame matches the selection\n")
    return 1 if bad or missing or not shown else 0


def _matching_parts(parts: Iterator[Any], flt: Any, matched: set[int]) -> Iterator[Any]:
    """The parts, unchanged (the timeline is built from every frame), collecting the numbers of the frames ``flt`` matches."""
    for part in parts:
        if flt is not None:
            batch = part.batch
            matched.update(batch.column("frame").filter(flt.mask(batch)).to_pylist())
        yield part


def _stream_frames(s: Any) -> Iterator[int]:
    """Every frame number a stream names: its requests and responses, snapshots, items, end and close."""
    for a in s.attempts:
        yield a.frame
        if a.response_frame is not None:
            yield a.response_frame
    for sn in s.snapshots:
        yield sn.frame
    for item in s.items:
        yield item.frame
    if s.end is not None and s.end.get("frame") is not None:
        yield s.end["frame"]
    yield from (f for f in (s.closed_frame, s.close_answered) if f is not None)
    for an in s.anomalies:
        yield from an.frames


def streams_with_frames(t: Any, frames: set[int]) -> Any:
    """The timeline ``t`` shown for ``timeline --filter``: only its streams that name one of ``frames``.

    With them their connections, their vbuckets' branch trees, and the
    connection anomalies that name one of ``frames``.
    """
    import dataclasses

    streams = [s for s in t.streams if not frames.isdisjoint(_stream_frames(s))]
    conns = {s.conn for s in streams}
    vbuckets = {s.vbucket for s in streams}
    anomalies = [
        a for a in t.anomalies if (a.vbucket is None and not frames.isdisjoint(a.frames)) or (a.vbucket in vbuckets and a.conn in conns)
    ]
    conns |= {a.conn for a in anomalies}
    return dataclasses.replace(
        t,
        streams=streams,
        connections={k: c for k, c in t.connections.items() if k in conns},
        branches={vb: b for vb, b in t.branches.items() if vb in vbuckets},
        anomalies=anomalies,
    )


def _timeline(args: argparse.Namespace, console: Console) -> int:
    from ..tables.history import frames_of, item_batch, rollback_losses
    from ..tables.stats import json_records
    from ..tables.timeline import story, timeline_frames
    from ..tables.timeline_feed import feed_parts

    out = console.out
    stats = CaptureStats()
    flt = _display_filter(args.filter)
    matched: set[int] = set()
    items: list[Any] = []  # the item frames' keys, for what each rollback cost

    def keep(parts: Iterable[Any]) -> Iterator[Any]:
        for part in parts:
            items.append(item_batch(part.batch))
            yield part

    t = feed_parts(keep(_matching_parts(_parts(args, stats), flt, matched)), timeline_builder(args)).timeline()
    t.set_first = dict(stats.set_first)
    if flt is not None:
        t = streams_with_frames(t, matched)
    bad = _report_files(stats)
    rolled = any(a.outcome == "rollback" for s in t.streams for a in s.attempts)
    losses = rollback_losses(frames_of(items), timeline_frames(t)) if rolled else None
    if args.json:
        # connection headers, streams, connection-level anomalies (no stream), what each rollback cost, then one object per
        # failover history
        for c in t.connections.values():
            if args.conn is None or c.conn == args.conn:
                out.write(json.dumps({"connection": c.as_dict()}) + "\n")
        for s in t.streams:
            if (args.vbucket is None or s.vbucket == args.vbucket) and (args.conn is None or s.conn == args.conn):
                out.write(json.dumps(s.as_dict()) + "\n")
        for a in t.anomalies:
            if a.vbucket is None and args.vbucket is None and (args.conn is None or a.conn == args.conn):
                out.write(json.dumps({"anomaly": {**a.as_dict(), "conn": a.conn}}) + "\n")
        for row in [] if losses is None else json_records(losses):
            if (args.vbucket is None or row["vbucket"] == args.vbucket) and (args.conn is None or row["conn"] == args.conn):
                out.write(json.dumps({"rollback_loss": row}) + "\n")
        for (cs, vb, h), branches in t.histories().items():
            if args.vbucket is None or vb == args.vbucket:
                tree = [
                    {"uuid": b.uuid, "seqno": b.seqno, "first_frame": b.first_frame, "cut_frame": b.cut_frame, "cut_by": b.cut_by}
                    for b in branches
                ]
                out.write(json.dumps({"vbucket": vb, "capture_set": cs, "history": h, "branches": tree}) + "\n")
    else:
        text = story(t, vbucket=args.vbucket, conn=args.conn, losses=losses)
        out.write("".join(safe_text(line) + "\n" for line in text.splitlines()))
    return 1 if bad else 0


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
    lines = ["capture sets:"]
    for cs in stats.sets:
        lines.append(f"  set {cs.number} ({cs.reason}): frames {stats.set_first[cs.number]}-{_set_last(stats, cs.number)}")
        for path in cs.files:
            info = stats.files[path]
            state = file_state(path, info["error"] or "") or f"{info['format']}, {plural(info['packets'], 'packet')}" + (
                f"; {'; '.join(info['problems'])}" if info["problems"] else ""
            )
            lines.append(f"    {path}: {state}")
    events = ", ".join(
        plural(n, *_KIND_WORDS.get(kind, (kind, kind))) for kind, n in sorted(kinds.items(), key=lambda kv: _KIND_ORDER.get(kv[0], 9))
    )
    lines.append(f"events: {events or 'none'}; problems on frames: {problems}")
    if any(stats.skipped.values()):
        lines.append("skipped packets: " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.skipped.items()) if v))
    lines.append("connections:")
    for conn in stats.connections:
        lines += _connection_lines(conn, stats.states.get(conn.id))
    lines.append("frames per command:")
    lines += [f"  {n:>8}  {name}" for name, n in sorted(per_op.items(), key=lambda kv: (-kv[1], kv[0]))]
    console.out.write("\n".join(lines) + "\n")
    return 1 if any(info["error"] for info in stats.files.values()) else 0


def _set_last(stats: CaptureStats, number: int) -> int:
    """The number of a capture set's last frame (one before its first when it has none)."""
    nxt = stats.set_first.get(number + 1)
    return (nxt if nxt is not None else stats.records + 1) - 1


_KIND_ORDER = {"frame": 0, "garbage": 1, "truncated": 2, "gap": 3}
_KIND_WORDS = {
    "frame": ("frame", "frames"),
    "garbage": ("garbage run", "garbage runs"),
    "truncated": ("truncated frame", "truncated frames"),
    "gap": ("gap", "gaps"),
}


def _connection_lines(conn: Any, st: Any) -> list[str]:
    """A connection of ``summary``: its label, how it was read, and what its session negotiated."""
    notes = [
        "TLS, not decoded" if conn.tls else "memcached binary",
        f"roles from {conn.role_source}",
        plural(conn.packets, "packet"),
        f"{plural(conn.lost, 'byte')} lost",
    ]
    conflicts = sum(h.conflicts for h in conn.halves.values())
    late = sum(h.after_close for h in conn.halves.values())
    if conflicts:
        where = sorted(p for h in conn.halves.values() for p in h.conflict_packets)
        shown = ", ".join(map(str, where[:10])) + (", ..." if len(where) > 10 or conflicts > len(where) else "")
        notes.append(f"{plural(conflicts, 'retransmission')} with different bytes (packets {shown})")
    if late:
        notes.append(f"{plural(late, 'byte')} after the end ignored")
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
    p.add_argument(
        "captures",
        nargs="+",
        help="pcap or pcapng files; the files of one recording (rotated ring-buffer files, or files whose connections "
        "continue) are one capture set, read in order as one capture, and every other file a set of its own",
    )
    sets = p.add_mutually_exclusive_group()
    sets.add_argument("--one-capture", action="store_true", help="read every file as one capture set (in the order given)")
    sets.add_argument("--per-file", action="store_true", help="read each file as a capture set of its own")
    p.add_argument("--port", type=int, action="append", help="server port(s) carrying memcached binary (default 11210, 11209, 11211)")
    p.add_argument("--no-detect", action="store_true", help="do not detect the protocol on other ports")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _filter_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--filter",
        "-Y",
        metavar="EXPR",
        help=f'a display filter, {what}: e.g. "name == \'DCP_MUTATION\' and vbucket == 3", "has_problem", '
        "\"key.contains('x')\" ('dcpinspect fields' lists the fields and functions)",
    )


def time_argument(p: argparse.ArgumentParser) -> None:
    """``-t/--time``: the time format of every command that lists frames (tshark's ``-t``)."""
    from .output import TIME_FORMATS

    p.add_argument(
        "-t",
        "--time",
        choices=tuple(TIME_FORMATS),
        default="r",
        help="time format: " + "; ".join(f"{k}: {v}" for k, v in TIME_FORMATS.items()),
    )


def _frames_arguments(fr: argparse.ArgumentParser) -> None:
    _capture_args(fr)
    g = fr.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="one JSON object per line per frame")
    g.add_argument("--parquet", metavar="OUT", help="write the table as parquet")
    g.add_argument("--csv", metavar="OUT", help="write the table as CSV")
    g.add_argument(
        "--pcap",
        metavar="OUT",
        help="write the packets that carry the selected frames (with --conn: the whole connection) to a pcap file, as captured",
    )
    fr.add_argument("--conn", type=int, metavar="N", help="only connection N (with --pcap: all its packets, handshake and close included)")
    fr.add_argument(
        "--no-json-check",
        action="store_true",
        help="do not check that values flagged JSON are JSON (faster; their json_check column says 'not checked')",
    )
    _filter_arg(fr, "only the frames it matches")
    time_argument(fr)
    fr.set_defaults(func=_frames)


def _show_arguments(sh: argparse.ArgumentParser) -> None:
    _capture_args(sh)
    sh.add_argument(
        "--frame",
        type=frame_ref,
        action="append",
        metavar="[FILE:]N",
        help="frame N (repeatable): with FILE (or --file), frame N within the capture set of FILE, as its table's set_frame "
        "column and a report name it; otherwise the run's frame number (the frame column: the same when one set is read)",
    )
    sh.add_argument("--file", metavar="FILE", help="count --frame numbers within the capture set of FILE (one of the captures)")
    sh.add_argument("--conn", type=int, help="connection number")
    sh.add_argument("--opcode", action="append", help="command name, e.g. DCP_STREAM_REQ (repeatable)")
    sh.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets")
    sh.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, help="grid rows before long frames are elided (0: never)")
    _filter_arg(sh, "only the frames it matches (with --frame, --conn, --opcode: those that match all)")
    time_argument(sh)
    sh.set_defaults(func=_show)


def _summary_arguments(sm: argparse.ArgumentParser) -> None:
    _capture_args(sm)
    sm.set_defaults(func=_summary)


def _timeline_arguments(tl: argparse.ArgumentParser) -> None:
    _capture_args(tl)
    tl.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per connection, per stream, per connection-level anomaly, per rollback's cost (rollback_loss: the "
        "items cut, re-delivered or possibly lost), then one per failover history (vbucket, capture set, history)",
    )
    tl.add_argument("--vbucket", type=int, help="only this vbucket")
    tl.add_argument("--conn", type=int, help="only this connection")
    _filter_arg(tl, "only the streams with a frame it matches (the timeline is built from every frame)")
    tl.set_defaults(func=_timeline)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "frames": _frames_arguments,
    "show": _show_arguments,
    "summary": _summary_arguments,
    "timeline": _timeline_arguments,
}
