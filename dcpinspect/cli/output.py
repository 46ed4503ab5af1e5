"""Records out: the one JSON-lines writer and the one text writer, and the printers that keep them off the forwarding path.

Every command that prints frames (``frames``, ``proxy``, ``sniff``, ``client
--json``) prints rows of the frames table (the columns of
:mod:`dcpinspect.tables.columns`): :func:`json_line` for ``--json``,
:func:`text_line` otherwise.  The rows come from the Arrow table of a
capture (``frames``: :func:`dcpinspect.tables.export.frame_rows`) or, for
live records, from :func:`record_rows` (the same column builder, no Arrow).
In a row ``ts`` is integer nanoseconds; JSON shows seconds.  The text
line's time column is a :class:`Clock`'s (``-t``, as tshark's: relative,
absolute, deltas, epoch); the live tools' printers show time relative to
their first record.

The live commands print through a :class:`RecordPrinter`: a bounded queue
drained by a thread of its own, so a slow or blocked output drops records
(counted) and never stalls a socket.  :class:`LogLines` and
:class:`QueuedLogHandler` do the same for log lines on stderr.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from ..flows.records import Record
from ..tables.columns import COLUMN_NAMES, JSON_COLUMNS, FrameColumns
from ..wire.render import plural, safe_text

__all__ = [
    "JSON_COLUMNS",
    "TEXT_COLUMNS",
    "TIME_FORMATS",
    "TS_REF",
    "Clock",
    "LinePrinter",
    "LogLines",
    "QueuedLogHandler",
    "RecordPrinter",
    "json_line",
    "record_lines",
    "record_rows",
    "seconds_text",
    "text_line",
    "utc_text",
]

#: the ``-t`` time formats of the text output (as tshark's): name -> meaning
TIME_FORMATS: dict[str, str] = {
    "r": "seconds since the start of the capture set (live tools: of the session)",
    "a": "absolute time of day, UTC (10:11:12.123456)",
    "ad": "absolute date and time, UTC (2026-01-02 10:11:12.123456)",
    "d": "seconds since the previous frame",
    "dd": "seconds since the previous frame shown",
    "e": "seconds since the epoch (1970-01-01 UTC)",
}
_TIME_WIDTH = {"r": 10, "d": 10, "dd": 10, "e": 17, "a": 15, "ad": 26}
#: the column of a prepared table holding each row's reference time (see :meth:`Clock.prepare`)
TS_REF = "ts_ref"
_SET = "capture_set"

#: the columns :func:`text_line` reads (``capture_set`` too when the table has it: relative time is per set)
TEXT_COLUMNS: tuple[str, ...] = (
    "frame",
    "ts",
    "packet",
    "dir",
    "conn_id",
    "type",
    "length",
    "name",
    "role",
    "vbucket",
    "status_name",
    "opaque",
    "key",
    "seqno",
    "problems",
    *((_SET,) if _SET in COLUMN_NAMES else ()),
)

_NS = 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def seconds_text(ns: int) -> str:
    """Integer nanoseconds as seconds with six decimals (truncated to the microsecond, exact: no float)."""
    sign = "-" if ns < 0 else ""
    s, frac = divmod(abs(ns), _NS)
    return f"{sign}{s}.{frac // 1000:06d}"


def utc_text(ns: int, *, date: bool = True) -> str:
    """Integer nanoseconds since the epoch as UTC ``2026-01-02 10:11:12.123456`` (``date=False``: the time of day only)."""
    when = _EPOCH + timedelta(microseconds=ns // 1000)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f" if date else "%H:%M:%S.%f")


class Clock:
    """The time column of the text output in one of the :data:`TIME_FORMATS` (``-t``), with the state its deltas need.

    :meth:`text` is called for every row shown, in order; it remembers each
    capture set's start (``r``: when the set's first frame with a known time
    began, its ``ts_first``, else its ``ts``) and the previous row.  When rows are filtered, the reference of ``r`` and ``d``
    must come from every row read, not only those shown: :meth:`prepare`
    adds it to a table before the filter (column :data:`TS_REF`), and
    :meth:`text` takes it from there.
    """

    def __init__(self, mode: str = "r") -> None:
        if mode not in TIME_FORMATS:
            raise ValueError(f"unknown time format {mode!r} (one of {', '.join(TIME_FORMATS)})")
        self.mode = mode
        self.width = _TIME_WIDTH[mode]
        self.start: dict[Any, int] = {}  # capture set -> its start (ns)
        self.previous: int | None = None  # the time of the previous row (read: d; shown: dd)

    @property
    def needs_every_row(self) -> bool:
        """Whether the format's reference comes from every row read (``r``, ``d``), not only from the rows shown."""
        return self.mode in ("r", "d")

    def text(self, row: Mapping[str, Any]) -> str:
        """The time of ``row`` (``ts`` in integer ns, ``None`` when unknown) in this format, padded to its column."""
        return self.value(row).rjust(self.width)

    def value(self, row: Mapping[str, Any]) -> str:
        """The time of ``row``, unpadded (``?`` when the time or its reference is unknown)."""
        ts: int | None = row["ts"]
        mode = self.mode
        if mode in ("a", "ad"):
            return "?" if ts is None else utc_text(ts, date=mode == "ad")
        if mode == "e":
            return "?" if ts is None else seconds_text(ts)
        if mode == "dd":
            ref, self.previous = self.previous, ts
        elif TS_REF in row:
            ref = row[TS_REF]
        elif mode == "r":
            key = row.get(_SET)
            if key not in self.start:
                first = row.get("ts_first")
                begun = first if first is not None else ts
                if begun is not None:
                    self.start[key] = begun
            ref = self.start.get(key)
        else:
            ref, self.previous = self.previous, ts
        return "?" if ts is None or ref is None else seconds_text(ts - ref)

    def prepare(self, table: Any) -> Any:
        """``table`` (pyarrow, every row read, before a filter) with the :data:`TS_REF` column ``r`` and ``d`` need.

        ``r``: each row's capture-set start (as :meth:`text` finds it); ``d``:
        the previous row's ``ts``.
        Other formats need no reference: ``table`` comes back as it was.
        """
        if self.mode not in ("r", "d"):
            return table
        from ..tables.times import with_time_reference

        table, self.previous = with_time_reference(table, self.mode, self.start, self.previous, TS_REF)
        return table


def json_line(row: Mapping[str, Any]) -> str:
    """One JSON object: the :data:`JSON_COLUMNS` of a frames-table row, ``ts`` in seconds (to the microsecond)."""
    ts = row["ts"]
    # an exact integer division, rounded to 6 digits: what pandas' Timestamp.timestamp() gives for the same nanoseconds
    return json.dumps({name: (None if ts is None else round(ts / _NS, 6)) if name == "ts" else row[name] for name in JSON_COLUMNS})


def text_line(row: Mapping[str, Any], clock: Clock | None = None) -> str:
    """One line of the frames list: frame, time (with ``clock``), packet, connection, direction, then what the row holds.

    A frame: its command, role, status (a response) or vbucket (a request),
    opaque, key, seqno and problems; garbage, a truncated frame or a gap:
    its length and reason.  Numbers are decimal but the opaque (hex, as the docs draw it); a
    response's status is its name (``Success``).
    """
    time = f" {clock.text(row)}" if clock is not None else ""
    packet = row.get("packet")
    head = f"{row['frame']:>7}{time}{f' pkt {packet}' if packet is not None else ''} conn {row['conn_id']} {row['dir']}"
    problems = f" [{'; '.join(row['problems'])}]" if row["problems"] else ""
    if row["type"] != "frame":
        length = row.get("length")
        size = f" {plural(length, 'byte')}" if length is not None else ""
        return f"{head} {row['type']}{size}{safe_text(problems)}"
    status = row["status_name"] if row["role"] == "response" else f"vb={row['vbucket']}"
    extra = f" key={row['key']!r}" if row["key"] is not None else ""
    extra += f" seqno={row['seqno']}" if row["seqno"] is not None else ""
    return f"{head} {row['name']} {row['role'] or ''} {status} opaque=0x{(row['opaque'] or 0):08x}{safe_text(extra + problems)}"


def record_rows(records: Iterable[Record], columns: Sequence[str]) -> list[dict[str, Any]]:
    """Frames-table rows (``columns`` only) of live records, built by the table's own column builder."""
    cols = FrameColumns().extend(records).cols
    return [dict(zip(columns, values, strict=True)) for values in zip(*(cols[c] for c in columns), strict=True)]


def record_lines(records: Iterable[Record], *, as_json: bool, clock: Clock | None = None) -> list[str]:
    """The lines of ``records``: :func:`json_line` or :func:`text_line` of each (its time column from ``clock``)."""
    if as_json:
        return [json_line(row) for row in record_rows(records, JSON_COLUMNS)]
    return [text_line(row, clock) for row in record_rows(records, TEXT_COLUMNS)]


class LinePrinter:
    """Lines off the caller's thread: a bounded queue drained by a thread of its own.

    :meth:`add` never blocks: beyond ``limit`` items (or ``limit_bytes``)
    queued, an item is dropped and counted in :attr:`dropped`, and a line
    says so once the output takes lines again.  The thread formats and
    writes; when ``out`` is a file with a descriptor (stdout), it writes to
    the descriptor directly, so an output that blocks (a paused pager)
    blocks that thread only and never holds a lock the rest of the process
    needs.  Subclasses say what an item weighs (:meth:`size`) and how a batch
    becomes lines (:meth:`lines`).
    """

    name = "dcpinspect-printer"

    def __init__(self, out: TextIO, *, limit: int, limit_bytes: int) -> None:
        self.out = out
        self.limit = limit
        self.limit_bytes = limit_bytes
        self.queue: deque[Any] = deque()
        self.queued_bytes = 0
        #: items not printed because the output could not keep up (all time), and not yet announced
        self.dropped = 0
        self._unannounced = 0
        self.printed = 0
        self._cond = threading.Condition()
        self._closing = False
        self._fd: int | None = None
        try:
            fd = out.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
        if fd is not None:
            out.flush()
            self._fd = os.dup(fd)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def size(self, item: Any) -> int:
        """What ``item`` weighs against ``limit_bytes``."""
        raise NotImplementedError

    def lines(self, batch: list[Any]) -> list[str]:
        """The lines of a batch of items."""
        raise NotImplementedError

    def dropped_line(self, n: int) -> str:
        """The line announcing ``n`` items dropped."""
        raise NotImplementedError

    def add(self, item: Any) -> None:
        """Queue ``item`` for printing (from any thread); dropped and counted when the queue is full."""
        n = self.size(item)
        with self._cond:
            if len(self.queue) >= self.limit or self.queued_bytes + n > self.limit_bytes:
                self.dropped += 1
                self._unannounced += 1
                return
            self.queue.append(item)
            self.queued_bytes += n
            self._cond.notify()

    def _write(self, text: str) -> None:
        if self._fd is None:
            self.out.write(text)
            self.out.flush()
            return
        data = text.encode("utf-8", "backslashreplace")
        while data:
            n = os.write(self._fd, data)
            data = data[n:]

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self.queue and not self._unannounced and not self._closing:
                        self._cond.wait()
                    if not self.queue and not self._unannounced:
                        return
                    batch = [self.queue.popleft() for _ in range(min(len(self.queue), 4096))]
                    self.queued_bytes -= sum(self.size(r) for r in batch)
                    dropped, self._unannounced = self._unannounced, 0
                lines = self.lines(batch) if batch else []
                if dropped:
                    lines.append(self.dropped_line(dropped))
                self._write("".join(line + "\n" for line in lines))
                self.printed += len(batch)
        except (BrokenPipeError, OSError, ValueError):
            pass  # the reader is gone: the command goes on, printing nothing

    def close(self, timeout: float | None = 5.0) -> bool:
        """Print what is queued (waiting at most ``timeout`` s for the output); ``False`` if the output is still blocked."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        done = not self._thread.is_alive()
        if done and self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return done


class RecordPrinter(LinePrinter):
    """Records printed as :func:`json_line` or :func:`text_line`, off the thread that hands them over (see :class:`LinePrinter`)."""

    name = "dcpinspect-record-printer"

    def __init__(self, out: TextIO, *, as_json: bool, limit: int = 10_000, limit_bytes: int = 8 * 1024 * 1024, time: str = "r") -> None:
        self.as_json = as_json
        #: the text lines' time column: relative to the first record by default (``time``: one of :data:`TIME_FORMATS`)
        self.clock = Clock(time)
        super().__init__(out, limit=limit, limit_bytes=limit_bytes)

    def size(self, item: Any) -> int:
        """A record weighs its frame's bytes."""
        return int(item.event.length)

    def lines(self, batch: list[Any]) -> list[str]:
        """One line per record."""
        return record_lines(batch, as_json=self.as_json, clock=self.clock)

    def dropped_line(self, n: int) -> str:
        """``# N records not shown ...``."""
        return f"# {plural(n, 'record')} not shown (the output could not keep up)"

    def summary(self) -> str:
        """``", N records not shown (the output could not keep up)"`` when records were dropped, else ``""``."""
        return f", {plural(self.dropped, 'record')} not shown (the output could not keep up)" if self.dropped else ""


class LogLines(LinePrinter):
    """Log lines (stderr) through the same bounded queue and thread: a blocked stderr never stalls forwarding."""

    name = "dcpinspect-log-lines"

    def __init__(self, out: TextIO, *, prefix: str) -> None:
        self.prefix = prefix
        super().__init__(out, limit=1_000, limit_bytes=1024 * 1024)

    def size(self, item: Any) -> int:
        """A line weighs its characters."""
        return len(item)

    def lines(self, batch: list[Any]) -> list[str]:
        """Each line with the prefix."""
        return [self.prefix + line for line in batch]

    def dropped_line(self, n: int) -> str:
        """``PREFIX N log lines not shown ...``."""
        return f"{self.prefix}{plural(n, 'log line')} not shown (stderr could not keep up)"


class QueuedLogHandler(logging.Handler):
    """A logging handler that never blocks: it queues formatted lines for a :class:`LogLines` thread."""

    def __init__(self, lines: LogLines) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        """Queue the message, escaped (peer-controlled text: addresses, errors)."""
        try:
            self.lines.add(safe_text(record.getMessage()))
        except Exception:
            self.handleError(record)
