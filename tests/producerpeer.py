"""A test consumer driving one sans-IO ProducerConnection (shared by the producer tests)."""

from __future__ import annotations

from dcpinspect import encode
from dcpinspect.live.cluster import Cluster
from dcpinspect.live.producer import ProducerConnection
from dcpinspect.live.sasl import plain_payload
from dcpinspect.protocol.enums import Feature
from dcpinspect.protocol.rules import MAX_SEQNO as FOREVER
from dcpinspect.wire.decoder import FrameDecoder
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.dissection import Dissection

__all__ = ["ALT", "COLLECTIONS", "FOREVER", "JSON", "SNAPPY", "XATTR", "Peer", "make", "names", "stream_extras", "stream_messages"]


def stream_extras(
    *, start: int = 0, end: int = FOREVER, uuid: int = 0, ss: int | None = None, se: int | None = None, flags: int = 0
) -> dict[str, int]:
    """A DCP_STREAM_REQ's extras; the snapshot bounds default to the start (a complete snapshot)."""
    return {
        "flags": flags,
        "start_seqno": start,
        "end_seqno": end,
        "vb_uuid": uuid,
        "snap_start_seqno": start if ss is None else ss,
        "snap_end_seqno": start if se is None else se,
    }


COLLECTIONS, JSON, ALT, XATTR, SNAPPY = Feature.COLLECTIONS, Feature.JSON, Feature.ALT_REQUEST_SUPPORT, Feature.XATTR, Feature.SNAPPY


class Peer:
    """A consumer driving one ProducerConnection; every frame it gets back must dissect cleanly."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.conn = ProducerConnection(cluster)
        self.dec = FrameDecoder()
        self.now = 0.0
        self.opaque = 0

    def send(self, *frames: bytes) -> list[Dissection]:
        for f in frames:
            self.conn.receive(f, self.now)
        return self.drain()

    def drain(self) -> list[Dissection]:
        out = []
        for ev in self.dec.feed(self.conn.data_to_send()):
            assert ev.type == "frame", ev
            d = dissect(ev, self.conn.context)
            assert not d.problems, (d.name, d.variant, d.problems)
            out.append(d)
        return out

    def tick(self, dt: float) -> list[Dissection]:
        self.now += dt
        self.conn.tick(self.now)
        return self.drain()

    def request(self, name: str, **kw) -> Dissection:
        self.opaque += 1
        replies = [d for d in self.send(encode(name, opaque=self.opaque, **kw)) if d.role == "response" and d.frame.opaque == self.opaque]
        assert len(replies) == 1, replies
        return replies[0]

    def status(self, name: str, **kw) -> int:
        return self.request(name, **kw).frame.status

    def bootstrap(self, *, features=(COLLECTIONS, JSON, ALT), open_flags=0x01, controls=None) -> None:
        if features:
            assert self.request("HELLO", key="test", value={"features": [(f,) for f in features]}).frame.status == 0
        assert self.status("SASL_AUTH", key="PLAIN", value=plain_payload("Administrator", "password")) == 0
        assert self.status("SELECT_BUCKET", key="default") == 0
        assert self.status("DCP_OPEN", key="test-conn", extras={"flags": open_flags}) == 0
        for k, v in ({"enable_noop": "true"} if controls is None else controls).items():
            assert self.status("DCP_CONTROL", key=k, value=v) == 0, k

    def stream_req(self, vb: int = 0, *, start=0, end=FOREVER, uuid=0, ss=None, se=None, flags=0, value=None) -> list[Dissection]:
        self.opaque += 1
        extras = stream_extras(start=start, end=end, uuid=uuid, ss=ss, se=se, flags=flags)
        return self.send(
            encode("DCP_STREAM_REQ", extras=extras, vbucket=vb, opaque=self.opaque, value=value, datatype=0x01 if value else 0)
        )


def make(items: int = 10, vbuckets: int = 2, **kw) -> tuple[Cluster, Peer]:
    cluster = Cluster(seed=7, **kw)
    cluster.create_bucket("default", vbuckets=vbuckets, items=items)
    return cluster, Peer(cluster)


def names(ds: list[Dissection]) -> list[str]:
    return [d.name for d in ds]


def stream_messages(ds: list[Dissection]) -> list[Dissection]:
    return [d for d in ds if d.role == "request" and d.name != "DCP_NOOP"]
