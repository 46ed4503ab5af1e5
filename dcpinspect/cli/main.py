"""``dcpinspect``: the one argparse tree and its dispatch.

Every subcommand is listed here with its one-line help; its arguments and
its code live in the module of its group (:mod:`.decode`, :mod:`.capture`,
:mod:`.live`, :mod:`.analyze`), imported only when it is chosen.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from .command import CliError, CommandParser, Console

__all__ = ["COMMANDS", "build_parser", "main"]

#: (subcommand, its group's module, one-line help) in the order ``dcpinspect --help`` lists them
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("decode", "decode", "annotate the frames in hex or raw bytes"),
    ("reference", "decode", "print the protocol reference (Markdown) generated from the table"),
    ("examples", "decode", "annotate the packets drawn in the seed documents"),
    ("frames", "capture", "the frames table of captures (text, JSON lines, parquet or CSV)"),
    ("show", "capture", "annotated byte tables of selected frames of a capture"),
    ("summary", "capture", "connections, negotiated features, per-command counts, bytes lost, problems"),
    ("timeline", "capture", "per-stream timelines: attempts, rollbacks explained, snapshots, ends, anomalies"),
    ("sim", "live", "run the DCP producer simulator (see 'dcpinspect sim --help')"),
    ("client", "live", "stream from a server as a DCP client (see 'dcpinspect client --help')"),
    ("proxy", "live", "a byte-exact tap proxy that decodes and records (see 'dcpinspect proxy --help')"),
    ("sniff", "live", "capture and decode live from an interface (see 'dcpinspect sniff --help')"),
    (
        "analyze",
        "analyze",
        "run the captures -> frames -> timelines pipeline on Spark: parquet tables and an HTML report (see 'dcpinspect analyze --help')",
    ),
)
#: groups whose parsers report unknown arguments themselves (``dcpinspect sim: error: ...``)
_STRICT = frozenset({"live", "analyze"})


def _arguments(group: str) -> Mapping[str, Callable[[argparse.ArgumentParser], None]]:
    """The argument adders of a subcommand group (its module is imported now: only the chosen subcommand's group is)."""
    if group == "decode":
        from .decode import ARGUMENTS
    elif group == "capture":
        from .capture import ARGUMENTS
    elif group == "live":
        from .live import ARGUMENTS
    else:
        from .analyze import ARGUMENTS
    return ARGUMENTS


def _configure(command: str, group: str) -> Callable[[CommandParser], None]:
    def configure(parser: CommandParser) -> None:
        _arguments(group)[command](parser)

    return configure


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: every subcommand, each configured when it is chosen (exposed for docs and tests)."""
    p = argparse.ArgumentParser(prog="dcpinspect", description="Inspect DCP and memcached binary protocol traffic.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for command, group, what in COMMANDS:
        sub.add_parser(command, help=what, configure=_configure(command, group), strict=group in _STRICT)
    return p


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    stdin: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run the CLI; returns the exit status (also for ``--help`` and usage errors, which argparse has printed)."""
    console = Console(out or sys.stdout, stdin or sys.stdin, os.environ if environ is None else environ)
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    args.own_process = argv is None  # the command line itself (not a caller's Python): start-up shortcuts are safe
    try:
        return int(args.func(args, console))
    except CliError as exc:
        sys.stderr.write(f"dcpinspect: error: {exc}\n")
        return 2
    except BrokenPipeError:  # pragma: no cover - e.g. piped into head
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
