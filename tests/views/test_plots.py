"""Plots: each returns a Figure with the artists its timeline calls for; headless (Agg), no pyplot."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import numpy as np

matplotlib.use("Agg")

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from paths import CAPTURES

from dcpinspect.capture.read import read_records
from dcpinspect.tables.export import frames_df, frames_table
from dcpinspect.timeline import MAX_SEQNO, Anomaly, Timeline, build_timeline
from dcpinspect.views import drawing, plots


@cache
def timeline(name: str) -> Timeline:
    return build_timeline(read_records([str(CAPTURES / name)]))


def by_gid(fig: Figure, prefix: str) -> list:
    return [a for ax in fig.axes for a in ax.get_children() if (a.get_gid() or "").startswith(prefix)]


def points(artist) -> int:
    return len(artist.get_offsets())


def test_no_pyplot() -> None:
    for module in (plots, drawing):
        src = Path(module.__file__).read_text()
        assert "pyplot" not in src.replace("never pyplot", "").replace("no pyplot", "").replace("without pyplot", "")


def test_seqnos_failover_branches(failover) -> None:
    t = timeline("live-failover-branches.pcap")
    fig = plots.plot_seqnos(t)
    assert isinstance(fig, Figure)
    with_items = [i for i, s in enumerate(t.streams) if s.items]
    assert sorted(a.get_gid() for a in by_gid(fig, "stream:")) == sorted(f"stream:{i}" for i in with_items)
    assert len(by_gid(fig, "snapshots:")) == len([s for s in t.streams if s.snapshots])
    (req,) = by_gid(fig, "requests")
    assert points(req) == sum(len(s.attempts) for s in t.streams) == len(failover.requests)
    assert sorted(plots.frames_of(req)) == list(failover.requests)
    (rb,) = by_gid(fig, "rollbacks")
    rollbacks = [a for s in t.streams for a in s.attempts if a.outcome == "rollback"]
    assert points(rb) == len(rollbacks) == 1
    assert list(plots.frames_of(rb)) == [failover.rollback]
    assert rb.get_offsets()[0][1] == failover.rollback_seqno  # at the rollback seqno
    (ends,) = by_gid(fig, "ends")
    assert points(ends) == len(failover.ends) == len(t.streams)
    assert list(plots.frames_of(ends)) == [s.end["frame"] for s in t.streams]
    assert sorted(plots.frames_of(ends)) == list(failover.ends)
    ax = fig.axes[0]
    assert ax.get_xlabel() and ax.get_ylabel() == "seqno"


def test_seqnos_per_frame_axis_and_filters() -> None:
    t = timeline("live-plain.pcap")
    fig = plots.plot_seqnos(t, vbucket=2, x="frame")
    assert [a.get_gid() for a in by_gid(fig, "stream:")] == [f"stream:{i}" for i, s in enumerate(t.streams) if s.vbucket == 2]
    line = by_gid(fig, "stream:")[0]
    assert list(line.get_xdata()) == list(plots.frames_of(line))  # x is the frame number
    assert fig.axes[0].get_xlabel() == "frame number"


def test_a_legend_of_hundreds_of_streams_is_cut() -> None:
    import copy

    t = copy.copy(timeline("live-plain.pcap"))
    few = plots.plot_seqnos(t).axes[0].get_legend()
    assert few.get_title().get_text() == ""
    shown = len(few.get_texts())
    t.streams = [copy.copy(s) for _ in range(40) for s in t.streams]
    for i, s in enumerate(t.streams):
        s.vbucket = i  # every stream its own legend entry
    ax = plots.plot_seqnos(t).axes[0]
    handles, _ = ax.get_legend_handles_labels()
    assert len(handles) > 12 and len(handles) >= shown
    leg = ax.get_legend()
    assert len(leg.get_texts()) == 12
    assert leg.get_title().get_text() == f"12 of {len(handles)}"


def test_uint64_max_is_labelled_max() -> None:
    t = timeline("seed-000-rollback-retry.pcap")
    import copy

    t2 = copy.deepcopy(t)
    t2.streams[0].attempts[0].start = MAX_SEQNO
    fig = plots.plot_seqnos(t2)
    FigureCanvasAgg(fig).draw()
    labels = [tl.get_text() for tl in fig.axes[0].get_yticklabels()]
    assert "max" in labels
    assert max(fig.axes[0].get_ylim()) < 1e10  # the axis is not stretched to 2^64


def test_branches(failover) -> None:
    t = timeline("live-failover-branches.pcap")
    fig = plots.plot_branches(t, 0)
    # vbucket 0's two branches: the one it was streamed on from 0, and the new active node's, forked at the rollback seqno
    assert len(by_gid(fig, "branch:")) == len(t.branches[0]) == len(failover.failover_log) == 2
    (resume,) = by_gid(fig, "resume:0")
    assert points(resume) == len(failover.vb0_requests)
    assert sorted(x for x, _y in resume.get_offsets()) == sorted([0, failover.resumed_at, failover.rollback_seqno])
    (target,) = by_gid(fig, "rollback-target:0")
    assert points(target) == 1 and target.get_offsets()[0][0] == failover.rollback_seqno
    # a lane per failover-log entry, oldest first, named by its uuid and where it starts
    labels = [tl.get_text() for tl in fig.axes[0].get_yticklabels()]
    oldest_first = sorted(failover.failover_log, key=lambda e: e[1])
    assert [lab.split()[0] for lab in labels] == [f"0x{uuid:016x}" for uuid, _seqno in oldest_first]  # zero-padded
    assert all(lab.endswith(f"@ {seqno}") for lab, (_uuid, seqno) in zip(labels, oldest_first, strict=True))
    # the resume at 15 on the old branch, which the new one forked from at 12: 12..15 was lost in the failover
    (lost,) = by_gid(fig, "lost:")
    assert lost.get_gid() == f"lost:{oldest_first[0][0]:x}"
    assert list(lost.get_xdata()) == [failover.rollback_seqno, failover.resumed_at] == [12, 15]
    # vbucket 1 failed over with nothing lost: two branches, no rollback, no lost segment
    one = plots.plot_branches(t, 1)
    assert len(by_gid(one, "branch:")) == len(t.branches[1]) == 2
    assert not by_gid(one, "lost:") and not by_gid(one, "rollback-target:")
    # every vbucket, one axes each
    t4 = timeline("live-plain.pcap")
    assert len(plots.plot_branches(t4).axes) == 4


def test_branches_fresh_start_uuid_0_is_not_an_unknown_branch() -> None:
    # uuid 0 asks for everything, from no history (kv_engine docs/dcp/documentation/commands/stream-request.md):
    # the request from 0 sits on the branch holding seqno 0
    t = timeline("live-purge-rollback.pcap")
    fig = plots.plot_branches(t, 0)
    labels = [tl.get_text() for tl in fig.axes[0].get_yticklabels()]
    assert "uuid in no log seen" not in labels and len(labels) == len(t.branches[0])
    (resume,) = by_gid(fig, "resume:0")
    zero = [y for x, y in resume.get_offsets() if x == 0]
    base = min(t.branches[0], key=lambda b: b.seqno).order
    assert zero and all(y == base for y in zero)
    # a uuid no log ever held still gets its own lane (a resume state from another node's history)
    seed = plots.plot_branches(timeline("live-rollback-retry.pcap"), 0)
    assert "uuid in no log seen" in [tl.get_text() for tl in seed.axes[0].get_yticklabels()]


def test_seed_branches_unordered_log() -> None:
    t = timeline("seed-000-rollback-retry.pcap")
    fig = plots.plot_branches(t)
    assert len(by_gid(fig, "branch:")) == 4
    assert points(by_gid(fig, "rollback-target:")[0]) == 1


def test_flow_and_noops() -> None:
    t = timeline("live-flow-control.pcap")
    fig = plots.plot_flow(t)
    assert len(by_gid(fig, "outstanding:")) == 1
    assert len(by_gid(fig, "buffer:")) == 1
    assert len(by_gid(fig, "stall:")) == len(t.stalls) == 1
    acks = by_gid(fig, "acks:")
    assert sum(points(a) for a in acks) == sum(f.event == "ack" for f in t.flow)
    s = timeline("dcp-session.pcap")
    fig2 = plots.plot_flow(s)
    assert len(fig2.axes) == 2  # noops below, on the same time axis
    assert fig2.axes[1].get_shared_x_axes().joined(fig2.axes[0], fig2.axes[1])
    (noops,) = by_gid(fig2, "noops:")
    assert points(noops) == len(s.noops) == 1


def test_opcodes_pandas_and_arrow() -> None:
    path = str(CAPTURES / "messy.pcap")
    df = frames_df([path])
    fig = plots.plot_opcodes(df, top=3)
    names = {a.get_gid() for a in by_gid(fig, "opcode:")}
    assert "opcode:capture problems" in names  # garbage and gaps
    assert len(names) <= 5
    fig2 = plots.plot_opcodes(frames_table([path]), top=3)
    assert {a.get_gid() for a in by_gid(fig2, "opcode:")} == names
    totals = sum(int(a.get_label().rsplit("(", 1)[1].rstrip(")").replace(",", "")) for a in by_gid(fig, "opcode:"))
    assert totals == len(df)


def test_pick_gives_frame() -> None:
    t = timeline("live-rollback-retry.pcap")
    fig = plots.plot_seqnos(t)
    (rb,) = by_gid(fig, "rollbacks")
    event = SimpleNamespace(artist=rb, ind=[0])
    a = next(a for s in t.streams for a in s.attempts if a.outcome == "rollback")
    assert plots.frame_at(event) == a.response_frame


def test_existing_axes_and_dark_theme() -> None:
    t = timeline("live-stream-ends.pcap")
    fig = Figure()
    ax = fig.add_subplot()
    assert plots.plot_seqnos(t, ax=ax, theme="dark") is fig
    assert ax.get_facecolor()[:3] != (1.0, 1.0, 1.0)
    assert plots.plot_branches(t, 0, ax=ax) is fig


def of_axes(ax: object, prefix: str) -> list:
    return [a for a in ax.get_children() if (a.get_gid() or "").startswith(prefix)]  # type: ignore[attr-defined]


def check_seqnos(t: Timeline) -> None:
    """A line per stream with as many points as it has items, a band per snapshot, and every request, rollback and end."""
    fig = plots.plot_seqnos(t, x="frame")
    chosen = sorted(plots.pick_streams(t)) if len(t.streams) > plots.MAX_STREAMS else range(len(t.streams))
    for i in chosen:
        s = t.streams[i]
        items = [it.frame for it in s.items if it.seqno is not None]
        lines = by_gid(fig, f"stream:{i}")
        assert [len(line.get_xdata()) for line in lines] == ([len(items)] if items else [])
        assert all(list(plots.frames_of(line)) == items == list(line.get_xdata()) for line in lines)
        bands = by_gid(fig, f"snapshots:{i}")
        assert [len(b.get_paths()) for b in bands] == ([len(s.snapshots)] if s.snapshots else [])
        assert all(list(plots.frames_of(b)) == [sn.frame for sn in s.snapshots] for b in bands)
    streams = [t.streams[i] for i in chosen]
    attempts = [a for s in streams for a in s.attempts]
    rollbacks = [a for a in attempts if a.outcome == "rollback" and a.rollback_seqno is not None]
    ends = [s.end["frame"] for s in streams if s.end is not None]
    for gid, frames in (
        ("requests", [a.frame for a in attempts]),
        ("rollbacks", [a.response_frame or a.frame for a in rollbacks]),
        ("ends", ends),
    ):
        drawn = [a for a in by_gid(fig, gid) if a.get_gid() == gid]
        assert [points(a) for a in drawn] == ([len(frames)] if frames else [])
        assert all(list(plots.frames_of(a)) == frames for a in drawn)
    assert len(by_gid(fig, "rollback-link")) == len(rollbacks)  # each rollback joined to its request


def check_branches(t: Timeline) -> None:
    """Per vbucket: a lane per branch, a resume point per request, a target and an arrow per rollback."""
    fig = plots.plot_branches(t)
    vbs = sorted(set(t.branches) | {s.vbucket for s in t.streams})[:8] or [0]
    assert len(fig.axes) == len(vbs)
    for ax, vb in zip(fig.axes, vbs, strict=True):
        attempts = [a for s in t.streams if s.vbucket == vb for a in s.attempts]
        rollbacks = [a for a in attempts if a.outcome == "rollback" and a.rollback_seqno is not None]
        assert len(of_axes(ax, "branch:")) == min(len(t.branches.get(vb, [])), plots.MAX_BRANCHES)
        assert sum(points(a) for a in of_axes(ax, f"resume:{vb}")) == len(attempts)
        assert sum(points(a) for a in of_axes(ax, f"rollback-target:{vb}")) == len(rollbacks)
        assert len(of_axes(ax, f"rollback-arrow:{vb}")) == min(len(rollbacks), plots.MAX_ROLLBACK_ARROWS)


def check_flow(t: Timeline) -> None:
    """A step line per connection with a point per flow sample, its acks, a span per stall; noop round trips below."""
    fig = plots.plot_flow(t)
    conns = sorted({f.conn for f in t.flow})
    assert len(conns) <= plots.MAX_CONNS
    for c in conns:
        samples = [f for f in t.flow if f.conn == c]
        (line,) = by_gid(fig, f"outstanding:{c}")
        assert len(line.get_xdata()) == len(samples) and list(plots.frames_of(line)) == [f.frame for f in samples]
        acks = [f.frame for f in samples if f.event == "ack"]
        assert [list(plots.frames_of(a)) for a in by_gid(fig, f"acks:{c}")] == ([acks] if acks else [])
        assert len(by_gid(fig, f"stall:{c}")) == sum(st["conn"] == c for st in t.stalls)
    assert len(fig.axes) == (2 if t.noops else 1)
    if t.noops:
        known = [n for n in t.noops if n["rtt_ns"] is not None]
        assert sum(points(a) for a in by_gid(fig, "noops:")) == len(known)


@pytest.mark.parametrize("name", sorted(p.name for p in CAPTURES.glob("*.pcap")))
def test_every_capture_plots(name: str) -> None:
    """Every capture, every plot: the artists are counted against the timeline, stream by stream."""
    t = timeline(name)
    check_seqnos(t)
    check_branches(t)
    check_flow(t)


def test_the_checks_see_something() -> None:
    """The captures above do hold what the checks count: items, snapshots, rollbacks, ends, branches, acks, stalls, noops."""
    ts = [timeline(p.name) for p in CAPTURES.glob("*.pcap")]
    streams = [s for t in ts for s in t.streams]
    assert sum(len(s.items) for s in streams) > 100 and sum(len(s.snapshots) for s in streams) > 10
    assert sum(a.outcome == "rollback" for s in streams for a in s.attempts) >= 3
    assert sum(s.end is not None for s in streams) >= 5
    assert sum(len(b) for t in ts for b in t.branches.values()) >= 5
    assert sum(f.event == "ack" for t in ts for f in t.flow) >= 1 and sum(len(t.stalls) for t in ts) >= 1
    assert sum(len(t.noops) for t in ts) >= 1


def _pixels_of(fig: Figure, artist: object, dpi: float = 80) -> list[tuple[float, float]]:
    """Where each point of ``artist`` lands in the PNG of ``fig`` at ``dpi`` (pixels from the top left)."""
    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    _w, h = canvas.get_width_height()
    pts = drawing.display_points(artist, np.arange(len(plots.frames_of(artist))))  # type: ignore[arg-type]
    assert pts is not None
    return [(float(x), float(h - y)) for x, y in pts]


@pytest.mark.parametrize("x", ["frame", "time"])
def test_a_click_on_the_picture_finds_the_frame(x: str) -> None:
    """What the explorer does with a browser click on a plot's PNG: the point under it, by its frame."""
    t = timeline("live-rollback-retry.pcap")
    fig = plots.plot_seqnos(t, x=x)
    line = next(a for a in fig.findobj(lambda a: len(plots.frames_of(a)) > 3))
    frames = plots.frames_of(line)
    for i, (px, py) in enumerate(_pixels_of(fig, line)):
        assert plots.frame_at_pixel(fig, px + 1, py - 1) == frames[i]  # within the pick radius
    assert plots.frame_at_pixel(fig, 1, 1) is None  # the corner: nothing there
    rb = next(a for a in fig.findobj(lambda a: a.get_gid() == "rollbacks"))
    ((px, py),) = _pixels_of(fig, rb)
    assert plots.frame_at_pixel(fig, px, py) == plots.frames_of(rb)[0]


# --- bounded: many streams -----------------------------------------------------------------------------------


def many_streams(n: int) -> Timeline:
    """``n`` streams (copies of live-plain's, each its own vbucket); stream 7 has a rollback, stream 11 an anomaly."""
    import copy

    t = copy.copy(timeline("live-plain.pcap"))
    base = t.streams
    t.streams = [copy.copy(base[i % len(base)]) for i in range(n)]
    for i, s in enumerate(t.streams):
        s.vbucket = i
        s.items = s.items[: 1 + i % 5]  # the busiest have 5 items
        s.anomalies = []
    rb = copy.deepcopy(next(a for a in timeline("live-rollback-retry.pcap").streams[0].attempts if a.outcome == "rollback"))
    t.streams[7].attempts = [rb, *t.streams[7].attempts]
    t.streams[11].anomalies = [Anomaly("seqno not increasing", [1], "<b>bad</b>", 1, 11)]
    t.anomalies = list(t.streams[11].anomalies)
    return t


def test_pick_streams_anomalies_and_rollbacks_first_then_the_busiest() -> None:
    t = many_streams(30)
    picked = plots.pick_streams(t, 8)
    assert sorted(picked[:2]) == [7, 11]
    assert all(len(t.streams[i].items) == 5 for i in picked[2:])  # then the busiest, in timeline order
    assert picked[2:] == sorted(picked[2:])
    assert plots.pick_streams(t, 100) == sorted(range(30), key=lambda i: (i not in (7, 11), -len(t.streams[i].items), i))
    assert plots.pick_streams(t, 3, items={5: 1000})[2] == 5  # true counts where the items were thinned


def test_seqnos_draws_a_bounded_number_of_streams_and_says_so() -> None:
    t = many_streams(300)
    fig = plots.plot_seqnos(t)
    drawn = {int(a.get_gid().split(":")[1]) for a in by_gid(fig, "stream:")}
    assert len(drawn) == 64  # (all 300 before: about 10 ms each, 65,536 took minutes)
    assert plots.MAX_STREAMS == 64
    assert {7, 11} <= drawn
    assert "showing 64 of 300 streams" in fig.axes[0].get_title()
    # a filter or an explicit choice within the bound draws everything asked for, and says nothing
    few = plots.plot_seqnos(t, streams=range(10))
    assert len(by_gid(few, "stream:")) == 10 and "showing" not in few.axes[0].get_title()
    assert len(by_gid(plots.plot_seqnos(t, max_streams=None), "stream:")) == 300


def copy_conn(c: object, **changes: object) -> object:
    import dataclasses

    return dataclasses.replace(c, **changes)  # type: ignore[type-var]


def test_flow_and_noops_draw_the_busiest_connections() -> None:
    import copy

    t = copy.copy(timeline("dcp-session.pcap"))
    (c,) = {f.conn for f in t.flow}
    t.flow = [f._replace(conn=k) for k in range(40) for f in t.flow[: 1 + k % 3]]
    t.noops = [{**n, "conn": k} for k in range(40) for n in t.noops]
    t.connections = {k: copy_conn(t.connections[c], conn=k) for k in range(40)}
    fig = plots.plot_flow(t)
    assert len(by_gid(fig, "outstanding:")) == 16
    assert plots.MAX_CONNS == 16
    assert "showing the 16 busiest of 40 connections" in fig.axes[0].get_title()
    assert len(by_gid(fig, "noops:")) == 16


def test_branches_of_a_vbucket_with_hundreds_of_logs_are_cut_to_the_last() -> None:
    from dcpinspect.timeline import Branch

    t = copy_conn(timeline("live-failover-branches.pcap"), branches={0: [Branch(0x1000 + k, k, k, k) for k in range(200)]})
    fig = plots.plot_branches(t, 0)  # type: ignore[arg-type]
    lanes = by_gid(fig, "branch:")
    assert len(lanes) == 64 and lanes[0].get_gid() == f"branch:{0x1000 + 136:x}"
    assert "showing the last 64 of 200" in fig.axes[0].get_title()
    every = plots.plot_branches(copy_conn(t, branches={vb: t.branches[0][:2] for vb in range(10)}))  # type: ignore[arg-type]
    assert len(every.axes) == 8 and "showing 8 of 10 vbuckets" in every.get_suptitle()


def test_a_time_out_of_range_leaves_durations_unknown_and_plots_drawn(tmp_path: Path) -> None:
    """A noop reply and a buffer ack whose packets' times are past 2262: null durations, nothing raises or is drawn at 1677."""
    import struct

    from pcapfactory import Conn, Msg, write_capture

    from dcpinspect import encode
    from dcpinspect.tables.timeline import timeline_frames
    from dcpinspect.views.report import render_report
    from dcpinspect.views.stepper import StepperModel

    mut = {"by_seqno": 1, "rev_seqno": 1, "flags": 0, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0}
    msgs = [
        Msg("c2s", encode("DCP_OPEN", key="c", extras={"flags": 0}, opaque=1)),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=1)),
        Msg("c2s", encode("DCP_CONTROL", key="connection_buffer_size", value=b"100", opaque=2)),
        Msg("s2c", encode("DCP_CONTROL", response=True, opaque=2)),
        Msg("c2s", encode("DCP_STREAM_REQ", vbucket=0, opaque=3, extras={"end_seqno": 2**64 - 1})),
        Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=3, value=[(0xFEED, 0)])),
        Msg("s2c", encode("DCP_MUTATION", vbucket=0, opaque=3, extras=mut, key="k", value=bytes(200))),
        Msg("s2c", encode("DCP_NOOP", opaque=9)),
        Msg("c2s", encode("DCP_NOOP", response=True, opaque=9)),  # its packet's time: out of range
        Msg("c2s", encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": 250}, opaque=4)),  # ends the stall: out of range too
    ]
    data = bytearray(write_capture(tmp_path / "c.pcapng", [Conn(msgs=msgs, close=None)], fmt="pcapng").path.read_bytes())
    epbs, pos = [], 0
    while pos < len(data):
        btype, blen = struct.unpack_from("<II", data, pos)
        if btype == 6:
            epbs.append(pos)
        pos += blen
    for at in epbs[-2:]:  # the last two packets: the noop reply and the ack
        struct.pack_into("<I", data, at + 12, 0xFFFFFFFF)
    path = tmp_path / "late.pcapng"
    path.write_bytes(bytes(data))
    t = build_timeline(read_records([str(path)]))
    assert [n["rtt_ns"] for n in t.noops] == [None]
    assert [s["duration_ns"] for s in t.stalls] == [None]
    dfs = timeline_frames(t)
    assert dfs["noops"]["rtt_ns"].isna().all() and dfs["stalls"]["duration_ns"].isna().all()
    ft = frames_table([str(path)])
    assert ft.column("ts").null_count == 2
    for fig in (plots.plot_noops(t), plots.plot_flow(t), plots.plot_opcodes(ft), plots.plot_seqnos(t, clock=plots.timeline_clock(t))):
        FigureCanvasAgg(fig).draw()
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            assert abs(lo) < 1e6 and abs(hi) < 1e6  # seconds since the first frame, not 9e9 s of a bogus time
    steps = StepperModel(read_records([str(path)])).steps  # what the stepper says frame by frame
    assert sum("an unknown time" in c.text for st in steps for c in st.changes) == 2
    page = render_report(t, ft, [], counts={"files": 1, "frames": ft.num_rows, "connections": 1, "streams": 1, "anomalies": 0})
    assert "<html" in page.lower()


# --- empty plots say so; the drawing kit does its work once (issue 16) ------------------


def tick_texts(fig: Figure) -> list[str]:
    FigureCanvasAgg(fig).draw()
    return [t.get_text() for ax in fig.axes for t in (*ax.get_xticklabels(), *ax.get_yticklabels())]


def empty_messages(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == "empty"]


def test_empty_plots_say_so_in_words_never_minus_zero() -> None:
    import copy

    t = copy.copy(timeline("live-plain.pcap"))
    t.streams = [copy.copy(s) for s in t.streams]
    for s in t.streams:
        s.items, s.snapshots, s.end, s.last_seqno = [], [], None, None
    one = plots.plot_seqnos(t, streams=[0])  # a request, no item
    assert empty_messages(one) == ["no items in this stream"] and "-0" not in tick_texts(one)
    assert empty_messages(plots.plot_seqnos(t)) == ["no items in these streams"] if len(t.streams) > 1 else True
    none = Timeline({}, [], {}, {}, [], [], [], [], {})
    for fig, said in (
        (plots.plot_seqnos(none), "no streams"),
        (plots.plot_branches(none, 3), "no failover log and no stream request seen on vbucket 3"),
        (plots.plot_flow(none, noops=False), "no buffer size negotiated: no flow control to plot"),
        (plots.plot_noops(none), "no noop answered"),
    ):
        assert empty_messages(fig) == [said] and not [t for t in tick_texts(fig) if t], said
    frames = {"ts": np.array([], dtype="datetime64[ns]"), "type": np.array([], dtype=object), "name": np.array([], dtype=object)}
    import pandas as pd

    assert empty_messages(plots.plot_opcodes(pd.DataFrame(frames))) == ["no frames"]


def test_a_seqno_axis_near_zero_never_says_minus_zero() -> None:
    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [0, 0])
    drawing.SeqAxis([0]).install(ax)
    assert "-0" not in tick_texts(fig)


def test_the_clock_converts_once_and_is_shared() -> None:
    clk = drawing.Clock((np.arange(1, 1_001), np.arange(1_000) * 1_000_000), "time")
    assert clk.conversions == 1
    for _ in range(50):
        clk(np.array([5, 500]))
    assert clk.conversions == 1 and list(clk([1, 1000])) == [0.0, 0.999]
    again = drawing.Clock(clk, "time")  # a plot given the model's clock wraps it: no new conversion
    assert again.conversions == 0 and list(again([1001])) == [0.999]
    assert list(drawing.Clock(clk, "frame")([7])) == [7.0]


def test_a_plot_draws_at_most_the_points_and_bands_asked_for() -> None:
    import copy

    from dcpinspect.timeline import Item, Snapshot

    t = copy.copy(timeline("live-plain.pcap"))
    s = copy.copy(t.streams[0])
    s.items = [Item(10 + k, 1_000 + k, 0x57, k + 1, k // 2) for k in range(50_000)]
    s.snapshots = [Snapshot(9 + 2 * k, 2 * k + 1, 2 * k + 2, 1) for k in range(25_000)]
    t.streams = [s, *[copy.copy(s) for _ in range(3)]]
    fig = plots.plot_seqnos(t, max_points=4_000, layout="fixed")
    lines = by_gid(fig, "stream:")
    assert len(lines) == 4 and sum(len(plots.frames_of(a)) for a in lines) <= 4_000
    assert all(len(c.get_paths()) <= plots.MAX_BANDS for c in by_gid(fig, "snapshots:"))
    assert len(plots.frames_of(by_gid(plots.plot_seqnos(t, streams=[0]), "stream:")[0])) <= drawing.MAX_POINTS
    assert getattr(fig, "dcpinspect_margins", None) == drawing.FIXED_MARGINS and fig.get_layout_engine() is None
