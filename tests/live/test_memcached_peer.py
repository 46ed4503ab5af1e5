"""A real peer: Debian's memcached (binary protocol) driven by a real PyPI client (python-binary-memcached,
no SASL) through the tap proxy.  The client's results are right, the bytes it sent and received are exactly the
capture's two directions, every frame decodes without a problem, and tshark agrees with the written capture."""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback import assert_clean, live_vs_file, tshark_agrees
from tshark import TSHARK

from dcpinspect import decode, encode
from dcpinspect.flows.records import Record
from dcpinspect.live.proxy import TapProxy

MEMCACHED = shutil.which("memcached") or ("/usr/bin/memcached" if Path("/usr/bin/memcached").exists() else None)
bmemcached = pytest.importorskip("bmemcached", reason="python-binary-memcached is not installed (pip install -e '.[dev]')")
pytestmark = [pytest.mark.memcached, pytest.mark.tshark]  # tshark reads its captures back when installed
pytestmark.append(pytest.mark.skipif(MEMCACHED is None, reason="memcached is not installed (apt-get install memcached)"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Stderr:
    """Drains a memcached's stderr on a thread; :attr:`ready` is set on its "server listening" line, or at EOF."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        self.stream = proc.stderr
        self.listening = False
        self.tail: list[str] = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for line in self.stream:  # -vv: memcached says when it listens (and then one line per command: drained)
            if "server listening" in line:
                self.listening = True
                self.ready.set()
            self.tail = [*self.tail[-20:], line]
        self.ready.set()  # EOF: it exited (e.g. the port was taken meanwhile)


@pytest.fixture
def memcached() -> Iterator[tuple[str, int]]:
    """A fresh memcached speaking only the binary protocol on 127.0.0.1 (TCP only)."""
    assert MEMCACHED is not None
    for _ in range(5):
        port = _free_port()
        proc = subprocess.Popen(
            [MEMCACHED, "-u", "root", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-B", "binary", "-m", "64", "-t", "2", "-vv"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        err = _Stderr(proc)
        assert err.ready.wait(120), "memcached neither listened nor exited"  # a deadline only: the line is the event
        if err.listening:
            break
        proc.wait(60)  # the port was taken meanwhile: another one
        err.thread.join(60)
    else:
        pytest.fail(f"memcached did not start: {''.join(err.tail)}")
    try:
        yield "127.0.0.1", port
    finally:
        proc.terminate()
        proc.wait(60)
        err.thread.join(60)


class Recording:
    """A socket that keeps a sha256 of every byte sent and received (the client's own view)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.sent = hashlib.sha256()
        self.received = hashlib.sha256()
        self.n_sent = 0
        self.n_received = 0

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)
        self.sent.update(data)
        self.n_sent += len(data)

    def recv(self, n: int) -> bytes:
        data = self._sock.recv(n)
        self.received.update(data)
        self.n_received += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _stream(recs: list[Record], conn: int, direction: str) -> bytes:
    return b"".join(r.event.raw for r in recs if r.conn == conn and r.direction == direction)  # type: ignore[union-attr]


def _raw_exchange(port: int, frames: list[bytes]) -> list[Any]:
    """Send frames on a plain socket and read one response per frame (for commands the client lacks)."""
    out: list[Any] = []
    with socket.create_connection(("127.0.0.1", port), 60) as s:  # a deadline only
        s.sendall(b"".join(frames))
        buf = b""
        while len(out) < len(frames):
            chunk = s.recv(65536)
            assert chunk, "memcached closed the connection"
            buf += chunk
            events = list(decode(buf))
            done = [e for e in events if e.type == "frame"]
            if len(done) >= len(frames):
                out = done
    return out


def test_binary_client_through_the_tap_proxy(memcached: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pcap = tmp_path / "memcached.pcap"
    live: list[Record] = []
    sockets: list[Recording] = []
    real = socket.create_connection

    def recording(*args: Any, **kw: Any) -> Any:
        sock = Recording(real(*args, **kw))
        sockets.append(sock)
        return sock

    with TapProxy(upstream=memcached, pcap=pcap, on_record=live.append).background() as proxy:
        monkeypatch.setattr(socket, "create_connection", recording)
        client = bmemcached.Client([f"127.0.0.1:{proxy.port}"])  # no username: no SASL
        try:
            assert client.set("greeting", "hello")
            assert client.get("greeting") == "hello"
            assert client.set("blob", b"\x00\xff" * 70_000)  # a value bigger than one segment
            assert client.get("blob") == b"\x00\xff" * 70_000
            assert client.add("greeting", "again") is False  # exists
            assert client.replace("greeting", "hi")
            assert client.get("greeting") == "hi"
            assert client.set("n", 10)
            assert client.incr("n", 5) == 15
            assert client.decr("n", 3) == 12
            assert client.set_multi({f"m{i}": f"v{i}" for i in range(20)}) == []
            assert client.get_multi([f"m{i}" for i in range(20)] + ["missing"]) == {f"m{i}": f"v{i}" for i in range(20)}
            value, cas = client.gets("greeting")
            assert value == "hi" and cas
            assert client.cas("greeting", "cas-ed", cas)
            assert client.get("greeting") == "cas-ed"
            assert client.delete("greeting")
            assert client.get("greeting") is None
            stats = client.stats()
            server_stats = next(iter(stats.values()))
            assert int(server_stats["curr_items"]) >= 22
            assert int(server_stats["cmd_get"]) >= 5
        finally:
            client.disconnect_all()
        monkeypatch.undo()
        # APPEND/PREPEND/VERSION/NOOP: not in this client, sent as raw frames through the proxy
        got = _raw_exchange(
            proxy.port,
            [
                encode("APPEND", key="m1", value=b"-tail", opaque=1),
                encode("PREPEND", key="m1", value=b"head-", opaque=2),
                encode("GET", key="m1", opaque=3),
                encode("VERSION", opaque=4),
                encode("NOOP", opaque=5),
            ],
        )
        assert [f.status for f in got] == [0, 0, 0, 0, 0]
        assert got[2].value == b"head-v1-tail"
        assert got[3].value.decode().count(".") >= 2  # e.g. 1.6.18
        assert proxy.wait_idle(60)  # both connections closed by FIN, none cut by the proxy's stop
    assert proxy.decode_errors == 0 and proxy.refused == 0
    assert len(sockets) == 1
    sock = sockets[0]

    back = live_vs_file(live, pcap)
    assert_clean(back)
    conn = back[0].conn
    c2s, s2c = _stream(back, conn, "c2s"), _stream(back, conn, "s2c")
    assert (hashlib.sha256(c2s).hexdigest(), len(c2s)) == (sock.sent.hexdigest(), sock.n_sent)
    assert (hashlib.sha256(s2c).hexdigest(), len(s2c)) == (sock.received.hexdigest(), sock.n_received)
    assert sum(proxy.bytes.values()) == sum(len(r.event.raw) for r in back)  # type: ignore[union-attr]
    names = {r.event.name for r in back}  # type: ignore[union-attr]
    assert {"SET", "GET", "ADD", "REPLACE", "INCREMENT", "DECREMENT", "DELETE", "STAT", "APPEND", "PREPEND", "VERSION", "NOOP"} <= names
    if TSHARK is not None:
        tshark_agrees(pcap, back, memcached[1])


#: a classic KV sequence and the statuses both servers must answer (vbucket 0: the simulator runs one vbucket)
_BOGUS_CAS = 0xDEADBEEFDEAD
KV_SEQUENCE = [
    (encode("GET", key="k", opaque=1), 0x01),
    (encode("REPLACE", key="k", extras={"flags": 1, "expiration": 0}, value=b"r", opaque=2), 0x01),
    (encode("DELETE", key="k", opaque=3), 0x01),
    (encode("ADD", key="k", extras={"flags": 0x1234, "expiration": 0}, value=b"first", opaque=4), 0x00),
    (encode("ADD", key="k", extras={"flags": 0, "expiration": 0}, value=b"again", opaque=5), 0x02),
    (encode("SET", key="k", extras={"flags": 0, "expiration": 0}, value=b"cas", cas=_BOGUS_CAS, opaque=6), 0x02),
    (encode("SET", key="other", extras={"flags": 0, "expiration": 0}, value=b"cas", cas=_BOGUS_CAS, opaque=7), 0x01),
    (encode("GET", key="k", opaque=8), 0x00),
    (encode("REPLACE", key="k", extras={"flags": 0x5678, "expiration": 0}, value=b"second", opaque=9), 0x00),
    (encode("GET", key="k", opaque=10), 0x00),
    (encode("DELETE", key="k", cas=_BOGUS_CAS, opaque=11), 0x02),
    (encode("DELETE", key="k", opaque=12), 0x00),
    (encode("GET", key="k", opaque=13), 0x01),
    (encode("SET", key="k", extras={"flags": 7, "expiration": 0}, value=b"back", opaque=14), 0x00),
    (encode("GET", key="k", opaque=15), 0x00),
]


def test_kv_statuses_match_memcached(memcached: tuple[str, int]) -> None:
    """The simulator answers the classic KV commands as memcached does: statuses, values, flags, CAS changes."""
    from dcpinspect.live.sasl import plain_payload
    from dcpinspect.live.sim import Simulator

    frames = [f for f, _ in KV_SEQUENCE]
    mc = _raw_exchange(memcached[1], frames)
    auth = [
        encode("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password"), opaque=90),
        encode("SELECT_BUCKET", key="default", opaque=91),
    ]
    with Simulator(vbuckets=1, items=0, seed=1).run_in_thread() as sim:
        got = _raw_exchange(sim.port, auth + frames)[2:]
    want = [status for _, status in KV_SEQUENCE]
    assert [f.status for f in mc] == want
    assert [f.status for f in got] == want
    for a, b in zip(mc, got, strict=True):
        assert (a.opcode, a.opaque) == (b.opcode, b.opaque)
        if a.status == 0:  # errors: memcached adds a text ("Not found"), kv_engine none
            assert (a.value, a.extras) == (b.value, b.extras), (a.opaque, a, b)
    # CAS: a GET returns the CAS of the write before it, each write a new one (both servers)
    for replies in (mc, got):
        cas = {f.opaque: f.cas for f in replies}
        assert cas[8] == cas[4] and cas[10] == cas[9] != cas[4] and cas[15] == cas[14]
