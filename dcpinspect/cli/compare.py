"""``dcpinspect compare``: why one consumer has what another has not (:mod:`dcpinspect.tables.compare`).

Rules:

1. ``CAPTURE_A CAPTURE_B``: each capture is read once (frames and timeline);
   the consumer of each is all its connections, or the one ``--a``/``--b``
   picks.  ``CAPTURE`` alone: two of its consumers, picked by ``--a`` and
   ``--b`` (or its two DCP_OPEN names when it has exactly two).  A selector
   is a connection number or a DCP_OPEN name.
2. Text: the story (per vbucket the counts and each difference with its
   reason), then the per-vbucket counts and the differences as tables.
   ``--json``: one object per vbucket (``{"vbucket": ..., "per_vbucket": {...}}``)
   then one per difference (``{"difference": {...}}``).  Wire text is escaped.
3. A selector that names nothing is a one-line error (exit 2); a capture
   that cannot be read too (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..flows.reassembly import DEFAULT_SERVER_PORTS
from ..wire.render import safe_text
from .command import CliError, Console

__all__ = ["ARGUMENTS", "json_lines"]


def json_lines(comparison: Any) -> list[str]:
    """Rule 2's JSON objects: the consumers, one per vbucket, then one per difference."""
    from ..tables.compare import comparison_records

    return [json.dumps(r) for r in comparison_records(comparison)]


def _text(comparison: Any) -> str:
    from ..tables.compare import comparison_text

    return comparison_text(comparison, safe_text)


def _compare(args: argparse.Namespace, console: Console) -> int:
    from ..tables.compare import UnreadableCapture, compare

    if args.capture_b is None and (args.a is None) != (args.b is None):
        raise CliError("one capture: pick both consumers with --a and --b (a connection number or a DCP_OPEN name each)")
    try:
        comparison = compare(
            args.capture_a,
            args.capture_b,
            consumer_a=args.a,
            consumer_b=args.b,
            vbucket=args.vbucket,
            server_ports=args.port or DEFAULT_SERVER_PORTS,
            detect=not args.no_detect,
        )
    except UnreadableCapture as exc:
        sys.stderr.write(f"dcpinspect: error: {safe_text(str(exc))}\n")
        return 1
    except ValueError as exc:
        raise CliError(safe_text(str(exc))) from None
    if args.json:
        console.out.write("".join(line + "\n" for line in json_lines(comparison)))
    else:
        console.out.write(_text(comparison))
    return 0


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Compare two DCP consumers - of two captures, or two connections of one - per vbucket: the seqnos and keys each "
        "received, where their failover histories diverge, and why one has what the other has not (a different start, "
        "a collections filter, a rollback, a stream that ended early, dedup across snapshots, another branch)."
    )
    p.epilog = (
        "examples:\n"
        "  dcpinspect compare captures/live-collections.pcap --a 1 --b 2\n"
        "  dcpinspect compare captures/live-purge-rollback.pcap --a live-purge-first --b live-purge-resume --vbucket 0\n"
        "  dcpinspect compare captures/live-plain.pcap captures/live-rollback-retry.pcap --json"
    )
    p.add_argument("capture_a", metavar="CAPTURE_A", help="pcap or pcapng file of consumer a (and of b when CAPTURE_B is not given)")
    p.add_argument("capture_b", metavar="CAPTURE_B", nargs="?", help="pcap or pcapng file of consumer b")
    p.add_argument(
        "--a",
        metavar="CONN|NAME",
        help="consumer a: a connection number, or a DCP_OPEN name (every connection that opened with it); "
        "default: every connection of CAPTURE_A, or with one capture its first of exactly two DCP_OPEN names",
    )
    p.add_argument(
        "--b",
        metavar="CONN|NAME",
        help="consumer b, as --a; default: every connection of CAPTURE_B, or with one capture its second DCP_OPEN name",
    )
    p.add_argument("--vbucket", type=int, help="only this vbucket")
    p.add_argument("--port", type=int, action="append", help="server port(s) carrying memcached binary (default 11210, 11209, 11211)")
    p.add_argument("--no-detect", action="store_true", help="do not detect the protocol on other ports")
    p.add_argument("--json", action="store_true", help="one JSON object for the consumers, one per vbucket, then one per difference")
    p.set_defaults(func=_compare)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"compare": _compare_arguments}
