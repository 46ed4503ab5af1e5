"""``frames --pcap OUT``: the packets of the selected frames, or whole connections, written back to a pcap file.

Rules:

1. The selection is the frames the command selected (``--filter``,
   ``--conn``): each keeps the packets that carry its bytes - its
   connection and direction, from ``packet_first`` to ``packet``
   (:class:`~dcpinspect.capture.pcapwrite.PacketSelection`).
2. ``--conn N`` exports connection N whole: every packet of its 4-tuple in
   its capture set, captured between its first and last packet (handshake
   and close included).
3. The packets are copied as captured (bytes, lengths, times, link type), in
   capture order, by a second read of the files
   (:func:`~dcpinspect.capture.pcapwrite.copy_packets`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..capture.pcapwrite import PacketSelection, copy_packets
from ..flows.records import CaptureStats
from ..wire.render import plural
from .command import CliError

__all__ = ["PcapExport", "only_connection"]


def only_connection(frames: Any, conn: int | None) -> Any:
    """The rows of an Arrow table or batch of the frames table that belong to connection ``conn`` (all when None)."""
    if conn is None:
        return frames
    from ..tables.follow import conn_rows

    return conn_rows(frames, conn)


class PcapExport:
    """Collects the packet spans of the frames shown, then copies those packets (``frames --pcap``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.out: str = args.pcap
        self.captures: list[str] = list(args.captures)
        self.conn: int | None = args.conn
        self.spans: list[tuple[int, int, str, int, int]] = []  # capture set, conn id, dir, packet_first, packet
        try:  # fail before reading when the file cannot be written
            open(self.out, "ab").close()  # only a check
        except OSError as exc:
            raise CliError(f"cannot write {self.out}: {exc.strerror or exc}") from None

    def take(self, frames: Any) -> None:
        """Note the spans of the selected rows (an Arrow table or batch of the frames table)."""
        from ..tables.follow import packet_spans

        self.spans.extend(packet_spans(frames))

    def sets(self, stats: CaptureStats) -> list[tuple[int, list[str]]]:
        """The capture sets the read followed (one set of every file when it planned none)."""
        if stats.sets:
            return [(s.number, list(s.files)) for s in stats.sets]
        return [(1, self.captures)]

    def selection(self, stats: CaptureStats) -> PacketSelection:
        """The packets to copy, from the spans noted and the connections the read saw."""
        sel = PacketSelection()
        set_of = {path: number for number, files in self.sets(stats) for path in files}
        if self.conn is not None:
            for whole in stats.connections:
                if whole.id == self.conn:
                    sel.add_connection(whole.client, whole.server, whole.first_ts, whole.last_ts, capture_set=set_of.get(whole.file, 1))
            return sel
        conns = {c.id: c for c in stats.connections}
        for cset, cid, d, first, last in self.spans:
            c = conns.get(cid)
            if c is None or first is None or last is None:
                continue
            src, dst = (c.client, c.server) if d == "c2s" else (c.server, c.client)
            sel.add((src[0], src[1], dst[0], dst[1]), first, last, capture_set=cset or 1)
        return sel

    def finish(self, stats: CaptureStats) -> None:
        """Copy the selected packets to the output file; one line on stderr says what was written."""
        if self.conn is not None and all(c.id != self.conn for c in stats.connections):
            raise CliError(f"no connection {self.conn} in the capture (it has {plural(len(stats.connections), 'connection')})")
        try:
            result = copy_packets(self.sets(stats), self.selection(stats), self.out)
        except OSError as exc:
            raise CliError(f"cannot write {self.out}: {exc.strerror or exc}") from None
        note = f" ({result.other_linktype} packets of another link type left out)" if result.other_linktype else ""
        sys.stderr.write(f"wrote {result.packets} packets to {self.out}{note}\n")
