"""The command line run in-process, for the CLI tests: ``run("frames", path) -> (exit status, stdout)`` (stderr: capsys)."""

from __future__ import annotations

import io

from dcpinspect.cli.main import main


def run(*argv: str, stdin: str = "") -> tuple[int, str]:
    """``dcpinspect ARGV...`` with ``stdin`` as its standard input: its exit status and what it wrote to stdout."""
    out = io.StringIO()
    code = main(list(argv), out=out, stdin=io.StringIO(stdin))
    return code, out.getvalue()
