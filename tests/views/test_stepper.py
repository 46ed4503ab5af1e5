"""The stepper: a session replayed frame by frame, what each frame changed adding up to the timeline."""

from __future__ import annotations

from collections import Counter

import pytest
from paths import CAPTURES

from dcpinspect.capture.read import read_records
from dcpinspect.timeline import TimelineBuilder, stream_label
from dcpinspect.views.stepper import StepperModel


def kinds(s: StepperModel) -> list[set[str]]:
    return [{c.kind for c in st.changes} for st in s.steps]


def test_stepper_rollback_story() -> None:
    path = str(CAPTURES / "live-rollback-retry.pcap")
    s = StepperModel.open(path)
    assert len(s) == sum(1 for _ in read_records([path]))  # a step per frame
    assert [st.frame for st in s.steps] == [r.number for r in read_records([path])]
    ks = kinds(s)
    order = [k for step in ks for k in sorted(step) if k in ("request", "rollback", "accepted", "snapshot", "item", "end")]
    first = {k: order.index(k) for k in reversed(order)}
    assert first["request"] < first["rollback"] < first["accepted"] < first["snapshot"] < first["item"] < first["end"]
    rb = next(st for st in s.steps if any(c.kind == "rollback" for c in st.changes))
    assert "rollback to seqno 0" in " ".join(c.text for c in rb.changes)
    retry = s.steps[rb.index + 1]
    assert any("retry" in c.text for c in retry.changes)
    accepted = next(st for st in s.steps if any(c.kind == "accepted" for c in st.changes))
    assert any(c.kind == "failover-log" for c in accepted.changes)
    assert accepted.state["last outcome"] == "success"


def test_stepper_flow_control_and_navigation() -> None:
    s = StepperModel.open(str(CAPTURES / "live-flow-control.pcap"), speed=100)
    all_kinds = set().union(*kinds(s))
    assert {"ack", "stall", "sent", "session"} <= all_kinds
    moves: list[str] = []
    s.on_change(moves.append)
    s.previous()
    assert s.position == 0 and not moves
    s.next()
    s.next()
    assert s.position == 2 and moves == ["position", "position"]
    s.goto(10_000)
    assert s.position == len(s) - 1
    s.next()
    assert s.position == len(s) - 1 and not s.playing
    s.goto(0)
    slept: list[float] = []
    steps = list(s.run(sleep=slept.append))
    assert len(steps) == len(s) and slept and slept[0] == pytest.approx(0.01)
    assert "step" in s.text() and "<ul>" in s._repr_html_()
    assert s.header() == f"step {len(s)}/{len(s)}: frame {s.current.frame} ({s.current.record.direction}, conn {s.current.record.conn})"


def test_play_and_tick() -> None:
    s = StepperModel.open(str(CAPTURES / "live-plain.pcap"))
    s.tick()
    assert s.position == 0  # not playing
    s.play()
    s.tick()
    s.tick()
    assert s.position == 2 and s.playing
    s.pause()
    s.tick()
    assert s.position == 2


@pytest.mark.parametrize("name", sorted(p.name for p in CAPTURES.glob("*.pcap")))
def test_the_changes_add_up_to_the_timeline(name: str) -> None:
    """Each request, answer, snapshot, item, end, flow sample, stall, noop and anomaly is said once, at its frame."""
    records = list(read_records([str(CAPTURES / name)]))
    s = StepperModel(records)
    b = TimelineBuilder()
    b.feed_all(records)
    t = b.timeline(final=False)  # what the stepper knew after the last frame
    said = Counter(c.kind for st in s.steps for c in st.changes)
    opened = sum(c.kind == "snapshot" and "opened" in c.text for st in s.steps for c in st.changes)
    attempts = [a for x in t.streams for a in x.attempts]
    assert said["request"] == len(attempts)
    assert said["accepted"] == sum(a.outcome == "success" for a in attempts)
    assert said["rollback"] == sum(a.outcome == "rollback" for a in attempts)
    assert said["error"] == sum(a.outcome == "error" for a in attempts)
    assert opened == sum(len(x.snapshots) for x in t.streams)
    assert said["item"] == sum(len(x.items) for x in t.streams)
    assert said["end"] == sum(x.end is not None for x in t.streams)
    assert said["ack"] == sum(f.event == "ack" for f in t.flow) and said["sent"] == sum(f.event == "sent" for f in t.flow)
    assert said["stall"] == len(t.stalls) and said["noop"] == len(t.noops)
    assert said["anomaly"] == len(t.anomalies)
    # a step names the stream it touched, and shows that stream's state
    labels = [stream_label(x) for x in t.streams]
    for st in s.steps:
        assert (st.stream is None) == (not st.state)
        if st.stream is not None:
            assert st.state["stream"] == labels[st.stream]
    items = [st for st in s.steps if any(c.kind == "item" for c in st.changes)]
    assert [st.frame for st in items] == sorted(it.frame for x in t.streams for it in x.items)
