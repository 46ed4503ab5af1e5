"""Capture files -> records: the file edge on top of :mod:`dcpinspect.flows.records`.

:func:`capture_segments` reads pcap/pcapng files in order (:class:`~dcpinspect.capture.pcapfile.CaptureReader`)
and turns each packet into a TCP segment (:func:`~dcpinspect.capture.packets.parse_packet`);
:func:`read_records` and :func:`read_chunks` feed those segments to the pure
record builders (:func:`~dcpinspect.flows.records.iter_records`,
:func:`~dcpinspect.flows.records.iter_chunks`), once per capture set
(:mod:`dcpinspect.capture.sets`): connections never continue from one set
into the next, while frames and connections are numbered on across them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..flows.reassembly import DEFAULT_SERVER_PORTS, Segment
from ..flows.records import CaptureStats, Record, RecordChunk, SetPlace, iter_chunks, iter_records
from .packets import parse_packet
from .pcapfile import CaptureError, CaptureReader
from .sets import Plan, read_sets

__all__ = ["capture_segments", "read_chunks", "read_records"]


def capture_segments(paths: Iterable[str], stats: CaptureStats, progress: Callable[[str, int], None] | None = None) -> Iterator[Segment]:
    """The TCP segments of capture files, in order; what each file held goes to ``stats.files``.

    A file that is not a capture is reported in ``stats.files[path]["error"]``
    and skipped; a truncated or corrupt record ends that file with a problem,
    keeping everything before it.  ``progress(path, offset)`` is called every
    1,024 packets.
    """
    st = stats
    base = 0  # the packets of the files before this one: a packet's position in the capture is base + its number
    for path in paths:
        reader = CaptureReader(str(path))
        info: dict[str, Any] = {"format": None, "packets": 0, "problems": [], "error": None}
        st.files[str(path)] = info
        try:
            for pkt in reader:
                st.packets += 1
                if progress is not None and not pkt.number % 1024:
                    progress(str(path), pkt.offset)
                seg = parse_packet(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, str(path), st.skipped, base + pkt.number)
                if seg is not None:
                    yield seg
        except CaptureError as exc:
            info["error"] = str(exc)
        info["format"] = reader.format or None
        info["packets"] = reader.packets
        base += reader.packets
        info["problems"] = [f"{msg} (at byte offset {off})" for off, msg in reader.problems]
        info["linktypes"] = sorted(reader.linktypes)


def read_records(
    paths: str | os.PathLike[str] | Iterable[str],
    *,
    server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
    detect: bool = True,
    stats: CaptureStats | None = None,
    reveal_secrets: bool = False,
    progress: Callable[[str, int], None] | None = None,
    capture_sets: Plan = "auto",
) -> Iterator[Record]:
    """Records of one or more capture files, each capture set read in order as one capture (rotated files join up).

    ``capture_sets`` is ``auto`` (detect which files are one recording),
    ``one`` (every file one capture) or ``per-file``
    (:func:`~dcpinspect.capture.sets.plan_capture_sets`).  See
    :func:`capture_segments` for what happens to unreadable files.  One path
    may be given alone.
    """
    st = stats if stats is not None else CaptureStats()
    if isinstance(paths, (str, os.PathLike)):
        paths = [os.fspath(paths)]

    def one(files: list[str], sub: CaptureStats, place: SetPlace) -> Iterator[Record]:
        segs = capture_segments(files, sub, progress)
        return iter_records(segs, server_ports=server_ports, detect=detect, stats=sub, reveal_secrets=reveal_secrets, place=place)

    yield from read_sets(paths, capture_sets, st, one)


def read_chunks(
    paths: Iterable[str],
    *,
    rows: int = 65536,
    server_ports: Iterable[int] = DEFAULT_SERVER_PORTS,
    detect: bool = True,
    stats: CaptureStats | None = None,
    reveal_secrets: bool = False,
    progress: Callable[[str, int], None] | None = None,
    capture_sets: Plan = "auto",
) -> Iterator[RecordChunk]:
    """:func:`read_records` in chunks (:class:`~dcpinspect.flows.records.RecordChunk`, each of one capture set), for columnar consumers."""
    st = stats if stats is not None else CaptureStats()

    def one(files: list[str], sub: CaptureStats, place: SetPlace) -> Iterator[RecordChunk]:
        segs = capture_segments(files, sub, progress)
        return iter_chunks(segs, rows=rows, server_ports=server_ports, detect=detect, stats=sub, reveal_secrets=reveal_secrets, place=place)

    yield from read_sets(paths, capture_sets, st, one)
