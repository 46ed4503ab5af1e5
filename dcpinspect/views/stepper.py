"""The teaching mode: a session replayed frame by frame, with what each frame changed in its stream's state.

:class:`StepperModel` feeds the records one at a time to one
:class:`~dcpinspect.timeline.builder.TimelineBuilder` (the state after frame *n*
is what the builder knew then; there is no second parser).  After each frame
it compares a small signature of the timeline with the one before; one differ
per part of a stream (its attempts, snapshots, items, end) and one per part of
the timeline (failover logs, branches, flow control, stalls, noops, anomalies,
the connections' negotiation) turn what grew into :class:`Change` sentences.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..capture.read import read_records
from ..flows.records import Record
from ..protocol import spec
from ..timeline import Stream, Timeline, TimelineBuilder, stream_label
from ..timeline.rollback import explained
from ..wire.render import annotate, annotate_html
from .labels import seqno_label

__all__ = ["Change", "Step", "StepperModel", "records_of"]


@dataclass(frozen=True)
class Change:
    """One thing a frame changed: a ``kind`` and a sentence.

    Kinds: request, accepted, rollback, judged, error, snapshot, item, end,
    failover-log, branch, ack, sent, stall, noop, anomaly, session.
    ``judged``: an earlier rollback explained again, by what this frame
    showed (the producer's failover log at the rollback, which only the
    retry's success returns after a failover).
    """

    kind: str
    text: str


@dataclass
class Step:
    """One frame of a replayed session and its effect."""

    index: int
    record: Record
    changes: list[Change]
    stream: int | None  # index into the final timeline's streams of the stream this frame touched
    state: dict[str, Any] = field(default_factory=dict)  # that stream's state after the frame

    @property
    def frame(self) -> int:
        """The frame (record) number."""
        return self.record.number

    def annotation_html(self) -> str:
        """The frame's grid and breakdown."""
        return annotate_html(self.record.event, context=self.record.context)


# ---------------------------------------------------------------------------
# what a frame changed: signatures and one differ per part


class _StreamSig(NamedTuple):
    attempts: int
    outcome: str | None  # the last attempt's
    snapshots: int
    items: int
    ended: bool
    complete: bool | None  # the last snapshot's
    judged: tuple[str, ...] = ()  # the explanation of each rollback, in order: a later frame may explain one again


_NEW_STREAM = _StreamSig(0, None, 0, 0, False, None)


@dataclass(frozen=True)
class _Signature:
    """What a timeline holds, in counts: enough to tell what one more frame changed."""

    streams: dict[int, _StreamSig]  # by id() of the stream
    logs: dict[int, int]
    branches: dict[int, list[tuple[int, int | None]]]  # vbucket -> (uuid, cut frame)
    flow: int
    stalls: int
    noops: int
    anomalies: int
    conns: dict[int, tuple[Any, ...]]


def _signature(t: Timeline) -> _Signature:
    return _Signature(
        streams={
            id(s): _StreamSig(
                len(s.attempts),
                s.attempts[-1].outcome if s.attempts else None,
                len(s.snapshots),
                len(s.items),
                s.end is not None,
                s.snapshots[-1].complete if s.snapshots else None,
                tuple(a.explanation for a in s.attempts if a.outcome == "rollback"),
            )
            for s in t.streams
        },
        logs={vb: len(v) for vb, v in t.logs.items()},
        branches={vb: [(b.uuid, b.cut_frame) for b in v] for vb, v in t.branches.items()},
        flow=len(t.flow),
        stalls=len(t.stalls),
        noops=len(t.noops),
        anomalies=len(t.anomalies),
        conns={c: (i.name, tuple(i.features), tuple(i.controls.items()), i.buffer_size, i.bucket) for c, i in t.connections.items()},
    )


def _snap_kind(flags: int) -> str:
    names = [name for bit, name in spec.SNAPSHOT_FLAGS.items() if flags & bit]
    return "|".join(names) or "none"


def _failover_log(entries: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"0x{u:016x}@{q}" for u, q in entries)


# --- the parts of a stream: (label, stream, signature before, signature after) -> changes


def _attempt_changes(label: str, s: Stream, old: _StreamSig, new: _StreamSig) -> list[Change]:
    out = []
    if new.attempts > old.attempts:
        a = s.attempts[-1]
        retry = " (retry)" if len(s.attempts) > 1 else ""
        text = f"{label}: stream requested{retry} from seqno {seqno_label(a.start)} to {seqno_label(a.end)}, uuid 0x{a.uuid:016x}"
        out.append(Change("request", text))
    if new.outcome != old.outcome and s.attempts:
        a = s.attempts[-1]
        if a.outcome == "success":
            out.append(Change("accepted", f"{label}: stream accepted"))
            out.append(Change("failover-log", f"vbucket {s.vbucket}: failover log replaced: [{_failover_log(a.failover_log)}]"))
        elif a.outcome == "rollback":
            why = f" - {a.explanation}" if a.explanation else ""
            out.append(Change("rollback", f"{label}: rollback to seqno {seqno_label(a.rollback_seqno)}{why}"))
        elif a.outcome == "error":
            out.append(Change("error", f"{label}: refused ({a.status_name})"))
    return out


def _judged_changes(label: str, s: Stream, old: _StreamSig, new: _StreamSig) -> list[Change]:
    """An earlier rollback whose explanation this frame changed: what the rule gives now, and with which log."""
    if old.judged == new.judged[: len(old.judged)]:
        return []
    out = []
    rollbacks = [a for a in s.attempts if a.outcome == "rollback"]
    for i, (was, now) in enumerate(zip(old.judged, new.judged, strict=False)):
        if was == now:
            continue
        a = rollbacks[i]
        retry = next((x for x in s.attempts if x.frame > a.frame), None)
        log = "the failover log seen before it" if a.log_frame is None else f"the failover log of frame {a.log_frame}"
        if retry is not None and a.log_frame is not None and retry.response_frame == a.log_frame:
            log = f"the failover log the retry returned (frame {a.log_frame})"
        if explained(a):
            verdict = f"now judged: the rule gives {seqno_label(a.rollback_seqno)} with {log}"
        else:
            verdict = "judged again, still not what the rule gives"
        out.append(
            Change("judged", f"{label}: the rollback to seqno {seqno_label(a.rollback_seqno)} (frame {a.response_frame}) {verdict} - {now}")
        )
    return out


def _snapshot_changes(label: str, s: Stream, old: _StreamSig, new: _StreamSig) -> list[Change]:
    if new.snapshots <= old.snapshots:
        return []
    sn = s.snapshots[-1]
    span = f"{seqno_label(sn.start)}-{seqno_label(sn.end)}"
    return [Change("snapshot", f"{label}: snapshot {span} opened ({_snap_kind(sn.flags)}, {sn.version})")]


def _item_changes(label: str, s: Stream, old: _StreamSig, new: _StreamSig) -> list[Change]:
    if new.items <= old.items:
        return []
    it = s.items[-1]
    cmd = spec.COMMANDS.get(it.opcode)
    snap = s.snapshots[it.snapshot] if it.snapshot >= 0 else None
    where = f" in snapshot {seqno_label(snap.start)}-{seqno_label(snap.end)}" if snap is not None else ""
    out = [Change("item", f"{label}: {cmd.name if cmd else hex(it.opcode)} seqno {seqno_label(it.seqno)} applied{where}")]
    if new.complete and not old.complete and new.snapshots == old.snapshots:
        out.append(Change("snapshot", f"{label}: snapshot complete"))
    return out


def _end_changes(label: str, s: Stream, old: _StreamSig, new: _StreamSig) -> list[Change]:
    if new.ended and not old.ended and s.end is not None:
        return [Change("end", f"{label}: stream ended ({s.end.get('name')})")]
    return []


_STREAM_DIFFERS = (_attempt_changes, _judged_changes, _snapshot_changes, _item_changes, _end_changes)


# --- the parts of the timeline: (signature before, after, timeline, changes so far) -> changes


def _log_changes(before: _Signature, after: _Signature, t: Timeline, so_far: list[Change]) -> list[Change]:
    if any(c.kind == "failover-log" for c in so_far):  # an accepted stream request said it already
        return []
    for vb, n in after.logs.items():  # one frame carries one vbucket's log
        if n > before.logs.get(vb, 0):
            return [Change("failover-log", f"vbucket {vb}: failover log replaced: [{_failover_log(t.logs[vb][-1][1])}]")]
    return []


def _branch_changes(before: _Signature, after: _Signature, t: Timeline, _so_far: list[Change]) -> list[Change]:
    out = []
    for vb, bs in after.branches.items():
        old = dict(before.branches.get(vb, []))
        for uuid, cut in bs:
            if uuid not in old:
                b = next(x for x in t.branches[vb] if x.uuid == uuid)
                out.append(Change("branch", f"vbucket {vb}: new branch 0x{uuid:016x} from seqno {seqno_label(b.seqno)}"))
            elif cut is not None and old[uuid] is None:
                out.append(Change("branch", f"vbucket {vb}: branch 0x{uuid:016x} cut from the history"))
    return out


def _flow_changes(before: _Signature, _after: _Signature, t: Timeline, _so_far: list[Change]) -> list[Change]:
    out = []
    for f in t.flow[before.flow :]:
        size = t.connections[f.conn].buffer_size if f.conn in t.connections else None
        of = f"{f.outstanding:,} of {size or '?'} outstanding"
        if f.event == "ack":
            out.append(Change("ack", f"conn {f.conn}: buffer acked {f.size:,} bytes, {of}"))
        else:
            out.append(Change("sent", f"conn {f.conn}: {f.size:,} bytes counted against the buffer, {of}"))
    return out


def _stall_changes(before: _Signature, _after: _Signature, t: Timeline, _so_far: list[Change]) -> list[Change]:
    out = []
    for st in t.stalls[before.stalls :]:
        took = "an unknown time" if st["duration_ns"] is None else f"{st['duration_ns'] / 1e9:.3f} s"
        out.append(Change("stall", f"conn {st['conn']}: stall since frame {st['frame']} ended after {took}"))
    return out


def _noop_changes(before: _Signature, _after: _Signature, t: Timeline, _so_far: list[Change]) -> list[Change]:
    out = []
    for n in t.noops[before.noops :]:
        took = "an unknown time" if n["rtt_ns"] is None else f"{n['rtt_ns'] / 1e6:.3f} ms"
        out.append(Change("noop", f"conn {n['conn']}: noop answered in {took}"))
    return out


def _anomaly_changes(before: _Signature, _after: _Signature, t: Timeline, _so_far: list[Change]) -> list[Change]:
    return [Change("anomaly", f"{an.kind}: {an.message}") for an in t.anomalies[before.anomalies :]]


def _session_changes(before: _Signature, after: _Signature, t: Timeline, _so_far: list[Change]) -> list[Change]:
    out = []
    for c, sig in after.conns.items():
        old = before.conns.get(c)
        if old == sig:
            continue
        name, features, controls, buffer_size, bucket = sig
        if old is None and not (name or features or controls or buffer_size is not None or bucket):
            continue  # a connection seen for the first time, nothing negotiated yet
        info = t.connections[c]
        bits = [f"DCP_OPEN {info.name!r}" if info.name else "", f"buffer {info.buffer_size}" if info.buffer_size else ""]
        if info.controls:
            k, (v, status) = list(info.controls.items())[-1]
            bits.append(f"control {k}={v} ({status})")
        if info.features:
            bits.append("features " + ", ".join(info.features))
        out.append(Change("session", f"conn {c}: " + "; ".join(b for b in bits if b)))
    return out


_TIMELINE_DIFFERS = (_log_changes, _branch_changes, _flow_changes, _stall_changes, _noop_changes, _anomaly_changes, _session_changes)


def _diff(before: _Signature, t: Timeline) -> tuple[list[Change], Stream | None, _Signature]:
    """What changed from ``before`` to ``t``: the changes, the stream touched last (if any), and ``t``'s signature."""
    after = _signature(t)
    out: list[Change] = []
    touched: Stream | None = None
    for s in t.streams:
        old = before.streams.get(id(s), _NEW_STREAM)
        new = after.streams[id(s)]
        if old == new and id(s) in before.streams:
            continue
        touched = s
        label = stream_label(s)
        for stream_differ in _STREAM_DIFFERS:
            out += stream_differ(label, s, old, new)
    for differ in _TIMELINE_DIFFERS:
        out += differ(before, after, t, out)
    return out, touched, after


def _stream_state(s: Stream, t: Timeline) -> dict[str, Any]:
    snap = s.snapshots[-1] if s.snapshots else None
    info = t.connections.get(s.conn)
    flow = next((f for f in reversed(t.flow) if f.conn == s.conn), None)
    span = f"{seqno_label(snap.start)}-{seqno_label(snap.end)}" + (" (complete)" if snap.complete else "") if snap else None
    state: dict[str, Any] = {
        "stream": stream_label(s),
        "attempts": len(s.attempts),
        "last outcome": s.attempts[-1].outcome if s.attempts else None,
        "snapshot": span,
        "items": len(s.items),
        "last seqno": seqno_label(s.last_seqno),
        "end": None if s.end is None else s.end.get("name"),
    }
    if info is not None and info.buffer_size:
        state["outstanding"] = f"{flow.outstanding if flow else 0:,} of {info.buffer_size:,} bytes"
    return state


# ---------------------------------------------------------------------------
# the model


class StepperModel:
    """A session replayed frame by frame (play/next/previous at a speed) with what each frame changed.

    The changes come from one :class:`~dcpinspect.timeline.builder.TimelineBuilder` fed
    the records one at a time (the state after frame *n* is what the builder
    knew then), not from a second parser.  Meant for teaching-size sessions
    (thousands of frames): every step is computed up front.
    """

    def __init__(self, records: Iterable[Record], *, speed: float = 2.0) -> None:
        self.records = list(records)
        self.speed = speed  # frames per second while playing
        self.position = 0
        self.playing = False
        self._listeners: list[Callable[[str], None]] = []
        self.steps = self._replay()

    def _replay(self) -> list[Step]:
        b = TimelineBuilder()
        steps: list[Step] = []
        before = _signature(b.timeline(final=False))
        index: dict[int, int] = {}
        for i, rec in enumerate(self.records):
            b.feed(rec)
            t = b.timeline(final=False)
            changes, touched, before = _diff(before, t)
            state: dict[str, Any] = {}
            stream = None
            if touched is not None:
                stream = index.setdefault(id(touched), next(k for k, s in enumerate(t.streams) if s is touched))
                state = _stream_state(touched, t)
            steps.append(Step(i, rec, changes, stream, state))
        return steps

    @classmethod
    def open(cls, source: Any, *, speed: float = 2.0) -> StepperModel:
        """From capture path(s), records, or a LiveCapture that kept its records."""
        return cls(records_of(source), speed=speed)

    # --- navigation ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.steps)

    @property
    def current(self) -> Step | None:
        """The step shown."""
        return self.steps[self.position] if self.steps else None

    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback("position")`` when the position moves."""
        self._listeners.append(callback)

    def goto(self, i: int) -> None:
        """Show step ``i`` (clamped)."""
        i = min(max(0, i), max(0, len(self.steps) - 1))
        if i != self.position:
            self.position = i
            for cb in list(self._listeners):
                cb("position")

    def next(self) -> Step | None:
        """One frame forward (stops playing at the end)."""
        if self.position >= len(self.steps) - 1:
            self.playing = False
        self.goto(self.position + 1)
        return self.current

    def previous(self) -> Step | None:
        """One frame back."""
        self.goto(self.position - 1)
        return self.current

    def play(self) -> None:
        """Start playing (the view's timer calls :meth:`tick`)."""
        self.playing = True

    def pause(self) -> None:
        """Stop playing."""
        self.playing = False

    def tick(self) -> None:
        """A timer tick: one frame forward while playing."""
        if self.playing:
            self.next()

    def run(self, *, sleep: Callable[[float], None] = time.sleep) -> Iterator[Step]:
        """Play synchronously (plain terminals): yield each step, waiting 1/speed between them."""
        self.play()
        while self.playing and self.current is not None:
            yield self.current
            if self.position >= len(self.steps) - 1:
                break
            sleep(1.0 / max(self.speed, 1e-3))
            self.next()
        self.playing = False

    # --- display ------------------------------------------------------------------
    def changes_html(self) -> str:
        """What the current frame changed, as an escaped HTML list, and the stream's state."""
        st = self.current
        if st is None:
            return "<p>(no frames)</p>"
        items = (
            "".join(f"<li><b>{html.escape(c.kind)}</b>: {html.escape(c.text)}</li>" for c in st.changes)
            or "<li>no change to any stream's state</li>"
        )
        state = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in st.state.items())
        return f"<ul>{items}</ul>" + (f"<table>{state}</table>" if state else "")

    def header(self) -> str:
        """``step 3/38: frame 3 (s2c, conn 1)`` (plain text)."""
        st = self.current
        if st is None:
            return "(no frames)"
        return f"step {st.index + 1}/{len(self.steps)}: frame {st.frame} ({st.record.direction}, conn {st.record.conn})"

    def text(self) -> str:
        """The current step as plain text."""
        st = self.current
        if st is None:
            return "(no frames)"
        head = f"step {st.index + 1}/{len(self.steps)}: frame {st.frame} ({st.record.direction})"
        body = annotate(st.record.event, context=st.record.context)
        changes = "\n".join(f"  * {c.kind}: {c.text}" for c in st.changes) or "  (no change)"
        return f"{head}\n{body}\nchanges:\n{changes}"

    def _repr_html_(self) -> str:
        st = self.current
        if st is None:
            return "<p>(no frames)</p>"
        head = f"<p>step {st.index + 1}/{len(self.steps)}: frame {st.frame} ({html.escape(st.record.direction)})</p>"
        return f"<div class='dcpinspect-stepper'>{head}{st.annotation_html()}{self.changes_html()}</div>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())


def records_of(source: Any) -> list[Record]:
    """Records of capture path(s), a list of records, or an object with a ``records`` list (a LiveCapture)."""
    if isinstance(source, (str, Path)):
        return list(read_records([str(source)]))
    if isinstance(source, (list, tuple)) and source and isinstance(source[0], (str, Path)):
        return list(read_records([str(p) for p in source]))
    if isinstance(getattr(source, "records", None), list):
        return list(source.records)
    return list(source)
