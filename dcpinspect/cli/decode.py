"""``dcpinspect decode | reference | examples``: bytes in, annotated frames out (the core only, nothing heavy)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

from ..wire.decoder import decode
from ..wire.dissect import dissect
from ..wire.dissection import DissectContext
from ..wire.events import Event, Frame
from ..wire.render import DEFAULT_MAX_ROWS, annotate, plural
from .command import CliError, Console

__all__ = ["ARGUMENTS", "event_dict", "parse_hex"]


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


def _read_inputs(args: argparse.Namespace, console: Console) -> list[tuple[str | None, bytes]]:
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
        return [(None, parse_hex(console.stdin.read()))]
    if not args.hex:
        raise CliError("no input: give hex bytes, '-' to read hex from stdin, or --file F for raw bytes")
    return [(None, parse_hex(" ".join(args.hex)))]


def _decode(args: argparse.Namespace, console: Console) -> int:
    out = console.out
    inputs = _read_inputs(args, console)
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
            chunks.insert(
                0, f"== {name}: {plural(len(data), 'byte')}, {plural(frames, 'frame')}, {plural(len(events) - frames, 'other event')}"
            )
        out.write("\n\n".join(chunks) + "\n\n")
    return 0


def _reference(args: argparse.Namespace, console: Console) -> int:
    from ..protocol.reference import reference_markdown

    console.out.write(reference_markdown())
    return 0


def _examples(args: argparse.Namespace, console: Console) -> int:
    from ..wire.examples import EXAMPLES
    from ..wire.render import breakdown, byte_table

    chosen = [e for e in EXAMPLES if not args.names or e.name in args.names]
    if args.names and len(chosen) != len(set(args.names)):
        known = ", ".join(e.name for e in EXAMPLES)
        raise CliError(f"unknown example name(s); known: {known}")
    for ex in chosen:
        d = ex.dissect()
        console.out.write(f"== {ex.name} (seed {ex.seed}): {ex.title}\n{byte_table(d, max_rows=None)}\n\n{breakdown(d)}\n\n")
    return 0


def _decode_arguments(d: argparse.ArgumentParser) -> None:
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
    d.set_defaults(func=_decode)


def _reference_arguments(r: argparse.ArgumentParser) -> None:
    r.set_defaults(func=_reference)


def _examples_arguments(e: argparse.ArgumentParser) -> None:
    from ..wire.examples import EXAMPLES

    e.add_argument("names", nargs="*", metavar="NAME", help="example names (default: all): " + ", ".join(x.name for x in EXAMPLES))
    e.set_defaults(func=_examples)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "decode": _decode_arguments,
    "reference": _reference_arguments,
    "examples": _examples_arguments,
}
