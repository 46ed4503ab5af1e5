"""The replay as DataFrames and a notebook widget (:mod:`dcpinspect.views.replay_view`): known divergences, a model refreshed by hand, escaped text."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from typing import Any

import pandas as pd
from paths import CAPTURES, ROOT

from dcpinspect import encode
from dcpinspect.capture.read import read_records
from dcpinspect.live.replay import ReplayConnection
from dcpinspect.live.replay_script import Script, extract_script
from dcpinspect.live.replay_server import ReplayServer
from dcpinspect.live.sasl import plain_payload
from dcpinspect.views.replay_view import (
    DIVERGENCE_COLUMNS,
    SUMMARY_COLUMNS,
    LoopRunner,
    ReplayModel,
    divergences_frame,
    replay_summary,
    replay_view,
)

EVIL = "evil<script>alert(1)</script>\x1b[31m"


def _script() -> Script:
    return extract_script(read_records(CAPTURES / "live-rollback-retry.pcap"))


def _open(conn: ReplayConnection, now: float, name: str = "live-rollback-retry") -> None:
    for raw in (
        encode("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password"), opaque=1),
        encode("SELECT_BUCKET", key="default", opaque=2),
        encode("DCP_OPEN", key=name, extras={"flags": 1}, opaque=3),
    ):
        conn.receive(raw, now)
    conn.data_to_send()


def _differing(s: Script, serial: int = 1, started: float = 100.0) -> ReplayConnection:
    """A connection that asks vbucket 0 from seqno 5 (the recording asked 12 and was rolled back) 2.5 s after it began."""
    conn = ReplayConnection(s, pace="fast", now=started, serial=serial)
    _open(conn, started)
    uuid = s.vbuckets[0].failover_log[0][0]
    req = {"start_seqno": 5, "end_seqno": 12, "vb_uuid": uuid, "snap_start_seqno": 5, "snap_end_seqno": 5}
    conn.receive(encode("DCP_STREAM_REQ", extras=req, opaque=77), started + 2.5)
    conn.data_to_send()
    return conn


def test_divergences_frame_of_sans_io_connections_has_the_known_rows() -> None:
    s = _script()
    a = _differing(s, serial=1)
    b = ReplayConnection(s, serial=2, now=50.0)
    b.receive(encode("HELLO", key="other", value=[(0x12,), (0x0B,), (0x1C,)], opaque=5), 51.0)  # features the recording did not ask
    df = divergences_frame([a, b])
    assert list(df.columns) == list(DIVERGENCE_COLUMNS)
    assert list(df["conn"]) == [1, 2] and list(df["kind"]) == ["stream_request", "hello"]
    assert list(df["at"]) == [2.5, 1.0]  # seconds since each connection began
    row = df.iloc[0]
    assert row["asked"].startswith("DCP_STREAM_REQ vb 0 start 5") and "Rollback to 0" in row["recorded"] and "Success" in row["answered"]
    assert divergences_frame([ReplayConnection(s)]).empty and list(divergences_frame([]).columns) == list(DIVERGENCE_COLUMNS)


def test_replay_summary_has_a_row_per_connection() -> None:
    s = _script()
    a, b = _differing(s, serial=1), ReplayConnection(s, serial=2)
    df = replay_summary([a, b])
    assert list(df.columns) == list(SUMMARY_COLUMNS) and list(df["conn"]) == [1, 2]
    assert list(df["divergences"]) == [1, 0] and list(df["streams_by_rule"]) == [1, 0] and list(df["items"]) == [7, 0]
    assert df.iloc[0]["name"] == "live-rollback-retry"


class FakeServer:
    """What the model reads of a ReplayServer, with connections added by the test."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections: list[ReplayConnection] = []
        self.host, self.port, self.pace, self.serving, self.source = "127.0.0.1", 11210, "fast", True, "captures/live-rollback-retry.pcap"

    def divergences(self) -> list[dict[str, Any]]:
        return [r for c in self.connections for r in c.divergence_rows()]

    def summaries(self) -> list[dict[str, Any]]:
        return [c.summary() for c in self.connections]


def test_the_model_refreshes_on_its_timer_and_stops_when_the_server_is_done(manual: Any) -> None:
    s = _script()
    server = FakeServer(s)
    model = ReplayModel(server, runner=manual, interval=0.5).start()
    heard: list[str] = []
    model.on_change(heard.append)
    assert model.connections.empty and "0 connections (0 open)" in model.counts()
    assert "connection 1 'live-rollback-retry'" in model.script_line() and "of captures/live-rollback-retry.pcap" in model.script_line()
    ((delay, _fn),) = manual.calls
    assert delay == 0.5
    server.connections.append(_differing(s))
    assert model.divergences.empty  # nothing changes until the timer fires
    manual.calls.pop(0)[1]()
    assert heard == ["tables"] and len(model.divergences) == 1 and list(model.connections["conn"]) == [1]
    assert model.counts() == "1 connection (1 open), 7 items sent, 1 divergence"
    assert len(manual.calls) == 1  # rescheduled
    manual.calls.pop(0)[1]()
    assert heard == ["tables"] and model.changes == 1  # nothing changed: the listeners hear nothing
    server.connections[0].close("client closed the connection")
    server.serving = False
    manual.calls.pop(0)[1]()
    assert heard == ["tables", "tables"] and not model.running and manual.calls == []  # the server is done: no more timers


def test_stop_ends_the_refreshes(manual: Any) -> None:
    model = ReplayModel(FakeServer(_script()), runner=manual).start()
    model.stop()
    manual.run_calls()
    assert manual.calls == [] and not model.running


def test_the_widget_renders_escaped_text_without_a_front_end(manual: Any) -> None:
    s = _script()
    server = FakeServer(s)
    server.source = EVIL
    server.connections.append(_differing(s))
    hostile = ReplayConnection(s, serial=2)
    _open(hostile, 0.0, name=EVIL)  # the DCP name is the client's: wire text
    server.connections.append(hostile)
    view = replay_view(server, runner=manual)
    bundle = view._repr_mimebundle_()
    page, text = bundle["text/html"], bundle["text/plain"]
    for shown in (page, view.header.value, view.connections.value):
        assert "<script>" not in shown and "&lt;script&gt;" in shown and "\x1b" not in shown
    assert "\x1b" not in text and "evil<script>" in text  # plain text keeps the text, control characters escaped
    assert "Rollback to 0" in view.divergences.value and "stream_request" in page
    assert view.model.running and len(manual.calls) == 1  # the view's model refreshes on the runner's timer
    server.connections.append(ReplayConnection(s, serial=3))
    manual.calls.pop(0)[1]()
    assert view.connections.value.count("<tr") == 4  # the widget redrew: a header and three connections
    view.close()
    assert not view.model.running


def test_the_model_imports_no_widget_toolkit() -> None:
    code = "import sys, dcpinspect.views.replay_view; print('ipywidgets' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip() == "False"


def test_frames_are_dataframes() -> None:
    assert isinstance(divergences_frame([]), pd.DataFrame) and isinstance(replay_summary([]), pd.DataFrame)


def test_the_default_timer_is_on_the_servers_event_loop() -> None:
    """A real server: the view's refreshes are timers on its loop (no thread); they run there and stop once it is done."""

    async def go() -> tuple[ReplayModel, list[str]]:
        server = await ReplayServer(_script(), pace="fast").start()
        model = ReplayModel(server, interval=0.0)
        assert isinstance(model.runner, LoopRunner) and model.runner.loop is server.loop
        threads = threading.active_count()
        where: list[str] = []
        model.on_change(lambda _w: where.append(threading.current_thread().name))
        model.start()
        _reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(encode("HELLO", key="other", value=[(0x12,), (0x0B,), (0x1C,)], opaque=5))
        await writer.drain()
        writer.close()
        await server.until_closed(1)
        await server.stop()
        while model.running:  # the timer sees the server done and stops
            await asyncio.sleep(0)
        assert threading.active_count() == threads
        return model, where

    model, where = asyncio.run(asyncio.wait_for(go(), 60))
    assert list(model.divergences["kind"]) == ["hello"] and where and set(where) == {threading.main_thread().name}
