"""The client against hostile servers always ends: a seeded slice of ``benchmarks/fuzz_client.py``.

Sans-IO runs (the consumer against the producer behind a mutating filter, fake clock) for every
mutation, and a few runs of the real client over TCP on 127.0.0.1 (the tests' loopback node, the hostile
filter on its output, the client's timeouts on a fake clock that moves only while nothing is in flight).
"""

from __future__ import annotations

import asyncio
import json
from types import ModuleType

import pytest
from scripts import load_script
from simnode import SimNode

from dcpinspect import FrameDecoder, encode
from dcpinspect.live.client import ClientError, DcpClient
from dcpinspect.live.consumer import ConsumerConfig
from dcpinspect.live.consumer_cluster import MAX_LINKS, ClusterConsumer
from dcpinspect.live.consumer_states import ConsumerEvent
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Magic, Opcode
from dcpinspect.wire.events import Frame


def _fuzz() -> ModuleType:
    return load_script("benchmarks/fuzz_client.py")


fuzz = _fuzz()
CASES = [(seed, kind) for kind in fuzz.MUTATIONS for seed in range(3)]


@pytest.mark.parametrize(("seed", "kind"), CASES, ids=[f"{k}-{s}" for s, k in CASES])
def test_sansio_client_always_ends(seed: int, kind: str) -> None:
    p = fuzz.plan(seed, kind)
    o = fuzz.run_sansio(p)
    assert fuzz.check(p, o) is None, o
    assert o.elapsed < 20 * 1.0


def test_sansio_silence_ends_with_the_response_timeout() -> None:
    # a bootstrap reply never comes (the stream requests have their own case); the sans-IO consumer has no
    # address, so it asks no cluster map: one reply fewer than over TCP
    for target in range(fuzz.REPLIES - 3):
        o = fuzz.run_sansio(fuzz.Plan(0, target, "silence"))
        assert o.kind == "error" and "within 1 s" in o.message, (target, o)


def test_sansio_huge_scram_iterations_is_refused() -> None:
    o = fuzz.run_sansio(fuzz.Plan(3, 2, "huge_iterations"))
    assert o.kind == "error" and "above the limit" in o.message, o


@pytest.mark.parametrize(
    ("kind", "target", "expect"),
    [
        ("silence", 4, "no reply to SELECT_BUCKET within 2 s"),
        ("huge_iterations", 2, "above the limit 100000"),
        ("close_mid_frame", 1, "server closed the connection"),
        ("garbage", 0, ""),
        ("wrong_opaque", 5, "no reply to CONFIG within 2 s"),
        ("wrong_opaque", 7, "no reply to OPEN within 2 s"),
        ("truncate", 3, ""),
    ],
)
def test_tcp_client_always_ends_with_the_right_error(kind: str, target: int, expect: str) -> None:
    """The real client over TCP: the run ends, and how (the assertion is on how, not on how long it took).

    The client's timeouts run on a fake clock that moves only while the connection is quiet: the node
    idle, every byte either way read by the other side (``fuzz.advance_when_quiet``).  A reply the plan
    withholds is then the only one that can time out, however long a loaded machine stalls the others,
    so the error names the right request.  Real time only bounds a hang (``run_tcp``'s ``safety``).
    """
    p = fuzz.Plan(11, target, kind)
    o = asyncio.run(fuzz.run_tcp(p, response_timeout=2.0))
    assert fuzz.check(p, o) is None, o
    assert o.kind == "error" and expect in o.message, o


# --- issue 14: silence while streaming, hostile cluster maps -----------------------------------------


class _MuteAfterStreamRequest:
    """An output filter: the node's bytes pass until its reply to the first stream request; then it falls silent (no noops)."""

    close = False

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.muted = False

    def filter(self, data: bytes) -> bytes:
        out = bytearray()
        for ev in self.decoder.feed(data):
            if self.muted or not isinstance(ev, Frame):
                break
            out += ev.raw
            self.muted = ev.magic == Magic.CLIENT_RESPONSE and ev.opcode == Opcode.DCP_STREAM_REQ
        return bytes(out)


def test_tcp_silence_while_streaming_is_a_dead_connection_after_two_noop_intervals() -> None:
    """No traffic at all for two noop intervals (the client's clock, faked: it moves only while nothing is in flight)."""
    interval = 3.0

    async def main() -> tuple[str, float]:
        async with SimNode(fuzz._cluster(5), output_filter=_MuteAfterStreamRequest) as node:
            clock = fuzz.FakeClock()
            cfg = fuzz.client_config(30.0)
            cfg = ConsumerConfig(**{**cfg.__dict__, "noop_interval": interval, "vbuckets": (0,), "to_latest": False})
            client = DcpClient(node.host, node.port, cfg, tick=0.05, clock=clock)
            await client.start()
            driver = asyncio.ensure_future(fuzz.advance_when_quiet(client, node, clock, 0.25, 60.0))
            try:
                await client.wait()
            except ClientError as exc:
                return str(exc), clock.now
            finally:
                driver.cancel()
            return "", clock.now

    message, when = asyncio.run(asyncio.wait_for(main(), 60))
    assert message.startswith("no traffic from the server for ") and f"noop interval {interval:g} s" in message, message
    assert 2 * interval < when <= 2 * interval + 1.0


def _scripted_map_bootstrap(fleet: ClusterConsumer, value: bytes) -> list[ConsumerEvent]:
    """Bring the fleet's first connection through its bootstrap to the cluster map reply ``value``."""
    evs = fleet.connected(0, 0.0)
    answers = {
        "HELLO": {"features": []},
        "SASL_LIST_MECHS": b"PLAIN",
        "GET_CLUSTER_CONFIG": value,
    }
    for _ in range(20):
        out = fleet.data_to_send(0)
        frames = [f for f in FrameDecoder().feed(out) if isinstance(f, Frame)]
        if not frames:
            break
        for f in frames:
            name = spec.opcode_name(f.opcode)
            reply = encode(name, response=True, opaque=f.opaque, value=answers.get(name))
            evs += fleet.receive(0, reply, 0.0)
    return evs


def test_a_map_naming_too_many_nodes_fails_the_client_in_one_line() -> None:
    n = MAX_LINKS + 10
    cfg = {"rev": 1, "nodesExt": [{"services": {"kv": 20000 + i}, "hostname": "127.0.0.1"} for i in range(n)]}
    cfg["vBucketServerMap"] = {"vBucketMap": [[i] for i in range(n)]}  # type: ignore[assignment]
    fleet = ClusterConsumer(ConsumerConfig(bucket="travel", user="alice", password="pw", vbuckets=None), ("127.0.0.1", 20000))
    fleet.wanted()
    evs = _scripted_map_bootstrap(fleet, json.dumps(cfg).encode())
    assert fleet.done and fleet.failure == f"the cluster map names more than {MAX_LINKS} nodes to connect to"
    assert len(fleet.links) == MAX_LINKS and [e.kind for e in evs].count("error") == 1


@pytest.mark.parametrize(
    "value",
    [
        b'{"rev": 1, "nodesExt": [{"services": {"kv": 20000}}], "vBucketServerMap": {"vBucketMap": [[0]]}, "name": 7}',
        b'{"rev": "1", "nodesExt": []}',
        b'{"nodesExt": [{"services": {"kv": 20000}}], "vBucketServerMap": {"vBucketMap": [[5]]}}',
        json.dumps({"nodesExt": [{"services": {"kv": 20000}}], "vBucketServerMap": {"vBucketMap": [[0]] * 70000}}).encode(),
        b"\xff" * 64,
    ],
)
def test_an_unusable_map_keeps_the_client_on_its_connection(value: bytes) -> None:
    fleet = ClusterConsumer(ConsumerConfig(bucket="travel", user="alice", password="pw", vbuckets=(0,)), ("127.0.0.1", 20000))
    fleet.wanted()
    evs = _scripted_map_bootstrap(fleet, value)
    assert fleet.failure is None and list(fleet.links) == [0] and fleet.consumer is not None
    assert fleet.consumer.cluster_map is None and any(e.kind == "cluster_map" and "stays on this connection" in e.message for e in evs)
    assert all(e.message.isprintable() for e in evs)
