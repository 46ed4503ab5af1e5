"""Byte ranges of a capture (split_ranges, read_range): many readers of one file see what one reader sees.

No Spark here: the ranges are read in process and compared with
CaptureReader over the whole file - packets, numbers, offsets, problems.
"""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest
from pcapfactory import Conn, Msg, write_bad_files, write_capture, write_hostile_headers

from dcpinspect import encode
from dcpinspect.capture.pcapfile import CaptureError, CaptureRange, CaptureReader, RawPacket, read_range, split_ranges


def _conns(k: int, n: int = 20) -> list[Conn]:
    return [
        Conn(
            client=(f"10.0.0.{10 + i}", 50000 + i),
            msgs=[Msg("c2s" if j % 2 else "s2c", encode("DCP_NOOP", opaque=0x1000 * i + j, response=j % 2 == 0)) for j in range(n)],
        )
        for i in range(k)
    ]


def _whole(path: Path) -> tuple[list[RawPacket], CaptureReader, str | None]:
    reader = CaptureReader(str(path))
    got: list[RawPacket] = []
    try:
        got.extend(reader)
    except CaptureError as exc:
        return got, reader, str(exc)
    return got, reader, None


def _ranged(path: Path, ranges: list[CaptureRange]) -> tuple[list[RawPacket], CaptureReader, str | None]:
    """Every range read by a reader of its own (as the Spark tasks do): packets, one reader holding what they all reported, the error."""
    packets: list[RawPacket] = []
    merged = CaptureReader(str(path))
    error = None
    with path.open("rb") as f:
        for rng in ranges:
            reader = CaptureReader(str(path))
            try:
                packets.extend(read_range(reader, f, rng))
            except CaptureError as exc:
                error = str(exc)
            assert reader.packets == rng.first_packet - 1 + sum(1 for p in packets if p.number >= rng.first_packet)
            merged.problems += reader.problems
            merged.linktypes |= reader.linktypes
            merged.bad_times += reader.bad_times
            merged.packets = max(merged.packets, reader.packets)
    return packets, merged, error


def _times(problems: list[tuple[int, str]]) -> tuple[list[tuple[int, str]], list[int]]:
    """Problems other than out-of-range times, and the offsets of those (one problem per reader, counting its packets)."""
    late = [off for off, msg in problems if msg.startswith("timestamp out of range")]
    return [(off, msg) for off, msg in problems if not msg.startswith("timestamp out of range")], late


def _same_as_whole(path: Path, split_size: int) -> list[CaptureRange]:
    ranges = split_ranges(path, split_size)
    assert all(a.end == b.start for a, b in itertools.pairwise(ranges))
    assert ranges[-1].end == path.stat().st_size
    want, reader, error = _whole(path)
    got, merged, got_error = _ranged(path, ranges)
    assert got == want
    assert got_error == error
    assert (merged.packets, merged.linktypes, merged.bad_times) == (reader.packets, reader.linktypes, reader.bad_times)
    (other, late), (want_other, want_late) = _times(merged.problems), _times(reader.problems)
    assert other == want_other
    assert late[:1] == want_late
    return ranges


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("split_size", [1, 700, 3000, 1 << 30])
def test_ranges_read_as_the_whole_file(tmp_path: Path, fmt: str, split_size: int) -> None:
    w = write_capture(tmp_path / f"c.{fmt}", _conns(4), fmt=fmt, mss=300, reorder=[5, 30], drop=[12], duplicate=[20], non_tcp=4)
    ranges = _same_as_whole(w.path, split_size)
    if split_size == 1:
        headers = 1 if fmt == "pcapng" else 0  # pcapng: the section header and interfaces are a range of their own
        assert len(ranges) == len(_whole(w.path)[0]) + headers  # one packet each
    if split_size == 1 << 30:
        assert len(ranges) == 1
    assert ranges[0].start == (24 if fmt == "pcap" else 0)
    firsts = [r.first_packet for r in ranges]
    assert firsts == sorted(firsts) and firsts[0] == 1


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_big_endian_nanosecond_and_many_interfaces(tmp_path: Path, fmt: str) -> None:
    extra = {"extra_interfaces": 3} if fmt == "pcapng" else {}
    w = write_capture(tmp_path / f"c.{fmt}", _conns(3), fmt=fmt, mss=200, big_endian=True, nanosecond=True, snaplen=150, **extra)
    assert len(_same_as_whole(w.path, 500)) > 3


def test_data_offset_is_where_the_packet_bytes_are(tmp_path: Path) -> None:
    for fmt in ("pcap", "pcapng"):
        w = write_capture(tmp_path / f"c.{fmt}", _conns(2), fmt=fmt, mss=100)
        data = w.path.read_bytes()
        packets = _whole(w.path)[0]
        assert packets
        for p in packets:
            assert data[p.data_offset : p.data_offset + len(p.data)] == p.data
            assert p.data_offset == p.offset + (16 if fmt == "pcap" else 28)


def _block(btype: int, body: bytes) -> bytes:
    body += bytes(-len(body) % 4)
    return struct.pack("<II", btype, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


def test_simple_packet_blocks(tmp_path: Path) -> None:
    """pcapng simple packet blocks (no time) mixed with enhanced ones: split and read like the rest."""
    frame = bytes(range(60))
    shb = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    idb = _block(1, struct.pack("<HHI", 1, 0, 0))
    blocks = [shb, idb]
    for i in range(12):
        if i % 3:
            blocks.append(_block(3, struct.pack("<I", len(frame)) + frame))
        else:
            blocks.append(_block(6, struct.pack("<IIIII", 0, 0, 1000 + i, len(frame), len(frame)) + frame))
    path = tmp_path / "spb.pcapng"
    path.write_bytes(b"".join(blocks))
    packets = _whole(path)[0]
    assert len(packets) == 12
    for p in packets:
        assert p.data == frame and p.data_offset == p.offset + (12 if p.ts == 0 else 28)
    assert len(_same_as_whole(path, 100)) == 4  # cut before the enhanced blocks (a simple one has no time to start a range with)


def test_bad_and_hostile_files(tmp_path: Path) -> None:
    """Whatever one reader reports - an error, a problem at an offset - the ranges report the same."""
    files = {**write_bad_files(tmp_path / "bad"), **write_hostile_headers(tmp_path / "hostile")}
    for name, path in files.items():
        for size in (64, 1 << 30):
            ranges = _same_as_whole(path, size)
            assert ranges, name


def test_a_file_open_already(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcapng", _conns(2), fmt="pcapng", mss=200)
    with w.path.open("rb") as f:
        assert split_ranges(f, 400) == split_ranges(w.path, 400) == split_ranges(str(w.path), 400)


def test_not_a_capture_and_missing(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_bytes(b"not a capture at all\n" * 10)
    assert split_ranges(text, 16) == [CaptureRange(0, text.stat().st_size, 1, b"")]
    assert split_ranges(tmp_path / "missing.pcap", 16) == [CaptureRange(0, 0, 1, b"")]
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    assert split_ranges(empty, 16) == [CaptureRange(0, 0, 1, b"")]
    with empty.open("rb") as f, pytest.raises(CaptureError, match="empty file"):
        list(read_range(CaptureReader(str(empty)), f, CaptureRange(0, 0, 1, b"")))
