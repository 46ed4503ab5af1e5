"""One direction of a TCP connection: sequence space -> ordered bytes -> the frame decoder.

The reassembler (:mod:`.reassembly`) keeps two of these per connection.  Out
of order segments wait, bounded in bytes, in count and in time (at most
:data:`MAX_HOLE_WAIT` packets of the capture); a hole that cannot be filled
becomes an explicit gap (``FrameDecoder.feed_gap``), never zero bytes;
overlapping retransmissions are compared with what was delivered and a
conflict is counted, not silently merged.

Where rows go in the capture's order: every segment carries its position in
the capture (``pos``, the packet's number in the capture as a whole).  What a
direction emits is placed at ``done``, the latest position among the bytes it
has delivered (so, in order, the packet that completed it; after a hole the
retransmission that filled it; after a hole given up, the latest packet among
those behind it - not the packet that gave it up).  ``done`` never goes back,
so a direction's rows stay in stream order, and it depends only on the
direction's own segments: any reader of the connection places its rows alike.
"""

from __future__ import annotations

from heapq import heappop, heappush

from ..wire.decoder import DEFAULT_MAX_BODY, FrameDecoder
from ..wire.events import Event

__all__ = [
    "MAX_CUT_PENDING",
    "MAX_CUT_PENDING_SEGMENTS",
    "MAX_HOLE_WAIT",
    "MAX_NOTED",
    "MAX_PENDING",
    "MAX_PENDING_SEGMENTS",
    "RECENT",
    "Emitted",
    "HalfStream",
]

MAX_PENDING = 4 * 1024 * 1024  # out-of-order bytes held per direction before a hole becomes a gap
MAX_NOTED = 100  # packet numbers kept per direction for conflicting retransmissions
MAX_PENDING_SEGMENTS = 4096  # ... and out-of-order segments (many tiny ones cost more than their bytes)
# Behind a hole the snaplen cut, much less is held: the receiver got those bytes, so a retransmission of them is rare
# (the real segment was lost too), while a capture taken with a small snaplen cuts every segment of every connection.
MAX_CUT_PENDING = 64 * 1024
MAX_CUT_PENDING_SEGMENTS = 64
RECENT = 64 * 1024  # delivered bytes kept per direction (up to twice that) to compare overlapping retransmissions
# A hole is given up once the capture is this many packets past the oldest segment held behind it: a retransmission
# comes within a few round trips, and meanwhile every other connection's rows wait for their place in the order.
MAX_HOLE_WAIT = 65536

_FINISHED = FrameDecoder()  # the decoder of every finished direction (theirs is closed: nothing more is fed)
_FINISHED.close()

#: one decoder call's events: (events, ts_last, packet_last, heads, position, file) - see :data:`Batch`
Emitted = tuple[list[Event], int, int, list[tuple[int, int, int, int]], int, str]


class HalfStream:
    """One direction of a connection: sequence space -> ordered bytes -> decoder.

    Out-of-order segments wait in ``pending`` (keyed by sequence number, with
    a heap of the keys, so the earliest is found in O(1) and taken in
    O(log n)); bytes the snaplen cut are a hole like any other, until a
    segment fills it or it is given up.  A finished direction keeps only its
    counters (its decoder is replaced by a shared closed one).
    """

    __slots__ = (
        "_arrivals",
        "_cut",
        "_held",
        "_order",
        "_recent",
        "_window",
        "after_close",
        "base",
        "bytes",
        "closed",
        "conflict_packets",
        "conflicts",
        "decoder",
        "done",
        "done_file",
        "fin_seq",
        "known_end",
        "lost",
        "next_seq",
        "pending",
        "pending_bytes",
        "scheduled",
        "segments",
    )

    def __init__(self, *, aligned: bool, max_body: int = DEFAULT_MAX_BODY, window: int = RECENT) -> None:
        self.decoder = FrameDecoder(aligned=aligned, max_body=max_body)
        self._window = window  # delivered bytes kept to compare retransmissions with (0: none, e.g. a proxy's own stream)
        self.next_seq: int | None = None  # absolute (64-bit) next expected sequence number
        self.base: int | None = None  # absolute seq of decoder offset 0
        self.pending: dict[int, tuple[bytes, int, int, int, int, str]] = {}  # abs seq -> (data, missing, ts, packet, pos, file)
        self.pending_bytes = 0
        self.known_end = 0  # absolute seq after the furthest byte a segment accounted for (payload + snaplen cut)
        self._order: list[int] = []  # heap of the keys of ``pending``: the earliest is always ``_order[0]``
        self._held: list[tuple[int, int]] = []  # heap of (pos, seq) of ``pending`` (stale entries skipped): the oldest held
        self.scheduled = False  # the reassembler has this direction in its heap of holes to give up
        self.done = 0  # the latest capture position among the bytes delivered: where what it emits is placed
        self.done_file = ""  # the file of that packet
        self._cut: tuple[int, int, int, int, str] | None = None  # (seq, ts, packet, pos, file) of the latest snaplen cut that left a hole
        self.fin_seq: int | None = None
        self.closed = False
        self.lost = 0  # bytes known missing (gaps)
        self.conflicts = 0  # overlapping retransmissions whose bytes differed
        self.conflict_packets: list[int] = []  # the packets that carried them (the first MAX_NOTED)
        self.bytes = 0  # bytes delivered
        self.segments = 0
        self.after_close = 0  # payload bytes that arrived after the direction ended (ignored)
        self._recent = bytearray()  # the last delivered bytes, ending at next_seq
        self._arrivals: list[tuple[int, int, int]] = []  # (decoder offset where a delivered run starts, ts, packet)

    # --- sequence numbers ------------------------------------------------------
    def extend(self, seq32: int) -> int:
        """A 32-bit sequence number as an absolute one, nearest to where we are (wraps)."""
        ref = self.next_seq
        if ref is None:
            return seq32 + (1 << 32)  # room below for retransmissions before the first segment
        diff = (seq32 - ref) & 0xFFFFFFFF
        if diff >= 1 << 31:
            diff -= 1 << 32
        return ref + diff

    # --- delivery ----------------------------------------------------------------
    def _deliver(self, data: bytes, ts: int, packet: int, pos: int, file: str, out: list[Emitted]) -> None:
        assert self.base is not None and self.next_seq is not None
        self._arrivals.append((self.next_seq - self.base, ts, packet))
        if pos > self.done:
            self.done, self.done_file = pos, file
        self.next_seq += len(data)
        self.bytes += len(data)
        if self._window:
            self._recent += data
            if len(self._recent) > 2 * self._window:
                del self._recent[: len(self._recent) - self._window]
        self._emit(self.decoder.feed(data), out)

    def _gap(self, n: int, ts: int, packet: int, pos: int, file: str, out: list[Emitted]) -> None:
        assert self.base is not None and self.next_seq is not None
        self._arrivals.append((self.next_seq - self.base, ts, packet))
        if pos > self.done:
            self.done, self.done_file = pos, file
        self.next_seq += n
        self.lost += n
        self._recent.clear()
        self._emit(self.decoder.feed_gap(n), out)

    def _emit(self, events: list[Event], out: list[Emitted], at: tuple[int, str] | None = None) -> None:
        """Events out, placed at ``done`` (or ``at``: a closing packet's position and file)."""
        if not events:
            return
        arr = self._arrivals
        last = arr[-1]
        lo = last[0]
        heads: list[tuple[int, int, int, int]] = []
        for ev in events:  # in stream order: only the first few can have started before the last run
            off = ev.offset
            if off >= lo:
                break
            first = arr[self._find(off)]
            end = arr[self._find(off + max(ev.length, 1) - 1)]
            heads.append((first[1], end[1], first[2], end[2]))
        pos, file = at if at is not None else (self.done, self.done_file)
        out.append((events, last[1], last[2], heads, pos, file))
        # forget arrivals before the first byte the decoder still holds
        held = self.decoder.offset - self.decoder.buffered
        if held < lo and len(arr) > 1024:
            keep_from = self._find(held)
            if keep_from > 1024:
                del arr[:keep_from]
        elif held >= lo and len(arr) > 1024:
            del arr[:-1]

    def _find(self, offset: int) -> int:
        """Index of the delivered run containing decoder ``offset``."""
        arr = self._arrivals
        lo, hi = 0, len(arr) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if arr[mid][0] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def push(self, seq: int, data: bytes, missing: int, ts: int, packet: int, pos: int, file: str, out: list[Emitted]) -> None:
        """Take one segment's payload at absolute ``seq`` (``missing`` bytes cut by the snaplen follow it), from capture position ``pos``."""
        self.segments += 1
        if self.closed:  # after FIN/RST or a corrupt flag: nothing more is decoded here
            self.after_close += len(data)
            return
        if self.next_seq is None:
            self.next_seq = self.base = seq
        end = seq + len(data)
        self.known_end = max(self.known_end, end + missing)
        nxt = self.next_seq
        if end <= nxt:  # no byte we lack (its cut tail, if any, is a hole like any other)
            self._compare(seq, data, packet)
            if missing and end == nxt:
                self._cut = (nxt, ts, packet, pos, file)
            return
        if seq < nxt:  # overlaps what we have: keep the new tail
            cut = nxt - seq
            self._compare(seq, data[:cut], packet)
            data = data[cut:]
            seq = nxt
        if seq == nxt:
            self._deliver(data, ts, packet, pos, file, out)
            if missing:
                self._cut = (self.next_seq, ts, packet, pos, file)
            if self._order and self._order[0] <= self.next_seq:
                self._drain(out)
            return
        old = self.pending.get(seq)
        if old is None:
            self.pending[seq] = (data, missing, ts, packet, pos, file)
            self.pending_bytes += len(data)
            heappush(self._order, seq)
            heappush(self._held, (pos, seq))
        else:
            if old[0] != data[: len(old[0])] and not data.startswith(old[0][: len(data)]):
                self._conflict(packet)
            if len(data) > len(old[0]):  # the one that carries more bytes (its cut is known_end's business)
                self.pending[seq] = (data, missing, ts, packet, pos, file)
                self.pending_bytes += len(data) - len(old[0])
                heappush(self._held, (pos, seq))
        while self.pending_bytes > MAX_PENDING or len(self.pending) > MAX_PENDING_SEGMENTS:
            self._skip_hole(out)
        while (
            self._order
            and (self.pending_bytes > MAX_CUT_PENDING or len(self.pending) > MAX_CUT_PENDING_SEGMENTS)
            and self._cut is not None
            and self._cut[0] == self.next_seq
        ):
            self._skip_hole(out)

    def _drain(self, out: list[Emitted]) -> None:
        """Deliver the pending segments that now start at or before ``next_seq``, lowest first."""
        order, pending = self._order, self.pending
        while order and self.next_seq is not None and order[0] <= self.next_seq:
            s = heappop(order)
            data, missing, ts, packet, pos, file = pending.pop(s)
            self.pending_bytes -= len(data)
            nxt = self.next_seq
            if s + len(data) <= nxt:
                self._compare(s, data, packet)
                continue
            cut = nxt - s
            self._compare(s, data[:cut], packet)
            self._deliver(data[cut:], ts, packet, pos, file, out)
            if missing:
                self._cut = (self.next_seq, ts, packet, pos, file)
        if not pending:
            self._held.clear()  # its stale entries with it

    def _skip_hole(self, out: list[Emitted]) -> None:
        """Give up waiting for the bytes before the earliest pending segment.

        The gap is dated by the packet the snaplen cut when that made the
        hole, else by that segment; it is placed with that segment (never
        before a position still held: see :meth:`Reassembler.watermark`).
        """
        if not self._order or self.next_seq is None:
            return
        first = self._order[0]
        if first > self.next_seq:
            _data, _missing, ts, packet, pos, file = self.pending[first]
            cut = self._cut
            if cut is not None and cut[0] == self.next_seq:
                ts, packet = cut[1], cut[2]
            self._gap(first - self.next_seq, ts, packet, pos, file, out)
        self._drain(out)

    def oldest(self) -> int | None:
        """The capture position of the oldest segment held behind a hole (None: nothing held)."""
        held, pending = self._held, self.pending
        while held:
            pos, seq = held[0]
            p = pending.get(seq)
            if p is not None and p[4] == pos:
                return pos
            heappop(held)
        return None

    def give_up_older(self, ts_before: int, out: list[Emitted]) -> None:
        """Give up holes until no segment held behind one was captured before ``ts_before`` (ns; a live source's clock)."""
        old = [seq for seq, p in self.pending.items() if p[2] < ts_before]
        if old:
            last = max(old)
            while self._order and self._order[0] <= last:
                self._skip_hole(out)

    def give_up(self, before: int, out: list[Emitted]) -> None:
        """Give up holes until no segment held behind one arrived at or before position ``before``."""
        while self.pending:
            o = self.oldest()
            if o is None or o > before:
                return
            self._skip_hole(out)

    def _conflict(self, packet: int) -> None:
        self.conflicts += 1
        if len(self.conflict_packets) < MAX_NOTED:
            self.conflict_packets.append(packet)

    def _compare(self, seq: int, data: bytes, packet: int) -> None:
        """Count a retransmission whose bytes differ from what was delivered."""
        if not data or self.next_seq is None:
            return
        start = self.next_seq - len(self._recent)
        a = max(seq, start)
        b = min(seq + len(data), self.next_seq)
        if a < b and self._recent[a - start : b - start] != data[a - seq : b - seq]:
            self._conflict(packet)

    def finish(self, ts: int, packet: int, pos: int, file: str, out: list[Emitted]) -> None:
        """The direction ended (FIN delivered, RST, end of capture) at capture position ``pos``: flush holes, close the decoder.

        What was held behind holes keeps its place (``done``); the bytes
        missing at the end and what the decoder still held are placed at ``pos``.
        """
        if self.closed:
            return
        while self.pending:
            self._skip_hole(out)
        end = max(self.known_end, self.fin_seq or 0)
        if self.next_seq is not None and end > self.next_seq:
            cut = self._cut
            if cut is not None and cut[0] == self.next_seq:
                ts, packet = cut[1], cut[2]  # dated by the packet the snaplen cut, placed at the end
            self._gap(end - self.next_seq, ts, packet, pos, file, out)
        self.closed = True
        if self.base is None:
            self.base = self.next_seq = 0
        self._emit(self.decoder.close(), out, (pos, file))
        self.decoder = _FINISHED
        self._arrivals = []  # a finished direction keeps only its counters
        self._recent = bytearray()
        self._order = []
        self._held = []
        self._cut = None
