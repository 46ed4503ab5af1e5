"""``dcpinspect follow``: one connection, both directions in capture order, or one DCP stream's messages (like ``tshark -z follow``).

Rules:

1. ``--conn N``: the connection's rows of the frames table in record order
   (the order frames completed in the capture), one line each as ``frames``
   prints them (:func:`~dcpinspect.cli.output.text_line`; ``--json``:
   :func:`~dcpinspect.cli.output.json_line`).  Relative and delta times
   (``-t``) refer to every frame read, as in ``frames``.
2. ``--conn N --raw``: the connection's bytes as a hex dump in the layout of
   ``tshark -z follow,tcp,hex``: 16 bytes a line, each direction with its own
   offsets, the server's lines indented by a tab; bytes lost to capture gaps
   are a ``[N bytes missing]`` line, never zeros.
3. ``--stream VB[:SID]``: every stream segment of vbucket VB (of stream id
   SID; on connection N with ``--conn``), under a header line, with its
   messages in order: the stream requests and their responses, snapshot
   markers, items, seqno-advanced, the end, the close.  The timeline says
   which frames belong to a segment (it pairs a producer's messages with the
   stream by their opaque); frames on the same connection, with the same
   opaque and vbucket, inside the segment's span that the timeline did not
   take are listed too.
"""

from __future__ import annotations

import argparse
import json
import string
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..flows.records import CaptureStats
from ..wire.render import plural, safe_text
from .capture import capture_arguments, read_capture_parts, report_files, time_argument, timeline_builder
from .command import CliError, Console

__all__ = ["ARGUMENTS", "hex_lines", "parse_stream", "stream_frames"]

_PRINTABLE = frozenset(string.ascii_letters + string.digits + string.punctuation + " ")


def parse_stream(text: str) -> tuple[int, int | None]:
    """``VB`` or ``VB:SID`` -> (vbucket, stream id or None); a ``ValueError`` says what is wrong."""
    vb, _, sid = text.partition(":")
    try:
        vbucket = int(vb, 0)
        stream_id = int(sid, 0) if sid else None
    except ValueError:
        raise ValueError(f"--stream {text!r}: expected VB or VB:SID, e.g. 3 or 3:1") from None
    if not 0 <= vbucket < 1 << 16 or (stream_id is not None and not 0 <= stream_id < 1 << 16):
        raise ValueError(f"--stream {text!r}: vbucket and stream id are 0-65535")
    return vbucket, stream_id


def hex_lines(data: bytes, offset: int, indent: str = "") -> list[str]:
    """``data`` (at ``offset`` in its direction's stream) as tshark's follow hex lines: offset, 16 bytes in two groups, ASCII."""
    out = []
    for at in range(0, len(data), 16):
        chunk = data[at : at + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk[:8])
        if len(chunk) > 8:
            hexes += "  " + " ".join(f"{b:02x}" for b in chunk[8:])
        text = "".join(chr(b) if chr(b) in _PRINTABLE else "." for b in chunk)
        out.append(f"{indent}{offset + at:08x}  {hexes:<49} {text}")
    return out


def _event_bytes(ev: Any) -> bytes | None:
    """The bytes of a frame, garbage run or truncated frame; None for a gap."""
    if ev.type == "frame":
        return bytes(ev[1])
    if ev.type == "gap":
        return None
    return bytes(ev.data)


def stream_frames(s: Any) -> Iterator[int]:
    """Every frame number a timeline stream segment names: requests, responses, markers, items, end, close, anomalies."""
    for a in s.attempts:
        yield a.frame
        if a.response_frame is not None:
            yield a.response_frame
    yield from (sn.frame for sn in s.snapshots)
    yield from (it.frame for it in s.items)
    if s.end is not None and s.end.get("frame") is not None:
        yield s.end["frame"]
    yield from (f for f in (s.closed_frame, s.close_answered) if f is not None)
    for an in s.anomalies:
        yield from an.frames


def _clock(args: argparse.Namespace) -> Any:
    from .output import Clock

    return Clock(args.time)


def _lines(rows: list[dict[str, Any]], as_json: bool, clock: Any) -> str:
    from .output import json_line, text_line

    return "".join((json_line(r) if as_json else text_line(r, clock)) + "\n" for r in rows)


def _columns(table: Any) -> tuple[str, ...]:
    from .output import JSON_COLUMNS, TEXT_COLUMNS, TS_REF

    cols = (*TEXT_COLUMNS, *JSON_COLUMNS, "conn")
    if TS_REF in table.schema.names:
        cols += (TS_REF,)
    return tuple(dict.fromkeys(c for c in cols if c in table.schema.names))


def _follow_frames(args: argparse.Namespace, out: Any, stats: CaptureStats) -> int:
    from ..tables.export import frame_rows
    from ..tables.follow import conn_rows

    clock = _clock(args)
    shown = 0
    for part in read_capture_parts(args, stats):
        batch = part.batch
        if not batch.num_rows:
            continue
        mine = conn_rows(clock.prepare(batch) if not args.json else batch, args.conn)
        if not mine.num_rows:
            continue
        rows = frame_rows(mine, _columns(mine))
        if not shown and not args.json:
            out.write(f"== conn {args.conn}  {safe_text(rows[0]['conn'])}  (c2s: client to server, s2c: server to client)\n")
        shown += len(rows)
        out.write(_lines(rows, args.json, clock))
    return shown


def _follow_raw(args: argparse.Namespace, out: Any, stats: CaptureStats) -> int:
    rule = "=" * 67
    shown = 0
    for part in read_capture_parts(args, stats):
        for rec in part.records():
            if rec.conn != args.conn:
                continue
            if not shown:
                client, _, server = rec.conn_label.partition(" -> ")
                out.write(f"{rule}\nFollow: dcpinspect conn {args.conn},hex\nNode 0: {safe_text(client)}\nNode 1: {safe_text(server)}\n")
            shown += 1
            indent = "" if rec.direction == "c2s" else "\t"
            data = _event_bytes(rec.event)
            if data is None:
                out.write(f"{indent}[{rec.event.length} bytes missing]\n")
            else:
                out.write("".join(line + "\n" for line in hex_lines(data, rec.event.offset, indent)))
    if shown:
        out.write(rule + "\n")
    return shown


def _segment_header(s: Any, label: str, items: int) -> str:
    attempts = ", ".join(f"{a.outcome or 'unanswered'} (frame {a.frame})" for a in s.attempts) or "none captured"
    end = "no end" if s.end is None else f"end {s.end.get('name')} (frame {s.end.get('frame')})"
    sid = "-" if s.stream_id is None else s.stream_id
    return (
        f"== stream vb {s.vbucket} sid {sid}  conn {s.conn} {safe_text(label)}  segment {s.segment}: "
        f"requests {attempts}; {plural(len(s.snapshots), 'snapshot')}, {plural(items, 'item')}, {end}\n"
    )


def _follow_stream(args: argparse.Namespace, out: Any, stats: CaptureStats) -> int:
    from ..tables.export import frame_rows
    from ..tables.follow import concat, segment_rows, stream_candidates
    from ..tables.timeline_feed import feed_parts

    vb, sid = parse_stream(args.stream)
    clock = _clock(args)
    kept: list[Any] = []

    def keep(parts: Iterable[Any]) -> Iterator[Any]:
        for part in parts:
            batch = part.batch
            kept.append(stream_candidates(clock.prepare(batch) if not args.json else batch, vb))
            yield part

    builder = feed_parts(keep(read_capture_parts(args, stats)), timeline_builder(args))
    t = builder.timeline()
    t.set_first = dict(stats.set_first)
    index = {id(s): i for i, s in enumerate(t.streams)}
    segs = [s for s in t.streams if s.vbucket == vb and (sid is None or s.stream_id == sid) and (args.conn is None or s.conn == args.conn)]
    if not segs:
        return 0
    table = concat(kept)
    labels = {c.id: c.label for c in stats.connections}
    shown = 0
    for k, s in enumerate(segs):
        named = set(stream_frames(s))
        later = [o for o in segs[k + 1 :] if (o.conn, o.stream_id) == (s.conn, s.stream_id)]
        lo = min(named, default=0)
        hi = min((min(stream_frames(o), default=lo) for o in later), default=None)
        opaques = {a.opaque for a in s.attempts} | ({s.opaque} if s.opaque is not None else set())
        rows = segment_rows(table, s.conn, s.stream_id, named, opaques, lo, hi) if table is not None else None
        items = builder.items_seen(index[id(s)])
        if args.json:
            head = {"stream": {"conn": s.conn, "vbucket": s.vbucket, "stream_id": s.stream_id, "segment": s.segment, "items": items}}
            out.write(json.dumps(head) + "\n")
        else:
            out.write(_segment_header(s, labels.get(s.conn, ""), items))
        if rows is not None and rows.num_rows:
            shown += rows.num_rows
            out.write(_lines(frame_rows(rows, _columns(rows)), args.json, clock))
    return max(shown, len(segs))


def _follow(args: argparse.Namespace, console: Console) -> int:
    if args.stream is None and args.conn is None:
        raise CliError("follow needs --conn N (a connection) or --stream VB[:SID] (a DCP stream)")
    if args.raw and args.stream is not None:
        raise CliError("--raw follows a connection (--conn N), not a stream")
    if args.stream is not None:
        try:
            parse_stream(args.stream)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    stats = CaptureStats()
    out = console.out
    if args.stream is not None:
        shown = _follow_stream(args, out, stats)
    elif args.raw:
        shown = _follow_raw(args, out, stats)
    else:
        shown = _follow_frames(args, out, stats)
    bad = report_files(stats)
    readable = any(not info["error"] for info in stats.files.values())
    if readable and not shown:
        if args.stream is not None:
            on = "" if args.conn is None else f" on connection {args.conn}"
            what = f"no DCP stream of vbucket {args.stream}{on} in the capture"
        elif all(c.id != args.conn for c in stats.connections):
            what = f"no connection {args.conn} (the capture has {len(stats.connections)})"
        else:
            what = f"connection {args.conn} has no frames (TLS, or nothing decoded)"
        import sys

        sys.stderr.write(f"dcpinspect: error: {what}\n")
        return 1
    return 1 if bad else 0


def _follow_arguments(p: argparse.ArgumentParser) -> None:

    p.description = "One connection's frames (or bytes) in capture order, both directions, or one DCP stream's messages."
    p.epilog = (
        "examples:\n"
        "  dcpinspect follow captures/live-stream-ids.pcap --conn 1\n"
        "  dcpinspect follow captures/live-stream-ids.pcap --conn 1 --raw\n"
        "  dcpinspect follow captures/live-stream-ids.pcap --stream 0:2\n"
        "  dcpinspect follow captures/live-rollback-retry.pcap --stream 0 --json"
    )
    capture_arguments(p)
    p.add_argument("--conn", type=int, metavar="N", help="the connection to follow (its number, as frames and summary show it)")
    p.add_argument(
        "--stream",
        metavar="VB[:SID]",
        help="the DCP stream of vbucket VB (and stream id SID) to follow, every segment of it (with --conn: on N)",
    )
    p.add_argument("--raw", action="store_true", help="the connection's bytes as a hex dump (tshark's follow,tcp,hex layout)")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per frame (as frames --json); with --stream, a header object per segment"
    )
    time_argument(p)
    p.set_defaults(func=_follow)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"follow": _follow_arguments}
