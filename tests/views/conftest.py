"""Fixtures of the views' tests: the failover capture's facts, a capture with HTML in a key, a short live session, a Background run by hand."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from paths import CAPTURES

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.capture.read import read_records
from dcpinspect.live.tap import LiveCapture
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.dissection import Dissection
from dcpinspect.wire.events import Frame

EVIL = "<script>alert(1)</script>"
BRANCHES = str(CAPTURES / "live-failover-branches.pcap")


@dataclass(frozen=True)
class Failover:
    """What ``live-failover-branches.pcap`` holds, read off its dissected records (not off the timeline the views draw).

    The story the views must show: a stream request on vbucket 0 resumes at ``resumed_at`` on a
    branch the new active node no longer has past ``rollback_seqno``, is answered Rollback, is
    retried from ``rollback_seqno`` and accepted with a failover log of two entries, and its stream
    ends (``end``).  ``first_vb0`` is vbucket 0's first request, on another connection: another stream.
    """

    path: str
    frames: int  # records in the capture
    requests: tuple[int, ...]  # every DCP_STREAM_REQ request, in capture order
    vb0_requests: tuple[int, ...]  # those on vbucket 0
    streams: int  # distinct (connection, vbucket) among the requests: the timeline's streams
    ends: tuple[int, ...]  # every DCP_STREAM_END
    request: int  # the request answered Rollback
    resumed_at: int  # its start seqno
    rollback: int  # the Rollback response
    rollback_seqno: int  # the seqno it names
    retry: int  # the next request on that connection and vbucket
    accepted: int  # the retry's Success
    failover_log: tuple[tuple[int, int], ...]  # (uuid, seqno) as the Success carries it, newest first
    end: int  # the retried stream's STREAM_END
    first_vb0: int  # vbucket 0's first request


class Msg(NamedTuple):
    """A frame of the capture with its record and its dissection."""

    number: int
    conn: int
    frame: Frame
    d: Dissection


def failover_facts(path: str = BRANCHES) -> Failover:
    records = list(read_records([path]))
    msgs = [Msg(r.number, r.conn, r.event, dissect(r.event, r.context)) for r in records if isinstance(r.event, Frame)]
    conn_of = {m.number: m.conn for m in msgs}

    def of(name: str, role: str) -> list[Msg]:
        return [m for m in msgs if m.frame.name == name and m.frame.role == role]

    reqs, answers, ends = of("DCP_STREAM_REQ", "request"), of("DCP_STREAM_REQ", "response"), of("DCP_STREAM_END", "request")
    (rb,) = (m for m in answers if m.d.get("rollback_seqno") is not None)
    (asked,) = (q for q in reqs if q.conn == rb.conn and q.frame.opaque == rb.frame.opaque and q.number < rb.number)
    retry = next(q for q in reqs if q.conn == rb.conn and q.frame.vbucket == asked.frame.vbucket and q.number > rb.number)
    ok = next(m for m in answers if m.conn == retry.conn and m.frame.opaque == retry.frame.opaque and m.number > retry.number)
    end = next(m for m in ends if m.conn == retry.conn and m.frame.opaque == retry.frame.opaque and m.number > ok.number)
    vb0 = tuple(q.number for q in reqs if q.frame.vbucket == 0)
    facts = Failover(
        path=path,
        frames=len(records),
        requests=tuple(q.number for q in reqs),
        vb0_requests=vb0,
        streams=len({(q.conn, q.frame.vbucket) for q in reqs}),
        ends=tuple(m.number for m in ends),
        request=asked.number,
        resumed_at=asked.d.get("start_seqno"),
        rollback=rb.number,
        rollback_seqno=rb.d.get("rollback_seqno"),
        retry=retry.number,
        accepted=ok.number,
        failover_log=tuple((e["vb_uuid"], e["vb_seqno"]) for e in ok.d.get("failover_log")),
        end=end.number,
        first_vb0=vb0[0],
    )
    # the capture's story as captures/README.md tells it: the facts above are that story's, not some other frames'
    assert asked.frame.vbucket == 0 and conn_of[facts.first_vb0] != rb.conn
    assert facts.resumed_at > facts.rollback_seqno > 0 and facts.retry == facts.rollback + 1
    assert retry.d.get("start_seqno") == facts.rollback_seqno
    assert len(facts.failover_log) == 2 and facts.failover_log[0][1] == facts.rollback_seqno
    assert all(0 < uuid < 2**48 for uuid, _ in facts.failover_log)  # the simulator's uuids are 48-bit
    return facts


@pytest.fixture(scope="session")
def failover() -> Failover:
    """The facts of ``live-failover-branches.pcap`` the views' tests check the views against."""
    return failover_facts()


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


# --- the browser tests' chromium --------------------------------------------------------------
BROWSER_START = 60_000  # ms chromium may take to start: generous, only reached when something is broken


def chromium_path() -> str | None:
    for candidate in (os.environ.get("DCPINSPECT_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian chromium through Playwright (never a downloaded browser)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
    exe = chromium_path()
    if exe is None:
        pytest.skip("no chromium at /usr/bin/chromium (apt-get install chromium; .ci/run does)")
    args = ["--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # chromium refuses to run its sandbox as root
    pw = sync_api.sync_playwright().start()
    try:
        try:
            b = pw.chromium.launch(executable_path=exe, headless=True, args=args, timeout=BROWSER_START)
        except Exception as exc:
            pytest.skip(f"chromium at {exe} did not start: {exc}")
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()
