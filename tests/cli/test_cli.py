"""The command line: decode (text and JSON), reference, examples, errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import run
from paths import ROOT

from dcpinspect import encode
from dcpinspect.cli.decode import parse_hex
from dcpinspect.cli.main import main
from dcpinspect.protocol.enums import Magic, Opcode
from dcpinspect.wire.examples import example


@pytest.mark.parametrize(
    "text",
    ["81 53 00 00", "0x81 0x53 0x00 0x00", "81530000", "0x81530000", "81:53:00:00", "81,53, 00,00", " 8153\n0000 "],
)
def test_parse_hex_forms(text: str) -> None:
    assert parse_hex(text) == b"\x81\x53\x00\x00"


def test_decode_hex_prints_the_seed_annotation() -> None:
    ex = example("stream-req-rollback-response")
    code, out = run("decode", *ex.data.hex(" ").split())
    assert code == 0
    assert "DCP_STREAM_REQ response" in out
    assert "Status       (6,7)  : 0x0023 (Rollback)" in out
    assert "  rollback # (24-31): 0x0000000000000000" in out


def test_decode_stdin_and_file(tmp_path: Path) -> None:
    raw = example("open-request").data
    code, out = run("decode", "-", stdin=raw.hex())
    assert code == 0 and "Key          (32-55): bucketstream vb[100-105]" in out
    f = tmp_path / "frames.bin"
    f.write_bytes(raw + raw)
    code, out2 = run("decode", "--file", str(f))
    assert code == 0 and out2.count("DCP_OPEN command") == 2


def test_decode_json_schema_and_tiling() -> None:
    data = b"\xff\xfe" + encode("DCP_STREAM_REQ", response=True, value=[(2**64 - 1, 5)], opaque=0x1000) + encode("DCP_NOOP")[:7]
    code, out = run("decode", "--json", data.hex())
    assert code == 0
    doc = json.loads(out)
    events = doc["events"]
    assert [e["type"] for e in events] == ["garbage", "frame", "truncated"]
    pos = 0
    for e in events:
        assert set(e) == {"type", "offset", "length", "name", "role", "magic", "opcode", "fields", "problems"}
        assert e["offset"] == pos
        pos += e["length"]
    assert pos == len(data)
    frame = events[1]
    assert (
        frame["name"] == "DCP_STREAM_REQ"
        and frame["role"] == "response"
        and frame["magic"] == Magic.CLIENT_RESPONSE
        and frame["opcode"] == Opcode.DCP_STREAM_REQ
    )
    uuid = next(f for f in frame["fields"] if f["path"] == "value.failover_log[0].vb_uuid")
    assert uuid["value"] == 2**64 - 1 and isinstance(uuid["value"], int)
    assert uuid == {
        "name": "vb UUID",
        "path": "value.failover_log[0].vb_uuid",
        "offset": 24,
        "length": 8,
        "value": 2**64 - 1,
        "hex": "ff" * 8,
        "meaning": None,
    }
    status = next(f for f in frame["fields"] if f["path"] == "header.status")
    assert status["value"] == 0 and status["meaning"] is None
    assert events[0]["problems"][0]["message"].startswith("unknown magic 0xff")


def test_decode_context_flags() -> None:
    raw = encode("DCP_MUTATION", extras={"by_seqno": 1}, key="k", cid=9)
    _, plain = run("decode", raw.hex())
    _, coll = run("decode", "--collections", raw.hex())
    assert "Collection ID" not in plain and "Collection ID (55)   : 0x09" in coll


def test_decode_upr_dialect() -> None:
    code, out = run("decode", "--dialect", "upr", example("upr-rollback-response").data.hex())
    assert code == 0 and "Rollback Seqno (13-20): 0x00000000000045a8" in out


def test_secrets_masked_unless_revealed() -> None:
    raw = encode("SASL_AUTH", key="PLAIN", value=b"\0u\0hunter2")
    _, masked = run("decode", raw.hex())
    _, shown = run("decode", "--reveal-secrets", raw.hex())
    assert "hunter2" not in masked and "hunter2" in shown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["decode", "zz"], "not hex"),
        (["decode", "123"], "odd number"),
        (["decode"], "no input"),
        (["decode", "--file", "/nonexistent/x"], "cannot read"),
    ],
)
def test_errors_are_clear(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run(*args)
    assert code == 2
    assert message in capsys.readouterr().err


def test_reference_and_examples_commands() -> None:
    code, out = run("reference")
    assert code == 0 and out == (ROOT / "REFERENCE.md").read_text()
    code, out = run("examples", "add-stream-response")
    assert code == 0 and "seed erratum" in out and "DCP_ADD_STREAM response" in out


def test_console_script_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dcpinspect", "decode", "80 5c 00 00" + " 00" * 20], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "DCP_NOOP command" in proc.stdout


@pytest.mark.parametrize("argv", [["summary"], ["frames", "--json"]], ids=["summary", "frames"])
def test_capture_commands_start_without_pandas(argv: list[str]) -> None:
    """``summary`` and ``frames`` (no --filter) never use pandas: the command line keeps pyarrow from importing it."""
    capture = str(ROOT / "captures" / "dcp-session.pcap")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dcpinspect", *argv, "--no-progress", capture],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "pyarrow" in imported and not any(m.startswith("pandas.") for m in imported)  # ("pandas" alone: the refused attempt)
    # called from Python, main() leaves pandas alone (pyarrow would remember it missing)
    assert main([*argv, "--no-progress", capture], out=io.StringIO(), stdin=io.StringIO("")) == 0
    import pandas  # noqa: F401 - still importable
