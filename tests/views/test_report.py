"""The analysis report (no Spark): sections per capture set, time from each set's start, one small plot per stream, words that agree with numbers, escaping, anomaly links."""

from __future__ import annotations

import copy
import dataclasses
import re
from functools import cache

import matplotlib
import numpy as np

matplotlib.use("Agg")

import pytest
from paths import CAPTURES

from dcpinspect import encode
from dcpinspect.tables.timeline_feed import read_timeline
from dcpinspect.timeline import Anomaly
from dcpinspect.views import report
from dcpinspect.views.report_html import plural
from dcpinspect.views.report_sets import split_sets

OLD = str(CAPTURES / "dcp-session.pcap")  # recorded in 2025
NEW = str(CAPTURES / "live-plain.pcap")  # recorded in 2026
LOSSY = str(CAPTURES / "live-loss-reorder.pcap")  # anomalies naming frames
EVIL = "<script>alert(1)</script>"


@cache
def page(*paths: str) -> str:
    return report.report_from_captures(list(paths))


def section(html: str, number: int) -> str:
    """The HTML of capture set ``number``'s section."""
    start = html.index(f"<section class='set' id='set-{number}'>")
    return html[start : html.index("</section>", start)]


def anchors(html: str) -> set[str]:
    return set(re.findall(r"\bid='([^']+)'", html))


def test_plural_agrees_with_the_number() -> None:
    assert plural(1, "connection") == "1 connection"
    assert plural(2, "connection") == "2 connections"
    assert plural(0, "stream") == "0 streams"
    assert plural(1, "anomaly", "anomalies") == "1 anomaly"
    assert plural(1234, "frame") == "1,234 frames"


def test_one_section_per_capture_set_each_with_its_own_streams() -> None:
    html = page(OLD, NEW)
    one, two = section(html, 1), section(html, 2)
    assert "dcp-session.pcap" in one and "live-plain.pcap" in two
    assert "id='set-3'" not in html
    t = read_timeline([OLD, NEW])
    conn_of = {i: s.conn for i, s in enumerate(t.streams)}
    first_file = {c: info.file for c, info in t.connections.items()}
    for number, text in ((1, one), (2, two)):
        shown = [int(i) for i in re.findall(r"<figure class='stream[^']*' id='stream-(\d+)'", text)]
        assert shown, f"set {number} draws no stream"
        assert {first_file[conn_of[i]] for i in shown} == {(OLD, NEW)[number - 1]}
    # the header and each set say their counts in words that agree with them
    assert "1 connection ·" in one and "1 connections" not in html
    assert "<b>2</b>capture sets" in html


def test_time_is_counted_from_each_sets_start() -> None:
    """Files a year apart: each set is a fraction of a second long, and its plots' x values start near 0."""
    html = page(OLD, NEW)
    lengths = [float(m) for m in re.findall(r"Starts [^<]*?, ([0-9.,]+) s long", html)]
    assert len(lengths) == 2 and all(0 < v < 5 for v in lengths)
    assert "2025-" in section(html, 1) and "2026-" in section(html, 2)
    t = read_timeline([OLD, NEW])
    for p in split_sets(t, None, [{"path": OLD, "capture_set": 1}, {"path": NEW, "capture_set": 2}]):
        start = min(it.ts for s in p.timeline.streams for it in s.items)
        p.start_ts = start
        fig = report.stream_figure(p, 0)
        xs = np.concatenate([ln.get_xdata() for ln in fig.axes[0].get_lines() if str(ln.get_gid()).startswith("stream:")])
        assert 0 <= xs.min() < 5 and xs.max() < 5  # seconds since the set's first frame, not since 2025


def test_each_stream_has_its_own_scale() -> None:
    """A stream at seqno 16 million beside one at seqno 3: each plot's y axis fits its own stream."""
    t = copy.copy(read_timeline([NEW]))
    base = t.streams[0]
    high = copy.copy(base)
    high.vbucket = 99
    up = 16_000_000
    high.items = [it._replace(seqno=up + (it.seqno or 0)) for it in base.items]
    high.attempts = [dataclasses.replace(at, start=up + at.start) for at in base.attempts]
    high.snapshots = [dataclasses.replace(sn, start=up + sn.start, end=up + sn.end) for sn in base.snapshots]
    high.last_seqno = up + (base.last_seqno or 0)
    t.streams = [base, high]
    (p,) = split_sets(t)
    lows = report.stream_figure(p, 0).axes[0].get_ylim()
    highs = report.stream_figure(p, 1).axes[0].get_ylim()
    assert lows[1] < 1_000_000 and highs[0] > 1_000_000


def test_a_subset_of_streams_is_said_and_the_rest_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    t = copy.copy(read_timeline([NEW]))
    t.streams = [copy.copy(t.streams[i % len(t.streams)]) for i in range(30)]
    for i, s in enumerate(t.streams):
        s.vbucket = 1000 + i
    monkeypatch.setattr(report, "MAX_STREAM_PLOTS", 4)
    html = report.render_report(t, None, [], counts={"streams": 30})
    assert "showing 4 of 30 streams" in html and "the rest are in the table below" in html
    assert len(re.findall(r"<figure class='stream", html)) == 4
    rest = html[html.index("showing 4 of 30 streams") :]
    assert len(re.findall(r"<tr><td>", rest)) == 26  # every stream not drawn, one row each
    # the table is bounded too, and says how many rows it left out
    monkeypatch.setattr(report, "MAX_ROWS", 10)
    html = report.render_report(t, None, [], counts={"streams": 30})
    rest = html[html.index("showing 4 of 30 streams") :]
    assert len(re.findall(r"<tr><td>", rest)) == 10 and "... and 16 more rows in the streams table" in rest


def test_a_long_name_is_cut() -> None:
    t = copy.copy(read_timeline([NEW]))
    (c,) = t.connections.values()
    t.connections = {c.conn: dataclasses.replace(c, name=EVIL + "x" * 5000)}
    html = report.render_report(t, None, [], counts={})
    assert "x" * 400 not in html and "more characters)" in html and "<script>" not in html


def test_hostile_wire_text_is_escaped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pcapfactory import Conn, Msg, write_capture

    mut = {"by_seqno": 1, "rev_seqno": 1, "flags": 0, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0}
    snap = {"start_seqno": 1, "end_seqno": 2, "flags": 1}
    msgs = [
        Msg("c2s", encode("DCP_OPEN", key=EVIL, extras={"flags": 0}, opaque=1)),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=1)),
        Msg("c2s", encode("DCP_STREAM_REQ", vbucket=0, opaque=3, extras={"end_seqno": 2**64 - 1})),
        Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=3, value=[(0xFEED, 0)])),
        Msg("s2c", encode("DCP_SNAPSHOT_MARKER", vbucket=0, opaque=3, extras=snap)),
        Msg("s2c", encode("DCP_MUTATION", vbucket=0, opaque=3, extras=mut, key=EVIL, value=b"{}")),
        Msg("s2c", encode("DCP_MUTATION", vbucket=0, opaque=3, extras={**mut, "by_seqno": 2}, key=EVIL, value=b"{}")),
    ]
    path = write_capture(tmp_path / "<b>evil<b>.pcap", [Conn(msgs=msgs, close=None)]).path
    html = report.report_from_captures([str(path)])
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the DCP_OPEN name and the key in the message
    assert "<b>evil" not in html and "&lt;b&gt;evil&lt;b&gt;.pcap" in html  # the file name
    assert "key twice in snapshot" in html


def test_anomalies_link_to_their_frames_by_file_and_frame_in_set() -> None:
    html = page(NEW, LOSSY)
    ids = anchors(html)
    links = re.findall(r"href='#(frame-\d+)'[^>]*>([^<]+)</a>", html)
    assert links, "no anomaly links"
    assert {target for target, _text in links} <= ids  # every link lands on a row
    t = read_timeline([NEW, LOSSY])
    first = min(f for a in t.anomalies for f in a.frames)
    lossy_first = next(p.first_frame for p in split_sets(t) if p.number == 2) if t.set_first else None
    for target, text in links:
        assert text.startswith("live-loss-reorder.pcap #")
        frame = int(target.split("-")[1])
        if lossy_first is not None:
            assert text.endswith(f"#{frame - lossy_first + 1:,}")  # the number within its set, as `show FILE --frame N` takes it
    row = html[html.index(f"id='frame-{first}'") :]
    row = row[: row.index("</tr>")]
    assert "live-loss-reorder.pcap" in row and "dcpinspect show" in row


def test_every_connection_is_listed_with_its_file_and_set() -> None:
    html = page(OLD, NEW, str(CAPTURES / "messy.pcap"))
    from dcpinspect.flows.records import CaptureStats
    from dcpinspect.tables.columnar import read_parts

    stats = CaptureStats()
    for _ in read_parts([OLD, NEW, str(CAPTURES / "messy.pcap")], stats=stats):
        pass
    assert any(c.tls for c in stats.connections)  # the TLS one too
    for c in stats.connections:
        at = html.index(f"<tr id='conn-{c.id}'>")
        row = html[at : html.index("</tr>", at)]
        assert c.file.rsplit("/", 1)[-1] in row


def test_a_timeline_without_sets_is_one_set() -> None:
    t = read_timeline([NEW])
    t.set_first = {}
    t.anomalies = [Anomaly("seqno not increasing", [3], "<b>bad</b>", None, None)]
    html = report.render_report(t, None, [], counts={"anomalies": 1})
    assert "id='set-1'" in html and "id='set-2'" not in html
    assert "&lt;b&gt;bad&lt;/b&gt;" in html and "<b>bad</b>" not in html
    assert "href='#frame-3'" in html and "id='frame-3'" in html


def test_each_sets_clock_is_converted_once_for_all_its_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream plots, flow and noops of a set share one clock: its frame/time arrays are built once, not once per plot."""
    from dcpinspect.views import drawing

    made: list[int] = []
    init = drawing.Clock.__init__

    def counting(self, known, x) -> None:  # type: ignore[no-untyped-def]
        init(self, known, x)
        made.append(self.conversions)

    monkeypatch.setattr(drawing.Clock, "__init__", counting)
    paths = [str(CAPTURES / "live-stream-ends.pcap"), str(CAPTURES / "live-stream-ids.pcap")]
    page = report.report_from_captures(paths)
    assert page.count("class='stream'") + page.count('class="stream"') >= 4  # several stream plots per set were drawn
    assert len(made) > 4 and sum(made) == 2  # one conversion per capture set
