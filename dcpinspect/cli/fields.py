"""``dcpinspect fields``: every table's fields with their types and meanings, and the display filter's functions (as ``tshark -G fields``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from itertools import groupby

from .command import CliError, Console

__all__ = ["ARGUMENTS"]


def _fields(args: argparse.Namespace, console: Console) -> int:
    from ..tables.fields import fields

    try:
        rows = fields(args.table)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    out = console.out
    if args.json:
        out.write("".join(json.dumps(row._asdict()) + "\n" for row in rows))
        return 0
    blocks = []
    for table, group in groupby(rows, key=lambda r: r.table):
        items = list(group)
        nw = max(len(r.name) for r in items)
        tw = max(len(r.type) for r in items)
        title = "filter functions and operators" if table == "filter" else f"{table} table"
        blocks.append("\n".join([f"== {title}", *(f"  {r.name.ljust(nw)}  {r.type.ljust(tw)}  {r.meaning}" for r in items)]))
    out.write("\n\n".join(blocks) + "\n")
    return 0


def _fields_arguments(p: argparse.ArgumentParser) -> None:
    from ..tables.fields import FIELD_TABLES

    p.add_argument("--table", choices=FIELD_TABLES, help="only this table (default: every table)")
    p.add_argument("--json", action="store_true", help="one JSON object per field: table, name, type, meaning")
    p.set_defaults(func=_fields)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"fields": _fields_arguments}
