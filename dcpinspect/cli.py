"""Command line: ``dcpinspect decode | reference | examples``.

A thin edge over the core: it reads bytes, calls :func:`dcpinspect.decode` /
:func:`dcpinspect.dissect` / the renderers, and prints.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from . import spec
from .decoder import Event, Frame, decode
from .dissect import DissectContext, dissect
from .render import DEFAULT_MAX_ROWS, annotate, safe_text

__all__ = ["event_dict", "main", "parse_hex"]


class CliError(Exception):
    """A user error: printed as ``dcpinspect: error: ...`` with exit status 2."""


def parse_hex(text: str) -> bytes:
    """Hex with or without spaces, commas, colons or ``0x`` prefixes -> bytes."""
    tokens = [t for t in re.split(r"[\s,:]+", text.strip()) if t]
    cleaned = "".join(t[2:] if t[:2] in ("0x", "0X") else t for t in tokens)
    bad = re.search(r"[^0-9a-fA-F]", cleaned)
    if bad:
        raise CliError(f"not hex: {bad.group(0)!r} at hex digit {bad.start()} (give bytes as hex, '-' for stdin or --file F)")
    if len(cleaned) % 2:
        raise CliError(f"odd number of hex digits ({len(cleaned)}): the last byte is incomplete")
    return bytes.fromhex(cleaned)


def event_dict(ev: Event, context: DissectContext | None = None) -> dict[str, Any]:
    """The JSON form of one event (offsets: event in the input, fields in the frame)."""
    if isinstance(ev, Frame):
        d = dissect(ev, context)
        is_mcbp = ev.dialect == "mcbp"
        return {
            "type": "frame",
            "offset": ev.offset,
            "length": ev.length,
            "name": d.name,
            "role": d.role,
            "magic": ev.magic if is_mcbp else None,
            "opcode": ev.opcode,
            "fields": [f.as_dict() for f in d.fields],
            "problems": [p.as_dict() for p in d.problems],
        }
    length = ev.length
    problems = [] if ev.type == "gap" else [{"message": ev.reason, "offset": 0, "length": length}]  # type: ignore[union-attr]
    return {
        "type": ev.type,
        "offset": ev.offset,
        "length": length,
        "name": None,
        "role": None,
        "magic": None,
        "opcode": None,
        "fields": [],
        "problems": problems,
    }


def _context(args: argparse.Namespace) -> DissectContext:
    return DissectContext(
        collections=True if args.collections else None,
        xattr=True if args.xattr else None,
        snappy=True if args.snappy else None,
        delete_times=True if args.delete_times else None,
        stream_ids=True if args.stream_ids else None,
        reveal_secrets=args.reveal_secrets,
    )


def _read_inputs(args: argparse.Namespace, stdin: TextIO) -> list[tuple[str | None, bytes]]:
    if args.file:
        if args.hex:
            raise CliError("give either hex arguments or --file, not both")
        inputs: list[tuple[str | None, bytes]] = []
        for name in args.file:
            try:
                with open(name, "rb") as fh:
                    inputs.append((name, fh.read()))
            except OSError as exc:
                raise CliError(f"cannot read {name}: {exc.strerror}") from exc
        return inputs
    if args.hex == ["-"]:
        return [(None, parse_hex(stdin.read()))]
    if not args.hex:
        raise CliError("no input: give hex bytes, '-' to read hex from stdin, or --file F for raw bytes")
    return [(None, parse_hex(" ".join(args.hex)))]


def _cmd_decode(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    inputs = _read_inputs(args, stdin)
    ctx = _context(args)
    max_rows = None if args.max_rows == 0 else args.max_rows
    for name, data in inputs:
        events = decode(data, dialect=args.dialect)
        if args.json:
            doc: dict[str, Any] = {"events": [event_dict(e, ctx) for e in events]}
            if len(inputs) > 1:
                doc = {"file": name, **doc}
            json.dump(doc, out)
            out.write("\n")
            continue
        chunks = [annotate(e, context=ctx, max_rows=max_rows) for e in events] or ["(no bytes)"]
        if len(inputs) > 1:
            frames = sum(e.type == "frame" for e in events)
            chunks.insert(0, f"== {name}: {len(data)} bytes, {frames} frames, {len(events) - frames} other events")
        out.write("\n\n".join(chunks) + "\n\n")
    return 0


def _cmd_reference(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from .reference import reference_markdown

    out.write(reference_markdown())
    return 0


def _cmd_examples(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from .examples import EXAMPLES
    from .render import breakdown, byte_table

    chosen = [e for e in EXAMPLES if not args.names or e.name in args.names]
    if args.names and len(chosen) != len(set(args.names)):
        known = ", ".join(e.name for e in EXAMPLES)
        raise CliError(f"unknown example name(s); known: {known}")
    for ex in chosen:
        d = ex.dissect()
        out.write(f"== {ex.name} (seed {ex.seed}): {ex.title}\n{byte_table(d, max_rows=None)}\n\n{breakdown(d)}\n\n")
    return 0


# --- captures -------------------------------------------------------------------


class _Progress:
    """A tqdm bar over the bytes of the capture files, only on an interactive terminal."""

    def __init__(self, paths: list[str], enabled: bool) -> None:
        import os

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
        "server_ports": args.port or [11210, 11209, 11211],
        "detect": not args.no_detect,
        "reveal_secrets": getattr(args, "reveal_secrets", False),
    }


def _read(args: argparse.Namespace, stats: Any) -> Any:
    from .records import read_records

    progress = _Progress(args.captures, not args.no_progress)
    try:
        yield from read_records(args.captures, stats=stats, progress=progress, **_read_options(args))
    finally:
        progress.close()


def _read_batches(args: argparse.Namespace, stats: Any) -> Any:
    from .batches import read_batches

    progress = _Progress(args.captures, not args.no_progress)
    try:
        yield from read_batches(args.captures, rows=20_000, stats=stats, progress=progress, **_read_options(args))
    finally:
        progress.close()


def _report_files(stats: Any) -> int:
    bad = 0
    for path, info in stats.files.items():
        if info["error"]:
            bad += 1
            sys.stderr.write(f"dcpinspect: error: {info['error']}\n")
        for problem in info["problems"]:
            kept = "" if problem.startswith("timestamp out of range") else "; frames before it were kept"  # reading went on
            sys.stderr.write(f"dcpinspect: warning: {path}: {problem}{kept}\n")
    return bad


def _cmd_frames(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    import pyarrow as pa

    from .batches import SCHEMA as schema
    from .columns import JSON_COLUMNS
    from .records import CaptureStats
    from .tables import _PANDAS

    stats = CaptureStats()
    writer: Any = None
    shown = 0

    def flush(batch: pa.RecordBatch) -> None:
        nonlocal writer, shown
        if not batch.num_rows:
            return
        table = pa.Table.from_batches([batch], schema=schema)
        if args.filter:
            df = table.to_pandas(types_mapper=_PANDAS.get)
            try:
                df = df.query(args.filter, engine="python")
            except Exception as exc:
                raise CliError(f"bad --filter expression {args.filter!r}: {exc}") from exc
            table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
        shown += table.num_rows
        if args.parquet:
            import pyarrow.parquet as pq

            if writer is None:
                writer = pq.ParquetWriter(args.parquet, schema)
            writer.write_table(table)
        elif args.csv:
            import pyarrow.compute as pc
            import pyarrow.csv as pcsv

            joined = pc.binary_join(table.column("problems"), "; ")
            t = table.set_column(table.schema.get_field_index("problems"), "problems", joined)
            if writer is None:
                writer = pcsv.CSVWriter(args.csv, t.schema)
            writer.write_table(t)
        elif args.json:
            for row in table.select(list(JSON_COLUMNS)).to_pylist():
                ts = row["ts"]
                row["ts"] = ts.timestamp() if ts is not None else None
                out.write(json.dumps(row) + "\n")
        else:
            for row in table.select(
                ["frame", "dir", "conn_id", "type", "name", "role", "vbucket", "status_name", "opaque", "key", "seqno", "problems"]
            ).to_pylist():
                status = row["status_name"] if row["role"] == "response" else f"vb={row['vbucket']}"
                what = row["name"] if row["type"] == "frame" else row["type"]
                extra = f" key={row['key']!r}" if row["key"] is not None else ""
                extra += f" seqno={row['seqno']}" if row["seqno"] is not None else ""
                extra += f" [{'; '.join(row['problems'])}]" if row["problems"] else ""
                out.write(
                    f"{row['frame']:>7} conn {row['conn_id']} {row['dir']} {what} {row['role'] or ''} {status if row['type'] == 'frame' else ''} opaque=0x{(row['opaque'] or 0):08x}{safe_text(extra)}\n"
                )

    try:
        for batch in _read_batches(args, stats):
            flush(batch)
    finally:
        if writer is not None:
            writer.close()
    bad = _report_files(stats)
    if args.parquet or args.csv:
        sys.stderr.write(f"wrote {shown} rows to {args.parquet or args.csv}\n")
    return 1 if bad == len(stats.files) and bad else 0


def _cmd_show(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from .flows import TS_UNKNOWN
    from .records import CaptureStats

    stats = CaptureStats()
    wanted = set(args.frame or [])
    names = {n.upper() for n in args.opcode or []}
    for rec in _read(args, stats):
        ev = rec.event
        if wanted and rec.number not in wanted:
            continue
        if args.conn is not None and rec.conn != args.conn:
            continue
        if names and (ev.type != "frame" or ev.name not in names):
            continue
        ts = "?" if rec.ts == TS_UNKNOWN else f"{rec.ts / 1e9:.6f}"
        out.write(
            f"== frame {rec.number}  conn {rec.conn} {rec.conn_label}  {rec.direction}  ts {ts}  packets {rec.packet_first}-{rec.packet}\n"
        )
        out.write(annotate(ev, context=rec.context, max_rows=None if args.max_rows == 0 else args.max_rows) + "\n\n")
    _report_files(stats)
    return 0


def _cmd_timeline(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from .records import CaptureStats
    from .timeline import TimelineBuilder
    from .timeline_tables import story

    stats = CaptureStats()
    builder = TimelineBuilder()
    for rec in _read(args, stats):
        builder.feed(rec)
    t = builder.timeline()
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


def _cmd_summary(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    from collections import Counter

    from .records import CaptureStats

    stats = CaptureStats()
    per_op: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    problems = 0
    for rec in _read(args, stats):
        ev = rec.event
        kinds[ev.type] += 1
        if ev.type == "frame":
            d = dissect(ev, rec.context)
            per_op[f"{d.name} {d.role}"] += 1
            problems += len(d.problems)
    lines = ["files:"]
    for path, info in stats.files.items():
        state = info["error"] or f"{info['format']}, {info['packets']} packets" + (
            f"; {'; '.join(info['problems'])}" if info["problems"] else ""
        )
        lines.append(f"  {path}: {state}")
    lines.append(f"events: {dict(kinds)}; problems on frames: {problems}")
    if any(stats.skipped.values()):
        lines.append("skipped packets: " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.skipped.items()) if v))
    lines.append("connections:")
    for conn in stats.connections:
        st = stats.states.get(conn.id)
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
        lines.append(f"  {conn.id}: {conn.label}  ({'; '.join(notes)})")
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
    lines.append("frames per command:")
    lines += [f"  {n:>8}  {name}" for name, n in per_op.most_common()]
    out.write("\n".join(lines) + "\n")
    return 1 if stats.files and all(info["error"] for info in stats.files.values()) else 0


_OPEN_FLAGS_FIELD = next(f for f in spec.COMMANDS[0x50].request[0].extras if f.name == "flags")  # the table's own meanings


def _capture_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("captures", nargs="+", help="pcap or pcapng files (read in order as one capture)")
    p.add_argument("--port", type=int, action="append", help="server port(s) carrying memcached binary (default 11210, 11209, 11211)")
    p.add_argument("--no-detect", action="store_true", help="do not detect the protocol on other ports")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


#: live commands -> the module whose ``command(argv, out=...)`` runs them
LIVE_COMMANDS = {"sim": "sim", "client": "client", "proxy": "proxy", "sniff": "sniff", "analyze": "spark"}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    p = argparse.ArgumentParser(prog="dcpinspect", description="Inspect DCP and memcached binary protocol traffic.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="annotate the frames in hex or raw bytes")
    d.add_argument("hex", nargs="*", help="bytes as hex (spaces and 0x allowed), or '-' to read hex from stdin")
    d.add_argument("--file", "-f", nargs="+", help="read raw bytes from these files instead (frames back to back)")
    d.add_argument("--dialect", choices=("mcbp", "upr"), default="mcbp", help="mcbp (default) or the old UPR draft")
    d.add_argument("--json", action="store_true", help="print {'events': [...]} as JSON")
    d.add_argument("--collections", action="store_true", help="collections were negotiated (keys carry a LEB128 collection id)")
    d.add_argument("--xattr", action="store_true", help="xattrs were negotiated")
    d.add_argument("--snappy", action="store_true", help="snappy was negotiated")
    d.add_argument("--delete-times", action="store_true", help="DCP_OPEN had IncludeDeleteTimes (deletion v2)")
    d.add_argument("--stream-ids", action="store_true", help="enable_stream_id was negotiated")
    d.add_argument("--reveal-secrets", action="store_true", help="show SASL passwords and proofs instead of masking them")
    d.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, help="grid rows before long frames are elided (0: never)")
    d.set_defaults(func=_cmd_decode)
    r = sub.add_parser("reference", help="print the protocol reference (Markdown) generated from the table")
    r.set_defaults(func=_cmd_reference)
    e = sub.add_parser("examples", help="annotate the packets drawn in the seed documents")
    e.add_argument("names", nargs="*", help="example names (default: all)")
    e.set_defaults(func=_cmd_examples)
    fr = sub.add_parser("frames", help="the frames table of captures (text, JSON lines, parquet or CSV)")
    _capture_args(fr)
    g = fr.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="one JSON object per line per frame")
    g.add_argument("--parquet", metavar="OUT", help="write the table as parquet")
    g.add_argument("--csv", metavar="OUT", help="write the table as CSV")
    fr.add_argument(
        "--filter",
        metavar="EXPR",
        help="a pandas query over the columns, e.g. \"name == 'DCP_MUTATION' and vbucket == 3\"; evaluated as Python: pass only trusted text",
    )
    fr.set_defaults(func=_cmd_frames)
    sh = sub.add_parser("show", help="annotated byte tables of selected frames of a capture")
    _capture_args(sh)
    sh.add_argument("--frame", type=int, action="append", help="frame number (repeatable)")
    sh.add_argument("--conn", type=int, help="connection number")
    sh.add_argument("--opcode", action="append", help="command name, e.g. DCP_STREAM_REQ (repeatable)")
    sh.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets")
    sh.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, help="grid rows before long frames are elided (0: never)")
    sh.set_defaults(func=_cmd_show)
    sm = sub.add_parser("summary", help="connections, negotiated features, per-command counts, bytes lost, problems")
    _capture_args(sm)
    sm.set_defaults(func=_cmd_summary)
    tl = sub.add_parser("timeline", help="per-stream timelines: attempts, rollbacks explained, snapshots, ends, anomalies")
    _capture_args(tl)
    tl.add_argument("--json", action="store_true", help="one JSON object per stream, then one per vbucket branch tree")
    tl.add_argument("--vbucket", type=int, help="only this vbucket")
    tl.add_argument("--conn", type=int, help="only this connection")
    tl.set_defaults(func=_cmd_timeline)
    for name, what in (
        ("sim", "run the DCP producer simulator"),
        ("client", "stream from a server as a DCP client"),
        ("proxy", "a byte-exact tap proxy that decodes and records"),
        ("sniff", "capture and decode live from an interface"),
        ("analyze", "run the captures -> frames -> timelines pipeline on Spark: parquet tables and an HTML report"),
    ):
        sub.add_parser(name, help=f"{what} (see 'dcpinspect {name} --help')", add_help=False)
    return p


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, stdin: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status."""
    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LIVE_COMMANDS:  # the live tools own their command lines
        import importlib

        module = importlib.import_module(f"dcpinspect.{LIVE_COMMANDS[argv[0]]}")
        return int(module.command(argv[1:], out=out))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args, out, stdin or sys.stdin))
    except CliError as exc:
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
        return 2
    except BrokenPipeError:  # pragma: no cover - e.g. piped into head
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
