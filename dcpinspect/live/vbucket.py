"""A vbucket's data as the simulator keeps it: history items, the collections manifest, the failover table.

:class:`VBucket` holds the history (a list of :class:`HistoryItem` in seqno order:
mutations, tombstones, sync-write prepares/commits/aborts, collection system
events; purged ones stay marked, as the persisted vbucket state still counts
them), the failover table (newest first, as kv_engine's ``FailoverTable``), the
purge seqno, the nodes holding it and each collection's high seqno as the
manifest keeps it.  :mod:`.cluster` changes them; the streams read them.
"""

from __future__ import annotations

import zlib
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ..protocol.enums import VBucketState

__all__ = ["MAX_FAILOVER_ENTRIES", "HistoryItem", "Manifest", "VBucket", "vbucket_for_key"]

#: kv_engine's max_failover_entries default
MAX_FAILOVER_ENTRIES = 25

_ACTIVE = int(VBucketState.ACTIVE)


def vbucket_for_key(key: bytes, vbuckets: int) -> int:
    """The vbucket a key hashes to (CRC32 as the SDKs compute it)."""
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % vbuckets


_SEQNO = attrgetter("seqno")


@dataclass(slots=True)
class HistoryItem:
    """One seqno of a vbucket's history.

    ``kind`` is ``mutation``, ``deletion``, ``expiration``, ``prepare``, ``commit``,
    ``abort`` or ``system``.  Commits carry the committed value and ``prepared_seqno``;
    system events carry ``event`` (a :class:`~dcpinspect.protocol.enums.SystemEvent`), ``scope_id``, ``manifest_uid`` and the
    collection/scope name in ``key``.
    """

    seqno: int
    kind: str
    key: bytes
    cid: int = 0
    value: bytes = b""
    datatype: int = 0
    cas: int = 0
    rev_seqno: int = 1
    flags: int = 0
    expiration: int = 0
    delete_time: int = 0
    prepared_seqno: int = 0
    durability: int = 1
    deleted: bool = False
    event: int = 0
    scope_id: int = 0
    manifest_uid: int = 0
    max_ttl: int | None = None
    #: removed by a purge (compaction): no longer backfilled, but it still counts for the vbucket's
    #: persisted state (max visible, high prepared/completed seqnos)
    purged: bool = False

    @property
    def dedup_key(self) -> tuple[Any, ...]:
        """Items sharing this key are deduplicated inside a snapshot (as a checkpoint deduplicates them).

        Prepares/aborts live in the prepared namespace, everything else in the
        committed one; system events are never deduplicated.
        """
        if self.kind == "system":
            return ("system", self.seqno)
        return ("prepared" if self.kind in ("prepare", "abort") else "committed", self.cid, self.key)

    @property
    def is_tombstone(self) -> bool:
        """Deletions, expirations, aborts and deleted commits (what compaction purges)."""
        return self.kind in ("deletion", "expiration", "abort") or (self.kind == "commit" and self.deleted)

    @property
    def visible(self) -> bool:
        """Committed items and system events (what a max visible seqno counts); prepares and aborts are not."""
        return self.kind not in ("prepare", "abort")


@dataclass
class Manifest:
    """The bucket's scopes and collections (ids 0-7 reserved, 0 = ``_default``)."""

    uid: int = 0
    scopes: dict[int, str] = field(default_factory=lambda: {0: "_default"})
    collections: dict[int, tuple[str, int, int | None]] = field(default_factory=lambda: {0: ("_default", 0, None)})
    next_id: int = 8

    def collection_id(self, name: str) -> int:
        """The id of a collection by name (``scope.collection`` or a bare name), or KeyError."""
        scope, _, coll = name.rpartition(".")
        for cid, (cname, sid, _ttl) in self.collections.items():
            if cname == coll and (not scope or self.scopes.get(sid) == scope):
                return cid
        raise KeyError(name)

    def scope_id(self, name: str) -> int:
        """The id of a scope by name, or KeyError."""
        for sid, sname in self.scopes.items():
            if sname == name:
                return sid
        raise KeyError(name)


@dataclass
class VBucket:
    """One vbucket: state, history, failover table (newest first), purge seqno, and the nodes holding it."""

    id: int
    state: int = _ACTIVE
    failover_log: list[tuple[int, int]] = field(default_factory=list)
    log: list[HistoryItem] = field(default_factory=list)
    #: the seqno of the newest tombstone (or completed prepare) a purge removed (kv_engine's purge seqno)
    purge_seqno: int = 0
    #: bumped whenever live streams must end (failover, rollback, state change)
    generation: int = 0
    #: the last seqno assigned (kept apart from the log: purged tombstones keep their seqno)
    high_seqno: int = 0
    #: [active node, replica nodes...] (-1: none); ``state`` is the state on the active node
    nodes: list[int] = field(default_factory=lambda: [0])
    #: collection id -> its high seqno as the manifest keeps it (every queued item moves it; purging never lowers it)
    collection_highs: dict[int, int] = field(default_factory=dict)

    @property
    def uuid(self) -> int:
        """The newest failover entry's UUID."""
        return self.failover_log[0][0]

    def add_failover_entry(self, uuid: int, seqno: int) -> None:
        """New branch: drop entries above ``seqno``, put it first, cap at :data:`MAX_FAILOVER_ENTRIES`."""
        kept = [(u, s) for u, s in self.failover_log if s <= seqno]
        self.failover_log = [(uuid, seqno), *kept][:MAX_FAILOVER_ENTRIES]

    def records(self, lo: int, hi: int) -> list[HistoryItem]:
        """The HistoryItems still stored (not purged) with lo < seqno <= hi, in seqno order (the log is: a bisection)."""
        log = self.log
        first = bisect_right(log, lo, key=_SEQNO)
        last = bisect_right(log, hi, lo=first, key=_SEQNO)
        return [r for r in log[first:last] if not r.purged]

    def collection_high_seqno(self, cids: Iterable[int]) -> int:
        """The highest seqno the manifest records for any of these collections (documents, sync writes, system events)."""
        return max((self.collection_highs.get(c, 0) for c in cids), default=0)

    def max_visible_seqno(self, upto: int, cids: Iterable[int] | None = None) -> int:
        """The highest seqno <= ``upto`` of a visible item (committed items and system events), optionally of some collections only."""
        want = None if cids is None else set(cids)
        for r in reversed(self.log):
            if r.seqno <= upto and r.visible and (want is None or r.cid in want):
                return r.seqno
        return 0
