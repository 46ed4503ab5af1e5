"""Live capture from a network interface: raw packets -> records (and, optionally, a pcap).

Packets come from scapy's :class:`~scapy.sendrecv.AsyncSniffer` on a Linux
``PF_PACKET`` listen socket whose ``recv`` returns the raw bytes only (no
per-packet dissection with scapy layers), filtered in the kernel by a BPF
``tcp port N`` where it compiles.  Each packet goes through
:func:`~dcpinspect.packets.parse_packet` into one
:class:`~dcpinspect.records.Recorder` - the same reassembly, decoding and
per-connection context as a capture file - and, with ``pcap=``, is written
as it was received.

On loopback the kernel hands a listen socket every packet twice (once going
out, once coming in); like libpcap, the outgoing copy is dropped there.

Needs root or ``CAP_NET_RAW``: without, :class:`SniffPermissionError`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO, TextIO

from .packets import parse_packet
from .records import CaptureStats, Record, Recorder

__all__ = ["SniffPermissionError", "Sniffer", "command"]

_PACKET_OUTGOING = 4
_SO_RCVBUFFORCE = 33
#: the kernel receive buffer asked for (packets beyond it are dropped by the kernel, and show as gaps)
RCVBUF = 64 * 1024 * 1024
#: bytes read per packet: above loopback's 64 KiB GSO segments, so nothing is cut
SNAPLEN = 262_144


class SniffPermissionError(PermissionError):
    """Opening a packet socket needs root or CAP_NET_RAW."""


def _linktype(sock: Any) -> int:
    """The pcap link type of a packet socket, from its ARPHRD hardware type."""
    from scapy.config import conf

    hatype = sock.ins.getsockname()[3]
    if hatype in (1, 772):  # Ethernet; loopback (frames carry a zeroed Ethernet header)
        return 1
    if hatype in (65534, 65535):  # ARPHRD_NONE (tun), ARPHRD_VOID: raw IP
        return 101
    num = conf.l2types.layer2num.get(sock.LL)
    return int(num) if num is not None else 1


def _raw_socket(iface: str, bpf: str | None) -> Any:
    """A scapy L2 listen socket on ``iface`` whose ``recv`` yields raw packets (outgoing loopback copies dropped)."""
    from scapy.arch.linux import L2ListenSocket
    from scapy.config import conf

    class RawListen(L2ListenSocket):
        loopback = iface == "lo" or iface.startswith("lo:")

        def recv(self, x: int = SNAPLEN, **kw: Any) -> Any:
            pkt, sa_ll, ts = self._recv_raw(self.ins, SNAPLEN)
            if not pkt or (self.loopback and sa_ll[2] == _PACKET_OUTGOING):
                return None
            p = conf.raw_layer(load=pkt)  # a holder for the bytes: nothing dissected
            p.time = ts if ts is not None else time.time()
            p.wirelen = len(pkt)
            return p

    quiet = logging.getLogger("scapy.runtime")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # scapy warns it cannot guess a layer for lo: the raw bytes are all we take
    try:
        sock = RawListen(iface=iface, filter=None)
    except PermissionError as exc:
        raise SniffPermissionError(f"capturing on {iface} needs root or CAP_NET_RAW ({exc})") from exc
    finally:
        quiet.setLevel(level)
    if bpf is not None:
        _attach_filter(sock.ins, bpf, iface)
    # scapy leaves 64 KiB of receive buffer: one loopback GSO packet; bursts would be dropped by the kernel
    for opt in (_SO_RCVBUFFORCE, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.ins.setsockopt(socket.SOL_SOCKET, opt, RCVBUF)
            break
    return sock


def _attach_filter(sock: socket.socket, bpf: str, iface: str) -> None:
    """Attach ``bpf`` to ``sock``, without libpcap's snap length.

    libpcap compiles ``ret #65535``, which cuts loopback's 65,549-byte frames;
    every accepting return is raised to :data:`SNAPLEN`.  When the filter cannot
    be compiled here, the ports are filtered in Python only.
    """
    try:
        from scapy.arch.common import compile_filter, free_filter
        from scapy.arch.linux import SO_ATTACH_FILTER
        from scapy.libs.structures import sock_fprog

        prog = compile_filter(bpf, iface)
    except Exception:
        return
    try:
        for i in range(prog.bf_len):
            insn = prog.bf_insns[i]
            if insn.code == 0x06 and insn.k:  # BPF_RET | BPF_K, accept
                insn.k = SNAPLEN
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, sock_fprog(prog.bf_len, prog.bf_insns))
    except Exception:
        pass
    finally:
        free_filter(prog)


class _RawPcap:
    """A pcap file of raw link-layer packets (nanosecond timestamps)."""

    def __init__(self, path: str | Path, linktype: int) -> None:
        self._fh: BinaryIO = Path(path).open("wb")  # noqa: SIM115 - closed by close()
        self._fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, SNAPLEN, linktype))

    def write(self, ts_ns: int, data: bytes, wirelen: int) -> None:
        sec, frac = divmod(ts_ns, 1_000_000_000)
        self._fh.write(struct.pack("<IIII", sec, frac, len(data), wirelen) + data)

    def close(self) -> None:
        self._fh.close()


class Sniffer:
    """Sniff ``iface`` for memcached-binary traffic on ``ports``; records as they complete.

    Args:
        iface: interface name (``lo``, ``eth0``).
        ports: server ports to capture (BPF ``tcp port ...``) and decode.
        pcap: also write the raw packets to this pcap file.
        on_record: called (on the sniffer's thread) with every record; without
            it records are kept in :attr:`records`.
        count: stop after this many TCP segments of those ports (0: no limit).
        reveal_secrets: records' contexts show SASL secrets.

    ``start()`` / ``stop()`` (or ``with Sniffer(...) as s:``); ``stop()``
    emits the records still held and closes the pcap.  Raises
    :class:`SniffPermissionError` without root or CAP_NET_RAW.
    """

    def __init__(
        self,
        iface: str = "lo",
        ports: tuple[int, ...] = (11210,),
        *,
        pcap: str | Path | None = None,
        on_record: Callable[[Record], None] | None = None,
        count: int = 0,
        reveal_secrets: bool = False,
        label: str | None = None,
    ) -> None:
        self.iface = iface
        self.ports = frozenset(ports)
        self.pcap = pcap
        self.on_record = on_record
        self.count = count
        self.file = label or (str(pcap) if pcap is not None else f"sniff:{iface}")
        self.stats = CaptureStats()
        self.recorder = Recorder(server_ports=self.ports, detect=False, stats=self.stats, reveal_secrets=reveal_secrets)
        self.records: list[Record] = []
        self.packets = 0  # packets read from the socket
        self.segments = 0  # TCP segments of ``ports`` decoded
        self.skipped: Counter[str] = Counter()
        self.done = threading.Event()  # set when ``count`` segments were seen
        self._lock = threading.Lock()
        self._writer: _RawPcap | None = None
        self._sniffer: Any = None
        self._sock: Any = None
        self._closed = False

    def start(self) -> Sniffer:
        """Open the socket (raises :class:`SniffPermissionError`) and start sniffing in a thread."""
        from scapy.sendrecv import AsyncSniffer

        bpf = " or ".join(f"tcp port {p}" for p in sorted(self.ports)) or None
        self._sock = _raw_socket(self.iface, bpf)
        self.linktype = _linktype(self._sock)
        if self.pcap is not None:
            self._writer = _RawPcap(self.pcap, self.linktype)
        started = threading.Event()
        self._sniffer = AsyncSniffer(opened_socket=self._sock, prn=self._packet, store=False, started_callback=started.set)
        self._sniffer.start()
        started.wait(5)
        return self

    def _packet(self, pkt: Any) -> None:
        data = bytes(pkt)
        ts = int(float(pkt.time) * 1_000_000_000)
        with self._lock:
            if self._closed:
                return
            self.packets += 1
            seg = parse_packet(self.linktype, data, getattr(pkt, "wirelen", len(data)), ts, self.packets, self.file, self.skipped)
            if seg is None or (seg.sport not in self.ports and seg.dport not in self.ports):
                return
            if self._writer is not None:
                self._writer.write(ts, data, getattr(pkt, "wirelen", len(data)))
            self.segments += 1
            self._emit(self.recorder.feed(seg._replace(packet=self.segments)))
            if self.count and self.segments >= self.count:
                self.done.set()

    def _emit(self, records: list[Record]) -> None:
        for r in records:
            if self.on_record is not None:
                self.on_record(r)
            else:
                self.records.append(r)

    def stop(self) -> None:
        """Stop sniffing, emit the records still held, close the pcap."""
        if self._sniffer is not None:
            with contextlib.suppress(Exception):
                self._sniffer.stop(join=True)
            self._sniffer = None
        if self._sock is not None:
            with contextlib.suppress(Exception):
                self._sock.close()
            self._sock = None
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._emit(self.recorder.close())
            if self._writer is not None:
                self._writer.close()

    def __enter__(self) -> Sniffer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dcpinspect sniff", description="Decode memcached-binary/DCP traffic live from an interface.")
    p.add_argument("--iface", default="lo", help="interface (default lo)")
    p.add_argument("--port", type=int, action="append", help="server port (repeatable; default 11210)")
    p.add_argument("--pcap", metavar="OUT", help="also write the raw packets to this pcap")
    p.add_argument("--count", type=int, default=0, help="stop after N TCP segments of those ports")
    p.add_argument("--timeout", type=float, help="stop after S seconds")
    p.add_argument("--json", action="store_true", help="one JSON object per record (the columns of `frames --json`)")
    p.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets")
    return p


def command(argv: list[str], *, out: TextIO) -> int:
    """``dcpinspect sniff --iface lo --port 11210 [--pcap OUT] [--count N] [--timeout S] [--json]``.

    Prints one line per record (as ``dcpinspect proxy`` does) until ``--count``
    segments, ``--timeout`` seconds, SIGINT or SIGTERM.  Without root or
    CAP_NET_RAW: a one-line error, exit 2.
    """
    from .proxy import record_lines

    args = _parser().parse_args(argv)
    ports = tuple(args.port or (11210,))
    pending: list[Record] = []
    lock = threading.Lock()

    def show() -> None:
        with lock:
            batch = pending[:]
            pending.clear()
        if batch:
            for line in record_lines(batch, as_json=args.json):
                out.write(line + "\n")
            out.flush()

    def add(rec: Record) -> None:
        with lock:
            pending.append(rec)

    sniffer = Sniffer(args.iface, ports, pcap=args.pcap, on_record=add, count=args.count, reveal_secrets=args.reveal_secrets)
    try:
        sniffer.start()
    except SniffPermissionError as exc:
        sys.stderr.write(f"dcpinspect sniff: error: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"dcpinspect sniff: error: cannot capture on {args.iface}: {exc}\n")
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.stderr.write(f"dcpinspect sniff: capturing on {args.iface}, tcp port {', '.join(map(str, ports))}\n")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    try:
        while not stop.is_set() and not sniffer.done.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(0.1)
            show()
    finally:
        sniffer.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        with contextlib.suppress(BrokenPipeError):
            show()
    sys.stderr.write(f"dcpinspect sniff: {sniffer.segments} segments, {sniffer.stats.records} records\n")
    return 0
