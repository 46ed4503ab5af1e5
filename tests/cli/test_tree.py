"""The one argparse tree: help texts pinned, subcommands configured (and their modules imported) only when chosen."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from paths import ROOT

from dcpinspect.cli.main import COMMANDS, build_parser, main


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="argparse lays help out differently in other Python versions")
def test_every_help_text_is_pinned(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], golden: Callable[[str, str], None]
) -> None:
    """``dcpinspect [CMD] --help`` byte for byte, as the commands printed them before the tree was one (80 columns)."""
    monkeypatch.setenv("COLUMNS", "80")
    parts = []
    for argv in [[], *([name] for name, _, _ in COMMANDS)]:
        assert main([*argv, "--help"]) == 0
        parts.append(f"== dcpinspect {' '.join([*argv, '--help'])}\n{capsys.readouterr().out}")
    golden("cli-help", "".join(parts))


def test_unknown_arguments_are_reported_where_they_were(capsys: pytest.CaptureFixture[str]) -> None:
    """The live tools and analyze name themselves; the capture and decode commands leave it to the top-level parser."""
    assert main(["sim", "--port", "0", "--bogus"]) == 2
    assert capsys.readouterr().err.endswith("dcpinspect sim: error: unrecognized arguments: --bogus\n")
    assert main(["decode", "--bogus", "00"]) == 2
    assert capsys.readouterr().err.endswith("dcpinspect: error: unrecognized arguments: --bogus\n")
    assert main(["client"]) == 2
    assert "dcpinspect client: error: the following arguments are required: HOST:PORT, --bucket, --user" in capsys.readouterr().err


def test_a_subcommand_is_configured_only_when_chosen() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    chosen = sub.choices["frames"]  # type: ignore[index]
    assert all(p.configure is not None for p in sub.choices.values())  # type: ignore[union-attr]
    parser.parse_args(["frames", "x.pcap"])
    assert chosen.configure is None and all(p.configure is not None for n, p in sub.choices.items() if n != "frames")  # type: ignore[union-attr]


def test_decode_loads_the_core_only() -> None:
    """``dcpinspect decode`` imports neither the live tools, the tables nor Spark, nor any heavy library."""
    code = (
        "import io, sys\n"
        "from dcpinspect.cli.main import main\n"
        "assert main(['decode', '815c0000000000000000000000000007', '0000000000000000'], out=io.StringIO()) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'numpy', 'pyarrow', 'pandas', 'scapy', 'pyspark', 'asyncio'}"
        " or m.split('.')[:2] in (['dcpinspect', p] for p in ('live', 'tables', 'timeline', 'views', 'spark', 'capture', 'flows'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
