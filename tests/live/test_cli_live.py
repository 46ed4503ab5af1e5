"""The live tools' command lines: one address syntax, SIGTERM like SIGINT, files flushed while running, the sim's log and
summary, the client's progress and help, the sniffer's capture filter and clean errors, README and --help in agreement.

No test waits for the clock: a running client is observed through its files (a bounded poll on their content, the
deadline only turning a hang into a failure), and an in-process client is driven by a fake clock."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT

from dcpinspect import dissect, encode
from dcpinspect.capture.read import read_records
from dcpinspect.cli.live import ClientProgress, parse_address
from dcpinspect.cli.main import main as cli_main
from dcpinspect.live.client import DcpClient
from dcpinspect.live.consumer import ConsumerConfig
from dcpinspect.live.consumer_states import ConsumerEvent
from dcpinspect.live.sim import Simulator
from dcpinspect.wire.decoder import decode

PASSWORD = "pa55-word"
ENV = {**os.environ, "DCPINSPECT_PASSWORD": PASSWORD, "PYTHONPATH": str(ROOT)}
DEADLINE = 60.0  # seconds: only ever a bound on a wait for something that should happen


def _sim(items: int = 6, vbuckets: int = 2) -> Simulator:
    return Simulator(
        host="127.0.0.1", port=0, bucket="travel", vbuckets=vbuckets, items=items, users={"alice": PASSWORD}, seed=5, tick=0.02
    )


def _config(**kw: Any) -> ConsumerConfig:
    base: dict[str, Any] = {"bucket": "travel", "user": "alice", "password": PASSWORD, "vbuckets": None, "to_latest": True}
    base.update(kw)
    return ConsumerConfig(**base)


def _client_cmd(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dcpinspect", "client", f"127.0.0.1:{port}", "--bucket", "travel", "--user", "alice", *extra]


def _mutations(pcap: Path) -> dict[int, list[int]]:
    """vbucket -> the seqnos of the DCP_MUTATIONs readable in ``pcap`` now (a file still being written may end mid-packet)."""
    out: dict[int, list[int]] = {}
    try:
        for r in read_records([str(pcap)]):
            ev = r.event
            if ev.type == "frame" and ev.name == "DCP_MUTATION":  # type: ignore[union-attr]
                d = dissect(ev)  # type: ignore[arg-type]
                out.setdefault(d.frame.vbucket or 0, []).append(d.extras["by_seqno"])
    except Exception:
        return out
    return out


def _state(path: Path) -> dict[int, int]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {int(vb): st["seqno"] for vb, st in doc["vbuckets"].items()}


def _wait(what: str, holds: Callable[[], bool], proc: subprocess.Popen[str] | None = None) -> None:
    """Wait until ``holds()`` (re-checked as the files change), failing if ``proc`` ends first or the deadline passes."""
    end = time.monotonic() + DEADLINE
    while not holds():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the process ended before {what}: {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > end:
            pytest.fail(f"no {what} within {DEADLINE:g} s")
        time.sleep(0.02)


def _highs(t: Any) -> dict[int, int]:
    return t.call(lambda: {i: v.high_seqno for i, v in enumerate(t.sim.bucket.vbuckets)})


# --- the address syntax ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kw", "expected"),
    [
        ("127.0.0.1:11210", {}, ("127.0.0.1", 11210)),
        ("db1.example:11211", {}, ("db1.example", 11211)),
        ("[::1]:11210", {}, ("::1", 11210)),
        (":11210", {}, ("127.0.0.1", 11210)),
        ("11210", {}, ("127.0.0.1", 11210)),
        (" 11210 ", {}, ("127.0.0.1", 11210)),
        ("0", {"listen": True}, ("127.0.0.1", 0)),
        (":0", {"listen": True}, ("127.0.0.1", 0)),
        ("[::]:0", {"listen": True}, ("::", 0)),
        ("db1", {"default_port": 11210}, ("db1", 11210)),
        ("[fe80::1]", {"default_port": 11210}, ("fe80::1", 11210)),
        ("db1:9000", {"default_port": 11210}, ("db1", 9000)),
        ("", {}, "empty"),
        ("db1", {}, "no port"),
        ("db1:", {}, "no port"),
        ("db1:x", {}, "not a number"),
        ("db1:70000", {}, "1..65535"),
        (":0", {}, "1..65535"),
        ("::1", {}, "brackets"),
        ("::1:11210", {}, "brackets"),
        ("[::1", {}, "no closing"),
        ("[]:1", {}, "between the brackets"),
        ("[::1]x", {}, "after ']'"),
        ("db1:١٢", {}, "not a number"),  # non-ASCII digits are no port
    ],
)
def test_parse_address_table(text: str, kw: dict[str, Any], expected: tuple[str, int] | str) -> None:
    if isinstance(expected, tuple):
        assert parse_address(text, **kw) == expected
    else:
        with pytest.raises(ValueError, match=re.escape(expected)) as exc:
            parse_address(text, **kw)
        assert "\n" not in str(exc.value) and "HOST:PORT, [IPv6]:PORT, :PORT or PORT" in str(exc.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "--listen", "[::1"],
        ["sim", "--listen", "h:99999"],
        ["proxy", "--listen", "nonsense", "--upstream", "127.0.0.1:1"],
        ["proxy", "--listen", ":0", "--upstream", ":0"],  # an upstream cannot be port 0
        ["client", "::1", "--bucket", "b", "--user", "u"],
    ],
)
def test_every_tool_rejects_a_bad_address_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(argv, out=io.StringIO(), environ={"DCPINSPECT_PASSWORD": "x"}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dcpinspect {argv[0]}: error: ") and "bad address" in err, err


def test_the_three_tools_share_one_parser() -> None:
    """sim, proxy and client take the same spellings: each of them reaches a listening simulator through ``:PORT`` and ``PORT``."""
    import dcpinspect.cli.live as live

    src = Path(live.__file__).read_text()
    assert src.count("parse_address(") >= 2 and "rpartition" in src.split("def parse_address")[1].split("\ndef ")[0]
    for name in ("_sim", "_proxy", "_client"):
        body = src.split(f"\ndef {name}(")[1].split("\ndef ")[0]
        assert "_address_or_exit(" in body, name


# --- the client: files flushed while running, SIGTERM like SIGINT -------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_client_flushes_while_running_and_a_signal_leaves_pcap_and_state_consistent(tmp_path: Path, sig: signal.Signals) -> None:
    """The pcap and the state file fill while the client runs (a few hundred bytes: only the periodic flush shows them);
    SIGTERM or SIGINT then closes the streams and leaves a pcap whose frames are those printed and a state it backs."""
    pcap, state = tmp_path / "c.pcap", tmp_path / "st.json"
    with _sim().run_in_thread() as t:
        cmd = _client_cmd(t.port, "--json", "--pcap", str(pcap), "--state", str(state))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
        try:
            highs = _highs(t)
            _wait("pcap with every item", lambda: {vb: max(s) for vb, s in _mutations(pcap).items()} == highs, proc)
            _wait("state file at the high seqnos", lambda: _state(state) == highs, proc)
            t.mutate("late-1", {"n": 1})
            t.mutate("late-2", {"n": 2})
            highs = _highs(t)
            _wait("pcap grown by the new items", lambda: {vb: max(s) for vb, s in _mutations(pcap).items()} == highs, proc)
            _wait("state file at the new high seqnos", lambda: _state(state) == highs, proc)
            assert proc.poll() is None  # all of that while the client was still streaming
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert f"stopped by {sig.name}" in err and "Traceback" not in err
    printed = [json.loads(line) for line in out.splitlines()]
    keys = ("dir", "frame", "name", "opaque", "vbucket", "seqno", "key")
    from dcpinspect.cli.output import record_lines

    back = [json.loads(line) for line in record_lines(list(read_records([str(pcap)])), as_json=True)]
    assert [tuple(r[k] for k in keys) for r in back] == [tuple(r[k] for k in keys) for r in printed]
    assert sum(r["name"] == "DCP_CLOSE_STREAM" and r["dir"] == "c2s" for r in printed) == 2  # the streams were closed
    assert all(not r["problems"] for r in printed)
    saved = _state(state)
    seen = _mutations(pcap)
    assert saved == highs and all(saved[vb] == max(seen[vb]) for vb in saved)  # the state names only seqnos the pcap holds


def test_flush_follows_the_clients_clock_not_the_arrival_of_data(tmp_path: Path) -> None:
    """With a fake clock frozen, nothing is flushed; one flush interval later, pcap and state are on disk - the stream silent."""
    pcap, state = tmp_path / "f.pcap", tmp_path / "f.json"
    now = [100.0]

    async def main() -> None:
        async with _sim() as sim:
            highs = {i: v.high_seqno for i, v in enumerate(sim.bucket.vbuckets)}
            client = DcpClient(
                "127.0.0.1", sim.port, _config(to_latest=False), pcap=pcap, state_path=state, clock=lambda: now[0], tick=0.02
            )
            await client.start()
            await asyncio.wait_for(client.until(lambda c: {vb: st.position.seqno for vb, st in client.streams.items()} == highs), DEADLINE)
            assert client.flushes == 0 and not state.exists() and _mutations(pcap) == {}  # frozen clock: still buffered
            now[0] += client.flush_interval
            await asyncio.wait_for(client.until(lambda c: client.flushes >= 1), DEADLINE)
            assert {vb: max(s) for vb, s in _mutations(pcap).items()} == highs == _state(state)
            flushes = client.flushes
            await client.stop()
            assert client.flushes == flushes  # the clock did not move again: the rest was the exit's flush

    asyncio.run(asyncio.wait_for(main(), DEADLINE * 2))


def test_flush_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="flush_interval"):
        DcpClient("127.0.0.1", 1, _config(), flush_interval=0)


def test_client_keep_secrets_writes_the_scram_proof_into_the_pcap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--keep-secrets is the client's too (as the README says): masked by default, as sent with it."""

    def proof(pcap: Path) -> bytes:
        steps = [r.event for r in read_records([str(pcap)]) if r.event.type == "frame" and r.event.name == "SASL_STEP"]  # type: ignore[union-attr]
        value: bytes = dissect(steps[0]).frame.value  # type: ignore[arg-type]
        return value.split(b",p=")[1]

    with _sim(items=2, vbuckets=1).run_in_thread() as t:
        for keep in (False, True):
            pcap = tmp_path / f"k{keep}.pcap"
            argv = ["client", f":{t.port}", "--bucket", "travel", "--user", "alice", "--to-latest", "--pcap", str(pcap)]
            assert cli_main(argv + ["--keep-secrets"] * keep, out=io.StringIO(), environ={"DCPINSPECT_PASSWORD": PASSWORD}) == 0
            p = proof(pcap)
            assert (set(p) == {ord("*")}) is not keep and len(p) > 10
    capsys.readouterr()


# --- the client's progress line and help ----------------------------------------------------------------------------


def _event(kind: str, vb: int | None, raw: bytes | None) -> ConsumerEvent:
    d = dissect(decode(raw)[0]) if raw is not None else None  # type: ignore[arg-type]
    return ConsumerEvent(kind, "", vb, dissection=d)


def test_progress_counts_items_and_bytes_per_vbucket() -> None:
    m1 = encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="a", value=b"x" * 100, vbucket=0)
    m2 = encode("DCP_MUTATION", extras={"by_seqno": 1, "rev_seqno": 1}, key="b", value=b"y" * 10, vbucket=3)
    marker = encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 1, "end_seqno": 1, "flags": 1}, vbucket=0)
    p = ClientProgress(max_vbuckets=1)
    mark = _event("snapshot", 0, marker)
    p.event(mark)
    p.event(ConsumerEvent("checkpoint", "", 0, dissection=mark.dissection))  # the same frame: its bytes count once
    p.event(_event("mutation", 0, m1))
    p.event(_event("mutation", 3, m2))
    p.event(_event("authenticated", None, None))
    assert p.items == {0: 1, 3: 1} and p.bytes == {0: len(marker) + len(m1), 3: len(m2)}
    line = p.line(frames=3, received=2500, elapsed=2.4)
    assert line == f"2 s: 3 frames, 2.5 kB received, 2 items; vb 0: 1 item {len(marker) + len(m1)} B, +1 vbucket"


def test_client_progress_on_request_and_its_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    """--progress writes to a stderr that is no terminal (one line each); the last line has the final counts."""
    with _sim(items=30, vbuckets=2).run_in_thread() as t:
        argv = ["client", str(t.port), "--bucket", "travel", "--user", "alice", "--to-latest", "--progress"]
        assert cli_main(argv, out=io.StringIO(), environ={"DCPINSPECT_PASSWORD": PASSWORD}) == 0
        assert cli_main(argv[:-1], out=io.StringIO(), environ={"DCPINSPECT_PASSWORD": PASSWORD}) == 0  # no terminal: none
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("dcpinspect client: ") for line in lines)
    last = lines[-1]
    assert re.fullmatch(
        r"dcpinspect client: \d+ s: \d+ frames, [\d.]+ kB received, 30 items; vb 0: \d+ items .*, vb 1: \d+ items .*", last
    ), last
    items = [int(n) for n in re.findall(r"vb \d: (\d+) items", last)]
    assert sum(items) == 30


def test_client_help_says_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["client", "--help"]) == 0
    text = capsys.readouterr().out
    for needle in (
        "stdout, --json  one JSON object per frame",
        "'vb N: seqno FIRST -> LAST",
        "--progress",
        "every second",
        "SIGTERM",
        "example:",
    ):
        assert needle in text, needle


@pytest.mark.parametrize("tool", ["sim", "client", "proxy", "sniff"])
def test_every_live_subcommand_has_a_description_and_an_example(tool: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main([tool, "--help"]) == 0
    text = capsys.readouterr().out
    usage, description = text.split("\n\n")[:2]
    assert usage.startswith(f"usage: dcpinspect {tool}") and len(description) > 40
    assert re.search(r"^examples?:\n  (DCPINSPECT_PASSWORD=\S+ )?dcpinspect " + tool, text, re.M), text


# --- the simulator's log and summary --------------------------------------------------------------------------------


def test_sim_logs_connections_and_prints_a_summary_on_stop() -> None:
    env = {**ENV, "DCPINSPECT_SIM_USERS": f"alice:{PASSWORD}"}
    cmd = [sys.executable, "-m", "dcpinspect", "sim", "--listen", ":0", "--bucket", "travel", "--items", "10", "--vbuckets", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("listening on 127.0.0.1:"), first
        port = int(first.rsplit(":", 1)[1])
        client = DcpClient("127.0.0.1", port, _config(name="cli-test"))
        asyncio.run(asyncio.wait_for(client.run(), DEADLINE))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    lines = err.splitlines()
    assert all(line.startswith("dcpinspect sim: ") for line in lines) and "Traceback" not in err
    peer = r"127\.0\.0\.1:\d+"
    assert re.fullmatch(rf"dcpinspect sim: connection 1 from {peer} accepted", lines[0]), lines
    assert re.fullmatch(rf"dcpinspect sim: connection 1 from {peer}: DCP_OPEN 'cli-test'", lines[1]), lines
    closed = rf"dcpinspect sim: connection 1 from {peer} closed \(client closed the connection\), DCP 'cli-test': "
    assert re.fullmatch(closed + rf"\d+ frames in, {client.frames} frames out, 2 streams, 10 items", lines[2]), lines
    n_in = int(re.search(r"(\d+) frames in", lines[2]).group(1))  # type: ignore[union-attr]
    assert lines[3] == (
        f"dcpinspect sim: stopped: 1 connection, {n_in + client.frames} frames ({n_in} in, {client.frames} out), 2 streams, "
        f"10 items, {client.bytes['c2s']} bytes in, {client.bytes['s2c']} bytes out"
    )
    assert len(lines) == 4


# --- sniff: the capture filter, clean errors ------------------------------------------------------------------------


def test_sniff_no_such_interface_is_one_line_and_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dcpinspect", "sniff", "--iface", "nosuch0", "--timeout", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=DEADLINE,
        check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("dcpinspect sniff: error: ") and "nosuch0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sniff_bad_capture_filter_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("scapy")
    from dcpinspect.live.sniff import check_filter

    try:
        check_filter("tcp port 11210", "lo")
    except Exception:  # pragma: no cover
        pytest.skip("libpcap cannot compile filters here")
    assert cli_main(["sniff", "--iface", "lo", "-f", "tcp prt 11210"], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dcpinspect sniff: error: bad capture filter 'tcp prt 11210': "), err


@pytest.mark.parametrize(
    ("argv", "bpf"),
    [
        ([], "tcp port 11210"),
        (["--port", "11211", "--port", "11210"], "tcp port 11210 or tcp port 11211"),
        (["-f", "tcp port 11210 and host 127.0.0.1"], "tcp port 11210 and host 127.0.0.1"),
        (["--capture-filter", "tcp"], "tcp"),
    ],
)
def test_sniff_hands_the_capture_filter_to_the_socket(
    argv: list[str], bpf: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The filter reaches the packet socket (whose opening fails here, as without privileges: one line, exit 2)."""
    pytest.importorskip("scapy")
    from dcpinspect.live import sniff

    seen: list[str | None] = []

    def denied(iface: str, filt: str | None) -> None:
        seen.append(filt)
        raise sniff.SniffPermissionError(f"capturing on {iface} needs root or CAP_NET_RAW ([Errno 1] Operation not permitted)")

    monkeypatch.setattr(sniff, "_raw_socket", denied)
    assert cli_main(["sniff", "--iface", "lo", *argv], out=io.StringIO()) == 2
    assert seen == [bpf]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root or CAP_NET_RAW" in err


# --- README and --help agree ------------------------------------------------------------------------------------------


def _readme_live_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Live connections", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("tool", ["sim", "client", "proxy", "sniff"])
def test_readme_live_commands_use_only_real_flags(tool: str, capsys: pytest.CaptureFixture[str]) -> None:
    section = _readme_live_section().replace("\\\n", " ")
    commands = [line for line in section.splitlines() if re.search(rf"\bdcpinspect {tool}\b", line.split("#")[0])]
    assert commands, f"the README's Live connections section shows no 'dcpinspect {tool}' command"
    assert cli_main([tool, "--help"]) == 0
    help_text = capsys.readouterr().out
    for line in commands:
        for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", line.split("#")[0].split(f"dcpinspect {tool}", 1)[1]):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}\b", help_text), f"README: dcpinspect {tool} {flag} is not in its --help"


def test_readme_secret_flags_exist_on_every_tool_that_writes_a_pcap(capsys: pytest.CaptureFixture[str]) -> None:
    section = _readme_live_section()
    assert "--keep-secrets" in section and "--reveal-secrets" in section
    for tool in ("client", "proxy", "sniff"):
        assert cli_main([tool, "--help"]) == 0
        text = capsys.readouterr().out
        assert "--keep-secrets" in text and "--reveal-secrets" in text and "--pcap" in text, tool


def test_every_flag_the_readme_live_section_names_is_a_live_tools_flag(capsys: pytest.CaptureFixture[str]) -> None:
    helps = ""
    for tool in ("sim", "client", "proxy", "sniff", "replay"):
        assert cli_main([tool, "--help"]) == 0
        helps += capsys.readouterr().out
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", _readme_live_section()))
    missing = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}\b", helps))
    assert flags and missing == [], missing


@pytest.mark.parametrize("flag", ["--state", "--pcap"])
def test_client_that_cannot_write_its_files_stops_with_one_line(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A state file or pcap in a directory that does not exist: exit 2 and one line, even on a stream that never ends."""
    with _sim(items=2, vbuckets=1).run_in_thread() as t:
        argv = ["client", f":{t.port}", "--bucket", "travel", "--user", "alice", flag, str(tmp_path / "missing" / "f")]
        assert cli_main(argv, out=io.StringIO(), environ={"DCPINSPECT_PASSWORD": PASSWORD}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dcpinspect client: error: cannot ") and "No such file or directory" in err, err


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "file"])
def test_progress_line_is_rewritten_in_place_on_a_terminal_only(tty: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from dcpinspect.cli import live

    monkeypatch.setattr(live.shutil, "get_terminal_size", lambda: os.terminal_size((40, 24)))
    err = io.StringIO()
    client = SimpleNamespace(frames=7, bytes={"s2c": 1234})
    w = live._ProgressWriter(ClientProgress(), client, err, tty=tty)
    w.write()
    client.frames = 9
    w.close()
    text = err.getvalue()
    if tty:
        first, last = text.split("\r")[1:]
        assert first.endswith("\x1b[K") and last.endswith("\x1b[K\n") and "\n" not in first
        assert len(first) - len("\x1b[K") == 39  # cut to the terminal's width
    else:
        assert "\r" not in text and "\x1b" not in text and text.count("\n") == 2
        assert text.splitlines()[1].startswith("dcpinspect client: 0 s: 9 frames, 1.2 kB received, 0 items")
