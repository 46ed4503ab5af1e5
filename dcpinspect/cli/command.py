"""What every subcommand shares: the parser class of the tree, the user error, and where a command reads and writes."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

__all__ = ["CliError", "CommandParser", "Console"]


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


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser in the one tree: its arguments are added when it is chosen.

    ``configure`` adds the arguments (and imports what they name) the first
    time the parser parses, so ``dcpinspect decode`` never imports the
    simulator, the client or Spark.  A ``strict`` parser reports arguments
    it does not know itself (``dcpinspect sim: error: unrecognized
    arguments``); the others leave that to the top-level parser.
    """

    def __init__(
        self, *args: object, configure: Callable[[CommandParser], None] | None = None, strict: bool = False, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.configure = configure
        self.strict = strict

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Add the arguments (once), then parse as argparse does."""
        if self.configure is not None:
            configure, self.configure = self.configure, None
            configure(self)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.strict:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras
