"""A DCP client across the nodes of a cluster, sans-IO: one :class:`DcpConsumer` per data node it needs.

Real clients follow the cluster map: each vbucket is streamed from the node the
map names active, over one DCP connection per node (each with its own
bootstrap and DCP_OPEN).  :class:`ClusterConsumer` holds those connections
(*links*) and moves streams between them; it does no I/O either: the edge
(:class:`~dcpinspect.live.client.DcpClient`) connects the links it asks for
and moves their bytes.

1. The first link goes to the address the user gave.  Its consumer asks
   GET_CLUSTER_CONFIG after SELECT_BUCKET; each vbucket the map names active on
   another node is handed over (a ``moved`` event carrying a
   :class:`~.consumer_streams.Handoff`) to the link to that node, opened if
   needed.  A server that answers GET_CLUSTER_CONFIG with an error (memcached,
   an old node) keeps every vbucket on the first link: single-node use is the
   plain :class:`DcpConsumer`.
2. When a stream ends StateChanged (a Rollback arrives as one) or a stream
   request is answered NOT_MY_VBUCKET, its link asks for the map again and the
   stream is requested again there or handed over; the new node may then roll
   it back (the consumer's rollback protocol).  Hand-overs in a row count
   against ``max_rollbacks`` like rollbacks do.
3. A link that fails (cannot connect, the server went away, a timeout) fails
   the whole client with one line naming ``host:port``; what every link
   received so far stays in :attr:`ClusterConsumer.state`.
4. Every event a link reports comes out tagged with its ``node``; the links'
   own ``done`` events are replaced by one when every link is done.

>>> c = ClusterConsumer(ConsumerConfig(bucket="b", user="u", password="p"), ("127.0.0.1", 11210))
>>> c.wanted()
[0]
>>> c.links[0].address
('127.0.0.1', 11210)
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from .consumer import ConsumerConfig, DcpConsumer
from .consumer_states import ConsumerEvent, StreamStatus
from .consumer_streams import Handoff, StreamInfo
from .resume import ResumeState
from .tap import format_endpoint as address_text  # host:port, [v6]:port

__all__ = ["MAX_LINKS", "ClusterConsumer", "Link", "address_text"]

#: connections a client opens at most (one per data node): a map naming more fails the client
MAX_LINKS = 1024


@dataclass
class Link:
    """One connection of the client: to ``address``, with its consumer once connected."""

    id: int
    address: tuple[str, int]
    consumer: DcpConsumer | None = None
    #: streams handed over before the link connected: adopted as it does
    handoffs: list[Handoff] = field(default_factory=list)
    #: the edge was asked to connect it (see :meth:`ClusterConsumer.wanted`)
    asked: bool = False
    #: the client stopped before it connected: it never streams
    cancelled: bool = False

    @property
    def done(self) -> bool:
        """Its consumer ended (done or failed), or it was cancelled."""
        return self.cancelled or (self.consumer is not None and self.consumer.done)


class ClusterConsumer:
    """The client's links and where each vbucket streams; feed it per link, as a :class:`DcpConsumer`.

    Edge protocol: connect each link id :meth:`wanted` returns and call
    :meth:`connected` (or :meth:`connect_failed`); send :meth:`data_to_send` of
    each link; feed what a link's socket reads to :meth:`receive`; call
    :meth:`tick` now and then; close a link's socket once :meth:`closable` says so.
    """

    def __init__(self, config: ConsumerConfig, address: tuple[str, int], now: float = 0.0) -> None:
        self.config = config
        self.links: dict[int, Link] = {}
        #: the client's failure (one line), once it failed
        self.failure: str | None = None
        #: streams that could not be placed on any link (hand-overs beyond the retry budget, closed before connecting)
        self.orphans: dict[int, StreamInfo] = {}
        self._hold_acks = False
        self._done_reported = False
        self._now = now
        self._next_id = 0
        self._link(address)

    # --- state ----------------------------------------------------------------------
    @property
    def consumer(self) -> DcpConsumer | None:
        """The first link's consumer (the only one for a single node)."""
        return self.links[0].consumer

    @property
    def done(self) -> bool:
        """Failed, or every link ended and none waits to connect."""
        return self.failure is not None or all(link.done for link in self.links.values())

    @property
    def hold_acks(self) -> bool:
        """Withhold every link's buffer acknowledgements (see :attr:`DcpConsumer.hold_acks`)."""
        return self._hold_acks

    @hold_acks.setter
    def hold_acks(self, value: bool) -> None:
        self._hold_acks = bool(value)
        for link in self.links.values():
            if link.consumer is not None:
                link.consumer.hold_acks = self._hold_acks

    @property
    def state(self) -> ResumeState:
        """The resume state of every vbucket, from the link that streams it now (a copy; persist this)."""
        first = self.links[0].consumer
        state = first.state if first is not None else (self.config.resume or ResumeState(bucket=self.config.bucket)).copy()
        for link in self.links.values():
            if link.consumer is not None and link.id:
                state.vbuckets.update(link.consumer.state.vbuckets)
            for h in link.handoffs:
                state.vbuckets[h.vbucket] = copy.deepcopy(h.position)
        for vb, st in self.orphans.items():
            state.vbuckets[vb] = copy.deepcopy(st.position)
        state.bucket = state.bucket or self.config.bucket
        state.vbuckets = dict(sorted(state.vbuckets.items()))
        return state

    @property
    def streams(self) -> dict[int, StreamInfo]:
        """Every vbucket's stream, from the link that streams it now (by vbucket)."""
        out: dict[int, StreamInfo] = {}
        for link in self.links.values():
            for h in link.handoffs:
                out[h.vbucket] = _pending(h)
            if link.consumer is not None:
                out.update((vb, st) for vb, st in link.consumer.streams.items() if st.status is not StreamStatus.MOVED)
        out.update(self.orphans)
        return dict(sorted(out.items()))

    @property
    def frames_received(self) -> int:
        """Frames decoded from the servers' bytes so far, on every link."""
        return sum(link.consumer.frames_received for link in self.links.values() if link.consumer is not None)

    # --- edge protocol ----------------------------------------------------------------
    def wanted(self) -> list[int]:
        """Links the edge has to connect now (each returned once)."""
        ids = [link.id for link in self.links.values() if not link.asked and self.failure is None]
        for i in ids:
            self.links[i].asked = True
        return ids

    def connected(self, link_id: int, now: float) -> list[ConsumerEvent]:
        """The link's TCP connection is up: its consumer starts (HELLO queued) and takes the streams handed to it."""
        link = self.links[link_id]
        self._now = now
        if link.cancelled:
            return []
        config = self.config if link_id == 0 else dataclasses.replace(self.config, vbuckets=(), resume=None)
        link.consumer = DcpConsumer(config, now=now, address=link.address)
        link.consumer.hold_acks = self._hold_acks
        events: list[ConsumerEvent] = []
        handoffs, link.handoffs = link.handoffs, []
        for h in handoffs:
            events += link.consumer.adopt(h, now) or []
        return self._after(link, events)

    def connect_failed(self, link_id: int, why: str) -> list[ConsumerEvent]:
        """The link could not connect (``why``: one line naming host:port): the client fails."""
        link = self.links[link_id]
        for h in link.handoffs:  # what the streams had is kept
            self.orphans[h.vbucket] = _pending(h)
        link.handoffs = []
        return self._fail([], why)

    def has_output(self, link_id: int) -> bool:
        """That link has bytes queued for its server."""
        consumer = self.links[link_id].consumer
        return consumer is not None and consumer.output_size > 0

    def data_to_send(self, link_id: int) -> bytes:
        """The bytes queued for that link's server."""
        consumer = self.links[link_id].consumer
        return consumer.data_to_send() if consumer is not None else b""

    def receive(self, link_id: int, data: bytes, now: float) -> list[ConsumerEvent]:
        """Bytes from that link's server -> events (of every link: a stream handed over starts elsewhere)."""
        self._now = now
        link = self.links[link_id]
        if link.consumer is None:
            return []
        return self._after(link, link.consumer.receive(data, now))

    def tick(self, now: float) -> list[ConsumerEvent]:
        """Time passes on every link (reply timeouts, dead connections, held acks released)."""
        self._now = now
        events: list[ConsumerEvent] = []
        for link in list(self.links.values()):
            if link.consumer is not None and not link.consumer.done:
                events += self._after(link, link.consumer.tick(now))
        return events

    def connection_lost(self, link_id: int) -> list[ConsumerEvent]:
        """That link's server closed the connection (a failure unless its streams all ended)."""
        link = self.links[link_id]
        return self._after(link, link.consumer.connection_lost()) if link.consumer is not None else []

    def connection_failed(self, link_id: int, why: str) -> list[ConsumerEvent]:
        """That link's transport failed."""
        link = self.links[link_id]
        return self._after(link, link.consumer.connection_failed(why)) if link.consumer is not None else []

    def closable(self, link_id: int) -> bool:
        """The link ended (or the client did): its socket can be closed."""
        return self.links[link_id].done or self.failure is not None

    def close_streams(self, now: float) -> list[ConsumerEvent]:
        """Stop: every link closes its streams; streams not yet on a connected link end where they are."""
        self._now = now
        events: list[ConsumerEvent] = []
        for link in list(self.links.values()):
            if link.consumer is not None:
                events += self._after(link, link.consumer.close_streams(now))
            else:
                for h in link.handoffs:
                    st = self.orphans[h.vbucket] = _pending(h)
                    st.status, st.end_reason = StreamStatus.ENDED, "Closed (by client)"
                link.handoffs = []
                link.asked = link.cancelled = True
        return events + self._check_done()

    # --- inside -------------------------------------------------------------------
    def _link(self, address: tuple[str, int]) -> Link:
        link = Link(self._next_id, address)
        self._next_id += 1
        self.links[link.id] = link
        return link

    def _after(self, link: Link, events: list[ConsumerEvent]) -> list[ConsumerEvent]:
        """A link's events: tagged, hand-overs carried out, its failure the client's, its ``done`` replaced."""
        node = address_text(link.address)
        out: list[ConsumerEvent] = []
        for ev in events:
            if ev.kind == "done":
                continue
            out.append(dataclasses.replace(ev, node=node))
            if ev.kind == "moved":
                out += self._hand_over(ev.data["handoff"])
            elif ev.kind == "error" and self.failure is None:
                self.failure = ev.message if link.id == 0 else f"{node}: {ev.message}"
                if link.id:
                    out[-1] = dataclasses.replace(out[-1], message=self.failure)
        return out + self._check_done()

    def _hand_over(self, h: Handoff) -> list[ConsumerEvent]:
        """Give the stream to the link to ``h.address``: an open one, or a new one."""
        vb = h.vbucket
        self.orphans.pop(vb, None)
        if h.retries_in_a_row > self.config.max_rollbacks:
            st = self.orphans[vb] = _pending(h)
            st.status = StreamStatus.FAILED
            st.error = f"moved {h.moves} times, {h.retries_in_a_row - 1} tries in a row; giving up"
            return [ConsumerEvent("stream_failed", st.error, vb, node=address_text(h.address))]
        for link in self.links.values():
            if link.address != h.address or link.done:
                continue
            if link.consumer is None:
                link.handoffs.append(h)
                return []
            events = link.consumer.adopt(h, self._now)
            if events is not None:
                return self._after(link, events)
        if sum(not link.done for link in self.links.values()) >= MAX_LINKS:  # ended links (streams moved away) do not count
            return self._fail([], f"the cluster map names more than {MAX_LINKS} nodes to connect to")
        self._link(h.address).handoffs.append(h)
        return []

    def _fail(self, events: list[ConsumerEvent], why: str) -> list[ConsumerEvent]:
        if self.failure is None:
            self.failure = why
            events.append(ConsumerEvent("error", why))
        return events

    def _check_done(self) -> list[ConsumerEvent]:
        if self._done_reported or self.failure is not None or not self.done:
            return []
        self._done_reported = True
        failed = sorted(vb for vb, st in self.streams.items() if st.status is StreamStatus.FAILED)
        return [ConsumerEvent("done", f"all streams ended ({len(failed)} failed)", data={"failed": failed})]


def _pending(h: Handoff) -> StreamInfo:
    """The stream ``h`` hands over, as it stands before a link takes it."""
    st = StreamInfo(h.vbucket, copy.deepcopy(h.position), high_seqno=h.high_seqno, counts=Counter(h.counts))
    st.rollbacks, st.rerequests, st.retries_in_a_row, st.moves = h.rollbacks, h.rerequests, h.retries_in_a_row, h.moves
    st.start_seqno = h.position.seqno
    return st
