"""Sniffing ``lo`` for real while a tap-proxy session runs: the sniffed records decode the session
(each packet once), the written pcap reads back to the same records, and the CLI works (root only)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_proxy import LOOP, requests, responses, run, send_chunks

from dcpinspect import dissect
from dcpinspect.proxy import TapProxy
from dcpinspect.records import Record, read_records

ROOT = Path(__file__).resolve().parents[1]


def _can_sniff() -> bool:
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    except (PermissionError, AttributeError, OSError):
        return False
    return True


needs_root = pytest.mark.skipif(not _can_sniff(), reason="sniffing needs root or CAP_NET_RAW")


def _frames(recs: list[Record]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {"c2s": [], "s2c": []}
    for r in recs:
        assert r.event.type == "frame", r
        out[r.direction].append(r.event.raw)  # type: ignore[union-attr]
    return out


@needs_root
def test_sniffing_lo_decodes_a_proxied_session(tmp_path: Path) -> None:
    from dcpinspect.sniff import Sniffer

    c2s, s2c = requests(120, seed=5, big=150_000), responses(120, seed=5, big=150_000)
    pcap = tmp_path / "sniffed.pcap"
    sniffed: list[Record] = []

    with socket.socket() as probe:
        probe.bind((LOOP, 0))
        port = probe.getsockname()[1]

    async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        assert await r.readexactly(len(c2s)) == c2s
        await send_chunks(w, s2c, seed=1)

    async def main() -> list[Record]:
        live: list[Record] = []
        srv = await asyncio.start_server(lambda r, w: _serve(server, r, w), LOOP, port)
        proxy = await TapProxy(upstream=(LOOP, port), on_record=live.append).start()
        r, w = await asyncio.open_connection(LOOP, proxy.port)
        await send_chunks(w, c2s, seed=2)
        assert await r.readexactly(len(s2c)) == s2c
        w.close()
        await w.wait_closed()
        await asyncio.sleep(0.2)  # FINs on the wire
        await proxy.stop()
        srv.close()
        await srv.wait_closed()
        return live

    with Sniffer("lo", (port,), pcap=pcap, on_record=sniffed.append) as sn:
        live = run(main())
    assert sn.linktype == 1
    # what the wire carried between proxy and upstream is what the proxy decoded, each frame once
    assert _frames(sniffed) == _frames(live)
    assert len(sniffed) == 240
    assert all(dissect(r.event, r.context).problems == [] for r in sniffed)  # type: ignore[arg-type]
    conns = {r.conn for r in sniffed}
    assert len(conns) == 1
    # the raw pcap reads back to the same records
    back = list(read_records([str(pcap)], server_ports=[port]))
    assert [(r.direction, r.event.raw, r.packet) for r in back] == [(r.direction, r.event.raw, r.packet) for r in sniffed]  # type: ignore[union-attr]


async def _serve(handler, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:  # type: ignore[no-untyped-def]
    try:
        await handler(r, w)
    finally:
        w.close()


@needs_root
def test_sniff_cli_count_and_json(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind((LOOP, 0))
        port = probe.getsockname()[1]
    pcap = tmp_path / "cli.pcap"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dcpinspect",
            "sniff",
            "--iface",
            "lo",
            "--port",
            str(port),
            "--pcap",
            str(pcap),
            "--json",
            "--timeout",
            "20",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stderr is not None
        assert "capturing on lo" in proc.stderr.readline()
        c2s = requests(10, seed=1)

        async def server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(await r.readexactly(len(c2s)))
            await w.drain()

        async def main() -> None:
            srv = await asyncio.start_server(lambda r, w: _serve(server, r, w), LOOP, port)
            r, w = await asyncio.open_connection(LOOP, port)
            w.write(c2s)
            assert await r.readexactly(len(c2s)) == c2s
            w.close()
            await w.wait_closed()
            await asyncio.sleep(0.3)
            srv.close()
            await srv.wait_closed()

        run(main())
        proc.send_signal(2)  # SIGINT
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    import json

    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 20 and all(row["problems"] == [] for row in rows)
    assert {row["dir"] for row in rows} == {"c2s", "s2c"}
    assert len(list(read_records([str(pcap)], server_ports=[port]))) == 20


def test_sniff_without_privileges_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from dcpinspect import sniff

    def denied(iface: str, bpf: str | None) -> None:
        raise sniff.SniffPermissionError(f"capturing on {iface} needs root or CAP_NET_RAW ([Errno 1] Operation not permitted)")

    monkeypatch.setattr(sniff, "_raw_socket", denied)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert sniff.command(["--iface", "lo"], out=io.StringIO()) == 2
    assert err.getvalue().count("\n") == 1 and "needs root or CAP_NET_RAW" in err.getvalue()


def test_sniff_as_unprivileged_user_exits_2() -> None:
    """For real, when an unprivileged user exists (``nobody``) and we may switch to it."""
    if os.geteuid() != 0:
        proc = subprocess.run(
            [sys.executable, "-m", "dcpinspect", "sniff", "--iface", "lo"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
    else:
        try:
            import pwd

            nobody = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("no unprivileged user to try")
        if not _runs_as_nobody(nobody.pw_uid, nobody.pw_gid):
            pytest.skip(f"user nobody cannot run {sys.executable} here")
        proc = subprocess.run(
            [sys.executable, "-m", "dcpinspect", "sniff", "--iface", "lo", "--timeout", "1"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": "/tmp"},
        )
    if proc.returncode != 2 and "No module named" in proc.stderr:
        pytest.skip("the unprivileged user cannot import the environment")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "needs root or CAP_NET_RAW" in proc.stderr


def _runs_as_nobody(uid: int, gid: int) -> bool:
    try:
        subprocess.run(
            [sys.executable, "-c", "import dcpinspect.sniff"],
            capture_output=True,
            timeout=60,
            check=True,
            user=uid,
            group=gid,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": "/tmp"},
        )
    except (OSError, subprocess.CalledProcessError):
        return False
    return True
