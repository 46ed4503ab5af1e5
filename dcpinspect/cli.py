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

from .decoder import Event, Frame, decode
from .dissect import DissectContext, dissect
from .render import DEFAULT_MAX_ROWS, annotate

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
    return p


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, stdin: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status."""
    out = out or sys.stdout
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
