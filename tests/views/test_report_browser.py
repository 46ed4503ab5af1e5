"""The analysis report in a real browser (Debian's chromium through Playwright): judged as a person would judge it.

The report of every shipped capture is rendered without Spark, opened from a
file, and screenshot whole (``/tmp/dcpinspect-report.png``, to look at).  Then:
nothing runs off the right edge, every picture loaded, every stream plot is big
enough to read, every connection has its row, every anomaly link lands on a
frame row, and a set that shows only some of its streams says so.  Skipped
(with the reason) only when chromium or Playwright cannot start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from paths import CAPTURES

from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.columnar import read_parts
from dcpinspect.views import report

pytestmark = pytest.mark.browser
WAIT = 60_000  # ms: generous, only reached when something is broken
SHOT = Path("/tmp/dcpinspect-report.png")
MIN_PLOT = (300, 170)  # px: a stream plot smaller than this is not readable
FEW = 2  # stream plots per set in the subset page


CAPTURE_FILES = sorted(str(p) for p in CAPTURES.glob("*.pcap"))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(report.report_from_captures(CAPTURE_FILES), encoding="utf-8")
    return path


def open_page(browser: Any, path: Path, width: int = 1400) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 1000}, java_script_enabled=True)
    page = context.new_page()
    page.set_default_timeout(WAIT)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (errors.append(d.message), d.dismiss()))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    page.errors = errors  # type: ignore[attr-defined]
    return page


def test_the_report_reads_well_in_a_browser(browser: Any, shipped: Path) -> None:
    page = open_page(browser, shipped)
    page.screenshot(path=str(SHOT), full_page=True)
    assert SHOT.stat().st_size > 10_000
    # nothing runs off the right edge
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth + 1")
    # every picture loaded
    images = page.evaluate("[...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
    assert images and all(ok and w > 0 and h > 0 for _alt, ok, w, h in images), [i for i in images if not (i[1] and i[2])]
    # each stream plot is big enough to read
    sizes = page.evaluate("[...document.querySelectorAll('img.stream')].map(i => [i.alt, i.width, i.height])")
    stats = CaptureStats()
    for _ in read_parts(CAPTURE_FILES, stats=stats):
        pass
    from dcpinspect.tables.timeline_feed import read_timeline

    t = read_timeline(CAPTURE_FILES)
    assert len(sizes) == len(t.streams)  # no shipped capture has more streams than a set draws
    small = [s for s in sizes if s[1] < MIN_PLOT[0] or s[2] < MIN_PLOT[1]]
    assert not small, small
    # every connection has its row, the TLS one too
    rows = set(page.evaluate("[...document.querySelectorAll('#connections tr[id]')].map(r => r.id)"))
    assert any(c.tls for c in stats.connections)
    assert {f"conn-{c.id}" for c in stats.connections} <= rows
    # every link inside the page lands somewhere, and anomalies link to frame rows naming their file
    dangling = page.evaluate(
        "[...document.querySelectorAll('a[href^=\"#\"]')].map(a => a.getAttribute('href')).filter(h => !document.getElementById(h.slice(1)))"
    )
    assert dangling == []
    frame_links = page.evaluate("[...document.querySelectorAll('a[href^=\"#frame-\"]')].map(a => [a.getAttribute('href'), a.textContent])")
    assert len(frame_links) >= len(t.anomalies)
    for href, text in frame_links:
        row = page.locator(f"tr{href}")
        assert row.count() == 1
        assert text.split(" #")[0] in row.inner_text()
    # the table of contents reaches every set
    toc = page.evaluate("[...document.querySelectorAll('nav.toc a')].map(a => a.getAttribute('href'))")
    assert "#lag" in toc  # the consumer-lag section, besides the sets and the other sections
    assert [h for h in toc if h.startswith("#set-")] == [f"#set-{i}" for i in range(1, len(toc) - 4)]
    assert not page.errors  # type: ignore[attr-defined]


def test_a_report_showing_some_streams_says_so(browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "MAX_STREAM_PLOTS", FEW)
    paths = [str(CAPTURES / "live-stream-ends.pcap")]
    path = tmp_path / "few.html"
    path.write_text(report.report_from_captures(paths), encoding="utf-8")
    page = open_page(browser, path, width=900)
    page.screenshot(path=str(SHOT.with_name("dcpinspect-report-few.png")), full_page=True)
    text = page.inner_text("section#set-1")
    from dcpinspect.tables.timeline_feed import read_timeline

    n = len(read_timeline(paths).streams)
    assert n > FEW
    assert f"showing {FEW} of {n} streams" in text and "the rest are in the table below" in text
    assert page.locator("section#set-1 img.stream").count() == FEW
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth + 1")
