"""Fixtures of the views' tests: a capture with HTML in a key, a short live session, a Background run by hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.live.tap import LiveCapture

EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="session")
def evil_capture(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A stream whose one mutation has :data:`EVIL` as its key and value."""
    path = tmp_path_factory.mktemp("evil") / "evil.pcap"
    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210))
        conv.open(1_000_000)
        ts = 2_000_000
        ts = conv.send("c2s", encode("DCP_STREAM_REQ", opaque=1, vbucket=0, extras={"start_seqno": 0, "end_seqno": 2**64 - 1}), ts)
        ts = conv.send("s2c", encode("DCP_STREAM_REQ", opaque=1, status=0), ts)
        ts = conv.send("s2c", encode("DCP_SNAPSHOT_MARKER", opaque=1, vbucket=0, extras={"start_seqno": 1, "end_seqno": 1, "flags": 1}), ts)
        mut = encode("DCP_MUTATION", opaque=1, vbucket=0, extras={"by_seqno": 1, "rev_seqno": 1}, key=EVIL, value=EVIL.encode())
        ts = conv.send("s2c", mut, ts)
        conv.close(ts)
    return str(Path(path))


def _live_session(cap: LiveCapture, items: int = 3) -> None:
    conn = cap.connection(("127.0.0.1", 50000), ("127.0.0.1", 11210), ts=1)
    conn.data("c2s", encode("DCP_STREAM_REQ", opaque=7, vbucket=5, extras={"start_seqno": 0, "end_seqno": 2**64 - 1}), ts=2)
    conn.data("s2c", encode("DCP_STREAM_REQ", opaque=7, status=0), ts=3)
    conn.data("s2c", encode("DCP_SNAPSHOT_MARKER", opaque=7, vbucket=5, extras={"start_seqno": 1, "end_seqno": items, "flags": 1}), ts=4)
    for i in range(items):
        conn.data(
            "s2c",
            encode("DCP_MUTATION", opaque=7, vbucket=5, extras={"by_seqno": i + 1, "rev_seqno": 1}, key=f"k{i}", value=b"v"),
            ts=5 + i,
        )


@pytest.fixture
def live_session() -> Callable[..., None]:
    """``live_session(capture, items=3)``: a stream request, its answer, a marker and ``items`` mutations, one record each."""
    return _live_session


class ManualBackground:
    """A :class:`~dcpinspect.views.background.Background` that runs nothing until the test says so: no thread, no clock."""

    def __init__(self) -> None:
        self.jobs: list[Callable[[], None]] = []
        self.calls: list[tuple[float, Callable[[], Any]]] = []

    def start(self, job: Callable[[], None], *, name: str = "") -> None:
        self.jobs.append(job)

    def join(self, timeout: float | None = None) -> bool:
        return not self.jobs

    def later(self, delay: float, fn: Callable[[], Any]) -> None:
        self.calls.append((delay, fn))

    def run_jobs(self) -> None:
        """What the thread would have done."""
        while self.jobs:
            self.jobs.pop(0)()

    def run_calls(self) -> None:
        """What the timer or the event loop would have called."""
        while self.calls:
            self.calls.pop(0)[1]()


@pytest.fixture
def manual() -> ManualBackground:
    """A Background the test runs by hand."""
    return ManualBackground()
