"""The simulator on real TCP (127.0.0.1): bootstrap, streaming, failover + rollback, the CLI."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT
from producerpeer import stream_extras

from dcpinspect import encode
from dcpinspect.cli.main import build_parser
from dcpinspect.cli.main import main as cli_main
from dcpinspect.live.clustermap import config_json, parse_config
from dcpinspect.live.sasl import ScramClient
from dcpinspect.live.sim import SCENARIOS, Simulator
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.dissection import DissectContext, Dissection

FOREVER = 2**64 - 1
CTX = DissectContext(collections=True, json=True, xattr=False, snappy=False, delete_times=False, include_xattrs=False, stream_ids=False)


class Client:
    """A minimal asyncio DCP consumer for the tests (frames built with encode, read with FrameDecoder + dissect)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.dec = FrameDecoder()
        self.backlog: list[Dissection] = []
        self.opaque = 0

    @classmethod
    async def connect(cls, sim: Simulator, address: tuple[str, int] | None = None) -> Client:
        host, port = address if address is not None else (sim.host, sim.port)
        return cls(*await asyncio.open_connection(host, port))

    def send(self, raw: bytes) -> None:
        self.writer.write(raw)

    async def next(self, timeout: float = 60.0) -> Dissection:
        while not self.backlog:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            assert data, "connection closed"
            for ev in self.dec.feed(data):
                assert ev.type == "frame"
                d = dissect(ev, CTX)
                assert not d.problems, (d.name, d.problems)
                self.backlog.append(d)
        return self.backlog.pop(0)

    async def request(self, name: str, **kw) -> Dissection:
        self.opaque += 1
        self.send(encode(name, opaque=self.opaque, **kw))
        while True:
            d = await self.next()
            if d.role == "response" and d.frame.opaque == self.opaque:
                return d
            self.backlog.append(d) if d.name != "DCP_NOOP" else None

    async def bootstrap(self) -> None:
        hello = await self.request("HELLO", key="test", value={"features": [(0x12,), (0x0B,), (0x10,)]})
        assert [f["feature"] for f in hello.body["features"]] == [0x12, 0x0B, 0x10]
        mechs = (await self.request("SASL_LIST_MECHS")).frame.value.decode().split()
        scram = ScramClient(mechs[0], "Administrator", "password")
        first = await self.request("SASL_AUTH", key=mechs[0], value=scram.first())
        assert first.frame.status == 0x21
        final = await self.request("SASL_STEP", key=mechs[0], value=scram.final(first.frame.value))
        assert final.frame.status == 0 and scram.verify(final.frame.value)
        assert (await self.request("SELECT_BUCKET", key="default")).frame.status == 0
        assert (await self.request("DCP_OPEN", key="test:1", extras={"flags": 1})).frame.status == 0
        assert (await self.request("DCP_CONTROL", key="enable_noop", value="true")).frame.status == 0

    async def stream_req(self, vb: int, *, start=0, end=FOREVER, uuid=0, ss=None, se=None) -> Dissection:
        extras = stream_extras(start=start, end=end, uuid=uuid, ss=ss, se=se)
        return await self.request("DCP_STREAM_REQ", extras=extras, vbucket=vb)

    async def until(self, name: str) -> list[Dissection]:
        got = []
        while True:
            d = await self.next()
            if d.name == "DCP_NOOP" and d.role == "request":
                self.send(encode("DCP_NOOP", response=True, opaque=d.frame.opaque))
                continue
            got.append(d)
            if d.name == name:
                return got

    def close(self) -> None:
        self.writer.close()


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, 120))  # a deadline only: it turns a hang into a failure


def test_bootstrap_and_stream_to_end() -> None:
    async def main() -> None:
        async with Simulator(items=40, vbuckets=2) as sim:
            c = await Client.connect(sim)
            await c.bootstrap()
            rows = (await c.request("GET_ALL_VB_SEQNOS")).body["vb_seqnos"]
            assert sum(r["high_seqno"] for r in rows) == 40
            for row in rows:
                ok = await c.stream_req(row["vbucket"], end=row["high_seqno"])
                assert ok.frame.status == 0 and ok.body["failover_log"]
                msgs = await c.until("DCP_STREAM_END")
                muts = [d for d in msgs if d.name == "DCP_MUTATION"]
                assert len(muts) == row["high_seqno"] and all(d.document["name"] == d.key_text for d in muts)
                assert msgs[0].name == "DCP_SNAPSHOT_MARKER" and msgs[-1].extras["status"] == 0
            c.close()

    run(main())


def test_failover_and_rollback_on_the_wire() -> None:
    """Two data nodes: the failover ends the old node's stream, the new map names the promoted node, the client rolls back there."""

    async def main() -> None:
        async with Simulator(items=40, vbuckets=1, nodes=2) as sim:
            assert len(sim.addresses) == 2 and sim.addresses[0] == (sim.host, sim.port)
            c = await Client.connect(sim)
            await c.bootstrap()
            ok = await c.stream_req(0)
            old_uuid = ok.body["failover_log"][0]["vb_uuid"]
            msgs = await c.until("DCP_MUTATION")
            marker = msgs[0]
            assert marker.extras["end_seqno"] == 40
            seen = [d for d in msgs if d.name == "DCP_MUTATION"]
            while len(seen) < 40:
                seen += [d for d in await c.until("DCP_MUTATION")]
            sim.failover(0, lose=5)
            end = (await c.until("DCP_STREAM_END"))[-1]
            assert end.extras["status"] == 2  # StateChanged
            assert (await c.stream_req(0, start=40, ss=0, se=40, uuid=old_uuid)).frame.status == 0x07  # not here any more
            config = await c.request("GET_CLUSTER_CONFIG")
            cmap = parse_config(config.frame.value, connected=(sim.host, sim.port))
            node = cmap.active_node(0)
            assert node == 1 and cmap.nodes[node] == sim.addresses[1]
            c.close()
            c = await Client.connect(sim, cmap.nodes[node])  # the client reconnects to the node the new map names
            await c.bootstrap()
            rb = await c.stream_req(0, start=40, ss=0, se=40, uuid=old_uuid)
            assert rb.frame.status == 0x23 and rb.body["rollback_seqno"] == 35  # step 7: snap complete, min(35, 40)
            again = await c.stream_req(0, start=35, uuid=old_uuid)
            assert again.frame.status == 0
            assert [e["vb_seqno"] for e in again.body["failover_log"]] == [35, 0]
            sim.mutate("after-failover", {"x": 1})
            new = [d for d in await c.until("DCP_MUTATION") if d.name == "DCP_MUTATION"]
            assert new[-1].key == b"after-failover" and new[-1].extras["by_seqno"] == 36
            c.close()

    run(main())


def test_noop_and_drop_connections() -> None:
    async def main() -> None:
        async with Simulator(items=2, vbuckets=1, tick=0.02) as sim:
            c = await Client.connect(sim)
            await c.bootstrap()
            assert (await c.request("DCP_CONTROL", key="set_noop_interval", value="0.1")).frame.status == 0
            noop = await c.next()
            assert noop.name == "DCP_NOOP" and noop.frame.opaque >= 10000001
            sim.drop_connections()
            assert await asyncio.wait_for(c.reader.read(), 60) == b""

    run(main())


def test_thread_runner_from_sync_code() -> None:
    with Simulator(items=4, vbuckets=1, nodes=2).run_in_thread() as sim:
        with socket.create_connection((sim.host, sim.port), timeout=60) as s:
            s.sendall(encode("SASL_LIST_MECHS", opaque=9))
            data = b""
            while len(data) < 24 or len(data) < 24 + int.from_bytes(data[8:12], "big"):
                data += s.recv(4096)
            assert b"PLAIN" in data
        assert sim.failover(0) != 0
        assert len(sim.bucket.vbuckets[0].failover_log) == 2


def test_command_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    assert cli_main(["sim", "--port", "0", "--users", "nopass"], out=out) == 2
    err = capsys.readouterr().err
    assert "nopass" in err and "error" in err and out.getvalue() == ""  # errors go to stderr
    for bad in (["--nodes", "0"], ["--idle-timeout", "0"], ["--scenario", "failover", "--nodes", "1"], ["--listen", "[::1"]):
        assert cli_main(["sim", "--port", "0", *bad], out=out) == 2, bad
        line = capsys.readouterr().err
        assert line.startswith("dcpinspect sim: error:") and line.count("\n") == 1, line
    assert set(SCENARIOS) >= {"failover", "purge", "collections", "sync-writes"}


def test_cli_prints_listening_and_stops_on_sigterm() -> None:
    root = ROOT
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcpinspect", "sim", "--port", "0", "--items", "5", "--scenario", "steady", "--nodes", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line + (proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.rsplit(":", 1)[1])
        second = proc.stdout.readline()  # the other nodes after node 0's line
        assert second.startswith("node 1 listening on 127.0.0.1:"), second
        for p in (port, int(second.rsplit(":", 1)[1])):
            with socket.create_connection(("127.0.0.1", p), timeout=60) as s:
                s.sendall(encode("NOOP", opaque=1))
                assert s.recv(24)[:2] == b"\x81\x0a"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- backpressure: a client that writes requests and never reads --------------------------------


def test_a_client_that_never_reads_is_not_read_either_and_the_output_stays_bounded() -> None:
    """The simulator stops reading a connection whose replies are not read: its write buffer stays bounded."""
    limit = 64 * 1024
    error_map = encode("GET_ERROR_MAP", value=(2).to_bytes(2, "big"))  # a 26-byte request, a ~2.4 KB reply (no auth needed)
    count = 4000  # ~10 MB of replies if all were answered

    async def main() -> None:
        paused = asyncio.Event()
        sim = Simulator(items=1, vbuckets=1, backlog_limit=limit, on_reading_paused=lambda conn: paused.set())
        async with sim:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # little room in the kernel for what is never read
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (sim.host, sim.port))
            _reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(error_map * count)  # and never read
            await asyncio.wait_for(paused.wait(), 60)  # safety net only; the event is the condition
            (conn,) = sim.connections
            assert not conn.want_read or conn.output_size == 0
            reply = 2369 + 1024  # one reply, with slack for the size of the error map
            assert 0 < sim.peak_backlog <= 2 * limit + reply
            assert conn.output_size < limit + reply
            assert conn.sent_frames < count  # it stopped answering: the rest waits unread in the kernel
            writer.close()

    run(main())


# --- command line: vbucket count, IPv6 address, credentials outside the process list ---------------


def test_vbucket_count_is_16_bit(capsys) -> None:
    from dcpinspect.live.sim import MAX_VBUCKETS

    assert MAX_VBUCKETS == 65536 and build_parser().parse_args(["sim", "--port", "0", "--vbuckets", "65536"]).vbuckets == 65536
    for bad in ("70000", "65537", "0", "-1", "x"):
        assert cli_main(["sim", "--port", "0", "--vbuckets", bad], out=io.StringIO()) == 2
        assert "--vbuckets" in capsys.readouterr().err
    try:
        Simulator(vbuckets=70000)
    except ValueError as exc:
        assert "1..65536" in str(exc)
    else:
        raise AssertionError("70000 vbuckets accepted")


def test_ipv6_addresses_are_shown_in_brackets() -> None:
    from dcpinspect.live.tap import format_endpoint

    assert format_endpoint(("::1", 11210)) == "[::1]:11210" and format_endpoint(("127.0.0.1", 5)) == "127.0.0.1:5"

    async def main() -> None:
        try:
            sim = await Simulator(host="::1", items=1, vbuckets=1).start()
        except OSError:
            return  # no IPv6 loopback here
        try:
            assert sim.host == "::1"
            reader, writer = await asyncio.open_connection(sim.host, sim.port)
            writer.write(encode("NOOP", opaque=1))
            assert (await reader.readexactly(24))[:2] == b"\x81\x0a"
            assert sim.connections[0].peer.startswith("[::1]:")
            writer.close()
        finally:
            await sim.stop()

    run(main())


def test_users_from_a_file_and_the_environment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dcpinspect.cli.live import USERS_ENV, sim_users

    f = tmp_path / "users"
    f.write_text("# comment\nalice:pa:ss\n\n  bob:b0b  \n")
    args = build_parser().parse_args(["sim", "--port", "0", "--users", "carol:c", "--users-file", str(f)])
    users = sim_users(args, {USERS_ENV: "dave:d1,erin:e2\nfrank:f3"})
    assert users == {"carol": "c", "alice": "pa:ss", "bob": "b0b", "dave": "d1", "erin": "e2", "frank": "f3"}
    assert sim_users(build_parser().parse_args(["sim", "--port", "0"]), {}) == {"Administrator": "password"}
    out = io.StringIO()
    f.write_text("alice-without-password\n")
    assert cli_main(["sim", "--port", "0", "--users-file", str(f)], out=out, environ={}) == 2
    assert "--users-file line 1" in capsys.readouterr().err
    assert cli_main(["sim", "--port", "0"], out=out, environ={USERS_ENV: "x:secret-pw,nocolon"}) == 2
    err = capsys.readouterr().err
    assert USERS_ENV in err and "secret-pw" not in err
    assert cli_main(["sim", "--port", "0", "--users-file", str(tmp_path / "missing")], out=out, environ={}) == 2
    assert "cannot read --users-file" in capsys.readouterr().err
    assert out.getvalue() == ""
    help_out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(help_out):
        cli_main(["sim", "--help"], out=io.StringIO())
    assert "--users-file" in help_out.getvalue() and USERS_ENV in help_out.getvalue()


# --- nodes, scenarios for the stream ends ----------------------------------------------------------


def test_nodes_and_scenarios_that_need_them() -> None:
    assert Simulator(scenario="failover").nodes == 2 and Simulator().nodes == 1
    for bad in ({"scenario": "failover", "nodes": 1}, {"slow_after": 1.0}):
        try:
            Simulator(**bad)
        except ValueError as exc:
            assert "nodes >= 2" in str(exc) or "disk_pressure" in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")
    assert set(SCENARIOS) >= {"slow", "backfill-fail", "backfill-rollback", "lost-privileges", "cursor-drop", "flaky"}


def test_scenarios_end_streams_backfill_fail_and_slow_on_the_wire() -> None:
    async def main() -> None:
        async with Simulator(items=20, vbuckets=1, scenario="backfill-fail") as sim:
            c = await Client.connect(sim)
            await c.bootstrap()
            assert (await c.stream_req(0)).frame.status == 0
            assert (await c.until("DCP_STREAM_END"))[-1].extras["status"] == 5
        async with Simulator(items=20, vbuckets=1, scenario="slow", tick=0.02) as sim:
            c = await Client.connect(sim)
            await c.bootstrap()
            assert (await c.stream_req(0)).frame.status == 0  # its backfill stalls under disk pressure
            assert (await c.until("DCP_STREAM_END"))[-1].extras["status"] == 4
            assert any(e["event"] == "stream_end" and e["reason"] == 4 for e in sim.cluster.journal)

    run(main())


def test_advertise_names_another_address_in_the_cluster_map_and_keeps_the_listening_one() -> None:
    """A tap proxy in front of a node: the map names the proxy, ``sim.addresses`` still says where the node listens."""
    with Simulator(vbuckets=4, items=0, nodes=2).run_in_thread() as st:
        listening = st.sim.addresses
        rev = st.sim.cluster.rev
        st.advertise(1, ("127.0.0.1", 1))
        doc = st.call(lambda: config_json(st.sim.cluster, st.sim.bucket, node=0))
        assert [n["services"]["kv"] for n in doc["nodesExt"]] == [listening[0][1], 1]
        assert st.sim.addresses == listening and st.sim.cluster.rev > rev
        with pytest.raises(ValueError, match="no node 2"):
            st.advertise(2, ("127.0.0.1", 1))
