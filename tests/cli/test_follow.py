"""``dcpinspect follow``: a connection's frames or bytes in order, a DCP stream's messages."""

from __future__ import annotations

import json

import pytest
from clirun import run
from paths import CAPTURES, THIRD_PARTY

from dcpinspect.capture.read import read_records
from dcpinspect.cli.follow import hex_lines, parse_stream

IDS = CAPTURES / "live-stream-ids.pcap"
RETRY = CAPTURES / "live-rollback-retry.pcap"
MULTI = CAPTURES / "live-stream-ends.pcap"


def name_of(line: str) -> str:
    """The command of a frames line: the word before its role."""
    words = line.split()
    return next(words[i - 1] for i, w in enumerate(words) if w in ("request", "response"))


def test_conn_lists_the_connections_frames_in_order() -> None:
    code, out = run("follow", "--no-progress", str(MULTI), "--conn", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("== conn 2  ")
    numbers = [int(line.split()[0]) for line in lines[1:]]
    assert numbers == sorted(numbers) and all(" conn 2 " in line for line in lines[1:])
    _, frames = run("frames", "--no-progress", str(MULTI), "--conn", "2")
    assert lines[1:] == frames.splitlines(), "the lines frames prints, the same times"


def test_conn_json() -> None:
    code, out = run("follow", "--no-progress", "--json", str(MULTI), "--conn", "3")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and rows and {r["conn"] for r in rows} == {rows[0]["conn"]}
    assert {r["dir"] for r in rows} == {"c2s", "s2c"}


def test_raw_is_the_connections_bytes_in_both_directions() -> None:
    code, out = run("follow", "--no-progress", "--raw", str(IDS), "--conn", "1")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == lines[-1] == "=" * 67 and lines[1] == "Follow: dcpinspect conn 1,hex" and lines[2].startswith("Node 0: 127.0.0.1:")
    streams: dict[str, bytearray] = {"c2s": bytearray(), "s2c": bytearray()}
    for line in lines[4:-1]:
        d = "s2c" if line.startswith("\t") else "c2s"
        offset, rest = line.strip().split("  ", 1)
        assert int(offset, 16) == len(streams[d]), "offsets run on in each direction"
        streams[d] += bytes.fromhex(rest[:49].replace("  ", " "))
    want = {"c2s": bytearray(), "s2c": bytearray()}
    for rec in read_records([str(IDS)]):
        want[rec.direction] += rec.event[1]
    assert streams == want


def test_hex_lines_layout() -> None:
    assert hex_lines(b"GET / HTTP/1.1\r\n", 0) == ["00000000  47 45 54 20 2f 20 48 54  54 50 2f 31 2e 31 0d 0a  GET / HTTP/1.1.."]
    assert hex_lines(b"\x80\x01", 32, "\t") == ["\t00000020  80 01" + " " * 45 + ".."]


def test_stream_with_an_id_lists_only_its_messages() -> None:
    code, out = run("follow", "--no-progress", str(IDS), "--stream", "0:2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("== stream vb 0 sid 2  conn 1 ") and "2 items, end OK" in lines[0]
    names = [name_of(line) for line in lines[1:]]
    assert names == ["DCP_STREAM_REQ", "DCP_STREAM_REQ", "DCP_SNAPSHOT_MARKER", "DCP_MUTATION", "DCP_MUTATION", "DCP_STREAM_END"]
    assert all("opaque=0x00000009" in line for line in lines[1:])


def test_stream_lists_every_attempt_and_the_items() -> None:
    code, out = run("follow", "--no-progress", str(RETRY), "--stream", "0")
    assert code == 0
    lines = out.splitlines()
    assert "requests rollback (frame 23), success (frame 25)" in lines[0]
    body = lines[1:]
    assert [name_of(line) for line in body[:4]] == ["DCP_STREAM_REQ"] * 4
    assert sum(" DCP_MUTATION " in line for line in body) == 12
    numbers = [int(line.split()[0]) for line in body]
    assert numbers == sorted(numbers)


def test_stream_json_has_a_header_per_segment() -> None:
    code, out = run("follow", "--no-progress", "--json", str(IDS), "--stream", "1")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and rows[0]["stream"]["vbucket"] == 1 and rows[0]["stream"]["items"] == 8
    assert all(r.get("vbucket") in (1, None) for r in rows[1:])


@pytest.mark.parametrize(
    ("argv", "message", "status"),
    [
        (["--stream", "9"], "no DCP stream of vbucket 9 in the capture", 1),
        (["--conn", "4"], "no connection 4 (the capture has 1)", 1),
        (["--stream", "x:1"], "--stream 'x:1': expected VB or VB:SID", 2),
        ([], "follow needs --conn N", 2),
        (["--stream", "0", "--raw"], "--raw follows a connection", 2),
    ],
)
def test_follow_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str, status: int) -> None:
    code, out = run("follow", "--no-progress", str(IDS), *argv)
    err = capsys.readouterr().err
    assert code == status and out == "" and message in err and len(err.splitlines()) == 1


def test_parse_stream() -> None:
    assert parse_stream("3") == (3, None) and parse_stream("3:1") == (3, 1) and parse_stream("0x10") == (16, None)
    with pytest.raises(ValueError, match="0-65535"):
        parse_stream("70000")


@pytest.mark.shared
@pytest.mark.skipif(not THIRD_PARTY.is_dir(), reason="../shared/captures/third-party is absent")
def test_follow_a_third_party_connection() -> None:
    src = THIRD_PARTY / "packetbeat_memcache_bin_tcp_counter_ops.pcap"
    code, out = run("follow", "--no-progress", str(src), "--conn", "1")
    assert code == 0 and len(out.splitlines()) == 11 and " INCREMENT " in out
    code, raw = run("follow", "--no-progress", "--raw", str(src), "--conn", "1")
    assert code == 0 and "\t00000000  81 " in raw and "cnt" in raw
