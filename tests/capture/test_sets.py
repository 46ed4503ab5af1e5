"""Capture sets: which files of a run are one recording, and reading each set as a capture of its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from paths import CAPTURES, THIRD_PARTY
from pcapfactory import Conn, Msg, rotate, write_capture
from readcheck import assert_same_read

from dcpinspect import encode
from dcpinspect.capture import sets
from dcpinspect.capture.read import read_records
from dcpinspect.capture.sets import CaptureSet, file_sets, plan_capture_sets, ring_name
from dcpinspect.cli.main import main
from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.timeline_feed import read_timeline

SHIPPED = sorted(str(p) for p in CAPTURES.glob("*.pcap"))


def _conn(port: int, n: int = 6, close: str | None = "fin", handshake: bool = True) -> Conn:
    msgs = [Msg("c2s", encode("DCP_NOOP", opaque=i)) for i in range(n)]
    msgs += [Msg("s2c", encode("DCP_NOOP", opaque=i, response=True)) for i in range(n)]
    return Conn(client=("10.0.0.1", port), msgs=msgs, close=close, handshake=handshake)


def _pair(tmp_path: Path, ts0: float = 1_700_000_000.0) -> tuple[str, str]:
    """Two unrelated files with the same 4-tuple (one connection each, opened and closed)."""
    a = write_capture(tmp_path / "a.pcap", [_conn(40000)], ts0=ts0)
    b = write_capture(tmp_path / "b.pcap", [_conn(40000)], ts0=ts0 + 3600)
    return str(a.path), str(b.path)


def test_one_file_is_one_set_without_reading_it(tmp_path: Path) -> None:
    assert plan_capture_sets([str(tmp_path / "nosuch.pcap")]) == [CaptureSet(1, (str(tmp_path / "nosuch.pcap"),), "one file")]


def test_unrelated_files_are_sets_of_their_own(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    plan = plan_capture_sets([b, a])
    assert [cs.files for cs in plan] == [(b,), (a,)]  # in the order of the arguments
    assert [cs.number for cs in plan] == [1, 2] and {cs.reason for cs in plan} == {"one file"}


def test_modes_force_one_set_or_one_per_file(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    assert plan_capture_sets([a, b], "one") == [CaptureSet(1, (a, b), "--one-capture")]
    assert plan_capture_sets([a, b], "per-file") == [CaptureSet(1, (a,), "--per-file"), CaptureSet(2, (b,), "--per-file")]
    with pytest.raises(ValueError, match="unknown mode"):
        plan_capture_sets([a], "sometimes")


def test_rotated_files_whose_connections_continue_are_one_set(tmp_path: Path) -> None:
    w = write_capture(tmp_path / "c.pcap", [_conn(40000 + i, n=20) for i in range(3)], mss=100)
    files = rotate(w.path, 3)
    other = write_capture(tmp_path / "other.pcap", [_conn(41000)], ts0=1_600_000_000.0)
    plan = plan_capture_sets([str(other.path), files[2], files[0], files[1]])
    assert plan[0].files == (str(other.path),)
    assert plan[1] == CaptureSet(2, tuple(files), "connections continue across files")  # read in time order


def test_a_connection_opening_again_is_not_a_continuation(tmp_path: Path) -> None:
    """The same 4-tuple right after, but opening with a SYN: a new connection, so a new recording."""
    a = write_capture(tmp_path / "a.pcap", [_conn(40000, close=None)], ts0=1_700_000_000.0)
    b = write_capture(tmp_path / "b.pcap", [_conn(40000)], ts0=1_700_000_001.0)
    assert len(plan_capture_sets([str(a.path), str(b.path)])) == 2


def test_a_continuation_far_later_is_not_one_recording(tmp_path: Path) -> None:
    a = write_capture(tmp_path / "a.pcap", [_conn(40000, close=None)], ts0=1_700_000_000.0)
    b1 = write_capture(tmp_path / "b1.pcap", [_conn(40000, handshake=False)], ts0=1_700_000_010.0)
    b2 = write_capture(tmp_path / "b2.pcap", [_conn(40000, handshake=False)], ts0=1_700_000_500.0)
    assert len(plan_capture_sets([str(a.path), str(b1.path)])) == 1
    assert len(plan_capture_sets([str(a.path), str(b2.path)])) == 2


def test_ring_buffer_names_make_one_set(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    names = [
        tmp_path / "ring_00001_20260101120000.pcap",
        tmp_path / "ring_00002_20260101130000.pcap",
        tmp_path / "ring_00004_20260101140000.pcap",
    ]
    for src, dst in zip((a, b, a), names, strict=True):
        shutil.copy(src, dst)
    assert ring_name(str(names[0])) == (str(tmp_path / "ring") + "\0.pcap", 1)
    assert ring_name(a) is None
    plan = plan_capture_sets([str(n) for n in names])
    assert plan[0] == CaptureSet(1, (str(names[0]), str(names[1])), "rotated ring buffer (dumpcap names)")
    assert plan[1].files == (str(names[2]),)  # number 3 is missing: not consecutive


def test_an_unreadable_file_is_a_set_of_its_own(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"not a capture at all")
    plan = plan_capture_sets([a, str(bad), str(tmp_path / "missing.pcap"), b])
    assert [cs.files for cs in plan] == [(a,), (str(bad),), (str(tmp_path / "missing.pcap"),), (b,)]
    assert plan[1].reason.startswith("unreadable")
    st = CaptureStats()
    list(read_records([a, str(bad), b], stats=st))
    assert st.files[str(bad)]["error"] and not st.files[a]["error"]


def test_tails_of_big_files_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files bigger than the edges read: the tail is found from the end (pcap and pcapng), and the join still made."""
    monkeypatch.setattr(sets, "EDGE_PACKETS", 40)
    monkeypatch.setattr(sets, "EDGE_BYTES", 16384)
    big = [Msg("c2s", encode("DCP_NOOP", opaque=i) * 20) for i in range(300)]
    for fmt in ("pcap", "pcapng"):
        w = write_capture(tmp_path / f"big.{fmt}", [Conn(client=("10.0.0.1", 40000), msgs=big, close=None)], fmt=fmt, mss=700)
        assert w.path.stat().st_size > 4 * sets.EDGE_BYTES
        nxt = write_capture(tmp_path / f"next.{fmt}", [_conn(40000, handshake=False)], fmt=fmt, ts0=1_700_000_000.0 + 301 * 0.001 + 1)
        plan = plan_capture_sets([str(nxt.path), str(w.path)])
        assert plan == [CaptureSet(1, (str(w.path), str(nxt.path)), "connections continue across files")], fmt
        # the tail alone says so: the head of the big file never reaches the connection's end
        late = write_capture(tmp_path / f"late.{fmt}", [_conn(40000, handshake=False)], ts0=1_700_000_000.0 + 301 * 0.001 + 120)
        assert len(plan_capture_sets([str(w.path), str(late.path)])) == 2


def test_the_same_tuple_in_two_sets_is_two_connections(tmp_path: Path) -> None:
    """Never joined across sets, in both paths; frames and connections numbered on across the run."""
    a = write_capture(tmp_path / "a.pcap", [_conn(40000, close=None)], ts0=1_700_000_000.0)
    b = write_capture(tmp_path / "b.pcap", [_conn(40000, handshake=False)], ts0=1_700_000_010.0)
    paths = [str(a.path), str(b.path)]
    one = assert_same_read(paths, capture_sets="one")
    assert set(one.column("conn_id").to_pylist()) == {1}
    t = assert_same_read(paths, capture_sets="per-file", rows=5)
    assert set(t.column("conn_id").to_pylist()) == {1, 2}
    assert t.column("frame").to_pylist() == list(range(1, t.num_rows + 1))
    n1 = t.column("capture_set").to_pylist().count(1)
    assert t.column("capture_set").to_pylist() == [1] * n1 + [2] * (t.num_rows - n1)
    assert t.column("set_frame").to_pylist() == list(range(1, n1 + 1)) + list(range(1, t.num_rows - n1 + 1))
    st = CaptureStats()
    recs = list(read_records(paths, stats=st, capture_sets="per-file"))
    assert st.set_first == {1: 1, 2: n1 + 1} and [c.id for c in st.connections] == [1, 2]
    assert [(r.capture_set, r.set_frame) for r in recs] == list(
        zip(t.column("capture_set").to_pylist(), t.column("set_frame").to_pylist(), strict=True)
    )


def test_shipped_captures_are_one_set_each_and_read_alike() -> None:
    plan = plan_capture_sets(SHIPPED)
    assert [cs.files for cs in plan] == [(p,) for p in SHIPPED]  # unrelated simulator runs
    t = assert_same_read(SHIPPED, rows=50)
    starts = [f for f, sf in zip(t.column("frame").to_pylist(), t.column("set_frame").to_pylist(), strict=True) if sf == 1]
    assert len(starts) == len(SHIPPED)
    st = CaptureStats()
    tl = read_timeline(SHIPPED, stats=st)
    assert tl.set_first == st.set_first and len(st.set_first) == len(SHIPPED)
    for cs, f in st.set_first.items():
        if cs < len(SHIPPED) and st.set_first[cs + 1] > f:
            assert tl.locate(f) == (cs, 1)
    assert sorted(st.set_first.values()) == starts


def test_each_set_reads_as_when_read_alone() -> None:
    """A file's rows in a run of many sets are its rows read alone, but for the run's numbering."""
    alone = assert_same_read([SHIPPED[3]])
    many = assert_same_read(SHIPPED)
    mine = many.filter(pa.compute.equal(many.column("file"), SHIPPED[3]))
    for name in alone.column_names:
        if name in ("frame", "conn_id", "capture_set"):
            continue
        assert mine.column(name).to_pylist() == alone.column(name).to_pylist(), name
    assert set(mine.column("capture_set").to_pylist()) == {4}


def _show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["show", "--no-progress", *args])
    return code, capsys.readouterr().out


def test_show_file_frame_finds_the_same_frame_whatever_else_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    x = SHIPPED[5]
    code, alone = _show(capsys, x, "--frame", "3")
    assert code == 0 and alone.startswith("== frame 3  (") and f"({x}, set 1 frame 3)" in alone
    code, many = _show(capsys, *SHIPPED, "--file", x, "--frame", "3")
    assert code == 0 and f"({x}, set 6 frame 3)" in many
    code, ref = _show(capsys, *SHIPPED, "--frame", f"{x}:3")
    assert code == 0 and ref == many
    assert alone.split("\n", 1)[1] == many.split("\n", 1)[1]  # the same frame, dissected alike
    code, _ = _show(capsys, *SHIPPED, "--frame", "nosuch.pcap:3")
    assert code == 2


def test_summary_lists_the_sets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", "--no-progress", *SHIPPED[:2]]) == 0
    out = capsys.readouterr().out
    assert out.startswith("capture sets:\n  set 1 (one file): frames 1-") and "  set 2 (one file)" in out
    assert main(["summary", "--no-progress", "--one-capture", *SHIPPED[:2]]) == 0
    assert "  set 1 (--one-capture)" in capsys.readouterr().out


def test_timeline_keeps_histories_per_set() -> None:
    st = CaptureStats()
    t = read_timeline(SHIPPED, stats=st)
    sets = file_sets(st.sets)
    assert {c.capture_set for c in t.connections.values()} <= set(sets.values())
    for c in t.connections.values():
        assert sets[c.file] == c.capture_set


@pytest.mark.shared
def test_third_party_captures_are_planned() -> None:
    files = sorted(str(p) for p in THIRD_PARTY.glob("*") if p.suffix in (".pcap", ".pcapng", ".cap"))
    if not files:
        pytest.skip("no third-party captures")
    plan = plan_capture_sets(files)
    assert sorted(f for cs in plan for f in cs.files) == files
