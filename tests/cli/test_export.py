"""``frames --pcap``: the packets of the selected frames (or whole connections) back to a pcap file, as captured."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from clirun import run
from paths import CAPTURES, THIRD_PARTY
from tshark import TSHARK, needs_tshark, tshark_frames

from dcpinspect.capture.pcapfile import CaptureReader
from dcpinspect.capture.pcapwrite import PacketSelection
from dcpinspect.flows.reassembly import Segment

SESSION = CAPTURES / "dcp-session.pcap"
MULTI = CAPTURES / "live-stream-ends.pcap"  # three connections


def frames_json(*argv: str) -> list[dict[str, object]]:
    code, out = run("frames", "--no-progress", "--json", *argv)
    assert code == 0
    return [json.loads(line) for line in out.splitlines()]


def packets(path: Path) -> list[tuple[int, int, bytes, int]]:
    return [(p.linktype, p.ts, p.data, p.wirelen) for p in CaptureReader(str(path))]


def _key(row: dict[str, object]) -> tuple[object, ...]:
    # not the key: a slice without the session's HELLO reads keys without the negotiated collection ids
    return (row["dir"], row["name"], row["opaque"], row["seqno"])


def test_filtered_frames_are_exported_with_their_packets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "slice.pcap"
    flt = "name == 'DCP_MUTATION'"
    code, printed = run("frames", "--no-progress", str(SESSION), "--filter", flt, "--pcap", str(out))
    assert code == 0 and printed == ""
    chosen = [_key(r) for r in frames_json(str(SESSION), "--filter", flt)]
    got = [_key(r) for r in frames_json(str(out))]
    assert chosen and all(k in got for k in chosen)
    source = packets(SESSION)
    written = packets(out)
    assert 0 < len(written) < len(source)
    assert written == [p for p in source if p in written], "the packets as captured, in capture order"
    assert capsys.readouterr().err == f"wrote {len(written)} packets to {out}\n"


def test_a_whole_connection_is_exported_with_handshake_and_close(tmp_path: Path) -> None:
    for conn in (1, 2, 3):
        out = tmp_path / f"conn{conn}.pcap"
        assert run("frames", "--no-progress", str(MULTI), "--conn", str(conn), "--pcap", str(out))[0] == 0
        mine = [(r["dir"], r["name"], r["opaque"], r["key"]) for r in frames_json(str(MULTI), "--conn", str(conn))]
        again = [(r["dir"], r["name"], r["opaque"], r["key"]) for r in frames_json(str(out))]
        assert mine and again == mine, conn
        flags = [p[2][47] for p in packets(out)]  # Ethernet + IPv4 (20) + TCP flags at 13
        assert flags[0] & 0x02 and any(f & 0x01 for f in flags), "SYN first, a FIN among them"


def test_frames_conn_selects_rows(capsys: pytest.CaptureFixture[str]) -> None:
    rows = frames_json(str(MULTI), "--conn", "2")
    assert rows and {r["conn"] for r in rows} == {rows[0]["conn"]}
    assert len(rows) < len(frames_json(str(MULTI)))


def test_export_with_no_frame_selected_is_a_valid_empty_pcap(tmp_path: Path) -> None:
    out = tmp_path / "none.pcap"
    assert run("frames", "--no-progress", str(SESSION), "--filter", "name == 'DCP_EXPIRATION'", "--pcap", str(out))[0] == 0
    assert packets(out) == [] and out.stat().st_size == 24


def test_export_to_an_unwritable_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("frames", "--no-progress", str(SESSION), "--pcap", str(tmp_path / "no" / "x.pcap"))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("dcpinspect: error: cannot write ") and len(err.splitlines()) == 1


def test_export_of_an_unknown_connection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("frames", "--no-progress", str(SESSION), "--conn", "5", "--pcap", str(tmp_path / "x.pcap"))
    assert code == 2 and "no connection 5" in capsys.readouterr().err


def test_selection_spans() -> None:
    sel = PacketSelection()
    sel.add(("a", 1, "b", 2), 5, 7)
    sel.add(("a", 1, "b", 2), 8, 9)
    seg = Segment(100, "a", 1, "b", 2, 0, 0x18, b"x")
    assert [n for n in range(1, 12) if sel.keeps(n, seg)] == [5, 6, 7, 8, 9]
    assert not sel.keeps(6, seg, capture_set=2), "positions count within a capture set"
    assert not sel.keeps(6, seg._replace(payload=b"")), "a frame's span keeps packets with payload"
    back = seg._replace(src="b", sport=2, dst="a", dport=1)
    assert not sel.keeps(6, back), "one direction"
    sel.add_connection(("a", 1), ("b", 2), 50, 150, capture_set=3)
    assert sel.keeps(1, seg._replace(payload=b""), 3) and sel.keeps(99, back, 3), "a connection: every packet, both ways"
    assert not sel.keeps(1, seg._replace(ts=151), 3) and not sel.keeps(1, seg, 1)


def test_export_from_the_second_capture_set(tmp_path: Path) -> None:
    out = tmp_path / "ends.pcap"
    argv = [str(SESSION), str(MULTI), "--filter", "name == 'DCP_STREAM_END'"]
    assert run("frames", "--no-progress", *argv, "--pcap", str(out))[0] == 0
    want = [_key(r) for r in frames_json(*argv)]
    got = [_key(r) for r in frames_json(str(out))]
    assert len(want) == 9 and all(k in got for k in want)
    whole = tmp_path / "conn3.pcap"
    assert run("frames", "--no-progress", str(SESSION), str(MULTI), "--conn", "3", "--pcap", str(whole))[0] == 0
    assert len(frames_json(str(whole))) == len(frames_json(str(SESSION), str(MULTI), "--conn", "3")) > 0


@needs_tshark
def test_tshark_reads_the_export(tmp_path: Path) -> None:
    out = tmp_path / "slice.pcap"
    assert run("frames", "--no-progress", str(SESSION), "--filter", "name == 'DCP_STREAM_REQ'", "--pcap", str(out))[0] == 0
    assert TSHARK is not None
    done = subprocess.run([TSHARK, "-r", str(out), "-n"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip()
    pdus = tshark_frames(out)
    ours = frames_json(str(out))
    assert len(pdus) == len(ours) > 0
    assert [int(str(p["couchbase.opcode"]), 16) for p in pdus] == [r["opcode"] for r in ours]


@pytest.mark.shared
@pytest.mark.skipif(not THIRD_PARTY.is_dir(), reason="../shared/captures/third-party is absent")
def test_third_party_capture_export(tmp_path: Path) -> None:
    src = THIRD_PARTY / "packetbeat_memcache_bin_tcp_multi_store_load.pcap"
    out = tmp_path / "sets.pcap"
    assert run("frames", "--no-progress", str(src), "--filter", "name == 'SET'", "--pcap", str(out))[0] == 0
    names = [r["name"] for r in frames_json(str(out))]
    assert names.count("SET") == sum(r["name"] == "SET" for r in frames_json(str(src))) > 0
