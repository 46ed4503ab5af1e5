"""``dcpinspect compare``: two connections of one shipped capture, two shipped captures, ``--json``, and its errors."""

from __future__ import annotations

import json

import pytest
from clirun import run
from paths import CAPTURES

COLLECTIONS = str(CAPTURES / "live-collections.pcap")
PURGE = str(CAPTURES / "live-purge-rollback.pcap")
PLAIN = str(CAPTURES / "live-plain.pcap")
RETRY = str(CAPTURES / "live-rollback-retry.pcap")


def test_two_connections_of_one_capture_the_filter() -> None:
    """live-collections: conn 1 streams collection 8 only; conn 2 (later, unfiltered) has the default collection and hotels."""
    code, out = run("compare", COLLECTIONS, "--a", "1", "--b", "2", "--vbucket", "0")
    assert code == 0
    assert out.startswith(f"a: {COLLECTIONS} conn 1 ('live-collections-filtered')\nb: {COLLECTIONS} conn 2 ('live-collections-all')\n")
    assert "vbucket 0: a 6 items, b 9 items, 2 in common; 4 only in a, 7 only in b" in out
    assert "only in b: seqnos 1-3 (3 items: doc-0001, doc-0003, doc-0004) - filter: a's stream request filtered on collections 0x8" in out
    assert "only in b: seqnos 9-12 (3 items: hotel-001, hotel-003, hotel-late-000) - filter" in out
    # the airlines documents: conn 2 streamed after the collection was dropped; the frames do not say so
    assert "only in a: seqnos 5-11 (4 items: airline-000, airline-002, airline-005, airline-late-001) - unknown: not explained" in out
    assert "\n== per vbucket\n" in out and "\n== differences\n" in out
    assert "vbucket 1" not in out


def test_names_pick_the_consumers_and_json() -> None:
    code, out = run("compare", PURGE, "--a", "live-purge-first", "--b", "live-purge-resume", "--json")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0] == {"consumers": {"a": f"{PURGE} conn 1 ('live-purge-first')", "b": f"{PURGE} conn 2 ('live-purge-resume')"}}
    (vb,) = [line for line in lines if "per_vbucket" in line]
    assert vb["vbucket"] == 0 and {k: vb["per_vbucket"][k] for k in ("items_a", "items_b", "common", "only_a", "only_b")} == {
        "items_a": 10,
        "items_b": 15,
        "common": 10,
        "only_a": 0,
        "only_b": 5,
    }
    (diff,) = [line["difference"] for line in lines if "difference" in line]
    assert (diff["only_in"], diff["seqno_from"], diff["seqno_to"], diff["reason"]) == ("b", 16, 20, "ended")
    assert diff["keys"] == [f"later-{i}" for i in range(5)] and diff["evidence_a"] == [36]
    assert diff["explanation"] == "a's stream reached seqno 10 and ended OK (frame 36)"
    # one capture with exactly two consumer names: those two, in connection order
    assert run("compare", PURGE, "--json")[1] == out


def test_two_captures_of_unrelated_histories() -> None:
    code, out = run("compare", PLAIN, RETRY, "--vbucket", "0", "--json")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    (vb,) = [line["per_vbucket"] for line in lines if "per_vbucket" in line]
    assert vb["diverge_at"] == 0 and vb["common"] == 0 and vb["branches_a"] != vb["branches_b"]
    reasons = [
        (d["only_in"], d["seqno_from"], d["seqno_to"], d["reason"]) for d in (line["difference"] for line in lines if "difference" in line)
    ]
    assert reasons == [("a", 1, 7, "branch"), ("b", 1, 7, "branch"), ("b", 8, 12, "ended")]


def test_a_capture_against_itself() -> None:
    code, out = run("compare", PLAIN, PLAIN)
    assert code == 0 and out.count("the same items") == 4 and "only in a:" not in out and "only in b:" not in out
    assert out.endswith("== differences\n  (none)\n")


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        ((COLLECTIONS, "--a", "7", "--b", "2"), 2, "dcpinspect: error: no connection 7 (connections: 1, 2)\n"),
        (
            (COLLECTIONS, "--a", "nobody", "--b", "2"),
            2,
            "dcpinspect: error: no consumer named 'nobody' (DCP_OPEN names: 'live-collections-all', 'live-collections-filtered')\n",
        ),
        ((PLAIN,), 2, "dcpinspect: error: one capture with 1 consumer name: name the two to compare (consumers: conn 1 'live-plain')\n"),
        ((PLAIN, "--a", "1"), 2, "dcpinspect: error: one capture: pick both consumers with --a and --b"),
        (("no-such.pcap", PLAIN), 1, "dcpinspect: error: no-such.pcap: cannot open"),
    ],
)
def test_errors_are_one_line(argv: tuple[str, ...], code: int, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("compare", *argv)[0] == code
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
