"""The vectorised packet stage (``packets_vector``) equals the per-packet one, segment for segment.

:func:`~dcpinspect.tables.packets_vector.segment_windows` is compared with
:func:`~dcpinspect.capture.read.capture_segments` (segments rebuilt with their
payload bytes, and the stats: files, packets, skipped reasons), and
:func:`~dcpinspect.tables.packets_vector.range_window` with
:func:`~dcpinspect.capture.pcapfile.read_range` and
:func:`~dcpinspect.capture.packets.locate_segment` over
:func:`~dcpinspect.capture.pcapfile.split_ranges` - on the shipped and
third-party captures, the hostile and bad files of ``pcapfactory``, every
``write_capture`` option, and Hypothesis-made packets and files (random link,
IP and TCP headers, cut anywhere, files damaged anywhere), with windows and
ranges cut anywhere.
"""

from __future__ import annotations

import functools
import itertools
import os
import struct
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import CAPTURES, THIRD_PARTY
from pcapfactory import LINKTYPES, Conn, Msg, write_bad_files, write_capture, write_hostile_headers

from dcpinspect import encode
from dcpinspect.capture.packets import locate_segment
from dcpinspect.capture.pcapfile import CaptureError, CaptureRange, CaptureReader, read_range, split_ranges
from dcpinspect.capture.read import capture_segments
from dcpinspect.flows.reassembly import Segment
from dcpinspect.flows.records import CaptureStats
from dcpinspect.tables.packets_vector import SegmentWindow, range_window, segment_windows

SHIPPED = sorted(CAPTURES.glob("*.pcap"))
OTHERS = sorted(THIRD_PARTY.glob("*.pcap*")) if THIRD_PARTY.is_dir() else []
WINDOWS = (32 << 20, 1, 200, 4096)


# --------------------------------------------------------------------------- comparing


def rebuilt(windows: list[SegmentWindow], start: int | None = None) -> list[Segment]:
    """The windows' segments as flows.reassembly.Segment (``start``: the file offset of ``data[0]`` of a range's window, whose segments have no position)."""
    out = []
    for w in windows:
        shift = start if start is not None and not w.mapped else 0
        for k in range(len(w.number)):
            a = int(w.poff[k]) - shift
            payload = bytes(w.data[a : a + int(w.plen[k])])
            out.append(
                Segment(
                    int(w.ts[k]),
                    w.addresses[w.src[k]],
                    int(w.sport[k]),
                    w.addresses[w.dst[k]],
                    int(w.dport[k]),
                    int(w.seq[k]),
                    int(w.flags[k]),
                    payload,
                    int(w.missing[k]),
                    int(w.number[k]),
                    w.path,
                    int(w.base) + int(w.number[k]) if start is None else 0,
                )
            )
    return out


def assert_same_segments(expected: list[Segment], got: list[Segment]) -> None:
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        assert a == b, f"segment {i} differs:\n per-packet {a[:7]} {a[8:]} {len(a.payload)}\n vectorised {b[:7]} {b[8:]} {len(b.payload)}"
    assert len(expected) == len(got)


def check_windows(paths: list[str], window: int = 32 << 20) -> list[SegmentWindow]:
    """segment_windows == capture_segments on ``paths``: segments and stats."""
    ref, got = CaptureStats(), CaptureStats()
    expected = list(capture_segments(paths, ref))
    calls: list[tuple[str, int]] = []
    windows = list(segment_windows(paths, got, window=window, progress=lambda p, o: calls.append((p, o))))
    assert_same_segments(expected, rebuilt(windows))  # after the walk: every window's data is still valid
    assert got.files == ref.files
    assert got.packets == ref.packets
    assert got.skipped == ref.skipped
    assert len(calls) >= len(windows)
    assert all(w.addresses is windows[0].addresses for w in windows)
    assert [w.file_index for w in windows] == sorted(w.file_index for w in windows)
    assert {w.path for w in windows} <= {str(p) for p in paths}
    return windows


def check_ranges(path: str, split: int) -> None:
    """range_window == read_range + locate_segment for every range of ``path``."""
    with open(path, "rb") as f:
        for rng in split_ranges(path, split):
            ref = CaptureReader(path)
            expected: list[Segment] = []
            skipped: Counter[str] = Counter()
            error = None
            try:
                for pkt in read_range(ref, f, rng):
                    found = locate_segment(pkt.linktype, pkt.data, pkt.wirelen, pkt.ts, pkt.number, path, skipped)
                    if found is not None:
                        expected.append(found[0])
            except CaptureError as exc:
                error = str(exc)
            f.seek(rng.start)
            data = f.read(rng.end - rng.start)
            mine: Counter[str] = Counter()
            if error is not None:
                with pytest.raises(CaptureError) as caught:
                    range_window(path, 3, data, rng, mine)
                assert str(caught.value) == error
                continue
            win, reader = range_window(path, 3, data, rng, mine)
            assert win.file_index == 3
            assert not win.mapped
            assert_same_segments(expected, rebuilt([win], rng.start))
            assert mine == skipped
            assert (reader.problems, reader.format, reader.packets, reader.linktypes, reader.bad_times) == (
                ref.problems,
                ref.format,
                ref.packets,
                ref.linktypes,
                ref.bad_times,
            )


# --------------------------------------------------------------------------- captures


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_captures(path: Path, window: int) -> None:
    check_windows([str(path)], window)


def test_shipped_captures_in_one_call() -> None:
    windows = check_windows([str(p) for p in SHIPPED], 1 << 16)
    assert {w.file_index for w in windows} == set(range(len(SHIPPED)))


@pytest.mark.parametrize("split", [1, 3000, 1 << 30])
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_ranges(path: Path, split: int) -> None:
    check_ranges(str(path), split)


@pytest.mark.shared
@pytest.mark.skipif(not OTHERS, reason="../shared/captures/third-party is absent")
@pytest.mark.parametrize("window", [32 << 20, 1, 1000])
def test_third_party_captures(window: int) -> None:
    for path in OTHERS:
        check_windows([str(path)], window)
        check_ranges(str(path), window)


def test_bad_and_hostile_files(tmp_path: Path) -> None:
    files = {**write_bad_files(tmp_path / "bad"), **write_hostile_headers(tmp_path / "hostile")}
    missing = tmp_path / "not-there.pcap"
    for path in [*files.values(), missing, Path("/dev/null"), tmp_path]:
        for window in (32 << 20, 1, 100):
            check_windows([str(path)], window)
        if path.is_file():
            for split in (1, 500, 1 << 30):
                check_ranges(str(path), split)
    st = CaptureStats()
    list(segment_windows([str(p) for p in files.values()], st))
    assert st.files[str(files["text"])]["error"]
    assert st.files[str(files["truncated_record"])]["problems"]
    assert st.files[str(files["pcapng_bad_tsresol"])]["problems"]


def _conns(k: int = 3, n: int = 12) -> list[Conn]:
    return [
        Conn(
            client=(f"10.0.0.{10 + i}", 50000 + i),
            msgs=[
                Msg("c2s" if j % 2 else "s2c", encode("DCP_NOOP", opaque=0x1000 * i + j, response=j % 2 == 0) * (1 + j % 5))
                for j in range(n)
            ],
        )
        for i in range(k)
    ]


OPTIONS = [
    {"linktype": lt, "fmt": fmt, "ipv6": v6} for lt, fmt, v6 in itertools.product(sorted(LINKTYPES), ("pcap", "pcapng"), (False, True))
] + [
    {"snaplen": 60},
    {"snaplen": 90, "fmt": "pcapng", "ipv6": True},
    {"snaplen": 45, "linktype": "ether-vlan"},
    {"nanosecond": True},
    {"nanosecond": True, "fmt": "pcapng", "big_endian": True},
    {"big_endian": True, "linktype": "null"},
    {"fmt": "pcapng", "extra_interfaces": 4, "non_tcp": 6},
    {"fmt": "pcapng", "extra_interfaces": 5, "non_tcp": 3, "ipv6": True, "big_endian": True},
    {"non_tcp": 8, "mss": 7},
    {"drop": [2], "reorder": [4], "duplicate": [5], "overlap_conflict": [6]},
    {"start_offset": 30, "fmt": "pcapng"},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_write_capture_options(tmp_path: Path, options: dict[str, object]) -> None:
    path = tmp_path / "x.cap"
    opts = dict(options)
    write_capture(path, _conns(), mss=opts.pop("mss", 100), **opts)
    for window in (32 << 20, 1, 333):
        check_windows([str(path)], window)
    for split in (1, 777):
        check_ranges(str(path), split)


def test_window_per_record_and_data_kept(tmp_path: Path) -> None:
    path = tmp_path / "x.pcap"
    w = write_capture(path, _conns(2, 4))
    st = CaptureStats()
    windows = list(segment_windows([str(path)], st, window=1))
    assert len(windows) == w.packets == st.packets  # a record larger than the window is a window of its own
    assert all(w.mapped for w in windows)
    assert windows[-1].end == path.stat().st_size
    big = list(segment_windows([str(path)], CaptureStats()))
    assert len(big) == 1
    assert [w.end for w in windows] == sorted(w.end for w in windows)


def _windows_of(paths: list[str], window: int, st: CaptureStats) -> list[SegmentWindow]:
    return list(segment_windows(paths, st, window=window))


def test_not_mappable_file_reads_per_packet(tmp_path: Path) -> None:
    """A pipe cannot be mapped: the per-packet reader, payloads copied per window, the same segments and stats."""
    src = tmp_path / "x.pcap"  # pcapng is read with a seek, which a pipe refuses
    write_capture(src, _conns(), mss=50)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with fifo.open("wb") as f:
            f.write(src.read_bytes())

    def through_pipe(read: Callable[[CaptureStats], list[Any]]) -> tuple[list[Any], CaptureStats]:
        t = threading.Thread(target=feed)
        t.start()
        st = CaptureStats()
        got = read(st)
        t.join()
        return got, st

    expected, ref = through_pipe(lambda st: list(capture_segments([str(fifo)], st)))
    assert ref.packets > 20
    counts = []
    for window in (1 << 20, 300):
        windows, got = through_pipe(functools.partial(_windows_of, [str(fifo)], window))
        assert windows and not any(w.mapped for w in windows)
        assert all(isinstance(w.data, bytes) for w in windows)
        assert_same_segments(expected, rebuilt(windows))
        assert (got.files, got.packets, got.skipped) == (ref.files, ref.packets, ref.skipped)
        counts.append(len(windows))
    assert counts[1] > counts[0]  # windows cut by bytes


# --------------------------------------------------------------------------- Hypothesis: packets and files

LINK_TYPES = (0, 1, 12, 14, 101, 108, 113, 228, 229, 276, 147)
ADDRS4 = [bytes([10, 0, 0, i]) for i in range(4)]
ADDRS6 = [bytes(15) + bytes([i]) for i in range(3)] + [bytes.fromhex("fd000000000000000000ffff0a000001")]


@st.composite
def tcp_header(draw: st.DrawFn) -> bytes:
    doff = draw(st.sampled_from([5, 5, 5, 6, 8, 15, 0, 3]))
    head = struct.pack(
        ">HHIIBBHHH",
        draw(st.sampled_from([11210, 50000, 0, 65535])),
        draw(st.integers(0, 65535)),
        draw(st.integers(0, 2**32 - 1)),
        0,
        doff << 4 | draw(st.integers(0, 15)),
        draw(st.integers(0, 255)),
        65535,
        0,
        0,
    )
    return head + draw(st.binary(min_size=0, max_size=40)) + draw(st.binary(min_size=0, max_size=60))


@st.composite
def ip_packet(draw: st.DrawFn) -> tuple[int, bytes]:
    """(ether type, IP packet) - mostly plausible, sometimes not."""
    upper = draw(tcp_header())
    kind = draw(st.sampled_from(["v4", "v4", "v6", "v6", "other"]))
    if kind == "other":
        return draw(st.sampled_from([0x0806, 0x0800, 0x86DD, 0x1234])), draw(st.binary(max_size=80))
    if kind == "v4":
        ihl = draw(st.sampled_from([5, 5, 6, 15, 0, 4]))
        proto = draw(st.sampled_from([6, 6, 6, 17, 1]))
        frag = draw(st.sampled_from([0, 0x4000, 0x2000, 0x0001, 0x8000]))
        opts = draw(st.binary(min_size=max(0, ihl * 4 - 20), max_size=max(0, ihl * 4 - 20)))
        total = draw(st.sampled_from([20 + len(opts) + len(upper), 0, draw(st.integers(0, 200))]))
        src, dst = draw(st.sampled_from(ADDRS4)), draw(st.one_of(st.sampled_from(ADDRS4), st.binary(min_size=4, max_size=4)))
        hdr = struct.pack(">BBHHHBBH4s4s", 0x40 | ihl, 0, total, 1, frag, 64, proto, 0, src, dst)
        return 0x0800, hdr + opts + upper
    nxt = draw(st.sampled_from([6, 6, 6, 17, 0, 43, 44, 60, 51]))
    ext = b""
    if nxt in (0, 43, 60, 51, 44):
        ext = bytes([6, draw(st.integers(0, 3))]) + draw(st.binary(min_size=6, max_size=30))
    body = ext + upper
    plen = draw(st.sampled_from([len(body), 0, draw(st.integers(0, 200))]))
    src, dst = draw(st.sampled_from(ADDRS6)), draw(st.one_of(st.sampled_from(ADDRS6), st.binary(min_size=16, max_size=16)))
    return 0x86DD, struct.pack(">IHBB16s16s", 0x60000000, plen, nxt, 64, src, dst) + body


@st.composite
def link_packet(draw: st.DrawFn, linktype: int) -> bytes:
    """A packet of ``linktype``: link header, then an IP packet (or random bytes)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=60))
    etype, ip = draw(ip_packet())
    if linktype == 1:
        tags = b"".join(
            struct.pack(">HH", draw(st.sampled_from([0x8100, 0x88A8, 0x9100])), draw(st.integers(0, 4095)))
            for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3])))
        )
        return bytes(12) + tags + struct.pack(">H", etype) + ip
    if linktype == 113:
        return bytes(14) + struct.pack(">H", etype) + ip
    if linktype == 276:
        return struct.pack(">H", etype) + bytes(18) + ip
    if linktype in (0, 108):
        family = draw(st.one_of(st.sampled_from([2, 10, 24, 28, 30, 7] if etype == 0x86DD else [2, 2, 17]), st.integers(0, 2**32 - 1)))
        order = ">" if linktype == 108 or draw(st.booleans()) else "<"
        return struct.pack(order + "I", family) + ip
    return ip  # raw, or a link type nobody reads


def _pcap(records: list[tuple[bytes, int]], linktype: int, endian: str, nano: bool, snaplen: int) -> bytes:
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)]
    for n, (data, wirelen) in enumerate(records):
        out.append(struct.pack(endian + "IIII", 1_700_000_000 + n, n * 7, len(data), wirelen) + data)
    return b"".join(out)


def _block(endian: str, btype: int, body: bytes) -> bytes:
    body += bytes(-len(body) % 4)
    return struct.pack(endian + "II", btype, len(body) + 12) + body + struct.pack(endian + "I", len(body) + 12)


def _pcapng(draw: st.DrawFn, linktypes: list[int], packets: list[tuple[int, bytes, int]], endian: str) -> bytes:
    out = [_block(endian, 0x0A0D0D0A, struct.pack(endian + "IHHq", 0x1A2B3C4D, 1, 0, -1))]
    for lt in linktypes:
        tsresol = draw(st.sampled_from([None, 9, 3, 0x80 | 20, 0x80 | 40, 12, 0]))
        opts = b"" if tsresol is None else struct.pack(endian + "HHB3xHH", 9, 1, tsresol, 0, 0)
        out.append(_block(endian, 1, struct.pack(endian + "HHI", lt, 0, draw(st.sampled_from([0, 65535, 50]))) + opts))
    for iface, data, wirelen in packets:
        ticks = draw(st.sampled_from([1_700_000_000_000_000, 1_700_000_000_000_000_000, 2**64 - 1, 0, 2**40]))
        kind = draw(st.sampled_from(["epb", "epb", "epb", "spb", "opb"]))
        if kind == "epb":
            out.append(_block(endian, 6, struct.pack(endian + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF, len(data), wirelen) + data))
        elif kind == "opb":
            out.append(
                _block(endian, 2, struct.pack(endian + "HHIIII", iface, 0, ticks >> 32, ticks & 0xFFFFFFFF, len(data), wirelen) + data)
            )
        else:
            out.append(_block(endian, 3, struct.pack(endian + "I", wirelen) + data))
    return b"".join(out)


@st.composite
def capture_file(draw: st.DrawFn) -> bytes:
    """A pcap or pcapng file of generated packets: cut by a snaplen, lengths lied about, the file damaged."""
    fmt = draw(st.sampled_from(["pcap", "pcapng"]))
    endian = draw(st.sampled_from("<>"))
    linktypes = draw(st.lists(st.sampled_from(LINK_TYPES), min_size=1, max_size=1 if fmt == "pcap" else 3))
    records: list[tuple[int, bytes, int]] = []
    for _ in range(draw(st.integers(0, 12))):
        iface = draw(st.integers(0, len(linktypes) - 1))
        data = draw(link_packet(linktypes[iface]))
        caplen = draw(st.sampled_from([len(data), len(data), draw(st.integers(0, len(data)))]))
        wirelen = draw(st.sampled_from([len(data), 0, draw(st.integers(0, 300))]))
        records.append((iface, data[:caplen], wirelen))
    if fmt == "pcap":
        raw = _pcap([(d, w) for _, d, w in records], linktypes[0], endian, draw(st.booleans()), draw(st.sampled_from([65535, 0, 40])))
    else:
        raw = _pcapng(draw, linktypes, records, endian)
    damage = draw(st.sampled_from(["none", "none", "cut", "flip"]))
    if damage == "cut" and raw:
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif damage == "flip" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    return raw


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=capture_file(), window=st.integers(1, 400), split=st.integers(1, 400))
def test_generated_files(tmp_path: Path, raw: bytes, window: int, split: int) -> None:
    path = tmp_path / "gen.cap"
    path.write_bytes(raw)
    check_windows([str(path)], window)
    check_windows([str(path)])
    check_ranges(str(path), split)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(linktype=st.sampled_from(LINK_TYPES), data=st.data())
def test_generated_packets_many_per_window(tmp_path: Path, linktype: int, data: st.DataObject) -> None:
    """Many generated packets in one file (batches of the header parse hold packets of every kind)."""
    packets = data.draw(st.lists(link_packet(linktype), min_size=1, max_size=60))
    path = tmp_path / "many.pcap"
    path.write_bytes(_pcap([(p, len(p)) for p in packets], linktype, "<", False, 65535))
    check_windows([str(path)])


TCP = struct.pack(">HHIIBBHHH", 50000, 11210, 2**32 - 5, 7, 5 << 4, 0x18, 65535, 0, 0) + b"payload!"
TCP_OPTIONS = struct.pack(">HHIIBBHHH", 11210, 50001, 99, 7, 8 << 4, 0x10, 65535, 0, 0) + bytes(12) + b"data"


def _ipv4(tcp: bytes, ihl: int = 5, frag: int = 0x4000, proto: int = 6, version: int = 4) -> bytes:
    opts = bytes(ihl * 4 - 20)
    return (
        struct.pack(">BBHHHBBH4s4s", version << 4 | ihl, 0, 20 + len(opts) + len(tcp), 1, frag, 64, proto, 0, ADDRS4[1], ADDRS4[2])
        + opts
        + tcp
    )


def _ipv6(tcp: bytes, ext: bool = False) -> bytes:
    body = (bytes([6, 0]) + bytes(6) if ext else b"") + tcp
    return struct.pack(">IHBB16s16s", 0x60000000, len(body), 0 if ext else 6, 64, ADDRS6[0], ADDRS6[3]) + body


IP_PACKETS = [
    (0x0800, _ipv4(TCP)),
    (0x0800, _ipv4(TCP_OPTIONS, 7)),
    (0x86DD, _ipv6(TCP)),
    (0x86DD, _ipv6(TCP_OPTIONS, ext=True)),
    (0x0800, _ipv4(TCP, frag=0x2000)),  # a first fragment
    (0x0800, _ipv4(TCP, frag=0x0001)),
    (0x0800, _ipv4(TCP, proto=17)),
    (0x0800, _ipv4(TCP, version=7)),  # raw links read the version
    (0x0806, _ipv4(TCP)),
]


def _framed(linktype: int, etype: int, ip: bytes) -> list[bytes]:
    """``ip`` behind every link header ``linktype`` can give it."""
    if linktype == 1:
        return [bytes(12) + struct.pack(">HH", 0x8100, 5) * tags + struct.pack(">H", etype) + ip for tags in range(4)]
    if linktype == 113:
        return [bytes(14) + struct.pack(">H", etype) + ip]
    if linktype == 276:
        return [struct.pack(">H", etype) + bytes(18) + ip]
    if linktype in (0, 108):
        families = (2, 0, 1, 3, 0x10000, 0x0200_0000) if etype == 0x0800 else (10, 24, 28, 30, 11, 0x1C00_0000, 0x1E00_0000)
        return [struct.pack(order + "I", f) + ip for f in families for order in "<>"]
    return [ip]


@pytest.mark.parametrize("linktype", LINK_TYPES)
def test_every_cut_of_every_packet(tmp_path: Path, linktype: int) -> None:
    """Each well-formed packet cut at every length (a snaplen anywhere in its headers), with the original length kept or lost."""
    records = []
    for etype, ip in IP_PACKETS:
        for packet in _framed(linktype, etype, ip):
            for cut in range(len(packet) + 1):
                records += [(packet[:cut], len(packet)), (packet[:cut], cut)]
    path = tmp_path / "cuts.pcap"
    path.write_bytes(_pcap(records, linktype, "<", True, 0))
    for window in (32 << 20, 100):
        windows = check_windows([str(path)], window)
    segments = sum(len(w.number) for w in windows)
    assert segments > len(IP_PACKETS) if linktype != 147 else segments == 0


TSRESOLS = [None, 0, 3, 6, 9, 10, 12, 19, 30, 127, 0x80, 0x80 | 20, 0x80 | 33, 0x80 | 63, 0x80 | 64, 0xFF]
TICKS = [
    0,
    1,
    999,
    1_700_000_000_123_456,
    1_700_000_000_123_456_789,
    2**63 - 1,
    2**63,
    2**64 - 1,
    9_223_372_036_854_775,
    9_223_372_036_854_776,
]


@pytest.mark.parametrize("endian", "<>")
def test_pcapng_times_at_every_resolution(tmp_path: Path, endian: str) -> None:
    """Interfaces at every kind of if_tsresol, packets at times in and out of range: the same times, the same one problem."""
    out = [_block(endian, 0x0A0D0D0A, struct.pack(endian + "IHHq", 0x1A2B3C4D, 1, 0, -1))]
    for r in TSRESOLS:
        opts = b"" if r is None else struct.pack(endian + "HHB3xHH", 9, 1, r, 0, 0)
        out.append(_block(endian, 1, struct.pack(endian + "HHI", 101, 0, 0) + opts))
    packet = _ipv4(TCP)
    for ticks in TICKS:
        for iface in range(len(TSRESOLS)):
            out.append(
                _block(endian, 6, struct.pack(endian + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF, len(packet), len(packet)) + packet)
            )
    path = tmp_path / "times.pcapng"
    path.write_bytes(b"".join(out))
    for window in (32 << 20, 1000):
        check_windows([str(path)], window)
    check_ranges(str(path), 3000)
    st = CaptureStats()
    list(segment_windows([str(path)], st))
    assert any("timestamp out of range" in p for p in st.files[str(path)]["problems"])


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("big_endian", [False, True])
def test_every_cut_and_flip_of_a_file(tmp_path: Path, fmt: str, big_endian: bool) -> None:
    """A small capture cut at every byte, and with every byte flipped: the same packets, problems and errors."""
    conn = Conn(
        msgs=[Msg("c2s", encode("DCP_NOOP", opaque=1)), Msg("s2c", encode("DCP_NOOP", opaque=1, response=True))],
        handshake=False,
        close=None,
    )
    good = write_capture(tmp_path / "good", [conn], fmt=fmt, big_endian=big_endian, mss=20, non_tcp=1).path.read_bytes()
    path = tmp_path / "x"
    variants = [good[:cut] for cut in range(len(good))]
    variants += [good[:at] + bytes([good[at] ^ flip]) + good[at + 1 :] for at in range(len(good)) for flip in (0x01, 0xF0)]
    for raw in variants:
        path.write_bytes(raw)
        check_windows([str(path)], 128)
    for raw in variants[::7]:
        path.write_bytes(raw)
        check_ranges(str(path), 100)


def test_pcapng_blocks_of_every_kind(tmp_path: Path) -> None:
    """Sections in both byte orders, simple and obsolete packet blocks, unknown and short blocks, each kind of bad block."""
    packet = bytes(12) + b"\x08\x00" + _ipv4(TCP)

    def section(e: str) -> bytes:
        return _block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1)) + _block(e, 1, struct.pack(e + "HHI", 1, 0, 40))

    def epb(e: str, iface: int = 0, caplen: int | None = None) -> bytes:
        return _block(e, 6, struct.pack(e + "IIIII", iface, 1, 2, len(packet) if caplen is None else caplen, len(packet)) + packet)

    good = section("<") + epb("<") + _block("<", 3, struct.pack("<I", len(packet)) + packet) + _block("<", 99, b"x" * 9)
    good += _block("<", 6, bytes(16)) + _block("<", 2, struct.pack("<HHIIII", 0, 0, 1, 2, len(packet), len(packet)) + packet)
    good += section("<")[:28] + _block("<", 3, struct.pack("<I", len(packet)) + packet)  # a section with no interface yet
    good += section(">") + epb(">") + epb(">") + _block(">", 3, b"")
    bad_trailer = epb("<")[:-4] + struct.pack("<I", 999)
    tails = [
        b"",
        epb("<", iface=1),
        epb("<", caplen=len(packet) + 4),
        bad_trailer,
        _block("<", 6, bytes(20))[:-1],
        struct.pack("<II", 6, 13) + bytes(8),
        struct.pack("<II", 6, 8),
        b"\x0a\x0d\x0d\x0a\x00\x00\x00\x00\xff\xff\xff\xff",
        b"\x0a\x0d\x0d\x0a\x1c",
        section(">")[:30],
        struct.pack("<II", 6, 1 << 30),
    ]
    path = tmp_path / "blocks.pcapng"
    for tail in tails:
        path.write_bytes(good + tail + epb("<"))
        for window in (32 << 20, 1, 150):
            check_windows([str(path)], window)
        check_ranges(str(path), 100)


def test_range_of_nothing_and_of_a_bad_header(tmp_path: Path) -> None:
    """A range of no bytes is an empty file; a range holding a broken header raises as read_range does."""
    with pytest.raises(CaptureError, match="empty file"):
        range_window(str(tmp_path / "x"), 0, b"", CaptureRange(0, 0, 1, b""), Counter())
    with pytest.raises(CaptureError, match="pcap global header truncated"):
        range_window(str(tmp_path / "x"), 0, b"\xd4\xc3\xb2\xa1\x02\x00", CaptureRange(0, 6, 1, b""), Counter())
