"""Stage 4: each connection's timeline built in the keys pass, merged on the driver (the Spark glue; an edge: numpy).

Each connection's records are fed, in order, to a
:class:`~dcpinspect.timeline.builder.TimelineBuilder` of its own in the keys
pass (record numbers are the keys K = k1 << KSHIFT | k2, which sort exactly
like the global frame numbers; connection ids are the positions ``ck`` that
made them known, which sort like the global ids).  :class:`Parts` keeps those
builders, through their public hooks only: with ``max_items`` the builder
thins its items and passes every item and flow sample to the sinks first,
which write them out (``analyze --items``) and note where each vbucket's
highest item seqno rose (:class:`~dcpinspect.timeline.merge.SeqnoRises`).
Each connection's result travels as a pickled
:class:`~dcpinspect.timeline.merge.ConnPart`, its seqno history delta-coded
and compressed with numpy; :func:`merge_timelines` hands the parts to
:func:`dcpinspect.timeline.merge.merge_timelines` with the decoder of that
history, and the driver then calls :meth:`Timeline.renumber`.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Callable, Iterator, Mapping
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from ..flows.records import Record
from ..protocol import spec
from ..protocol.enums import Opcode
from ..protocol.session import EXPECTS_RESPONSE
from ..protocol.session import REQUEST_MAGICS as _REQUESTS
from ..protocol.session import RESPONSE_MAGICS as _CLIENT_RESPONSES  # responses to a client's requests
from ..tables.columnar import TablePart
from ..tables.timeline_feed import feed_part
from ..timeline import Item, Timeline, TimelineBuilder
from ..timeline.merge import ConnPart, SeqnoRises, record_tuple, thin
from ..timeline.merge import merge_timelines as merge_parts
from ..wire.events import Frame
from .frametable import ItemsOut
from .numbering import KSHIFT

__all__ = ["Parts", "merge_timelines"]

_FIRST = itemgetter(0)
_SNAPSHOT_MARKER = int(Opcode.DCP_SNAPSHOT_MARKER)
_MARKER_V1_EXTRAS = sum(f.size or 0 for f in spec.SNAPSHOT_V1_EXTRAS)  # a v1 marker's extras length; a v2 marker has a 1-byte version


class _Rises(SeqnoRises):
    """:class:`SeqnoRises` with the running maximum taken by numpy (a task sees millions of items)."""

    def add(self, vb: int, batches: list[list[Item]]) -> None:
        its = batches[0] if len(batches) == 1 else sorted((it for x in batches for it in x), key=_FIRST)
        best = self.best.get(vb, -1)
        ks, qs = self.rises.setdefault(vb, ([], []))
        self.best[vb] = best
        if not its:
            return
        keys, _ts, _op, seqnos, _snap = zip(*its, strict=True)
        q = pa.array(seqnos, pa.uint64())
        if q.null_count:
            at = np.flatnonzero(q.is_valid().to_numpy(zero_copy_only=False))
            keys = tuple(keys[i] for i in at.tolist())
            q = q.drop_null()
        qa = q.to_numpy()
        if not len(qa):
            return
        top = np.maximum.accumulate(qa)
        if best >= 0:
            rose = qa > np.maximum(np.concatenate(([np.uint64(best)], top[:-1])), np.uint64(best))
        else:
            rose = np.concatenate(([True], qa[1:] > top[:-1]))
        at = np.flatnonzero(rose)
        ks += [keys[i] for i in at.tolist()]
        qs += qa[at].tolist()
        self.best[vb] = max(best, int(top[-1]))


class _Conn:
    """One connection's builder in a task, and what the merge needs besides its timeline."""

    def __init__(self, ck: int, first: int, max_items: int | None, out: ItemsOut | None) -> None:
        self.ck, self.first = ck, first
        self.born: list[int] = []  # the key of the record that created each stream
        self.raised: list[int] = []  # the key of the record that raised each anomaly
        self.control: list[Record] = []  # the records the merge replays
        self.markers: dict[int, Record] = {}  # v2 markers (key -> record): replayed if they carried a purge seqno
        self.rises = _Rises() if max_items is not None else None  # fed by the items sink (items are thinned)
        self._new: dict[int, list[list[Item]]] = {}  # vbucket -> the items the sink got since the last drain
        self.out = out
        if max_items is None:
            self.builder = TimelineBuilder()
        else:
            self.builder = TimelineBuilder(max_items=max_items, on_items=self._items, on_flow=out.add_flow if out is not None else None)

    def _items(self, index: int, items: list[Item]) -> None:
        vb = self.builder.streams[index].vbucket
        if self.out is not None:
            self.out.add_items(self.born[index], self.ck, vb, items)
        self._new.setdefault(vb, []).append(items)

    def flush(self) -> None:
        """The builder's new items to the sinks (and thinned); where each vbucket's highest seqno rose, noted."""
        self.builder.flush()
        self._drain()

    def _drain(self) -> None:
        if self.rises is not None:
            for vb, batches in self._new.items():
                self.rises.add(vb, batches)
        self._new.clear()

    def part(self, max_items: int | None) -> ConnPart:
        """The connection's :class:`ConnPart` (its streams' items moved into columns)."""
        bl = self.builder
        t = bl.timeline()
        self._drain()  # the timeline flushed the last items
        purge = {sn.frame for s in t.streams for sn in s.snapshots if isinstance(sn.purge_seqno, int)}
        ctl = self.control + [r for k, r in self.markers.items() if k in purge]
        ctl.sort(key=lambda r: r.number)
        counts = [bl.items_seen(i) for i in range(len(t.streams))]
        rises = self.rises if self.rises is not None else SeqnoRises.of(t.streams)
        history = {vb: _rises_blob(ks, qs) for vb, (ks, qs) in rises.rises.items() if ks}
        flow = t.flow
        if max_items is not None:
            for s in t.streams:
                s.items = thin(s.items, max_items)
            flow = thin(flow, max_items)
        nrt = bl.anomaly_count
        part = ConnPart(
            self.ck,
            self.first,
            t.connections[self.ck],
            list(zip(self.born, t.streams, strict=True)),
            list(zip(self.raised, t.anomalies[:nrt], strict=True)),
            t.anomalies[nrt:],
            flow,
            t.noops,
            t.stalls,
            counts,
            [record_tuple(r) for r in ctl],
            history,
            [tuple(map(list, zip(*s.items, strict=True))) if s.items else () for s in t.streams],
        )
        for s in t.streams:
            s.items = []
        return part


class Parts:
    """The per-connection TimelineBuilders of one task (with ``max_items``, their items thinned as they come: bounded memory)."""

    def __init__(self, max_items: int | None = None, items_to: str | None = None) -> None:
        if items_to is not None and max_items is None:
            raise ValueError("items_to needs max_items")
        self.max_items = max_items
        self.out = ItemsOut(items_to) if items_to is not None else None
        self.conns: dict[int, _Conn] = {}

    def feed(self, part: TablePart, k1: np.ndarray, k2: np.ndarray, ck: np.ndarray) -> None:
        """Feed a part's rows (keys ``k1``, ``k2``; connection ``ck`` of each) to their connections' builders, as records numbered by key.

        Item runs go in bulk (:func:`~dcpinspect.tables.timeline_feed.feed_part`); every other row through :meth:`_record`.
        """
        keys: np.ndarray | list[int] = (
            (k1 << KSHIFT) | k2
            if len(k1) and int(k1.max()) < 1 << (63 - KSHIFT)
            else [a << KSHIFT | b for a, b in zip(k1.tolist(), k2.tolist(), strict=True)]
        )
        feed_part(part, self._builder, self._record, numbers=keys, conns=ck, per_connection=True)
        if self.max_items is not None:
            for c in np.unique(ck).tolist():
                self.conns[c].flush()

    def _conn(self, c: int, key: int) -> _Conn:
        conn = self.conns.get(c)
        if conn is None:
            conn = self.conns[c] = _Conn(c, key, self.max_items, self.out)
        return conn

    def _builder(self, c: int, key: int) -> TimelineBuilder:
        return self._conn(c, key).builder

    def _record(self, rec: Record) -> None:
        """One record to its connection's builder, noting the streams it created, the anomalies it raised, and what the merge replays."""
        key = rec.number
        conn = self._conn(rec.conn, key)
        bl = conn.builder
        ns, na = len(bl.streams), bl.anomaly_count
        bl.feed(rec)
        if len(bl.streams) != ns:
            conn.born.append(key)
        m = bl.anomaly_count
        if m != na:
            conn.raised.extend([key] * (m - na))
        ev = rec.event
        if ev.__class__ is Frame and ev[2] == "mcbp":
            raw = ev[1]
            magic, op = raw[0], raw[1]
            if magic in _CLIENT_RESPONSES:
                conn.control.append(rec)
            elif magic in _REQUESTS:
                if op in EXPECTS_RESPONSE:
                    conn.control.append(rec)
                elif op == _SNAPSHOT_MARKER and raw[4] != _MARKER_V1_EXTRAS:  # a v2 marker: may carry the purge seqno
                    conn.markers[key] = rec

    def parts(self, max_items: int | None) -> Iterator[tuple[int, bytes]]:
        """Each connection's :class:`ConnPart`, pickled (``ck``, bytes)."""
        for ck, conn in self.conns.items():
            yield ck, pickle.dumps(conn.part(max_items), protocol=pickle.HIGHEST_PROTOCOL)


def merge_timelines(
    parts: list[ConnPart],
    frames_of: Callable[[list[int]], list[int]] | None = None,
    capture_sets: Mapping[str, int] | None = None,
) -> tuple[Timeline, dict[int, int]]:
    """:func:`dcpinspect.timeline.merge.merge_timelines` of parts whose seqno histories were compressed here (``capture_sets``: file -> set)."""
    return merge_parts(parts, frames_of, rises=_unhistory, capture_sets=capture_sets)


def _rises_blob(ks: list[int], qs: list[int]) -> bytes:
    """(K, seqno) pairs where a vbucket's highest seqno rose, delta-coded and compressed (read by :func:`_unhistory`)."""
    mask = (1 << KSHIFT) - 1
    q = np.asarray(qs, np.uint64)
    k1 = np.array([k >> KSHIFT for k in ks], np.int64)
    k2 = np.array([k & mask for k in ks], np.int64)
    blob = np.concatenate((np.diff(k1, prepend=0), k2, np.diff(q, prepend=np.uint64(0)).view(np.int64)))
    return zlib.compress(blob.tobytes(), 1)


def _unhistory(blob: bytes) -> tuple[Any, Any]:
    """The (keys, seqnos) of :func:`_rises_blob` (keys as an int64 array while they fit)."""
    a = np.frombuffer(zlib.decompress(blob), np.int64)
    n = len(a) // 3
    k1, k2, q = np.cumsum(a[:n]), a[n : 2 * n], np.cumsum(a[2 * n :].view(np.uint64))
    if not n or int(k1.max()) < 1 << (63 - KSHIFT):
        return (k1 << KSHIFT) | k2, q
    return [x << KSHIFT | y for x, y in zip(k1.tolist(), k2.tolist(), strict=True)], q
