"""The explorer's model without a browser or a widget: filters, paging, selection, pictures, background and live loading."""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pytest
from paths import CAPTURES

from dcpinspect.capture.read import read_records
from dcpinspect.live.tap import LiveCapture
from dcpinspect.tables.columnar import read_parts
from dcpinspect.tables.export import frames_df, frames_table
from dcpinspect.timeline import build_timeline
from dcpinspect.views.explorer import PAGE_COLUMNS, ExplorerModel, key_frames
from dcpinspect.wire.render import annotate, annotate_html

BRANCHES = str(CAPTURES / "live-failover-branches.pcap")
WAIT = 60  # seconds: a bound on waiting for an event, only reached when something is broken


def fresh(name: str = BRANCHES, **kw) -> ExplorerModel:
    return ExplorerModel.open(name, **kw)


def test_filtering(failover) -> None:
    m = fresh()
    assert m.total == m.store.rows == failover.frames
    m.set_filters(vbucket=0, opcode="DCP_STREAM_REQ")
    assert [r["frame"] for r in m.page_rows()] == list(failover.vb0_requests)
    m.set_filters(direction="s2c")
    assert m.total == 0  # the requests travel c2s
    m.clear_filters()
    story = m.stream_of(failover.rollback)
    assert story is not None
    m.set_filters(stream=story)
    shown = {r["frame"] for r in m.page_rows()}
    assert shown == set(m.stream_frames(story).tolist())
    assert {failover.request, failover.rollback, failover.retry, failover.accepted, failover.end} <= shown
    assert failover.first_vb0 not in shown  # vbucket 0's first stream, on another connection
    m.clear_filters()
    m.set_filters(conn=1, direction="c2s")
    assert all(r["dir"] == "c2s" and r["conn_id"] == 1 for r in m.page_rows())


def test_key_search_and_problems() -> None:
    m = fresh(str(CAPTURES / "live-plain.pcap"))
    key = next(r["key"] for r in m.page_rows() if r["name"] == "DCP_MUTATION")
    m.set_filters(key=key.upper())
    assert m.total >= 1 and all(key.lower() in (r["key"] or "").lower() for r in m.page_rows())
    messy = fresh(str(CAPTURES / "messy.pcap"))
    messy.set_filters(problems=True)
    t = messy.timeline
    anomaly_frames = {f for a in t.anomalies for f in a.frames}
    rows = messy.page_rows()
    assert rows and all(r["problems"] or r["frame"] in anomaly_frames for r in rows)
    assert any(r["type"] == "gap" for r in rows)


def test_paging(failover) -> None:
    m = fresh(page_size=10)
    pages = -(-failover.frames // 10)
    assert m.pages == pages and failover.frames % 10  # the last page is a short one
    first = [r["frame"] for r in m.page_rows()]
    m.next_page()
    second = [r["frame"] for r in m.page_rows()]
    assert first == list(range(1, 11)) and second == list(range(11, 21))
    m.goto_page(99)
    assert m.page == pages - 1 and [r["frame"] for r in m.page_rows()] == list(range(10 * (pages - 1) + 1, failover.frames + 1))
    m.previous_page()
    assert m.page == pages - 2
    m.set_filters(vbucket=0)
    assert m.page == 0  # a filter change goes back to the first page
    df = m.page_df()
    assert list(df.columns) == list(PAGE_COLUMNS) and list(df["frame"]) == [r["frame"] for r in m.page_rows()]


def test_selection_annotation(failover) -> None:
    m = fresh()
    seen: list[str] = []
    m.on_change(seen.append)
    m.select(failover.rollback)
    assert seen == ["selection"]
    page = m.annotation_html()
    assert "DCP_STREAM_REQ response" in page and "0x0023 (Rollback)" in page
    assert f"0x{failover.rollback_seqno:016x}" in page  # the seqno to roll back to
    story = m.stream_of(failover.rollback)
    assert story is not None and m.timeline.streams[story].vbucket == 0
    assert {m.stream_of(f) for f in (failover.request, failover.retry, failover.accepted, failover.end)} == {story}
    first = m.stream_of(failover.first_vb0)
    assert first is not None and first != story and m.timeline.streams[first].vbucket == 0
    assert m.stream_of(1) is None  # the HELLO: no stream
    with pytest.raises(KeyError):
        m.select(failover.frames + 1)
    fig = m.stream_figure()
    assert [a.get_gid() for a in fig.axes[0].get_children() if (a.get_gid() or "").startswith("stream:")] == [f"stream:{story}"]
    assert m.branch_figure() is not None


def test_shown_pictures_follow_the_selected_stream(failover) -> None:
    """The pictures beside the list are the model's: drawn once per stream and timeline, with the stream's key frames."""
    m = fresh()
    m.select(failover.request)
    shown = m.shown()
    assert shown is not None and shown.key[0] == m.stream_of(failover.rollback) is not None
    assert shown.png("stream")[:4] == b"\x89PNG" and shown.png("branch")[:4] == b"\x89PNG"
    assert shown.png("stream") is shown.png("stream")  # rendered once
    assert shown.jumps == key_frames(m.timeline.streams[shown.key[0]])
    assert [f for _l, f in shown.jumps] == sorted({f for _l, f in shown.jumps})
    # the requests and their answers, and the end
    assert {failover.request, failover.rollback, failover.retry, failover.accepted, failover.end} <= {f for _l, f in shown.jumps}
    m.select(failover.accepted)  # the same stream: the same pictures
    assert m.shown() is shown
    m.select(failover.first_vb0)  # another stream
    assert m.shown() is not shown and m.shown().key[0] == m.stream_of(failover.first_vb0) != shown.key[0]


def test_dataframe_source_refetches_bytes(failover) -> None:
    df = frames_df([BRANCHES])
    m = ExplorerModel.open(df)
    assert m.total == failover.frames
    m.select(failover.rollback)
    assert "0x0023 (Rollback)" in m.annotation_html()
    assert m.timeline is not None and len(m.timeline.streams) == failover.streams


def test_pick_selects(failover) -> None:
    m = fresh()
    fig = m.stream_figure()
    rb = next(a for a in fig.axes[0].get_children() if a.get_gid() == "rollbacks")
    assert m.select_pick(SimpleNamespace(artist=rb, ind=[0])) == failover.rollback
    assert m.selected == failover.rollback


def test_static_fallbacks(failover) -> None:
    m = fresh()
    m.select(failover.first_vb0)
    page = m._repr_html_()
    assert "<table" in page and "DCP_STREAM_REQ" in page and f"frame {failover.first_vb0}" in page
    assert f"{failover.frames} frames" in m.text()


# --- loading in the background ------------------------------------------------------


def _same_breakdown(m: ExplorerModel, frame: int) -> None:
    """The selected frame is the capture's, bytes and context, and so is what the view shows of it."""
    rec = next(r for r in read_records([BRANCHES]) if r.number == frame)
    ev, ctx = m.selected_event()
    assert type(ev) is type(rec.event) and bytes(ev[1]) == bytes(rec.event[1]) and ctx == rec.context
    assert annotate(ev, context=ctx) == annotate(rec.event, context=rec.context)
    html = f"<div><b>frame {frame}</b></div>" + annotate_html(rec.event, context=rec.context)
    assert re.sub(r"dcpi\d+", "ID", m.annotation_html()) == re.sub(r"dcpi\d+", "ID", html)  # ids are per rendering


def test_background_load_shows_the_first_chunk_then_the_rest(manual, failover) -> None:
    """The first chunk is read at once and paged; the rest waits for the runner (here: run by hand, no thread)."""
    m = ExplorerModel(runner=manual, page_size=5)
    heard: list[tuple[str, int, bool]] = []
    m.on_change(lambda what: heard.append((what, m.store.rows, m.loading)))
    m.load([BRANCHES], background=True, rows=10)
    chunks = [p.batch.num_rows for p in read_parts([BRANCHES], rows=10)]
    assert len(chunks) > 2 and sum(chunks) == failover.frames
    assert m.loading and m.store.rows == chunks[0] and len(manual.jobs) == 1
    assert [r["frame"] for r in m.page_rows()] == [1, 2, 3, 4, 5]
    assert "(loading...)" in m.summary() and not m.runner.join() and not heard
    manual.run_jobs()
    assert not m.loading and m.error is None and "(loading...)" not in m.summary()
    # a chunk at a time, then the end
    so_far = list(itertools.accumulate(chunks))
    assert heard == [*(("rows", n, True) for n in so_far[1:]), ("rows", failover.frames, False)]
    assert m.store.table.equals(frames_table([BRANCHES]))


def test_background_load_in_a_thread(failover) -> None:
    """A real thread: wait for the model to say it finished, then check what it holds against the table and the timeline."""
    finished = threading.Event()
    m = ExplorerModel()
    m.on_change(lambda what: finished.set() if what == "rows" and not m.loading else None)
    m.load([BRANCHES], background=True, rows=16)
    assert finished.wait(WAIT)
    assert m.wait(WAIT) is m and m.error is None
    assert m.store.table.equals(frames_table([BRANCHES]))
    assert m.total == failover.frames and [r["frame"] for r in m.page_rows()] == list(range(1, 51))
    t = build_timeline(read_records([BRANCHES]))
    assert [s.as_dict() for s in m.timeline.streams] == [s.as_dict() for s in t.streams]
    m.select(failover.rollback)
    _same_breakdown(m, failover.rollback)
    assert "0x0023 (Rollback)" in m.annotation_html()


def test_a_load_error_is_kept_not_lost_in_the_thread(manual, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error after the first chunk (in the thread) ends the load and is shown, not lost."""
    m = ExplorerModel(runner=manual)
    m.load([BRANCHES], background=True, rows=10)
    take = m._take_chunk

    def broken(chunk) -> None:
        take(chunk)
        raise OSError("the disk went away")

    monkeypatch.setattr(m, "_take_chunk", broken)
    heard: list[str] = []
    m.on_change(heard.append)
    manual.run_jobs()
    assert not m.loading and m.error == "OSError: the disk went away"
    first, second = (p.batch.num_rows for p in itertools.islice(read_parts([BRANCHES], rows=10), 2))
    assert m.store.rows == first + second and heard == ["rows"]  # the chunk in hand, then the end of the load


# --- live -------------------------------------------------------------------------


def test_live_records_are_folded_in_by_the_runner(manual, live_session) -> None:
    """A record only queues; one fold is scheduled per interval, whatever the number of records."""
    cap = LiveCapture()
    m = ExplorerModel.live(cap, interval=0.25, runner=manual)
    heard: list[str] = []
    m.on_change(heard.append)
    live_session(cap)
    assert m.store.rows == 0 and [d for d, _fn in manual.calls] == [0.25]
    manual.run_calls()
    assert m.store.rows == 6 and heard == ["rows"]
    assert m.timeline.streams[0].last_seqno == 3
    m.on_record(cap_record := next(iter(read_records([BRANCHES]))))
    assert len(manual.calls) == 1 and m.store.rows == 6  # the next record schedules the next fold
    manual.run_calls()
    assert m.store.rows == 7 and m.store.frames()[-1] == cap_record.number


def test_folds_never_interleave(manual, live_session) -> None:
    """A fold on a timer thread and a later one keep the records' order, in the table and in the timeline."""
    from dcpinspect.views.store import FrameStore

    entered, go = threading.Event(), threading.Event()

    class SlowStore(FrameStore):
        calls = 0

        def add_records(self, records):  # the first fold stops here until the test lets it go on
            SlowStore.calls += 1
            if SlowStore.calls == 1:
                entered.set()
                assert go.wait(WAIT)
            return super().add_records(records)

    cap = LiveCapture()
    m = ExplorerModel.live(cap, runner=manual)
    m.store = SlowStore()
    live_session(cap)  # 6 records queued
    first = threading.Thread(target=m.flush)
    first.start()
    assert entered.wait(WAIT)  # the first fold holds records 1-6
    later = list(itertools.islice(read_records([BRANCHES]), 4))
    m.feed_many(later)  # 4 more, queued while the first fold is under way
    second = threading.Thread(target=m.flush)
    second.start()
    go.set()
    first.join(WAIT)
    second.join(WAIT)
    assert not first.is_alive() and not second.is_alive()
    names = m.store.table.column("name").to_pylist()
    queued_later = frames_table([BRANCHES]).column("name").to_pylist()[:4]
    assert names == ["DCP_STREAM_REQ"] * 2 + ["DCP_SNAPSHOT_MARKER"] + ["DCP_MUTATION"] * 3 + queued_later


def test_live_append_thread_timer(live_session) -> None:
    """Without an event loop the fold runs on a timer thread: wait for the model to say it has every row."""
    m = ExplorerModel.live(interval=0.01)
    all_in = threading.Event()
    m.on_change(lambda what: all_in.set() if what == "rows" and m.store.rows == 6 else None)
    cap = LiveCapture(on_record=m.on_record)
    live_session(cap)
    assert all_in.wait(WAIT)
    assert m.store.rows == 6
    assert m.timeline.streams[0].last_seqno == 3
    m.select(6)
    assert "DCP_MUTATION" in m.annotation_html()


def test_live_attach_on_event_loop(live_session) -> None:
    """On a running event loop the fold is a call_later on it: await the model's change, never a sleep."""

    async def run() -> ExplorerModel:
        cap = LiveCapture()
        m = ExplorerModel.live(cap, interval=0.01)
        all_in = asyncio.Event()
        on_loop = []
        m.on_change(lambda what: (on_loop.append(threading.current_thread()), all_in.set() if m.store.rows == 8 else None))
        live_session(cap, items=5)
        assert m.store.rows == 0  # nothing folded in yet: the callback only queued
        await asyncio.wait_for(all_in.wait(), WAIT)
        assert set(on_loop) == {threading.current_thread()}  # folded on the loop's own thread
        return m

    m = asyncio.run(run())
    assert m.store.rows == 8
    m.set_filters(opcode="DCP_MUTATION")
    assert m.total == 5
