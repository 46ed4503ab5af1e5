"""Live capture from a network interface: raw packets -> records (and, optionally, a pcap).

Packets come from scapy's :class:`~scapy.sendrecv.AsyncSniffer` on a Linux
``PF_PACKET`` listen socket whose ``recv`` returns the raw bytes only (no
per-packet dissection with scapy layers), filtered in the kernel by a BPF
``tcp port N`` where it compiles.  Each packet goes through
:func:`~dcpinspect.capture.packets.parse_packet` into one
:class:`~dcpinspect.flows.records.Recorder` - the same reassembly, decoding and
per-connection context as a capture file - and, with ``pcap=``, is written
as it was received, except that SASL secrets (PLAIN passwords, SCRAM proofs,
every SASL payload not known to be safe) are overwritten with ``*`` in both
directions unless ``keep_secrets=True`` (see :class:`_PcapMasker`).  A closed
connection leaves only a bounded summary behind (the recorder keeps the last
:data:`~dcpinspect.live.tap.KEEP_CLOSED` closed connections; their session state
is forgotten).

On loopback the kernel hands a listen socket every packet twice (once going
out, once coming in); like libpcap, the outgoing copy is dropped there.

Needs root or ``CAP_NET_RAW``: without, :class:`SniffPermissionError`.  An
interface that does not exist, or a capture filter (``capture_filter``, BPF as
in ``tcpdump``/``tshark -f``) that does not compile, is a :class:`SniffError`
with a one-line message, before anything is opened.  The default capture
filter is ``tcp port P`` for each server port (``or``-ed); whatever the filter
lets through, only TCP segments of the server ports are decoded.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..capture.packets import locate_segment
from ..capture.pcapwrite import RawPcapWriter, sum16
from ..flows.reassembly import FIN, RST, SYN, Segment
from ..flows.records import CaptureStats, Record, Recorder
from .tap import KEEP_CLOSED, SecretMasker, StatePruner

__all__ = ["HOLE_TIMEOUT", "IDLE_TIMEOUT", "SniffError", "SniffPermissionError", "Sniffer", "default_filter", "interfaces"]

_PACKET_OUTGOING = 4
_SO_RCVBUFFORCE = 33
#: the kernel receive buffer asked for (packets beyond it are dropped by the kernel, and show as gaps)
RCVBUF = 64 * 1024 * 1024
#: bytes read per packet: above loopback's 64 KiB GSO segments, so nothing is cut
SNAPLEN = 262_144
#: a segment further than this from the next expected byte of its flow cannot be placed: masked whole
PLACE_WINDOW = 64 * 1024 * 1024
#: payload bytes of segments that arrived ahead of a hole, held per flow before the hole is declared lost
AHEAD_LIMIT = 4 * 1024 * 1024
#: packets held for masking, in bytes, before the oldest holder gives up (its possible secrets masked)
QUEUE_LIMIT = 16 * 1024 * 1024
#: capture time a packet may be held for masking before its flow gives up
HOLD_NS = 2_000_000_000
#: flows (one direction of a connection) tracked for masking (the oldest gives up beyond)
MAX_FLOWS = 10_000
IDLE_TIMEOUT = 600.0  # seconds of silence after which a connection is taken as gone (its FIN/RST not seen)
#: seconds of capture time a hole (a packet the kernel dropped) is waited for: meanwhile every connection's records wait
HOLE_TIMEOUT = 5.0
EXPIRY_CHECK = 10_000_000_000  # ns of capture time between looks for such connections


class SniffPermissionError(PermissionError):
    """Opening a packet socket needs root or CAP_NET_RAW."""


class SniffError(Exception):
    """A sniff that cannot start: no such interface, a capture filter that does not compile (a one-line reason)."""


def interfaces() -> list[str]:
    """The names of this host's network interfaces (``[]`` where they cannot be listed)."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def default_filter(ports: Iterable[int]) -> str | None:
    """The capture filter for the server ports: ``tcp port 11210 or tcp port 11211`` (``None`` without ports)."""
    return " or ".join(f"tcp port {p}" for p in sorted(set(ports))) or None


def _check_interface(iface: str) -> None:
    names = interfaces()
    if names and iface not in names and iface.split(":", 1)[0] not in names:
        raise SniffError(f"no such interface: {iface!r} (this host has {', '.join(names)})")


def check_filter(bpf: str, iface: str) -> None:
    """Raise :class:`SniffError` if ``bpf`` does not compile (libpcap's message, one line); silent where libpcap is missing."""
    try:
        from scapy.arch.common import compile_filter, free_filter
    except Exception:  # pragma: no cover - no libpcap: the kernel filter is skipped, the ports filtered in Python
        return
    try:
        prog = compile_filter(bpf, iface)
    except (ImportError, OSError):  # no libpcap, or it wanted the interface open (no privileges: said when it is opened)
        return
    except Exception as exc:
        text = " ".join(str(exc).split())
        inner = re.search(r"\((.+)\)$", text)  # scapy: "Failed to compile filter expression '...' (libpcap's reason)"
        raise SniffError(f"bad capture filter {bpf!r}: {inner.group(1) if inner else text}") from None
    free_filter(prog)


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
    except ValueError as exc:  # scapy: "Interface '...' not found !"
        raise SniffError(f"cannot capture on {iface!r}: {' '.join(str(exc).split())}") from None
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


def patch_payload(data: bytearray, tcp: int, start: int, payload: bytes) -> None:
    """Overwrite the TCP payload at ``data[start:]`` with ``payload`` (same length) and update the TCP checksum.

    The checksum is updated incrementally (RFC 1624) over the 16-bit words that
    changed (aligned on the TCP header at ``tcp``): a packet whose checksum was
    valid stays valid, for tshark and any other reader.  A packet captured
    with its checksum not yet computed (checksum offload: outgoing and
    loopback packets carry a partial sum) was unverifiable and stays so;
    tshark does not check TCP checksums by default.
    """
    end = start + len(payload)
    if bytes(data[start:end]) == payload:
        return
    lo = tcp + ((start - tcp) & ~1)
    hi = min(end + ((end - tcp) & 1), len(data))
    old = sum16(bytes(data[lo:hi]))
    data[start:end] = payload
    new = sum16(bytes(data[lo:hi]))
    csum = struct.unpack_from(">H", data, tcp + 16)[0]
    acc = (~csum & 0xFFFF) + (~old & 0xFFFF) + new
    while acc >> 16:
        acc = (acc & 0xFFFF) + (acc >> 16)
    struct.pack_into(">H", data, tcp + 16, ~acc & 0xFFFF)


class _Out:
    """A packet waiting to be written (``ready`` once its payload is masked)."""

    __slots__ = ("data", "flow", "ready", "start", "tcp", "ts", "wirelen")

    def __init__(self, ts: int, data: bytes, wirelen: int, tcp: int, start: int) -> None:
        self.ts = ts
        self.data = bytearray(data)
        self.wirelen = wirelen
        self.tcp = tcp
        self.start = start
        self.ready = False
        self.flow: _Flow | None = None


class _Flow:
    """One direction of a connection: stream offset 0 is sequence number ``base``."""

    def __init__(self, base: int, *, aligned: bool) -> None:
        self.base = base & 0xFFFFFFFF
        self.masker: SecretMasker[_Out] = SecretMasker(aligned=aligned)
        self.ahead: list[tuple[int, _Out, bytes]] = []  # segments past a hole: (stream offset, packet, payload)
        self.ahead_bytes = 0


class _PcapMasker:
    """The sniffer's pcap writer with SASL secrets masked: packets are written in capture order.

    Payloads of both directions (a SASL request may come from the server
    side too, reflected by a proxy or a broken peer) go, per flow, through the :class:`~dcpinspect.live.tap.SecretMasker` the proxy
    and client captures use, placed by sequence number: stream offset 0 is
    the byte after the SYN (or, for a connection already open when the
    capture started, the first payload byte seen - the stream is then blind,
    masked, until a frame boundary is found).  Secret bytes are overwritten
    in the raw packet in place (same length) and the TCP checksum updated.

    Segments that are not the next expected byte never leak a secret:

    * a retransmission (or an overlap) is masked with the secret spans
      already known for those bytes, and held back with the SASL request
      when it reaches into one that is not complete yet;
    * a segment past a hole is held until the hole fills; when it does not
      (:data:`AHEAD_LIMIT` bytes held, the flow ends, or the wait is too
      long) the hole is declared lost: an unfinished SASL request is masked
      (header kept), and what follows the hole is masked until the decoder
      finds a frame boundary again;
    * a segment that cannot be placed (further than :data:`PLACE_WINDOW`
      from the next expected byte, or before the stream's start) has its
      whole payload masked.

    Only packets of an unfinished SASL request (or of a hole) are held, and
    everything behind them in the file waits, so the file keeps the capture
    order.  Memory and delay are bounded: beyond :data:`QUEUE_LIMIT` bytes
    held or :data:`HOLD_NS` of capture time the oldest holder gives up (its
    possible secrets masked, now and when the rest of the frame arrives).
    """

    def __init__(self, writer: RawPcapWriter, ports: frozenset[int]) -> None:
        self.writer = writer
        self.ports = ports
        self.queue: deque[_Out] = deque()
        self.queued = 0
        self.flows: dict[tuple[str, int, str, int], _Flow] = {}

    def write(self, seg: Segment, ts: int, data: bytes, wirelen: int, tcp: int, start: int) -> None:
        out = _Out(ts, data, wirelen, tcp, start)
        self.queue.append(out)
        self.queued += len(data)
        if seg.dport in self.ports or seg.sport in self.ports:
            self._flow(seg, out)
        else:
            out.ready = True  # not a flow of the server ports: not decoded, not masked
        self._drain(ts)

    def close(self) -> None:
        for key in list(self.flows):
            self._finish(key)
        self._drain(None, force=True)
        self.writer.close()

    def _flow(self, seg: Segment, out: _Out) -> None:
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        flow = self.flows.get(key)
        syn = 1 if seg.flags & SYN else 0
        if syn and (flow is None or flow.base != (seg.seq + 1) & 0xFFFFFFFF):  # a new connection (not a SYN retransmitted)
            if flow is not None:
                self._finish(key)
            flow = self.flows[key] = _Flow(seg.seq + 1, aligned=True)
        elif flow is None and seg.payload:  # joined mid-connection
            flow = self.flows[key] = _Flow(seg.seq, aligned=False)
        if flow is None or not seg.payload:
            out.ready = True
        else:
            self._place(flow, out, seg.seq + syn, seg.payload, seg.missing)
        if flow is not None and seg.flags & (FIN | RST):
            self._finish(key)
        if seg.flags & RST and (seg.dst, seg.dport, seg.src, seg.sport) in self.flows:  # a reset ends both directions
            self._finish((seg.dst, seg.dport, seg.src, seg.sport))
        if len(self.flows) > MAX_FLOWS:
            self._finish(next(iter(self.flows)))

    def _place(self, flow: _Flow, out: _Out, seq: int, payload: bytes, missing: int = 0) -> None:
        m = flow.masker
        rel = ((seq - flow.base - m.offset + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)  # from the next expected byte
        at = m.offset + rel
        if at < 0 or abs(rel) > PLACE_WINDOW:
            self._released([(out, b"*" * len(payload))])
            return
        out.flow = flow
        if rel > 0:
            flow.ahead.append((at, out, payload))
            flow.ahead_bytes += len(payload)
            if flow.ahead_bytes > AHEAD_LIMIT:
                self._skip_hole(flow)
            return
        self._released(m.add(out, payload, at))
        if missing and m.offset == at + len(payload):  # the capture cut this segment (snap length): its tail is lost
            self._released(m.gap(missing))
        self._catch_up(flow)

    def _catch_up(self, flow: _Flow) -> None:
        flow.ahead.sort(key=lambda a: a[0])
        while flow.ahead and flow.ahead[0][0] <= flow.masker.offset:
            at, out, payload = flow.ahead.pop(0)
            flow.ahead_bytes -= len(payload)
            self._released(flow.masker.add(out, payload, at))

    def _skip_hole(self, flow: _Flow) -> None:
        """The bytes up to the first segment held past the hole are lost to this capture."""
        if flow.ahead:
            first = min(a for a, _, _ in flow.ahead)
            self._released(flow.masker.gap(first - flow.masker.offset))
            self._catch_up(flow)

    def _give_up(self, flow: _Flow) -> None:
        while flow.ahead:
            self._skip_hole(flow)
        self._released(flow.masker.give_up())

    def _finish(self, key: tuple[str, int, str, int]) -> None:
        self._give_up(self.flows.pop(key))

    def _released(self, packets: list[tuple[_Out, bytes]]) -> None:
        for out, payload in packets:
            patch_payload(out.data, out.tcp, out.start, payload)
            out.ready = True
            out.flow = None

    def _drain(self, now: int | None, *, force: bool = False) -> None:
        q = self.queue
        while q:
            out = q[0]
            if not out.ready:
                late = now is not None and now - out.ts > HOLD_NS
                if not (force or late or self.queued > QUEUE_LIMIT):
                    return
                if out.flow is not None:
                    self._give_up(out.flow)
                if not out.ready:  # cannot happen (every held packet belongs to a flow): never write it unmasked
                    patch_payload(out.data, out.tcp, out.start, b"*" * (len(out.data) - out.start))
                    out.ready = True
            q.popleft()
            self.queued -= len(out.data)
            self.writer.write(out.ts, bytes(out.data), out.wirelen)


class Sniffer:
    """Sniff ``iface`` for memcached-binary traffic on ``ports``; records as they complete.

    Args:
        iface: interface name (``lo``, ``eth0``).
        ports: server ports to decode (and, without ``capture_filter``, to capture: BPF ``tcp port ...``).
        capture_filter: a BPF capture filter (``tcp port 11210 and host 10.0.0.5``) instead of the ports'.
        pcap: also write the raw packets to this pcap file.
        on_record: called (on the sniffer's thread) with every record; without
            it records are kept in :attr:`records`.
        count: stop after this many TCP segments of those ports (0: no limit).
        reveal_secrets: records' contexts show SASL secrets.
        keep_secrets: write SASL passwords and SCRAM proofs into the pcap as
            captured; by default their bytes are overwritten with ``*`` in the
            file (same length, TCP checksum updated; see :class:`_PcapMasker`).
            The records always hold the bytes as captured.

    ``start()`` / ``stop()`` (or ``with Sniffer(...) as s:``); ``stop()``
    emits the records still held and closes the pcap.  Raises
    :class:`SniffPermissionError` without root or CAP_NET_RAW.
    :meth:`wait_until` blocks until a condition on the sniffer holds (a hook
    for tests: e.g. every connection's FINs handled before ``stop()``).
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
        keep_secrets: bool = False,
        label: str | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        hole_timeout: float = HOLE_TIMEOUT,
        capture_filter: str | None = None,
    ) -> None:
        self.iface = iface
        self.capture_filter = capture_filter
        self.idle_ns = int(idle_timeout * 1e9)  # a connection silent this long (capture time) is closed: its FIN/RST was missed
        self.hole_ns = int(hole_timeout * 1e9)  # a hole waited for this long (capture time) is given up
        self._next_expiry: int | None = None
        self.ports = frozenset(ports)
        self.pcap = pcap
        self.on_record = on_record
        self.count = count
        self.keep_secrets = keep_secrets
        self.file = label or (str(pcap) if pcap is not None else f"sniff:{iface}")
        self.stats = CaptureStats()
        self.recorder = Recorder(server_ports=self.ports, detect=False, stats=self.stats, reveal_secrets=reveal_secrets)
        self.recorder.reassembler.keep_closed = KEEP_CLOSED  # a long-running source: closed connections are summarised
        self._prune = StatePruner(self.stats, self.recorder.reassembler)
        self.records: list[Record] = []
        self.packets = 0  # packets read from the socket
        self.segments = 0  # TCP segments of ``ports`` decoded
        self.skipped: Counter[str] = Counter()
        self.done = threading.Event()  # set when ``count`` segments were seen
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified after each segment of ``ports`` (see wait_until)
        self._waiters = 0
        self._writer: RawPcapWriter | None = None
        self._masker: _PcapMasker | None = None
        self._sniffer: Any = None
        self._sock: Any = None
        self._closed = False

    def start(self) -> Sniffer:
        """Open the socket and start sniffing in a thread.

        Raises :class:`SniffError` (no such interface, a capture filter that does not compile)
        or :class:`SniffPermissionError` (no root or CAP_NET_RAW), before any file is written.
        """
        from scapy.sendrecv import AsyncSniffer

        _check_interface(self.iface)
        bpf = self.filter
        if self.capture_filter is not None:
            check_filter(self.capture_filter, self.iface)
        self._sock = _raw_socket(self.iface, bpf)
        self.linktype = _linktype(self._sock)
        if self.pcap is not None:
            self._writer = RawPcapWriter(self.pcap, self.linktype, snaplen=SNAPLEN)
            if not self.keep_secrets:
                self._masker = _PcapMasker(self._writer, self.ports)
        started = threading.Event()
        self._sniffer = AsyncSniffer(opened_socket=self._sock, prn=self._packet, store=False, started_callback=started.set)
        self._sniffer.start()
        started.wait(5)
        return self

    @property
    def filter(self) -> str | None:
        """The capture filter in use: ``capture_filter``, else the server ports' (:func:`default_filter`)."""
        return self.capture_filter if self.capture_filter is not None else default_filter(self.ports)

    def _packet(self, pkt: Any) -> None:
        data = bytes(pkt)
        ts = int(float(pkt.time) * 1_000_000_000)
        with self._lock:
            if self._closed:
                return
            self.packets += 1
            wirelen = getattr(pkt, "wirelen", len(data))
            found = locate_segment(self.linktype, data, wirelen, ts, self.packets, self.file, self.skipped)
            if found is None:
                return
            seg, tcp, start = found
            if seg.sport not in self.ports and seg.dport not in self.ports:
                return
            if self._masker is not None:
                self._masker.write(seg, ts, data, wirelen, tcp, start)
            elif self._writer is not None:
                self._writer.write(ts, data, wirelen)
            self.segments += 1
            self._emit(self.recorder.feed(seg._replace(packet=self.segments)))
            if seg.flags & (FIN | RST):
                self._prune()
            if self._next_expiry is None or ts >= self._next_expiry:  # now and then, by the packets' own clock
                if self._next_expiry is not None:
                    self._emit(self.recorder.give_up_older(ts - self.hole_ns))
                    self._emit(self.recorder.expire(ts - self.idle_ns))
                    self._prune()
                self._next_expiry = ts + min(self.idle_ns, EXPIRY_CHECK, self.hole_ns)
            if self.count and self.segments >= self.count:
                self.done.set()
            if self._waiters:
                self._changed.notify_all()

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
            if self._masker is not None:
                self._masker.close()
            elif self._writer is not None:
                self._writer.close()
            self._changed.notify_all()

    def wait_until(self, predicate: Callable[[Sniffer], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate(self)`` holds; ``False`` if ``timeout`` passed first.

        A hook for tests and scripts, e.g. wait until the sniffer has handled a
        connection's FINs before stopping it::

            sn.wait_until(lambda s: all(c.closed for c in s.recorder.reassembler.connections), 60)

        The predicate runs under the sniffer's lock: now, after every TCP
        segment of ``ports`` was handled, and when the sniffer stops - woken by
        the packets, never by polling.  Call it from any thread but the
        sniffer's own (never from ``on_record``).
        """
        with self._changed:
            self._waiters += 1
            try:
                return self._changed.wait_for(lambda: predicate(self), timeout)
            finally:
                self._waiters -= 1

    def __enter__(self) -> Sniffer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
