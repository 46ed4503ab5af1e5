"""The live sample captures (``captures/live-*.pcap``) against the simulator's own journal of what it did.

Each capture was recorded by ``captures/make_live_samples.py`` (client -> tap proxy ->
simulator on 127.0.0.1, or with several data nodes the clients' own capture); next to
it, ``live-<name>.journal.json`` is the simulator's ``Cluster.journal``.  The timeline
built from the capture is checked against that journal - the ground truth - never
against the timeline code's own output; and each capture reads back with no anomaly
but those ``captures/README.md`` says it demonstrates (:data:`DEMONSTRATES`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from paths import CAPTURES
from tshark import needs_tshark, opaque_value, tshark_frames

from dcpinspect import dissect
from dcpinspect.capture.read import read_records
from dcpinspect.flows.records import CaptureStats, Record
from dcpinspect.live.clustermap import ClusterMap, parse_config
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Opcode, StreamEndStatus
from dcpinspect.protocol.session import SASL_REQUESTS
from dcpinspect.timeline import Timeline, build_timeline

NAMES = [
    "plain",
    "rollback-retry",
    "failover-branches",
    "purge-rollback",
    "stream-ids",
    "collections",
    "sync-writes",
    "flow-control",
    "oso",
    "stream-ends",
    "sdk",
    "loss-reorder",
]
CLEAN = [n for n in NAMES if n != "loss-reorder"]
Key = tuple[str, int, int | None]


@functools.cache
def load(name: str) -> tuple[Timeline, list[dict[str, Any]], dict[str, Any], list[Record], CaptureStats]:
    stats = CaptureStats()
    records = list(read_records([str(CAPTURES / f"live-{name}.pcap")], stats=stats))
    doc = json.loads((CAPTURES / f"live-{name}.journal.json").read_text())
    return build_timeline(records), doc["journal"], doc.get("postprocess", {}), records, stats


def names(t: Timeline) -> dict[int, str]:
    return {c.conn: c.name for c in t.connections.values()}


def journal_streams(journal: list[dict[str, Any]]) -> dict[Key, dict[str, list[Any]]]:
    """Per (connection name, vbucket, sid): what the producer decided and sent, in order."""
    out: dict[Key, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    current: dict[Key, list[Any] | None] = {}
    for e in journal:
        if "vb" not in e or "name" not in e:
            continue
        key = (e["name"], e["vb"], e.get("sid"))
        s = out[key]
        ev = e["event"]
        if ev == "stream_request":
            detail = e.get("rollback_seqno") if e["decision"] == "rollback" else e["status"]
            s["attempts"].append((e["start"], e["end"], e["uuid"], e["snap_start"], e["snap_end"], e["decision"], detail))
            current[key] = None
        elif ev == "marker":
            snap = [e["start"], e["end"], e["flags"], e["version"], 0]
            s["snapshots"].append(snap)
            current[key] = snap
        elif ev == "item":
            s["items"].append((e["opcode"], e["seqno"]))
            snap = current.get(key)
            if snap is not None:
                snap[4] += 1
        elif ev == "stream_end":
            s["ends"].append(e["status"])
            current[key] = None
    return {k: {kind: [tuple(x) if isinstance(x, list) else x for x in v] for kind, v in d.items()} for k, d in out.items()}


def timeline_streams(t: Timeline) -> dict[Key, dict[str, list[Any]]]:
    """The same shape, from the timeline built from the capture."""
    conn_names = names(t)
    out: dict[Key, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for s in t.streams:
        d = out[(conn_names[s.conn], s.vbucket, s.stream_id)]
        for a in s.attempts:
            detail = a.rollback_seqno if a.outcome == "rollback" else a.status
            d["attempts"].append((a.start, a.end, a.uuid, a.snap_start, a.snap_end, a.outcome, detail))
        d["snapshots"] += [(x.start, x.end, x.flags, x.version, x.items) for x in s.snapshots]
        d["items"] += [(spec.COMMANDS[i.opcode].name, i.seqno) for i in s.items]
        if s.end is not None:
            d["ends"].append(s.end["status"])
    return {k: {kind: list(v) for kind, v in d.items()} for k, d in out.items()}


def _pick(streams: dict[Key, dict[str, list[Any]]], kind: str) -> dict[Key, list[Any]]:
    return {k: v[kind] for k, v in streams.items() if v.get(kind)}


# --- the stream stories --------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_attempts_and_outcomes(name: str) -> None:
    t, journal, _, _, _ = load(name)
    expected = _pick(journal_streams(journal), "attempts")
    assert expected
    assert _pick(timeline_streams(t), "attempts") == expected


@pytest.mark.parametrize("name", NAMES)
def test_rollbacks_are_explained_as_the_producer_decided(name: str) -> None:
    t, journal, _, _, _ = load(name)
    decided = [e["rollback_seqno"] for e in journal if e["event"] == "stream_request" and e["decision"] == "rollback"]
    attempts = [a for s in t.streams for a in s.attempts if a.outcome == "rollback"]
    assert [a.rollback_seqno for a in attempts] == decided
    for a in attempts:  # where the replay of the rollback rule (protocol.rules.rollback_decision) commits to a number, it is the producer's
        assert a.predicted is None or a.predicted == a.rollback_seqno, a.explanation
        assert "but the rule" not in a.explanation


@pytest.mark.parametrize("name", NAMES)
def test_stream_ends(name: str) -> None:
    t, journal, _, _, _ = load(name)
    expected = _pick(journal_streams(journal), "ends")
    assert expected or name in ("sync-writes", "sdk")  # those end with CLOSE_STREAM and no STREAM_END
    assert _pick(timeline_streams(t), "ends") == expected


@pytest.mark.parametrize("name", CLEAN)
def test_snapshots_and_their_items(name: str) -> None:
    t, journal, _, _, _ = load(name)
    assert _pick(timeline_streams(t), "snapshots") == _pick(journal_streams(journal), "snapshots")


@pytest.mark.parametrize("name", CLEAN)
def test_items_per_stream(name: str) -> None:
    t, journal, _, _, _ = load(name)
    expected = _pick(journal_streams(journal), "items")
    assert expected
    assert _pick(timeline_streams(t), "items") == expected


@pytest.mark.parametrize("name", NAMES)
def test_failover_branches(name: str) -> None:
    """Every branch the producer created and told a consumer about, with its branch point, in order; cuts as the journal says."""
    t, journal, _, _, _ = load(name)
    created: dict[int, list[tuple[int, int]]] = defaultdict(list)
    removed: dict[tuple[int, int], int] = {}
    for e in journal:
        if e["event"] in ("vbucket_created", "failover"):
            created[e["vb"]].append((e["uuid"], e["seqno"]))
            for u, _s in e.get("removed", []):
                removed[(e["vb"], u)] = e["uuid"]
    sent = {u for e in journal if e["event"] == "stream_request" and e["decision"] == "success" for u, _ in e["failover_log"]}
    expected = {vb: [b for b in bs if b[0] in sent] for vb, bs in created.items()}
    assert {vb: [(b.uuid, b.seqno) for b in bs] for vb, bs in t.branches.items()} == {vb: bs for vb, bs in expected.items() if bs}
    for vb, bs in t.branches.items():
        for b in bs:
            assert b.cut_by == removed.get((vb, b.uuid))


def _server_port_of(t: Timeline, conn: int) -> int:
    return int(t.connections[conn].label.rsplit(":", 1)[1])


def _maps(records: list[Record]) -> list[tuple[int, ClusterMap]]:
    """Every cluster map a GET_CLUSTER_CONFIG response carried: (frame number, map)."""
    out = []
    for r in records:
        if r.event.type == "frame" and r.event.name == "GET_CLUSTER_CONFIG" and r.direction == "s2c" and r.event.value:
            host, port = r.conn_label.split(" -> ")[1].rsplit(":", 1)
            out.append((r.number, parse_config(bytes(r.event.value), connected=(host, int(port)))))
    return out


def test_failover_promotes_the_replica_and_the_client_follows_the_map() -> None:
    """Each vbucket fails over once to the other node: its stream on the old node ends StateChanged and is requested again
    on the node the new cluster map names, with the failover log grown; the loss on vbucket 0 rolls the resume back."""
    t, journal, _, records, _ = load("failover-branches")
    failovers = {e["vb"]: e for e in journal if e["event"] == "failover"}
    assert sorted(failovers) == [0, 1]
    assert (failovers[1]["old_node"], failovers[1]["new_node"], failovers[1]["lost"]) == (1, 0, 0)
    assert (failovers[0]["old_node"], failovers[0]["new_node"], failovers[0]["lost"]) == (0, 1, 3)
    maps = _maps(records)
    assert {m.rev for _, m in maps} >= {1, 3}  # the first map and the one after both failovers
    ports = {m.nodes[i][1] for _, m in maps for i in range(len(m.nodes))}
    assert {_server_port_of(t, c) for c in t.connections} == ports  # the client spoke to exactly the nodes the maps name
    for vb, f in failovers.items():
        streams = sorted(t.stream(vb), key=lambda s: s.attempts[0].frame)
        first, *later = streams
        assert first.end is not None and first.end["status"] == 2  # StateChanged on the old node
        assert later and all(_server_port_of(t, s.conn) != _server_port_of(t, first.conn) for s in later)
        # the re-request went where the last map before it names the vbucket active
        req = later[0].attempts[0].frame
        (_, cmap) = [(n, m) for n, m in maps if n < req][-1]
        assert cmap.active_node(vb) == f["new_node"]
        assert cmap.nodes[f["new_node"]][1] == _server_port_of(t, later[0].conn)
        assert later[-1].end is not None and later[-1].end["status"] == 0  # OK at seqno 20
        assert [len(log) for _frame, log in t.logs[vb]][-1] == 2
    outcomes = [a.outcome for s in sorted(t.stream(0), key=lambda s: s.attempts[0].frame) for a in s.attempts]
    assert outcomes == ["success", "rollback", "success"]
    rb = next(a for s in t.stream(0) for a in s.attempts if a.outcome == "rollback")
    assert (rb.start, rb.rollback_seqno) == (15, 12) and rb.rollback_seqno == failovers[0]["seqno"] == failovers[0]["high_seqno"]
    assert [a.outcome for s in t.stream(1) for a in s.attempts] == ["success", "success"]  # nothing lost: no rollback


def test_purge_rollback_is_to_zero_below_the_purge_seqno() -> None:
    t, journal, _, _, _ = load("purge-rollback")
    purge = next(e for e in journal if e["event"] == "purge")
    rb = next(a for s in t.streams for a in s.attempts if a.outcome == "rollback")
    assert rb.rollback_seqno == 0 and 0 < rb.start < purge["purge_seqno"]


def test_stream_ids_two_streams_on_one_vbucket() -> None:
    t, _, _, records, _ = load("stream-ids")
    assert sorted((s.vbucket, s.stream_id) for s in t.streams) == [(0, 1), (0, 2), (1, 3)]
    reqs = [dissect(r.event, r.context) for r in records if r.event.type == "frame" and r.event.name == "DCP_STREAM_REQ"]
    assert sorted(d.document["sid"] for d in reqs if d.role == "request") == [1, 2, 3]
    # the two streams of vbucket 0 were live at the same time
    s1, s2 = (s for s in t.streams if s.vbucket == 0)
    assert s2.attempts[0].frame < s1.end["frame"] and s1.attempts[0].frame < s2.end["frame"]  # type: ignore[index]


def test_collections_filter_system_events_and_filter_empty() -> None:
    t, journal, _, records, _ = load("collections")
    ds = [dissect(r.event, r.context) for r in records if r.event.type == "frame"]
    assert any(d.name == "DCP_STREAM_REQ" and d.role == "request" and d.document == {"collections": ["8"]} for d in ds)
    changes = [e["event"] for e in journal if e["event"].startswith("collection_")]
    assert changes == ["collection_created", "collection_created", "collection_dropped"]
    ends = _pick(timeline_streams(t), "ends")
    assert {k: v for k, v in ends.items() if k[0] == "live-collections-filtered"} == {
        ("live-collections-filtered", 0, None): [7],
        ("live-collections-filtered", 1, None): [7],
    }
    events = Counter(d.name for d in ds)
    assert events["DCP_SYSTEM_EVENT"] >= 6 and events["DCP_SEQNO_ADVANCED"] >= 1


def test_sync_writes_markers_and_acks() -> None:
    t, journal, _, records, _ = load("sync-writes")
    ops = Counter(name for s in t.streams for name, _ in [(spec.COMMANDS[i.opcode].name, i.seqno) for i in s.items])
    assert ops["DCP_PREPARE"] == 4 and ops["DCP_COMMIT"] == 3 and ops["DCP_ABORT"] == 1
    assert {x.version for s in t.streams for x in s.snapshots} == {"v2.0"}
    acked = [e["prepared_seqno"] for e in journal if e["event"] == "seqno_ack"]
    sent = [
        dissect(r.event, r.context).extras["prepared_seqno"]
        for r in records
        if r.event.type == "frame" and r.event.name == "DCP_SEQNO_ACKNOWLEDGED"
    ]
    assert sent == acked and len(acked) == 4


def test_flow_control_stall_and_resume() -> None:
    """A consumer that stops acking only stalls the producer: nothing ends Slow, the stream runs to OK once it acks."""
    t, journal, _, _, _ = load("flow-control")
    assert [e for e in journal if e["event"] == "flow_blocked"]
    assert [e["status"] for e in journal if e["event"] == "stream_end"] == [StreamEndStatus.OK]
    assert [s.end["status"] for s in t.streams if s.end] == [StreamEndStatus.OK]
    assert [f.size for f in t.flow if f.event == "ack"] == [e["bytes"] for e in journal if e["event"] == "buffer_ack"]
    assert len(t.stalls) >= 1 and t.stalls[0]["duration_ns"] >= 400_000_000  # the consumer held its acks 0.5 s
    assert t.connections[1].buffer_size == 2048


def test_oso_backfill() -> None:
    t, journal, _, _, _ = load("oso")
    assert [e["flags"] for e in journal if e["event"] == "oso"] == [1, 2]
    (s,) = t.streams
    seqnos = [i.seqno for i in s.items if i.opcode != Opcode.DCP_SEQNO_ADVANCED]
    assert seqnos != sorted(seqnos)  # key order, not seqno order


#: (connection name, internal reason) -> the status on the wire, as the stream-ends sample produced them
STREAM_ENDS = {
    ("live-stream-ends", StreamEndStatus.OK): StreamEndStatus.OK,
    ("live-stream-ends", StreamEndStatus.STATE_CHANGED): StreamEndStatus.STATE_CHANGED,
    ("live-stream-ends", StreamEndStatus.FILTER_EMPTY): StreamEndStatus.FILTER_EMPTY,
    ("live-stream-ends", StreamEndStatus.BACKFILL_FAIL): StreamEndStatus.BACKFILL_FAIL,
    ("live-stream-ends", StreamEndStatus.ROLLBACK): StreamEndStatus.STATE_CHANGED,  # kv_engine sends Rollback as StateChanged
    ("live-stream-ends", StreamEndStatus.SLOW): StreamEndStatus.SLOW,
    ("live-stream-ends", StreamEndStatus.LOST_PRIVILEGES): StreamEndStatus.LOST_PRIVILEGES,
    ("live-stream-ends-close", StreamEndStatus.CLOSED): StreamEndStatus.CLOSED,
    ("live-stream-ends-legacy", StreamEndStatus.LOST_PRIVILEGES): StreamEndStatus.OK,  # no collections: shown as OK
}


def test_every_stream_end_status_a_server_sends() -> None:
    t, journal, _, records, _ = load("stream-ends")
    ends = [e for e in journal if e["event"] == "stream_end"]
    assert {(e["name"], e["reason"]): e["status"] for e in ends} == {(n, int(r)): int(s) for (n, r), s in STREAM_ENDS.items()}
    assert len(ends) == len(STREAM_ENDS)
    names_ = names(t)
    seen = sorted((names_[s.conn], s.vbucket, s.end["status"]) for s in t.streams if s.end)
    assert seen == sorted((e["name"], e["vb"], e["status"]) for e in ends)
    wire = [dissect(r.event, r.context).extras["status"] for r in records if r.event.type == "frame" and r.event.name == "DCP_STREAM_END"]
    assert sorted(wire) == sorted(e["status"] for e in ends)
    assert StreamEndStatus.DISCONNECTED not in wire  # never on the wire
    assert "flow_blocked" in {e["event"] for e in journal}  # the close waited behind a full window, nothing ended Slow for it


def test_queued_items_follow_the_close_response_then_closed() -> None:
    """send_stream_end_on_client_close_stream: what was queued still goes after the close response, then STREAM_END(Closed)."""
    t, journal, _, records, _ = load("stream-ends")
    conn = next(c for c, n in names(t).items() if n == "live-stream-ends-close")
    frames = [(r.direction, r.event.name, r.event.is_response) for r in records if r.event.type == "frame" and r.conn == conn]
    close = frames.index(("s2c", "DCP_CLOSE_STREAM", True))
    end = frames.index(("s2c", "DCP_STREAM_END", False))
    between = [f[1] for f in frames[close:end] if f[0] == "s2c" and not f[2]]
    after_close = [e for e in journal if e.get("name") == "live-stream-ends-close" and e["event"] in ("close_stream", "item", "stream_end")]
    i = next(i for i, e in enumerate(after_close) if e["event"] == "close_stream")
    queued = [e for e in after_close[i:] if e["event"] == "item"]
    assert queued and between == ["DCP_MUTATION"] * len(queued)
    (s,) = [s for s in t.streams if s.conn == conn]
    assert s.end is not None and s.end["status"] == StreamEndStatus.CLOSED and s.close_answered is not None


def test_the_sdk_wrote_through_the_proxy_and_dcp_streamed_it() -> None:
    """The official SDK's capture: its bootstrap and KV traffic went through the proxy (the map names the proxy's port),
    and the stock client's streams carry each document it wrote, in the default collection and in ``airlines``."""
    t, journal, _, records, _ = load("sdk")
    assert len({_server_port_of(t, c) for c in t.connections}) == 1
    assert len(t.connections) == 3  # the DCP client, the SDK's bootstrap and bucket connections, all through the proxy
    assert {len(m.nodes) for _, m in _maps(records)} == {1}
    ds = [dissect(r.event, r.context) for r in records if r.event.type == "frame"]
    agents = {json.loads(d.key)["a"] for d in ds if d.name == "HELLO" and d.role == "request" and d.key.startswith(b"{")}
    assert agents and all(a.startswith("python/") for a in agents), agents  # the SDK's two connections
    kv = Counter(d.name for d in ds if d.role == "request" and d.name in ("SET", "GET", "DELETE"))
    assert kv["SET"] == 5 and kv["DELETE"] == 2 and kv["GET"] >= 4
    cid = next(e["cid"] for e in journal if e["event"] == "collection_created")
    streamed = [(d.name, d.key, d.cid) for d in ds if d.role == "request" and d.name in ("DCP_MUTATION", "DCP_DELETION")]
    for coll, c in (("_default", 0), ("airlines", cid)):
        assert (("DCP_MUTATION", f"sdk-{coll}-kept".encode(), c)) in streamed
        assert (("DCP_DELETION", f"sdk-{coll}".encode(), c)) in streamed
    prepared = [d for d in ds if d.role == "request" and d.name == "DCP_PREPARE"]
    assert [d.key for d in prepared] == [b"sdk-durable"] and any(d.name == "DCP_COMMIT" for d in ds)


# --- anomalies -------------------------------------------------------------------------------------

#: the anomalies each capture demonstrates (as captures/README.md says), as (kind, uncertain): every other capture reads
#: back with none.  live-loss-reorder lost a producer segment on purpose: the marker it held is missing (the next
#: snapshot's items look outside the previous one) and the consumer acks bytes the capture never saw; both come after
#: the gap, so both are uncertain.
DEMONSTRATES: dict[str, set[tuple[str, bool]]] = {
    "loss-reorder": {("seqno outside snapshot", True), ("ack beyond bytes received", True)},
}


@pytest.mark.parametrize("name", NAMES)
def test_no_anomaly_but_what_the_readme_says_it_demonstrates(name: str) -> None:
    stats = CaptureStats()
    t = build_timeline(read_records([str(CAPTURES / f"live-{name}.pcap")], stats=stats))
    got = {(str(a.kind), a.uncertain) for a in t.anomalies}
    assert got == DEMONSTRATES.get(name, set()), [(str(a.kind), a.frames[:4], a.message) for a in t.anomalies]


def test_loss_is_a_gap_and_only_the_dropped_items_are_missing() -> None:
    t, journal, post, _, _ = load("loss-reorder")
    (conn,) = t.connections.values()
    assert conn.lost == post["dropped_bytes"] > 0
    dropped = {f["seqno"] for f in post["dropped_frames"] if f["seqno"] is not None}
    assert dropped
    want = [(e["opcode"], e["seqno"]) for e in journal if e["event"] == "item" and e["seqno"] not in dropped]
    (s,) = t.streams
    assert [(spec.COMMANDS[i.opcode].name, i.seqno) for i in s.items] == want  # the swapped segments were put back in order
    assert len([x for x in s.snapshots]) == len([e for e in journal if e["event"] == "marker"]) - 1  # one marker lost


def test_anomalies_after_the_loss_are_uncertain() -> None:
    t, _, _, records, _ = load("loss-reorder")
    gap = next(r.number for r in records if r.event.type == "gap")
    kinds = {a.kind for a in t.anomalies if a.uncertain}
    assert "seqno outside snapshot" in kinds  # the lost marker: the next snapshot's items look outside the previous one
    for a in t.anomalies:
        if min(a.frames) > gap:
            assert a.uncertain, a


def test_every_anomaly_of_the_messy_capture_is_uncertain() -> None:
    t, _, _, _, _ = load("loss-reorder")
    assert t.anomalies and all(a.uncertain for a in t.anomalies), [(a.kind, a.frames[:3], a.uncertain) for a in t.anomalies]


# --- regeneration, tshark ------------------------------------------------------------------------


def _shape(records: list[Record]) -> dict[tuple[str, int | None], list[tuple[str, str, int | None]]]:
    """Per (direction, vbucket): the frames' names and seqnos in order (interleaving across vbuckets may differ)."""
    out: dict[tuple[str, int | None], list[tuple[str, str, int | None]]] = defaultdict(list)
    for r in records:
        if r.event.type != "frame":
            continue
        d = dissect(r.event, r.context)
        seqno = d.extras.get("by_seqno")
        out[(r.direction, r.event.vbucket)].append((d.name, d.role, seqno if isinstance(seqno, int) else None))
    return dict(out)


def test_live_samples_regenerate(tmp_path: Path) -> None:
    spec_ = importlib.util.spec_from_file_location("make_live_samples", CAPTURES / "make_live_samples.py")
    assert spec_ and spec_.loader
    mod = importlib.util.module_from_spec(spec_)
    sys.modules["make_live_samples"] = mod  # its dataclasses look their module up
    try:
        spec_.loader.exec_module(mod)
        mod.main(["plain"], out=tmp_path)  # type: ignore[attr-defined]
    finally:
        del sys.modules["make_live_samples"]
    fresh = list(read_records([str(tmp_path / "live-plain.pcap")]))
    _, journal, _, shipped, _ = load("plain")
    assert _shape(fresh) == _shape(shipped), "captures/live-plain.pcap is stale: run python captures/make_live_samples.py"
    again = json.loads((tmp_path / "live-plain.journal.json").read_text())["journal"]
    assert sorted(map(json.dumps, again)) == sorted(map(json.dumps, journal))


def test_live_samples_are_small() -> None:
    for name in NAMES:
        assert (CAPTURES / f"live-{name}.pcap").stat().st_size < 1 << 20
        assert (CAPTURES / f"live-{name}.journal.json").stat().st_size < 1 << 20


def _server_ports(records: list[Record]) -> tuple[int, ...]:
    """The server port of every connection (several with several data nodes)."""
    return tuple(sorted({int(r.conn_label.rsplit(":", 1)[1]) for r in records}))


#: DCP messages whose key tshark reads as collection id + key whether or not collections were negotiated
_DCP_KEYED = frozenset(
    (
        Opcode.DCP_MUTATION,
        Opcode.DCP_DELETION,
        Opcode.DCP_EXPIRATION,
        Opcode.DCP_SYSTEM_EVENT,
        Opcode.DCP_PREPARE,
        Opcode.DCP_COMMIT,
        Opcode.DCP_ABORT,
    )
)


@needs_tshark
@pytest.mark.parametrize("name", CLEAN)
def test_tshark_agrees_on_the_live_samples(name: str) -> None:
    _, _, _, records, _ = load(name)
    theirs = tshark_frames(CAPTURES / f"live-{name}.pcap", ports=_server_ports(records))
    mine = sorted((r for r in records if r.event.type == "frame"), key=lambda r: (r.packet, r.event.offset))
    assert len(theirs) == len(mine)
    for p, r in zip(theirs, mine, strict=True):
        fr = r.event
        assert int(p["couchbase.opcode"], 16) == fr.opcode
        assert opaque_value(p["couchbase.opaque"]) == fr.opaque  # type: ignore[arg-type]
        assert int(p["couchbase.total_bodylength"]) == fr.body_length  # type: ignore[arg-type]
        if fr.is_response:
            assert int(p["couchbase.status"], 16) == fr.status  # type: ignore[arg-type]
        elif p["couchbase.vbucket"] is not None:
            assert int(p["couchbase.vbucket"], 0) == fr.vbucket  # type: ignore[arg-type]
        d = dissect(fr, r.context)
        if d.key and d.cid is None and fr.opcode not in SASL_REQUESTS and fr.opcode not in _DCP_KEYED:
            assert p["couchbase.key"] == d.key_text


@pytest.mark.parametrize("name", NAMES)
def test_anomaly_frames_are_named_once(name: str) -> None:
    t, _, _, _, _ = load(name)
    for a in t.anomalies:
        assert len(a.frames) == len(set(a.frames)), (a.kind, a.frames[:8])


@pytest.mark.parametrize("name", ["rollback-retry", "failover-branches", "purge-rollback"])
def test_every_rollback_is_explained_by_the_rule(name: str) -> None:
    """The producer really applied the rollback rule (kv_engine's failover table, ``protocol.rules.rollback_decision``),
    so replaying it on what was seen must give the observed seqno."""
    t, journal, _, _, _ = load(name)
    rolls = sorted((a for s in t.streams for a in s.attempts if a.outcome == "rollback"), key=lambda a: a.frame)
    truth = [e for e in journal if e["event"] == "stream_request" and e["decision"] == "rollback"]
    assert len(rolls) == len(truth) > 0
    for a, e in zip(rolls, truth, strict=True):
        assert (a.start, a.rollback_seqno) == (e["start"], e["rollback_seqno"])
        assert not a.explanation.startswith(("observed", "cannot")), a.explanation
        # the producer's own reason, unless it hinged on the purge seqno that was not on the wire
        reason = re.sub(r"uuid (\d+)", lambda m: f"uuid 0x{int(m.group(1)):016x}", e["reason"])  # the timeline writes uuids in hex
        assert reason in a.explanation or e["reason"] in a.explanation or "purge seqno was not observed" in a.explanation, (
            a.explanation,
            e["reason"],
        )
