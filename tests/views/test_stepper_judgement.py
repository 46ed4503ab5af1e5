"""A rollback is never shown as contradicting the rule without saying why (issue 17: "the rule gives [0]" where 15 was observed).

After a failover the producer's failover log at the rollback is not known
when the Rollback answer arrives: only the retry's success returns it.  The
frame of the rollback says so (not judged yet); the frame of that success
says the rule now gives the observed seqno.  Frames are built by hand, one
connection, as in tests/timeline/test_server_behaviour.py.
"""

from __future__ import annotations

from dcpinspect import encode
from dcpinspect.flows.records import Record
from dcpinspect.flows.session import FRESH
from dcpinspect.protocol.enums import SnapshotFlag, StreamEndStatus
from dcpinspect.protocol.rules import MAX_SEQNO
from dcpinspect.tables.timeline import story
from dcpinspect.timeline import TimelineBuilder, build_timeline
from dcpinspect.timeline.rollback import explained
from dcpinspect.views.stepper import Change, StepperModel
from dcpinspect.wire.events import Frame

T0 = 1_700_000_000_000_000_000
OLD, NEW = 0x91B7584A2265, 0xCD613E30D8F1  # 48-bit, as the server makes them
Conv = list[tuple[str, bytes]]


def records(frames: Conv) -> list[Record]:
    return [Record(n, "f", 1, "c", d, T0 + n, T0 + n, n, n, Frame(0, raw), FRESH) for n, (d, raw) in enumerate(frames, 1)]


def req(opaque: int, start: int, uuid: int, snap: tuple[int, int]) -> tuple[str, bytes]:
    extras = {
        "flags": 0,
        "start_seqno": start,
        "end_seqno": MAX_SEQNO,
        "vb_uuid": uuid,
        "snap_start_seqno": snap[0],
        "snap_end_seqno": snap[1],
    }
    return ("c2s", encode("DCP_STREAM_REQ", extras=extras, vbucket=0, opaque=opaque))


def ok(opaque: int, log: list[tuple[int, int]]) -> tuple[str, bytes]:
    value = {"failover_log": [{"vb_uuid": u, "vb_seqno": s} for u, s in log]}
    return ("s2c", encode("DCP_STREAM_REQ", response=True, opaque=opaque, value=value))


def rollback(opaque: int, to: int) -> tuple[str, bytes]:
    return ("s2c", encode("DCP_STREAM_REQ", response=True, status=0x23, opaque=opaque, value={"rollback_seqno": to}))


def failover_session(retry_log: list[tuple[int, int]]) -> Conv:
    """20 items on branch OLD, the stream ends StateChanged; the resume from 20 rolls back to 15, the retry gets ``retry_log``."""
    marker = encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 0, "end_seqno": 20, "flags": int(SnapshotFlag.DISK)}, opaque=0x10)
    muts = [encode("DCP_MUTATION", extras={"by_seqno": i, "rev_seqno": 1}, key=f"k{i}", value=b"v", opaque=0x10) for i in range(1, 21)]
    end = encode("DCP_STREAM_END", extras={"status": int(StreamEndStatus.STATE_CHANGED)}, opaque=0x10)
    return [
        ("c2s", encode("DCP_OPEN", extras={"seqno": 0, "flags": 1}, key="test:conn", opaque=2)),
        ("s2c", encode("DCP_OPEN", response=True, opaque=2)),
        req(0x10, 0, 0, (0, 0)),
        ok(0x10, [(OLD, 0)]),
        ("s2c", marker),
        *[("s2c", m) for m in muts],
        ("s2c", end),
        req(0x11, 20, OLD, (20, 20)),
        rollback(0x11, 15),
        req(0x12, 15, OLD, (15, 15)),
        ok(0x12, retry_log),
    ]


def change_texts(step_changes: list[Change], kind: str) -> list[str]:
    return [c.text for c in step_changes if c.kind == kind]


def test_the_rollback_frame_says_it_is_not_judged_yet() -> None:
    recs = records(failover_session([(NEW, 15), (OLD, 0)]))
    s = StepperModel(recs)
    (rb,) = [st for st in s.steps if change_texts(st.changes, "rollback")]
    (text,) = change_texts(rb.changes, "rollback")
    assert text.startswith("conn 1 vb 0 #1: rollback to seqno 15 - observed a rollback to 15; not judged yet:"), text
    assert "the producer's failover log at that moment was not seen" in text
    assert "the rule gives [0]" not in text  # the old wording: a bare contradiction
    # what the old log gives is said whole: the unobserved inputs make it no rollback or a rollback to 0
    assert "the rule gives no rollback or a rollback to 0, never a rollback to 15" in text


def test_the_retry_success_frame_judges_it_with_the_log_it_returned() -> None:
    recs = records(failover_session([(NEW, 15), (OLD, 0)]))
    s = StepperModel(recs)
    judged = [(st, t) for st in s.steps for t in change_texts(st.changes, "judged")]
    assert len(judged) == 1
    st, text = judged[0]
    assert st.frame == len(recs)  # the retry's success, the last frame
    assert "the rollback to seqno 15 (frame 28) now judged: the rule gives 15 with the failover log the retry returned (frame 30)" in text
    assert "history diverged at seqno 15" in text
    # said once: the rollback itself is still one rollback change
    assert sum(c.kind == "rollback" for x in s.steps for c in x.changes) == 1


def test_the_final_story_of_a_judged_rollback_is_unchanged() -> None:
    t = build_timeline(records(failover_session([(NEW, 15), (OLD, 0)])))
    a = t.streams[-1].attempts[0]
    assert explained(a) and a.log_frame == 30
    assert a.explanation.startswith("consistent with the rule for some value of the inputs not observed (high seqno, purge seqno): ")
    assert a.explanation.endswith(
        "(using the failover log seen later, at frame 30: the producer's log had changed since the one seen before)"
    )
    assert "not judged" not in story(t)


def test_twin_a_retry_log_that_does_not_explain_it_is_judged_again_as_a_contradiction() -> None:
    """The retry returns a log with no fork at 15: the rule with the producer's log predicts otherwise, and the step says so."""
    recs = records(failover_session([(NEW, 10), (OLD, 0)]))
    s = StepperModel(recs)
    (text,) = [t for st in s.steps for t in change_texts(st.changes, "judged")]
    assert "judged again, still not what the rule gives - observed a rollback to 15, but the rule" in text, text
    a = build_timeline(recs).streams[-1].attempts[0]
    assert not explained(a) and "not judged yet" not in a.explanation


def test_before_the_retry_the_timeline_says_not_judged_yet() -> None:
    recs = records(failover_session([(NEW, 15), (OLD, 0)]))
    b = TimelineBuilder()
    b.feed_all(recs[:-2])  # up to the rollback answer
    a = b.timeline(final=False).streams[-1].attempts[0]
    assert a.outcome == "rollback" and not explained(a) and a.predicted is None
    assert a.explanation.startswith("observed a rollback to 15; not judged yet: the producer's failover log at that moment was not seen")


def test_twin_a_rollback_the_log_seen_before_explains_is_judged_at_once() -> None:
    """No failover: the log seen before is the producer's, the rollback frame judges it, nothing is judged later."""
    conv = failover_session([(NEW, 15), (OLD, 0)])
    conv[3] = ok(0x10, [(NEW, 15), (OLD, 0)])  # the first stream already saw the fork at 15
    s = StepperModel(records(conv))
    (text,) = [t for st in s.steps for t in change_texts(st.changes, "rollback")]
    assert "not judged" not in text and "history diverged at seqno 15" in text
    assert not [t for st in s.steps for t in change_texts(st.changes, "judged")]
