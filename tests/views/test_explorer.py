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
    """The whole read waits for the runner (here: run by hand, no thread); the listeners hear of it O(log n) times."""
    m = ExplorerModel(runner=manual, page_size=5)
    heard: list[tuple[str, int, bool]] = []
    pages: list[list[int]] = []
    m.on_change(lambda what: (heard.append((what, m.store.rows, m.loading)), pages.append([r["frame"] for r in m.page_rows()])))
    m.load([BRANCHES], background=True, rows=10)
    chunks = [p.batch.num_rows for p in read_parts([BRANCHES], rows=10)]
    assert len(chunks) > 2 and sum(chunks) == failover.frames
    assert m.loading and m.store.rows == 0 and len(manual.jobs) == 1  # the view opens at once
    assert "(loading...)" in m.summary() and not m.runner.join() and not heard
    manual.run_jobs()
    assert not m.loading and m.error is None and "(loading...)" not in m.summary()
    # after the 1st, 2nd, 4th, 8th... chunk, then the end: O(log n) redraws, the first page after the first chunk
    so_far = list(itertools.accumulate(chunks))
    told = [n for k, n in enumerate(so_far, 1) if k & (k - 1) == 0]
    assert heard == [*(("rows", n, True) for n in told), ("rows", failover.frames, False)]
    assert len(heard) <= len(chunks).bit_length() + 1 < len(chunks) and m.notified == len(heard)
    assert pages[0] == [1, 2, 3, 4, 5] and m.chunks == len(chunks)
    assert m.store.plain_table().equals(frames_table([BRANCHES]))


def test_background_load_in_a_thread(failover) -> None:
    """A real thread: wait for the model to say it finished, then check what it holds against the table and the timeline."""
    finished = threading.Event()
    m = ExplorerModel()
    m.on_change(lambda what: finished.set() if what == "rows" and not m.loading else None)
    m.load([BRANCHES], background=True, rows=16)
    assert finished.wait(WAIT)
    assert m.wait(WAIT) is m and m.error is None
    assert m.store.plain_table().equals(frames_table([BRANCHES]))
    assert m.total == failover.frames and [r["frame"] for r in m.page_rows()] == list(range(1, 51))
    t = build_timeline(read_records([BRANCHES]))
    assert [s.as_dict() for s in m.timeline.streams] == [s.as_dict() for s in t.streams]
    m.select(failover.rollback)
    _same_breakdown(m, failover.rollback)
    assert "0x0023 (Rollback)" in m.annotation_html()


def test_a_load_error_is_kept_not_lost_in_the_thread(manual, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error in the thread ends the load and is shown, not lost; what was read stays."""
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
    first = next(read_parts([BRANCHES], rows=10)).batch.num_rows
    assert m.store.rows == first and heard == ["rows"]  # the chunk in hand, then the end of the load


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


# --- work done, not time taken (issue 16: the explorer on 1M frames) ---------------------


def _mutations(path, n: int, *, streams: int = 1, snapshot_every: int = 0, cut_last: int = 0) -> str:
    """A capture of ``n`` mutations per stream over ``streams`` vbuckets of one connection (markers every ``snapshot_every``)."""
    from dcpinspect import encode
    from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation

    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210))
        conv.open(1_000_000)
        ts = 2_000_000
        for vb in range(streams):
            req = encode("DCP_STREAM_REQ", opaque=vb + 1, vbucket=vb, extras={"start_seqno": 0, "end_seqno": 2**64 - 1})
            ts = conv.send("c2s", req, ts)
            ts = conv.send("s2c", encode("DCP_STREAM_REQ", opaque=vb + 1, status=0), ts)
        data = []
        for i in range(n):
            for vb in range(streams):
                if snapshot_every and i % snapshot_every == 0:
                    ext = {"start_seqno": i + 1, "end_seqno": i + snapshot_every, "flags": 1}
                    data.append(encode("DCP_SNAPSHOT_MARKER", opaque=vb + 1, vbucket=vb, extras=ext))
                ext = {"by_seqno": i + 1, "rev_seqno": 1}
                data.append(encode("DCP_MUTATION", opaque=vb + 1, vbucket=vb, extras=ext, key=f"k{i}", value=b"v" * 8))
        blob = b"".join(data)
        ts = conv.send("s2c", blob[: len(blob) - cut_last] if cut_last else blob, ts, step_ns=1000)
        if not cut_last:
            conv.close(ts)
    return str(path)


def test_the_clock_converts_the_frames_once_for_every_band_and_mark(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plots' clock turns the frames' times into floats once (was: once per snapshot band), and the model makes it once."""
    from dcpinspect.views import drawing

    made: list[drawing.Clock] = []
    real = drawing.Clock.__init__

    def spy(self, *args, **kw) -> None:
        real(self, *args, **kw)
        made.append(self)

    monkeypatch.setattr(drawing.Clock, "__init__", spy)
    m = ExplorerModel.open(_mutations(tmp_path / "snaps.pcap", 400, snapshot_every=2))
    s = m.timeline.streams[0]
    assert len(s.snapshots) == 200
    m.select(s.items[-1].frame)
    m.shown().png("stream")
    m.show_stream(None)
    m.shown().png("stream")
    assert sum(c.conversions for c in made) == 1  # one conversion for both pictures and every band and mark in them
    assert len(made) >= 2  # each plot wraps the model's clock: no new conversion


def test_pictures_draw_a_bounded_number_of_points_and_bands(tmp_path) -> None:
    from dcpinspect.views import explorer as ex
    from dcpinspect.views.plots import MAX_BANDS, frames_of

    m = ExplorerModel.open(_mutations(tmp_path / "many.pcap", 3000, streams=3, snapshot_every=2))
    t = m.timeline
    assert [len(s.items) for s in t.streams] == [len(s.items) for s in t.streams] and max(
        len(s.items) for s in t.streams
    ) <= 2 * ex.MAX_ITEMS
    assert [m.builder.items_seen(i) for i in range(3)] == [3000] * 3  # the true counts are kept
    m.show_stream(None)
    fig = m.shown().figures["stream"]
    lines = [a for a in fig.axes[0].get_lines() if (a.get_gid() or "").startswith("stream:")]
    assert len(lines) == 3 and sum(len(frames_of(a)) for a in lines) <= max(ex.MAX_POINTS, 300)
    bands = [c for c in fig.axes[0].collections if (c.get_gid() or "").startswith("snapshots:")]
    assert bands and all(len(c.get_paths()) <= MAX_BANDS for c in bands)
    # the stream filter still knows every item of a thinned stream
    m.set_filters(stream=0)
    names = [r["name"] for r in m.store.plain_table().take(m.indices()).select(["name"]).to_pylist()]
    assert names.count("DCP_MUTATION") == 3000 and names.count("DCP_SNAPSHOT_MARKER") == 1500


def test_the_stream_selector_picks_the_picture(failover) -> None:
    m = fresh()
    heard: list[str] = []
    m.on_change(heard.append)
    assert m.shown_stream() is None and len(m.shown().figures["stream"].axes[0].get_lines()) >= 1
    m.select(failover.request)
    story = m.stream_of(failover.request)
    assert m.shown_stream() == story  # the pictures follow the selected frame
    other = next(i for i, _l in m.streams() if i != story)
    m.show_stream(other)
    assert heard[-1] == "plot" and m.shown().key[0] == other and m.selected == failover.request  # the selection stays
    with pytest.raises(KeyError):
        m.show_stream(10_000)


def test_a_truncated_frame_is_dissected_as_far_as_it_goes(tmp_path) -> None:
    """The last mutation cut 5 bytes short: the explorer shows its header, extras and key, and what is missing."""
    m = ExplorerModel.open(_mutations(tmp_path / "cut.pcap", 3, cut_last=5))
    rows = m.store.plain_table().to_pylist()
    (cut,) = (r for r in rows if r["type"] == "truncated")
    m.select(cut["frame"])
    page = m.annotation_html()
    assert "5 bytes not captured" in page and "DCP_MUTATION" in page and "k2" in page and "by seqno" in page


def test_the_display_filter_and_its_errors(failover) -> None:
    m = fresh()
    m.set_filters(text="name == 'DCP_STREAM_REQ' and dir == 'c2s'")
    assert m.filter_error is None and m.total == len(failover.requests)
    m.set_filters(text="name.contains('STREAM_END')")
    assert m.total == len(failover.ends)
    m.set_filters(text="vbucket ==")
    assert m.filter_error and "\n" not in m.filter_error and m.total == failover.frames  # nothing hidden by a bad filter
    m.set_filters(text="nosuch == 1")
    assert "nosuch" in m.filter_error
    m.set_filters(text="")
    assert m.total == failover.frames


def test_the_store_holds_the_table_compact_and_outside_the_heap(failover) -> None:
    """Few-valued text columns dictionary-encoded, batches memory-mapped from a spill file; the plain table is the frames table."""
    import pyarrow as pa

    m = fresh()
    t = m.store.compact
    assert pa.types.is_dictionary(t.schema.field("name").type) and pa.types.is_dictionary(t.schema.field("file").type)
    assert m.store.plain_table().equals(frames_table([BRANCHES]))
    maps = [(buf.address, buf.address + buf.size) for _start, _m, buf in m.store._batch_spill._maps]  # type: ignore[union-attr]
    for col in ("frame", "ts", "key"):  # the columns' bytes are the spill file's pages, not the heap's
        for chunk in t.column(col).chunks:
            data = chunk.buffers()[-1]
            assert any(lo <= data.address and data.address + data.size <= hi for lo, hi in maps)
    assert m.store.raw(0) == next(iter(read_records([BRANCHES]))).event.raw
    assert m.store.table.equals(m.store.plain_table()) and m.store.table.schema.field("name").type == pa.string()
    again = ExplorerModel.open(m.store.compact, timeline=False)  # a compact table is taken as it is
    assert again.store.plain_table().equals(m.store.plain_table())


def test_the_load_reads_and_spills_in_bounded_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader parses READ_WINDOW bytes at a time and the store spills COALESCE_ROWS rows at a time: a load's peak memory is theirs, not the capture's."""
    from dcpinspect.views import explorer, store

    asked: list[dict] = []

    def reading(paths, **kw):
        asked.append(kw)
        return read_parts(paths, **kw)

    monkeypatch.setattr(explorer, "read_parts", reading)
    monkeypatch.setattr(store, "COALESCE_ROWS", 40)
    m = ExplorerModel()
    m.load([BRANCHES], rows=10)
    assert [kw["window"] for kw in asked] == [explorer.READ_WINDOW] and explorer.READ_WINDOW <= 4 << 20
    sizes = [b.num_rows for b in m.store.compact.to_batches()]
    assert len(sizes) >= 3 and max(sizes) < 40 + 10  # each spilled once COALESCE_ROWS rows are in, not at the end
    assert m.store.plain_table().equals(frames_table([BRANCHES]))


def _mapped_kib(lo: int, hi: int) -> int:
    """KiB of the process's resident set in the mappings within [lo, hi) (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                start, end = (int(x, 16) for x in head.split("-"))
                inside = lo <= start and end <= hi
            elif inside and head == "Rss:":
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_an_action_lets_the_pages_it_read_go() -> None:
    """A filter reads the spill file's pages into the resident set; once the action is done they leave it (the data stays)."""
    m = fresh()
    spill = m.store._batch_spill
    assert spill is not None
    (_start, _map, buf), *_ = spill._maps
    before = m.store.plain_table()
    m.store.forget_pages()
    assert _mapped_kib(buf.address, buf.address + buf.size) == 0
    assert m.store.compact.column("key").to_pylist()  # read: the column's pages are mapped in
    assert _mapped_kib(buf.address, buf.address + buf.size) > 0
    m.set_filters(key="doc")  # an action: the view (here none) answers, then the pages go
    assert _mapped_kib(buf.address, buf.address + buf.size) == 0
    assert m.store.plain_table().equals(before)  # read again from the file: the same table
