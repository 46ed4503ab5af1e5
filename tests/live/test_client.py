"""The live client end to end on real TCP: against the sans-IO producer behind the loopback node of
``tests/simnode.py`` (the ``sim_node`` fixture), and against the project's simulator (``dcpinspect.live.sim``).

No test waits for the wall clock: the node runs the producer when bytes arrive, and a test waits for the
client's own progress (:meth:`DcpClient.until`) or for its end.  ``run``'s deadline only catches a hang."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT
from simnode import SimNode

from dcpinspect import FrameDecoder, encode
from dcpinspect.capture.read import read_records
from dcpinspect.cli.main import main as cli_main
from dcpinspect.cli.output import record_lines
from dcpinspect.flows.records import Record
from dcpinspect.live.client import ClientError, DcpClient, load_state, run_client, run_client_sync
from dcpinspect.live.cluster import Bucket, Cluster
from dcpinspect.live.consumer import ConsumerConfig
from dcpinspect.live.consumer_states import ConsumerEvent
from dcpinspect.live.resume import ResumeState
from dcpinspect.live.sim import Simulator
from dcpinspect.protocol.enums import Opcode

NodeFactory = Callable[[Cluster], SimNode]

PASSWORD = "pa55-word"


def run(coro: Awaitable[Any], timeout: float = 120) -> Any:
    """Run ``coro``; the deadline is there to turn a hang into a failure, never to wait for something."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def cluster(items: int = 120, vbuckets: int = 4, seed: int = 1) -> tuple[Cluster, Bucket]:
    c = Cluster({"alice": PASSWORD}, seed=seed)
    return c, c.create_bucket("travel", vbuckets=vbuckets, items=items)


def config(**kw: Any) -> ConsumerConfig:
    base: dict[str, Any] = {
        "bucket": "travel",
        "user": "alice",
        "password": PASSWORD,
        "vbuckets": None,
        "to_latest": True,
        "buffer_size": 2000,
    }
    base.update(kw)
    return ConsumerConfig(**base)


def highs(bucket: Bucket) -> dict[int, int]:
    return {i: v.high_seqno for i, v in enumerate(bucket.vbuckets)}


def test_stream_to_latest_records_pcap_and_state(tmp_path: Path, sim_node: NodeFactory) -> None:
    cl, bucket = cluster()
    records: list[Record] = []
    events: list[ConsumerEvent] = []
    state_file = tmp_path / "state.json"
    pcap = tmp_path / "live.pcap"

    async def main() -> ResumeState:
        async with sim_node(cl) as node:
            return await run_client(
                "127.0.0.1", node.port, config(), on_record=records.append, on_event=events.append, pcap=pcap, state_path=state_file
            )

    state = run(main())
    assert {vb: st.seqno for vb, st in state.vbuckets.items()} == highs(bucket)
    assert load_state(state_file) == state
    names = [r.event.name for r in records if r.event.type == "frame"]  # type: ignore[union-attr]
    assert names.count("DCP_MUTATION") == 120 and "DCP_BUFFER_ACKNOWLEDGEMENT" in names
    assert all(r.event.type == "frame" for r in records)
    assert {r.direction for r in records} == {"c2s", "s2c"}
    from dcpinspect import dissect

    assert all(not dissect(r.event, r.context).problems for r in records)  # type: ignore[arg-type]
    # the pcap holds the same frames
    back = list(read_records([str(pcap)]))
    assert [r.event.name for r in back] == [r.event.name for r in records]  # type: ignore[union-attr]
    # byte for byte, except the SCRAM proof: the pcap masks SASL secrets (LiveCapture keep_secrets=False)
    differ = [(r.event.name, a.event.raw) for r, a in zip(records, back, strict=True) if r.event.raw != a.event.raw]  # type: ignore[union-attr]
    assert [n for n, _ in differ] == ["SASL_STEP"] and b"p=****" in differ[0][1]
    assert PASSWORD not in "".join(map(str, events))
    row = json.loads(record_lines([records[0]], as_json=True)[0])
    from dcpinspect.tables.columns import JSON_COLUMNS

    assert list(row) == list(JSON_COLUMNS) and row["name"] == "HELLO" and isinstance(row["ts"], float)


def test_resume_from_a_saved_state_gets_only_the_new_items(tmp_path: Path, sim_node: NodeFactory) -> None:
    cl, bucket = cluster(items=40)
    state_file = tmp_path / "state.json"

    async def session() -> tuple[ResumeState, list[ConsumerEvent]]:
        evs: list[ConsumerEvent] = []
        async with sim_node(cl) as node:
            st = await run_client("127.0.0.1", node.port, config(), on_event=evs.append, state_path=state_file)
        return st, evs

    first, _ = run(session())
    for i in range(7):
        bucket.mutate(f"later-{i}", {"i": i})
    second, evs = run(session())
    assert sum(e.kind == "mutation" for e in evs) == 7
    assert {vb: st.seqno for vb, st in second.vbuckets.items()} == highs(bucket)
    reqs = [e for e in evs if e.kind == "stream_requested"]
    assert {e.vbucket: e.data["start_seqno"] for e in reqs} == {vb: st.seqno for vb, st in first.vbuckets.items()}
    assert all(e.data["vb_uuid"] == first.vbuckets[e.vbucket].vb_uuid for e in reqs if e.vbucket is not None)


def test_connection_refused_and_bad_password(sim_node: NodeFactory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClientError, match="cannot connect"):
        run(run_client("127.0.0.1", port, config()))
    cl, _ = cluster(items=1)

    async def main() -> None:
        async with sim_node(cl) as node:
            await run_client("127.0.0.1", node.port, config(password="wrong"))

    with pytest.raises(ClientError, match="authentication failed") as info:
        run(main())
    assert "wrong" not in str(info.value)


def test_stop_from_inside_a_running_loop_and_sync_use(tmp_path: Path, sim_node: NodeFactory) -> None:
    cl, bucket = cluster(items=10)

    async def main() -> ResumeState:
        async with sim_node(cl) as node:
            client = DcpClient("127.0.0.1", node.port, config(to_latest=False), state_path=tmp_path / "s.json")
            await client.start()
            want = highs(bucket)
            # every vbucket listed and caught up (not "all()" over a stream table still empty)
            await client.until(lambda c: {vb: s.position.seqno for vb, s in c.streams.items()} == want)
            return await client.stop()

    state = run(main())
    assert {vb: st.seqno for vb, st in state.vbuckets.items()} == highs(bucket)
    assert load_state(tmp_path / "s.json") == state

    # from sync code, and from sync code called inside a running loop (as in Jupyter)
    async def node_then_sync() -> ResumeState:
        async with sim_node(cl) as node:
            return await asyncio.to_thread(run_client_sync, "127.0.0.1", node.port, config())

    assert run(node_then_sync()) == state


@contextlib.contextmanager
def node_in_thread(sim_node: NodeFactory, cl: Cluster) -> Iterator[int]:
    """The node on its own event loop in a thread (for a client in a subprocess); the waits only guard against a hang."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()  # bound to the node's loop when first awaited there
    holder: dict[str, Any] = {}

    async def serve() -> None:
        try:
            async with sim_node(cl) as node:
                holder["port"] = node.port
                ready.set()
                await stop.wait()
        finally:
            ready.set()  # a node that failed to start must not leave the test waiting

    t = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    t.start()
    try:
        assert ready.wait(60) and "port" in holder, "the loopback node did not start"
        yield holder["port"]
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(60)
        assert not t.is_alive(), "the loopback node did not stop"
        loop.close()


def test_cli_to_latest_json_exits_0(tmp_path: Path, sim_node: NodeFactory) -> None:
    cl, bucket = cluster(items=25, vbuckets=2)
    env = {**os.environ, "DCPINSPECT_PASSWORD": PASSWORD, "PYTHONPATH": str(ROOT)}
    with node_in_thread(sim_node, cl) as port:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "dcpinspect",
                "client",
                f"127.0.0.1:{port}",
                "--bucket",
                "travel",
                "--user",
                "alice",
                "--to-latest",
                "--json",
                "--state",
                str(tmp_path / "st.json"),
                "--pcap",
                str(tmp_path / "c.pcap"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        rows = [json.loads(line) for line in proc.stdout.splitlines()]
        assert sum(r["name"] == "DCP_MUTATION" for r in rows) == 25
        assert all(not r["problems"] for r in rows)
        assert PASSWORD not in proc.stdout + proc.stderr
        assert {int(k): v["seqno"] for k, v in json.loads((tmp_path / "st.json").read_text())["vbuckets"].items()} == highs(bucket)
        # the human summary, resumed from the state file: nothing new
        out = io.StringIO()
        os.environ["DCPINSPECT_TEST_PW"] = PASSWORD
        try:
            rc = cli_main(
                [
                    "client",
                    f"127.0.0.1:{port}",
                    "--bucket",
                    "travel",
                    "--user",
                    "alice",
                    "--password-env",
                    "DCPINSPECT_TEST_PW",
                    "--to-latest",
                    "--state",
                    str(tmp_path / "st.json"),
                ],
                out=out,
            )
        finally:
            del os.environ["DCPINSPECT_TEST_PW"]
        assert rc == 0, out.getvalue()
        lines = [x for x in out.getvalue().splitlines() if x.startswith("vb ")]
        assert len(lines) == 2 and all("nothing" in x and "OK" in x for x in lines)
        # wrong password: one line, exit 2
        env_bad = {**env, "DCPINSPECT_PASSWORD": "nope"}
        bad = subprocess.run(
            [sys.executable, "-m", "dcpinspect", "client", f"127.0.0.1:{port}", "--bucket", "travel", "--user", "alice", "--to-latest"],
            capture_output=True,
            text=True,
            env=env_bad,
            timeout=60,
            check=False,
        )
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_cli_errors_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DCPINSPECT_PASSWORD", PASSWORD)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert cli_main(["client", f"127.0.0.1:{port}", "--bucket", "b", "--user", "u"], out=io.StringIO()) == 2
    assert "cannot connect" in err.getvalue() and len(err.getvalue().splitlines()) == 1
    monkeypatch.delenv("DCPINSPECT_PASSWORD")
    assert cli_main(["client", "127.0.0.1:1", "--bucket", "b", "--user", "u"], out=io.StringIO()) == 2
    assert "DCPINSPECT_PASSWORD" in err.getvalue()
    assert cli_main(["client", "127.0.0.1:1", "--bucket", "b", "--user", "u", "--vbuckets", "3-1"], out=io.StringIO()) == 2


# --- the project's simulator ------------------------------------------------------------------------


def _sim(nodes: int = 1) -> Simulator:
    return Simulator(
        host="127.0.0.1", port=0, bucket="travel", vbuckets=4, items=60, users={"alice": PASSWORD}, seed=7, tick=0.02, nodes=nodes
    )


def test_simulator_to_latest_then_failover_rollback_and_retry() -> None:
    """Two nodes (a failover promotes a replica): the second run finds vbucket 2 on the other node, which rolls it back."""
    s = _sim(nodes=2)

    async def main() -> None:
        await s.start()
        try:
            first = await run_client(s.host, s.port, config())
            assert {vb: st.seqno for vb, st in first.vbuckets.items()} == highs(s.bucket)
            s.failover(2, lose=4)
            s.mutate("fresh", {"v": 1})
            evs: list[ConsumerEvent] = []
            second = await run_client(s.host, s.port, config(resume=first), on_event=evs.append)
            rb = [e for e in evs if e.kind == "rollback"]
            assert [e.vbucket for e in rb] == [2] and rb[0].data["rollback_seqno"] <= first.vbuckets[2].seqno - 4
            assert {vb: st.seqno for vb, st in second.vbuckets.items()} == highs(s.bucket)
            assert second.vbuckets[2].vb_uuid == s.bucket.vbuckets[2].failover_log[0][0]
        finally:
            await s.stop()

    run(main())


def test_simulator_failover_while_streaming_rerequests_and_rolls_back() -> None:
    """StateChanged: the client asks the map again and re-requests vbucket 0 on the promoted node, which rolls it back."""
    s = _sim(nodes=2)

    async def main() -> None:
        await s.start()
        try:
            evs: list[ConsumerEvent] = []
            client = DcpClient(s.host, s.port, config(to_latest=False, vbuckets=(0, 1)), on_event=evs.append)
            await client.start()

            def caught_up(_c: Any) -> bool:  # every node's streams (the first connection's consumer has only its own)
                return all(
                    st.status == "streaming" and st.position.seqno == s.bucket.vbuckets[vb].high_seqno for vb, st in client.streams.items()
                )

            await client.until(caught_up)
            s.failover(0, lose=3)
            await client.until(lambda c: any(e.kind == "rollback" for e in evs) and caught_up(c))
            for i in range(20):
                s.mutate(f"after-{i}", i)
            await client.until(caught_up)
            state = await client.stop()
            kinds = [e.kind for e in evs]
            assert "stream_end" in kinds and "rerequest" in kinds and "moved" in kinds and "malformed" not in kinds
            assert {vb: st.seqno for vb, st in state.vbuckets.items()} == {vb: s.bucket.vbuckets[vb].high_seqno for vb in (0, 1)}
        finally:
            await s.stop()

    run(main())


def test_simulator_cli_to_latest_json_exits_0(tmp_path: Path) -> None:
    s = _sim()
    env = {**os.environ, "DCPINSPECT_PASSWORD": PASSWORD, "PYTHONPATH": str(ROOT)}
    with s.run_in_thread() as t:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "dcpinspect",
                "client",
                f"{t.host}:{t.port}",
                "--bucket",
                "travel",
                "--user",
                "alice",
                "--vbuckets",
                "0-3",
                "--to-latest",
                "--json",
                "--pcap",
                str(tmp_path / "sim.pcap"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert sum(r["name"] == "DCP_MUTATION" for r in rows) == 60
    assert sum(r["name"] == "DCP_STREAM_END" for r in rows) == 4
    assert all(not r["problems"] for r in rows)
    assert len(list(read_records([str(tmp_path / "sim.pcap")]))) == len(rows)


def test_simulator_held_acks_stall_the_stream_until_released() -> None:
    """hold_acks: the window fills and the producer stops (flow control); releasing sends the ack and the stream ends OK."""
    s = _sim()

    async def main() -> None:
        await s.start()
        try:
            evs: list[ConsumerEvent] = []
            client = DcpClient(s.host, s.port, config(vbuckets=(0,), buffer_size=1024), on_event=evs.append, hold_acks=True, tick=0.02)
            await client.start()

            def window_full_and_all_received(c: Any) -> bool:
                # the producer stopped on a full window, and every byte it charged to it has arrived
                conns = s.connections
                return (
                    len(conns) == 1
                    and conns[0].buffer_size > 0
                    and conns[0].bytes_outstanding >= conns[0].buffer_size
                    and c.consumed_total == conns[0].bytes_outstanding
                )

            await client.until(window_full_and_all_received)
            assert client.consumer is not None and client.consumer.hold_acks and client.consumer.unacked >= 1024
            s.kick()  # the producer is asked for more: the full window holds it back
            assert s.connections[0].bytes_outstanding == client.consumer.consumed_total
            stalled = client.consumer.streams[0].position.seqno
            assert stalled < s.bucket.vbuckets[0].high_seqno and not any(e.kind == "buffer_ack" for e in evs)
            client.hold_acks = False
            state = await client.wait()
            assert state.vbuckets[0].seqno == s.bucket.vbuckets[0].high_seqno
            assert any(e.kind == "buffer_ack" for e in evs)
        finally:
            await s.stop()

    run(main())


def test_simulator_stop_with_send_stream_end_on_client_close_stream_sees_closed() -> None:
    """send_stream_end_on_client_close_stream: the client closes its streams and reads on until the producer's STREAM_END(Closed)."""
    s = _sim()

    async def main() -> None:
        await s.start()
        try:
            evs: list[ConsumerEvent] = []
            records: list[Record] = []
            cfg = config(to_latest=False, vbuckets=(0, 1), controls=(("send_stream_end_on_client_close_stream", "true"),))
            client = DcpClient(s.host, s.port, cfg, on_event=evs.append, on_record=records.append)
            await client.start()
            await client.until(lambda c: len(c.streams) == 2 and all(st.status == "streaming" for st in c.streams.values()))
            await client.stop()
            ends = [e for e in evs if e.kind == "stream_end"]
            assert sorted(e.vbucket for e in ends) == [0, 1] and {e.message for e in ends} == {"Closed"}
            assert sum(r.event.type == "frame" and r.event.opcode == Opcode.DCP_STREAM_END for r in records) == 2
        finally:
            await s.stop()

    run(main())


# --- what the client keeps on a long stream ----------------------------------------------------------


def test_the_client_keeps_no_records_however_many_frames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_node: NodeFactory) -> None:
    """Without on_record the frames are not kept (they were: 160 MB at 300k mutations); the consumer's tables stay per-vbucket."""
    from dcpinspect.live import client as client_mod

    made: list[Any] = []

    class Spy(client_mod.LiveCapture):  # type: ignore[misc,name-defined]
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            made.append(self)

    monkeypatch.setattr(client_mod, "LiveCapture", Spy)
    cl, _bucket = cluster(items=1500, vbuckets=2)

    async def main(**kw: Any) -> DcpClient:
        async with sim_node(cl) as node:
            client = DcpClient("127.0.0.1", node.port, config(), **kw)
            await client.run()
            return client

    client = run(main())  # as `dcpinspect client` without --json or --pcap: nothing turns frames into records
    assert made == []
    c = client.consumer
    assert c is not None and sum(st.counts["mutation"] for st in c.streams.values()) == 1500
    assert len(c.streams) == 2 and len(c.state.vbuckets) == 2 and not c.awaiting and not c.tracker.by_opaque and not c.data_to_send()
    run(main(pcap=tmp_path / "c.pcap"))  # with --pcap: records are made for the file, and dropped
    assert len(made) == 1 and made[0].records == []
    assert sum(r.event.name == "DCP_MUTATION" for r in read_records([str(tmp_path / "c.pcap")])) == 1500  # type: ignore[union-attr]


def test_cli_summary_escapes_the_servers_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error body with control characters reaches the terminal escaped, like every other output."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = FrameDecoder()
        while data := await reader.read(4096):
            for f in dec.feed(data):
                name = {Opcode.HELLO: "HELLO", Opcode.SASL_LIST_MECHS: "SASL_LIST_MECHS"}.get(f.opcode)  # type: ignore[union-attr,call-overload]
                if name == "HELLO":
                    writer.write(encode(name, response=True, opaque=f.opaque, value={"features": []}))  # type: ignore[union-attr]
                elif name:
                    writer.write(encode(name, response=True, opaque=f.opaque, value=b"EVIL\x1b]0;owned\x07\x1b[2J"))  # type: ignore[union-attr]
        writer.close()

    async def main() -> tuple[int, str]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        monkeypatch.setenv("DCPINSPECT_PASSWORD", PASSWORD)
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        try:
            rc = await asyncio.to_thread(cli_main, ["client", f"127.0.0.1:{port}", "--bucket", "b", "--user", "u"], out=io.StringIO())
        finally:
            server.close()
        return rc, err.getvalue()

    rc, err = run(main())
    assert rc == 2 and "\\x1b]0;owned\\x07" in err and "\x1b" not in err and "\x07" not in err
