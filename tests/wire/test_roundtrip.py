"""Round trip through the protocol table: encode -> decode -> dissect -> encode.

For every variant of every command (and of the UPR draft), a frame built
within the variant's rules must decode to exactly one frame, dissect to the
same variant with the same extras / structured value / key / header fields and
no problems, and re-encode from the dissected values to the identical bytes.
Separately, breaking each rule the table declares must yield a problem that
names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from strategies import (
    ALL_VARIANTS,
    NOT_CHECKED,
    UPR_VARIANTS,
    Case,
    cache_records,
    flatbuffer_values,
    known_bits,
    max_uint,
    mcbp_case,
    selectors,
    upr_case,
    upr_variant_id,
    variant_id,
)

from dcpinspect import DissectContext, Frame, decode, dissect, encode
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import OpenFlag, Status
from dcpinspect.protocol.fields import ENUM, FLAGS, Command, Field, Group, Variant
from dcpinspect.wire.framing import encode_leb128

ROUNDTRIP = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RULES = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def only_frame(raw: bytes, dialect: str = "mcbp") -> Frame:
    events = decode(raw, dialect=dialect)
    assert len(events) == 1, events
    assert isinstance(events[0], Frame), events
    assert (events[0].offset, events[0].raw) == (0, raw)
    return events[0]


def test_variant_names_are_unique_per_role() -> None:
    # encode(variant=...) picks by name: two variants of one role with one name could not both be built
    for cmd in spec.COMMANDS.values():
        for variants in (cmd.request, cmd.response):
            names = [v.name for v in variants]
            assert len(names) == len(set(names)), (cmd.name, names)


def test_checks_name_extras_fields() -> None:
    # the case strategy satisfies checks on extras; a check on another section would need the strategy extended
    for cmd, _, v in ALL_VARIANTS:
        names = {f.name for f in v.extras}
        for check in v.checks:
            if check[0] in ("exclusive", "requires", "cache_transfer_only_with", "zero", "nonzero"):
                assert check[1] in names, (cmd.name, check)
            elif check[0] == "order":
                assert {check[1], check[2]} <= names, (cmd.name, check)


# ---------------------------------------------------------------------------
# 5. round trip of every variant

#: DCP_FLUSH is obsolete: sending it at all is the one problem its frames carry
EXPECTED_PROBLEMS = {cmd.opcode: [cmd.obsolete] for cmd in spec.COMMANDS.values() if cmd.obsolete}


def _roundtrip_params() -> list[Any]:
    return [pytest.param(cmd, response, v, id=variant_id(cmd, response, v)) for cmd, response, v in ALL_VARIANTS]


def reencode(d: Any, fr: Frame) -> bytes:
    """Build the frame again from what the dissection says."""
    variants = spec.COMMANDS[fr.opcode].response if fr.is_response else spec.COMMANDS[fr.opcode].request
    v = next(x for x in variants if x.name == d.variant)
    value: Any
    if isinstance(v.value, tuple) or v.value.startswith("flatbuffers:"):
        value = d.body
    elif v.value in ("json", "json?") and fr.value:
        value = d.document if isinstance(d.document, (dict, list)) else json.dumps(d.document).encode()
    elif v.value in ("text", "text?") and fr.value:
        value = d.document
    else:
        value = fr.value
    return encode(
        fr.opcode,
        response=fr.is_response,
        variant=d.variant,
        status=fr.status or 0,
        extras=d.extras,
        value=value,
        key=d.key,
        vbucket=fr.vbucket or 0,
        opaque=fr.opaque,
        cas=fr.cas,
        datatype=fr.datatype,
    )


def check_case(case: Case) -> Any:
    raw = case.encode()
    fr = only_frame(raw)
    kw = case.kwargs
    assert fr.is_response == case.response
    assert fr.opaque == kw["opaque"]
    assert fr.cas == kw["cas"]
    assert fr.datatype == kw["datatype"]
    if case.response:
        assert fr.status == kw["status"]
    else:
        assert fr.vbucket == kw["vbucket"]
    assert (fr.opcode, fr.framing, fr.key, len(fr.extras)) == (case.opcode, b"", case.key, case.variant.extras_len)
    d = dissect(fr, case.context)
    assert d.name == spec.COMMANDS[case.opcode].name
    assert d.role == ("response" if case.response else "request")
    assert d.variant == case.variant.name
    assert d.extras == case.extras
    assert d.body == case.body
    assert d.key == case.key
    if case.document is not NOT_CHECKED:
        assert d.document == case.document
    assert [p.message for p in d.problems] == EXPECTED_PROBLEMS.get(case.opcode, []), d.problems
    assert reencode(d, fr) == raw
    return d


@pytest.mark.parametrize(("cmd", "response", "v"), _roundtrip_params())
@ROUNDTRIP
@given(data=st.data())
def test_roundtrip(cmd: Command, response: bool, v: Variant, data: st.DataObject) -> None:
    check_case(data.draw(mcbp_case(cmd, response, v), label="case"))


@pytest.mark.parametrize(("op", "v"), [pytest.param(op, v, id=upr_variant_id(op, v)) for op, v in UPR_VARIANTS])
@ROUNDTRIP
@given(data=st.data())
def test_upr_roundtrip(op: int, v: Variant, data: st.DataObject) -> None:
    case = data.draw(upr_case(op, v), label="case")
    raw = case.encode()
    fr = only_frame(raw, "upr")
    assert (fr.dialect, fr.opcode, fr.opaque, fr.body_length) == ("upr", op, case.kwargs["opaque"], len(raw) - 12)
    d = dissect(fr)
    assert d.variant == v.name
    assert d.body == case.body
    expected = ["the UPR draft's mutation has no key length: key/value boundary unspecified"] if v.name == "mutation" else []
    assert [p.message for p in d.problems] == expected
    value = d.body if isinstance(v.value, tuple) else fr.body
    assert encode(op, dialect="upr", value=value, opaque=fr.opaque) == raw


REQUESTS = [t for t in ALL_VARIANTS if not t[1]]
RESPONSES = [t for t in ALL_VARIANTS if t[1]]


@PROPERTY
@given(data=st.data(), sid=st.integers(0, 0xFFFF))
def test_stream_id_roundtrip(data: st.DataObject, sid: int) -> None:
    cmd, _, v = data.draw(st.sampled_from(REQUESTS), label="variant")
    case = data.draw(mcbp_case(cmd, False, v), label="case")
    raw = case.encode(stream_id=sid)
    fr = only_frame(raw)
    d = dissect(fr, case.context)
    assert fr.is_alt and fr.magic == 0x08
    assert fr.stream_id == d.stream_id == sid
    assert (d.variant, d.extras, d.body, d.key) == (v.name, case.extras, case.body, case.key)
    expected = list(EXPECTED_PROBLEMS.get(cmd.opcode, []))
    if cmd.sid == "never":
        expected.append(f"{cmd.name} must never carry a stream id (stream-ids and sync writes are exclusive)")
    assert [p.message for p in d.problems] == expected
    if cmd.sid != "never":
        sent = dissect(fr, DissectContext(stream_ids=False))
        assert "stream id sent but enable_stream_id was not negotiated" in [p.message for p in sent.problems]
    assert encode(fr.opcode, **{**case.kwargs, "extras": d.extras, "key": d.key}, stream_id=d.stream_id) == raw


@PROPERTY
@given(data=st.data())
def test_stream_id_required_when_enabled(data: st.DataObject) -> None:
    cmd, _, v = data.draw(st.sampled_from([t for t in REQUESTS if t[0].sid == "stream"]), label="variant")
    d = dissect(only_frame(data.draw(mcbp_case(cmd, False, v), label="case").encode()), DissectContext(stream_ids=True))
    assert any("stream id missing" in p.message for p in d.problems), d.problems


@PROPERTY
@given(data=st.data(), units=st.integers(0, 0xFFFF))
def test_response_frame_info_2_is_not_a_stream_id(data: st.DataObject, units: int) -> None:
    cmd, _, v = data.draw(st.sampled_from(RESPONSES), label="variant")
    case = data.draw(mcbp_case(cmd, True, v), label="case")
    fr = only_frame(case.encode(frame_infos=[(spec.FRAME_INFO_STREAM_ID, units.to_bytes(2, "big"))]))
    d = dissect(fr, case.context)
    assert fr.magic == 0x18
    assert d.problems == []
    assert d.stream_id is None
    assert fr.stream_id is None


@PROPERTY
@given(
    opcode=st.sampled_from(sorted(spec.COMMANDS)),
    status=st.sampled_from(sorted(set(spec.STATUS) - {Status.SUCCESS})) | st.integers(1, 0xFFFF),
    body=st.sampled_from([b"", b"not my vbucket", b'{"error":{"context":"no such key","ref":"1234"}}']),
    opaque=st.integers(0, 2**32 - 1),
)
def test_error_responses(opcode: int, status: int, body: bytes, opaque: int) -> None:
    cmd = spec.COMMANDS[opcode]
    assume(not any(dict(v.when).get("status") == status for v in cmd.response))
    raw = encode(opcode, response=True, status=status, value=body, opaque=opaque)
    fr = only_frame(raw)
    d = dissect(fr)
    assert (d.variant, fr.status, fr.opaque) == ("error", status, opaque)
    assert d.problems == []
    if body.startswith(b"{"):
        assert d.document == json.loads(body)
    assert encode(opcode, response=True, status=status, value=fr.value, opaque=opaque) == raw


@PROPERTY
@given(table=st.sampled_from(sorted(spec.FLATBUFFER_TABLES)), data=st.data())
def test_flatbuffers_absent_fields_read_as_defaults(table: str, data: st.DataObject) -> None:
    full = data.draw(flatbuffer_values(table), label="values")
    keep = data.draw(st.sets(st.sampled_from(sorted(full))), label="present")
    v = next(v for _, _, v in ALL_VARIANTS if v.value == f"flatbuffers:{table}")
    values = {k: full[k] for k in keep}
    key = b"" if v.key == "none" else b"name"
    raw = encode("DCP_SYSTEM_EVENT", variant=v.name, extras={"by_seqno": 1}, key=key, value=values)
    d = dissect(only_frame(raw))
    defaults = {name: "" if typ == "string" else (False if typ == "bool" else 0) for name, typ in spec.FLATBUFFER_TABLES[table]}
    assert d.body == {**defaults, **values}
    assert d.problems == []


# ---------------------------------------------------------------------------
# 5b. breaking each declared rule yields a problem that names it


@dataclass(frozen=True)
class Rule:
    cmd: Command
    response: bool
    variant: Variant
    what: str
    detail: Any
    message: str

    @property
    def id(self) -> str:
        extra = f"-{self.detail[1].name}" if self.what in ("invalid", "unknown") else ""
        if self.what == "invalid":
            extra += f"={self.detail[2]:#x}"
        if self.what == "check":
            extra = "-" + "-".join(str(x) for x in self.detail[:3])
        return f"{variant_id(self.cmd, self.response, self.variant)}-{self.what}{extra}"


def _sections(v: Variant) -> list[tuple[str, Field]]:
    out = [("extras", f) for f in v.extras]
    if isinstance(v.value, tuple):
        out += [("value", f) for f in v.value if isinstance(f, Field)]
    return out


def _all_rules() -> tuple[list[Rule], list[Rule]]:
    """(rules a violation of which must be reported, rules on variant-selecting fields)."""
    rules: list[Rule] = []
    on_selectors: dict[tuple[str, str, str], Rule] = {}
    for cmd, response, v in ALL_VARIANTS:
        sole = len(cmd.response if response else cmd.request) == 1 and not v.when

        def add(what: str, detail: Any, message: str, cmd: Command = cmd, response: bool = response, v: Variant = v) -> None:
            rules.append(Rule(cmd, response, v, what, detail, message))

        for check in v.checks:
            add("check", check, str(check[3] if check[0] == "context" else check[-1]))
        if v.cas:
            add("cas", v.cas, "CAS must be 0" if v.cas == "zero" else "CAS must not be 0")
        if v.datatypes is not None:
            add("datatype", None, "is not valid for")
        if cmd.obsolete and not response:
            add("obsolete", None, cmd.obsolete)
        sel = selectors(v)
        for section, f in _sections(v):
            found: list[Rule] = []
            for bad, why in (f.invalid or {}).items():
                found.append(Rule(cmd, response, v, "invalid", (section, f, bad), why))
            if f.strict and f.names is not None and f.kind in (ENUM, FLAGS):
                found.append(Rule(cmd, response, v, "unknown", (section, f), f"unknown {f.label}"))
            for r in found:
                if f.name in sel:
                    on_selectors.setdefault((cmd.name, r.what, r.message), r)
                else:
                    rules.append(r)
        if sole:
            if v.key in ("doc", "text", "agent"):
                add("key-missing", None, "must have a key")
            if v.key == "none":
                add("key-forbidden", None, "must not have a key")
            if v.value == "none":
                add("value-forbidden", None, "must not have a value")
            required = v.value in ("doc", "text", "json", "cache_records") or (
                isinstance(v.value, tuple) and v.value and not all(isinstance(f, Group) for f in v.value)
            )
            if required:
                add("value-missing", None, "must have a value")
            if v.extras and not v.any_extras:
                add("extras-missing", None, f"must have {v.extras_len} bytes of extras")
    return rules, list(on_selectors.values())


ALL_RULES, SELECTOR_RULES = _all_rules()


def violate(rule: Rule, case: Case, draw: Any) -> tuple[dict[str, Any], DissectContext | None]:
    """Encode changes (and a context) that break ``rule`` and nothing it depends on."""
    extras = dict(case.extras)
    value = dict(case.kwargs["value"]) if isinstance(case.kwargs["value"], dict) else case.kwargs["value"]
    changes: dict[str, Any] = {}
    ctx = None
    what, detail = rule.what, rule.detail
    fields = {f.name: f for f in rule.variant.extras}
    if what == "check":
        kind = detail[0]
        if kind == "context":
            ctx = DissectContext(**{detail[1]: not detail[2]})
        elif kind in ("zero", "nonzero"):
            f = fields[detail[1]]
            extras[f.name] = draw(st.integers(1, max_uint(f.size or 1))) if kind == "zero" else 0
        elif kind == "order":
            lo, hi = fields[detail[1]], fields[detail[2]]
            extras[hi.name] = draw(st.integers(0, max_uint(hi.size or 1) - 1))
            extras[lo.name] = draw(st.integers(extras[hi.name] + 1, max_uint(lo.size or 1)))
        else:
            name, a, b = detail[1], detail[2], detail[3]
            if kind == "exclusive":
                extras[name] |= a | b
            elif kind == "requires":
                extras[name] = (extras[name] | a) & ~b
            else:  # cache_transfer_only_with: a plus any known bit outside b
                f = fields[name]
                other = sorted(bit for bit in f.names or () if not bit & b and bit not in (f.invalid or {}))
                extras[name] |= a | draw(st.sampled_from(other))
    elif what == "cas":
        changes["cas"] = draw(st.integers(1, 2**64 - 1)) if detail == "zero" else 0
    elif what == "datatype":
        changes["datatype"] = draw(st.sampled_from(sorted(set(range(8)) - set(rule.variant.datatypes or ()))))
    elif what in ("invalid", "unknown"):
        section, f = detail[0], detail[1]
        target = extras if section == "extras" else value
        if what == "invalid":
            target[f.name] = target[f.name] | detail[2] if f.kind == FLAGS else detail[2]
        elif f.kind == FLAGS:
            spare = [1 << i for i in range(8 * (f.size or 1)) if not (1 << i) & known_bits(f)]
            target[f.name] |= draw(st.sampled_from(spare))
        else:
            target[f.name] = draw(
                st.integers(0, max_uint(f.size or 1)).filter(lambda x: x not in (f.names or {}) and x not in (f.invalid or {}))
            )
    elif what == "key-missing":
        changes["key"] = b""
    elif what == "key-forbidden":
        changes["key"] = draw(st.binary(min_size=1, max_size=8))
    elif what == "value-forbidden":
        value = draw(st.binary(min_size=1, max_size=8))
    elif what == "value-missing":
        value = None
        changes["datatype"] = 0
    elif what == "extras-missing":
        extras = b""  # type: ignore[assignment]
    elif what != "obsolete":
        raise AssertionError(what)
    return {**changes, "extras": extras, "value": value}, ctx


def assert_rule_reported(rule: Rule, data: st.DataObject) -> None:
    case = data.draw(mcbp_case(rule.cmd, rule.response, rule.variant), label="case")
    changes, ctx = violate(rule, case, data.draw)
    d = dissect(only_frame(case.encode(**changes)), ctx or case.context)
    assert any(rule.message in p.message for p in d.problems), (rule.message, d.problems)


@pytest.mark.parametrize("rule", [pytest.param(r, id=r.id) for r in ALL_RULES])
@RULES
@given(data=st.data())
def test_rule_violation_is_reported(rule: Rule, data: st.DataObject) -> None:
    assert_rule_reported(rule, data)


# Fields that select the variant (system event id and version, marker version) are
# checked too: a value no variant lists must still be reported by its own rule,
# not as "unexpected extras length 13 (expected 13)".
@pytest.mark.parametrize("rule", [pytest.param(r, id=r.id) for r in SELECTOR_RULES])
@RULES
@given(data=st.data())
def test_rule_violation_on_selector_field_is_reported(rule: Rule, data: st.DataObject) -> None:
    assert_rule_reported(rule, data)


def test_rule_tables_are_not_empty() -> None:
    whats = {r.what for r in ALL_RULES}
    assert whats >= {"check", "cas", "datatype", "obsolete", "invalid", "unknown", "key-missing", "value-missing", "extras-missing"}
    assert len(SELECTOR_RULES) >= 3


# value / key rules that live in the dissector rather than the table


def _open_case(data: st.DataObject, *, producer: bool) -> tuple[Case, dict[str, Any]]:
    cmd = spec.COMMANDS[0x50]
    case = data.draw(mcbp_case(cmd, False, cmd.request[0]), label="case")
    extras = dict(case.extras)
    extras["flags"] = (extras["flags"] | OpenFlag.PRODUCER) if producer else extras["flags"] & ~(OpenFlag.PRODUCER | 0x200)
    return case, extras


@PROPERTY
@given(data=st.data(), which=st.sampled_from(["no-json-datatype", "producer", "unknown-key"]))
def test_dcp_open_value_rules(data: st.DataObject, which: str) -> None:
    case, extras = _open_case(data, producer=which == "producer")
    name = data.draw(st.text(max_size=8), label="name")
    value: dict[str, Any] = {"consumer_name": name}
    datatype = 0x01
    message = {
        "no-json-datatype": "DCP_OPEN value must have datatype JSON",
        "producer": "consumer_name is only valid on consumer connections",
        "unknown-key": "unknown DCP_OPEN value key",
    }[which]
    if which == "no-json-datatype":
        datatype = 0
    elif which == "unknown-key":
        value[data.draw(st.text(min_size=1, max_size=8).filter(lambda k: k != "consumer_name"), label="key")] = 1
    d = dissect(only_frame(case.encode(extras=extras, value=value, datatype=datatype)))
    assert any(message in p.message for p in d.problems), d.problems


STREAM_REQ_VALUE_RULES: list[tuple[str, Any, DissectContext, str]] = [
    ("uid-not-string", {"uid": 5}, DissectContext(), "uid must be a JSON string"),
    ("sid-zero", {"sid": 0}, DissectContext(), "out of range"),
    ("sid-too-big", {"sid": 65536}, DissectContext(), "out of range"),
    ("sid-not-int", {"sid": "1"}, DissectContext(), "sid must be a JSON integer"),
    ("sid-not-negotiated", {"sid": 1}, DissectContext(stream_ids=False), "enable_stream_id was not negotiated"),
    ("sid-required", {}, DissectContext(stream_ids=True), "sid required"),
    ("collections-not-hex", {"collections": ["xyz"]}, DissectContext(), "collections must be an array of hex strings"),
    ("scope-not-hex", {"scope": ""}, DissectContext(), "scope must be a hex string"),
    ("collections-and-scope", {"collections": ["8"], "scope": "0"}, DissectContext(), "collections and scope together are invalid"),
    ("purge-not-decimal", {"purge_seqno": "0x10"}, DissectContext(), "purge_seqno must be a decimal string"),
    ("no-collections", {"uid": "0"}, DissectContext(collections=False), "only accepted when collections were negotiated"),
    ("not-json", b"{uid:", DissectContext(), "value is not valid JSON"),
]


@pytest.mark.parametrize(("value", "ctx", "message"), [pytest.param(*r[1:], id=r[0]) for r in STREAM_REQ_VALUE_RULES])
@RULES
@given(data=st.data())
def test_stream_req_value_rules(value: Any, ctx: DissectContext, message: str, data: st.DataObject) -> None:
    cmd = spec.COMMANDS[0x53]
    case = data.draw(mcbp_case(cmd, False, cmd.request[0]), label="case")
    d = dissect(only_frame(case.encode(value=value)), ctx)
    assert any(message in p.message for p in d.problems), d.problems


@PROPERTY
@given(key=st.text(min_size=1, max_size=20).filter(lambda k: k not in spec.CONTROL_KEYS), value=st.text(min_size=1, max_size=8))
def test_unknown_control_key(key: str, value: str) -> None:
    d = dissect(only_frame(encode("DCP_CONTROL", key=key, value=value)))
    assert [p.message for p in d.problems] == [f"unknown control key {key!r} (the producer answers Einval)"]


@PROPERTY
@given(agent=st.text(max_size=12).map(lambda s: "{" + s).filter(lambda s: not _is_json(s)))
def test_hello_agent_that_is_not_json(agent: str) -> None:
    d = dissect(only_frame(encode("HELLO", key=agent, value={"features": []})))
    assert any("is not JSON" in p.message for p in d.problems), d.problems


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------
# 6. collections: LEB128 collection-id key prefixes


def _mutation(key: bytes, cid: int | None) -> bytes:
    return encode("DCP_MUTATION", extras={"by_seqno": 1}, key=key, cid=cid, value=b"v", opaque=7)


@PROPERTY
@given(cid=st.integers(0, 2**32 - 1), key=st.binary(max_size=40))
@example(cid=0, key=b"k")
@example(cid=2**32 - 1, key=b"k")
@example(cid=0x7F, key=b"")
def test_collection_id_prefix(cid: int, key: bytes) -> None:
    raw = _mutation(key, cid)
    fr = only_frame(raw)
    d = dissect(fr, DissectContext(collections=True))
    assert (d.cid, d.key) == (cid, key)
    assert [p.message for p in d.problems] == ([] if key else ["key holds only a collection id"])
    if key:
        assert encode("DCP_MUTATION", extras=d.extras, key=d.key, cid=d.cid, value=fr.value, opaque=7) == raw
    for collections in (None, False):
        d = dissect(fr, DissectContext(collections=collections))
        assert (d.cid, d.key) == (None, encode_leb128(cid) + key)
        assert d.problems == []


@PROPERTY
@given(cid=st.integers(0, 2**28 - 1), extra=st.integers(1, 4), key=st.binary(min_size=1, max_size=12))
@example(cid=0, extra=1, key=b"k")  # b"\x80\x00" + key
def test_overlong_leb128_is_a_problem(cid: int, extra: int, key: bytes) -> None:
    canonical = encode_leb128(cid)
    assume(len(canonical) + extra <= 5)
    overlong = canonical[:-1] + bytes([canonical[-1] | 0x80]) + b"\x80" * (extra - 1) + b"\x00"
    d = dissect(only_frame(_mutation(overlong + key, None)), DissectContext(collections=True))
    assert (d.cid, d.key) == (cid, key)
    assert any("non-canonical" in p.message for p in d.problems), d.problems


@PROPERTY
@given(value=st.integers(2**32, 2**35 - 1), key=st.binary(min_size=1, max_size=12))
def test_leb128_above_32_bits_is_a_problem(value: int, key: bytes) -> None:
    d = dissect(only_frame(_mutation(key, value)), DissectContext(collections=True))
    assert d.key == key
    assert any("exceeds 32 bits" in p.message for p in d.problems), d.problems


@PROPERTY
@given(records=cache_records())
def test_cache_transfer_keys_without_collections(records: tuple[bytes, list[dict[str, Any]]]) -> None:
    value, expected = records
    d = dissect(only_frame(encode("DCP_CACHE_TRANSFER", value=value)), DissectContext(collections=False))
    assert d.problems == []
    keys = [encode_leb128(r["cid"]) + r["key"].encode() for r in expected]
    assert d.body["records"] == [
        {k: v for k, v in r.items() if k != "cid"} | {"key": key.decode("utf-8", "backslashreplace")}
        for r, key in zip(expected, keys, strict=True)
    ]


@PROPERTY
@given(prefix=st.binary(min_size=1, max_size=6).map(lambda b: bytes(x | 0x80 for x in b)))
def test_unterminated_leb128_is_a_problem(prefix: bytes) -> None:
    d = dissect(only_frame(_mutation(prefix, None)), DissectContext(collections=True))
    assert d.cid is None
    assert any("LEB128" in p.message for p in d.problems), d.problems
