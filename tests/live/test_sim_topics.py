"""The simulator's sync-write facade: prepare, commit and abort write the bucket's history and wake the connections."""

from __future__ import annotations

import pytest

from dcpinspect.live.sim import Simulator


def test_prepare_commit_abort_return_their_seqnos_and_write_the_history() -> None:
    sim = Simulator(vbuckets=1, items=2, seed=1)
    kicks: list[int] = []
    sim.kick = lambda: kicks.append(1)  # type: ignore[method-assign]
    assert sim.prepare("k1", {"n": 1}) == 3
    assert sim.commit("k1") == 4
    assert sim.prepare("k2", {"n": 2}, level=2) == 5
    assert sim.abort("k2") == 6
    log = sim.bucket.vbuckets[0].log
    assert [(r.seqno, r.kind, r.key) for r in log[2:]] == [
        (3, "prepare", b"k1"),
        (4, "commit", b"k1"),
        (5, "prepare", b"k2"),
        (6, "abort", b"k2"),
    ]
    assert log[3].prepared_seqno == 3 and log[5].prepared_seqno == 5
    assert log[4].durability == 2
    assert len(kicks) == 4  # each one wakes the connections


def test_commit_without_a_pending_prepare_is_refused() -> None:
    sim = Simulator(vbuckets=1, items=0, seed=1)
    with pytest.raises(ValueError, match="no pending prepare"):
        sim.commit("nothing")
    sim.prepare("k", {"n": 1})
    sim.commit("k")
    with pytest.raises(ValueError, match="no pending prepare"):
        sim.abort("k")


def test_the_thread_wrapper_forwards_them() -> None:
    with Simulator(vbuckets=1, items=0, seed=1).run_in_thread() as st:
        assert st.prepare("k", {"n": 1}) == 1
        assert st.commit("k") == 2
        assert st.prepare("j") == 3
        assert st.abort("j") == 4
        assert st.call(lambda: st.sim.bucket.vbuckets[0].high_seqno) == 4


def test_create_collection_passes_its_max_ttl_to_the_begin_event() -> None:
    sim = Simulator(vbuckets=1, items=0, seed=1)
    cid = sim.create_collection("hotels", max_ttl=3600)
    event = sim.bucket.vbuckets[0].log[-1]
    assert (event.kind, event.key, event.cid, event.max_ttl) == ("system", b"hotels", cid, 3600)


def test_a_failover_rewinds_the_rev_seqnos_of_the_versions_the_replica_never_had() -> None:
    sim = Simulator(vbuckets=1, items=0, seed=1, nodes=2)
    sim.mutate("cart", {"n": 1})  # rev 1
    sim.mutate("cart", {"n": 2})  # rev 2
    sim.mutate("cart", {"n": 3})  # rev 3, lost below
    sim.mutate("gone", {"n": 1})  # rev 1, lost below
    sim.failover(0, lose=2)
    sim.mutate("cart", {"n": 4})
    sim.mutate("gone", {"n": 2})
    revs = [(r.key, r.rev_seqno) for r in sim.bucket.vbuckets[0].log]
    assert revs == [(b"cart", 1), (b"cart", 2), (b"cart", 3), (b"gone", 1)]  # the promoted replica writes rev 3 again, and gone starts anew
