"""The sans-IO DCP consumer against a scripted server (replies built with encode, requests read with dissect),
against the sans-IO producer (fake clock), and every phase x every kind of incoming frame (Hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpinspect import EncodeError, FrameDecoder, dissect, encode
from dcpinspect.live import consumer as consumer_mod
from dcpinspect.live.cluster import Cluster
from dcpinspect.live.consumer import REPLY_HANDLERS, ConsumerConfig, DcpConsumer
from dcpinspect.live.consumer_states import (
    AWAITS,
    PHASE_TRANSITIONS,
    STREAM_TRANSITIONS,
    ConsumerEvent,
    Phase,
    Request,
    StreamStatus,
)
from dcpinspect.live.consumer_streams import STREAM_MESSAGE_HANDLERS, Handoff
from dcpinspect.live.producer import ProducerConnection
from dcpinspect.live.resume import ResumeState, VbState
from dcpinspect.live.sasl import ScramServer
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Feature, Magic, Opcode, Status, StreamEndStatus
from dcpinspect.protocol.rules import MAX_SEQNO, flow_control_size
from dcpinspect.protocol.session import DEFAULT_NOOP_INTERVAL, STREAM_MESSAGES
from dcpinspect.wire.dissection import Dissection
from dcpinspect.wire.events import Frame

PASSWORD = "s3cret-pw"


def cfg(**kw) -> ConsumerConfig:
    base = {"bucket": "travel", "user": "alice", "password": PASSWORD, "vbuckets": (0,), "buffer_size": 1000}
    base.update(kw)
    return ConsumerConfig(**base)


class Server:
    """A scripted server: it reads what the consumer sent and answers with frames built by encode."""

    def __init__(self, config: ConsumerConfig, address: tuple[str, int] | None = None) -> None:
        self.c = DcpConsumer(config, address=address)
        self.now = 0.0
        self.events: list[ConsumerEvent] = []
        self.decoder = FrameDecoder()
        self.log: list[Dissection] = []

    def sent(self) -> list[Dissection]:
        """Frames the consumer sent since the last call; each must dissect without problems."""
        out = []
        for ev in self.decoder.feed(self.c.data_to_send()):
            assert isinstance(ev, Frame), ev
            d = dissect(ev, self.c.context)
            assert not d.problems, (d.name, d.problems)
            out.append(d)
        self.log += out
        return out

    def one(self, name: str) -> Dissection:
        got = self.sent()
        assert [d.name for d in got] == [name], [d.name for d in got]
        return got[0]

    def reply(self, *frames: bytes, dt: float = 0.01) -> list[ConsumerEvent]:
        self.now += dt
        evs = self.c.receive(b"".join(frames), self.now)
        self.events += evs
        return evs

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


def resp(name: str, req: Dissection, status: int = 0, **kw) -> bytes:
    return encode(name, response=True, opaque=req.frame.opaque, status=status, **kw)


def bootstrap(
    config: ConsumerConfig, *, mechs: bytes = b"PLAIN", high: dict[int, int] | None = None, reject: tuple[str, ...] = ()
) -> Server:
    """Drive the consumer to its stream requests (which stay unread in ``srv.pending``)."""
    s = Server(config)
    hello = s.one("HELLO")
    s.reply(resp("HELLO", hello, value={"features": [{"feature": 0x12}, {"feature": 0x0B}]}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=mechs))
    auth = s.one("SASL_AUTH")
    assert auth.key == b"PLAIN"
    s.reply(resp("SASL_AUTH", auth))
    s.reply(resp("SELECT_BUCKET", s.one("SELECT_BUCKET")))
    if config.to_latest:
        req = s.one("GET_ALL_VB_SEQNOS")
        s.reply(resp("GET_ALL_VB_SEQNOS", req, value={"vb_seqnos": [{"vbucket": vb, "high_seqno": h} for vb, h in (high or {}).items()]}))
    return open_and_controls(s, reject)


def open_and_controls(s: Server, reject: tuple[str, ...] = ()) -> Server:
    """Answer DCP_OPEN and each DCP_CONTROL (EINVAL for the keys in ``reject``); what follows stays in ``s.pending``."""
    s.reply(resp("DCP_OPEN", s.one("DCP_OPEN")))
    while True:
        got = s.sent()
        if not got or got[0].name != "DCP_CONTROL":
            s.pending = got  # type: ignore[attr-defined]
            return s
        assert len(got) == 1
        s.reply(resp("DCP_CONTROL", got[0], status=0x04 if got[0].key_text in reject else 0))


def accept(s: Server, req: Dissection, log: list[tuple[int, int]]) -> list[ConsumerEvent]:
    return s.reply(resp("DCP_STREAM_REQ", req, value=log))


def stream_req(s: Server) -> Dissection:
    got = [d for d in s.pending if d.name == "DCP_STREAM_REQ"]  # type: ignore[attr-defined]
    assert len(got) == 1
    return got[0]


def marker(req: Dissection, start: int, end: int, flags: int = 1) -> bytes:
    return encode(
        "DCP_SNAPSHOT_MARKER",
        extras={"start_seqno": start, "end_seqno": end, "flags": flags},
        vbucket=req.frame.vbucket or 0,
        opaque=req.frame.opaque,
    )


def mutation(req: Dissection, seqno: int, key: str = "k", value: bytes = b"{}") -> bytes:
    return encode(
        "DCP_MUTATION",
        extras={"by_seqno": seqno, "rev_seqno": 1},
        key=key,
        cid=0,
        value=value,
        datatype=1,
        vbucket=req.frame.vbucket or 0,
        opaque=req.frame.opaque,
    )


def stream_end(req: Dissection, status: int = 0) -> bytes:
    return encode("DCP_STREAM_END", extras={"status": status}, vbucket=req.frame.vbucket or 0, opaque=req.frame.opaque)


# --- bootstrap ------------------------------------------------------------------------------


def test_bootstrap_order_one_request_at_a_time() -> None:
    s = bootstrap(cfg(to_latest=True, noop_interval=2.5), high={0: 7, 1: 9})
    names = [d.name for d in s.log]
    assert names == [
        "HELLO",
        "SASL_LIST_MECHS",
        "SASL_AUTH",
        "SELECT_BUCKET",
        "GET_ALL_VB_SEQNOS",
        "DCP_OPEN",
        "DCP_CONTROL",
        "DCP_CONTROL",
        "DCP_CONTROL",
        "DCP_STREAM_REQ",
    ]
    hello = s.log[0]
    assert {f["feature"] for f in hello.body["features"]} >= {0x12, 0x0B}
    assert s.log[3].key == b"travel"
    op = s.log[5]
    assert op.key == b"dcpinspect" and op.extras["flags"] & 0x01
    assert [(d.key_text, d.frame.value) for d in s.log[6:9]] == [
        ("enable_noop", b"true"),
        ("set_noop_interval", b"2.5"),
        ("connection_buffer_size", b"1000"),
    ]
    req = s.log[9]
    assert req.extras["end_seqno"] == 7 and req.extras["start_seqno"] == 0 and req.extras["vb_uuid"] == 0
    assert s.c.phase == Phase.STREAMING and s.c.flow_control and s.c.noop
    assert len({d.frame.opaque for d in s.log}) == len(s.log)  # every request its own opaque


def test_scram_picks_the_strongest_and_verifies_the_server() -> None:
    s = Server(cfg())
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"SCRAM-SHA1 PLAIN SCRAM-SHA512 SCRAM-SHA256"))
    auth = s.one("SASL_AUTH")
    assert auth.key == b"SCRAM-SHA512"
    server = ScramServer("SCRAM-SHA512", {"alice": PASSWORD}, iterations=64)
    s.reply(resp("SASL_AUTH", auth, status=0x21, value=server.first(auth.frame.value)))
    step = s.one("SASL_STEP")
    assert step.key == b"SCRAM-SHA512"
    final = server.final(step.frame.value)  # raises if the proof is wrong
    assert server.user == "alice"
    s.reply(resp("SASL_STEP", step, value=final))
    assert s.one("SELECT_BUCKET").key == b"travel"
    assert "authenticated" in s.kinds()


def test_scram_server_signature_mismatch_fails() -> None:
    s = Server(cfg())
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"SCRAM-SHA256"))
    auth = s.one("SASL_AUTH")
    server = ScramServer("SCRAM-SHA256", {"alice": PASSWORD}, iterations=64)
    s.reply(resp("SASL_AUTH", auth, status=0x21, value=server.first(auth.frame.value)))
    step = s.one("SASL_STEP")
    server.final(step.frame.value)
    s.reply(resp("SASL_STEP", step, value=b"v=AAAA"))
    assert s.c.done and s.c.phase == Phase.FAILED and "signature" in (s.c.failure or "")
    assert s.sent() == []


def test_plain_payload() -> None:
    s = Server(cfg(mechanisms=("PLAIN",)))
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"SCRAM-SHA512 PLAIN"))
    auth = s.one("SASL_AUTH")
    assert auth.key == b"PLAIN" and auth.frame.value == b"\0alice\0" + PASSWORD.encode()


def test_auth_failure_is_an_event_and_never_shows_the_password() -> None:
    c = cfg()
    s = Server(c)
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"PLAIN"))
    s.reply(resp("SASL_AUTH", s.one("SASL_AUTH"), status=0x20))
    assert "auth_failed" in s.kinds() and s.c.done and s.c.phase == Phase.FAILED
    assert "0x20" in (s.c.failure or "")
    assert s.sent() == []
    shown = repr(c) + str(s.c.__dict__) + "".join(map(str, s.events)) + "".join(map(repr, s.events))
    assert PASSWORD not in shown
    assert "alice" in repr(c)


def test_no_common_mechanism() -> None:
    s = Server(cfg())
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"OAUTHBEARER"))
    assert s.c.phase == Phase.FAILED and "OAUTHBEARER" in (s.c.failure or "")


def test_select_bucket_and_open_failures() -> None:
    s = Server(cfg())
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"PLAIN"))
    s.reply(resp("SASL_AUTH", s.one("SASL_AUTH")))
    s.reply(resp("SELECT_BUCKET", s.one("SELECT_BUCKET"), status=0x24))
    assert s.c.phase == Phase.FAILED and "travel" in (s.c.failure or "")


def test_rejected_controls_are_noted_and_switch_features_off() -> None:
    s = bootstrap(cfg(), reject=("connection_buffer_size",))
    assert s.c.rejected_controls == {"connection_buffer_size": 0x04}
    assert not s.c.flow_control and "control_rejected" in s.kinds()
    req = stream_req(s)
    accept(s, req, [(5, 0)])
    s.reply(marker(req, 0, 50), *(mutation(req, i, value=b"x" * 200) for i in range(1, 10)))
    assert all(d.name != "DCP_BUFFER_ACKNOWLEDGEMENT" for d in s.sent())


def test_noop_disabled_drops_its_interval() -> None:
    s = bootstrap(cfg(), reject=("enable_noop",))
    assert [d.key_text for d in s.log if d.name == "DCP_CONTROL"] == ["enable_noop", "connection_buffer_size"]


def test_get_all_vb_seqnos_falls_back_to_stat() -> None:
    s = Server(cfg(to_latest=True, vbuckets=(0, 3)))
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"PLAIN"))
    s.reply(resp("SASL_AUTH", s.one("SASL_AUTH")))
    s.reply(resp("SELECT_BUCKET", s.one("SELECT_BUCKET")))
    s.reply(resp("GET_ALL_VB_SEQNOS", s.one("GET_ALL_VB_SEQNOS"), status=0x81))
    stat = s.one("STAT")
    assert stat.key == b"vbucket-seqno"
    s.reply(
        resp("STAT", stat, key="vb_0:high_seqno", value=b"12"),
        resp("STAT", stat, key="vb_0:uuid", value=b"777"),
        resp("STAT", stat, key="vb_3:high_seqno", value=b"4"),
    )
    assert s.sent() == []
    s.reply(resp("STAT", stat))
    s.reply(resp("DCP_OPEN", s.one("DCP_OPEN")))
    while (got := s.sent())[0].name == "DCP_CONTROL":
        s.reply(resp("DCP_CONTROL", got[0]))
    ends = {d.frame.vbucket: d.extras["end_seqno"] for d in got}
    assert ends == {0: 12, 3: 4}


# --- stream requests from a saved state --------------------------------------------------------


def test_fresh_request() -> None:
    req = stream_req(bootstrap(cfg()))
    assert req.extras == {
        "flags": 0,
        "reserved": 0,
        "start_seqno": 0,
        "end_seqno": MAX_SEQNO,
        "vb_uuid": 0,
        "snap_start_seqno": 0,
        "snap_end_seqno": 0,
    }


def test_resume_mid_snapshot_sends_the_snapshot_bounds() -> None:
    state = ResumeState("travel", {0: VbState(vb_uuid=0xABC, seqno=5, snap_start=3, snap_end=8, failover_log=[(0xABC, 0)])})
    req = stream_req(bootstrap(cfg(resume=state)))
    e = req.extras
    assert (e["start_seqno"], e["snap_start_seqno"], e["snap_end_seqno"], e["vb_uuid"]) == (5, 3, 8, 0xABC)


def test_resume_after_a_complete_snapshot() -> None:
    state = ResumeState("travel", {0: VbState(vb_uuid=0xABC, seqno=8, snap_start=8, snap_end=8, failover_log=[(0xABC, 0)])})
    req = stream_req(bootstrap(cfg(resume=state)))
    e = req.extras
    assert (e["start_seqno"], e["snap_start_seqno"], e["snap_end_seqno"], e["vb_uuid"]) == (8, 8, 8, 0xABC)


def test_to_latest_never_asks_for_an_end_below_its_start() -> None:
    state = ResumeState("travel", {0: VbState(vb_uuid=9, seqno=10, snap_start=10, snap_end=10, failover_log=[(9, 0)])})
    req = stream_req(bootstrap(cfg(resume=state, to_latest=True), high={0: 7}))
    assert req.extras["start_seqno"] == 10 and req.extras["end_seqno"] == 10


def test_stream_ids_and_collection_filter_in_the_value() -> None:
    s = bootstrap(cfg(stream_ids=True, stream_value={"collections": ["8"]}))
    req = stream_req(s)
    assert req.document == {"collections": ["8"], "sid": 1}
    accept(s, req, [(1, 0)])
    frame = encode("DCP_SNAPSHOT_MARKER", extras={"start_seqno": 0, "end_seqno": 1, "flags": 1}, opaque=req.frame.opaque, stream_id=1)
    s.reply(frame, encode("DCP_MUTATION", extras={"by_seqno": 1}, key="a", cid=8, opaque=req.frame.opaque, stream_id=1))
    assert s.c.state.vbuckets[0].seqno == 1


# --- rollback -----------------------------------------------------------------------------------


def _rollback_case(
    log: list[tuple[int, int]], seqno: int, snap: tuple[int, int], rollback_to: int
) -> tuple[Server, Dissection, Dissection]:
    state = ResumeState("travel", {0: VbState(vb_uuid=log[0][0], seqno=seqno, snap_start=snap[0], snap_end=snap[1], failover_log=log)})
    s = bootstrap(cfg(resume=state))
    first = stream_req(s)
    s.reply(resp("DCP_STREAM_REQ", first, status=0x23, value={"rollback_seqno": rollback_to}))
    retry = s.one("DCP_STREAM_REQ")
    return s, first, retry


def test_rollback_worked_example_from_the_docs() -> None:
    # discussion.md: table [(2222,3),(1111,0)], request uuid 1111 start 3 snap {1,4} -> rollback to 1
    s, first, retry = _rollback_case([(1111, 0)], 3, (1, 4), 1)
    assert first.extras["vb_uuid"] == 1111 and first.extras["snap_start_seqno"] == 1 and first.extras["snap_end_seqno"] == 4
    e = retry.extras
    assert (e["start_seqno"], e["vb_uuid"], e["snap_start_seqno"], e["snap_end_seqno"]) == (1, 1111, 1, 1)
    assert retry.frame.opaque != first.frame.opaque
    st = s.c.state.vbuckets[0]
    assert (st.seqno, st.snap_start, st.snap_end, st.failover_log) == (1, 1, 1, [(1111, 0)])
    ev = next(e for e in s.events if e.kind == "rollback")
    assert ev.data["rollback_seqno"] == 1 and ev.data["from_seqno"] == 3


def test_rollback_trims_the_failover_log_and_takes_the_newest_remaining_uuid() -> None:
    s, _, retry = _rollback_case([(3333, 10), (2222, 5), (1111, 0)], 12, (12, 12), 7)
    e = retry.extras
    assert (e["start_seqno"], e["vb_uuid"], e["snap_start_seqno"], e["snap_end_seqno"]) == (7, 2222, 7, 7)
    assert s.c.state.vbuckets[0].failover_log == [(2222, 5), (1111, 0)]


def test_rollback_to_a_branch_point_keeps_that_entry() -> None:
    _, _, retry = _rollback_case([(3333, 10), (2222, 5), (1111, 0)], 12, (11, 14), 10)
    assert (retry.extras["start_seqno"], retry.extras["vb_uuid"]) == (10, 3333)


def test_rollback_to_zero_is_a_fresh_start() -> None:
    s, _, retry = _rollback_case([(3333, 10), (1111, 0)], 12, (12, 12), 0)
    e = retry.extras
    assert (e["start_seqno"], e["vb_uuid"], e["snap_start_seqno"], e["snap_end_seqno"]) == (0, 0, 0, 0)
    assert s.c.state.vbuckets[0].failover_log == []


def test_repeated_rollbacks_then_success_stores_the_servers_log() -> None:
    s, _, retry = _rollback_case([(3333, 10), (2222, 5), (1111, 0)], 12, (12, 12), 7)
    s.reply(resp("DCP_STREAM_REQ", retry, status=0x23, value={"rollback_seqno": 4}))
    again = s.one("DCP_STREAM_REQ")
    assert (again.extras["start_seqno"], again.extras["vb_uuid"]) == (4, 1111)
    accept(s, again, [(4444, 4), (1111, 0)])
    st = s.c.state.vbuckets[0]
    assert st.vb_uuid == 4444 and st.failover_log == [(4444, 4), (1111, 0)] and st.seqno == 4
    assert s.c.streams[0].rollbacks == 2 and s.c.streams[0].status == "streaming"


def test_endless_rollbacks_give_up() -> None:
    state = ResumeState("travel", {0: VbState(vb_uuid=1, seqno=5, snap_start=5, snap_end=5, failover_log=[(1, 0)])})
    s = bootstrap(cfg(resume=state, max_rollbacks=3))
    req = stream_req(s)
    for _ in range(4):
        s.reply(resp("DCP_STREAM_REQ", req, status=0x23, value={"rollback_seqno": 5}))
        got = s.sent()
        if not got:
            break
        req = got[0]
    assert s.c.streams[0].status == "failed" and s.c.done


def test_other_stream_request_errors_stop_that_vbucket_only() -> None:
    s = bootstrap(cfg(vbuckets=(0, 1)))
    reqs = {d.frame.vbucket: d for d in s.pending}  # type: ignore[attr-defined]
    s.reply(resp("DCP_STREAM_REQ", reqs[1], status=0x07))
    accept(s, reqs[0], [(1, 0)])
    assert s.c.streams[1].status == "failed" and "0x07" in (s.c.streams[1].error or "")
    assert s.c.streams[0].status == "streaming" and not s.c.done


# --- snapshots, items, state --------------------------------------------------------------------


def test_state_is_committed_only_at_consistent_points() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    s.reply(marker(req, 0, 3), mutation(req, 1), mutation(req, 2))
    assert s.c.state.vbuckets[0].seqno == 0  # mid-snapshot: not consistent yet
    assert s.c.streams[0].position.seqno == 2
    s.reply(mutation(req, 3))
    st = s.c.state.vbuckets[0]
    assert (st.seqno, st.snap_start, st.snap_end, st.vb_uuid) == (3, 3, 3, 77)
    s.reply(marker(req, 4, 9), mutation(req, 5))
    assert s.c.state.vbuckets[0].seqno == 3
    # the next marker closes the snapshot (seqno 6..9 were deduplicated away): resume inside its bounds
    s.reply(marker(req, 10, 12))
    st = s.c.state.vbuckets[0]
    assert (st.seqno, st.snap_start, st.snap_end) == (5, 4, 9)
    assert s.c.streams[0].counts["mutation"] == 4


def test_snapshot_ack_flag_is_answered_once_the_snapshot_is_in() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    m = marker(req, 1, 2, flags=0x08 | 0x02)
    s.reply(m, mutation(req, 1))
    assert s.sent() == []
    s.reply(mutation(req, 2))
    ack = s.one("DCP_SNAPSHOT_MARKER")
    assert ack.role == "response" and ack.frame.opaque == req.frame.opaque


def test_v22_marker_seqno_advanced_and_sync_writes() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    o = req.frame.opaque
    s.reply(
        encode("DCP_SNAPSHOT_MARKER", extras={"version": 2}, value={"start_seqno": 1, "end_seqno": 6, "flags": 2}, opaque=o),
        encode("DCP_PREPARE", extras={"by_seqno": 1, "durability_level": 1}, key="p", cid=0, cas=5, opaque=o),
        encode("DCP_COMMIT", extras={"prepared_seqno": 1, "commit_seqno": 2}, key="p", cid=0, opaque=o),
        encode("DCP_PREPARE", extras={"by_seqno": 3, "durability_level": 1}, key="q", cid=0, cas=6, opaque=o),
        encode("DCP_ABORT", extras={"prepared_seqno": 3, "abort_seqno": 4}, key="q", cid=0, opaque=o),
    )
    assert s.c.streams[0].position.seqno == 4 and s.c.state.vbuckets[0].seqno == 0
    s.reply(encode("DCP_SEQNO_ADVANCED", extras={"seqno": 6}, opaque=o))
    assert s.c.state.vbuckets[0].seqno == 6
    kinds = s.kinds()
    assert {"prepare", "commit", "abort", "seqno_advanced"} <= set(kinds)
    assert "malformed" not in kinds


def test_system_event_is_an_item() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    o = req.frame.opaque
    s.reply(
        marker(req, 1, 1),
        encode(
            "DCP_SYSTEM_EVENT",
            extras={"by_seqno": 1, "event": 0, "version": 0},
            key="c1",
            value={"manifest_uid": 2, "scope_id": 0, "collection_id": 8},
            opaque=o,
        ),
    )
    assert s.c.state.vbuckets[0].seqno == 1 and "system_event" in s.kinds()


def test_oso_snapshot_resume_points() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    o = req.frame.opaque
    s.reply(encode("DCP_OSO_SNAPSHOT", extras={"flags": 1}, opaque=o), mutation(req, 7), mutation(req, 2), mutation(req, 5))
    assert s.c.state.vbuckets[0].seqno == 0 and "malformed" not in s.kinds()
    s.reply(encode("DCP_OSO_SNAPSHOT", extras={"flags": 2}, opaque=o))
    st = s.c.state.vbuckets[0]
    assert (st.seqno, st.snap_start, st.snap_end) == (7, 7, 7)
    s.reply(encode("DCP_SEQNO_ADVANCED", extras={"seqno": 9}, opaque=o))
    assert s.c.state.vbuckets[0].seqno == 9


def test_stream_breaking_inside_oso_resumes_from_before_it() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    o = req.frame.opaque
    s.reply(marker(req, 1, 2), mutation(req, 1), mutation(req, 2))
    s.reply(encode("DCP_OSO_SNAPSHOT", extras={"flags": 1}, opaque=o), mutation(req, 9), stream_end(req, 4))
    again = s.one("DCP_STREAM_REQ")
    assert again.extras["start_seqno"] == 2 and again.extras["snap_start_seqno"] == 2 and again.extras["vb_uuid"] == 77


# --- flow control, noops ---------------------------------------------------------------------------


def test_buffer_ack_counts_every_stream_message_like_the_producer() -> None:
    s = bootstrap(cfg(buffer_size=1000, ack_ratio=0.5))
    req = stream_req(s)
    accept(s, req, [(77, 0)])  # responses to our own requests are not counted
    o = req.frame.opaque
    m = marker(req, 1, 100)
    mut = mutation(req, 1, key="abc", value=b"v" * 100)
    prep = encode("DCP_PREPARE", extras={"by_seqno": 2, "durability_level": 1}, key="p", cid=0, value=b"x", cas=1, opaque=o)
    noop = encode("DCP_NOOP", opaque=10000001)
    assert len(m) == 44 and len(mut) == 55 + 4 + 100 and len(prep) == 24 + 31 + 2 + 1
    prep_frame, noop_frame = FrameDecoder().feed(prep + noop)
    assert isinstance(prep_frame, Frame) and isinstance(noop_frame, Frame)
    assert flow_control_size(prep_frame.magic, prep_frame.opcode, prep_frame.length) == 57 + 2 + 1  # a prepare counts 2 more
    assert flow_control_size(noop_frame.magic, noop_frame.opcode, noop_frame.length) == 0
    s.reply(m, mut, prep, noop)
    assert s.c.unacked == 44 + 159 + 60
    assert [d.name for d in s.sent()] == ["DCP_NOOP"]  # 263 < 500: no ack yet; the noop is answered
    muts = [mutation(req, 3 + i, key="abc", value=b"v" * 100) for i in range(2)]
    s.reply(*muts)  # 263 + 318 = 581 >= 500
    ack = s.one("DCP_BUFFER_ACKNOWLEDGEMENT")
    assert ack.extras["buffer_bytes"] == 581 and s.c.unacked == 0 and s.c.acked_total == 581
    s.reply(mutation(req, 5, key="abc", value=b"v" * 100))
    assert s.c.unacked == 159 and s.sent() == []


def test_one_message_larger_than_the_buffer_is_acked_at_once() -> None:
    s = bootstrap(cfg(buffer_size=100))
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    s.reply(marker(req, 1, 1), mutation(req, 1, value=b"z" * 300))
    assert s.one("DCP_BUFFER_ACKNOWLEDGEMENT").extras["buffer_bytes"] == 44 + 55 + 2 + 300


def test_noop_reply_echoes_the_opaque() -> None:
    s = bootstrap(cfg())
    stream_req(s)
    s.reply(encode("DCP_NOOP", opaque=10000007))
    reply = s.one("DCP_NOOP")
    assert reply.role == "response" and reply.frame.opaque == 10000007 and reply.frame.status == 0


def test_silence_for_two_noop_intervals_is_a_dead_connection() -> None:
    s = bootstrap(cfg(noop_interval=1.0))
    stream_req(s)
    assert s.c.tick(s.now + 1.5) == []
    evs = s.c.tick(s.now + 2.5)
    assert [e.kind for e in evs] == ["error"] and s.c.done


def test_bootstrap_timeout() -> None:
    s = Server(cfg(response_timeout=5))
    s.one("HELLO")
    assert s.c.tick(4) == [] and not s.c.done
    assert s.c.tick(6)[0].kind == "error" and s.c.done


# --- stream end ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (0, "ended"),
        (1, "ended"),
        (2, "again"),
        (3, "failed"),
        (4, "again"),
        (5, "again"),
        (6, "again"),
        (7, "ended"),
        (8, "ended"),  # LostPrivileges: stop
        (99, "failed"),
    ],
)
def test_stream_end_reasons(status: int, outcome: str) -> None:
    s = bootstrap(cfg(vbuckets=(0, 1)))
    reqs = {d.frame.vbucket: d for d in s.pending}  # type: ignore[attr-defined]
    req = reqs[0]
    accept(s, req, [(77, 0)])
    accept(s, reqs[1], [(78, 0)])
    s.reply(marker(req, 1, 2), mutation(req, 1), mutation(req, 2))
    s.reply(stream_end(req, status))
    st = s.c.streams[0]
    sent = s.sent()
    if outcome == "again":
        assert st.status == "requested" and [d.name for d in sent] == ["DCP_STREAM_REQ"]
        e = sent[0].extras
        assert (e["start_seqno"], e["snap_start_seqno"], e["snap_end_seqno"], e["vb_uuid"]) == (2, 2, 2, 77)
        assert sent[0].frame.opaque != req.frame.opaque
    else:
        assert st.status == outcome and sent == []
    assert s.c.state.vbuckets[0].seqno == 2
    assert not s.c.done  # vb 1 still streams


def test_done_when_every_stream_reached_its_end() -> None:
    s = bootstrap(cfg(to_latest=True, vbuckets=(0, 1)), high={0: 2, 1: 0})
    reqs = {d.frame.vbucket: d for d in s.pending}  # type: ignore[attr-defined]
    assert reqs[1].extras["end_seqno"] == 0
    accept(s, reqs[0], [(77, 0)])
    accept(s, reqs[1], [(78, 0)])
    s.reply(stream_end(reqs[1], 0))
    assert not s.c.done
    s.reply(marker(reqs[0], 0, 2), mutation(reqs[0], 1), mutation(reqs[0], 2), stream_end(reqs[0], 0))
    assert s.c.done and s.c.phase == Phase.DONE and s.kinds().count("done") == 1
    assert {vb: v.seqno for vb, v in s.c.state.vbuckets.items()} == {0: 2, 1: 0}


def test_close_streams() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    s.c.close_streams()
    close = s.one("DCP_CLOSE_STREAM")
    assert close.frame.vbucket == 0 and s.c.done


def test_close_streams_waits_for_stream_end_closed_when_asked_for() -> None:
    """With send_stream_end_on_client_close_stream the producer confirms a close with STREAM_END(Closed)."""
    s = bootstrap(cfg(controls=(("send_stream_end_on_client_close_stream", "true"),)))
    assert s.c.end_on_close
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    s.reply(marker(req, 1, 2), mutation(req, 1))
    s.c.close_streams(s.now)
    s.c.close_streams(s.now)  # again (the client loop does): nothing more is sent
    assert [d.name for d in s.sent()] == ["DCP_CLOSE_STREAM"] and not s.c.done
    s.reply(mutation(req, 2))  # still in flight: applied
    assert s.c.state.vbuckets[0].seqno == 2 and not s.c.done
    s.reply(stream_end(req, 1))
    assert s.c.done and s.c.streams[0].end_reason == "Closed (closed by client)"
    assert "rerequest" not in s.kinds()


def test_close_streams_gives_up_waiting_after_the_response_timeout() -> None:
    s = bootstrap(cfg(controls=(("send_stream_end_on_client_close_stream", "true"),)))
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    s.c.close_streams(s.now)
    assert not s.c.done
    s.c.tick(s.now + s.c.config.response_timeout + 1)
    assert s.c.done and "no STREAM_END" in (s.c.streams[0].end_reason or "")


def test_connection_lost() -> None:
    s = bootstrap(cfg())
    evs = s.c.connection_lost()
    assert evs[-1].kind == "error" and s.c.done and "closed" in (s.c.failure or "")


# --- resume state JSON -------------------------------------------------------------------------------


def test_state_json_round_trip() -> None:
    st = ResumeState("b", {0: VbState(1, 5, 3, 8, [(1, 0)]), 1023: VbState(2**64 - 1, 2**64 - 2, 0, 2**64 - 2, [(2**64 - 1, 7), (3, 0)])})
    text = st.to_json()
    back = ResumeState.from_json(text)
    assert back == st and back.vbuckets[1023].failover_log[0] == (2**64 - 1, 7)
    assert ResumeState.from_json(text.encode()) == st


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"version": 2, "vbuckets": {}}',
        '{"version": 1, "vbuckets": {"x": {}}}',
        '{"version": 1, "vbuckets": {"0": {"seqno": -1}}}',
        '{"version": 1, "vbuckets": {"0": {"seqno": 5, "snap_start": 6, "snap_end": 9}}}',
        '{"version": 1, "vbuckets": {"0": {"failover_log": [[1]]}}}',
        '{"version": 1, "vbuckets": {"0": {"seqno": "3"}}}',
    ],
)
def test_bad_state_json_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        ResumeState.from_json(text)


def test_state_after_a_session_resumes_the_next_one() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    s.reply(marker(req, 0, 3), mutation(req, 1), mutation(req, 2), mutation(req, 3), marker(req, 4, 6), mutation(req, 4))
    saved = ResumeState.from_json(s.c.state.to_json())
    again = stream_req(bootstrap(cfg(resume=saved)))
    e = again.extras
    assert (e["start_seqno"], e["vb_uuid"], e["snap_start_seqno"], e["snap_end_seqno"]) == (3, 77, 3, 3)


# --- malformed input ----------------------------------------------------------------------------------


def test_malformed_frames_become_events() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    o = req.frame.opaque
    bad = [
        encode("DCP_MUTATION", extras=b"\x00" * 5, key="k", opaque=o),  # extras too short
        encode("DCP_SNAPSHOT_MARKER", extras=b"\x00\x09", opaque=o),
        encode("DCP_STREAM_END", extras=b"", opaque=o),
        encode("DCP_NOOP", overrides={"body_length": 3}) + b"abc",
        encode("DCP_STREAM_REQ", response=True, opaque=o, value=b"\x01\x02"),  # stale / odd
        encode("DCP_MUTATION", extras={"by_seqno": 1}, key="k", cid=0, opaque=0xDEAD),  # no such stream
        encode("HELLO", response=True, opaque=0x7777),
    ]
    for frame in bad:
        s.reply(frame)
    kinds = s.kinds()
    assert kinds.count("malformed") >= 3 and "unexpected" in kinds and not s.c.done
    s.sent()  # whatever was answered dissects cleanly
    # bytes that are not frames: the framing is lost, replies and stream ends may be gone - the connection fails
    s.reply(b"\xff" * 30, encode("DCP_NOOP", opaque=5))
    assert s.c.phase == Phase.FAILED and "not frames" in (s.c.failure or "")
    assert s.sent() == []  # nothing acted upon after the failure (the noop is not answered)


def test_random_bytes_never_raise() -> None:
    rng = random.Random(1234)
    s = bootstrap(cfg(vbuckets=(0, 1)))
    reqs = list(s.pending)  # type: ignore[attr-defined]
    accept(s, reqs[0], [(1, 0)])
    good = [marker(reqs[0], 1, 5), mutation(reqs[0], 1), stream_end(reqs[0], 2), encode("DCP_NOOP", opaque=3)]
    for _ in range(300):
        frame = bytearray(rng.choice(good))
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        s.reply(bytes(frame[: rng.randint(1, len(frame))]) if rng.random() < 0.3 else bytes(frame))
        s.c.tick(s.now)
        for ev in FrameDecoder().feed(s.c.data_to_send()):
            assert isinstance(ev, Frame)
            assert not dissect(ev, s.c.context).problems


# --- against the project's sans-IO producer (no sockets) -----------------------------------------


def _pair(cluster: Cluster, config: ConsumerConfig, limit: int = 20000, node: int = 0) -> tuple[DcpConsumer, list[ConsumerEvent]]:
    prod = ProducerConnection(cluster, node=node)
    cons = DcpConsumer(config)
    dec = FrameDecoder()
    now = 0.0
    evs: list[ConsumerEvent] = []
    for _ in range(limit):
        out = cons.data_to_send()
        for ev in dec.feed(out):
            assert isinstance(ev, Frame) and not dissect(ev, cons.context).problems
        if out:
            prod.receive(out, now)
        prod.tick(now)
        data = prod.data_to_send()
        if data:
            evs += cons.receive(data, now)
        evs += cons.tick(now)
        if cons.done or prod.closed:
            break
        now += 0.01
    return cons, evs


def test_against_the_producer_to_latest_then_failover_and_rollback() -> None:
    """Node 1's vbuckets; vbucket 1 fails over to node 0, losing 3 items the consumer has: resumed there, it rolls back."""
    cluster = Cluster({"alice": PASSWORD}, seed=3, nodes=2)
    bucket = cluster.create_bucket("travel", vbuckets=4, items=200)
    mine = (1, 3)
    assert [bucket.vbucket_map()[vb][0] for vb in mine] == [1, 1]
    config = cfg(vbuckets=mine, to_latest=True, buffer_size=4000)
    c, evs = _pair(cluster, config, node=1)
    kinds = [e.kind for e in evs]
    assert c.phase == Phase.DONE, c.failure
    highs = {vb: bucket.vbuckets[vb].high_seqno for vb in mine}
    assert kinds.count("mutation") == sum(highs.values()) and kinds.count("buffer_ack") >= 1
    assert not {"malformed", "unexpected", "control_rejected", "error"} & set(kinds)
    state = c.state
    assert {vb: st.seqno for vb, st in state.vbuckets.items()} == highs
    assert c.acked_total + c.unacked == c.consumed_total
    # vbucket 1 fails over to node 0 losing 3 items the consumer has; new writes land everywhere
    bucket.failover(1, lose=3)
    for i in range(10):
        bucket.mutate(f"new-{i}", {"i": i})
    c2, evs2 = _pair(cluster, cfg(vbuckets=(1,), to_latest=True, resume=state), node=0)
    assert c2.phase == Phase.DONE, c2.failure
    rb = [e for e in evs2 if e.kind == "rollback"]
    assert [e.vbucket for e in rb] == [1] and rb[0].data["rollback_seqno"] <= state.vbuckets[1].seqno - 3
    assert c2.state.vbuckets[1].seqno == bucket.vbuckets[1].high_seqno
    assert c2.state.vbuckets[1].vb_uuid == bucket.vbuckets[1].failover_log[0][0]
    assert c2.state.vbuckets[3] == state.vbuckets[3]  # not streamed here: kept as it was
    assert [e.kind for e in evs2].count("mutation") == bucket.vbuckets[1].high_seqno - rb[0].data["rollback_seqno"]


def test_against_the_producer_with_scram_and_stream_ids() -> None:
    cluster = Cluster({"alice": PASSWORD}, seed=5)
    cluster.create_bucket("travel", vbuckets=2, items=30)
    c, evs = _pair(cluster, cfg(vbuckets=(0, 1), to_latest=True, stream_ids=True))
    assert c.phase == Phase.DONE, c.failure
    assert c.mechanism == "SCRAM-SHA512" and c.context.stream_ids
    assert [e.kind for e in evs].count("mutation") == 30


# --- hostile bootstrap replies: every path ends in an error or a timeout ---------------------------


def _to_scram_first(mech: str = "SCRAM-SHA256", **kw) -> tuple[Server, Dissection, str]:
    s = Server(cfg(**kw))
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=mech.encode()))
    auth = s.one("SASL_AUTH")
    nonce = auth.frame.value.decode().split("r=", 1)[1]
    return s, auth, nonce


@pytest.mark.parametrize("iterations", [10**30, 2**31 - 1, 100_001])
def test_scram_iteration_count_above_the_limit_fails_at_once(iterations: int) -> None:
    """A server-first with i=10**30 made pbkdf2 raise after the request had left the pending set: the client hung."""
    s, auth, nonce = _to_scram_first()
    s.reply(resp("SASL_AUTH", auth, status=0x21, value=f"r={nonce}srv,s=QUJDRA==,i={iterations}".encode()))
    assert s.c.phase == Phase.FAILED and "above the limit 100000" in (s.c.failure or "")
    assert [e.kind for e in s.events[-2:]] == ["auth_failed", "error"]


@pytest.mark.parametrize(
    ("server_first", "why"),
    [
        ("r={n}srv,s=QUJDRA==", "no i="),
        ("s=QUJDRA==,i=4096", "no r="),
        ("r={n}srv,i=4096", "no s="),
        ("r={n}srv,s=not*base64,i=4096", "bad base64 in the salt"),
        ("r={n}srv,s=,i=4096", "empty salt"),
        ("r=someone-else,s=QUJDRA==,i=4096", "does not extend"),
        ("r={n},s=QUJDRA==,i=4096", "does not extend"),
        ("r={n}srv,s=QUJDRA==,i=0", "bad iteration count"),
        ("r={n}srv,s=QUJDRA==,i=-5", "bad iteration count"),
        ("r={n}srv,s=QUJDRA==,i=4096,m=ext", "not supported"),
        ("garbage", "malformed SCRAM attribute"),
    ],
)
def test_malformed_scram_server_first_is_a_clear_error(server_first: str, why: str) -> None:
    s, auth, nonce = _to_scram_first()
    s.reply(resp("SASL_AUTH", auth, status=0x21, value=server_first.format(n=nonce).encode()))
    assert s.c.phase == Phase.FAILED and why in (s.c.failure or ""), s.c.failure
    assert s.sent() == []


@pytest.mark.parametrize(
    ("server_final", "why"),
    [
        (b"", "malformed SCRAM attribute"),
        (b"x=1", "no v="),
        (b"v=***", "bad base64 in the server signature"),
        (b"e=invalid-proof", "reports an error: invalid-proof"),
        (b"v=AAAA", "does not verify"),
    ],
)
def test_malformed_scram_server_final_is_a_clear_error(server_final: bytes, why: str) -> None:
    s, auth, _ = _to_scram_first()
    server = ScramServer("SCRAM-SHA256", {"alice": PASSWORD}, iterations=64)
    s.reply(resp("SASL_AUTH", auth, status=0x21, value=server.first(auth.frame.value)))
    step = s.one("SASL_STEP")
    server.final(step.frame.value)
    s.reply(resp("SASL_STEP", step, value=server_final))
    assert s.c.phase == Phase.FAILED and why in (s.c.failure or ""), s.c.failure


def test_any_exception_in_a_reply_handler_fails_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setitem(REPLY_HANDLERS, Request.SELECT_BUCKET, broken)
    s = Server(cfg())
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"PLAIN"))
    s.reply(resp("SASL_AUTH", s.one("SASL_AUTH")))
    s.reply(resp("SELECT_BUCKET", s.one("SELECT_BUCKET")))
    assert s.c.phase == Phase.FAILED and s.c.failure == "cannot handle the SELECT_BUCKET reply: RuntimeError: boom"


def test_a_bootstrap_with_nothing_pending_still_times_out() -> None:
    """Safety net: a bootstrap phase that waits for nothing (a mishandled reply) ends after the response timeout."""
    s = Server(cfg(response_timeout=5))
    s.one("HELLO")
    s.c._pending.clear()
    assert s.c.tick(4) == [] and not s.c.done
    assert s.c.tick(6)[0].kind == "error" and "stalled" in (s.c.failure or "")


def test_a_stream_request_never_answered_fails_that_vbucket_after_the_response_timeout() -> None:
    """Without noops (rejected) nothing else would ever end the wait."""
    s = bootstrap(cfg(vbuckets=(0, 1), response_timeout=5), reject=("enable_noop",))
    reqs = {d.frame.vbucket: d for d in s.pending}  # type: ignore[attr-defined]
    accept(s, reqs[0], [(1, 0)])
    s.reply(marker(reqs[0], 0, 1), mutation(reqs[0], 1), stream_end(reqs[0]))
    assert s.c.streams[0].status == "ended" and not s.c.done
    assert s.c.tick(s.now + 4) == [] and not s.c.done
    evs = s.c.tick(s.now + 6)
    assert s.c.streams[1].status == "failed" and "no reply to the stream request" in (s.c.streams[1].error or "")
    assert s.c.phase == Phase.DONE and "done" in [e.kind for e in evs]
    s.reply(resp("DCP_STREAM_REQ", reqs[1], value=[(2, 0)]))  # a late answer changes nothing
    assert s.c.streams[1].status == "failed" and s.kinds()[-1] == "unexpected"


def test_a_stat_reply_that_never_ends_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_mod, "MAX_STAT_KEYS", 10)
    s = Server(cfg(to_latest=True))
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"PLAIN"))
    s.reply(resp("SASL_AUTH", s.one("SASL_AUTH")))
    s.reply(resp("SELECT_BUCKET", s.one("SELECT_BUCKET")))
    s.reply(resp("GET_ALL_VB_SEQNOS", s.one("GET_ALL_VB_SEQNOS"), status=0x81))
    stat = s.one("STAT")
    s.reply(*(resp("STAT", stat, key=f"vb_{i}:high_seqno", value=b"1") for i in range(11)))
    assert s.c.phase == Phase.FAILED and "more than 10 keys" in (s.c.failure or "")


def test_server_text_in_errors_is_escaped() -> None:
    evil = "\x1b]0;owned\x07\x1b[2J"
    s = Server(cfg())
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=f"EVIL{evil}".encode()))
    assert s.c.phase == Phase.FAILED and "\\x1b]0;owned\\x07" in (s.c.failure or "")
    s = Server(cfg())
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": []}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"PLAIN"))
    s.reply(resp("SASL_AUTH", s.one("SASL_AUTH"), status=0x20, value=evil.encode()))
    assert "\\x1b[2J" in (s.c.failure or "")
    s = bootstrap(cfg())
    s.reply(resp("DCP_STREAM_REQ", stream_req(s), status=0x07, value=evil.encode()))
    assert "\\x1b]0;owned" in (s.c.streams[0].error or "")
    for text in [s.c.streams[0].error or ""] + [str(e) for e in s.events]:
        assert not any(ord(ch) < 0x20 for ch in text), text


# --- stopping mid-stream, against the producer with a fake clock --------------------------------------


def test_stop_mid_stream_against_the_producer_keeps_every_consistent_point() -> None:
    """close_streams while items are still coming: the producer closes the streams, the state is the last consistent point."""
    cluster = Cluster({"alice": PASSWORD}, seed=9)
    bucket = cluster.create_bucket("travel", vbuckets=2, items=400)
    prod = ProducerConnection(cluster)
    cons = DcpConsumer(cfg(vbuckets=(0, 1), buffer_size=3000))
    now, evs = 0.0, []
    while sum(e.kind == "mutation" for e in evs) < 100:  # a fake clock: the producer and the consumer take turns
        prod.receive(cons.data_to_send(), now)
        evs += cons.receive(prod.data_to_send(), now) + cons.tick(now)
        now += 0.01
    assert not cons.done
    evs += cons.close_streams(now)
    prod.receive(cons.data_to_send(), now)
    assert cons.done and cons.phase == Phase.DONE and not prod.streams  # both streams closed on the producer too
    checkpoints = {e.vbucket: e.data["seqno"] for e in evs if e.kind == "checkpoint"}
    assert {vb: v.seqno for vb, v in cons.state.vbuckets.items()} == checkpoints
    assert all(0 < v.seqno < bucket.vbuckets[vb].high_seqno for vb, v in cons.state.vbuckets.items())
    assert [st.end_reason for st in cons.streams.values()] == ["Closed (by client)"] * 2


# --- every phase x every kind of incoming frame (h2's test_state_machines) ----------------------------

_REPLY_VALUES: dict[str, object] = {
    "HELLO": {"features": [{"feature": Feature.COLLECTIONS}, {"feature": Feature.JSON}]},
    "SASL_LIST_MECHS": b"PLAIN",
    "GET_ALL_VB_SEQNOS": {"vb_seqnos": [{"vbucket": 0, "high_seqno": 5}, {"vbucket": 1, "high_seqno": 0}]},
    "GET_CLUSTER_CONFIG": {
        "rev": 1,
        "nodesExt": [{"services": {"kv": 11210}, "hostname": "$HOST"}],
        "vBucketServerMap": {"vBucketMap": [[0], [0]]},
    },
}


def _drive_to(phase: Phase, closing: bool = False) -> Server:
    """A consumer brought to ``phase`` along the ordinary path (a scripted server answering every request).

    Streaming, one stream streams (half of its snapshot received) and the other is requested; or, ``closing``,
    the client stopped and the first awaits its STREAM_END(Closed).
    """
    config = cfg(to_latest=True, vbuckets=(0, 1), mechanisms=("PLAIN",), controls=(("send_stream_end_on_client_close_stream", "true"),))
    s = Server(config, address=("127.0.0.1", 11210))  # it knows its address: it asks for the cluster map
    if phase is Phase.FAILED:
        s.reply(resp("HELLO", s.one("HELLO"), status=Status.EINVAL))
        assert s.c.phase is Phase.FAILED
        return s
    target = Phase.STREAMING if phase is Phase.DONE else phase
    while s.c.phase is not target:
        (req,) = s.sent()
        s.reply(resp(req.name, req, value=_REPLY_VALUES.get(req.name)))
    if phase is Phase.STREAMING:
        req = next(d for d in s.sent() if d.frame.vbucket == 0)
        accept(s, req, [(77, 0)])
        s.reply(marker(req, 1, 5), mutation(req, 1))
        if closing:
            s.c.close_streams(s.now)
            assert [st.status for st in s.c.streams.values()] == [StreamStatus.CLOSING, StreamStatus.ENDED]
    if phase is Phase.DONE:
        s.c.close_streams(s.now)
    s.sent()  # what the consumer sent is in the log, its output empty
    assert s.c.phase is phase
    return s


_RESPONSE_MAGICS = frozenset((Magic.CLIENT_RESPONSE, Magic.ALT_CLIENT_RESPONSE))
_REQUEST_MAGICS = frozenset((Magic.CLIENT_REQUEST, Magic.ALT_CLIENT_REQUEST))


@st.composite
def _incoming(draw: st.DrawFn, s: Server) -> bytes:
    """One frame from the server: any opcode (the table's and unknown ones), any magic, any status, an opaque
    that is awaited / a live stream's / one the consumer used / random, and default or random extras and value."""
    op = draw(st.one_of(st.sampled_from(sorted(spec.COMMANDS)), st.integers(0, 0xFF)))
    magic = draw(st.sampled_from(list(Magic)))
    known = sorted({d.frame.opaque for d in s.log} | set(s.c.awaiting) | set(s.c.tracker.by_opaque))
    opaque = draw(st.one_of(st.sampled_from(known), st.integers(0, 2**32 - 1)))
    status = draw(st.one_of(st.sampled_from(list(Status)), st.integers(0, 0xFFFF)))
    vbucket = draw(st.sampled_from([0, 1, 9]))
    extras = draw(st.one_of(st.none(), st.binary(max_size=40)))
    value = draw(st.one_of(st.none(), st.binary(max_size=40)))
    response = magic in _RESPONSE_MAGICS
    try:
        return encode(op, response=response, magic=magic, status=status, opaque=opaque, vbucket=vbucket, extras=extras, value=value)
    except EncodeError:  # the value does not fit the command's layout: as raw bytes after a bare header
        return encode(op, response=response, magic=magic, status=status, opaque=opaque, vbucket=vbucket, variant=None, extras=extras)


@st.composite
def _case(draw: st.DrawFn) -> tuple[Phase, Server, bytes]:
    phase = draw(st.sampled_from(list(Phase)))
    s = _drive_to(phase, closing=phase is Phase.STREAMING and draw(st.booleans()))  # afresh each time (about a millisecond)
    return phase, s, draw(_incoming(s))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_every_phase_takes_every_frame(case: tuple[Phase, Server, bytes]) -> None:
    """Nothing raises (a move outside the tables would: TransitionError), and unexpected input becomes an event."""
    phase, s, raw = case
    (frame,) = FrameDecoder().feed(raw)
    assert isinstance(frame, Frame)
    awaited = s.c.awaiting.get(frame.opaque)
    asked = {d.frame.opaque: d.frame.opcode for d in s.log}.get(frame.opaque)
    stream = s.c.tracker.by_opaque.get(frame.opaque)
    evs = s.c.receive(raw, s.now + 0.01)
    kinds = [e.kind for e in evs]
    out = s.c.data_to_send()
    assert s.c.phase in PHASE_TRANSITIONS[phase] | {phase}
    if phase is Phase.FAILED:
        assert evs == [] and out == b""  # nothing is acted upon after a fatal failure
    elif frame.magic in _RESPONSE_MAGICS:
        if awaited is None or asked != frame.opcode:  # no request of ours has this opaque and opcode
            assert "unexpected" in kinds, kinds
        else:  # the reply to what the consumer asked: it moves on, or says why not (a STAT reply may take several)
            assert evs or out or s.c.phase is not phase or awaited is Request.STAT, (awaited, kinds)
    elif frame.magic in _REQUEST_MAGICS:
        if frame.opcode == Opcode.DCP_NOOP:
            assert kinds == ["noop"] and FrameDecoder().feed(out)[0].opcode == Opcode.DCP_NOOP  # type: ignore[union-attr]
        elif stream is None or frame.vbucket != stream.vbucket or frame.opcode not in STREAM_MESSAGES:
            assert "unexpected" in kinds, kinds
        else:  # a message on a live stream: counted, or malformed
            assert evs, kinds
    else:  # a server request or response (the other two magics)
        assert "unexpected" in kinds, kinds
    assert all(isinstance(ev, Frame) for ev in FrameDecoder().feed(out))
    # then time passes, the client stops, the connection drops: still nothing raises, and it ends
    s.c.tick(s.now + 1000)
    s.c.close_streams(s.now + 1000)
    s.c.connection_lost()
    assert s.c.done


def test_the_transition_tables_cover_every_state_and_input() -> None:
    assert set(PHASE_TRANSITIONS) == set(Phase) == set(AWAITS)
    assert set(STREAM_TRANSITIONS) == set(StreamStatus)
    assert all(moves <= set(Phase) for moves in PHASE_TRANSITIONS.values())
    assert all(moves <= set(StreamStatus) for moves in STREAM_TRANSITIONS.values())
    ends = {p for p, moves in PHASE_TRANSITIONS.items() if not moves}
    assert ends == {Phase.DONE, Phase.FAILED} and all(not AWAITS[p] for p in ends)
    assert {s for s, moves in STREAM_TRANSITIONS.items() if not moves} == {StreamStatus.ENDED, StreamStatus.FAILED, StreamStatus.MOVED}
    reach: set[Phase] = set()
    todo = [Phase.HELLO]
    while todo:
        p = todo.pop()
        if p not in reach:
            reach.add(p)
            todo += PHASE_TRANSITIONS[p]
    assert reach == set(Phase)  # every phase is reachable from the first
    assert set(REPLY_HANDLERS) == set(Request) == set().union(*AWAITS.values())  # every kind of request is sent and handled
    assert set(STREAM_MESSAGE_HANDLERS) == STREAM_MESSAGES  # every stream message has a handler
    assert all(_drive_to(p).c.phase is p for p in Phase)  # and the Hypothesis test above starts from each phase


# --- issue 14: acknowledgements never exceed what was received ------------------------------------


def _acked(raw: bytes) -> tuple[int, list[Frame]]:
    """The bytes a consumer's output acknowledges, and its frames."""
    frames = [f for f in FrameDecoder().feed(raw) if isinstance(f, Frame)]
    return sum(int.from_bytes(f.extras[:4], "big") for f in frames if f.opcode == Opcode.DCP_BUFFER_ACKNOWLEDGEMENT), frames


@st.composite
def _stream_traffic(draw: st.DrawFn) -> list[tuple[str, int]]:
    """A producer's output on one stream: markers, items of any size, prepares, seqno-advanced, OSO, noops, stray replies."""
    kinds = st.sampled_from(["marker", "mutation", "prepare", "advanced", "oso", "noop", "reply", "unreadable", "hold", "release"])
    return draw(st.lists(st.tuples(kinds, st.integers(0, 3000)), min_size=1, max_size=60))


@settings(max_examples=150, deadline=None)
@given(_stream_traffic(), st.integers(1, 5000), st.floats(0.01, 1.0))
def test_acks_never_exceed_what_was_received(traffic: list[tuple[str, int]], buffer_size: int, ratio: float) -> None:
    """After every chunk from the server, the bytes acknowledged so far are at most the flow-control sizes received so far
    (kv_engine docs/dcp flow-control.md); once acks are not held, everything at or above the threshold is acknowledged."""
    s = bootstrap(cfg(buffer_size=buffer_size, ack_ratio=ratio))
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    o, seqno, received, acked = req.frame.opaque, 0, 0, 0
    for kind, size in traffic:
        if kind in ("hold", "release"):  # a stalled consumer, then one that catches up (acks held back go out on a tick)
            s.c.hold_acks = kind == "hold"
            s.c.tick(s.now)
            got, _ = _acked(s.c.data_to_send())
            acked += got
            assert acked <= received
            continue
        seqno += 1
        if kind == "marker":
            frame = marker(req, seqno, seqno + size % 5)
        elif kind == "mutation":
            frame = mutation(req, seqno, key=f"k{size}", value=b"v" * size)
        elif kind == "prepare":
            frame = encode("DCP_PREPARE", extras={"by_seqno": seqno, "durability_level": 1}, key="p", cid=0, value=b"x" * size, opaque=o)
        elif kind == "advanced":
            frame = encode("DCP_SEQNO_ADVANCED", extras={"seqno": seqno}, opaque=o)
        elif kind == "oso":
            frame = encode("DCP_OSO_SNAPSHOT", extras={"flags": 1 + size % 2}, opaque=o)
        elif kind == "noop":
            frame = encode("DCP_NOOP", opaque=10000001 + size)
        elif kind == "reply":
            frame = encode("DCP_CONTROL", response=True, opaque=size)
        else:  # a stream message the consumer cannot read (its extras cut short): the producer charged it all the same
            frame = encode("DCP_MUTATION", variant=None, extras=b"\x00" * (size % 8), key="bad", opaque=o)
        (f,) = FrameDecoder().feed(frame)
        assert isinstance(f, Frame)
        received += flow_control_size(f.magic, f.opcode, f.length)
        s.reply(frame)
        got, frames = _acked(s.c.data_to_send())
        acked += got
        assert acked <= received, (acked, received)
        assert all(not (x.opcode == Opcode.DCP_NOOP and x.magic == Magic.CLIENT_REQUEST) for x in frames)  # never a noop request
        assert s.c.acked_total == acked and s.c.acked_total + s.c.unacked == s.c.consumed_total == received
        if not s.c.hold_acks:
            assert s.c.unacked < max(1, int(buffer_size * ratio))


def test_an_unreadable_stream_message_is_acknowledged_all_the_same() -> None:
    """A message the consumer cannot act upon still took the producer's window: left out of the acks it would stall the stream."""
    s = bootstrap(cfg(buffer_size=100, ack_ratio=0.5))
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    bad = encode("DCP_MUTATION", variant=None, extras=b"\x00\x01", key="bad", value=b"x" * 40, opaque=req.frame.opaque)
    evs = s.reply(bad)
    assert "malformed" in [e.kind for e in evs]
    assert s.one("DCP_BUFFER_ACKNOWLEDGEMENT").extras["buffer_bytes"] == len(bad)


# --- noops ------------------------------------------------------------------------------------------


def test_a_rejected_noop_interval_means_the_producers_default() -> None:
    """The producer keeps its own interval (20 s) when set_noop_interval is refused: silence is judged against that."""
    s = bootstrap(cfg(noop_interval=1.0), reject=("set_noop_interval",))
    accept(s, stream_req(s), [(77, 0)])
    assert s.c.noop and s.c.noop_interval == DEFAULT_NOOP_INTERVAL
    assert s.c.tick(s.now + 2 * DEFAULT_NOOP_INTERVAL - 1) == []
    assert [e.kind for e in s.c.tick(s.now + 2 * DEFAULT_NOOP_INTERVAL + 1)] == ["error"]


def test_any_traffic_keeps_the_connection_alive_and_noops_are_only_answered() -> None:
    s = bootstrap(cfg(noop_interval=1.0))
    req = stream_req(s)
    accept(s, req, [(77, 0)])
    for i in range(10):  # data every 1.5 s (under 2 intervals), noops now and then: never dead, never a noop request
        s.reply(marker(req, i + 1, i + 1), mutation(req, i + 1), dt=1.5)
        if i % 3 == 0:
            s.reply(encode("DCP_NOOP", opaque=10000001 + i), dt=0)
        assert "error" not in [e.kind for e in s.c.tick(s.now)]
    _, frames = _acked(b"".join(d.frame.raw for d in s.sent()))
    noops = [f for f in frames if f.opcode == Opcode.DCP_NOOP]
    assert len(noops) == 4 and all(f.magic == Magic.CLIENT_RESPONSE for f in noops)
    assert not s.c.done


# --- stream ends: the documented action per reason ---------------------------------------------------


def test_disconnected_never_comes_on_the_wire() -> None:
    s = bootstrap(cfg(vbuckets=(0, 1)))
    reqs = {d.frame.vbucket: d for d in s.pending}  # type: ignore[attr-defined]
    accept(s, reqs[0], [(77, 0)])
    evs = s.reply(stream_end(reqs[0], int(StreamEndStatus.DISCONNECTED)))
    assert "malformed" in [e.kind for e in evs] and s.c.streams[0].status == "failed" and s.sent() == []


# --- resume (kv_engine docs/dcp: stream request, snapshots, OSO, rollback) --------------------------


def _break_and_resume(s: Server, req: Dissection) -> dict[str, int]:
    """The stream ends Slow (re-request): the new request's resume fields."""
    s.reply(stream_end(req, int(StreamEndStatus.SLOW)))
    return dict(s.one("DCP_STREAM_REQ").extras)


def test_resume_mid_snapshot_uses_the_last_markers_bounds() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(0xAA, 0)])
    s.reply(marker(req, 1, 3), *(mutation(req, i) for i in (1, 2, 3)), marker(req, 4, 9), mutation(req, 6))
    e = _break_and_resume(s, req)
    assert (e["start_seqno"], e["snap_start_seqno"], e["snap_end_seqno"], e["vb_uuid"]) == (6, 4, 9, 0xAA)


def test_seqno_advanced_completes_a_snapshot() -> None:
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(0xAA, 0)])
    s.reply(marker(req, 1, 8), mutation(req, 2), encode("DCP_SEQNO_ADVANCED", extras={"seqno": 8}, opaque=req.frame.opaque))
    assert s.c.state.vbuckets[0].seqno == 8
    e = _break_and_resume(s, req)
    assert (e["start_seqno"], e["snap_start_seqno"], e["snap_end_seqno"]) == (8, 8, 8)


@pytest.mark.parametrize(("end_seen", "resume_at"), [(False, 3), (True, 11)])
def test_oso_with_seqno_advanced_before_its_end(end_seen: bool, resume_at: int) -> None:
    """Y = the highest seqno before the OSO snapshot, X = the highest inside it including the SEQNO_ADVANCED that
    comes before the OSO end (kv_engine active_stream.cc): resume from Y inside, from X after the end."""
    s = bootstrap(cfg())
    req = stream_req(s)
    accept(s, req, [(0xAA, 0)])
    o = req.frame.opaque
    s.reply(marker(req, 1, 3), *(mutation(req, i) for i in (1, 2, 3)))
    s.reply(encode("DCP_OSO_SNAPSHOT", extras={"flags": 1}, opaque=o), mutation(req, 9, "b"), mutation(req, 5, "a"))
    s.reply(encode("DCP_SEQNO_ADVANCED", extras={"seqno": 11}, opaque=o))
    if end_seen:
        s.reply(encode("DCP_OSO_SNAPSHOT", extras={"flags": 2}, opaque=o))
    assert "malformed" not in s.kinds()
    e = _break_and_resume(s, req)
    assert (e["start_seqno"], e["snap_start_seqno"], e["snap_end_seqno"], e["vb_uuid"]) == (resume_at, resume_at, resume_at, 0xAA)


# --- the cluster map (a consumer that knows its address) ---------------------------------------------

HERE = ("127.0.0.1", 11210)
THERE = ("127.0.0.1", 11299)


def cluster_config(vbmap: list[list[int]], rev: int = 1) -> dict[str, object]:
    nodes = [{"services": {"kv": HERE[1]}, "hostname": HERE[0]}, {"services": {"kv": THERE[1]}, "hostname": THERE[0]}]
    return {"rev": rev, "nodesExt": nodes, "vBucketServerMap": {"vBucketMap": vbmap}}


def map_bootstrap(config: ConsumerConfig, vbmap: list[list[int]] | None, *, status: int = 0) -> Server:
    """Bootstrap a consumer at HERE; GET_CLUSTER_CONFIG answered with ``vbmap`` (or ``status``); to its stream requests."""
    s = Server(config, address=HERE)
    s.reply(resp("HELLO", s.one("HELLO"), value={"features": [{"feature": 0x12}, {"feature": 0x0B}]}))
    s.reply(resp("SASL_LIST_MECHS", s.one("SASL_LIST_MECHS"), value=b"PLAIN"))
    s.reply(resp("SASL_AUTH", s.one("SASL_AUTH")))
    s.reply(resp("SELECT_BUCKET", s.one("SELECT_BUCKET")))
    get = s.one("GET_CLUSTER_CONFIG")  # right after SELECT_BUCKET, as the SDKs do
    s.reply(resp("GET_CLUSTER_CONFIG", get, status=status, value=cluster_config(vbmap) if vbmap is not None and not status else None))
    if s.c.done:
        return s
    if config.to_latest or (config.vbuckets is None and s.c.cluster_map is None):
        s.reply(resp("GET_ALL_VB_SEQNOS", s.one("GET_ALL_VB_SEQNOS"), value={"vb_seqnos": [{"vbucket": 0, "high_seqno": 0}]}))
    return open_and_controls(s)


def moved(s: Server) -> dict[int, Handoff]:
    return {e.vbucket: e.data["handoff"] for e in s.events if e.kind == "moved" and e.vbucket is not None}


def test_the_map_places_each_vbucket_on_its_active_node() -> None:
    state = ResumeState("travel", {1: VbState(vb_uuid=5, seqno=4, snap_start=4, snap_end=4, failover_log=[(5, 0)])})
    s = map_bootstrap(cfg(vbuckets=(0, 1, 2), resume=state), [[0, 1], [1, 0], [0, -1]])
    assert [d.frame.vbucket for d in s.pending] == [0, 2]  # type: ignore[attr-defined]
    h = moved(s)
    assert list(h) == [1] and h[1].address == THERE and h[1].position == state.vbuckets[1]
    assert 1 not in s.c.state.vbuckets and 1 not in s.c.streams  # its state goes with it
    assert s.c.node_index == 0 and s.c.cluster_map is not None and s.c.cluster_map.rev == 1


def test_every_vbucket_of_the_map_when_none_are_named() -> None:
    s = map_bootstrap(cfg(vbuckets=None), [[1], [0], [1], [0]])
    assert [d.frame.vbucket for d in s.pending] == [1, 3] and sorted(moved(s)) == [0, 2]  # type: ignore[attr-defined]
    assert "GET_ALL_VB_SEQNOS" not in [d.name for d in s.log]


def test_nothing_active_here_ends_the_connection_before_dcp_open() -> None:
    s = map_bootstrap(cfg(vbuckets=(0,)), [[1, 0]])
    assert s.c.phase is Phase.DONE and sorted(moved(s)) == [0] and "DCP_OPEN" not in [d.name for d in s.log]


@pytest.mark.parametrize("status", [int(Status.UNKNOWN_COMMAND), int(Status.NO_BUCKET), int(Status.EINVAL)])
def test_a_server_without_cluster_maps_keeps_every_vbucket_here(status: int) -> None:
    """memcached or an old node answers GET_CLUSTER_CONFIG with an error: stay on this connection, as before."""
    s = map_bootstrap(cfg(vbuckets=(0, 1)), [[1], [1]], status=status)
    assert [d.frame.vbucket for d in s.pending] == [0, 1] and moved(s) == {}  # type: ignore[attr-defined]
    req = s.pending[0]  # type: ignore[attr-defined]
    accept(s, req, [(7, 0)])
    s.reply(stream_end(req, int(StreamEndStatus.STATE_CHANGED)))
    assert s.one("DCP_STREAM_REQ").frame.vbucket == 0  # re-requested here, no map asked


@pytest.mark.parametrize("value", [b"not json", b'{"nodesExt": 3}', b'{"rev": 1, "nodesExt": [{"services": {"kv": 11210}}]}'])
def test_an_unusable_map_keeps_every_vbucket_here(value: bytes) -> None:
    s = Server(cfg(vbuckets=(0, 1)), address=HERE)
    for name, v in (("HELLO", {"features": []}), ("SASL_LIST_MECHS", b"PLAIN"), ("SASL_AUTH", None), ("SELECT_BUCKET", None)):
        s.reply(resp(name, s.one(name), value=v))
    s.reply(resp("GET_CLUSTER_CONFIG", s.one("GET_CLUSTER_CONFIG"), value=value))
    assert s.one("DCP_OPEN") and s.c.cluster_map is None and not s.c.done


@pytest.mark.parametrize("status", [int(StreamEndStatus.STATE_CHANGED), int(StreamEndStatus.ROLLBACK)])
def test_state_changed_asks_the_map_and_moves_the_stream(status: int) -> None:
    s = map_bootstrap(cfg(vbuckets=(0, 1)), [[0, 1], [0, 1]])
    reqs = {d.frame.vbucket: d for d in s.pending}  # type: ignore[attr-defined]
    accept(s, reqs[0], [(0xA, 0)])
    accept(s, reqs[1], [(0xB, 0)])
    s.reply(marker(reqs[0], 1, 2), mutation(reqs[0], 1), mutation(reqs[0], 2), marker(reqs[0], 3, 5), mutation(reqs[0], 3))
    s.reply(stream_end(reqs[0], status))
    assert s.c.streams[0].status is StreamStatus.LOCATING
    get = s.one("GET_CLUSTER_CONFIG")
    s.reply(resp("GET_CLUSTER_CONFIG", get, value=cluster_config([[1, -1], [0, 1]], rev=2)))
    h = moved(s)[0]
    assert h.address == THERE and (h.position.seqno, h.position.snap_start, h.position.snap_end, h.position.vb_uuid) == (3, 3, 5, 0xA)
    assert s.c.streams[0].status is StreamStatus.MOVED and 0 not in s.c.state.vbuckets and s.sent() == []
    assert not s.c.done  # vb 1 streams on
    s.reply(stream_end(reqs[1], int(StreamEndStatus.OK)))
    assert s.c.done and s.c.phase is Phase.DONE


def test_state_changed_where_the_map_still_says_here_requests_again_here() -> None:
    s = map_bootstrap(cfg(vbuckets=(0,)), [[0, 1]])
    req = s.pending[0]  # type: ignore[attr-defined]
    accept(s, req, [(0xA, 0)])
    s.reply(marker(req, 1, 1), mutation(req, 1), stream_end(req, int(StreamEndStatus.STATE_CHANGED)))
    s.reply(resp("GET_CLUSTER_CONFIG", s.one("GET_CLUSTER_CONFIG"), value=cluster_config([[0, 1]])))
    again = s.one("DCP_STREAM_REQ")
    assert (again.frame.vbucket, again.extras["start_seqno"], again.extras["vb_uuid"]) == (0, 1, 0xA) and moved(s) == {}


def test_several_streams_moving_share_one_map_request() -> None:
    s = map_bootstrap(cfg(vbuckets=(0, 1)), [[0], [0]])
    reqs = {d.frame.vbucket: d for d in s.pending}  # type: ignore[attr-defined]
    accept(s, reqs[0], [(0xA, 0)])
    accept(s, reqs[1], [(0xB, 0)])
    s.reply(stream_end(reqs[0], int(StreamEndStatus.STATE_CHANGED)), stream_end(reqs[1], int(StreamEndStatus.STATE_CHANGED)))
    get = s.one("GET_CLUSTER_CONFIG")
    s.reply(resp("GET_CLUSTER_CONFIG", get, value=cluster_config([[1], [1]], rev=3)))
    assert sorted(moved(s)) == [0, 1] and s.c.phase is Phase.DONE


def test_not_my_vbucket_asks_the_map_and_moves_the_stream() -> None:
    s = map_bootstrap(cfg(vbuckets=(0,)), [[0, 1]])
    req = s.pending[0]  # type: ignore[attr-defined]
    s.reply(resp("DCP_STREAM_REQ", req, status=int(Status.NOT_MY_VBUCKET)))
    s.reply(resp("GET_CLUSTER_CONFIG", s.one("GET_CLUSTER_CONFIG"), value=cluster_config([[1, -1]], rev=2)))
    assert moved(s)[0].address == THERE and s.c.done


def test_not_my_vbucket_forever_gives_up() -> None:
    s = map_bootstrap(cfg(vbuckets=(0,), max_rollbacks=3), [[0, 1]])
    req = s.pending[0]  # type: ignore[attr-defined]
    for _ in range(5):
        s.reply(resp("DCP_STREAM_REQ", req, status=int(Status.NOT_MY_VBUCKET)))
        got = s.sent()
        if not got:
            break
        s.reply(resp("GET_CLUSTER_CONFIG", got[0], value=cluster_config([[0, 1]])))  # the map insists: here
        req = s.one("DCP_STREAM_REQ")
    assert s.c.streams[0].status == "failed" and "not my vbucket" in (s.c.streams[0].error or "") and s.c.done


def test_a_map_request_never_answered_while_streaming_fails_the_connection() -> None:
    s = map_bootstrap(cfg(vbuckets=(0,), response_timeout=5, noop_interval=None), [[0, 1]])
    req = s.pending[0]  # type: ignore[attr-defined]
    accept(s, req, [(0xA, 0)])
    s.reply(stream_end(req, int(StreamEndStatus.STATE_CHANGED)))
    s.one("GET_CLUSTER_CONFIG")
    assert s.c.tick(s.now + 4) == []
    evs = s.c.tick(s.now + 6)
    assert [e.kind for e in evs] == ["error"] and "CONFIG" in evs[0].message


def test_an_adopted_stream_is_requested_from_where_it_was() -> None:
    s = map_bootstrap(cfg(vbuckets=(0,)), [[0, 1], [0, 1]])
    accept(s, s.pending[0], [(0xA, 0)])  # type: ignore[attr-defined]
    pos = VbState(vb_uuid=0xB, seqno=9, snap_start=7, snap_end=12, failover_log=[(0xB, 0)])
    evs = s.c.adopt(Handoff(1, HERE, pos, rollbacks=2), s.now)
    assert evs is not None and [e.kind for e in evs] == ["adopted", "stream_requested"]
    req = s.one("DCP_STREAM_REQ")
    e = req.extras
    assert (req.frame.vbucket, e["start_seqno"], e["snap_start_seqno"], e["snap_end_seqno"], e["vb_uuid"]) == (1, 9, 7, 12, 0xB)
    assert s.c.state.vbuckets[1] == pos and s.c.streams[1].rollbacks == 2
    s.c.close_streams(s.now)
    assert s.c.adopt(Handoff(2, HERE, VbState()), s.now) is None  # an ended connection takes nothing


def test_a_resume_position_outside_its_snapshot_streams_again_from_0() -> None:
    # claiming a finished snapshot (seqno-seqno) instead could skip a rollback the client needs
    state = ResumeState("travel", {0: VbState(vb_uuid=0xABC, seqno=29, snap_start=0, snap_end=0, failover_log=[(0xABC, 0)])})
    s = bootstrap(cfg(resume=state))
    req = stream_req(s)
    e = req.extras
    assert (e["start_seqno"], e["snap_start_seqno"], e["snap_end_seqno"], e["vb_uuid"]) == (0, 0, 0, 0)
    assert s.c.streams[0].position.seqno == 0
    (reset,) = [e for e in s.events if e.kind == "resume_reset"]
    assert "seqno 29 lies outside its snapshot 0-0" in reset.message and reset.vbucket == 0
