"""The failover branch tree of each vbucket, and why each rollback happened.

Every failover log seen (a stream request's success, a failover-log request's
answer) is merged into a per-vbucket tree of branches (kv_engine's
docs/dcp/documentation/commands/failover-log.md and rollback.md): an entry
is a branch from its seqno, first seen in some log, and cut by the first
later log that no longer lists it.  Each rollback is then
explained by replaying the producer's rule,
:func:`~dcpinspect.protocol.rules.rollback_decision`, on what the capture
showed of its inputs.  Pure: frame numbers and seqnos in, text and numbers out.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import Any

from ..protocol.rules import MAX_SEQNO, client_purge_seqno, from_latest, rollback_decision
from .model import Attempt, Branch, Stream

__all__ = ["FailoverHistory", "failover_log", "rollback_loop"]

_FIRST = itemgetter(0)
Log = list[tuple[int, int]]  # (uuid, seqno), newest first


class FailoverHistory:
    """What the rollback rule reads, per vbucket: failover logs, branches, high and purge seqnos, the highest seqno seen."""

    def __init__(self) -> None:
        self.branches: dict[int, list[Branch]] = {}  # vbucket -> branches in order of first sight
        self.logs: dict[int, list[tuple[int, Log]]] = {}  # vbucket -> [(frame, log)]
        self.high: dict[int, tuple[int, int]] = {}  # vbucket -> (frame, high seqno) from GET_ALL_VB_SEQNOS
        self.purge: dict[int, tuple[int, int]] = {}  # vbucket -> (frame, purge seqno) from v2.2 markers
        self._known: dict[int, dict[int, Branch]] = {}  # vbucket -> uuid -> its branch
        self._uncut: dict[int, list[Branch]] = {}  # vbucket -> the branches no log has cut yet, in order of first sight
        self._unordered: set[int] = set()  # vbuckets whose logs were not fed in frame order (no bisecting those)
        # vbucket -> [highest last seqno of its ended streams, its streams not ended yet]: the highest seqno seen
        # on a vbucket without a scan of every stream (an ended stream takes no more items: folded in once)
        self._streams: dict[int, list[Any]] = {}
        self._elsewhere: dict[int, int] = {}  # vbucket -> highest item seqno seen outside this builder
        # rollback attempts the rule does not explain yet (id() -> (stream, attempt)): a later log may
        self._unexplained: dict[int, tuple[Stream, Attempt]] = {}

    @property
    def unexplained(self) -> list[Attempt]:
        """The rollbacks the rule does not explain (yet)."""
        return [a for _s, a in self._unexplained.values()]

    def add_stream(self, s: Stream) -> None:
        """Follow ``s``'s last seqno for the highest seqno seen on its vbucket."""
        self._streams.setdefault(s.vbucket, [0, []])[1].append(s)

    def observe_seqno(self, vb: int, seqno: int) -> None:
        """Note an item seqno of ``vb`` seen outside this history's streams (another connection's builder)."""
        if seqno > self._elsewhere.get(vb, -1):
            self._elsewhere[vb] = seqno

    def observe_log(self, vb: int, frame: int, log: Log) -> None:
        """Merge the failover log ``log`` of ``vb`` (seen at ``frame``) into its branches."""
        logs = self.logs.setdefault(vb, [])
        if logs and frame < logs[-1][0]:
            self._unordered.add(vb)
        logs.append((frame, log))
        branches = self.branches.setdefault(vb, [])
        known = self._known.setdefault(vb, {})
        uncut = self._uncut.setdefault(vb, [])
        for uuid, seqno in reversed(log):  # oldest first: order of first sight within one log
            if uuid not in known:
                b = Branch(uuid, seqno, frame, len(branches))
                branches.append(b)
                known[uuid] = b
                uncut.append(b)
        present = {u for u, _ in log}
        kept = []  # at most len(log): the work per log does not grow with the branches seen
        for b in uncut:
            if b.uuid in present:
                kept.append(b)
                continue
            b.cut_frame = frame
            # the newest entry whose branch point is below b's removed it
            b.cut_by = next((u for u, s in log if s < b.seqno), None)
        self._uncut[vb] = kept

    def explain(self, s: Stream, a: Attempt) -> None:
        """Replay the producer's rule on what was seen, and say what it predicts (``a.explanation``, ``a.predicted``).

        The failover log is the last one seen before the rollback; when that
        one does not give the observed seqno and a log was seen after it (the
        retry's success: the producer's log at that moment, e.g. after a
        failover), the rule is replayed on that one too.  Unknown inputs are
        bracketed rather than guessed: the high seqno H is tried at the
        highest seqno seen for the vbucket and at 2^64-1, the purge seqno P
        (when no v2.2 marker showed it) at 0 and just above the start seqno
        (where that is not above H),
        and for a stream of some collections only (a filter, or a legacy
        stream) the high seqno M of those collections (the purge exemption) at
        0 and as if there were none; a prediction is made only when the
        bracket agrees.  The request goes through the rule as the producer
        takes it: a FromLatest request starts at the high seqno tried, and the
        client's purge seqno is its value's ``purge_seqno`` string.
        """
        logs = self.logs.get(s.vbucket) or []
        at = a.response_frame or a.frame
        if s.vbucket in self._unordered:
            before = [e for e in logs if e[0] < at][-1:]
            after = [e for e in logs if e[0] > at][:1]
        else:  # the logs in frame order (the rule): bisect, no scan of every log of the vbucket
            i, j = bisect_left(logs, at, key=_FIRST), bisect_right(logs, at, key=_FIRST)
            before, after = logs[max(0, i - 1) : i], logs[j : j + 1]
        candidates = [(before[-1][1], "")] if before else []
        if after:
            why = ": the producer's log had changed since the one seen before" if before else ""
            candidates.append((after[0][1], f" (using the failover log seen later, at frame {after[0][0]}{why})"))
        if not candidates:
            a.explanation = "cannot replay the rule: no failover log of this vbucket was seen"
            self._unexplained[id(a)] = (s, a)
            return
        results = [self._replay(s, a, table, source) for table, source in candidates]
        explanation, predicted, matched = next((r for r in results if r[2]), results[0])
        a.explanation, a.predicted = explanation, predicted
        if matched:
            self._unexplained.pop(id(a), None)
        else:
            self._unexplained[id(a)] = (s, a)

    def explain_again(self) -> None:
        """Explain again the rollbacks still unexplained whose vbucket has a log now (one seen only after a rollback can)."""
        for st, at in list(self._unexplained.values()):
            if at.outcome == "rollback" and self.logs.get(st.vbucket):
                self.explain(st, at)

    def _replay(self, s: Stream, a: Attempt, table: Log, source: str) -> tuple[str, int | None, bool]:
        """(explanation, predicted rollback seqno, whether the rule gives the observed seqno) for one failover log."""
        vb = s.vbucket
        high = self.high.get(vb)
        seen = max(self._seen(vb), self._elsewhere.get(vb, 0))
        highs = [high[1]] if high else [max(seen, table[0][1]), MAX_SEQNO]
        purge = self.purge.get(vb)
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
                    tried.append((h, p, d))
        outcomes = {d for _h, _p, d in tried}
        observed = a.rollback_seqno
        matching = [(h, p, d) for h, p, d in tried if d.rollback and d.seqno == observed]
        if len(outcomes) == 1:
            (d,) = outcomes
            predicted = d.seqno if d.rollback else None
            if matching:
                return f"{d.reason}{source}", predicted, True
            what = f"predicts a rollback to {d.seqno}" if d.rollback else "predicts no rollback"
            return f"observed a rollback to {observed}, but the rule {what} from what was seen: {d.reason}{source}", predicted, False
        if matching and purge is None and all(p != 0 for _h, p, _d in matching):
            return (
                f"only a purge seqno above the start seqno {a.start} explains a rollback to {observed} "
                f"(the purge check of kv_engine's FailoverTable::needsRollback; the purge seqno was not observed){source}",
                None,
                True,
            )
        if matching:
            _h, _p, d = matching[0]
            return (
                f"consistent with the rule for some value of the inputs not observed (high seqno, purge seqno): {d.reason}{source}",
                None,
                True,
            )
        got = sorted({d.seqno for d in outcomes if d.rollback})
        return f"observed a rollback to {observed}; the rule gives {got or 'no rollback'} for the unobserved inputs{source}", None, False

    def _seen(self, vb: int) -> int:
        """The highest item seqno seen on ``vb`` by the streams added (0: none)."""
        entry = self._streams.get(vb)
        if entry is None:
            return 0
        if any(x.end is not None for x in entry[1]):
            entry[0] = max([entry[0], *(x.last_seqno or 0 for x in entry[1] if x.end is not None)])
            entry[1] = [x for x in entry[1] if x.end is None]
        return max([entry[0], *(x.last_seqno or 0 for x in entry[1])])


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
