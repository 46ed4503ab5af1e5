"""Records: decoded events with their connection, direction, time and context.

:func:`iter_records` turns segments (from a capture, a proxy, a sniffer) into
:class:`Record` objects through the one :class:`~dcpinspect.flows.reassembly.Reassembler`
and :class:`~dcpinspect.wire.decoder.FrameDecoder`, and follows what each connection
negotiated (HELLO features, DCP_OPEN flags, DCP_CONTROL enable_stream_id) so
every frame is dissected with the context of *its* connection: a key carries a
collection id only where collections were negotiated.  A connection whose
start was not captured has an unknown context (nothing is guessed).  Records
are numbered in the capture's order (the reassembler's ``(k1, k2)``: by the
packet that completed them, frames after a hole given up in their place, not
where the hole was given up); what waits for its place is bounded by
:data:`~dcpinspect.flows.halfstream.MAX_HOLE_WAIT` packets.  Pure: no
I/O.  :func:`dcpinspect.capture.read.read_records` is the capture-file edge on top.
"""

from __future__ import annotations

import gc
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import accumulate
from typing import Any, NamedTuple, TypeVar

from ..protocol.session import SESSION_OPS
from ..wire.decoder import DEFAULT_MAX_BODY
from ..wire.dissection import DissectContext
from ..wire.events import Event, Frame
from .reassembly import DEFAULT_SERVER_PORTS, TLS_PORTS, Batch, Connection, Reassembler, Segment, expand
from .session import ConnState, Sessions

T = TypeVar("T")

__all__ = [
    "FIRST_SET",
    "CaptureStats",
    "InOrder",
    "Record",
    "RecordChunk",
    "SetPlace",
    "gc_paused",
    "iter_chunks",
    "iter_records",
]


class Record(NamedTuple):
    """One decoded event in its capture: frame (or garbage/truncated/gap) + where and when."""

    number: int  # 1-based, in order of completion
    file: str
    conn: int
    conn_label: str
    direction: str  # "c2s" | "s2c"
    ts: int  # ns: the packet that completed it (capture.TS_UNKNOWN if its timestamp was out of range: null in tables)
    ts_first: int  # ns: the packet its first byte arrived in (likewise)
    packet: int
    packet_first: int
    event: Event
    context: DissectContext
    capture_set: int = 1  # the capture set it was read in (1-based)
    set_base: int = 0  # the records of the sets before it: its number within its set is ``number - set_base``

    @property
    def set_frame(self) -> int:
        """Its number within its capture set (1-based)."""
        return self.number - self.set_base


class SetPlace(NamedTuple):
    """Where one capture set's read starts in a run of several: its number, and the records and connections before it."""

    capture_set: int = 1
    frame_base: int = 0  # records numbered before this set (its first is ``frame_base + 1``)
    conn_base: int = 0  # connection ids given before this set


#: the place of a read of one capture set (or the first of several)
FIRST_SET = SetPlace()


@dataclass
class CaptureStats:
    """What a read saw besides frames: per-file problems, skipped packets, connections.

    ``sets`` is the plan of capture sets the read followed (a list of
    :class:`dcpinspect.capture.sets.CaptureSet`) and ``set_first`` the number
    of each set's first frame (set -> frame; a set without frames gets the
    number its first frame would have had).
    """

    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    connections: list[Connection] = field(default_factory=list)
    states: dict[int, ConnState] = field(default_factory=dict)
    packets: int = 0
    records: int = 0
    sets: list[Any] = field(default_factory=list)
    set_first: dict[int, int] = field(default_factory=dict)

    def add_set(self, sub: CaptureStats) -> None:
        """Take what the read of one capture set saw (its records and connections already numbered after the sets before)."""
        self.files.update(sub.files)
        self.skipped.update(sub.skipped)
        self.connections.extend(sub.connections)
        self.states.update(sub.states)
        self.packets += sub.packets
        self.records = max(self.records, sub.records)


class InOrder:
    """Batches of a reassembler in the capture's order: each held until its ``k1`` is below the watermark.

    What is held is what came while a hole was open: at most
    :data:`~dcpinspect.flows.halfstream.MAX_HOLE_WAIT` packets' worth.
    """

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: list[tuple[int, int, Batch]] = []  # heap by (k1, k2): unique, so batches are never compared

    def release(self, batches: list[Batch], watermark: int) -> list[Batch]:
        """Take ``batches``; return those (and those held) whose place is now final, in order."""
        held = self.held
        if not held:
            if len(batches) < 2:
                if not batches or batches[0][7] < watermark:
                    return batches
            elif all(b[7] < watermark for b in batches):
                keys = [(b[7], b[8]) for b in batches]
                return batches if keys == sorted(keys) else sorted(batches, key=_place)
        for b in batches:
            heappush(held, (b[7], b[8], b))
        out: list[Batch] = []
        while held and held[0][0] < watermark:
            out.append(heappop(held)[2])
        return out


def _place(b: Batch) -> tuple[int, int]:
    return b[7], b[8]


def _batches(
    segments: Iterable[Segment],
    r: Reassembler,
    st: CaptureStats,
) -> Iterator[Batch]:
    st.connections = r.connections
    order = InOrder()
    for seg in segments:
        batches = r.feed_raw(seg)
        if batches or order.held:
            yield from order.release(batches, r.watermark())
    yield from order.release(r.close_raw(), r.watermark())
    st.skipped["not memcached-binary TCP"] += r.skipped_segments


class Recorder:
    """Push-based records: feed segments as they happen (a proxy, a client, a sniffer).

    The same reassembly, decoding, numbering and per-connection context as
    :func:`iter_records` (which is built on it)::

        rec = Recorder()
        for seg in live_segments:
            for record in rec.feed(seg):
                ...
        rest = rec.close()
    """

    def __init__(
        self,
        *,
        server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
        detect: bool = True,
        tls_ports: Iterable[int] = TLS_PORTS,
        max_body: int = DEFAULT_MAX_BODY,
        stats: CaptureStats | None = None,
        reveal_secrets: bool = False,
        hole_wait: int | None = None,
        place: SetPlace = FIRST_SET,
    ) -> None:
        self.reassembler = Reassembler(
            server_ports=server_ports,
            detect=detect,
            tls_ports=tls_ports,
            max_body=max_body,
            hole_wait=hole_wait,
            first_id=place.conn_base + 1,
        )
        self.stats = stats if stats is not None else CaptureStats()
        self.stats.connections = self.reassembler.connections
        self._sessions = Sessions(self.stats.states, reveal_secrets)
        self._order = InOrder()
        self.number = place.frame_base
        self.place = place
        self._closed = False

    def feed(self, segment: Segment, keys: tuple[list[int], list[int]] | None = None) -> list[Record]:
        """Take one segment; return the records whose place in the capture's order is now final (``keys`` gets their ``k1``, ``k2``)."""
        return self._records(self.reassembler.feed_raw(segment), keys)

    def advance(self, pos: int, keys: tuple[list[int], list[int]] | None = None) -> list[Record]:
        """The capture reached position ``pos`` (a packet this recorder was not fed): the records that makes final."""
        return self._records(self.reassembler.give_up(pos), keys)

    def give_up_older(self, ts_before: int) -> list[Record]:
        """A live source: give up the holes held since before ``ts_before`` (ns, capture time); the records that makes final."""
        return self._records(self.reassembler.give_up_older(ts_before))

    @property
    def held(self) -> int:
        """Batches of records waiting for their place (behind a hole still open)."""
        return len(self._order.held)

    def expire(self, idle_before: int) -> list[Record]:
        """Close the connections silent since before ``idle_before`` (ns, capture time): the records they held."""
        return self._records(self.reassembler.expire(idle_before))

    def close(self, keys: tuple[list[int], list[int]] | None = None) -> list[Record]:
        """End of input: the records still held (truncated frames, gaps)."""
        if self._closed:
            return []
        self._closed = True
        out = self._records(self.reassembler.close_raw(), keys)
        self.stats.skipped["not memcached-binary TCP"] += self.reassembler.skipped_segments
        return out

    def _records(self, batches: list[Batch], keys: tuple[list[int], list[int]] | None = None) -> list[Record]:
        order = self._order
        if not batches and not order.held:
            return []
        out: list[Record] = []
        cset, base = self.place.capture_set, self.place.frame_base
        for b in order.release(batches, self.reassembler.watermark()):
            conn, d = b[0], b[1]
            label = conn.label
            file = b[6] or conn.file
            state = self._sessions.state(conn)
            if keys is not None:
                n = len(b[2])
                keys[0].extend([b[7]] * n)
                keys[1].extend(range(b[8], b[8] + n))
            for ev, ts_first, ts_last, p_first, p_last in expand(b):
                self.number += 1
                out.append(Record(self.number, file, conn.id, label, d, ts_last, ts_first, p_last, p_first, ev, state.context, cset, base))
                if ev.__class__ is Frame and ev[1][1] in SESSION_OPS and ev[2] == "mcbp":
                    state.observe(d, ev)
        self.stats.records = self.number
        return out


def iter_records(
    segments: Iterable[Segment],
    *,
    server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
    detect: bool = True,
    tls_ports: Iterable[int] = TLS_PORTS,
    max_body: int = DEFAULT_MAX_BODY,
    stats: CaptureStats | None = None,
    reveal_secrets: bool = False,
    place: SetPlace = FIRST_SET,
) -> Iterator[Record]:
    """Reassemble, decode and contextualise ``segments``; yield records in completion order (numbered after ``place``)."""
    rec = Recorder(
        server_ports=server_ports,
        detect=detect,
        tls_ports=tls_ports,
        max_body=max_body,
        stats=stats,
        reveal_secrets=reveal_secrets,
        place=place,
    )
    for seg in segments:
        out = rec.feed(seg)
        if out:
            yield from out
    yield from rec.close()


@dataclass
class RecordChunk:
    """Many records in columnar form (the twin of :class:`Record` for table builders).

    ``events`` and ``context`` have one entry per record; the rest one per
    *run* - the records completed by one packet in one direction - with
    ``counts`` records each.  ``heads`` overrides the times and packets of the
    few records that began in an earlier packet (index in the chunk ->
    ``(ts_first, ts_last, packet_first, packet_last)``).  Record numbers run
    from ``first_number``; connection labels are in ``labels`` (by id).
    Every record of a chunk is of one capture set (``capture_set``, after
    ``set_base`` records of the sets before it).
    """

    first_number: int
    events: list[Event] = field(default_factory=list)
    context: list[DissectContext] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    conn: list[int] = field(default_factory=list)
    direction: list[str] = field(default_factory=list)
    file: list[str] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)
    packet: list[int] = field(default_factory=list)
    heads: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    capture_set: int = 1
    set_base: int = 0

    def __len__(self) -> int:
        return len(self.events)

    def record(self, i: int) -> Record:
        """Record ``i`` of the chunk as a :class:`Record`."""
        return self._record(i, bisect_right(list(accumulate(self.counts)), i))

    def records(self) -> Iterator[Record]:
        """Every record of the chunk, in order."""
        i = 0
        for run, n in enumerate(self.counts):
            for j in range(i, i + n):
                yield self._record(j, run)
            i += n

    def _record(self, i: int, run: int) -> Record:
        """Record ``i``, of run ``run``."""
        c = self.conn[run]
        ts = self.ts[run]
        packet = self.packet[run]
        tf, tl, pf, pl = self.heads.get(i, (ts, ts, packet, packet))
        return Record(
            self.first_number + i,
            self.file[run],
            c,
            self.labels[c],
            self.direction[run],
            tl,
            tf,
            pl,
            pf,
            self.events[i],
            self.context[i],
            self.capture_set,
            self.set_base,
        )


def iter_chunks(
    segments: Iterable[Segment],
    *,
    rows: int = 65536,
    server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
    detect: bool = True,
    tls_ports: Iterable[int] = TLS_PORTS,
    max_body: int = DEFAULT_MAX_BODY,
    stats: CaptureStats | None = None,
    reveal_secrets: bool = False,
    place: SetPlace = FIRST_SET,
) -> Iterator[RecordChunk]:
    """The records of :func:`iter_records` (same order, numbers and contexts) in chunks of about ``rows``."""
    r = Reassembler(server_ports=server_ports, detect=detect, tls_ports=tls_ports, max_body=max_body, first_id=place.conn_base + 1)
    st = stats if stats is not None else CaptureStats()
    sessions = Sessions(st.states, reveal_secrets)
    cset, sbase = place.capture_set, place.frame_base
    chunk = RecordChunk(sbase + 1, capture_set=cset, set_base=sbase)
    for conn, d, evs, ts, packet, heads, file, _k1, _k2 in _batches(segments, r, st):
        base = len(chunk.events)
        chunk.events += evs
        chunk.context += sessions.contexts(conn, d, evs)
        chunk.counts.append(len(evs))
        chunk.conn.append(conn.id)
        chunk.direction.append(d)
        chunk.file.append(file or conn.file)
        chunk.ts.append(ts)
        chunk.packet.append(packet)
        for i, h in enumerate(heads, base):
            chunk.heads[i] = h
        chunk.labels[conn.id] = conn.label
        if len(chunk.events) >= rows:
            st.records = chunk.first_number + len(chunk) - 1
            yield chunk
            chunk = RecordChunk(chunk.first_number + len(chunk), capture_set=cset, set_base=sbase)
    st.records = chunk.first_number + len(chunk) - 1
    if chunk.events:
        yield chunk


def gc_paused(items: Iterable[T]) -> Iterator[T]:
    """Yield from ``items`` with Python's cyclic collector paused while each item is made.

    The decoder allocates small objects by the million and none of them form
    cycles, while every full collection would walk all that are still held
    (in a Spark worker it tripled a task's time).  The collector runs between
    items, as the caller consumes them.
    """
    it = iter(items)
    while True:
        was = gc.isenabled()
        gc.disable()
        try:
            item = next(it, _END)
        finally:
            if was:
                gc.enable()
        if item is _END:
            return
        yield item


_END: Any = object()
