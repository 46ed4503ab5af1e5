"""``dcpinspect replay``: serve a capture's recorded producer to a new client (:mod:`dcpinspect.live.replay`).

Rules:

1. The capture is read with the capture commands' options
   (:func:`~.capture.capture_arguments`); the connection replayed is
   ``--conn N`` or the first DCP producer connection, and the first line
   says which and why.  No such connection: one line and exit 2.
2. stdout: ``replaying ...``, ``listening on HOST:PORT``, then a line per
   divergence as it happens and a summary per client when it closes
   (``--json``: one JSON object each, ``event`` naming it).  stderr: the
   connection log and errors, one line each, never a traceback.
3. It serves every client that connects, each a fresh replay, until
   SIGINT/SIGTERM; ``--once`` stops after the first client closed.  Exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from ..flows.records import CaptureStats
from ..wire.render import plural, safe_text
from .capture import capture_arguments, read_capture_parts, report_files
from .command import CliError, Console

__all__ = ["ARGUMENTS", "summary_line"]


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Serve the recorded producer side of one connection of a capture to new clients: the recorded HELLO, open and "
        "control answers, each stream request's recorded response (Success, Rollback, error) and then its recorded "
        "snapshots, items and stream end, with the new client's opaques. Requests that differ from the recording are "
        "answered by the simulator's rules from the recorded state and reported as divergences."
    )
    p.epilog = (
        "output:\n"
        "  stdout  'replaying connection N ...', 'listening on HOST:PORT', then one line\n"
        "          per divergence ('client C: divergence: KIND: asked ...; recorded ...;\n"
        "          answered ...') and one per client that closed (its summary)\n"
        "  stdout, --json  one JSON object each (event: replaying, listening, divergence, summary)\n"
        "\n"
        "authentication: the new client's SASL (PLAIN, SCRAM) is checked against --users (default\n"
        "Administrator:password), as 'dcpinspect sim' does: a recorded SCRAM exchange cannot be replayed.\n"
        "\n"
        "examples:\n"
        "  dcpinspect replay captures/live-rollback-retry.pcap --listen 127.0.0.1:0\n"
        "  dcpinspect replay captures/live-stream-ends.pcap --conn 2 --pace fast --json --once"
    )
    capture_arguments(p)
    p.add_argument("--listen", default="127.0.0.1:0", metavar="ADDR", help="where to listen: HOST:PORT, :PORT or PORT (port 0: a free one)")
    p.add_argument("--conn", type=int, metavar="N", help="the connection to replay (default: the first DCP producer connection)")
    p.add_argument(
        "--pace",
        choices=("captured", "fast"),
        default="captured",
        help="stream messages at their recorded delays (captured) or as fast as flow control allows (fast)",
    )
    p.add_argument("--users", nargs="+", action="extend", metavar="USER:PASS", help="credentials the new clients authenticate with")
    p.add_argument("--users-file", metavar="PATH", help="read credentials from this file, one USER:PASS per line ('#' comments)")
    p.add_argument("--once", action="store_true", help="stop after the first client closed")
    p.add_argument("--json", action="store_true", help="one JSON object per line (event: replaying, listening, divergence, summary)")
    p.set_defaults(func=_replay)


def summary_line(s: dict[str, Any]) -> str:
    """One line of a client's summary."""
    name = f" {safe_text(str(s['name']))!r}" if s.get("name") else ""
    return (
        f"client {s['conn']}{name} closed ({safe_text(str(s['closed']))}): {s['frames_in']} frames in, {s['frames_out']} out, "
        f"{plural(s['streams_replayed'], 'stream')} replayed, {s['streams_by_rule']} by rule, {plural(s['items'], 'item')}, "
        f"{plural(s['divergences'], 'divergence')}"
    )


class _Out:
    """Text or JSON lines on stdout, flushed at once (a client's tester reads them live)."""

    def __init__(self, out: TextIO, as_json: bool) -> None:
        self.out, self.as_json = out, as_json

    def emit(self, obj: dict[str, Any], text: str) -> None:
        self.out.write((json.dumps(obj, default=str) if self.as_json else text) + "\n")
        self.out.flush()


def _replay(args: argparse.Namespace, console: Console) -> int:
    from ..live.replay_script import ScriptError, extract_script
    from .live import parse_address, sim_users

    try:
        listen = parse_address(args.listen, listen=True)
        users = sim_users(args, console.environ)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.conn is not None and args.conn < 1:
        raise CliError("--conn takes a connection number (1, 2, ...)")
    stats = CaptureStats()
    records = [r for part in read_capture_parts(args, stats) for r in part.records()]
    if report_files(stats) and not records:
        return 1
    try:
        script = extract_script(records, args.conn)
    except ScriptError as exc:
        raise CliError(str(exc)) from None
    out = _Out(console.out, args.json)
    files = ", ".join(args.captures)
    out.emit(
        {"event": "replaying", "conn": script.conn, "name": script.name, "why": script.why, "captures": args.captures, "pace": args.pace},
        f"replaying {script.describe()} of {files}; pace {args.pace}",
    )
    try:
        return asyncio.run(_serve(script, listen, users, args, out))
    except KeyboardInterrupt:
        return 0


async def _serve(script: Any, listen: tuple[str, int], users: dict[str, str], args: argparse.Namespace, out: _Out) -> int:
    from ..live.replay_server import ReplayServer, log
    from ..live.tap import format_endpoint
    from .live import until_signalled

    done = asyncio.Event()

    def divergence(conn: Any, div: Any) -> None:
        out.emit({**div.as_dict(), "client": conn.serial}, f"client {conn.serial}: {div.line()}")

    def closed(conn: Any) -> None:
        s = conn.summary()
        out.emit(s, summary_line(s))
        if args.once:
            done.set()

    server = ReplayServer(
        script,
        host=listen[0],
        port=listen[1],
        pace=args.pace,
        users=users,
        on_divergence=divergence,
        on_closed=closed,
        source=", ".join(args.captures),
    )
    with _log_to_stderr(log):
        try:
            await server.start()
        except OSError as exc:
            raise CliError(f"cannot listen on {format_endpoint(listen)}: {exc.strerror or exc}") from None
        out.emit({"event": "listening", "host": server.host, "port": server.port}, f"listening on {format_endpoint(server.address)}")
        waits: list[asyncio.Task[Any]] = [asyncio.create_task(until_signalled()), asyncio.create_task(done.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in waits:
                t.cancel()
            await server.stop()
    return 0


@contextlib.contextmanager
def _log_to_stderr(log: logging.Logger) -> Iterator[None]:
    """The replay's connection log on stderr, ``dcpinspect replay: ...`` one line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dcpinspect replay: %(message)s"))
    log.addHandler(handler)
    level, log.level = log.level, logging.INFO
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"replay": _replay_arguments}
