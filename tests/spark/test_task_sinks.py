"""A task's item sinks (no Java): the numpy running maximum equals :class:`SeqnoRises`, item by item."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpinspect.spark.timelines import _Rises
from dcpinspect.timeline import Item
from dcpinspect.timeline.merge import SeqnoRises

seqnos = st.one_of(st.none(), st.integers(0, 40), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1]))


@settings(max_examples=300, deadline=None)
@given(calls=st.lists(st.tuples(st.integers(0, 2), st.lists(st.lists(seqnos, max_size=12), min_size=1, max_size=3)), max_size=8))
def test_rises_equal_the_pure_ones(calls: list[tuple[int, list[list[int | None]]]]) -> None:
    pure, fast = SeqnoRises(), _Rises()
    key = 0
    for vb, streams in calls:
        batches = []
        for qs in streams:
            batch = []
            for q in qs:
                key += 1 + (q or 0) % 3
                batch.append(Item(key if key % 5 else key + 2**64, 0, 0x57, q, 0))  # keys past int64 too
            batches.append(batch)
        batches = [b for b in batches if b] or [[]]
        pure.add(vb, batches)
        fast.add(vb, batches)
        assert fast.rises == pure.rises
        assert fast.best == pure.best
