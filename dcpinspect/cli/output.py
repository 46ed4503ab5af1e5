"""Records out: the one JSON-lines writer and the one text writer, and the printers that keep them off the forwarding path.

Every command that prints frames (``frames``, ``proxy``, ``sniff``, ``client
--json``) prints rows of the frames table (the columns of
:mod:`dcpinspect.tables.columns`): :func:`json_line` for ``--json``,
:func:`text_line` otherwise.  The rows come from the Arrow table of a
capture (``frames``: :func:`dcpinspect.tables.export.frame_rows`) or, for
live records, from :func:`record_rows` (the same column builder, no Arrow).
In a row ``ts`` is integer nanoseconds; JSON shows seconds.

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
from typing import Any, TextIO

from ..flows.records import Record
from ..tables.columns import JSON_COLUMNS, FrameColumns
from ..wire.render import safe_text

__all__ = [
    "JSON_COLUMNS",
    "TEXT_COLUMNS",
    "LinePrinter",
    "LogLines",
    "QueuedLogHandler",
    "RecordPrinter",
    "json_line",
    "record_lines",
    "record_rows",
    "text_line",
]

#: the columns :func:`text_line` reads
TEXT_COLUMNS = ("frame", "dir", "conn_id", "type", "name", "role", "vbucket", "status_name", "opaque", "key", "seqno", "problems")

_NS = 1_000_000_000


def json_line(row: Mapping[str, Any]) -> str:
    """One JSON object: the :data:`JSON_COLUMNS` of a frames-table row, ``ts`` in seconds (to the microsecond)."""
    ts = row["ts"]
    # an exact integer division, rounded to 6 digits: what pandas' Timestamp.timestamp() gives for the same nanoseconds
    return json.dumps({name: (None if ts is None else round(ts / _NS, 6)) if name == "ts" else row[name] for name in JSON_COLUMNS})


def text_line(row: Mapping[str, Any]) -> str:
    """One line: frame, connection, direction, command, role, status (responses) or vbucket, opaque, key, seqno, problems."""
    frame = row["type"] == "frame"
    status = row["status_name"] if row["role"] == "response" else f"vb={row['vbucket']}"
    what = row["name"] if frame else row["type"]
    extra = f" key={row['key']!r}" if row["key"] is not None else ""
    extra += f" seqno={row['seqno']}" if row["seqno"] is not None else ""
    extra += f" [{'; '.join(row['problems'])}]" if row["problems"] else ""
    return (
        f"{row['frame']:>7} conn {row['conn_id']} {row['dir']} {what} {row['role'] or ''} {status if frame else ''} "
        f"opaque=0x{(row['opaque'] or 0):08x}{safe_text(extra)}"
    )


def record_rows(records: Iterable[Record], columns: Sequence[str]) -> list[dict[str, Any]]:
    """Frames-table rows (``columns`` only) of live records, built by the table's own column builder."""
    cols = FrameColumns().extend(records).cols
    return [dict(zip(columns, values, strict=True)) for values in zip(*(cols[c] for c in columns), strict=True)]


def record_lines(records: Iterable[Record], *, as_json: bool) -> list[str]:
    """The lines of ``records``: :func:`json_line` or :func:`text_line` of each."""
    if as_json:
        return [json_line(row) for row in record_rows(records, JSON_COLUMNS)]
    return [text_line(row) for row in record_rows(records, TEXT_COLUMNS)]


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

    def __init__(self, out: TextIO, *, as_json: bool, limit: int = 10_000, limit_bytes: int = 8 * 1024 * 1024) -> None:
        self.as_json = as_json
        super().__init__(out, limit=limit, limit_bytes=limit_bytes)

    def size(self, item: Any) -> int:
        """A record weighs its frame's bytes."""
        return int(item.event.length)

    def lines(self, batch: list[Any]) -> list[str]:
        """One line per record."""
        return record_lines(batch, as_json=self.as_json)

    def dropped_line(self, n: int) -> str:
        """``# N records not shown ...``."""
        return f"# {n} records not shown (the output could not keep up)"

    def summary(self) -> str:
        """``", N records not shown (the output could not keep up)"`` when records were dropped, else ``""``."""
        return f", {self.dropped} records not shown (the output could not keep up)" if self.dropped else ""


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
        return f"{self.prefix}{n} log lines not shown (stderr could not keep up)"


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
