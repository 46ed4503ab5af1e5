"""Gzip'ed captures: read as tshark reads them, found by their magic bytes, streaming, keeping what came before a fault."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest
from paths import CAPTURES
from pcapfactory import Conn, Msg, write_capture

from dcpinspect.capture.pcapfile import CaptureError, CaptureReader, Gunzip, read_range, split_ranges
from dcpinspect.capture.read import read_records

PLAIN = CAPTURES / "live-stream-ids.pcap"


def _noop(opaque: int, magic: int = 0x80) -> bytes:
    return bytes([magic, 0x5C]) + bytes(10) + opaque.to_bytes(4, "big") + bytes(8)


def _pcapng(tmp_path: Path) -> Path:
    conn = Conn(msgs=[Msg("c2s", _noop(1)), Msg("s2c", _noop(1, 0x81)), Msg("c2s", _noop(2))])
    path = tmp_path / "x.pcapng"
    write_capture(path, [conn], fmt="pcapng")
    return path


def _gz(src: Path, dst: Path, data: bytes | None = None) -> Path:
    dst.write_bytes(gzip.compress(src.read_bytes() if data is None else data))
    return dst


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_gzip_reads_as_the_plain_file(tmp_path: Path, fmt: str) -> None:
    src = PLAIN if fmt == "pcap" else _pcapng(tmp_path)
    gz = _gz(src, tmp_path / "capture.bin")  # no .gz in the name: the magic bytes decide
    plain, packed = CaptureReader(str(src)), CaptureReader(str(gz))
    assert list(packed) == list(plain) and plain.packets > 2
    assert packed.format == fmt and packed.compression == "gzip" and packed.problems == []
    assert plain.compression == ""


def test_gzip_records_equal_the_plain_file(tmp_path: Path) -> None:
    gz = _gz(PLAIN, tmp_path / "c.pcap.gz")
    got = [(r.number, r.conn, r.direction, r.event) for r in read_records([str(gz)])]
    want = [(r.number, r.conn, r.direction, r.event) for r in read_records([str(PLAIN)])]
    assert got == want and len(got) > 40


def test_concatenated_members_and_padding(tmp_path: Path) -> None:
    data = PLAIN.read_bytes()
    path = tmp_path / "m.pcap.gz"
    path.write_bytes(gzip.compress(data[:1000]) + gzip.compress(data[1000:]) + b"\0" * 7)
    r = CaptureReader(str(path))
    assert list(r) == list(CaptureReader(str(PLAIN))) and r.problems == []


def test_trailing_bytes_that_are_not_gzip_are_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "t.pcap.gz"
    path.write_bytes(gzip.compress(PLAIN.read_bytes()) + b"junk")
    r = CaptureReader(str(path))
    assert list(r) == list(CaptureReader(str(PLAIN)))
    assert [m for _o, m in r.problems] == ["4 bytes after the gzip data are not gzip: ignored"]


def test_a_cut_gzip_file_keeps_the_packets_before_the_cut(tmp_path: Path) -> None:
    whole = list(CaptureReader(str(PLAIN)))
    packed = gzip.compress(PLAIN.read_bytes())
    path = tmp_path / "cut.pcap.gz"
    path.write_bytes(packed[: len(packed) * 2 // 3])
    r = CaptureReader(str(path))
    got = list(r)
    assert 0 < len(got) < len(whole) and got == whole[: len(got)]
    assert r.problems[-1][1] == "gzip data cut short (no end of stream): the capture was cut short"


def test_corrupt_gzip_data_ends_the_file_with_a_problem(tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(PLAIN.read_bytes()))
    packed[-6] ^= 0xFF  # the CRC: every byte decompresses, the check fails at the end
    path = tmp_path / "crc.pcap.gz"
    path.write_bytes(bytes(packed))
    r = CaptureReader(str(path))
    got = list(r)
    assert got and got == list(CaptureReader(str(PLAIN)))[: len(got)]
    assert len(r.problems) == 1 and "gzip data corrupt" in r.problems[0][1] and "reading stopped" in r.problems[0][1]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (gzip.compress(b""), "empty gzip'ed data: not a capture"),
        (gzip.compress(b"hello world"), "gzip'ed, but not a pcap or pcapng capture (starts with 68656c6c)"),
    ],
)
def test_gzip_of_something_else_is_an_error(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "x.gz"
    path.write_bytes(data)
    with pytest.raises(CaptureError) as err:
        list(CaptureReader(str(path)))
    assert message in str(err.value) and str(err.value).count(str(path)) == 1


def test_garbled_gzip_header_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "g.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + bytes(6) + b"\xff" * 64)
    with pytest.raises(CaptureError, match="gzip data corrupt"):
        list(CaptureReader(str(path)))


def test_gunzip_reads_in_bounded_pieces() -> None:
    data = bytes(range(256)) * 40_000  # 10 MB that compress well
    g = Gunzip(io.BytesIO(gzip.compress(data)))
    got = []
    while chunk := g.read(3_000_000):
        assert len(g._buf) <= 3_000_000 + (1 << 20)  # never much more than asked for held
        got.append(chunk)
    assert b"".join(got) == data and g.tell() == len(data) and not g.cut


def test_a_gzip_file_is_one_range_read_whole(tmp_path: Path) -> None:
    gz = _gz(PLAIN, tmp_path / "r.pcap.gz")
    ranges = split_ranges(gz, 1000)
    assert len(ranges) == 1 and ranges[0].start == 0 and ranges[0].prefix == b""
    reader = CaptureReader(str(gz))
    with gz.open("rb") as f:
        got = list(read_range(reader, f, ranges[0]))
    assert got == list(CaptureReader(str(PLAIN))) and reader.compression == "gzip" and reader.format == "pcap"


def test_the_cli_reads_a_gzip_capture(tmp_path: Path) -> None:
    from dcpinspect.cli.main import main

    gz = _gz(PLAIN, tmp_path / "c.pcap.gz")
    outs = []
    for path in (gz, PLAIN):
        out = io.StringIO()
        assert main(["frames", "--no-progress", str(path)], out=out, stdin=io.StringIO("")) == 0
        outs.append(out.getvalue())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) > 40
