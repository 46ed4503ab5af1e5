"""The behaviour facts of :mod:`dcpinspect.protocol.session`: the DCP_CONTROL table against a producer, and the opcode sets."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dcpinspect import encode
from dcpinspect.live.cluster import Cluster
from dcpinspect.live.producer import HANDLED_OPCODES, ProducerConnection
from dcpinspect.live.sasl import plain_payload
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Feature, Opcode, OpenFlag, Status
from dcpinspect.protocol.exchanges import Exchange, answered_once, exchange
from dcpinspect.protocol.session import (
    CONTEXT_EFFECTS,
    CONTROL_KEYS,
    EXPECTS_RESPONSE,
    ITEMS,
    SEQNO_FIELD,
    SESSION_OPS,
    STREAM_END_NORMAL,
    STREAM_END_REREQUEST,
    STREAM_MESSAGES,
    SYNC_WRITES,
    control_on,
    control_status,
    control_value,
    parse_float,
    parse_u32,
)
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.dissect import dissect

# ---------------------------------------------------------------------------
# DCP_CONTROL: the table's answer is the producer's answer, in every negotiated state

#: values tried for every key: valid ones of some key, invalid ones, empty, odd numbers
VALUES = [
    "",
    "true",
    "false",
    "TRUE",
    "yes",
    "0",
    "1",
    "1024",
    "-1",
    "+5",
    " 7",
    "4294967295",
    "4294967296",
    "9" * 5000,
    "\u00b2",  # a digit int() refuses
    "\u0661\u0662",  # digits int() takes
    "0.1",
    "0.05",
    "1e3",
    "nan",
    "inf",
    "abc",
    "high",
    "medium",
    "low",
    "urgent",
    "2.0",
    "2.2",
    "3.0",
    "round-robin",
    "sequential",
    "random",
    "true_with_seqno_advanced",
    "replica-1",
]


def _values_of(key: str) -> list[str]:
    rule = CONTROL_KEYS[key]
    own = sorted(rule.values) if isinstance(rule.values, frozenset) else []
    return list(dict.fromkeys([*VALUES, *own]))


#: negotiated states: HELLO features x DCP_OPEN flags x the controls set before
FEATURES = [(), (Feature.SNAPPY,), (Feature.COLLECTIONS,), (Feature.SNAPPY, Feature.COLLECTIONS, Feature.JSON)]
OPEN_FLAGS = [
    OpenFlag.PRODUCER,
    OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS | OpenFlag.INCLUDE_DELETED_USER_XATTRS,
]
PRIOR = [{}, {"enable_stream_id": "true"}, {"enable_sync_writes": "true", "consumer_name": "replica"}]
STATES = list(itertools.product(FEATURES, OPEN_FLAGS, PRIOR))


class Session:
    """One producer connection bootstrapped into a negotiated state, answering DCP_CONTROLs."""

    def __init__(self, features: tuple[int, ...], open_flags: int, prior: dict[str, str]) -> None:
        cluster = Cluster(seed=1)
        cluster.create_bucket("default", vbuckets=1)
        self.conn = ProducerConnection(cluster)
        self.dec = FrameDecoder()
        self.opaque = 0
        if features:
            assert self.request("HELLO", key="t", value={"features": [(int(f),) for f in features]}) == Status.SUCCESS
        assert self.request("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")) == Status.SUCCESS
        assert self.request("SELECT_BUCKET", key="default") == Status.SUCCESS
        assert self.request("DCP_OPEN", key="t", extras={"flags": int(open_flags)}) == Status.SUCCESS
        for key, value in prior.items():
            assert self.control(key, value) == Status.SUCCESS, key

    def request(self, name: str, **kw: Any) -> int:
        self.opaque += 1
        self.conn.receive(encode(name, opaque=self.opaque, **kw), 0.0)
        replies = [ev for ev in self.dec.feed(self.conn.data_to_send()) if ev.opaque == self.opaque]
        assert len(replies) == 1 and not self.conn.closed, (name, self.conn.close_reason)
        return replies[0].status

    def control(self, key: str, value: str | bytes) -> int:
        return self.request("DCP_CONTROL", key=key, value=value)


@pytest.mark.parametrize(("features", "open_flags", "prior"), STATES)
def test_control_status_is_the_producers_answer(features: tuple[int, ...], open_flags: int, prior: dict[str, str]) -> None:
    for key in CONTROL_KEYS:
        s = Session(features, open_flags, prior)
        for value in _values_of(key):
            before = dict(s.conn.controls)
            want = control_status(
                key,
                value,
                features=frozenset(int(f) for f in features),
                open_flags=int(open_flags),
                controls=before,
                stream_ids=before.get("enable_stream_id") == "true",
            )
            assert s.control(key, value) == want, (key, value)
            # an accepted key is recorded by the session (a one-way switch that is on stays on), a refused one is not
            kept = control_value(key, value, before.get(key)) if want == Status.SUCCESS else before.get(key)
            assert s.conn.controls.get(key) == kept


@pytest.mark.parametrize("key", [*CONTROL_KEYS, "no_such_key", ""])
def test_undecodable_and_unknown_controls(key: str) -> None:
    """kv_engine compares the value's bytes: keys that take any value take bytes that are not UTF-8 too."""
    s = Session((Feature.COLLECTIONS,), OpenFlag.PRODUCER, {})
    rule = CONTROL_KEYS.get(key)
    want = control_status(key, b"\xff\xfe".decode("utf-8", "surrogateescape"), features={Feature.COLLECTIONS}, open_flags=OpenFlag.PRODUCER)
    assert s.control(key, b"\xff\xfe") == want
    if rule is not None and rule.values is None and rule.needs_feature is None:  # any value, bytes included
        assert want == (Status.NOT_SUPPORTED if rule.refused else Status.SUCCESS)
    else:
        assert want != Status.SUCCESS
    if key not in CONTROL_KEYS:
        assert s.control(key, "true") == Status.EINVAL == control_status(key, "true")


#: kv_engine engines/ep/src/dcp/producer.cc ``DcpProducer::control``, value by value
SOURCE_RULES = [
    ("enable_noop", "yes", Status.SUCCESS),  # any value; only "true" turns noops on
    ("set_noop_interval", " 2.5 trailing", Status.SUCCESS),  # strtof: whitespace ends the number
    ("set_noop_interval", "0x1p3", Status.SUCCESS),  # a C hex float
    ("set_noop_interval", "inf", Status.SUCCESS),
    ("set_noop_interval", "nan", Status.EINVAL),
    ("set_noop_interval", "0.05", Status.EINVAL),  # below connection_manager_interval
    ("set_noop_interval", "1e39", Status.EINVAL),  # ERANGE
    ("connection_buffer_size", " +7", Status.SUCCESS),  # safe_strtoul skips spaces and one '+'
    ("connection_buffer_size", "12 x", Status.SUCCESS),
    ("connection_buffer_size", "12x", Status.EINVAL),
    ("connection_buffer_size", "4294967296", Status.EINVAL),
    ("connection_buffer_size", "-1", Status.EINVAL),
    ("stream_buffer_size", "1024", Status.NOT_SUPPORTED),
    ("supports_cursor_dropping", "no", Status.SUCCESS),
    ("send_stream_end_on_client_close_stream", "false", Status.SUCCESS),
    ("enable_expiry_opcode", "false", Status.SUCCESS),
    ("enable_stream_id", "false", Status.EINVAL),
    ("v7_dcp_status_codes", "false", Status.EINVAL),
    ("flatbuffers_system_events", "false", Status.EINVAL),
    ("change_streams", "true", Status.NOT_SUPPORTED),
    ("change_streams", "false", Status.EINVAL),
    ("max_marker_version", "2.0", Status.EINVAL),
    ("cache_transfer", "anything", Status.SUCCESS),  # dcp_cache_transfer_enabled defaults to true
]


@pytest.mark.parametrize(("key", "value", "status"), SOURCE_RULES, ids=[f"{k}={v}" for k, v, _ in SOURCE_RULES])
def test_control_rules_follow_the_server(key: str, value: str, status: int) -> None:
    assert control_status(key, value, features={Feature.COLLECTIONS}) == status
    assert Session((Feature.COLLECTIONS,), OpenFlag.PRODUCER, {}).control(key, value) == status


def test_max_marker_version_without_collections_is_not_supported() -> None:
    assert control_status("max_marker_version", "2.2") == Status.NOT_SUPPORTED
    assert control_status("max_marker_version", "2.0") == Status.EINVAL
    assert Session((), OpenFlag.PRODUCER, {}).control("max_marker_version", "2.2") == Status.NOT_SUPPORTED


def test_one_way_and_switch_values() -> None:
    s = Session((Feature.COLLECTIONS,), OpenFlag.PRODUCER, {})
    assert s.control("send_stream_end_on_client_close_stream", "true") == Status.SUCCESS
    assert s.control("send_stream_end_on_client_close_stream", "false") == Status.SUCCESS
    assert s.conn.controls["send_stream_end_on_client_close_stream"] == "true"  # one-way: stays on
    assert control_on("send_stream_end_on_client_close_stream", s.conn.controls)
    assert s.control("enable_noop", "true") == Status.SUCCESS and s.conn.noop_enabled
    assert s.control("enable_noop", "yes") == Status.SUCCESS and not s.conn.noop_enabled  # accepted, turns noops off
    assert not control_on("enable_noop", s.conn.controls)
    assert control_on("connection_buffer_size", {"connection_buffer_size": "0"})  # a quantity: set is on


def test_parsers_follow_the_c_library() -> None:
    assert [parse_u32(v) for v in ("7", " 7", "+7", "007", "7 x", "7x", "", "+", "-7", "4294967295", "0" * 30 + "1")] == [
        7,
        7,
        7,
        7,
        7,
        None,
        None,
        None,
        None,
        2**32 - 1,
        1,
    ]
    assert parse_float("2.5") == 2.5 and parse_float(".5") == 0.5 and parse_float("0x1p-1") == 0.5
    assert parse_float("1e39") is None and parse_float("abc") is None and parse_float("2.5x") is None


def test_control_effects_reach_the_connection() -> None:
    s = Session((Feature.COLLECTIONS,), OpenFlag.PRODUCER, {})
    assert s.control("enable_noop", "true") == Status.SUCCESS and s.conn.noop_enabled
    assert s.control("set_noop_interval", "2.5") == Status.SUCCESS and s.conn.noop_interval == 2.5
    assert s.control("connection_buffer_size", "4294967295") == Status.SUCCESS and s.conn.buffer_size == 2**32 - 1
    assert s.control("connection_buffer_size", "4294967296") == Status.EINVAL and s.conn.buffer_size == 2**32 - 1
    assert s.control("enable_noop", "false") == Status.SUCCESS and not s.conn.noop_enabled
    assert s.control("set_noop_interval", "inf") == Status.SUCCESS and s.conn.noop_interval == float("inf")
    assert s.control("enable_stream_id", "true") == Status.SUCCESS and s.conn.context.stream_ids


def test_every_control_key_is_in_the_reference_and_dissects_as_known() -> None:
    assert set(spec.CONTROL_KEYS) == set(CONTROL_KEYS)
    for key in CONTROL_KEYS:
        d = dissect(FrameDecoder().feed(encode("DCP_CONTROL", key=key, value="true"))[0])
        assert not any("unknown" in p.message for p in d.problems), (key, d.problems)


# ---------------------------------------------------------------------------
# the opcode sets


def test_opcode_sets_are_consistent() -> None:
    assert ITEMS <= STREAM_MESSAGES
    assert set(SEQNO_FIELD) == ITEMS | {Opcode.DCP_SEQNO_ACKNOWLEDGED}
    assert SYNC_WRITES - {Opcode.DCP_SEQNO_ACKNOWLEDGED} <= ITEMS
    assert not STREAM_MESSAGES & EXPECTS_RESPONSE  # the producer's stream messages are never answered
    assert set(CONTEXT_EFFECTS) == SESSION_OPS and SESSION_OPS <= EXPECTS_RESPONSE
    assert not STREAM_END_REREQUEST & STREAM_END_NORMAL
    every = STREAM_MESSAGES | EXPECTS_RESPONSE | SYNC_WRITES
    assert every <= set(spec.COMMANDS)


def test_the_producer_handles_every_command_that_expects_a_response() -> None:
    assert EXPECTS_RESPONSE <= HANDLED_OPCODES
    assert set(spec.COMMANDS) >= HANDLED_OPCODES


def test_the_session_requests_that_expect_a_response_agree_with_the_exchanges() -> None:
    """EXPECTS_RESPONSE (the session requests a replay follows) is a subset of what protocol/exchanges.py says is answered."""
    assert all(answered_once(op) or exchange(op) is Exchange.CLOSE for op in EXPECTS_RESPONSE)
    assert all(exchange(op) in (Exchange.NONE, Exchange.ON_ACK_FLAG, Exchange.ONE) for op in STREAM_MESSAGES)
    assert not any(answered_once(op) for op in STREAM_MESSAGES - {Opcode.DCP_SET_VBUCKET_STATE})
