"""The table's ``when`` and ``checks``, typed: conditions and rules, and the one variant choice everybody uses."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import ALL_VARIANTS, UPR_VARIANTS, mcbp_case, variant_id

from dcpinspect import DissectContext, Frame, decode, dissect, encode
from dcpinspect.protocol.fields import (
    ContextIs,
    Exclusive,
    ExtrasLength,
    FieldIs,
    NonZero,
    OnlyWith,
    Order,
    Requires,
    StatusIs,
    ValueLength,
    Variant,
    Zero,
)
from dcpinspect.wire.dissect import GENERIC, select_variant

RULE_CLASSES = {
    "zero": Zero,
    "nonzero": NonZero,
    "order": Order,
    "exclusive": Exclusive,
    "requires": Requires,
    "cache_transfer_only_with": OnlyWith,
    "context": ContextIs,
}
EVERY_VARIANT = [v for _, _, v in ALL_VARIANTS] + [v for _, v in UPR_VARIANTS]


def test_every_check_is_a_typed_rule() -> None:
    for v in EVERY_VARIANT:
        assert len(v.rules) == len(v.checks)
        for check, rule in zip(v.checks, v.rules, strict=True):
            assert type(rule) is RULE_CLASSES[str(check[0])], (v.name, check)
            assert rule.message == check[-1]
            assert rule.field == (None if isinstance(rule, ContextIs) else check[1])
        # each rule is checked exactly once: with the extras (zero / non-zero on an extras field) or after the value
        screened = [r for _, _, r in v.extras_screen]
        assert sorted(map(id, screened + list(v.value_rules))) == sorted(map(id, v.rules))


def test_every_when_is_a_typed_condition() -> None:
    kinds = {"extlen": ExtrasLength, "status": StatusIs, "vlen": ValueLength}
    for v in EVERY_VARIANT:
        assert len(v.conditions) == len(v.when)
        for (attr, want), c in zip(v.when, v.conditions, strict=True):
            if attr in kinds:
                assert type(c) is kinds[attr] and want in (getattr(c, "length", None), getattr(c, "status", None))
            else:
                assert c == FieldIs(attr, want)
        assert dict(v.selector_values) == {a: w for a, w in v.when if a not in kinds}


def test_unknown_check_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown check"):
        Variant(checks=(("shiny", "flags", "no such rule"),))


@settings(max_examples=200, deadline=None)
@given(value=st.integers(0, 2**64 - 1))
def test_the_extras_screen_is_the_rules_own_test(value: int) -> None:
    for v in EVERY_VARIANT:
        for i, must_be_zero, rule in v.extras_screen:
            assert v.extras_names[i] == rule.field and must_be_zero is rule.must_be_zero
            assert ((value != 0) is must_be_zero) == rule.violated({rule.field: value})


@settings(max_examples=300, deadline=None)
@given(
    a=st.integers(0, 2**32 - 1),
    b=st.integers(0, 2**32 - 1),
    bit=st.sampled_from([1 << i for i in range(12)]),
    other=st.sampled_from([1 << i for i in range(12)]),
)
def test_rules_scalar(a: int, b: int, bit: int, other: int) -> None:
    values: dict[str, Any] = {"x": a, "y": b}
    assert Zero("x", "").violated(values) == (a != 0)
    assert NonZero("x", "").violated(values) == (a == 0)
    assert Order("x", "y", "").violated(values) == (a > b)
    assert Exclusive("x", bit, other, "").violated(values) == bool(a & bit and a & other)
    assert Requires("x", bit, other, "").violated(values) == bool(a & bit and not a & other)
    assert OnlyWith("x", bit, bit | other, "").violated(values) == bool(a & bit and a & ~(bit | other))
    # a field that is absent, or not an integer, breaks nothing
    for rule in (Zero("z", ""), NonZero("z", ""), Order("x", "z", ""), Exclusive("z", 1, 2, ""), Requires("s", 1, 2, "")):
        assert not rule.violated({**values, "s": "text"})


def test_context_rule_guesses_nothing() -> None:
    rule = ContextIs("delete_times", True, "")
    assert rule.violated({}, DissectContext(delete_times=False))
    assert not rule.violated({}, DissectContext(delete_times=True))
    assert not rule.violated({}, DissectContext())  # unknown
    assert not rule.violated({}, None)


@pytest.mark.parametrize(("cmd", "response", "v"), [pytest.param(*t, id=variant_id(*t)) for t in ALL_VARIANTS])
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_encoder_and_dissector_choose_the_same_variant(cmd: Any, response: bool, v: Variant, data: st.DataObject) -> None:
    """``select_variant`` on the fields the encoder was given, and on the bytes it built, agree."""
    case = data.draw(mcbp_case(cmd, response, v), label="case")
    status = case.kwargs.get("status", 0) if response else None
    variants = cmd.response if response else cmd.request
    by_fields = select_variant(variants, case.extras, status)
    (frame,) = decode(case.encode())
    assert isinstance(frame, Frame)
    by_bytes = select_variant(variants, frame.extras, status, len(frame.value))
    assert by_fields is v and by_bytes is v
    assert dissect(frame, case.context).variant == v.name


def test_select_variant_cases() -> None:
    from dcpinspect.protocol import spec

    marker = spec.COMMANDS[0x56].request
    assert select_variant(marker, bytes(20)) is marker[0]
    assert select_variant(marker, b"\x02") is marker[2]
    assert select_variant(marker, b"\x07") is None  # a version no variant lists
    assert select_variant(marker, {"version": 2}).name == "v2.2"  # type: ignore[union-attr]
    assert select_variant(marker, None) is marker[0]
    stream_req = spec.COMMANDS[0x53].response
    assert select_variant(stream_req, b"", 0x23).name == "rollback"  # type: ignore[union-attr]
    assert select_variant(stream_req, b"", 0) is stream_req[0]
    assert select_variant(stream_req, b"", 0x07) is None  # an error: no variant, the dissector reads it as one
    assert select_variant((GENERIC,), b"\x01\x02") is GENERIC
    # the dissector and the encoder pick the same variant for extras given as bytes
    raw = encode("DCP_SNAPSHOT_MARKER", extras=b"\x02", value={"start_seqno": 1, "end_seqno": 2})
    assert dissect(decode(raw)[0]).variant == "v2.2"  # type: ignore[arg-type]
