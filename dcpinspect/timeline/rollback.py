"""The failover branch trees of each vbucket, one per history, and why each rollback happened.

Every failover log seen (a stream request's success, a failover-log request's
answer) belongs to one *history* of its vbucket (kv_engine's
docs/dcp/documentation/commands/failover-log.md and rollback.md), and each
history is a tree of branches: an entry is a branch from its seqno, first
seen in some log of the history, and cut by the first later log of the
history that no longer lists it.  Each rollback is then explained by
replaying the producer's rule,
:func:`~dcpinspect.protocol.rules.rollback_decision`, on what the capture
showed of its inputs within the stream's history.  Pure: frame numbers and
seqnos in, text and numbers out.

Rules:

1. Histories never cross capture sets: a connection belongs to one set
   (:meth:`FailoverHistory.connection`; set 1 when never told), and its logs
   only ever meet the logs of connections of the same set.
2. Within a set, logs of one vbucket are one history only when they share
   history: a common ``(uuid, seqno)`` entry.  A log sharing entries with
   several histories joins them (union-find); otherwise it starts a new one
   (another cluster or bucket recorded in the same set).
3. A stream's history is that of its connection's own failover logs of the
   vbucket; else the history whose logs hold the requested vb uuid; else none,
   and the explanation says so (another cluster's log is never read for it:
   a log of the stream's own connection seen later explains it then).
4. What the rule reads besides the log - the high seqno (GET_ALL_VB_SEQNOS),
   the purge seqno (v2.2 markers) and the highest item seqno seen - is taken
   from the connections of the same set whose logs of the vbucket are in the
   stream's history (or who showed no log of it).
5. The work per log is bounded as for one history: at most its length in
   entries; only a log that joins histories costs the joined histories'
   logs (they are replayed in the order they came, as if they had always
   been one, so the tree does not depend on when the join was seen).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from ..protocol.rules import MAX_SEQNO, client_purge_seqno, from_latest, rollback_decision
from .model import Attempt, Branch, HistoryKey, Stream

__all__ = ["UNEXPLAINED", "FailoverHistory", "explained", "failover_log", "hex_uuid", "hex_uuids", "rollback_loop"]

_FIRST = itemgetter(0)
Log = list[tuple[int, int]]  # (uuid, seqno), newest first
Scope = tuple[int, int]  # (capture set, vbucket)


#: how the explanation of a rollback starts when the rule, replayed on what was seen, does not (yet) give its seqno
UNEXPLAINED = ("observed a rollback to", "cannot replay the rule")


def explained(a: Attempt) -> bool:
    """Whether ``a`` is a rollback the rule, replayed on what was seen, gives (its explanation does not start with :data:`UNEXPLAINED`)."""
    return a.outcome == "rollback" and bool(a.explanation) and not a.explanation.startswith(UNEXPLAINED)


def hex_uuid(uuid: int) -> str:
    """A vbucket uuid as every text of the timeline writes it: ``0x`` and 16 hex digits."""
    return f"0x{uuid:016x}"


class _History:
    """One history of a (capture set, vbucket): its logs in the order fed, and its branches (union-find node)."""

    __slots__ = ("born", "branches", "conns", "known", "logs", "parent", "seq", "uncut", "unordered")

    def __init__(self, born: int) -> None:
        self.parent = self
        self.born = born  # order of creation (the oldest of those joined): the histories' numbering
        self.logs: list[tuple[int, Log]] = []  # (frame, log) in the order fed
        self.seq: list[int] = []  # the feed order of each log (a join replays both histories' logs in it)
        self.conns: list[int] = []  # the connection of each log
        self.branches: list[Branch] = []  # in order of first sight
        self.known: dict[int, Branch] = {}  # uuid -> its branch
        self.uncut: list[Branch] = []  # the branches no log has cut yet, in order of first sight
        self.unordered = False  # its logs were not fed in frame order (no bisecting them)

    def root(self) -> _History:
        h = self
        while h.parent is not h:
            h.parent = h.parent.parent
            h = h.parent
        return h

    def add(self, seq: int, conn: int, frame: int, log: Log) -> None:
        """Merge ``log`` (seen at ``frame``) into the branches: at most ``len(log)`` work, whatever the branches seen."""
        if self.logs and frame < self.logs[-1][0]:
            self.unordered = True
        self.logs.append((frame, log))
        self.seq.append(seq)
        self.conns.append(conn)
        branches, known = self.branches, self.known
        for uuid, seqno in reversed(log):  # oldest first: order of first sight within one log
            if uuid not in known:
                b = Branch(uuid, seqno, frame, len(branches), conn=conn)
                branches.append(b)
                known[uuid] = b
                self.uncut.append(b)
        present = {u for u, _ in log}
        kept = []
        for b in self.uncut:
            if b.uuid in present:
                kept.append(b)
                continue
            b.cut_frame = frame
            # the newest entry whose branch point is below b's removed it
            b.cut_by = next((u for u, s in log if s < b.seqno), None)
        self.uncut = kept

    def join(self, other: _History) -> None:
        """Take ``other`` in: both histories' logs replayed in the order they were fed."""
        fed = sorted(zip(self.seq + other.seq, self.conns + other.conns, self.logs + other.logs, strict=True), key=_FIRST)
        self.logs, self.seq, self.conns, self.branches, self.known, self.uncut, self.unordered = [], [], [], [], {}, [], False
        for seq, conn, (frame, log) in fed:
            self.add(seq, conn, frame, log)
        self.born = min(self.born, other.born)
        other.parent = self
        other.logs, other.seq, other.conns, other.branches, other.known, other.uncut = [], [], [], [], {}, []

    def around(self, at: int) -> tuple[list[tuple[int, Log]], list[tuple[int, Log]]]:
        """The last log before frame ``at`` and the first after it (each a list of at most one)."""
        logs = self.logs
        if self.unordered:
            return [e for e in logs if e[0] < at][-1:], [e for e in logs if e[0] > at][:1]
        i, j = bisect_left(logs, at, key=_FIRST), bisect_right(logs, at, key=_FIRST)  # no scan of every log
        return logs[max(0, i - 1) : i], logs[j : j + 1]


class _Scope:
    """What one (capture set, vbucket) holds: its histories and the rule's other inputs, per connection."""

    __slots__ = ("elsewhere", "entries", "high", "histories", "purge", "streams", "uuids")

    def __init__(self) -> None:
        self.histories: list[_History] = []  # the roots, in order of creation
        self.entries: dict[tuple[int, int], _History] = {}  # (uuid, seqno) -> a history that showed it (its root: find)
        self.uuids: dict[int, _History] = {}  # uuid -> the latest history that showed it
        self.high: dict[int, tuple[int, int]] = {}  # conn -> (frame, high seqno) from GET_ALL_VB_SEQNOS
        self.purge: dict[int, tuple[int, int]] = {}  # conn -> (frame, purge seqno) from v2.2 markers
        # conn -> [highest last seqno of its ended streams, its streams not ended yet]: the highest seqno seen without a
        # scan of every stream (an ended stream takes no more items: folded in once)
        self.streams: dict[int, list[Any]] = {}
        self.elsewhere: dict[int | None, int] = {}  # conn (None: unknown) -> highest item seqno seen outside this builder


class FailoverHistory:
    """What the rollback rule reads, per (capture set, vbucket) and history: failover logs, branches, high and purge seqnos, the highest seqno seen."""

    def __init__(self) -> None:
        self.high: dict[int, tuple[int, int]] = {}  # vbucket -> (frame, high seqno) last seen, any set (the timeline's)
        self._sets: dict[int, int] = {}  # conn -> its capture set
        self._scopes: dict[Scope, _Scope] = {}
        self._own: dict[tuple[int, int], _History] = {}  # (conn, vbucket) -> the history of its latest log of it
        self._fed = 0  # logs fed so far (each log's feed order)
        # rollback attempts the rule does not explain yet (id() -> (stream, attempt)): a later log may
        self._unexplained: dict[int, tuple[Stream, Attempt]] = {}

    @property
    def unexplained(self) -> list[Attempt]:
        """The rollbacks the rule does not explain (yet)."""
        return [a for _s, a in self._unexplained.values()]

    def connection(self, conn: int, capture_set: int) -> None:
        """Put connection ``conn`` in capture set ``capture_set`` (before anything of it is observed)."""
        self._sets[conn] = capture_set

    def _scope(self, conn: int | None, vb: int, capture_set: int | None = None) -> _Scope:
        cs = capture_set if capture_set is not None else self._sets.get(conn, 1) if conn is not None else 1
        sc = self._scopes.get((cs, vb))
        if sc is None:
            sc = self._scopes[(cs, vb)] = _Scope()
        return sc

    def add_stream(self, s: Stream) -> None:
        """Follow ``s``'s last seqno for the highest seqno seen on its vbucket."""
        self._scope(s.conn, s.vbucket).streams.setdefault(s.conn, [0, []])[1].append(s)

    def observe_seqno(self, vb: int, seqno: int, conn: int | None = None, capture_set: int | None = None) -> None:
        """Note an item seqno of ``vb`` seen outside this history's streams (another connection's builder: ``conn``, if known)."""
        seen = self._scope(conn, vb, capture_set).elsewhere
        if seqno > seen.get(conn, -1):
            seen[conn] = seqno

    def observe_high(self, conn: int, vb: int, frame: int, seqno: int) -> None:
        """The high seqno of ``vb`` as connection ``conn`` was told it (GET_ALL_VB_SEQNOS) at ``frame``."""
        self._scope(conn, vb).high[conn] = self.high[vb] = (frame, seqno)

    def observe_purge(self, conn: int, vb: int, frame: int, seqno: int) -> None:
        """The purge seqno of ``vb`` as a marker on connection ``conn`` showed it at ``frame``."""
        self._scope(conn, vb).purge[conn] = (frame, seqno)

    def observe_log(self, vb: int, frame: int, log: Log, conn: int = 0) -> None:
        """Merge the failover log ``log`` of ``vb`` (seen at ``frame`` on ``conn``) into its history (rules 1, 2, 5)."""
        sc = self._scope(conn, vb)
        found: dict[int, _History] = {}
        for e in log:
            h = sc.entries.get(e)
            if h is not None:
                r = h.root()
                found[id(r)] = r
        if not found:
            h = _History(self._fed)
            sc.histories.append(h)
        else:
            h, *rest = sorted(found.values(), key=lambda x: x.born)
            for other in rest:
                h.join(other)
            if rest:
                sc.histories = [x for x in sc.histories if x.parent is x]
        h.add(self._fed, conn, frame, log)
        self._fed += 1
        for e in log:
            sc.entries[e] = h
            sc.uuids[e[0]] = h
        self._own[(conn, vb)] = h

    def history_of(self, s: Stream, a: Attempt) -> _History | None:
        """The history stream ``s`` belongs to when it made ``a`` (rule 3); ``None``: none seen."""
        own = self._own.get((s.conn, s.vbucket))
        if own is not None:
            return own.root()
        sc = self._scope(s.conn, s.vbucket)
        h = sc.uuids.get(a.uuid)
        return None if h is None else h.root()

    def explain(self, s: Stream, a: Attempt) -> None:
        """Replay the producer's rule on what was seen in the stream's history, and say what it predicts (``a.explanation``, ``a.predicted``).

        The failover log is the history's last one seen before the rollback;
        when that one does not give the observed seqno and a log was seen
        after it (the retry's success: the producer's log at that moment,
        e.g. after a failover), the rule is replayed on that one too.  Unknown
        inputs are bracketed rather than guessed: the high seqno H is tried at
        the highest seqno seen for the vbucket and at 2^64-1, the purge seqno
        P (when no v2.2 marker showed it) at 0 and just above the start seqno
        (where that is not above H),
        and for a stream of some collections only (a filter, or a legacy
        stream) the high seqno M of those collections (the purge exemption) at
        0 and as if there were none; a prediction is made only when the
        bracket agrees.  The request goes through the rule as the producer
        takes it: a FromLatest request starts at the high seqno tried, and the
        client's purge seqno is its value's ``purge_seqno`` string.

        A rollback the rule does not give is never left as a bare
        contradiction: with only a log seen *before* it, the explanation
        says it is not judged yet (the producer's log at that moment - after
        a failover, a newer one - was not seen; a retry's success shows it)
        and what the rule gives with the old log; with the producer's log
        seen too, it says that the rule predicts something else.
        """
        h = self.history_of(s, a)
        before, after = h.around(a.response_frame or a.frame) if h is not None else ([], [])
        candidates = [(before[-1][1], "")] if before else []
        if after:
            why = ": the producer's log had changed since the one seen before" if before else ""
            candidates.append((after[0][1], f" (using the failover log seen later, at frame {after[0][0]}{why})"))
        if h is None or not candidates:
            a.log_frame = None
            others = len(self._scope(s.conn, s.vbucket).histories)
            a.explanation = (
                f"cannot replay the rule: no failover log of this stream's history was seen (its connection showed none of "
                f"vbucket {s.vbucket}, and vb uuid {hex_uuid(a.uuid)} is in no log of its capture set)"
                if others
                else "cannot replay the rule: no failover log of this vbucket was seen"
            )
            self._unexplained[id(a)] = (s, a)
            return
        results = [(self._replay(s, a, table, source, h), bool(source)) for table, source in candidates]
        (explanation, predicted, matched), later = next((r for r in results if r[0][2]), results[0])
        if not matched:
            observed = f"observed a rollback to {a.rollback_seqno}"
            if before and not after:  # the producer's log at the rollback is not known yet: say so, judge nothing
                explanation = (
                    f"{observed}; not judged yet: the producer's failover log at that moment was not seen (a successful "
                    f"retry returns it); the last one seen before is out of date if a new branch started since (a "
                    f"failover), and with it {explanation}"
                )
            else:
                explanation = f"{observed}, but {explanation}"
        a.explanation, a.predicted = explanation, predicted
        a.log_frame = after[0][0] if later else None
        if matched:
            self._unexplained.pop(id(a), None)
        else:
            self._unexplained[id(a)] = (s, a)

    def explain_again(self) -> None:
        """Explain again the rollbacks still unexplained whose history has a log now (one seen only after a rollback can)."""
        for st, at in list(self._unexplained.values()):
            if at.outcome == "rollback" and self.history_of(st, at) is not None:
                self.explain(st, at)

    def _inputs(self, s: Stream, h: _History) -> tuple[tuple[int, int] | None, tuple[int, int] | None, int]:
        """(high seqno, purge seqno, highest item seqno seen) of ``s``'s vbucket from the connections of its history (rule 4)."""
        vb, sc, own = s.vbucket, self._scope(s.conn, s.vbucket), self._own

        def ours(conn: int | None) -> bool:
            o = None if conn is None else own.get((conn, vb))
            return o is None or o.root() is h

        high = max((v for c, v in sc.high.items() if ours(c)), default=None)
        purge = max((v for c, v in sc.purge.items() if ours(c)), default=None)
        seen = max((_seen(e) for c, e in sc.streams.items() if ours(c)), default=0)
        seen = max([seen, *(q for c, q in sc.elsewhere.items() if ours(c))])
        return high, purge, seen

    def _replay(self, s: Stream, a: Attempt, table: Log, source: str, hist: _History) -> tuple[str, int | None, bool]:
        """(explanation, predicted rollback seqno, whether the rule gives the observed seqno) for one failover log.

        When the rule does not give the observed seqno the explanation is only
        what the rule gives (``the rule predicts ...``): :meth:`explain` says
        what was observed and why the two differ.
        """
        high, purge, seen = self._inputs(s, hist)
        highs = [high[1]] if high else [max(seen, table[0][1]), MAX_SEQNO]
        client_purge = client_purge_seqno(a.value) or 0
        filtered: list[int | None] = [None] if a.filtered is False else [None, 0]
        tried = []
        for h in highs:
            start, snap_start, snap_end, uuid = from_latest(
                flags=a.flags,
                start=a.start,
                snap_start=a.snap_start,
                snap_end=a.snap_end,
                vb_uuid=a.uuid,
                high_seqno=h,
                latest_uuid=table[0][0],
            )
            # the purge seqno never exceeds the high seqno: just above the start only where there is room
            for p in [purge[1]] if purge else [0, start + 1] if start < h else [0]:
                for m in filtered:
                    d = rollback_decision(
                        start=start,
                        snap_start=snap_start,
                        snap_end=snap_end,
                        vb_uuid=uuid,
                        flags=a.flags,
                        failover_log=table,
                        high_seqno=h,
                        purge_seqno=p,
                        client_purge_seqno=client_purge,
                        filtered_max_seqno=m,
                    )
                    tried.append((h, p, d, uuid))
        outcomes = {d for _h, _p, d, _u in tried}
        observed = a.rollback_seqno
        matching = [(h, p, d, u) for h, p, d, u in tried if d.rollback and d.seqno == observed]
        if len(outcomes) == 1:
            (d,) = outcomes
            reason = hex_uuids(d.reason, (t[3] for t in tried))
            predicted = d.seqno if d.rollback else None
            if matching:
                return f"{reason}{source}", predicted, True
            what = f"predicts a rollback to {d.seqno}" if d.rollback else "predicts no rollback"
            return f"the rule {what} from what was seen: {reason}{source}", predicted, False
        if matching and purge is None and all(p != 0 for _h, p, _d, _u in matching):
            return (
                f"only a purge seqno above the start seqno {a.start} explains a rollback to {observed} "
                f"(the purge check of kv_engine's FailoverTable::needsRollback; the purge seqno was not observed){source}",
                None,
                True,
            )
        if matching:
            d = matching[0][2]
            return (
                "consistent with the rule for some value of the inputs not observed (high seqno, purge seqno): "
                f"{hex_uuids(d.reason, (t[3] for t in tried))}{source}",
                None,
                True,
            )
        got = [f"a rollback to {q}" for q in sorted({d.seqno for d in outcomes if d.rollback})]
        if any(not d.rollback for d in outcomes):
            got.insert(0, "no rollback")
        return (
            f"the rule gives {' or '.join(got)}, never a rollback to {observed}, for every value tried of the inputs "
            f"not observed (high seqno, purge seqno){source}",
            None,
            False,
        )

    def parts(self) -> tuple[dict[int, list[Branch]], dict[int, list[tuple[int, Log]]], dict[HistoryKey, list[tuple[int, Log]]]]:
        """(vbucket -> its branches of every set and history, vbucket -> its logs, (set, vbucket, history) -> that history's logs).

        Numbers the histories of each (capture set, vbucket) 1.. in order of
        first sight and tags their branches; the branches of a vbucket come
        set by set, history by history, each in order of first sight, and
        their ``order`` is their index in that list (one lane each).
        """
        branches: dict[int, list[Branch]] = {}
        logs: dict[int, list[tuple[int, Log]]] = {}
        per_history: dict[HistoryKey, list[tuple[int, Log]]] = {}
        for (cs, vb), sc in sorted(self._scopes.items()):
            for n, h in enumerate(sorted(sc.histories, key=lambda x: x.born), 1):
                for b in h.branches:
                    b.capture_set, b.history = cs, n
                branches.setdefault(vb, []).extend(h.branches)
                logs.setdefault(vb, []).extend(h.logs)
                per_history[(cs, vb, n)] = h.logs
        for xs in logs.values():
            xs.sort(key=_FIRST)
        for bs in branches.values():  # one lane each: histories never share an order
            for i, b in enumerate(bs):
                b.order = i
        return branches, logs, per_history


def _seen(entry: list[Any]) -> int:
    """The highest item seqno of one connection's streams of a vbucket (0: none); ended streams folded in once."""
    if any(x.end is not None for x in entry[1]):
        entry[0] = max([entry[0], *(x.last_seqno or 0 for x in entry[1] if x.end is not None)])
        entry[1] = [x for x in entry[1] if x.end is None]
    return max([entry[0], *(x.last_seqno or 0 for x in entry[1])])


def hex_uuids(text: str, uuids: Iterable[int]) -> str:
    """``text`` (a rule's reason) with ``uuid N`` of each of ``uuids`` written as every timeline text writes it (:func:`hex_uuid`)."""
    for u in set(uuids):
        text = text.replace(f"uuid {u} ", f"uuid {hex_uuid(u)} ").replace(f"uuid {u})", f"uuid {hex_uuid(u)})")
    return text


def rollback_loop(attempts: list[Attempt]) -> tuple[list[int], str] | None:
    """(the frames, what) when the last three rollbacks of a stream make a loop: to 0 each time, or the same request."""
    rolls: list[Attempt] = []  # the last three rollbacks (from the end: no scan of every attempt of a long loop)
    for a in reversed(attempts):
        if a.outcome == "rollback":
            rolls.append(a)
            if len(rolls) == 3:
                break
    if len(rolls) < 3:
        return None
    rolls.reverse()
    frames = [a.frame for a in rolls]
    if all(a.rollback_seqno == 0 for a in rolls):
        return frames, "rolled back to 0 three times in a row"
    if len({(a.start, a.uuid, a.snap_start, a.snap_end) for a in rolls}) == 1:
        return frames, "the same request rolled back three times"
    return None


def failover_log(raw: Any) -> Log:
    """A dissected ``failover_log`` value as ``(uuid, seqno)`` pairs (entries that are not both ints are left out)."""
    if not isinstance(raw, list):
        return []
    out = []
    for e in raw:
        if isinstance(e, dict) and isinstance(e.get("vb_uuid"), int) and isinstance(e.get("vb_seqno"), int):
            out.append((e["vb_uuid"], e["vb_seqno"]))
    return out
