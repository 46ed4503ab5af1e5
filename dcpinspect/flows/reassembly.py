"""TCP reassembly: segments in, ordered byte runs and explicit gaps out (sans-IO).

Theory of operation
-------------------
:class:`Reassembler` takes :class:`Segment` objects (one per captured TCP
packet, in capture order) and keeps one :class:`Connection` per TCP
connection: two directions, each a :class:`HalfStream` that turns sequence
numbers into an ordered byte stream and feeds a :class:`FrameDecoder`.

Rules this module keeps:

1. Missing bytes are never zero-filled.  Bytes not captured - a segment lost
   or not yet arrived, the tail of a packet the snaplen cut - are a hole that
   a later segment (a retransmission) may fill.  A hole is given up only when
   nothing can fill it any more: the out-of-order buffer is over its bound,
   both ends sent FIN, a RST, a SYN reusing the tuple, the end of the capture
   (or :meth:`Reassembler.expire`).  Then it reaches the decoder as
   ``feed_gap(n)`` (dated by the cut packet when a snaplen cut made it); the
   decoder resynchronises after it.  Each direction counts the bytes it lost:
   exactly those that no captured segment carried.
2. Sequence numbers are extended to 64 bits so they wrap correctly; a
   retransmission is dropped, an overlap is compared with the bytes already
   seen (kept for a bounded window) and a difference is reported.
3. Port reuse is a new connection: a SYN for a closed (or FIN/RST) tuple, or
   one with a different initial sequence number.
4. Roles: the SYN's sender is the client; else the endpoint on a known server
   port is the server; else whoever sends HELLO/SASL/DCP_OPEN first is the
   client.  Direction is not role: a DCP producer (server) sends requests.
5. Each decoded event carries the timestamp and packet number of the packet
   its first byte arrived in and of the packet that completed it.  Every
   batch of events also carries its place in the capture's order, ``(k1,
   k2)``: ``k1`` the position (:attr:`Segment.pos`) of the packet that
   completed it - after a hole given up, the latest packet behind the hole,
   not the one that gave it up; at the end of the capture
   :data:`CLOSE_BASE` plus the position its connection became known at -
   and ``k2`` its order among the events of that ``k1``.  A hole is given
   up at the latest :data:`~.halfstream.MAX_HOLE_WAIT` packets after the
   oldest segment held behind it (:meth:`Reassembler.give_up`, checked at
   every segment), so events wait a bounded time for their place:
   :meth:`Reassembler.watermark` says below which ``k1`` nothing more can
   come, and :class:`~.records.Recorder` numbers events in ``(k1, k2)``
   order up to it.  The placing depends only on a connection's own
   segments and their positions, so a reader of part of a capture (a Spark
   task) places every event as a reader of all of it does.
6. No I/O and no clock: timestamps are whatever the source put in segments.
7. Bounded cost: a segment costs O(log n) in the n out-of-order segments held
   (a heap of their sequence numbers), and each direction holds at most
   ``MAX_PENDING`` bytes and ``MAX_PENDING_SEGMENTS`` segments (far fewer,
   ``MAX_CUT_PENDING*``, behind a hole the snaplen cut).  A closed
   connection leaves every per-connection map (a bounded number of recently
   closed ones stay findable by their 4-tuple); with ``keep_closed`` even the
   list of connections is bounded, with counters of those dropped from it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import NamedTuple

from ..protocol.enums import Magic
from ..protocol.session import SESSION_START_OPS
from ..wire.decoder import DEFAULT_MAX_BODY, plausible_header
from ..wire.events import Event
from .halfstream import MAX_HOLE_WAIT, RECENT, Emitted, HalfStream

__all__ = [
    "CLOSE_BASE",
    "DEFAULT_SERVER_PORTS",
    "TLS_PORTS",
    "TS_MAX",
    "TS_UNKNOWN",
    "Batch",
    "Connection",
    "FlowEvent",
    "HalfStream",
    "Reassembler",
    "Segment",
    "expand",
    "plausible_start",
    "tls_record",
]

#: a segment's time when its packet's timestamp was out of range: int64's minimum (numpy's NaT), a null ``ts`` in every table
TS_UNKNOWN = -(2**63)
#: the latest packet time a ``timestamp[ns]`` column holds (int64 ns: 2262-04-11T23:47:16.854775807)
TS_MAX = 2**63 - 1
#: the ``k1`` of events emitted at the end of the capture: ``CLOSE_BASE`` + the position their connection became known at
CLOSE_BASE = 1 << 61
_NOTHING_HELD = 1 << 63  # the watermark when no hole is open: every k1 is below it
DEFAULT_SERVER_PORTS = frozenset((11210, 11209, 11211))
TLS_PORTS = frozenset((11207,))
FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10
MAX_RECENTLY_CLOSED = 1024  # closed connections still found by their 4-tuple (late retransmissions, ACKs)
MAX_IGNORED = 65536  # 4-tuples of other traffic remembered (a SYN, FIN both ways or a RST forgets one sooner)
_CLIENT_REQUEST = int(Magic.CLIENT_REQUEST)


class Segment(NamedTuple):
    """One captured TCP segment.

    ``missing`` is the number of payload bytes the capture did not keep
    (snaplen): they follow ``payload`` in sequence space.  ``ts`` is in
    nanoseconds; ``packet`` the packet's 1-based number in its file;
    ``pos`` its 1-based number in the capture as a whole (the files read as
    one: the packets of the files before it plus ``packet``), or 0 to let
    the reassembler count the segments it is fed (a live source).
    """

    ts: int
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    flags: int
    payload: bytes = b""
    missing: int = 0
    packet: int = 0
    file: str = ""
    pos: int = 0


class FlowEvent(NamedTuple):
    """A decoder event with where and when it happened."""

    conn: Connection
    direction: str  # "c2s" or "s2c" (client-to-server, server-to-client)
    event: Event
    ts_first: int
    ts_last: int
    packet_first: int
    packet_last: int
    file: str = ""  # the capture file of the packet that completed it


#: a connection's 4-tuple, the lower endpoint first
Key = tuple[tuple[str, int], tuple[str, int]]


@dataclass(eq=False)
class Connection:
    """One TCP connection (a new one for every reuse of the same 4-tuple)."""

    id: int
    client: tuple[str, int]
    server: tuple[str, int]
    file: str = ""
    syn_seen: bool = False
    role_source: str = ""  # "syn", "port", "session", "guess"
    tls: bool = False
    closed: bool = False
    decided: bool = True  # known to be memcached binary (or TLS); False until the first payload says
    sniffed: bool = False  # its first payload was looked at for a TLS record
    ignored: bool = False  # not memcached binary: its segments are counted and skipped
    isn: dict[str, int] = field(default_factory=dict)
    halves: dict[str, HalfStream] = field(default_factory=dict)
    first_ts: int = 0
    last_ts: int = 0
    last_file: str = ""  # the capture file of its latest packet (rotated captures)
    packets: int = 0
    known_at: int = 0  # the capture position of the segment that made it known (adopted)
    dropped: bool = False  # closed, and no longer in :attr:`Reassembler.connections` (see ``keep_closed``)
    _retired: bool = field(default=False, repr=False)  # closed and out of the live map

    @property
    def label(self) -> str:
        """``client ip:port -> server ip:port`` (IPv6 addresses in brackets)."""
        return f"{_ep(self.client)} -> {_ep(self.server)}"

    @property
    def lost(self) -> int:
        """Bytes known missing, both directions."""
        return sum(h.lost for h in self.halves.values())


def _ep(ep: tuple[str, int]) -> str:
    host, port = ep
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: what :meth:`Reassembler.feed_raw` returns: decoder events of one direction, completed by the
#: same packet (``ts_last``, ``packet_last``), with the file of that packet; ``heads`` holds
#: ``(ts_first, ts_last, packet_first, packet_last)`` of the first ``len(heads)`` events (those
#: that began in earlier packets); every later event began and ended in that packet.  Then
#: ``k1, k2``: the batch's place in the capture's order (rule 5; its events are ``k2``,
#: ``k2 + 1``, ...).
Batch = tuple[Connection, str, list[Event], int, int, list[tuple[int, int, int, int]], str, int, int]


def expand(batch: Batch) -> Iterator[tuple[Event, int, int, int, int]]:
    """``(event, ts_first, ts_last, packet_first, packet_last)`` of each event of a batch."""
    events, ts, packet, heads = batch[2], batch[3], batch[4], batch[5]
    k = len(heads)
    for i, ev in enumerate(events):
        if i < k:
            h = heads[i]
            yield ev, h[0], h[1], h[2], h[3]
        else:
            yield ev, ts, ts, packet, packet


class Reassembler:
    """Every TCP connection of a capture, reassembled and decoded.

    Memory stays bounded for a long-running source (a proxy, a sniffer): a
    connection that closed (both directions finished by FIN, or a RST, their
    held bytes flushed) leaves the map of live connections for a bounded map
    of recently closed ones (late retransmissions and ACKs still find it; a SYN
    on its 4-tuple opens a new connection); tuples of other traffic are
    forgotten on FIN both ways or RST and are bounded too.  What stays is
    :attr:`connections`: every connection, unless ``keep_closed`` is set.  A
    connection that never closes stays live until :meth:`expire` (or the end).

    Args:
        server_ports: ports that mark the server side (and memcached traffic).
        detect: also decode connections on other ports whose first bytes are
            a plausible memcached-binary header.
        tls_ports: ports whose traffic is TLS (reported, never decoded).
        max_body: passed to each :class:`FrameDecoder`.
        keep_closed: ``None`` (the default) keeps every connection in
            :attr:`connections` (a capture's summary lists them all).  A
            number keeps only that many closed connections there, the most
            recently closed: older ones are dropped (``Connection.dropped``)
            at the start of the next :meth:`feed_raw` - after the caller has
            handled the events of the segment that closed them - their
            counters added to :attr:`dropped`, and :attr:`on_drop` (if set)
            called with each, so that a caller can forget what it keeps per
            connection.  Set it (or the attribute) before feeding.
        compare_window: delivered bytes each direction keeps (up to twice
            this) to compare overlapping retransmissions with; 0 for a stream
            that cannot retransmit, such as what a proxy forwarded.
        hole_wait: packets of the capture a hole is waited for, after the
            oldest segment held behind it (rule 5; default
            :data:`~.halfstream.MAX_HOLE_WAIT`).
        first_id: the id of the first connection (a capture set read after
            others numbers its connections after theirs).
    """

    def __init__(
        self,
        *,
        server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
        detect: bool = True,
        tls_ports: Iterable[int] = TLS_PORTS,
        max_body: int = DEFAULT_MAX_BODY,
        keep_closed: int | None = None,
        compare_window: int = RECENT,
        hole_wait: int | None = None,
        first_id: int = 1,
    ) -> None:
        self.server_ports = frozenset(server_ports)
        self.tls_ports = frozenset(tls_ports)
        self.detect = detect
        self.max_body = max_body
        self.keep_closed = keep_closed
        self.compare_window = compare_window
        self.on_drop: Callable[[Connection], None] | None = None
        self.connections: list[Connection] = []  # in order of id; compacted in place when some are dropped
        self.dropped: Counter[str] = Counter()  # connections dropped from ``connections``, and their packets, bytes, lost, ...
        self.skipped_segments = 0  # TCP segments of connections that are not memcached binary
        self._live: dict[Key, Connection] = {}
        self._recently_closed: dict[Key, Connection] = {}  # oldest first, at most MAX_RECENTLY_CLOSED
        self._ignored: dict[Key, int] = {}  # not memcached binary -> bits of the endpoints that sent FIN; oldest first
        self._closed_kept: deque[Connection] = deque()  # closed connections still in ``connections`` (with keep_closed)
        self._stale = 0  # dropped connections still in ``connections`` (compacted when they are many)
        self._next_id = first_id  # capture sets read one after another number their connections on
        self._last_ts = 0
        self._last_packet = 0
        self._last_file = ""
        self._pos = 0  # the position of the latest segment
        self._holes: list[tuple[int, int, Connection, str, HalfStream]] = []  # (deadline, tiebreak, ...) of directions holding segments
        self._tiebreak = 0
        self.hole_wait = MAX_HOLE_WAIT if hole_wait is None else hole_wait  # packets of the capture a hole is waited for (rule 5)
        self._holes_limit = 64  # the heap is rid of closed directions' entries when it grows past this
        self._k2: dict[int, int] = {}  # k1 -> the next k2 (those that cannot come again are forgotten now and then)
        self._k2_limit = 64

    def _key(self, seg: Segment) -> Key:
        a = (seg.src, seg.sport)
        b = (seg.dst, seg.dport)
        return (a, b) if a <= b else (b, a)

    def feed(self, seg: Segment) -> list[FlowEvent]:
        """Take one segment; return the events it completed."""
        return [FlowEvent(b[0], b[1], *r, b[6]) for b in self.feed_raw(seg) for r in expand(b)]

    def feed_raw(self, seg: Segment) -> list[Batch]:
        """Like :meth:`feed`, in batches (see :data:`Batch`): no object per event beyond the decoder's."""
        if self.keep_closed is not None and len(self._closed_kept) > self.keep_closed:
            self._trim(self.keep_closed)
        self._last_ts = seg.ts
        self._last_packet = seg.packet
        self._last_file = seg.file
        pos = self._pos = seg.pos or self._pos + 1
        out: list[Batch] = self.give_up(pos) if self._holes and self._holes[0][0] <= pos else []
        key = self._key(seg)
        conn = self._live.get(key)
        if conn is None:
            conn = self._recently_closed.get(key)
        src = (seg.src, seg.sport)
        if seg.flags & SYN and conn is not None:
            d = "c2s" if src == conn.client else "s2c"
            isn = conn.isn.get(d)
            if conn.closed or (isn is not None and isn != seg.seq):
                out += self._close(conn, seg.ts, seg.packet, pos, "")
                conn = None
        if conn is None:
            if key in self._ignored and not seg.flags & SYN:
                self.skipped_segments += 1
                self._ignored_flags(key, src, seg.flags)
                return out
            conn = self._open(seg, key)
            if conn is None:
                self.skipped_segments += 1
                self._ignored_flags(key, src, seg.flags)
                return out
        if not conn.decided and (seg.payload or seg.missing):
            self._decide(conn, seg.payload)
        if conn.ignored:
            self.skipped_segments += 1
            self._forget(key, conn)
            self._ignore(key)
            self._ignored_flags(key, src, seg.flags)
            return out
        if not conn.sniffed and seg.payload:  # a TLS handshake on any port (after a SYN, the first segment has none)
            conn.sniffed = True
            conn.tls = conn.tls or tls_record(seg.payload)
        conn.packets += 1
        conn.last_ts = seg.ts
        conn.last_file = seg.file
        d = "c2s" if src == conn.client else "s2c"
        half = conn.halves.get(d)
        if half is None:
            half = conn.halves[d] = HalfStream(
                aligned=bool(seg.flags & SYN) or conn.syn_seen, max_body=self.max_body, window=self.compare_window
            )
        raw_out: list[Emitted] = []
        seq = seg.seq
        if seg.flags & SYN:
            conn.isn[d] = seq
            if half.next_seq is None:
                half.next_seq = half.base = seq + 1 + (1 << 32)
            seq += 1
        if conn.tls:  # encrypted: counted, never decoded
            half.segments += 1
            half.bytes += len(seg.payload)
            if seg.flags & (FIN | RST) and not conn.closed:
                conn.closed = True
                self._retire(key, conn)
            return out
        if seg.payload or seg.missing:
            half.push(half.extend(seq & 0xFFFFFFFF), seg.payload, seg.missing, seg.ts, seg.packet, pos, seg.file, raw_out)
            if half.pending and not half.scheduled:
                self._schedule(conn, d, half)
        if seg.flags & FIN and half.next_seq is not None:
            half.fin_seq = half.extend((seq + len(seg.payload) + seg.missing) & 0xFFFFFFFF)
        if half.fin_seq is not None and half.next_seq is not None and half.fin_seq <= half.next_seq and not half.pending:
            half.finish(seg.ts, seg.packet, pos, seg.file, raw_out)
        if raw_out:
            out += self._placed(conn, d, raw_out)
        if seg.flags & RST:
            out += self._close(conn, seg.ts, seg.packet, pos, seg.file)
        elif (
            half.fin_seq is not None
            and not conn.closed
            and len(conn.halves) == 2
            and all(h.closed or h.fin_seq is not None for h in conn.halves.values())
        ):
            if all(h.closed for h in conn.halves.values()):
                conn.closed = True
                self._retire(key, conn)
            else:  # both ends sent FIN: the bytes still missing will not come (rule 1)
                out += self._close(conn, seg.ts, seg.packet, pos, seg.file)
        return out

    # --- the capture's order (rule 5) -------------------------------------------------
    def _placed(self, conn: Connection, d: str, raw: list[Emitted]) -> list[Batch]:
        """A direction's emitted events as batches, each with its ``(k1, k2)``."""
        k2s = self._k2
        out: list[Batch] = []
        for events, ts, packet, heads, k1, file in raw:
            k2 = k2s.get(k1, 0)
            k2s[k1] = k2 + len(events)
            out.append((conn, d, events, ts, packet, heads, file, k1, k2))
        if len(k2s) > self._k2_limit:
            # a k1 comes again only from a direction still holding segments (>= the watermark) or from this very segment
            low = min(self.watermark(), self._pos)
            self._k2 = {k: v for k, v in k2s.items() if k >= low}
            self._k2_limit = 2 * len(self._k2) + 64
        return out

    def _schedule(self, conn: Connection, d: str, half: HalfStream) -> None:
        oldest = half.oldest()
        if oldest is not None:
            half.scheduled = True
            self._tiebreak += 1
            heappush(self._holes, (oldest + self.hole_wait, self._tiebreak, conn, d, half))

    def give_up(self, pos: int) -> list[Batch]:
        """The capture reached position ``pos``: give up every hole whose oldest held segment is ``MAX_HOLE_WAIT`` packets behind.

        :meth:`feed_raw` does this before each segment; a reader that feeds
        only some connections (a columnar decode) calls it to say how far
        the capture has gone.  The result depends only on each direction's
        segments and ``pos``, never on which segment triggered it.
        """
        holes = self._holes
        out: list[Batch] = []
        while holes and holes[0][0] <= pos:
            _dl, _t, conn, d, half = heappop(holes)
            half.scheduled = False
            if half.closed or not half.pending:
                continue
            raw: list[Emitted] = []
            half.give_up(pos - self.hole_wait, raw)
            if raw:
                out += self._placed(conn, d, raw)
            if half.pending:
                self._schedule(conn, d, half)
        return out

    def give_up_older(self, ts_before: int) -> list[Batch]:
        """Give up every hole behind which a segment captured before ``ts_before`` (ns) is held.

        For a live source, whose packets may come slowly: there a hole
        (a packet the capture dropped) should not hold every other
        connection's records back for :attr:`hole_wait` packets.  Unlike
        :meth:`give_up` it depends on when it is called, so a capture file
        read later may place those rows a little differently.
        """
        out: list[Batch] = []
        for _dl, _t, conn, d, half in list(self._holes):
            if half.closed or not half.pending:
                continue
            raw: list[Emitted] = []
            half.give_up_older(ts_before, raw)
            if raw:
                out += self._placed(conn, d, raw)
        return out

    def watermark(self) -> int:
        """No event emitted from now on has a ``k1`` below this: the oldest position held behind a hole (a huge number if none)."""
        holes = self._holes
        while holes:
            dl, _t, conn, d, half = holes[0]
            oldest = None if half.closed else half.oldest()
            if oldest is not None and oldest + self.hole_wait == dl:
                return oldest
            heappop(holes)
            half.scheduled = False
            if oldest is not None:
                self._schedule(conn, d, half)
        return _NOTHING_HELD

    def _open(self, seg: Segment, key: Key) -> Connection | None:
        src, dst = (seg.src, seg.sport), (seg.dst, seg.dport)
        if seg.flags & SYN and not seg.flags & ACK:
            client, server, how = src, dst, "syn"
        elif seg.flags & SYN:  # SYN-ACK: the sender is the server
            client, server, how = dst, src, "syn"
        elif seg.dport in self.server_ports or seg.dport in self.tls_ports:
            client, server, how = src, dst, "port"
        elif seg.sport in self.server_ports or seg.sport in self.tls_ports:
            client, server, how = dst, src, "port"
        elif seg.payload[1:2] and seg.payload[0] == _CLIENT_REQUEST and seg.payload[1] in SESSION_START_OPS:
            client, server, how = src, dst, "session"
        else:
            client, server = (src, dst) if seg.sport > seg.dport else (dst, src)
            how = "guess"
        known = server[1] in self.server_ports or server[1] in self.tls_ports
        tls = server[1] in self.tls_ports  # the server's port: a client's ephemeral port may be anything
        if not known and not seg.flags & SYN and not (self.detect and plausible_start(seg.payload)):
            self._ignore(key)
            return None
        conn = Connection(0, client, server, file=seg.file, syn_seen=bool(seg.flags & SYN), role_source=how, tls=tls, first_ts=seg.ts)
        conn.decided = known or not seg.flags & SYN  # a SYN on another port: wait for its first bytes
        if conn.decided:
            self._adopt(conn)
        self._live[key] = conn
        self._recently_closed.pop(key, None)
        self._ignored.pop(key, None)
        return conn

    def _adopt(self, conn: Connection) -> None:
        conn.decided = True
        conn.known_at = self._pos
        conn.id = self._next_id
        self._next_id += 1
        self.connections.append(conn)
        if conn.closed and self.keep_closed is not None:  # closed before its first bytes said what it is
            self._closed_kept.append(conn)

    def _decide(self, conn: Connection, payload: bytes) -> None:
        """First bytes of a connection on an unknown port: memcached binary, TLS, or not ours."""
        if self.detect and plausible_start(payload):
            conn.tls = tls_record(payload)
            self._adopt(conn)
        else:
            conn.decided = True
            conn.ignored = True

    def _ignore(self, key: Key) -> None:
        """Remember a 4-tuple of other traffic (the oldest one is forgotten beyond MAX_IGNORED)."""
        if key not in self._ignored:
            self._ignored[key] = 0
            if len(self._ignored) > MAX_IGNORED:
                del self._ignored[next(iter(self._ignored))]

    def _ignored_flags(self, key: Key, src: tuple[str, int], flags: int) -> None:
        """Forget the tuple of other traffic once it was reset or both ends sent FIN."""
        bits = self._ignored.get(key)
        if bits is None or not flags & (FIN | RST):
            return
        bits |= 3 if flags & RST else 1 if src == key[0] else 2
        if bits == 3:
            del self._ignored[key]
        else:
            self._ignored[key] = bits

    def _forget(self, key: Key, conn: Connection) -> None:
        """Take ``conn`` out of the maps of live and recently closed connections."""
        if self._live.get(key) is conn:
            del self._live[key]
        if self._recently_closed.get(key) is conn:
            del self._recently_closed[key]

    def _retire(self, key: Key, conn: Connection) -> None:
        """``conn`` just closed: from the live map to the bounded map of recently closed ones."""
        if conn._retired:
            return
        conn._retired = True
        if self._live.get(key) is conn:
            del self._live[key]
            recent = self._recently_closed
            recent.pop(key, None)
            recent[key] = conn
            if len(recent) > MAX_RECENTLY_CLOSED:
                del recent[next(iter(recent))]
        if conn.decided and not conn.ignored and self.keep_closed is not None:
            self._closed_kept.append(conn)

    def _trim(self, keep: int) -> None:
        """Drop the oldest closed connections from :attr:`connections` until ``keep`` are left."""
        kept = self._closed_kept
        while len(kept) > keep:
            conn = kept.popleft()
            conn.dropped = True
            d = self.dropped
            d["connections"] += 1
            d["packets"] += conn.packets
            for h in conn.halves.values():
                d["bytes"] += h.bytes
                d["lost"] += h.lost
                d["conflicts"] += h.conflicts
                d["after_close"] += h.after_close
            self._stale += 1
            if self.on_drop is not None:
                self.on_drop(conn)
        if self._stale > 64 and self._stale * 2 > len(self.connections):
            self.connections[:] = [c for c in self.connections if not c.dropped]  # in place: others hold this list
            self._stale = 0

    def _close(self, conn: Connection, ts: int, packet: int, pos: int, file: str) -> list[Batch]:
        """End both directions at position ``pos`` (in ``file``; "" for the file the connection was last seen in)."""
        out: list[Batch] = []
        file = file or conn.last_file or self._last_file
        for d, half in conn.halves.items() if not conn.tls else ():
            raw: list[Emitted] = []
            half.finish(ts, packet, pos, file, raw)
            if raw:
                out += self._placed(conn, d, raw)
        conn.closed = True
        self._retire(_conn_key(conn), conn)
        if len(self._holes) > self._holes_limit:
            live = [e for e in self._holes if not e[4].closed and e[4].pending]
            for e in self._holes:
                if e[4].closed or not e[4].pending:
                    e[4].scheduled = False
            heapify(live)
            self._holes = live
            self._holes_limit = 2 * len(live) + 64
        return out

    def expire(self, idle_before: int) -> list[Batch]:
        """Close the connections whose latest packet is older than ``idle_before`` (ns, capture time).

        For a long-running source: a connection that vanished without FIN or
        RST (or whose FIN the capture lost) is otherwise live until the end.
        Its directions are finished as at the end of a capture (their holes
        given up) and its events returned, in batches (see :meth:`feed_raw`).
        O(live connections): call it now and then, not per segment.
        """
        out: list[Batch] = []
        for conn in [c for c in self._live.values() if c.last_ts < idle_before and not c.closed]:
            out += self._close(conn, self._last_ts, self._last_packet, self._pos, "")
        return out

    def close(self) -> list[FlowEvent]:
        """End of capture: finish every direction still open."""
        return [FlowEvent(b[0], b[1], *r, b[6]) for b in self.close_raw() for r in expand(b)]

    def close_raw(self) -> list[Batch]:
        """Like :meth:`close`, in batches (see :meth:`feed_raw`)."""
        out: list[Batch] = []
        for conn in [c for c in self.connections if not c.closed]:
            out += self._close(conn, self._last_ts, self._last_packet, CLOSE_BASE + conn.known_at, "")
        return out

    def run(self, segments: Iterable[Segment]) -> Iterator[FlowEvent]:
        """Feed all ``segments`` and close; yield events as they complete."""
        for seg in segments:
            yield from self.feed(seg)
        yield from self.close()


def _conn_key(conn: Connection) -> Key:
    a, b = conn.client, conn.server
    return (a, b) if a <= b else (b, a)


def plausible_start(payload: bytes) -> bool:
    """Whether these first bytes look like a memcached-binary header (or a TLS record)."""
    if payload[:2] == b"\x16\x03":
        return True
    if len(payload) < 24:
        return False
    return plausible_header(payload)


def tls_record(payload: bytes) -> bool:
    """Whether bytes start a TLS handshake record (content type 22, version 3.x); no memcached magic starts so."""
    return len(payload) >= 3 and payload[0] == 0x16 and payload[1] == 3 and payload[2] <= 4
