"""A document's history and what each rollback cost: simulator sessions recorded to pcap, with known answers.

Each scenario drives the sans-IO producer (:class:`~dcpinspect.live.producer.ProducerConnection`
on a :class:`~dcpinspect.live.cluster.Cluster`) from scripted consumers, records
every byte each way as a TCP conversation (``pcapfactory``, one global clock so
the frames of several connections keep the order they happened in), reads the
pcap back with the ordinary readers and asks the questions.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest
from paths import CAPTURES
from pcapfactory import Conn, Msg, write_capture
from producerpeer import COLLECTIONS, JSON, stream_extras

from dcpinspect import encode
from dcpinspect.live.cluster import Cluster
from dcpinspect.live.producer import ProducerConnection
from dcpinspect.live.sasl import plain_payload
from dcpinspect.protocol.enums import Status
from dcpinspect.protocol.rules import MAX_SEQNO
from dcpinspect.tables.history import (
    FATES,
    key_absence,
    key_history,
    key_versions,
    read_tables,
    rollback_losses,
    rollback_lost_keys,
)
from dcpinspect.tables.timeline import story
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.dissect import dissect

T0 = 1_700_000_100.0  # after the handshakes pcapfactory writes from 1_700_000_000


class Wire:
    """One consumer connection to a data node of ``cluster``, its bytes recorded (``record=False``: not captured yet)."""

    clock = itertools.count()

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        *,
        node: int = 0,
        port: int = 50000,
        features: tuple[int, ...] = (COLLECTIONS, JSON),
        record: bool = True,
        dcp: bool = True,
    ) -> None:
        self.conn = ProducerConnection(cluster, node=node)
        self.name = name
        self.msgs: list[Msg] = []
        self.dec = FrameDecoder()
        self.opaque = 0x100
        self.port = port
        self.node = node
        self.record = record
        self.got: list = []
        self._send(encode("HELLO", opaque=1, key="t", value={"features": [(f,) for f in features]}))
        self._send(encode("SASL_AUTH", opaque=2, key="PLAIN", value=plain_payload("Administrator", "password")))
        self._send(encode("SELECT_BUCKET", opaque=3, key="default"))
        if not dcp:  # a KV connection
            return
        self._send(encode("DCP_OPEN", opaque=4, key=name, extras={"flags": 0x01}))
        self._send(encode("DCP_CONTROL", opaque=5, key="enable_noop", value="true"))  # the simulator streams with noops on

    def _ts(self) -> float:
        return T0 + next(Wire.clock) * 0.05

    def _send(self, frame: bytes) -> None:
        if self.record:
            self.msgs.append(Msg("c2s", frame, ts=self._ts()))
        self.conn.receive(frame, 0.0)
        self.pump()

    def pump(self) -> None:
        self.conn.pump(0.0)
        out = self.conn.data_to_send()
        if out:
            if self.record:
                self.msgs.append(Msg("s2c", out, ts=self._ts()))
            self.got += [dissect(ev, self.conn.context) for ev in self.dec.feed(out)]

    def stream(self, vb: int = 0, *, start: int = 0, end: int = MAX_SEQNO, uuid: int = 0, value: object = None) -> int:
        """A stream request; returns its response status."""
        self.opaque += 1
        extras = stream_extras(start=start, end=end, uuid=uuid)
        before = len(self.got)
        self._send(encode("DCP_STREAM_REQ", extras=extras, vbucket=vb, opaque=self.opaque, value=value, datatype=0x01 if value else 0))
        return next(d.frame.status for d in self.got[before:] if d.name == "DCP_STREAM_REQ" and d.role == "response")

    def conn_(self, k: int) -> Conn:
        return Conn(client=("10.0.0.1", self.port), server=("10.0.0.2", 11210 + self.node), msgs=self.msgs, close=None)


def capture(tmp_path: Path, *wires: Wire, name: str = "s.pcap") -> str:
    path = tmp_path / name
    write_capture(path, [w.conn_(k) for k, w in enumerate(wires)], step=0.0001)
    return str(path)


def bucket(nodes: int = 1, vbuckets: int = 1, items: int = 0) -> tuple[Cluster, object]:
    cluster = Cluster(seed=3, nodes=nodes)
    b = cluster.create_bucket("default", vbuckets=vbuckets, items=items)
    return cluster, b


def pump(*wires: Wire) -> None:
    for w in wires:
        w.pump()


# --------------------------------------------------------------------------- a failover that loses N items


@pytest.fixture(scope="module")
def failover(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, int]:
    """vb 0: 10 docs, then k-a k-b k-c (11-13) live; failover lose=2 (k-b, k-c gone); the consumer reconnects to node 1
    under the same name, rolls back to 11, retries; the new branch writes k-b again (12) and k-d (13).
    Known answer: the rollback cut 2 items (k-b 12, k-c 13): k-b re-delivered (changed), k-c possibly lost."""
    cluster, b = bucket(nodes=2)
    for i in range(10):
        b.mutate(f"doc-{i}")
    old = b.vbuckets[0].uuid
    a = Wire(cluster, "app", node=0, port=50001)
    assert a.stream(0) == Status.SUCCESS
    for k in ("k-a", "k-b", "k-c"):
        b.mutate(k, {"v": 1})
        pump(a)
    b.failover(0, lose=2)
    pump(a)
    n = Wire(cluster, "app", node=1, port=50002)
    assert n.stream(0, start=13, uuid=old) == Status.ROLLBACK
    assert n.stream(0, start=11, uuid=old) == Status.SUCCESS
    b.mutate("k-b", {"v": 2})
    pump(n)
    b.mutate("k-d", {"v": 1})
    pump(n)
    return capture(tmp_path_factory.mktemp("failover"), a, n), old, b.vbuckets[0].uuid


def test_a_failover_that_lost_two_items_costs_those_two(failover: tuple[str, int, int]) -> None:
    path, old, _new = failover
    r = read_tables(path)
    losses = rollback_losses(r.frames, r.tables)
    assert len(losses) == 1
    row = losses.iloc[0]
    assert (row["consumer"], row["vbucket"], row["rollback_seqno"], row["uuid"]) == ("app", 0, 11, old)
    assert row["items"] == 2 and row["keys"] == ["k-b", "k-c"] and (row["first_seqno"], row["last_seqno"]) == (12, 13)
    assert (row["redelivered"], row["possibly_lost"], row["lost_keys"]) == (1, 1, ["k-c"])
    keys = rollback_lost_keys(r.frames, r.tables).set_index("key")
    assert keys.loc["k-b", "status"] == "redelivered" and keys.loc["k-b", "new_seqno"] == 12 and not keys.loc["k-b", "same_version"]
    assert keys.loc["k-c", "status"] == "possibly lost" and keys.loc["k-c", "reason"] == "not re-sent before the capture ended"
    text = story(r.timeline, losses=losses)
    assert "cost: the rollback cost 2 items above seqno 11 (keys: k-b, k-c; 1 re-delivered, 1 possibly lost)" in text
    assert story(r.timeline) == text.replace(
        "\n      cost: the rollback cost 2 items above seqno 11 (keys: k-b, k-c; 1 re-delivered, 1 possibly lost)", ""
    )


def test_the_fates_across_the_failover(failover: tuple[str, int, int]) -> None:
    path, _old, _new = failover
    r = read_tables(path)
    v = key_versions(r.frames, r.tables)
    assert set(v["fate"]) <= set(FATES)
    kb = key_history(None, "k-b", frames=r.frames, tables=r.tables)
    assert kb["seqno"].tolist() == [12, 12] and kb["conn"].nunique() == 2  # the same seqno on two branches
    assert kb["fate"].tolist() == ["rolled back", "current"] and kb["fate_seqno"].iloc[0] == 11
    assert kb["consumer"].tolist() == ["app", "app"] and kb["cas"].iloc[0] != kb["cas"].iloc[1]
    ka = key_history(None, "k-a", frames=r.frames, tables=r.tables)
    assert ka["fate"].tolist() == ["current"]  # 11 survived the failover
    kc = key_history(None, "k-c", frames=r.frames, tables=r.tables)
    assert kc["fate"].tolist() == ["rolled back"]
    doc = key_history(None, "doc-3", frames=r.frames, tables=r.tables)
    assert doc["snap_type"].iloc[0].startswith("disk") and doc["fate"].tolist() == ["current"]


# --------------------------------------------------------------------------- a key in two collections


def test_a_key_in_two_collections_is_two_documents(tmp_path: Path) -> None:
    cluster, b = bucket()
    cid = b.create_collection("c1")
    b.mutate("k1", {"in": "default"})
    b.mutate("k1", {"in": "c1"}, collection="c1")
    b.mutate("only-default")
    w = Wire(cluster, "all", port=50003)
    assert w.stream(0) == Status.SUCCESS
    f = Wire(cluster, "filtered", port=50004)
    assert f.stream(0, value={"collections": [f"{cid:x}"]}) == Status.SUCCESS
    r = read_tables(capture(tmp_path, w, f))
    both = key_history(None, "k1", frames=r.frames, tables=r.tables)
    assert sorted(zip(both["consumer"], both["cid"], strict=True)) == [("all", 0), ("all", cid), ("filtered", cid)]
    assert (both["fate"] == "current").all()  # two documents: neither supersedes the other
    one = key_history(None, "k1", collection=cid, frames=r.frames, tables=r.tables)
    assert len(one) == 2 and set(one["cid"]) == {cid}
    default = key_history(None, "k1", collection=0, frames=r.frames, tables=r.tables)
    assert default["consumer"].tolist() == ["all"]
    # the filtered consumer never saw the default collection's document: the filter says why
    assert key_absence(r.frames, r.tables, "only-default", collection=0) == ""
    f_only = {k: (v[v["conn"] == 2] if "conn" in v.columns and k != "connections" else v) for k, v in r.tables.items()}
    reason = key_absence(r.frames, f_only, "only-default", collection=0)
    assert (
        reason.startswith("never seen on any stream")
        and f"collection 0x0 was filtered out by every stream request (filters [{cid:#x}])" in reason
    )


def test_a_key_never_seen_says_so() -> None:
    r = read_tables(CAPTURES / "live-plain.pcap")
    out = key_history(None, "no-such-key", frames=r.frames, tables=r.tables)
    assert out.empty and out.attrs["absence"].startswith("never seen on any stream (4 streams of vbuckets 0, 1, 2, 3")


# --------------------------------------------------------------------------- a stream re-requested after close


def test_a_stream_re_requested_after_close(tmp_path: Path) -> None:
    cluster, b = bucket()
    for i in range(5):
        b.mutate(f"d{i}")
    w = Wire(cluster, "again", port=50005)
    assert w.stream(0, end=5) == Status.SUCCESS  # ends OK at 5
    assert w.stream(0, end=5) == Status.SUCCESS  # the same from 0 again: the same seqnos re-delivered
    b.mutate("d1", {"v": 2})  # seqno 6
    assert w.stream(0, start=5, uuid=b.vbuckets[0].uuid, end=6) == Status.SUCCESS
    r = read_tables(capture(tmp_path, w))
    d1 = key_history(None, "d1", frames=r.frames, tables=r.tables)
    assert d1["seqno"].tolist() == [2, 2, 6] and d1["stream"].nunique() == 3
    assert d1["fate"].tolist() == ["re-delivered", "superseded", "current"]
    assert d1["fate_seqno"].tolist()[:2] == [2, 6]
    assert rollback_losses(r.frames, r.tables).empty


# --------------------------------------------------------------------------- a rollback to 0 (purge), resumed under another name


def test_a_rollback_to_zero_counts_everything_above_zero(tmp_path: Path) -> None:
    cluster, b = bucket()
    for i in range(6):
        b.mutate(f"p{i}")
    first = Wire(cluster, "saver", port=50006)
    assert first.stream(0, end=6) == Status.SUCCESS
    uuid = b.vbuckets[0].uuid
    b.delete("p0")  # 7
    b.purge(0)  # purge seqno 7 > the resume's start 6
    again = Wire(cluster, "resumer", port=50007)
    assert again.stream(0, start=6, uuid=uuid) == Status.ROLLBACK
    assert again.stream(0) == Status.SUCCESS
    r = read_tables(capture(tmp_path, first, again))
    losses = rollback_losses(r.frames, r.tables)
    row = losses.iloc[0]
    assert row["rollback_seqno"] == 0 and row["items"] == 6 and row["keys"] == [f"p{i}" for i in range(6)]
    detail = rollback_lost_keys(r.frames, r.tables).set_index("key")
    retried = key_versions(r.frames, r.tables)
    resent = retried[retried["consumer"] == "resumer"].set_index("key")
    for k in detail.index:  # re-delivered exactly when the retry sent a mutation of it; else possibly lost
        if k in resent.index and resent.loc[k, "name"] == "DCP_MUTATION":
            assert detail.loc[k, "status"] == "redelivered" and detail.loc[k, "same_version"]
        else:
            assert detail.loc[k, "status"] == "possibly lost"
    p0 = key_history(None, "p0", frames=r.frames, tables=r.tables)
    assert p0["lineage"].tolist() == ["saver"] * len(p0)  # the resumer continues the saver's history
    assert p0["fate"].iloc[0] == "rolled back"


# --------------------------------------------------------------------------- a capture that starts mid-stream


def test_items_before_any_captured_request_still_count(tmp_path: Path) -> None:
    cluster, b = bucket()
    for i in range(4):
        b.mutate(f"m{i}")
    w = Wire(cluster, "mid", port=50008, record=False)  # the capture starts later: no HELLO, no DCP_OPEN, no stream request
    w.opaque += 1
    w.conn.receive(encode("DCP_STREAM_REQ", extras=stream_extras(), vbucket=0, opaque=w.opaque), 0.0)
    w.record = True
    w.pump()  # the items are captured
    w.opaque += 1
    w.msgs.append(Msg("c2s", encode("DCP_CLOSE_STREAM", vbucket=0, opaque=w.opaque), ts=w._ts()))
    w.conn.receive(encode("DCP_CLOSE_STREAM", vbucket=0, opaque=w.opaque), 0.0)
    w.pump()
    assert w.stream(0, start=4, uuid=0xDEAD) == Status.ROLLBACK  # a uuid the vbucket never had: rollback to 0
    r = read_tables(capture(tmp_path, w))
    row = rollback_losses(r.frames, r.tables).iloc[0]
    assert row["consumer"] == "conn 1" and row["rollback_seqno"] == 0 and row["items"] == 4
    assert row["possibly_lost"] == 4 and row["redelivered"] == 0


# --------------------------------------------------------------------------- a dedup violation


def test_a_key_twice_in_one_snapshot_is_a_dedup_violation() -> None:
    r = read_tables(CAPTURES / "session-broken.pcap")
    h = key_history(None, "airline_10", frames=r.frames, tables=r.tables)
    assert h["seqno"].tolist() == [2, 4] and h["snapshot"].nunique() == 1
    assert h["fate"].tolist() == ["superseded in snapshot", "current"] and h["dedup_violation"].tolist() == [True, False]
    clean = key_history([CAPTURES / "dcp-session.pcap"], "airline_10")
    assert not clean["dedup_violation"].any()


def test_the_shipped_failover_capture() -> None:
    r = read_tables(CAPTURES / "live-failover-branches.pcap")
    losses = rollback_losses(r.frames, r.tables)
    assert losses[["conn", "rollback_seqno", "items", "possibly_lost"]].values.tolist() == [[3, 12, 3, 3]]
    assert losses["keys"].iloc[0] == ["before-loss-004", "before-loss-006", "before-loss-008"]
    assert isinstance(losses, pd.DataFrame)


# --------------------------------------------------------------------------- a key written after the stream ended


def test_a_key_written_after_the_stream_ended_says_so(tmp_path: Path) -> None:
    cluster, b = bucket()
    for i in range(3):
        b.mutate(f"e{i}")
    w = Wire(cluster, "early", port=50009)
    assert w.stream(0, end=3) == Status.SUCCESS  # ends OK at 3
    kv = Wire(cluster, "writer", port=50010, features=(JSON,), dcp=False)
    kv._send(encode("SET", opaque=0x77, key="late", extras={"flags": 0, "expiration": 0}, value=b"{}", vbucket=0))
    assert any(d.name == "SET" and d.role == "response" and d.frame.status == 0 for d in kv.got)
    r = read_tables(capture(tmp_path, w, kv))
    reason = key_history(None, "late", frames=r.frames, tables=r.tables).attrs["absence"]
    assert reason.startswith("never seen on any stream (1 stream of vbucket 0; the capture has SET of it at frame ")
    assert "on vbucket 0; the streams of vbucket 0 received their last item at frame " in reason and reason.endswith(", before it)")
