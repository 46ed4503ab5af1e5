"""Where the explorer's deferred work runs: a capture read in a thread, and live records folded in after a delay.

The models stay synchronous: everything that runs later goes through one
:class:`Runner`.  :class:`Background` is the real one (a thread, the running
event loop or a timer); a test passes one that runs the work when told to
(no thread, no clock).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Background", "Runner"]


class Runner(Protocol):
    """What a model needs to defer work: a job in the background, a call later."""

    def start(self, job: Callable[[], None], *, name: str = ...) -> None:
        """Run ``job`` apart from the caller."""

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the job started last; whether it has finished."""

    def later(self, delay: float, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` about ``delay`` seconds from now."""


class Background:
    """The model's one door to threads and event loops.

    :meth:`start` runs a job in a daemon thread (one at a time); :meth:`later`
    calls a function after ``delay`` seconds on the running asyncio loop when
    there is one (a notebook kernel, an async client), else on a timer thread.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def start(self, job: Callable[[], None], *, name: str = "dcpinspect-background") -> None:
        """Run ``job`` in a daemon thread."""
        self._thread = threading.Thread(target=job, name=name, daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the job started last; whether it has finished."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def later(self, delay: float, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` after ``delay`` seconds: on the running event loop, else on a timer thread."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            timer = threading.Timer(delay, fn)
            timer.daemon = True
            timer.start()
        else:
            loop.call_later(delay, fn)
