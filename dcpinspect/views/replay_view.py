"""A running replay (``dcpinspect replay``) as DataFrames and a notebook widget.

:class:`~dcpinspect.live.replay_server.ReplayServer` serves one recorded
connection to every client that connects; this module shows what it did.

1. :func:`divergences_frame` - one row per divergence of every replay
   connection (conn, at: seconds since the connection began, kind, asked,
   recorded, answered); :func:`replay_summary` - one row per connection (its
   ``summary()``).  Both take a server (its ``divergences()``/``summaries()``
   rows) or an iterable of connections (each one's ``divergence_rows()``/
   ``summary()``), so a sans-IO ``ReplayConnection`` works as well as a
   server.  This layer does not import :mod:`dcpinspect.live`: they are read
   by those names only.
2. :class:`ReplayModel` is the plain model: the script line (which
   connection of which capture, the pace, where it listens), the counts, and
   the two tables, recomputed by :meth:`~ReplayModel.refresh`, which tells
   the listeners only when something changed.  :meth:`~ReplayModel.start`
   refreshes every ``interval`` seconds through a
   :class:`~dcpinspect.views.background.Runner`: by default a timer on the
   server's own event loop (``server.loop``: the notebook kernel's, where
   the connections change, so a refresh never races them; no thread), else
   :class:`~dcpinspect.views.background.Background`
   until :meth:`~ReplayModel.stop`, or once the server stopped and every
   connection ended.
3. :class:`~dcpinspect.views.replay_widget.ReplayView` (:func:`replay_view`) is a thin ipywidgets view that
   redraws from the model on each change; without a front end its
   ``_repr_html_`` / ``text()`` are the model's.  ipywidgets is imported only
   when a widget is made (:mod:`.replay_widget`).
4. Every text that came off the wire (a DCP name, what a client asked) is
   escaped in HTML (``DataFrame.to_html`` escapes, the script line goes
   through :func:`html.escape`) and passed through
   :func:`~dcpinspect.wire.render.safe_text` in plain text.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from typing import Any, Protocol

import pandas as pd

from ..wire.render import plural, safe_text
from .background import Background, Runner

__all__ = ["DIVERGENCE_COLUMNS", "SUMMARY_COLUMNS", "LoopRunner", "ReplayModel", "divergences_frame", "replay_summary", "replay_view"]

#: the columns of :func:`divergences_frame`
DIVERGENCE_COLUMNS = ("conn", "at", "kind", "asked", "recorded", "answered")
#: the columns of :func:`replay_summary` (a connection's ``summary()`` without its ``event``)
SUMMARY_COLUMNS = (
    "conn",
    "peer",
    "name",
    "frames_in",
    "frames_out",
    "streams_replayed",
    "streams_by_rule",
    "items",
    "divergences",
    "closed",
)


class _Connection(Protocol):
    """What is read of a replay connection (:class:`dcpinspect.live.replay.ReplayConnection`)."""

    closed: bool

    def divergence_rows(self) -> list[dict[str, Any]]: ...

    def summary(self) -> dict[str, Any]: ...


def _connections(source: Any) -> list[_Connection]:
    """A server's connections so far, or the connections given."""
    conns = getattr(source, "connections", source)
    return list(conns)


def divergences_frame(source: Any) -> pd.DataFrame:
    """One row per divergence of every replay connection: conn, at (s since the connection began), kind, asked, recorded, answered.

    ``source``: a ``ReplayServer`` or an iterable of ``ReplayConnection``.
    """
    if hasattr(source, "divergences") and hasattr(source, "connections"):
        rows = list(source.divergences())
    else:
        rows = [row for c in _connections(source) for row in c.divergence_rows()]
    df = pd.DataFrame(rows, columns=list(DIVERGENCE_COLUMNS))
    return df.astype({"conn": "int64", "at": "float64"})


def replay_summary(source: Any) -> pd.DataFrame:
    """One row per replay connection: its ``summary()`` (conn, peer, name, frames each way, streams, items, divergences, closed)."""
    if hasattr(source, "summaries") and hasattr(source, "connections"):
        rows = list(source.summaries())
    else:
        rows = [c.summary() for c in _connections(source)]
    df = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    ints = ("conn", "frames_in", "frames_out", "streams_replayed", "streams_by_rule", "items", "divergences")
    return df.astype(dict.fromkeys(ints, "int64"))


class ReplayModel:
    """A running replay server's script, counts and tables (rules 2-4 of the module).

    Args:
        server: a ``ReplayServer`` (read: ``script``, ``connections``, ``host``,
            ``port``, ``pace``, ``serving``, ``source``, ``divergences()``, ``summaries()``).
        source: what the script was recorded from (default: the server's ``source``).
        interval: seconds between refreshes once :meth:`start` ed.
        runner: where the refreshes run (default :class:`~.background.Background`:
            the running event loop); a test passes one it runs by hand.
    """

    def __init__(self, server: Any, *, source: str | None = None, interval: float = 1.0, runner: Runner | None = None) -> None:
        self.server = server
        self.source = source if source is not None else str(getattr(server, "source", "") or "")
        self.interval = interval
        self.runner: Runner = runner if runner is not None else _default_runner(server)
        self.connections = replay_summary([])
        self.divergences = divergences_frame([])
        self.running = False
        #: how many refreshes changed something (the listeners heard of it)
        self.changes = 0
        self._listeners: list[Callable[[str], None]] = []
        self.refresh()

    # --- state ----------------------------------------------------------------------
    def script_line(self) -> str:
        """Which connection of which capture is replayed, how, where (plain text, wire text made safe)."""
        script = self.server.script
        of = f" of {self.source}" if self.source else ""
        where = f"{self.server.host}:{self.server.port}" if getattr(self.server, "serving", True) else "stopped"
        return safe_text(f"replaying {script.describe()}{of}; pace {self.server.pace}; {where}", 1000)

    def counts(self) -> str:
        """Connections (open), items sent and divergences so far."""
        df = self.connections
        open_ = int((df["closed"].isna() | (df["closed"] == "")).sum()) if len(df) else 0
        return (
            f"{plural(len(df), 'connection')} ({open_} open), {plural(int(df['items'].sum()) if len(df) else 0, 'item')} sent, "
            f"{plural(len(self.divergences), 'divergence')}"
        )

    def refresh(self) -> bool:
        """Recompute the tables from the server; tells the listeners (``"tables"``) and returns ``True`` when they changed."""
        conns = replay_summary(self.server)
        divs = divergences_frame(self.server)
        if conns.equals(self.connections) and divs.equals(self.divergences):
            return False
        self.connections, self.divergences = conns, divs
        self.changes += 1
        for cb in list(self._listeners):
            cb("tables")
        return True

    # --- the timer ------------------------------------------------------------------
    def start(self) -> ReplayModel:
        """Refresh every ``interval`` seconds (through the runner) until :meth:`stop` or the server is done."""
        if not self.running:
            self.running = True
            self.runner.later(self.interval, self._tick)
        return self

    def stop(self) -> None:
        """No more refreshes."""
        self.running = False

    def _done(self) -> bool:
        return not getattr(self.server, "serving", True) and all(c.closed for c in _connections(self.server))

    def _tick(self) -> None:
        if not self.running:
            return
        self.refresh()
        if self._done():
            self.running = False
        else:
            self.runner.later(self.interval, self._tick)

    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback("tables")`` whenever a refresh changed the tables."""
        self._listeners.append(callback)

    # --- rendering --------------------------------------------------------------------
    def text(self) -> str:
        """The model as plain text (a terminal, a notebook without a front end)."""
        out = [self.script_line(), self.counts()]
        if len(self.connections):
            out += ["", "connections:", _safe_frame(self.connections).to_string(index=False)]
        if len(self.divergences):
            out += ["", "divergences:", _safe_frame(self.divergences).to_string(index=False)]
        return "\n".join(out)

    def header_html(self) -> str:
        """The script line and the counts as escaped HTML."""
        return f"<p><b>{html.escape(self.script_line())}</b><br>{html.escape(self.counts())}</p>"

    def connections_html(self) -> str:
        """The connections table as escaped HTML."""
        return _table_html(self.connections, "no client has connected yet")

    def divergences_html(self) -> str:
        """The divergences table as escaped HTML."""
        return _table_html(self.divergences, "no divergence: every request matched the recording")

    def _repr_html_(self) -> str:
        return (
            f'<div class="dcpinspect-replay">{self.header_html()}<h4>Connections</h4>{self.connections_html()}'
            f"<h4>Divergences</h4>{self.divergences_html()}</div>"
        )

    def __repr__(self) -> str:
        return self.text()


class LoopRunner:
    """A :class:`~.background.Runner` whose calls later are timers on one event loop (from any thread); it runs no job."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def start(self, job: Callable[[], None], *, name: str = "") -> None:
        """Not used: a replay view runs no job."""
        raise NotImplementedError("a replay view runs no background job")

    def join(self, timeout: float | None = None) -> bool:
        """Nothing to wait for."""
        return True

    def later(self, delay: float, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` about ``delay`` seconds from now on the loop."""
        self.loop.call_soon_threadsafe(self.loop.call_later, delay, fn)


def _default_runner(server: Any) -> Runner:
    loop = getattr(server, "loop", None)
    if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_closed():
        return LoopRunner(loop)
    return Background()


def _safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Text cells made safe for a terminal (control characters escaped, bounded)."""
    return df.apply(lambda col: col.map(lambda v: safe_text(v, 300) if isinstance(v, str) else v) if col.dtype == object else col)


def _table_html(df: pd.DataFrame, empty: str) -> str:
    if not len(df):
        return f"<p><i>{html.escape(empty)}</i></p>"
    return str(_safe_frame(df).to_html(index=False, escape=True, border=0, classes="dcpinspect-table"))


def replay_view(server: Any, *, source: str | None = None, interval: float = 1.0, runner: Runner | None = None) -> Any:
    """An ipywidgets view of a running ``ReplayServer``, refreshed every ``interval`` s on the running event loop.

    >>> view = replay_view(server)   # doctest: +SKIP
    >>> view.model.divergences       # doctest: +SKIP
    """
    from .replay_widget import ReplayView

    model = ReplayModel(server, source=source, interval=interval, runner=runner)
    view = ReplayView(model)
    model.start()
    return view
