"""Help: every subcommand describes itself, shows an example and its defaults; ``--version``; no arguments; README and --help agree."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from importlib.metadata import version

import pytest
from paths import ROOT

from dcpinspect.cli.command import CommandParser
from dcpinspect.cli.main import COMMANDS, build_parser, main
from dcpinspect.wire.examples import EXAMPLES

README = ROOT / "README.md"
#: a command line of an example: dcpinspect itself, maybe after sudo or an environment variable
_EXAMPLE = re.compile(r"^  (sudo |[A-Z_]+=\S+ )?dcpinspect \S+", re.MULTILINE)


def helped(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def command_parsers() -> Iterator[tuple[str, CommandParser]]:
    """Each subcommand's parser, its arguments added."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        assert isinstance(p, CommandParser)
        p.configured()
        yield name, p


def flags(p: argparse.ArgumentParser) -> list[str]:
    """The long flags ``--help`` shows (hidden aliases of renamed flags are not shown, so not asked of README either)."""
    return [
        s
        for a in p._actions
        if a.help != argparse.SUPPRESS
        for s in a.option_strings
        if s.startswith("--") and s not in ("--help", "--version")
    ]


@pytest.mark.parametrize("command", [c for c, _g, _h in COMMANDS])
def test_every_command_has_a_description_an_example_and_its_defaults(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    text = helped([command, "--help"], capsys)
    usage, _, rest = text.partition("\n\n")
    assert usage.startswith(f"usage: dcpinspect {command}")
    description = rest.split("\n\n", 1)[0]
    assert not description.startswith(("positional arguments:", "options:")) and len(description) > 20, description
    epilog = text.rsplit("options:", 1)[-1]
    assert "example" in epilog.lower() and _EXAMPLE.search(epilog), f"{command}: no example in the epilog"
    parser = dict(command_parsers())[command]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.default not in (None, False, argparse.SUPPRESS) and not action.required and action.help:
            assert "default" in formatter._expand_help(action).lower(), f"{command} {action.option_strings}: default not shown"


def test_version_and_no_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"dcpinspect {version('dcpinspect')}\n"
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"dcpinspect {version('dcpinspect')}\n"
    text = helped([], capsys)
    assert text == helped(["--help"], capsys)
    assert all(f"    {c}" in text for c, _g, _h in COMMANDS)


def test_examples_help_lists_the_names(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = helped(["examples", "--help"], capsys)
    listed = set(re.findall(r"[a-z]+(?:-[a-z]+)+", text))
    assert {e.name for e in EXAMPLES} <= listed


def test_readme_and_help_agree_flag_for_flag() -> None:
    """Every flag of every subcommand is in README.md, and every flag a README command line gives is one of its command's."""
    readme = README.read_text()
    missing = sorted({f"{name} {flag}" for name, p in command_parsers() for flag in flags(p) if flag not in readme})
    assert not missing, f"flags --help has and README.md does not mention: {', '.join(missing)}"
    known = {name: set(flags(p)) | {"--help"} for name, p in command_parsers()}
    unknown = []
    for line in readme.splitlines():
        m = re.match(r"^\s*(?:\$ )?(?:sudo )?(?:[A-Z_]+=\S+ )*dcpinspect ([a-z]+)\b(.*)", line)
        if m and m.group(1) in known:
            unknown += [f"{m.group(1)} {f}" for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m.group(2)) if f not in known[m.group(1)]]
    assert not unknown, f"README.md command lines with flags their command does not have: {', '.join(sorted(set(unknown)))}"
