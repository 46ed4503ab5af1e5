"""``dcpinspect``: the one argparse tree and its dispatch.

Every subcommand is listed here with its one-line help (:data:`COMMANDS`)
and its description and examples (:data:`HELP`); its arguments and its code
live in the module of its group (:mod:`.decode`, :mod:`.fields`,
:mod:`.capture`, :mod:`.live`, :mod:`.analyze`), imported only when it is
chosen.  ``dcpinspect`` alone prints the help and exits 0 (as ``--help``);
``dcpinspect --version`` prints the installed version.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from .command import CliError, CommandParser, Console, HelpFormatter

__all__ = ["COMMANDS", "HELP", "build_parser", "main", "version"]

#: (subcommand, its group's module, one-line help) in the order ``dcpinspect --help`` lists them
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("decode", "decode", "annotate the frames in hex or raw bytes"),
    ("reference", "decode", "print the protocol reference (Markdown) generated from the table"),
    ("examples", "decode", "annotate the example packets drawn in the DCP docs and the UPR draft"),
    ("frames", "capture", "the frames table of captures (text, JSON lines, parquet or CSV)"),
    ("show", "capture", "annotated byte tables of selected frames of a capture"),
    ("summary", "capture", "connections, negotiated features, per-command counts, bytes lost, problems"),
    ("timeline", "capture", "per-stream timelines: attempts, rollbacks explained, snapshots, ends, anomalies"),
    ("fields", "fields", "every table's fields with type and meaning, and the display filter's functions"),
    ("follow", "follow", "one connection's frames or bytes in order, or one DCP stream's messages (like tshark -z follow)"),
    ("stats", "stats", "statistics: response times per command, statuses, conversations, vbucket progress and lag"),
    ("key", "key", "did my consumer get document X, and which version: every item of a key, its snapshot and its fate"),
    ("lag", "lag", "how far behind each consumer is: per vbucket, its seqno against the producer's high seqno, worst first"),
    ("compare", "compare", "why one DCP consumer has what another has not: two captures, or two connections of one"),
    ("sim", "live", "run the DCP producer simulator (see 'dcpinspect sim --help')"),
    ("client", "live", "stream from a server as a DCP client (see 'dcpinspect client --help')"),
    ("proxy", "live", "a byte-exact tap proxy that decodes and records (see 'dcpinspect proxy --help')"),
    ("sniff", "live", "capture and decode live from an interface (see 'dcpinspect sniff --help')"),
    ("replay", "replay", "serve a capture's recorded producer to new clients, reporting each divergence"),
    (
        "analyze",
        "analyze",
        "run the captures -> frames -> timelines pipeline on Spark: parquet tables and an HTML report (see 'dcpinspect analyze --help')",
    ),
)
#: subcommand -> (description, epilog: examples that work) of its ``--help``; a group may set its own description, and an
#: epilog of its own, which these examples then follow unless it has examples (see :class:`~.command.CommandParser`); the
#: live tools and follow/stats write theirs in their groups
HELP: dict[str, tuple[str, str]] = {
    "decode": (
        "Decode memcached binary protocol / DCP frames given as hex (or raw bytes from files) and annotate each "
        "in the protocol docs' style: the 4-byte grid, then a Field (offset) (value) breakdown and any problems.",
        "examples:\n"
        "  dcpinspect decode 80 b5 00 00 00 00 00 00 00 00 00 00 00 00 00 07 00 00 00 00 00 00 00 00\n"
        "  echo '815c0000000000000000000000000007 0000000000000000' | dcpinspect decode -\n"
        "  dcpinspect decode --json --file frame.bin",
    ),
    "reference": (
        "Print the protocol reference (every opcode's request and response layout, statuses, flags) as Markdown, "
        "generated from the same table the decoder reads.",
        "example:\n  dcpinspect reference > REFERENCE.md",
    ),
    "examples": (
        "Annotate the example packets drawn in kv_engine's DCP documentation and the UPR draft (the golden test vectors; docs/SOURCES.md).",
        "examples:\n  dcpinspect examples\n  dcpinspect examples stream-req-rollback-response upr-ok-response",
    ),
    "frames": (
        "List the frames of captures (pcap, pcapng) as text, one line per frame (frame number, time, packet, connection, "
        "direction, command, status or vbucket, opaque, key, seqno, problems), as JSON lines, or write them as parquet or CSV. "
        "--filter keeps the frames a display filter matches ('dcpinspect fields' lists the fields).",
        "examples:\n"
        "  dcpinspect frames captures/seed-000-rollback-retry.pcap\n"
        "  dcpinspect frames -t ad --filter \"name == 'DCP_STREAM_REQ' and status == 0x23\" captures/seed-000-rollback-retry.pcap\n"
        "  dcpinspect frames --filter has_problem captures/messy.pcap\n"
        "  dcpinspect frames --parquet frames.parquet captures/*.pcap",
    ),
    "show": (
        "Print the annotated byte tables of selected frames of captures: by frame number, connection, command or display "
        "filter (all of them when none is given).",
        "examples:\n"
        "  dcpinspect show --frame 2 captures/seed-000-rollback-retry.pcap\n"
        "  dcpinspect show --opcode DCP_STREAM_REQ --conn 1 captures/seed-000-rollback-retry.pcap\n"
        "  dcpinspect show --filter \"has_problem('plausible')\" captures/messy.pcap",
    ),
    "summary": (
        "Summarise captures: each file, each connection (what it negotiated, bytes lost), frames per command and problems.",
        "example:\n  dcpinspect summary captures/messy.pcap",
    ),
    "timeline": (
        "Reconstruct every DCP stream: its requests and their outcomes (rollbacks explained from the failover logs), "
        "snapshots, items, ends and anomalies, and each vbucket's failover branches. --filter shows only the streams "
        "with a frame the filter matches; the timeline itself is always built from every frame.",
        "examples:\n"
        "  dcpinspect timeline captures/seed-000-rollback-retry.pcap\n"
        "  dcpinspect timeline --vbucket 0 --json captures/seed-000-rollback-retry.pcap\n"
        '  dcpinspect timeline --filter "status == 0x23" captures/*.pcap',
    ),
    "fields": (
        "List every field of the frames table (the names a display filter takes), the filter's functions and operators, "
        "and the columns of the timeline tables, each with its type and meaning (as tshark -G fields).",
        "examples:\n  dcpinspect fields\n  dcpinspect fields --table frames\n  dcpinspect fields --json",
    ),
    "analyze": (
        "Run the captures -> frames -> timelines pipeline on Spark; write parquet tables and an HTML report.",
        "examples:\n  dcpinspect analyze captures/*.pcap --out out/\n  dcpinspect analyze /data/big.pcap --out out/ --master spark://127.0.0.1:7077",
    ),
}
_TOP_EPILOG = (
    "'dcpinspect COMMAND --help' describes a command, with examples.\n\n"
    "examples:\n"
    "  dcpinspect frames captures/seed-000-rollback-retry.pcap\n"
    "  dcpinspect show --frame 2 captures/seed-000-rollback-retry.pcap\n"
    "  dcpinspect timeline captures/seed-000-rollback-retry.pcap\n"
    "  dcpinspect fields --table frames"
)
#: groups whose parsers report unknown arguments themselves (``dcpinspect sim: error: ...``)
_STRICT = frozenset({"live", "analyze"})


def _arguments(group: str) -> Mapping[str, Callable[[argparse.ArgumentParser], None]]:
    """The argument adders of a subcommand group (its module is imported now: only the chosen subcommand's group is)."""
    if group == "decode":
        from .decode import ARGUMENTS
    elif group == "fields":
        from .fields import ARGUMENTS
    elif group == "capture":
        from .capture import ARGUMENTS
    elif group == "live":
        from .live import ARGUMENTS
    elif group == "follow":
        from .follow import ARGUMENTS
    elif group == "stats":
        from .stats import ARGUMENTS
    elif group == "replay":
        from .replay import ARGUMENTS
    elif group == "key":
        from .key import ARGUMENTS
    elif group == "lag":
        from .lag import ARGUMENTS
    elif group == "compare":
        from .compare import ARGUMENTS
    else:
        from .analyze import ARGUMENTS
    return ARGUMENTS


def _configure(command: str, group: str) -> Callable[[CommandParser], None]:
    def configure(parser: CommandParser) -> None:
        _arguments(group)[command](parser)

    return configure


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: every subcommand, each configured when it is chosen (exposed for docs and tests)."""
    p = argparse.ArgumentParser(
        prog="dcpinspect",
        description="Inspect DCP and memcached binary protocol traffic.",
        epilog=_TOP_EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for command, group, what in COMMANDS:
        description, epilog = HELP.get(command, (what, None))
        sub.add_parser(
            command, help=what, description=description, epilog=epilog, configure=_configure(command, group), strict=group in _STRICT
        )
    return p


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked (``importlib.metadata`` is not free at start-up)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, help="show the installed version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: object, values: object, option_string: str | None = None) -> None:
        sys.stdout.write(f"{parser.prog} {version()}\n")
        parser.exit()


def version() -> str:
    """The installed distribution's version (``unknown`` when it is not installed, e.g. run from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("dcpinspect")
    except PackageNotFoundError:
        return "unknown"


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    stdin: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run the CLI; returns the exit status (also for ``--help`` and usage errors, which argparse has printed)."""
    console = Console(out or sys.stdout, stdin or sys.stdin, os.environ if environ is None else environ)
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments:  # no command: the help, and success (as 'dcpinspect --help')
        build_parser().print_help()
        return 0
    try:
        args = build_parser().parse_args(arguments)
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
