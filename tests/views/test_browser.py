"""The explorer in a real browser: Voila serves executed notebooks with live widgets, Playwright drives Debian's chromium.

Skipped (with the reason) only when chromium, Playwright or the Voila server
cannot start.  Nothing leaves 127.0.0.1: the page's requests elsewhere (a
CDN stylesheet in Voila's template) are aborted and kept in ``Tab.blocked``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest
from paths import ROOT

from dcpinspect import encode
from dcpinspect.capture.pcapwrite import PcapWriter, TcpConversation
from dcpinspect.views.explorer import PNG_DPI, ExplorerModel
from dcpinspect.views.labels import row_label
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.render import annotate, value_text

pytestmark = pytest.mark.browser
BRANCHES = ROOT / "captures" / "live-failover-branches.pcap"
EVIL = "<script>alert(1)</script>"
EVIL_VALUE = "<img src=x onerror=alert(2)>"
WAIT = 60_000  # ms: generous, only reached when something is broken
LOCAL = re.compile(r"^(https?|wss?)://127\.0\.0\.1:\d+/")
EXPLORER = ".dcpinspect-explorer"
FRAMES = f"{EXPLORER} .dcpinspect-frame-list select"  # the frame list (the question panels have lists of their own)
PRE = f"{EXPLORER} .dcpinspect-annotation pre"


# --- the capture with HTML in a key ---------------------------------------------------------


def write_evil_capture(path: Path) -> Path:
    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210))
        conv.open(1_000_000)
        ts = 2_000_000
        ts = conv.send("c2s", encode("DCP_STREAM_REQ", opaque=1, vbucket=0, extras={"start_seqno": 0, "end_seqno": 2**64 - 1}), ts)
        ts = conv.send("s2c", encode("DCP_STREAM_REQ", opaque=1, status=0), ts)
        ts = conv.send("s2c", encode("DCP_SNAPSHOT_MARKER", opaque=1, vbucket=0, extras={"start_seqno": 1, "end_seqno": 2, "flags": 1}), ts)
        ts = conv.send(
            "s2c", encode("DCP_MUTATION", opaque=1, vbucket=0, extras={"by_seqno": 1, "rev_seqno": 1}, key="plain", value=b"{}"), ts
        )
        evil = encode("DCP_MUTATION", opaque=1, vbucket=0, extras={"by_seqno": 2, "rev_seqno": 1}, key=EVIL, value=EVIL_VALUE.encode())
        ts = conv.send("s2c", evil, ts)
        conv.close(ts)
    return path


def write_empty_stream_capture(path: Path) -> Path:
    """Two streams: vbucket 0 with 40 mutations, vbucket 1 accepted and never sent an item."""
    with PcapWriter(path) as w:
        conv = TcpConversation(w, ("10.0.0.1", 40000), ("10.0.0.2", 11210))
        conv.open(1_000_000)
        ts = 2_000_000
        for vb in (0, 1):
            ts = conv.send(
                "c2s", encode("DCP_STREAM_REQ", opaque=vb + 1, vbucket=vb, extras={"start_seqno": 0, "end_seqno": 2**64 - 1}), ts
            )
            ts = conv.send("s2c", encode("DCP_STREAM_REQ", opaque=vb + 1, status=0), ts)
        ts = conv.send(
            "s2c", encode("DCP_SNAPSHOT_MARKER", opaque=1, vbucket=0, extras={"start_seqno": 1, "end_seqno": 40, "flags": 1}), ts
        )
        for i in range(40):
            ext = {"by_seqno": i + 1, "rev_seqno": 1}
            ts = conv.send("s2c", encode("DCP_MUTATION", opaque=1, vbucket=0, extras=ext, key=f"k{i}", value=b"{}"), ts, step_ns=50_000_000)
        conv.close(ts)
    return path


def write_notebook(path: Path, capture: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"import dcpinspect\n\nview = dcpinspect.explore({str(capture)!r}, page_size=20)\nview"),
    ]
    nbformat.write(nb, path)


# --- the server and the browser -----------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RUNNING = re.compile(rb"(http://127\.0\.0\.1:\d+/)")


class ServerLog:
    """The server's output copied to a file by a thread, which tells when Voila says where it is listening (or that it exited)."""

    def __init__(self, proc: subprocess.Popen[bytes], path: Path) -> None:
        self.path = path
        self.url: str | None = None
        self.said = threading.Event()  # "Voila is running at" and its URL, or the end of the output
        self._thread = threading.Thread(target=self._copy, args=(proc,), name="voila-log", daemon=True)
        self._thread.start()

    def _copy(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        running = False
        with self.path.open("wb") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                running = running or b"is running at" in line
                found = RUNNING.search(line) if running and self.url is None else None
                if found:
                    self.url = found.group(1).decode()
                    self.said.set()
        self.said.set()

    def text(self) -> str:
        return self.path.read_text(errors="replace")[-2000:]


def wait_listening(proc: subprocess.Popen[bytes], log: ServerLog, timeout: float = 60) -> str:
    """The URL the server listens on, once it has said so (an event, not a poll; ``timeout`` only bounds a broken start)."""
    if not log.said.wait(timeout):
        pytest.skip(f"the Voila server did not say it was listening within {timeout:.0f} s: {log.text()}")
    if log.url is None:
        proc.wait(10)
        pytest.skip(f"the Voila server exited with {proc.returncode}: {log.text()}")
    return log.url


@dataclass
class Site:
    url: str  # notebooks are at url + name
    evil: Path  # the capture with HTML in a key
    empty: Path  # the capture with a stream that never sent an item


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """Voila serving a directory of notebooks on 127.0.0.1."""
    pytest.importorskip("voila", reason="voila is not installed (pip install -e '.[dev]')")
    root = tmp_path_factory.mktemp("voila")
    nbs = root / "notebooks"
    nbs.mkdir()
    write_notebook(nbs / "explore.ipynb", BRANCHES)
    evil = write_evil_capture(root / "evil.pcap")
    write_notebook(nbs / "evil.ipynb", evil)
    empty = write_empty_stream_capture(root / "empty.pcap")
    write_notebook(nbs / "empty.ipynb", empty)
    port = free_port()
    env = {
        **os.environ,
        # a private, offline Jupyter: no user config, nothing written to $HOME, no update checks
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        # Voila's templates live under the prefix it was installed in (the base one, from a venv)
        "JUPYTER_PATH": os.pathsep.join(
            dict.fromkeys(str(Path(p) / "share" / "jupyter") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))
        ),
        "IPYTHONDIR": str(root / "ipython"),
        "MPLCONFIGDIR": str(root / "mpl"),
        "MPLBACKEND": "Agg",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    cmd = [
        sys.executable,
        "-m",
        "voila",
        str(nbs),
        "--no-browser",
        f"--port={port}",
        "--Voila.ip=127.0.0.1",
        "--show_tracebacks=True",
    ]
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = wait_listening(proc, ServerLog(proc, root / "voila.log"))  # the port it took (another, when that one was taken)
        yield Site(f"{url}voila/render/", evil, empty)
    finally:
        # the server and the kernels it started share the new session's process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # kernels that outlived the server


@dataclass
class Tab:
    """A page and what it did that it should not have."""

    page: Any
    blocked: list[str] = field(default_factory=list)  # requests that would have left 127.0.0.1
    dialogs: list[str] = field(default_factory=list)  # alert/confirm/prompt: wire text run as script
    errors: list[str] = field(default_factory=list)  # uncaught page errors


@pytest.fixture
def tab(browser: Any, site: Site) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1400, "height": 1100}, service_workers="block")
    t = Tab(context.new_page())
    t.page.set_default_timeout(WAIT)

    def route(r: Any) -> None:
        if LOCAL.match(r.request.url):
            r.continue_()
        else:
            t.blocked.append(r.request.url)
            r.abort()

    def dialog(d: Any) -> None:
        t.dialogs.append(d.message)
        d.dismiss()

    context.route("**/*", route)
    t.page.on("dialog", dialog)
    t.page.on("pageerror", lambda exc: t.errors.append(str(exc)))
    try:
        yield t
    finally:
        context.close()


def open_explorer(page: Any, url: str) -> None:
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(FRAMES, state="visible")  # the kernel ran the notebook and the widgets rendered


def dropdown(page: Any, label: str) -> Any:
    return (
        page.locator(f"{EXPLORER} .widget-dropdown").filter(has=page.locator("label", has_text=re.compile(f"^{label}$"))).locator("select")
    )


def option_texts(page: Any) -> list[str]:
    texts = page.eval_on_selector(FRAMES, "s => [...s.options].map(o => o.textContent)")
    return [t.replace("\xa0", " ") for t in texts]


def wait_options(page: Any, labels: list[str]) -> None:
    """Wait until the frame list shows exactly these labels (the widget renders spaces as no-break spaces)."""
    page.wait_for_function(
        "([sel, want]) => { const s = document.querySelector(sel);"
        " return !!s && s.options.length === want.length"
        " && [...s.options].every((o, i) => o.textContent.replace(/\\u00a0/g, ' ') === want[i]); }",
        arg=[FRAMES, labels],
    )


def visible_images(page: Any, n: int) -> list[int]:
    """The natural widths of the explorer's visible images, once there are ``n`` or more and all have loaded (0: broken)."""
    js = f"[...document.querySelectorAll('{EXPLORER} img')].filter(i => i.offsetParent !== null)"
    page.wait_for_function(f"() => {js}.length >= {n} && {js}.every(i => i.complete)")
    return list(page.evaluate(f"() => {js}.map(i => i.naturalWidth)"))


def expected(capture: Path, frame: int) -> tuple[str, Any]:
    """What render.annotate prints for a frame of a capture, and its dissection."""
    model = ExplorerModel.open(str(capture), timeline=False)
    row = model.store.row_of(frame)
    assert row is not None
    event, context = model.store.event(row)
    return annotate(event, context=context), dissect(event, context)


def point_on_stream_plot(selected: int, width: int) -> tuple[int, tuple[float, float]]:
    """A frame drawn on the selected stream's plot (not ``selected``) and where it is in the PNG the view sends, ``width`` pixels wide."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from dcpinspect.views import plots
    from dcpinspect.views.drawing import fit_margins

    model = ExplorerModel.open(str(BRANCHES))
    model.select(selected)
    fig = model.stream_figure()
    fig.set_size_inches(width / PNG_DPI, fig.get_size_inches()[1])
    fit_margins(fig)
    fig.set_dpi(PNG_DPI)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    line = next(a for a in fig.findobj(lambda a: len(plots.frames_of(a)) > 3))
    frames = plots.frames_of(line)
    i = len(frames) // 2
    ((x, y),) = line.get_transform().transform(line.get_xydata()[i : i + 1])
    return int(frames[i]), (float(x), float(canvas.get_width_height()[1] - y))


# --- the tests ------------------------------------------------------------------------------


def test_select_frame_shows_grid_and_breakdown(tab: Tab, site: Site, tmp_path: Path, failover: Any) -> None:
    page = tab.page
    model = ExplorerModel.open(str(BRANCHES), timeline=False, page_size=20)
    first_page = [row_label(r) for r in model.page_rows()]
    model.set_filters(opcode="DCP_STREAM_REQ")
    requests = [row_label(r) for r in model.page_rows()]
    frame = failover.rollback  # the rollback response
    text, d = expected(BRANCHES, frame)
    assert d.title == "DCP_STREAM_REQ response"
    raw = d.frame.raw

    open_explorer(page, site.url + "explore.ipynb")
    wait_options(page, first_page)
    status = page.locator(f"{EXPLORER} .widget-html-content", has_text="frames;")
    pages = -(-failover.frames // 20)
    assert f"{failover.frames} frames" in status.inner_text() and f"page 1/{pages}" in status.inner_text()
    assert dropdown(page, "opcode").input_value() == "any"  # ("any", None) is shown, not an empty box

    # a filter set in the browser reaches the kernel's model and comes back as the frame list
    dropdown(page, "opcode").select_option(label="DCP_STREAM_REQ")
    wait_options(page, requests)
    page.locator(FRAMES).select_option(index=[r["frame"] for r in model.page_rows()].index(frame))

    page.locator(f"{EXPLORER} .widget-html-content b", has_text=re.compile(f"^frame {frame}$")).wait_for()
    pre = page.locator(PRE)
    pre.wait_for()
    # the text of the grid and the breakdown is exactly what render.annotate prints for the frame
    shown = pre.evaluate("e => e.textContent")
    assert shown == text
    rollback_to = f"0x{failover.rollback_seqno:016x}"
    for needle in ("DCP_STREAM_REQ response", "Status       (6,7)  : 0x0023 (Rollback)", rollback_to, "| 0x81  ", "| 0x53  "):
        assert needle in shown

    # each grid cell carries its field's name and its byte; each breakdown row its field's value
    cells = pre.locator("a").evaluate_all("as => as.map(a => [a.title, a.textContent.trim()])")
    assert len(cells) == len(raw)
    names = {f.label.strip() for f in d.fields}
    for i, (title, byte) in enumerate(cells):
        assert title in names
        assert byte == f"0x{raw[i]:02x}"
    assert cells[0][0] == "Magic" and cells[1][0] == "Opcode" and cells[6][0] == cells[7][0] == "Status"
    rows = pre.locator("span[id]").all_text_contents()
    assert len(rows) == len(d.fields)
    for f, row in zip(d.fields, rows, strict=True):
        assert f.label.strip() in row and value_text(f) in row

    # the frame list's columns line up too
    assert "mono" in page.locator(FRAMES).evaluate("e => getComputedStyle(e).fontFamily").lower()
    # a fixed-width font, so the grid lines up (JupyterLab's output area gives pre the proportional UI font)
    font = pre.evaluate("e => getComputedStyle(e).fontFamily").lower()
    assert "mono" in font, font
    lefts = pre.locator("a").evaluate_all("as => as.slice(0, 8).map(a => Math.round(a.getBoundingClientRect().left))")
    assert lefts[:4] == lefts[4:8]  # the cells of rows 0 and 4 start at the same x

    # the field under the pointer is highlighted in the grid and in the breakdown
    cell = pre.locator("a").nth(6)  # the status
    cell.hover()
    cls = cell.get_attribute("class")
    assert page.locator(f"{PRE} span.{cls}").evaluate("e => getComputedStyle(e).outlineStyle") == "solid"
    assert page.locator(f"{PRE} span.f0").evaluate("e => getComputedStyle(e).outlineStyle") == "none"

    # the stream's timeline and its vbucket's branch tree are there as images
    widths = visible_images(page, 2)
    assert len(widths) == 2 and all(widths), widths

    # a click on a point of the stream's timeline selects that point's frame
    wait_drawn_to_fit(page)
    img = page.locator(f"{EXPLORER} img.dcpinspect-figure").first
    img.scroll_into_view_if_needed()  # a click must land in the viewport (the plot is in the first screen: no scroll)
    box = img.bounding_box()
    natural = img.evaluate("i => [i.naturalWidth, i.naturalHeight]")
    target, (px, py) = point_on_stream_plot(frame, natural[0])
    page.mouse.click(box["x"] + px * box["width"] / natural[0], box["y"] + py * box["height"] / natural[1])
    page.locator(f"{EXPLORER} .widget-html-content b", has_text=re.compile(f"^frame {target}$")).wait_for()
    assert pre.evaluate("e => e.textContent") == expected(BRANCHES, target)[0]
    assert_plot_in_first_screen(page)

    shot = tmp_path / f"explorer-frame-{frame}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert not tab.errors, tab.errors


def test_wire_html_is_shown_as_text(tab: Tab, site: Site, tmp_path: Path) -> None:
    page = tab.page
    model = ExplorerModel.open(str(site.evil), timeline=False, page_size=20)
    labels = [row_label(r) for r in model.page_rows()]
    model.set_filters(key="script")
    (row,) = model.page_rows()
    text, d = expected(site.evil, row["frame"])
    assert d.key_text == EVIL and EVIL in text

    open_explorer(page, site.url + "evil.ipynb")
    wait_options(page, labels)
    assert any(repr(EVIL) in t for t in option_texts(page))  # the frame list shows the key as text
    # nothing selected: every stream's timeline, and no branch tree yet - hidden, not a broken-image icon
    widths = visible_images(page, 1)
    assert (
        len(widths) == 1
        and all(widths)
        and page.locator(f"{EXPLORER} img").count() - page.locator(f"{EXPLORER} .dcpinspect-panels img").count() == 2
    ), widths

    key = page.get_by_placeholder("text in the key")
    key.fill("script")
    key.press("Enter")  # the key box sends on enter (continuous_update=False)
    wait_options(page, [row_label(row)])
    page.locator(FRAMES).select_option(index=0)
    pre = page.locator(PRE)
    pre.wait_for()

    shown = pre.evaluate("e => e.textContent")
    assert shown == text  # the literal text: escaped on the way in, shown as it was on the wire
    assert "0x3c ('<')" in shown and EVIL in page.locator(EXPLORER).inner_text()
    # nothing from the wire became markup: no injected script or event handler, no dialog, no error
    injected = page.evaluate(
        "() => [...document.querySelectorAll('script')].filter(s => s.textContent.includes('alert(')).length"
        " + document.querySelectorAll('[onerror]').length"
    )
    assert injected == 0
    assert page.locator(f"{PRE} script, {PRE} img").count() == 0
    widths = visible_images(page, 2)  # the stream and its vbucket's branches, drawn after the annotation
    assert len(widths) == 2 and all(widths), widths
    page.screenshot(path=str(tmp_path / "explorer-evil.png"), full_page=True)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))")  # let any handler have run
    assert tab.dialogs == []
    assert not tab.errors, tab.errors


def assert_plot_in_first_screen(page: Any) -> None:
    """The selected frame's annotation is longer than its pane (it scrolls there), and the stream plot is whole in the first screen."""
    page.evaluate("() => { window.scrollTo(0, 0); for (const e of document.querySelectorAll('*')) if (e.scrollTop) e.scrollTop = 0; }")
    pane = page.locator(f"{EXPLORER} .dcpinspect-annotation-pane")
    content, shown = pane.evaluate("e => [e.scrollHeight, e.clientHeight]")
    assert content > 1.5 * shown, (content, shown)  # a long annotation: without its own pane it would push the plot down
    wait_drawn_to_fit(page)
    img = page.locator(f"{EXPLORER} img.dcpinspect-figure").first
    top, bottom, screen = img.evaluate("i => [i.getBoundingClientRect().top, i.getBoundingClientRect().bottom, window.innerHeight]")
    assert top >= 0 and bottom <= screen, (top, bottom, screen)


def wait_drawn_to_fit(page: Any) -> None:
    """Wait until every visible picture was drawn for the width it has on the page (the view re-draws at the width it reports)."""
    page.wait_for_function(
        f"() => {{ const imgs = [...document.querySelectorAll('{EXPLORER} img.dcpinspect-figure')].filter(i => i.offsetParent !== null);"
        " return imgs.length > 0 && imgs.every(i => i.complete && Math.abs(i.naturalWidth - i.getBoundingClientRect().width) <= 10); }"
    )


def test_plots_are_full_width_readable_and_say_when_empty(tab: Tab, site: Site, tmp_path: Path) -> None:
    """The pictures span the explorer, are drawn at the size they are shown (10 pt text read at 10 pt), and an empty one says so."""
    page = tab.page
    model = ExplorerModel.open(str(site.empty))
    labels = dict((i, label) for i, label in model.streams())
    empty = next(i for i, s in enumerate(model.timeline.streams) if not s.items)
    open_explorer(page, site.url + "empty.ipynb")
    visible_images(page, 1)  # every stream's seqnos, before anything is selected
    wait_drawn_to_fit(page)
    explorer = page.locator(EXPLORER).first.bounding_box()
    for img in page.locator(f"{EXPLORER} img.dcpinspect-figure").all():
        if not img.is_visible():
            continue
        box = img.bounding_box()
        natural = img.evaluate("i => i.naturalWidth")
        assert box["width"] >= 0.9 * explorer["width"], (box, explorer)  # full width, not a thumbnail beside the annotation
        assert 0.9 * box["width"] <= natural <= 1.25 * box["width"], (natural, box)  # not shrunk: its text is read at its size
    # the plot selector: the stream that never sent an item says so, in the picture and in its words
    dropdown(page, "plot").select_option(label=labels[empty])
    page.wait_for_function(
        f"() => [...document.querySelectorAll('{EXPLORER} img.dcpinspect-figure')].some(i => i.alt.includes('no items in this stream'))"
    )
    wait_drawn_to_fit(page)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    model.show_stream(empty)
    fig = model.shown().figures["stream"]
    FigureCanvasAgg(fig).draw()
    assert "-0" not in [t.get_text() for t in fig.axes[0].get_yticklabels()]  # no "-0" ticks on an empty plot
    page.screenshot(path=str(tmp_path / "explorer-empty-stream.png"), full_page=True)
    assert not tab.errors, tab.errors
