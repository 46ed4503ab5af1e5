"""``dcpinspect replay``: a capture's recorded producer served to new clients (:mod:`dcpinspect.live.replay`).

The sans-IO replay runs on a fake clock; the end-to-end tests run the stock client
(:class:`~dcpinspect.live.client.DcpClient`) or a client that sends the recorded
client's own requests against the asyncio edge and compare what it received with
what the recorded client received, stream by stream.  Nothing waits for the wall
clock: each wait is for an event (a frame received, a connection closed);
``run``'s deadline only turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import subprocess
import sys
import threading
from collections.abc import Awaitable
from typing import Any

import pytest
from clirun import run as cli
from paths import CAPTURES

from dcpinspect import FrameDecoder, encode
from dcpinspect.capture.read import read_records
from dcpinspect.cli.main import main as cli_main
from dcpinspect.flows.records import Record
from dcpinspect.live.client import DcpClient
from dcpinspect.live.consumer import ConsumerConfig
from dcpinspect.live.replay import ReplayConnection, with_opaque
from dcpinspect.live.replay_script import Script, ScriptError, extract_script
from dcpinspect.live.replay_server import ReplayServer
from dcpinspect.live.resume import ResumeState, VbState
from dcpinspect.live.sasl import plain_payload
from dcpinspect.protocol.enums import Opcode, Status
from dcpinspect.protocol.session import REQUEST_MAGICS, RESPONSE_MAGICS
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.dissection import DissectContext

USER, PASSWORD = "Administrator", "password"
_SASL = frozenset(int(op) for op in (Opcode.SASL_LIST_MECHS, Opcode.SASL_AUTH, Opcode.SASL_STEP))
#: responses whose content is the replay's own (SASL, the cluster map naming the replay's address)
_OWN = _SASL | {int(Opcode.GET_CLUSTER_CONFIG)}


def run(coro: Awaitable[Any], timeout: float = 60) -> Any:
    """Run ``coro``; the deadline turns a hang into a failure, it is never a wait."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def records(name: str) -> list[Record]:
    return list(read_records(CAPTURES / f"{name}.pcap"))


def script(name: str, conn: int | None = None) -> Script:
    return extract_script(records(name), conn)


def seen(recs: list[Record], conn: int | None = None) -> dict[int, list[tuple[Any, ...]]]:
    """Per vbucket, the server's frames as (name, status or seqno, key): what a client received, comparable across sessions."""
    out: dict[int, list[tuple[Any, ...]]] = {}
    reqs: dict[int, int] = {}  # opaque -> the vbucket of the request it answers
    for r in recs:
        if (conn is not None and r.conn != conn) or r.event.type != "frame":
            continue
        d = dissect(r.event, r.context)
        f = d.frame
        if r.direction == "c2s" and f.magic in REQUEST_MAGICS:
            reqs[f.opaque] = f.vbucket or 0
            continue
        if r.direction != "s2c" or f.opcode in _OWN or f.opcode == Opcode.DCP_NOOP:
            continue
        if f.magic in RESPONSE_MAGICS:
            if f.opcode in (Opcode.DCP_STREAM_REQ, Opcode.DCP_CLOSE_STREAM):
                out.setdefault(reqs.get(f.opaque, -1), []).append((d.name, f.status, dict(d.body)))
        else:
            seqno = d.extras.get("by_seqno", d.extras.get("seqno", d.extras.get("end_seqno")))
            out.setdefault(f.vbucket or 0, []).append((d.name, seqno, d.key_text, d.extras.get("status")))
    return out


# --- the script --------------------------------------------------------------------------------------


def test_script_of_a_rollback_then_retry() -> None:
    s = script("live-rollback-retry")
    assert (s.conn, s.name, s.bucket) == (1, "live-rollback-retry", "default")
    assert "first DCP producer connection" in s.why
    first, retry = s.streams
    assert (first.status, first.rollback_seqno, first.messages) == (Status.ROLLBACK, 0, [])
    assert retry.status == Status.SUCCESS and retry.ended
    assert [m.seqno for m in retry.messages if m.name == "DCP_MUTATION"] == list(range(1, 13))
    assert s.vbuckets[0].high_seqno == 12 and s.vbuckets[0].failover_log == retry.failover_log


def test_script_marks_what_followed_a_client_close() -> None:
    s = script("live-stream-ends", 2)
    (st,) = s.streams
    assert st.close_response is not None
    after = [m.name for m in st.messages if m.after_close]
    assert after[-1] == "DCP_STREAM_END" and after.count("DCP_STREAM_END") == 1


def test_a_capture_starting_mid_stream_counts_what_it_cannot_replay() -> None:
    recs = records("live-plain")
    first_item = next(r.number for r in recs if r.event.type == "frame" and r.event.opcode == Opcode.DCP_MUTATION)
    cut = [r for r in recs if r.number > first_item]
    with pytest.raises(ScriptError):
        extract_script(cut)  # no DCP_OPEN in what is left
    s = extract_script(cut, 1)
    assert s.streams == [] and s.orphans == sum(1 for r in cut if r.direction == "s2c" and r.event.opcode != Opcode.DCP_NOOP)
    assert "requested before the capture began" in s.describe()


def test_the_module_docstring_example(monkeypatch: pytest.MonkeyPatch) -> None:
    import doctest

    import dcpinspect.live.replay as replay

    monkeypatch.chdir(CAPTURES.parent)
    result = doctest.testmod(replay)
    assert result.attempted > 0 and result.failed == 0


def test_script_errors_name_the_connections() -> None:
    with pytest.raises(ScriptError, match="no connection 9"):
        script("live-plain", 9)
    with pytest.raises(ScriptError, match="no DCP producer connection"):
        extract_script([r for r in records("live-plain") if r.event.type == "frame" and r.event.opcode != Opcode.DCP_OPEN])


# --- sans-IO, fake clock ------------------------------------------------------------------------------


def _recorded_requests(recs: list[Record], conn: int) -> list[tuple[bytes, int]]:
    """The recorded client's requests (not SASL, not replies) with how many server frames (not SASL, not noops) preceded each."""
    out, before = [], 0
    for r in recs:
        if r.conn != conn or r.event.type != "frame":
            continue
        op, magic = r.event.opcode, r.event.magic
        if r.direction == "s2c" and op not in _SASL and op != Opcode.DCP_NOOP:
            before += 1
        elif r.direction == "c2s" and magic in REQUEST_MAGICS and op not in _SASL:
            out.append((bytes(r.event.raw), before))
    return out


def _feed(conn: ReplayConnection, raw: bytes, now: float) -> list[Any]:
    conn.receive(raw, now)
    return [dissect(ev, DissectContext()) for ev in FrameDecoder().feed(conn.data_to_send())]


def test_sans_io_answers_with_the_new_opaques_and_paces_as_captured() -> None:
    s = script("live-flow-control")
    conn = ReplayConnection(s, pace="captured", now=100.0)
    (auth,) = _feed(conn, encode("SASL_AUTH", key="PLAIN", value=plain_payload(USER, PASSWORD), opaque=1), 100.0)
    assert auth.frame.status == Status.SUCCESS
    got: list[Any] = []
    for raw, _before in _recorded_requests(records("live-flow-control"), s.conn):
        if raw[1] == Opcode.DCP_BUFFER_ACKNOWLEDGEMENT or b"connection_buffer_size" in raw:
            continue  # no window: the pace alone holds messages back
        got += _feed(conn, with_opaque(raw, int.from_bytes(raw[12:16], "big") + 0x5000), 100.0)
    stream_req = next(d for d in got if d.name == "DCP_STREAM_REQ")
    assert stream_req.frame.status == Status.SUCCESS and stream_req.frame.opaque >= 0x5000
    assert all(d.frame.opaque >= 0x5000 for d in got)  # every answer and stream message carries the new opaque
    (rec,) = s.streams
    due = [m.at for m in rec.messages]
    sent_now = sum(1 for d in got if d.role == "request")
    assert sent_now == sum(1 for at in due if at <= 0)  # only what the capture sent at once
    wake = conn.next_wakeup(100.0)
    assert wake is not None and wake > 100.0
    conn.tick(wake - 1e-6)
    assert conn.data_to_send() == b""  # nothing before its time
    conn.tick(wake)
    assert conn.data_to_send() != b""
    assert conn.divergences == []


def test_sans_io_flow_control_holds_the_recorded_stream_until_acked() -> None:
    s = script("live-flow-control")
    conn = ReplayConnection(s, pace="fast")
    _feed(conn, encode("SASL_AUTH", key="PLAIN", value=plain_payload(USER, PASSWORD), opaque=1), 0.0)
    got: list[Any] = []
    for raw, _before in _recorded_requests(records("live-flow-control"), s.conn):
        if raw[1] != Opcode.DCP_BUFFER_ACKNOWLEDGEMENT:
            got += _feed(conn, raw, 0.0)
    window = int(conn.controls["connection_buffer_size"])
    sent = sum(len(d.frame.raw) for d in got if d.role == "request")
    assert window <= sent < window + 200 and conn.bytes_outstanding >= window  # the window is full: the producer waits
    conn.tick(1000.0)
    assert all(d.name == "DCP_NOOP" for d in _feed(conn, b"", 1000.0))  # time alone sends nothing more of the stream
    more = _feed(conn, encode("DCP_BUFFER_ACKNOWLEDGEMENT", extras={"buffer_bytes": sent}, opaque=99), 1000.0)
    assert any(d.name == "DCP_MUTATION" for d in more)


def test_sans_io_a_differing_stream_request_gets_the_rule_and_is_reported() -> None:
    s = script("live-rollback-retry")
    uuid = s.vbuckets[0].failover_log[0][0]
    conn = ReplayConnection(s, pace="fast")
    for raw in (
        encode("SASL_AUTH", key="PLAIN", value=plain_payload(USER, PASSWORD), opaque=1),
        encode("SELECT_BUCKET", key="default", opaque=2),
        encode("DCP_OPEN", key="live-rollback-retry", extras={"flags": 1}, opaque=3),
    ):
        _feed(conn, raw, 0.0)
    req = {"start_seqno": 5, "end_seqno": 12, "vb_uuid": uuid, "snap_start_seqno": 5, "snap_end_seqno": 5}
    got = _feed(conn, encode("DCP_STREAM_REQ", extras=req, opaque=77), 0.0)
    assert got[0].frame.status == Status.SUCCESS
    assert [d.extras["by_seqno"] for d in got if d.name == "DCP_MUTATION"] == list(range(6, 13))
    assert got[-1].name == "DCP_STREAM_END" and got[-1].frame.opaque == 77
    (div,) = conn.divergences
    assert div.kind == "stream_request" and "start 5" in div.asked and "Rollback to 0" in div.recorded and "Success" in div.answered
    # another uuid at the same seqno: the rule on the recorded failover log says roll back to 0
    bad = _feed(conn, encode("DCP_STREAM_REQ", extras={**req, "vb_uuid": 1234}, opaque=78), 0.0)
    assert bad[0].frame.status == Status.ROLLBACK and bad[0].body["rollback_seqno"] == 0
    # a vbucket the recording does not have
    none = _feed(conn, encode("DCP_STREAM_REQ", extras={**req, "vb_uuid": 0, "start_seqno": 0}, vbucket=3, opaque=79), 0.0)
    assert none[0].frame.status == Status.NOT_MY_VBUCKET
    assert [d.kind for d in conn.divergences] == ["stream_request"] * 3


def test_sans_io_a_differing_hello_gets_the_recorded_features_it_asked_for() -> None:
    s = script("live-rollback-retry")
    conn = ReplayConnection(s)
    (hello,) = _feed(conn, encode("HELLO", key="other", value=[(0x12,), (0x0B,), (0x1C,)], opaque=5), 0.0)
    assert [e["feature"] for e in hello.body["features"]] == [0x12, 0x0B] == list(conn.features)
    assert conn.divergences[0].kind == "hello"


# --- end to end --------------------------------------------------------------------------------------


def _resume(s: Script) -> ResumeState | None:
    """Where the recorded client resumed from (its first stream request per vbucket), to ask the same."""
    first: dict[int, Any] = {}
    for st in s.streams:
        first.setdefault(st.vb, st)
    vbs = {vb: VbState(st.uuid, st.start, st.snap_start, st.snap_end, [(st.uuid, 0)]) for vb, st in first.items() if st.start}
    return ResumeState(bucket="default", vbuckets=vbs) if vbs else None


async def _stock_client(s: Script, **cfg: Any) -> tuple[ReplayServer, list[Record]]:
    server = await ReplayServer(s, pace="fast").start()
    got: list[Record] = []
    vbuckets = tuple(sorted({st.vb for st in s.streams}))
    base = {"name": s.name, "vbuckets": vbuckets, "to_latest": True, "resume": _resume(s)}
    config = ConsumerConfig(bucket="default", user=USER, password=PASSWORD, **{**base, **cfg})
    try:
        await DcpClient("127.0.0.1", server.port, config, on_record=got.append).run()
        await server.until_closed(1)
    finally:
        await server.stop()
    return server, got


@pytest.mark.parametrize("name", ["live-rollback-retry", "live-plain"])
def test_the_stock_client_gets_what_the_recorded_client_got(name: str) -> None:
    s = script(name)
    server, got = run(_stock_client(s))
    assert seen(got) == seen(records(name), s.conn)
    (conn,) = server.connections
    assert conn.divergences == [] and conn.summary()["streams_replayed"] == len([st for st in s.streams if st.status == Status.SUCCESS])


def test_a_client_that_asks_differently_gets_the_rule_and_a_divergence() -> None:
    s = script("live-rollback-retry")
    uuid = s.vbuckets[0].failover_log[0][0]
    resume = ResumeState(bucket="default", vbuckets={0: VbState(uuid, 5, 5, 5, [(uuid, 0)])})
    server, got = run(_stock_client(s, resume=resume, name="someone-else"))
    vb0 = seen(got)[0]
    assert vb0[0][:2] == ("DCP_STREAM_REQ", Status.SUCCESS)  # the rule on the recorded failover log: no rollback
    assert [k for (n, _s, k, _e) in vb0[1:] if n == "DCP_MUTATION"] == [f"doc-{i:04d}" for i in range(5, 12)]
    assert vb0[-1][0] == "DCP_STREAM_END"
    (conn,) = server.connections
    (div,) = conn.divergences  # the DCP name is the client's own: not a divergence
    assert div.kind == "stream_request" and div.asked.startswith("DCP_STREAM_REQ vb 0 start 5") and "Rollback to 0" in div.recorded


async def _echo(s: Script, recs: list[Record], user: str, password: str) -> tuple[ReplayServer, list[Record]]:
    """The recorded client's own requests, each sent once the server frames recorded before it arrived."""
    server = await ReplayServer(s, pace="fast", users={user: password}).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    decoder, got, arrived = FrameDecoder(), [], asyncio.Condition()
    ctx = [r.context for r in recs if r.conn == s.conn][-1]  # what the session negotiated (collections: keys carry the cid)
    counted = 0
    auth = encode("SASL_AUTH", key="PLAIN", value=plain_payload(user, password), opaque=0xFFFF)

    async def read() -> None:
        nonlocal counted
        while data := await reader.read(65536):
            for ev in decoder.feed(data):
                rec = Record(len(got) + 1, "echo", 1, "", "s2c", 0, 0, 0, 0, ev, ctx)
                got.append(rec)
                if ev.opcode == Opcode.DCP_NOOP:
                    writer.write(encode("DCP_NOOP", response=True, opaque=ev.header[6]))
                elif ev.opcode not in _SASL:
                    counted += 1
            async with arrived:
                arrived.notify_all()

    task = asyncio.create_task(read())
    writer.write(auth)
    for raw, before in _recorded_requests(recs, s.conn):
        async with arrived:
            await arrived.wait_for(lambda b=before: counted >= b)  # type: ignore[misc]
        got.append(Record(len(got) + 1, "echo", 1, "", "c2s", 0, 0, 0, 0, next(iter(FrameDecoder().feed(raw))), DissectContext()))
        writer.write(raw)
    async with arrived:
        await arrived.wait_for(lambda: counted >= sum(1 for r in recs if _counts(r, s.conn)))
    writer.close()
    await server.until_closed(1)
    task.cancel()
    await server.stop()
    return server, got


def _counts(r: Record, conn: int) -> bool:
    return r.conn == conn and r.direction == "s2c" and r.event.type == "frame" and r.event.opcode not in _SASL | {int(Opcode.DCP_NOOP)}


@pytest.mark.parametrize("conn", [1, 2, 3])
def test_every_stream_end_of_a_recording_is_replayed(conn: int) -> None:
    """live-stream-ends: OK, StateChanged, FilterEmpty, BackfillFail, Slow, Closed after a close behind a full window, LostPrivileges."""
    recs = records("live-stream-ends")
    s = extract_script(recs, conn)
    server, got = run(_echo(s, recs, "reader", "reader-password"))
    assert seen(got) == seen(recs, conn)
    assert server.connections[0].divergences == []


def test_cli_replay_serves_a_client_and_prints_divergences_and_the_summary() -> None:
    listening = threading.Event()

    class Out(io.StringIO):
        def write(self, s: str) -> int:
            n = super().write(s)
            if "listening" in s:
                listening.set()
            return n

    out = Out()
    argv = ["replay", str(CAPTURES / "live-rollback-retry.pcap"), "--pace", "fast", "--once", "--json", "--no-progress"]
    code: list[int] = []
    t = threading.Thread(target=lambda: code.append(cli_main(argv, out=out, environ={})))
    t.start()
    assert listening.wait(60)
    port = next(json.loads(line)["port"] for line in out.getvalue().splitlines() if '"listening"' in line)
    uuid = script("live-rollback-retry").vbuckets[0].failover_log[0][0]
    resume = ResumeState(bucket="default", vbuckets={0: VbState(uuid, 5, 5, 5, [(uuid, 0)])})
    config = ConsumerConfig(bucket="default", user=USER, password=PASSWORD, vbuckets=(0,), to_latest=True, resume=resume)
    run(DcpClient("127.0.0.1", port, config).run())
    t.join(60)
    assert code == [0]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in lines] == ["replaying", "listening", "divergence", "summary"]
    assert lines[0]["conn"] == 1 and lines[2]["kind"] == "stream_request" and lines[2]["client"] == 1
    assert (lines[3]["items"], lines[3]["divergences"], lines[3]["streams_by_rule"]) == (7, 1, 1)


def test_cli_replay_errors_are_one_line() -> None:
    code, out = cli("replay", str(CAPTURES / "live-plain.pcap"), "--conn", "7", "--no-progress")
    assert code == 2 and out == ""
    code, _ = cli("replay", str(CAPTURES / "live-plain.pcap"), "--listen", "nonsense", "--no-progress")
    assert code == 2


# --- the official SDK: KV replayed -------------------------------------------------------------------


def _sample_sdk_script() -> str:
    """The SDK side of the ``sdk`` sample (captures/make_live_samples.py): the requests the recording holds."""
    spec = importlib.util.spec_from_file_location("make_live_samples", CAPTURES / "make_live_samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_live_samples", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return str(module.SDK_SCRIPT)


@pytest.mark.sdk
def test_the_official_sdk_gets_the_recorded_kv_answers() -> None:
    """live-sdk.pcap's KV connection (3) replayed to the SDK running the same script: the recorded CAS and mutation tokens."""
    if importlib.util.find_spec("couchbase") is None:
        pytest.fail("the official Couchbase SDK is not installed: pip install -e '.[dev]' (or deselect with -m 'not sdk')")
    recs = records("live-sdk")
    s = extract_script(recs, 3)
    recorded = [
        (int.from_bytes(r.event.raw[16:24], "big"), dissect(r.event, r.context).extras.get("seqno"))
        for r in recs
        if r.conn == 3 and r.direction == "s2c" and r.event.type == "frame" and r.event.opcode in (Opcode.SET, Opcode.DELETE)
    ]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(ReplayServer(s, pace="fast").start(), loop).result(60)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _sample_sdk_script(), str(server.port), "airlines", USER, PASSWORD],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,  # a deadline only: the script ends by itself in seconds
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
        results = json.loads(lines[-1][len("RESULT ") :])
        assert [(r["cas"], r["seqno"]) for r in results] == recorded  # every write answered as recorded
        divergences = [d for c in server.connections for d in c.divergences]
        assert divergences == [], [d.line() for d in divergences]
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)


def test_sans_io_unrecorded_requests_are_answered_from_the_recorded_state() -> None:
    s = script("live-rollback-retry")
    conn = ReplayConnection(s, pace="fast", serial=7)
    assert conn.serial == 7
    for raw in (
        encode("SASL_AUTH", key="PLAIN", value=plain_payload(USER, PASSWORD), opaque=1),
        encode("SELECT_BUCKET", key="default", opaque=2),
    ):
        _feed(conn, raw, 0.0)
    (seqnos,) = _feed(conn, encode("GET_ALL_VB_SEQNOS", opaque=3), 0.0)
    assert {e["vbucket"]: e["high_seqno"] for e in seqnos.body["vb_seqnos"]}[0] == s.vbuckets[0].high_seqno > 0
    (log,) = _feed(conn, encode("GET_FAILOVER_LOG", vbucket=0, opaque=4), 0.0)
    assert [(e["vb_uuid"], e["vb_seqno"]) for e in log.body["failover_log"]] == s.vbuckets[0].failover_log


def test_the_servers_divergence_and_summary_rows_after_a_real_client() -> None:
    from dcpinspect.views.replay_view import divergences_frame, replay_summary

    s = script("live-rollback-retry")
    uuid = s.vbuckets[0].failover_log[0][0]
    resume = ResumeState(bucket="default", vbuckets={0: VbState(uuid, 5, 5, 5, [(uuid, 0)])})
    server, _got = run(_stock_client(s, resume=resume, name="someone-else"))  # waited on until_closed: the rows are final
    assert not server.serving
    (row,) = server.divergences()
    assert set(row) == {"conn", "at", "kind", "asked", "recorded", "answered"}
    assert row["conn"] == 1 and row["kind"] == "stream_request" and row["at"] >= 0
    assert row["asked"].startswith("DCP_STREAM_REQ vb 0 start 5") and "Rollback to 0" in row["recorded"]
    df = divergences_frame(server)
    assert df.to_dict("records") == [row]
    (summary,) = server.summaries()
    assert summary["divergences"] == 1 and summary["items"] == 7 and summary["name"] == "someone-else"
    assert replay_summary(server)[["conn", "divergences", "items"]].values.tolist() == [[1, 1, 7]]
