"""What every subcommand shares: the parser class of the tree, the user error, and where a command reads and writes."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

__all__ = ["CliError", "CommandParser", "Console", "HelpFormatter"]


class CliError(Exception):
    """A user error: printed as ``dcpinspect: error: ...`` with exit status 2."""


@dataclass(frozen=True)
class Console:
    """Where a command writes its output, reads ``-`` input, and looks up environment variables (passwords, users).

    Diagnostics go to ``sys.stderr``, looked up when written.
    """

    out: TextIO
    stdin: TextIO
    environ: Mapping[str, str]


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` of every command: each option's default shown, prose wrapped, indented lines (examples) kept as written.

    A default is shown when the option has one (not ``None``, not a flag's
    ``False``) and its help does not already say it.
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                lines.append(textwrap.fill(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False))
                prose.clear()

        for line in text.splitlines():
            if not line.strip():
                flush()
                lines.append("")
            elif line[0].isspace():
                flush()
                lines.append(indent + line)
            else:
                prose.append(line.strip())
        flush()
        return "\n".join(lines)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)  # names and flags stay whole

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or action.required or "default" in text.lower():
            return action.help
        if action.option_strings or action.nargs in ("?", "*"):
            return f"{text} (default: %(default)s)"
        return action.help


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser in the one tree: its arguments are added when it is chosen.

    ``configure`` adds the arguments (and imports what they name) the first
    time the parser parses, so ``dcpinspect decode`` never imports the
    simulator, the client or Spark.  Its help shows every option's default
    (:class:`HelpFormatter`); a description or epilog the group sets
    itself wins over the tree's, and the tree's examples follow its epilog
    unless that has examples of its own.  A ``strict`` parser reports arguments
    it does not know itself (``dcpinspect sim: error: unrecognized
    arguments``); the others leave that to the top-level parser.
    """

    def __init__(
        self, *args: object, configure: Callable[[CommandParser], None] | None = None, strict: bool = False, **kwargs: object
    ) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.configure = configure
        self.strict = strict

    def configured(self) -> CommandParser:
        """The parser with its arguments added (now, the first time it is asked; for docs and tests too)."""
        if self.configure is not None:
            configure, self.configure = self.configure, None
            examples = self.epilog
            configure(self)
            if examples and self.epilog != examples and "example" not in (self.epilog or "").lower():
                self.epilog = f"{self.epilog}\n\n{examples}"  # the group wrote an epilog of its own, without examples: ours follow it
        return self

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Add the arguments (once), then parse as argparse does."""
        self.configured()
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.strict:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras
