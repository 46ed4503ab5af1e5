"""The sans-IO producer's session half: bootstrap, DCP_OPEN, DCP_CONTROL, noops, malformed input, dispatch."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from producerpeer import ALT, COLLECTIONS, JSON, SNAPPY, XATTR, Peer, make, names, stream_messages  # noqa: F401
from strategies import ALL_VARIANTS, mcbp_case

from dcpinspect import EncodeError, encode
from dcpinspect.live.producer import HANDLED_OPCODES, UNANSWERED
from dcpinspect.live.sasl import ScramClient, plain_payload
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Feature, Magic, Opcode, OpenFlag, Status
from dcpinspect.protocol.rules import MAX_SEQNO as FOREVER
from dcpinspect.protocol.session import DCP_IDLE_TIMEOUT, DEFAULT_NOOP_INTERVAL, EXPECTS_RESPONSE, NOOP_OPAQUE_BASE

#: DCP_CONTROL key, value, status: kv_engine engines/ep/src/dcp/producer.cc ``DcpProducer::control``
CONTROL_CASES = [
    ("enable_noop", "true", 0),
    ("enable_noop", "yes", 0),  # any value is accepted; only "true" turns noops on
    ("set_noop_interval", "0.1", 0),
    ("set_noop_interval", "0.05", 0x04),  # below connection_manager_interval
    ("set_noop_interval", "abc", 0x04),
    ("set_noop_interval", "nan", 0x04),
    ("connection_buffer_size", "1024", 0),
    ("connection_buffer_size", "4294967295", 0),
    ("connection_buffer_size", "4294967296", 0x04),  # not a u32
    ("connection_buffer_size", "-1", 0x04),
    ("stream_buffer_size", "1024", 0x83),
    ("set_priority", "high", 0),
    ("set_priority", "urgent", 0x04),
    ("supports_cursor_dropping", "true", 0),
    ("supports_cursor_dropping_vulcan", "false", 0),
    ("supports_hifi_MFU", "maybe", 0),  # any value
    ("force_value_compression", "true", 0x04),  # snappy not negotiated
    ("send_stream_end_on_client_close_stream", "true", 0),
    ("send_stream_end_on_client_close_stream", "false", 0),  # any value; "false" does not turn it off
    ("enable_expiry_opcode", "true", 0),
    ("enable_expiry_opcode", "false", 0),
    ("enable_stream_id", "true", 0),
    ("enable_stream_id", "false", 0x04),
    ("enable_sync_writes", "true", 0),
    ("enable_sync_writes", "false", 0x04),
    ("consumer_name", "replica-1", 0),
    ("enable_out_of_order_snapshots", "true_with_seqno_advanced", 0),
    ("enable_out_of_order_snapshots", "maybe", 0x04),
    ("include_deleted_user_xattrs", "true", 0x04),  # open flag 0x100 not set
    ("v7_dcp_status_codes", "true", 0),
    ("v7_dcp_status_codes", "false", 0x04),
    ("flatbuffers_system_events", "true", 0),
    ("flatbuffers_system_events", "false", 0x04),
    ("change_streams", "true", 0x83),  # the simulator's storage keeps no history
    ("change_streams", "false", 0x04),
    ("max_marker_version", "2.2", 0),
    ("max_marker_version", "2.0", 0x04),  # only "2.2"
    ("max_marker_version", "3.0", 0x04),
    ("backfill_order", "sequential", 0),
    ("backfill_order", "random", 0x04),
    ("cache_transfer", "true", 0),  # dcp_cache_transfer_enabled defaults to true
    ("cache_transfer", "anything", 0),
    ("no_such_key", "true", 0x04),
]


# ---------------------------------------------------------------------------
# state x input: table-built frames in every session state never raise, and every request is answered
# (or is one the producer documents as unanswered, or ends the connection for a documented reason)

REQUEST_MAGICS = {Magic.CLIENT_REQUEST, Magic.ALT_CLIENT_REQUEST}
RESPONSE_MAGICS = {Magic.CLIENT_RESPONSE, Magic.ALT_CLIENT_RESPONSE}
#: why a producer closes a connection on its client's input (ProducerConnection's rule 2)
DOCUMENTED_CLOSES = (
    "client sent QUIT",
    "invalid data from the client",
    "unexpected magic",
    "DCP_NOOP request from the consumer",
    "unexpected DCP_NOOP response",
    "unexpected response",
)
CONTROL_CHOICES = [
    ("enable_noop", "true"),
    ("enable_stream_id", "true"),
    ("enable_sync_writes", "true"),
    ("consumer_name", "replica"),
    ("connection_buffer_size", "300"),
    ("send_stream_end_on_client_close_stream", "true"),
    ("enable_out_of_order_snapshots", "true_with_seqno_advanced"),
    ("max_marker_version", "2.2"),
    ("flatbuffers_system_events", "true"),
    ("enable_expiry_opcode", "true"),
    ("force_value_compression", "true"),
]
OPEN_CHOICES = [
    OpenFlag.PRODUCER,
    OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS,
    OpenFlag.PRODUCER | OpenFlag.INCLUDE_DELETE_TIMES,
    OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS | OpenFlag.INCLUDE_DELETED_USER_XATTRS,
    OpenFlag.PRODUCER | OpenFlag.NO_VALUE,
    0,
]
FEATURE_CHOICES = [Feature.COLLECTIONS, Feature.JSON, Feature.ALT_REQUEST_SUPPORT, Feature.XATTR, Feature.SNAPPY, Feature.SYNC_REPLICATION]


#: the table's variants of the commands the producer handles (requests) and of the responses a consumer sends it
HANDLED_VARIANTS = [
    (c, r, v)
    for c, r, v in ALL_VARIANTS
    if (not r and c.opcode in HANDLED_OPCODES) or (r and c.opcode in (Opcode.DCP_NOOP, Opcode.DCP_SET_VBUCKET_STATE))
]
#: go on to the next bootstrap step (mostly)
ON = st.sampled_from((False, True, True, True))


@st.composite
def session_states(draw: st.DrawFn) -> list[bytes]:
    """The frames that bring a connection to a drawn state: nothing, HELLO, authenticated, bucket, DCP_OPEN, controls, a stream."""
    frames = []
    if draw(st.booleans()):
        features = draw(st.lists(st.sampled_from(FEATURE_CHOICES), unique=True))
        frames.append(encode("HELLO", key="hyp", value={"features": [(int(f),) for f in features]}))
    if not draw(ON):
        return frames
    frames.append(encode("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")))
    if not draw(ON):
        return frames
    frames.append(encode("SELECT_BUCKET", key="default"))
    if not draw(ON):
        return frames
    flags = draw(st.sampled_from(OPEN_CHOICES))
    frames.append(encode("DCP_OPEN", key="hyp", extras={"flags": int(flags)}))
    if not flags & OpenFlag.PRODUCER:
        return frames  # refused (the simulator only produces): DCP commands are then EINVAL
    for key, value in draw(st.lists(st.sampled_from(CONTROL_CHOICES), max_size=5)):
        frames.append(encode("DCP_CONTROL", key=key, value=value))
    if draw(st.booleans()):
        extras = {"start_seqno": 0, "end_seqno": FOREVER, "snap_start_seqno": 0, "snap_end_seqno": 0}
        frames.append(encode("DCP_STREAM_REQ", extras=extras, vbucket=draw(st.integers(0, 1))))
    return frames


@st.composite
def table_frames(draw: st.DrawFn) -> bytes:
    """Any frame of the table (requests and responses), with the plain or the alt magic, sometimes to a vbucket that exists."""
    cmd, response, variant = draw(st.sampled_from(HANDLED_VARIANTS) | st.sampled_from(ALL_VARIANTS))
    case = draw(mcbp_case(cmd, response, variant))
    changes: dict[str, Any] = {}
    if not response and draw(st.booleans()):
        changes["vbucket"] = draw(st.integers(0, 2))
    how = draw(st.sampled_from(("plain",) * 5 + ("alt",) * 4 + ("other magic",)))
    if how == "alt":
        changes["stream_id"] = draw(st.integers(0, 3))
    elif how == "other magic":
        changes["magic"] = int(draw(st.sampled_from(list(Magic))))
    try:
        return case.encode(**changes)
    except EncodeError:  # e.g. a key too long for the alt magic: the frame as the table built it
        return case.encode()


def test_bootstrap_hello_sasl_select() -> None:
    _, p = make()
    hello = p.request("HELLO", key="agent", value={"features": [(0x99,), (COLLECTIONS,), (JSON,), (COLLECTIONS,), (0x0F,)]})
    assert [f["feature"] for f in hello.body["features"]] == [COLLECTIONS, JSON]
    assert p.request("SASL_LIST_MECHS").frame.value == b"SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN"
    assert p.status("SELECT_BUCKET", key="default") == 0x24  # not authenticated
    assert p.status("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "nope")) == 0x20
    client = ScramClient("SCRAM-SHA512", "Administrator", "password")
    first = p.request("SASL_AUTH", key="SCRAM-SHA512", value=client.first())
    assert first.frame.status == 0x21
    final = p.request("SASL_STEP", key="SCRAM-SHA512", value=client.final(first.frame.value))
    assert final.frame.status == 0 and client.verify(final.frame.value)
    assert p.status("DCP_OPEN", key="x", extras={"flags": 1}) == 0x08  # no bucket yet
    assert p.status("SELECT_BUCKET", key="nope") == 0x01
    assert p.status("SELECT_BUCKET", key="default") == 0
    emap = p.request("GET_ERROR_MAP", value={"version": 2})
    assert emap.document["errors"]["23"]["name"] == "Rollback"
    assert p.status("NOOP") == 0
    assert p.status(0xEE) == 0x81  # unknown command


def test_scram_wrong_password_is_auth_error() -> None:
    _, p = make()
    client = ScramClient("SCRAM-SHA256", "Administrator", "wrong")
    first = p.request("SASL_AUTH", key="SCRAM-SHA256", value=client.first())
    assert p.status("SASL_STEP", key="SCRAM-SHA256", value=client.final(first.frame.value)) == 0x20
    assert p.conn.user is None


def test_seqnos_failover_log_and_stats() -> None:
    cluster, p = make(items=10, nodes=2)  # a failover promotes a replica: two nodes
    p.bootstrap()
    b = cluster.buckets["default"]
    rows = p.request("GET_ALL_VB_SEQNOS").body["vb_seqnos"]
    assert rows == [{"vbucket": vb.id, "high_seqno": vb.high_seqno} for vb in b.vbuckets]
    b.failover(1)
    for op in ("GET_FAILOVER_LOG", "DCP_GET_FAILOVER_LOG"):
        log = p.request(op, vbucket=1).body["failover_log"]
        assert [(e["vb_uuid"], e["vb_seqno"]) for e in log] == b.vbuckets[1].failover_log
    assert p.status("GET_FAILOVER_LOG", vbucket=9) == 0x07
    p.opaque += 1
    stats = {d.key_text: d.frame.value.decode() for d in p.send(encode("STAT", key="failovers 1", opaque=p.opaque))}
    assert stats["vb_1:num_entries"] == "2" and stats["vb_1:0:seq"] == str(b.vbuckets[1].high_seqno) and "" in stats
    p.opaque += 1
    stats = {d.key_text: d.frame.value.decode() for d in p.send(encode("STAT", key="vbucket-seqno", opaque=p.opaque))}
    assert stats["vb_0:high_seqno"] == str(b.vbuckets[0].high_seqno)


@pytest.mark.parametrize(
    ("flags", "status"),
    [(0x01, 0), (0x03, 0x04), (0x11, 0x04), (0x49, 0x04), (0x105, 0), (0x101, 0x04), (0x400 | 1, 0x04), (0x00, 0x83), (0x201, 0)],
)
def test_dcp_open_flags(flags: int, status: int) -> None:
    _, p = make()
    p.bootstrap(open_flags=0x01, controls={})
    p2 = Peer(p.cluster)
    assert p2.status("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")) == 0
    assert p2.status("SELECT_BUCKET", key="default") == 0
    assert p2.status("DCP_OPEN", key="other", extras={"flags": flags}) == status


def test_dcp_open_name_reuse_closes_older() -> None:
    cluster, p = make()
    p.bootstrap()
    q = Peer(cluster)
    q.bootstrap()
    assert p.conn.closed and "reused" in p.conn.close_reason and not q.conn.closed


def test_the_same_dcp_name_on_two_nodes_is_two_connections() -> None:
    cluster, p = make(nodes=2)
    q = Peer(cluster)
    q.conn.node = 1
    p.bootstrap()
    q.bootstrap()
    assert not p.conn.closed and not q.conn.closed


@pytest.mark.parametrize(("key", "value", "status"), CONTROL_CASES, ids=[f"{k}={v}" for k, v, _ in CONTROL_CASES])
def test_dcp_control_rules(key: str, value: str, status: int) -> None:
    _, p = make()
    p.bootstrap(controls={})
    assert p.status("DCP_CONTROL", key=key, value=value) == status


def test_control_exclusions_and_dependencies() -> None:
    _, p = make()
    p.bootstrap(controls={"enable_stream_id": "true"})
    assert p.status("DCP_CONTROL", key="enable_sync_writes", value="true") == 0x83
    _, q = make()
    q.bootstrap(controls={"enable_sync_writes": "true"})
    assert q.status("DCP_CONTROL", key="enable_stream_id", value="true") == 0x83
    _, r = make()
    r.bootstrap(features=(JSON,), controls={})
    assert r.status("DCP_CONTROL", key="max_marker_version", value="2.2") == 0x83  # NotSupported without collections
    _, s = make()
    s.bootstrap(features=(SNAPPY, JSON), open_flags=0x105, controls={})
    assert s.status("DCP_CONTROL", key="force_value_compression", value="true") == 0
    assert s.status("DCP_CONTROL", key="include_deleted_user_xattrs", value="true") == 0


#: every DCP command a client may send: before DCP_OPEN each is EINVAL and the connection stays open
#: (kv_engine daemon/mcbp_validators.cc ``verify_common_dcp_restrictions``)
DCP_BEFORE_OPEN = [
    ("DCP_CONTROL", {"key": "enable_noop", "value": "true"}),
    ("DCP_GET_FAILOVER_LOG", {}),
    ("DCP_STREAM_REQ", {"extras": {"end_seqno": FOREVER}}),
    ("DCP_CLOSE_STREAM", {}),
    ("DCP_NOOP", {}),
    ("DCP_BUFFER_ACKNOWLEDGEMENT", {"extras": {"buffer_bytes": 10}}),
    ("DCP_SEQNO_ACKNOWLEDGED", {"extras": {"prepared_seqno": 1}}),
    ("DCP_ADD_STREAM", {"extras": {"flags": 0}}),
]


@pytest.mark.parametrize(("name", "kw"), DCP_BEFORE_OPEN, ids=[n for n, _ in DCP_BEFORE_OPEN])
def test_dcp_commands_before_open_are_einval_and_the_connection_stays(name: str, kw: dict[str, Any]) -> None:
    _, p = make()
    assert p.status("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")) == 0
    assert p.status("SELECT_BUCKET", key="default") == 0
    reply = p.request(name, **kw)
    assert reply.frame.status == Status.EINVAL and not p.conn.closed
    assert b"DCP connection" in reply.frame.value
    assert p.request("GET_FAILOVER_LOG", vbucket=0).frame.status == 0  # 0x96 works on any connection
    assert p.status("DCP_OPEN", key="late", extras={"flags": 1}) == 0 and p.status("DCP_CONTROL", key="enable_noop", value="true") == 0


def test_a_dead_vbucket_still_returns_its_failover_log() -> None:
    cluster, p = make()
    p.bootstrap()
    b = cluster.buckets["default"]
    b.set_state(1, "dead")
    for op in ("GET_FAILOVER_LOG", "DCP_GET_FAILOVER_LOG"):
        log = p.request(op, vbucket=1).body["failover_log"]
        assert [(e["vb_uuid"], e["vb_seqno"]) for e in log] == b.vbuckets[1].failover_log
    assert p.status("DCP_GET_FAILOVER_LOG", vbucket=7) == Status.NOT_MY_VBUCKET  # no such vbucket


def test_select_bucket_on_a_dcp_connection_is_not_supported() -> None:
    _, p = make()
    p.bootstrap()
    assert p.status("SELECT_BUCKET", key="default") == Status.NOT_SUPPORTED


# ---------------------------------------------------------------------------
# stream request validation, in the server's order (§6.4)


def _answer(p: Peer, noop) -> None:
    p.send(encode("DCP_NOOP", response=True, opaque=noop.frame.opaque))


def test_noop_interval_reply_and_idle_disconnect() -> None:
    _, p = make(items=0, idle_timeout=5.0)
    p.bootstrap(controls={"enable_noop": "true", "set_noop_interval": "1.0"})
    assert p.tick(0.5) == []
    noop = p.tick(0.6)
    assert names(noop) == ["DCP_NOOP"] and noop[0].frame.opaque == NOOP_OPAQUE_BASE == 10000001
    assert p.tick(1.5) == []  # one pending at a time
    _answer(p, noop[0])
    noop2 = p.tick(1.1)
    assert noop2[0].frame.opaque == 10000002
    p.tick(3.0)
    assert not p.conn.closed
    p.tick(3.0)  # nothing received for > 5 s
    assert p.conn.closed and "dcp_idle_timeout" in p.conn.close_reason


def test_noops_default_to_every_20_seconds_from_the_connection_start() -> None:
    """kv_engine producer.cc: ``defaultDcpNoopTxInterval`` 20 s; the noop clock starts with the connection."""
    _, p = make(items=0)
    p.bootstrap(controls={"enable_noop": "true"})
    assert p.conn.noop_interval == DEFAULT_NOOP_INTERVAL == 20.0
    assert p.tick(19.9) == []
    noop = p.tick(0.1)
    assert names(noop) == ["DCP_NOOP"] and p.now == pytest.approx(20.0)
    _answer(p, noop[0])
    assert p.tick(19.9) == [] and names(p.tick(0.1)) == ["DCP_NOOP"]


def test_noops_are_periodic_while_data_flows() -> None:
    """A noop goes out every interval since the last noop, however busy the stream is (``maybeSendNoop``)."""
    cluster, p = make(items=0, vbuckets=1)
    p.bootstrap(controls={"enable_noop": "true", "set_noop_interval": "2"})
    p.stream_req(0)
    b = cluster.buckets["default"]
    noops: list[float] = []
    for i in range(40):  # a mutation every 0.25 s for 10 s
        b.mutate(f"busy-{i}", {"i": i})
        for d in p.tick(0.25):
            if d.name == "DCP_NOOP" and d.role == "request":
                noops.append(p.now)
                _answer(p, d)
    assert noops == pytest.approx([2.0, 4.0, 6.0, 8.0, 10.0])


def test_no_second_noop_while_one_is_unanswered_and_idle_timeout_counts_from_the_last_receive() -> None:
    _, p = make(items=0)  # idle timeout: kv_engine's default
    assert p.cluster.idle_timeout == DCP_IDLE_TIMEOUT == 360.0
    p.bootstrap(controls={"enable_noop": "true", "set_noop_interval": "10"})
    sent = [d.frame.opaque for _ in range(35) for d in p.tick(10.0)]
    assert sent == [10000001]  # 350 s, one noop, never answered
    assert not p.conn.closed
    p.send(encode("DCP_CONTROL", key="set_priority", value="high", opaque=99))  # anything received counts
    p.tick(359.0)
    assert not p.conn.closed
    p.tick(1.5)
    assert p.conn.closed and "360" in p.conn.close_reason


def test_without_noops_there_is_no_idle_disconnect() -> None:
    _, p = make(items=0)
    p.bootstrap(controls={})
    assert p.tick(10_000.0) == [] and not p.conn.closed


def test_enable_noop_with_another_value_turns_noops_off() -> None:
    _, p = make(items=0)
    p.bootstrap(controls={"enable_noop": "true"})
    assert p.status("DCP_CONTROL", key="enable_noop", value="TRUE") == 0
    assert p.tick(100.0) == [] and not p.conn.noop_enabled


def test_a_dcp_noop_request_from_the_consumer_disconnects() -> None:
    _, p = make(items=0)
    p.bootstrap()
    assert p.send(encode("DCP_NOOP", opaque=5)) == []
    assert p.conn.closed and "DCP_NOOP request" in p.conn.close_reason


@pytest.mark.parametrize("opaque", [10000002, 10000000, 1])
def test_a_noop_reply_with_an_opaque_never_sent_disconnects(opaque: int) -> None:
    _, p = make(items=0)
    p.bootstrap(controls={"enable_noop": "true", "set_noop_interval": "1"})
    assert p.tick(1.0)[0].frame.opaque == 10000001
    p.send(encode("DCP_NOOP", response=True, opaque=opaque))
    assert p.conn.closed and "unexpected DCP_NOOP response" in p.conn.close_reason


def test_malformed_requests() -> None:
    _, p = make()
    p.bootstrap()
    assert p.status("DCP_STREAM_REQ", extras=b"\0" * 10) == 0x04  # wrong extras length
    assert p.status("DCP_CONTROL", key="enable_noop") == 0x04  # empty value
    p.send(b"\x42" * 30)
    assert p.conn.closed


def test_random_bytes_never_raise() -> None:
    rng = random.Random(3)
    for _ in range(200):
        _, p = make(items=2)
        p.bootstrap()
        raw = bytearray(encode(rng.choice(["DCP_STREAM_REQ", "DCP_CONTROL", "HELLO", "STAT", "DCP_CLOSE_STREAM"]), opaque=1))
        for _ in range(rng.randrange(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        p.conn.receive(bytes(raw) + bytes(rng.randrange(256) for _ in range(rng.randrange(40))), 0.0)
        p.conn.data_to_send()
        assert "internal error" not in p.conn.close_reason


# ---------------------------------------------------------------------------
# bounded output: a client that sends requests and never takes the replies


def test_requests_wait_while_the_output_is_backed_up_and_are_answered_in_order_later() -> None:
    cluster, p = make(items=1, output_limit=8 * 1024)
    emap = [encode("GET_ERROR_MAP", value=(2).to_bytes(2, "big"), opaque=i) for i in range(1, 201)]  # ~2.4 KB replies
    reply = len(encode("GET_ERROR_MAP", response=True, value=b"x" * 4000))  # more than one reply
    p.conn.receive(b"".join(emap), p.now)
    assert not p.conn.want_read and p.conn.want_write
    assert p.conn.output_size < cluster.output_limit + reply
    p.conn.tick(p.now + 1)  # time passing handles nothing more while the output is not taken
    assert p.conn.output_size < cluster.output_limit + reply
    opaques: list[int] = []
    while True:
        opaques += [d.frame.opaque for d in p.drain()]
        if not p.conn.want_write:
            break
        p.conn.pump(p.now)
        assert p.conn.output_size < cluster.output_limit + reply
    assert opaques == list(range(1, 201)) and p.conn.want_read


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(prefix=session_states(), frames=st.lists(table_frames(), min_size=1, max_size=12), ticks=st.lists(st.booleans(), max_size=12))
def test_every_state_and_input(prefix: list[bytes], frames: list[bytes], ticks: list[bool]) -> None:
    cluster, p = make(items=6, vbuckets=2, idle_timeout=1e9)
    for f in prefix:
        p.conn.receive(f, p.now)
    p.conn.data_to_send()
    assert not p.conn.closed, p.conn.close_reason
    for i, raw in enumerate(frames):
        magic, opcode, opaque = raw[0], raw[1], int.from_bytes(raw[12:16], "big")
        p.conn.receive(raw, p.now)
        if i < len(ticks) and ticks[i]:
            p.now += 0.5
            p.conn.tick(p.now)
        out = p.conn.data_to_send()
        events = p.dec.feed(out)
        assert all(ev.type == "frame" for ev in events) and sum(len(ev.raw) for ev in events) == len(out)  # every byte a frame
        assert "internal error" not in p.conn.close_reason, p.conn.close_reason
        if p.conn.closed:
            assert any(r in p.conn.close_reason for r in DOCUMENTED_CLOSES), p.conn.close_reason
            assert p.conn not in cluster.connections
            break
        assert p.conn.bytes_outstanding >= 0
        if magic in REQUEST_MAGICS:
            answered = any(ev.magic in RESPONSE_MAGICS and ev.opcode == opcode and ev.opaque == opaque for ev in events)
            assert answered or opcode in UNANSWERED, (Opcode(opcode).name if opcode in spec.COMMANDS else opcode, raw.hex())
        else:
            assert magic in RESPONSE_MAGICS  # any other magic closes the connection


def test_the_dispatch_table_covers_every_opcode() -> None:
    """Every command is handled or answered UnknownCommand; the unanswered ones are not ones that expect a response."""
    assert set(spec.COMMANDS) >= HANDLED_OPCODES and EXPECTS_RESPONSE <= HANDLED_OPCODES
    assert UNANSWERED <= HANDLED_OPCODES and not UNANSWERED & EXPECTS_RESPONSE
    _, p = make()
    p.bootstrap()
    for opcode in sorted(set(spec.COMMANDS) - HANDLED_OPCODES):
        assert p.status(opcode) == Status.UNKNOWN_COMMAND, Opcode(opcode).name


def test_connections_register_with_serials_and_leave_when_closed() -> None:
    cluster, p = make()
    q = Peer(cluster)
    assert (p.conn.serial, q.conn.serial) == (1, 2) and cluster.connections == [p.conn, q.conn]
    p.conn.close("test")
    assert cluster.connections == [q.conn]
    cluster.drop_connections()
    assert q.conn.closed and q.conn.close_reason == "dropped by scenario" and not cluster.connections


@pytest.mark.parametrize("how", ["client closed the connection", "QUIT", "idle"])
def test_every_way_a_connection_closes_ends_its_streams_disconnected_off_the_wire(how: str) -> None:
    """kv_engine ends a closing connection's streams Disconnected (3) and never sends that status: it is journaled only."""
    cluster, p = make(items=4)
    p.bootstrap()
    p.stream_req(0)
    if how == "QUIT":
        p.send(encode("QUIT", opaque=99))
    elif how == "idle":
        p.tick(cluster.idle_timeout + 1)
    else:
        p.conn.close(how)
    assert p.conn.closed
    ends = [e for e in cluster.journal if e["event"] == "stream_end"]
    assert [(e["vb"], e["status"], e["reason"]) for e in ends] == [(0, None, 3)]
    assert "DCP_STREAM_END" not in names(p.drain())
