"""The vectorised twin of every typed rule agrees with the rule's own scalar ``violated``, row by row."""

from __future__ import annotations

import typing

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpinspect.protocol.fields import ContextIs, Exclusive, NonZero, OnlyWith, Order, Requires, Rule, Zero
from dcpinspect.tables.frames_vector import VECTOR_RULES

BITS = st.sampled_from([1 << i for i in range(10)])
RULES = st.one_of(
    st.builds(Zero, st.just("a"), st.just("")),
    st.builds(NonZero, st.just("a"), st.just("")),
    st.builds(Order, st.just("a"), st.just("b"), st.just("")),
    st.builds(Exclusive, st.just("a"), BITS, BITS, st.just("")),
    st.builds(Requires, st.just("a"), BITS, BITS, st.just("")),
    st.builds(OnlyWith, st.just("a"), BITS, st.tuples(BITS, BITS).map(lambda t: t[0] | t[1]), st.just("")),
)
DTYPE = np.dtype([("a", "u4"), ("b", "u8")])


def test_every_rule_but_the_context_has_a_vectorised_twin() -> None:
    assert set(VECTOR_RULES) == set(typing.get_args(Rule)) - {ContextIs}  # context rules are settled per group of frames


@settings(max_examples=300, deadline=None)
@given(
    rule=RULES,
    rows=st.lists(
        st.tuples(st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 0x100, 0x111]), st.integers(0, 2**64 - 1)), min_size=1, max_size=20
    ),
)
def test_vectorised_rules_agree_with_the_scalar_ones(rule: Rule, rows: list[tuple[int, int]]) -> None:
    ext = np.array(rows, DTYPE)
    got = VECTOR_RULES[type(rule)](rule, ext)
    want = [rule.violated({"a": a, "b": b}) for a, b in rows]
    assert got.tolist() == want
