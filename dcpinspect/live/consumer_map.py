"""The consumer's side of the cluster map: which node streams which vbucket (mixed into :class:`~.consumer.DcpConsumer`).

With the address it is connected to, a consumer asks GET_CLUSTER_CONFIG after
SELECT_BUCKET, as the official clients do (couchbase-cxx-client
``core/io/mcbp_session.cxx``), and reads the map with
:func:`~.clustermap.parse_config`:

1. At bootstrap the vbuckets the map names active on another node are handed
   over (:meth:`~.consumer_streams.Streams.hand_over`: a ``moved`` event the
   fleet of :mod:`.consumer_cluster` acts on); the rest stream here.
2. A stream that must move (StateChanged, NOT_MY_VBUCKET) waits in ``LOCATING``
   for one new map request shared by every vbucket moving meanwhile; then it is
   requested again here or handed over.
3. A map this connection cannot route with (an error status, not JSON, no
   vbucket map, not naming this node) keeps every vbucket here, or keeps the
   map it had.
"""

from __future__ import annotations

from typing import Any

from ..protocol.enums import Status
from ..wire.dissection import Dissection
from ..wire.events import Frame
from ..wire.render import plural
from .clustermap import ClusterMap, parse_config
from .consumer_states import ConsumerEvent, Phase, Request, StreamStatus, server_text, status_text
from .consumer_streams import StreamInfo, Streams
from .tap import format_endpoint

__all__ = ["ClusterMapMixin", "this_node"]

#: vbucket ids are 16 bits
_MAX_VBUCKET = (1 << 16) - 1
_SUCCESS = int(Status.SUCCESS)


class ClusterMapMixin:
    """GET_CLUSTER_CONFIG replies and moving streams between nodes."""

    # --- supplied by the consumer ----------------------------------------------------------
    address: tuple[str, int] | None
    cluster_map: ClusterMap | None
    node_index: int | None
    tracker: Streams
    phase: Phase
    config: Any
    _config_asked: float
    _now: float
    _placed: bool

    @property
    def streams(self) -> dict[int, StreamInfo]:
        """The streams of this connection, by vbucket."""
        raise NotImplementedError

    def _after_config(self, now: float, events: list[ConsumerEvent]) -> None:
        raise NotImplementedError

    def _stream_request(self, st: StreamInfo, events: list[ConsumerEvent]) -> None:
        raise NotImplementedError

    def _request(self, what: Request, name: str, detail: Any = None, now: float | None = None, **kw: Any) -> None:
        raise NotImplementedError

    def _on_config(self, frame: Frame, d: Dissection, detail: Any, now: float, events: list[ConsumerEvent]) -> None:
        self._config_asked = -1.0
        cmap = self._read_map(frame, events)
        if self.phase is Phase.CONFIG:
            if cmap is not None:
                self._place(cmap, events)
            self._after_config(now, events)
        else:  # streaming: the vbuckets that moved are requested here again, or handed over
            self._relocate(events)

    def _read_map(self, frame: Frame, events: list[ConsumerEvent]) -> ClusterMap | None:
        """The map in a GET_CLUSTER_CONFIG reply, if it can route vbuckets (else: stay on this connection)."""
        assert self.address is not None
        why = ""
        if frame.status != _SUCCESS:
            why = f"not served ({status_text(frame.status)})"
        else:
            try:
                cmap = parse_config(frame.value, connected=self.address)
            except (ValueError, KeyError, TypeError) as exc:
                why = f"unreadable ({server_text(str(exc))})"
                events.append(ConsumerEvent("malformed", f"cluster map {why}"))
            else:
                me = this_node(cmap, self.address)
                if not cmap.vbucket_map:
                    why = "without a vbucket map"
                elif len(cmap.vbucket_map) > _MAX_VBUCKET + 1:
                    why = f"with {len(cmap.vbucket_map)} vbuckets (at most {_MAX_VBUCKET + 1})"
                elif me is None:
                    why = f"not naming this node {format_endpoint(self.address)}"
                else:
                    self.cluster_map, self.node_index = cmap, me
                    self.tracker.follow_map = True
                    text = (
                        f"rev {cmap.rev}: {plural(len(cmap.nodes), 'node')}, {plural(len(cmap.vbucket_map), 'vbucket')}, this is node {me}"
                    )
                    events.append(ConsumerEvent("cluster_map", text, data={"map": cmap, "node": me}))
                    return cmap
        if self.cluster_map is None:
            self.tracker.follow_map = False
            events.append(ConsumerEvent("cluster_map", f"{why}: every vbucket stays on this connection"))
        else:
            events.append(ConsumerEvent("cluster_map", f"{why}: keeping rev {self.cluster_map.rev}"))
        return None

    def _place(self, cmap: ClusterMap, events: list[ConsumerEvent]) -> None:
        """Bootstrap: keep the vbuckets active on this node, hand the others over."""
        self._placed = True
        if self.config.vbuckets is None:
            for vb in range(len(cmap.vbucket_map)):
                if vb not in self.streams:
                    self.tracker.add(vb)
        for st in list(self.streams.values()):
            node = cmap.active_node(st.vbucket)
            if node is not None and node != self.node_index and not st.finished:
                self.tracker.hand_over(st, cmap.nodes[node], events)
                del self.streams[st.vbucket]

    def _again(self, st: StreamInfo, events: list[ConsumerEvent]) -> None:
        """Request ``st`` again: here, or once the cluster map says where its vbucket lives."""
        if st.status is not StreamStatus.LOCATING:
            self._stream_request(st, events)
        elif self._config_asked < 0:  # one map request serves every vbucket that moved meanwhile
            self._config_asked = self._now
            self._request(Request.CONFIG, "GET_CLUSTER_CONFIG")

    def _relocate(self, events: list[ConsumerEvent]) -> None:
        cmap = self.cluster_map
        for st in [s for s in self.streams.values() if s.status is StreamStatus.LOCATING]:
            node = cmap.active_node(st.vbucket) if cmap is not None else None
            if cmap is None or node is None or node == self.node_index or not self.tracker.follow_map:
                self._stream_request(st, events)  # still here (or nowhere known): ask this node again
            else:
                self.tracker.hand_over(st, cmap.nodes[node], events)


def this_node(cmap: ClusterMap, address: tuple[str, int]) -> int | None:
    """This node's server index: the node at the address connected to, else the one marked ``thisNode``, else a lone node."""
    if address in cmap.nodes:
        return cmap.nodes.index(address)
    if cmap.this_node is not None and 0 <= cmap.this_node < len(cmap.nodes):
        return cmap.this_node
    return 0 if len(cmap.nodes) == 1 else None
