"""The client against hostile servers always ends: a seeded slice of ``benchmarks/fuzz_client.py``.

Sans-IO runs (the consumer against the producer behind a mutating filter, fake clock) for every
mutation, and a few runs of the real client over TCP on 127.0.0.1 (the tests' loopback node, the hostile
filter on its output, the client's timeouts on a fake clock that moves only while nothing is in flight).
"""

from __future__ import annotations

import asyncio
from types import ModuleType

import pytest
from scripts import load_script


def _fuzz() -> ModuleType:
    return load_script("benchmarks/fuzz_client.py")


fuzz = _fuzz()
CASES = [(seed, kind) for kind in fuzz.MUTATIONS for seed in range(3)]


@pytest.mark.parametrize(("seed", "kind"), CASES, ids=[f"{k}-{s}" for s, k in CASES])
def test_sansio_client_always_ends(seed: int, kind: str) -> None:
    p = fuzz.plan(seed, kind)
    o = fuzz.run_sansio(p)
    assert fuzz.check(p, o) is None, o
    assert o.elapsed < 20 * 1.0


def test_sansio_silence_ends_with_the_response_timeout() -> None:
    for target in range(fuzz.REPLIES - 2):  # a bootstrap reply never comes (the stream requests have their own case)
        o = fuzz.run_sansio(fuzz.Plan(0, target, "silence"))
        assert o.kind == "error" and "within 1 s" in o.message, (target, o)


def test_sansio_huge_scram_iterations_is_refused() -> None:
    o = fuzz.run_sansio(fuzz.Plan(3, 2, "huge_iterations"))
    assert o.kind == "error" and "above the limit" in o.message, o


@pytest.mark.parametrize(
    ("kind", "target", "expect"),
    [
        ("silence", 4, "no reply to SELECT_BUCKET within 2 s"),
        ("huge_iterations", 2, "above the limit 100000"),
        ("close_mid_frame", 1, "server closed the connection"),
        ("garbage", 0, ""),
        ("wrong_opaque", 6, "no reply to OPEN within 2 s"),
        ("truncate", 3, ""),
    ],
)
def test_tcp_client_always_ends_with_the_right_error(kind: str, target: int, expect: str) -> None:
    """The real client over TCP: the run ends, and how (the assertion is on how, not on how long it took).

    The client's timeouts run on a fake clock that moves only while the connection is quiet: the node
    idle, every byte either way read by the other side (``fuzz.advance_when_quiet``).  A reply the plan
    withholds is then the only one that can time out, however long a loaded machine stalls the others,
    so the error names the right request.  Real time only bounds a hang (``run_tcp``'s ``safety``).
    """
    p = fuzz.Plan(11, target, kind)
    o = asyncio.run(fuzz.run_tcp(p, response_timeout=2.0))
    assert fuzz.check(p, o) is None, o
    assert o.kind == "error" and expect in o.message, o
