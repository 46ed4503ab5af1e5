"""Sniffing ``lo`` for real while a tap-proxy session runs: the sniffed records decode the session
(each packet once), the written pcap reads back to the same records, and the CLI works (root only)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loopback import LOOP, requests, responses, run, send_chunks
from paths import ROOT

from dcpinspect import dissect, encode
from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import Record
from dcpinspect.live.proxy import TapProxy


def _can_sniff() -> bool:
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    except (PermissionError, AttributeError, OSError):
        return False
    return True


needs_root = pytest.mark.skipif(not _can_sniff(), reason="sniffing needs root or CAP_NET_RAW")


def _closed(n: int) -> Callable[[Any], bool]:
    """For ``Sniffer.wait_until``: the sniffer has handled the end (FIN both ways, or a RST) of ``n`` connections."""
    return lambda sn: sum(c.closed for c in sn.recorder.reassembler.connections) >= n


def _frames(recs: list[Record]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {"c2s": [], "s2c": []}
    for r in recs:
        assert r.event.type == "frame", r
        out[r.direction].append(r.event.raw)  # type: ignore[union-attr]
    return out


@needs_root
def test_sniffing_lo_decodes_a_proxied_session(tmp_path: Path) -> None:
    from dcpinspect.live.sniff import Sniffer

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
        assert await asyncio.to_thread(sn.wait_until, _closed(1), 60)  # both FINs of proxy <-> upstream sniffed
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
            "-f",
            f"tcp port {port} and host {LOOP}",  # a capture filter of the user's own, compiled into the kernel socket
            "--pcap",
            str(pcap),
            "--json",
            "--timeout",
            "120",  # a deadline only: the test stops it with SIGINT
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == f"dcpinspect sniff: capturing on lo, filter 'tcp port {port} and host {LOOP}'\n"
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
            srv.close()
            await srv.wait_closed()

        run(main())
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(20)]  # each record printed: the sniffer has handled the exchange
        proc.send_signal(2)  # SIGINT
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    import json

    assert out == ""  # nothing after the 20 records
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 20 and all(row["problems"] == [] for row in rows)
    assert {row["dir"] for row in rows} == {"c2s", "s2c"}
    assert len(list(read_records([str(pcap)], server_ports=[port]))) == 20


def test_sniff_without_privileges_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from dcpinspect.cli.main import main
    from dcpinspect.live import sniff

    def denied(iface: str, bpf: str | None) -> None:
        raise sniff.SniffPermissionError(f"capturing on {iface} needs root or CAP_NET_RAW ([Errno 1] Operation not permitted)")

    monkeypatch.setattr(sniff, "_raw_socket", denied)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["sniff", "--iface", "lo"], out=io.StringIO()) == 2
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
            [sys.executable, "-c", "import dcpinspect.live.sniff"],
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


# --- the pcap's SASL masking, on hand-made raw packets (no socket) ------------------------------------------

CLIENT, SERVER = ("10.0.0.1", 40000), ("10.0.0.2", 11210)


def _csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _raw(seq: int, payload: bytes = b"", flags: int = 0x18, *, c2s: bool = True) -> bytes:
    """An Ethernet/IPv4/TCP packet with valid IP and TCP checksums."""
    (src, sport), (dst, dport) = (CLIENT, SERVER) if c2s else (SERVER, CLIENT)
    s, d = socket.inet_aton(src), socket.inet_aton(dst)
    tcp = struct.pack(">HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, 0, 0x50, flags, 65535, 0, 0) + payload
    tcp = tcp[:16] + struct.pack(">H", _csum(s + d + struct.pack(">BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0, s, d)
    ip = ip[:10] + struct.pack(">H", _csum(ip)) + ip[12:]
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + tcp


def _tcp_ok(raw: bytes) -> bool:
    ip = raw[14:34]
    tcp = raw[34:]
    return _csum(ip[12:20] + struct.pack(">BBH", 0, 6, len(tcp)) + tcp) == 0


class _Collect:
    def __init__(self) -> None:
        self.packets: list[bytes] = []

    def write(self, ts: int, data: bytes, wirelen: int) -> None:
        self.packets.append(data)

    def close(self) -> None:
        pass


class _Wire:
    """Feeds hand-made packets through the sniffer's pcap masker, as the sniffer does."""

    def __init__(self) -> None:
        from dcpinspect.live.sniff import _PcapMasker

        self.out = _Collect()
        self.masker = _PcapMasker(self.out, frozenset({SERVER[1]}))  # type: ignore[arg-type]
        self.ts = 0

    def send(self, raw: bytes, cut: int = 0) -> None:
        from dcpinspect.capture.packets import locate_segment

        self.ts += 1000
        data = raw[: len(raw) - cut]  # the capture kept only this much (snap length)
        found = locate_segment(1, data, len(raw), self.ts, 0, "t", Counter())
        assert found is not None
        seg, tcp, start = found
        self.masker.write(seg, self.ts, data, len(raw), tcp, start)

    def payloads(self) -> bytes:
        return b"".join(p[54:] for p in self.out.packets)


ISN = 1000
AUTH = encode("SASL_AUTH", key="PLAIN", value=b"\x00bob\x00hunter2-secret", opaque=1)
NOOP = encode("NOOP", opaque=2)
MASKED = AUTH.replace(b"hunter2-secret", b"*" * 14)


def _start(w: _Wire) -> None:
    w.send(_raw(ISN, flags=0x02))  # SYN
    w.send(_raw(5000, flags=0x12, c2s=False))  # SYN-ACK


def test_masker_sasl_frame_split_across_two_segments_and_retransmitted() -> None:
    w = _Wire()
    _start(w)
    cut = len(AUTH) - 8  # the password is split: "hunter2-se" | "cret"
    one, two = _raw(ISN + 1, AUTH[:cut]), _raw(ISN + 1 + cut, AUTH[cut:] + NOOP)
    w.send(one)
    assert len(w.out.packets) == 2  # the unfinished SASL request is held back
    w.send(one)  # retransmitted while held: held too
    w.send(_raw(5001, flags=0x10, c2s=False))  # the server's ACK waits behind it (the file keeps the capture order)
    assert len(w.out.packets) == 2
    w.send(two)
    w.send(two)  # retransmitted after the frame completed: masked with the spans known
    w.send(_raw(ISN + 1 + cut - 4, AUTH[cut - 4 :]))  # an overlapping retransmission
    w.send(_raw(5001, encode("SASL_AUTH", response=True, opaque=1), c2s=False))
    w.masker.close()
    pk = w.out.packets
    assert len(pk) == 9
    assert [p[54:] for p in pk[2:4]] == [MASKED[:cut]] * 2
    assert pk[4] == _raw(5001, flags=0x10, c2s=False)
    assert [p[54:] for p in pk[5:7]] == [MASKED[cut:] + NOOP] * 2
    assert pk[7][54:] == MASKED[cut - 4 :]
    assert b"cret" not in b"".join(pk) and b"hunter" not in b"".join(pk)
    assert all(_tcp_ok(p) for p in pk)  # checksums updated, not just left stale
    assert all(len(a) == len(b) for a, b in zip(pk, [pk[0], pk[1], one, one, pk[4], two, two, pk[7], pk[8]], strict=True))


def test_masker_out_of_order_and_lost_segments() -> None:
    w = _Wire()
    _start(w)
    a, b, c = AUTH[:30], AUTH[30:40], AUTH[40:]
    w.send(_raw(ISN + 1 + 40, c))  # arrives first: held until the hole fills
    w.send(_raw(ISN + 1, a))
    assert len(w.out.packets) == 2
    w.send(_raw(ISN + 1 + 30, b))
    w.send(_raw(ISN + 1 + len(AUTH), NOOP))
    w.masker.close()
    assert [p[54:] for p in w.out.packets[2:]] == [MASKED[40:], MASKED[:30], MASKED[30:40], NOOP]
    assert all(_tcp_ok(p) for p in w.out.packets)

    # the middle segment never comes: the hole is declared lost, the unfinished request masked (header kept)
    w = _Wire()
    _start(w)
    w.send(_raw(ISN + 1, AUTH[:30]))
    w.send(_raw(ISN + 1 + 40, AUTH[40:]))
    w.masker.close()
    got = [p[54:] for p in w.out.packets[2:]]
    assert got == [AUTH[:24] + b"*" * 6, b"*" * (len(AUTH) - 40)]
    assert all(_tcp_ok(p) for p in w.out.packets)

    # a packet cut by the snap length inside the request: its lost tail is a hole too
    w = _Wire()
    _start(w)
    w.send(_raw(ISN + 1, AUTH), cut=5)
    w.send(_raw(ISN + 1 + len(AUTH), NOOP))
    assert [p[54:] for p in w.out.packets[2:]] == [AUTH[:24] + b"*" * (len(AUTH) - 29), NOOP]  # in sync again at once


def test_masker_unplaceable_midstream_oversized_and_server_side() -> None:
    w = _Wire()
    # joined mid-connection: blind until a frame boundary (the tail before it may be a secret's)
    tail = b"\x00bob\x00pw"
    w.send(_raw(7000, tail + NOOP))
    w.send(_raw(7000 + len(tail) + len(NOOP), AUTH))
    w.send(_raw(7000 + (1 << 28), b"far away"))  # cannot be placed: masked whole
    w.send(_raw(5000, b"\x00bob\x00pw", c2s=False))  # server->client too: blind (it may be a reflected request's tail)
    w.send(_raw(5000 + len(tail), NOOP, c2s=False))  # ... until a frame boundary
    w.masker.close()
    got = [p[54:] for p in w.out.packets]
    assert got == [b"*" * len(tail) + NOOP, MASKED, b"*" * 8, b"*" * len(tail), NOOP]

    # a SASL request declaring a body beyond the hold limit is not held: its body is masked as it passes
    from dcpinspect.live.tap import HOLD_LIMIT

    w = _Wire()
    _start(w)
    header = bytearray(AUTH[:24])
    struct.pack_into(">I", header, 8, HOLD_LIMIT + 10)
    w.send(_raw(ISN + 1, bytes(header) + b"PLAIN" + b"x" * 100))
    assert len(w.out.packets) == 3
    assert w.out.packets[2][54:] == bytes(header) + b"*" * 105


# --- SASL secrets in the sniffed pcap, for real on lo -----------------------------------------------------------


@needs_root
@pytest.mark.tshark
@pytest.mark.parametrize("keep", [False, True])
def test_sniffed_pcap_masks_sasl_plain_and_scram_secrets(tmp_path: Path, keep: bool) -> None:
    from tshark import TSHARK, tshark_frames

    from dcpinspect.live.client import run_client
    from dcpinspect.live.consumer import ConsumerConfig
    from dcpinspect.live.sim import Simulator
    from dcpinspect.live.sniff import Sniffer

    password = "s3cret-Pa55word"
    with socket.socket() as probe:
        probe.bind((LOOP, 0))
        port = probe.getsockname()[1]
    pcap = tmp_path / "sasl.pcap"
    sniffed: list[Record] = []
    sim = Simulator(host=LOOP, port=port, bucket="travel", vbuckets=2, items=10, users={"alice": password}, seed=3, tick=0.02)

    async def main() -> None:
        await sim.start()
        try:
            for mech in ("PLAIN", "SCRAM-SHA512"):
                cfg = ConsumerConfig(bucket="travel", user="alice", password=password, to_latest=True, mechanisms=(mech,))
                await run_client(LOOP, port, cfg)
            assert await asyncio.to_thread(sn.wait_until, _closed(2), 60)  # both connections' FINs sniffed
        finally:
            await sim.stop()

    with Sniffer("lo", (port,), pcap=pcap, on_record=sniffed.append, keep_secrets=keep) as sn:
        run(main())
    sasl = [r.event for r in sniffed if r.event.type == "frame" and r.direction == "c2s" and r.event.name in ("SASL_AUTH", "SASL_STEP")]  # type: ignore[union-attr]
    assert [e.name for e in sasl] == ["SASL_AUTH", "SASL_AUTH", "SASL_STEP"]  # type: ignore[union-attr]
    final = sasl[2].value  # type: ignore[union-attr]
    proof = final[final.index(b"p=") + 2 :]
    assert len(proof) > 60  # base64 of a SHA-512 proof
    raw = pcap.read_bytes()
    assert (password.encode() in raw) == keep and (proof in raw) == keep
    assert (b"\x00alice\x00" in raw) and b"n=alice" in raw  # only the secrets are masked
    # the pcap reads back to the same frames, the SASL ones masked (same length)
    back = list(read_records([str(pcap)], server_ports=[port]))
    assert [(r.direction, r.event.type, r.packet) for r in back] == [(r.direction, r.event.type, r.packet) for r in sniffed]
    differ = [(a.event.name, a.event.raw, b.event.raw) for a, b in zip(sniffed, back, strict=True) if a.event.raw != b.event.raw]  # type: ignore[union-attr]
    if keep:
        assert differ == []
    else:
        assert [d[0] for d in differ] == ["SASL_AUTH", "SASL_STEP"]
        assert differ[0][2] == differ[0][1].replace(password.encode(), b"*" * len(password))
        assert differ[1][2] == differ[1][1].replace(proof, b"*" * len(proof))
    assert [(r.number, dissect(r.event, r.context).problems) for r in back if dissect(r.event, r.context).problems] == []  # type: ignore[arg-type]
    if TSHARK is not None:  # tshark reads it, PDU for PDU (keys aside: it shows collection-prefixed keys empty)
        pdus = tshark_frames(pcap, ports=[port])
        mine = sorted((r for r in back if r.event.type == "frame"), key=lambda r: (r.packet, r.event.offset))  # type: ignore[union-attr]
        assert [
            (int(str(p["frame.number"])), int(str(p["couchbase.opcode"]), 16), int(str(p["couchbase.total_bodylength"]))) for p in pdus
        ] == [
            (r.packet, r.event.opcode, r.event.body_length)  # type: ignore[union-attr]
            for r in mine
        ]


def test_masker_sasl_request_from_the_server_side_is_masked() -> None:
    """A SASL request in the server-to-client direction (reflected by an upstream) is masked like a client's."""
    w = _Wire()
    _start(w)
    w.send(_raw(ISN + 1, NOOP))
    w.send(_raw(5001, AUTH[:30], c2s=False))
    w.send(_raw(5001 + 30, AUTH[30:], c2s=False))
    w.send(_raw(5001 + len(AUTH), flags=0x04, c2s=False))  # RST: both directions end
    assert not w.masker.flows
    w.masker.close()
    assert b"hunter" not in b"".join(w.out.packets) and b"cret" not in b"".join(w.out.packets)
    assert w.payloads() == NOOP + MASKED
    assert all(_tcp_ok(p) for p in w.out.packets)


def test_masker_cram_md5_masked_whole() -> None:
    w = _Wire()
    _start(w)
    cram = encode("SASL_AUTH", key="CRAM-MD5", value=b"bob 0123456789abcdef0123456789abcdef", opaque=1)
    w.send(_raw(ISN + 1, cram))
    w.masker.close()
    assert w.payloads() == cram[:24] + b"CRAM-MD5" + b"*" * (len(cram) - 32)


class _Pkt:
    """What scapy hands the sniffer: the packet's bytes and its capture time."""

    def __init__(self, raw: bytes, when: float) -> None:
        self.raw, self.time, self.wirelen = raw, when, len(raw)

    def __bytes__(self) -> bytes:
        return self.raw


def test_a_connection_that_vanished_without_fin_is_expired_by_capture_time() -> None:
    """A long sniff forgets a connection silent for ``idle_timeout`` (its FIN/RST was missed) and emits what it held."""
    from dcpinspect.live.sniff import Sniffer

    got: list[Record] = []
    sn = Sniffer(ports=(11210,), on_record=got.append, idle_timeout=60)
    sn.linktype = 1  # Ethernet, as start() would read from the socket
    half = encode("DCP_NOOP", opaque=7)[:10]  # a frame that never completes
    sn._packet(_Pkt(_raw(ISN, flags=0x02), 1000.0))
    sn._packet(_Pkt(_raw(ISN + 1, half), 1000.5))
    assert got == [] and len(sn.recorder.reassembler._live) == 1
    other = _raw(1, flags=0x02)
    later = other[:34] + struct.pack(">H", 40001) + other[36:]  # another client port: a new connection
    sn._packet(_Pkt(later, 1000.5 + 61))
    assert [r.event.type for r in got] == ["truncated"]  # the first connection's held bytes, reported
    assert [c.closed for c in sn.recorder.reassembler.connections][:1] == [True]
    assert all(40000 not in (a[1], b[1]) for a, b in sn.recorder.reassembler._live)  # only the new connection is live


def test_a_packet_the_kernel_dropped_holds_records_back_for_hole_timeout_only() -> None:
    """A hole (a lost packet) makes later records wait for their place; the sniffer gives it up after ``hole_timeout``."""
    from dcpinspect.live.sniff import Sniffer
    from dcpinspect.wire.events import Gap

    got: list[Record] = []
    sn = Sniffer(ports=(11210,), on_record=got.append, hole_timeout=2)
    sn.linktype = 1
    a, b = encode("NOOP", opaque=1), encode("NOOP", opaque=2)
    sn._packet(_Pkt(_raw(ISN, flags=0x02), 1000.0))
    sn._packet(_Pkt(_raw(ISN + 1, a), 1000.1))
    sn._packet(_Pkt(_raw(ISN + 1 + len(a) + len(b), a), 1000.2))  # b never captured: a hole
    other = _raw(1, flags=0x02)
    sn._packet(_Pkt(other[:34] + struct.pack(">H", 40001) + other[36:], 1000.3))  # another connection opens
    frame = _raw(2, b)
    sn._packet(_Pkt(frame[:34] + struct.pack(">H", 40001) + frame[36:], 1000.4))  # ... and completes a frame
    assert [r.event.opaque for r in got] == [1]  # that frame waits for its place behind the hole
    sn._packet(_Pkt(_raw(ISN + 1 + 2 * len(a) + len(b), b""), 1003.0))  # capture time goes on past the hole timeout
    assert [type(r.event).__name__ for r in got] == ["Frame", "Gap", "Frame", "Frame"]
    assert [r.conn for r in got] == [1, 1, 1, 2]  # in their places: the gap and the frame behind it first
    assert [r.number for r in got] == [1, 2, 3, 4]
    assert isinstance(got[1].event, Gap) and got[1].event.length == len(b)
