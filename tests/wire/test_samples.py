"""The shipped sample captures: reproducible byte for byte, and they hold what captures/README.md says."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from paths import CAPTURES
from tshark import needs_tshark, tshark_frames

from dcpinspect import dissect
from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import CaptureStats


def _make_samples() -> object:
    spec = importlib.util.spec_from_file_location("make_samples", CAPTURES / "make_samples.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_samples_regenerate_identically(tmp_path: Path) -> None:
    mod = _make_samples()
    shutil.copy(CAPTURES / "make_samples.py", tmp_path / "make_samples.py")
    mod.HERE = tmp_path  # type: ignore[attr-defined]
    mod.main()  # type: ignore[attr-defined]
    for name in ("seed-000-rollback-retry.bin", "seed-000-rollback-retry.pcap", "dcp-session.pcap", "messy.pcap", "session-broken.pcap"):
        assert (tmp_path / name).read_bytes() == (CAPTURES / name).read_bytes(), f"{name} is stale: run python captures/make_samples.py"


def read(name: str) -> tuple[list[object], CaptureStats]:
    st = CaptureStats()
    return list(read_records([str(CAPTURES / name)], stats=st)), st


def test_session_sample() -> None:
    recs, st = read("dcp-session.pcap")
    assert all(r.event.type == "frame" for r in recs)  # type: ignore[attr-defined]
    ds = [dissect(r.event, r.context) for r in recs]  # type: ignore[attr-defined]
    assert all(d.problems == [] for d in ds)
    state = st.states[1]
    assert 0x12 in state.features and state.open_flags == 0x21 and state.bucket == "travel-sample"
    muts = [d for d in ds if d.name == "DCP_MUTATION"]
    assert [(d.cid, d.key_text) for d in muts] == [(8, "airline_10"), (8, "airline_137")]
    assert next(d for d in ds if d.name == "DCP_DELETION").key_text == "airline_24"  # a key once per snapshot
    dele = next(d for d in ds if d.name == "DCP_DELETION")
    assert dele.variant == "v2" and dele.cid == 8
    auth = next(d for d in ds if d.name == "SASL_AUTH" and d.role == "request")
    assert "password" not in str([f.value for f in auth.fields])


def test_messy_sample() -> None:
    recs, st = read("messy.pcap")
    kinds = [r.event.type for r in recs]  # type: ignore[attr-defined]
    assert kinds.count("gap") == 1 and "garbage" in kinds and "truncated" in kinds
    conns = {c.id: c for c in st.connections}
    assert conns[1].lost == 1000 and conns[2].role_source == "port" and conns[4].tls
    assert st.skipped["not memcached-binary TCP"] > 0  # the HTTP connection


def test_seed_000_sample_matches_the_seed() -> None:
    recs, _ = read("seed-000-rollback-retry.pcap")
    ds = [dissect(r.event, r.context) for r in recs]  # type: ignore[attr-defined]
    assert [(d.name, d.role, d.variant) for d in ds] == [
        ("DCP_STREAM_REQ", "request", ""),
        ("DCP_STREAM_REQ", "response", "rollback"),
        ("DCP_STREAM_REQ", "request", ""),
        ("DCP_STREAM_REQ", "response", "success"),
    ]
    assert [r.direction for r in recs] == ["c2s", "s2c", "c2s", "s2c"]  # type: ignore[attr-defined]


@needs_tshark
def test_tshark_reads_the_samples() -> None:
    assert len(tshark_frames(CAPTURES / "dcp-session.pcap")) == 25
    assert len(tshark_frames(CAPTURES / "seed-000-rollback-retry.pcap")) == 4


@needs_tshark
@pytest.mark.parametrize("name", ["dcp-session.pcap", "seed-000-rollback-retry.pcap"])
def test_tshark_agrees_on_the_samples(name: str) -> None:
    from tshark import opaque_value

    theirs = tshark_frames(CAPTURES / name)
    recs, _ = read(name)
    mine = sorted((r for r in recs if r.event.type == "frame"), key=lambda r: (r.packet, r.event.offset))  # type: ignore[attr-defined]
    assert len(theirs) == len(mine)
    for p, r in zip(theirs, mine, strict=True):
        fr = r.event  # type: ignore[attr-defined]
        assert int(p["couchbase.opcode"], 16) == fr.opcode
        assert opaque_value(p["couchbase.opaque"]) == fr.opaque
        assert int(p["couchbase.total_bodylength"]) == fr.body_length
        if fr.is_response:
            assert int(p["couchbase.status"], 16) == fr.status
        d = dissect(fr, r.context)  # type: ignore[attr-defined]
        if d.key and d.cid is None and fr.opcode not in (0x21, 0x22):  # tshark shows SASL and cid-prefixed keys its own way
            assert p["couchbase.key"] == d.key_text
