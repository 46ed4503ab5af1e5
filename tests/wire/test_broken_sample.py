"""``captures/session-broken.pcap``: reproducible byte for byte, and broken exactly where captures/README.md says.

Notebook 02's "find the two broken frames" leans on it: the clean session
with ``airline_10`` delivered twice in one snapshot and a buffer ack beyond
the bytes received; the timeline flags both, and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from paths import CAPTURES
from scripts import load_script

from dcpinspect.capture.read import read_records
from dcpinspect.protocol.rules import flow_control_size
from dcpinspect.timeline import AnomalyKind, build_timeline
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.events import Frame

BROKEN = CAPTURES / "session-broken.pcap"


def _make_samples() -> ModuleType:
    return load_script("captures/make_samples.py")


def test_broken_session_regenerates_identically(tmp_path: Path) -> None:
    mod = _make_samples()
    mod.write(tmp_path / "b.pcap", [(mod.CLIENT, mod.SERVER, mod.broken_session(), {})])
    assert (tmp_path / "b.pcap").read_bytes() == BROKEN.read_bytes(), "session-broken.pcap is stale: run python captures/make_samples.py"


def test_broken_session_differs_from_the_clean_one_only_where_it_is_broken() -> None:
    mod = _make_samples()
    clean, broken = mod.session(), mod.broken_session()
    assert [d for d, _ in clean] == [d for d, _ in broken]
    differ = [i for i, (a, b) in enumerate(zip(clean, broken, strict=True)) if a != b]
    names = [[f.name for f in FrameDecoder().feed(broken[i][1]) if isinstance(f, Frame)] for i in differ]
    assert names == [["DCP_OPEN"], ["DCP_SNAPSHOT_MARKER", "DCP_MUTATION", "DCP_MUTATION", "DCP_DELETION"], ["DCP_BUFFER_ACKNOWLEDGEMENT"]]


def test_the_timeline_flags_the_two_broken_frames_and_nothing_else() -> None:
    records = list(read_records([str(BROKEN)]))
    t = build_timeline(records)
    got = sorted((a.kind, tuple(a.frames), a.uncertain) for a in t.anomalies)
    assert got == sorted([(AnomalyKind.DUPLICATE_KEY, (20, 22), False), (AnomalyKind.ACK_BEYOND_RECEIVED, (23,), False)])
    by_number = {r.number: r for r in records}
    stream = [e for e in (by_number[n].event for n in range(19, 23)) if isinstance(e, Frame)]
    received = sum(flow_control_size(f.magic, f.opcode, f.length) for f in stream)
    mod = _make_samples()
    assert (received, mod.OVER_ACK) == (283, 300)
    clean = build_timeline(read_records([str(CAPTURES / "dcp-session.pcap")]))
    assert clean.anomalies == []
