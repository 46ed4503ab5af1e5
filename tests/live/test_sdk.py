"""The official Couchbase Python SDK against the simulator: bootstrap, KV in the default and a named collection,
a durable write, and a DCP stream that sees the SDK's mutations with the keys, CAS and seqnos its tokens reported.

The SDK (a C++ core with its own threads) runs in a subprocess: a hang or a crash cannot take the test run with
it; it is killed at the safety deadline and the test fails with its output.  It bootstraps over KV only
(``couchbase://127.0.0.1:PORT``: an IP literal, so no DNS SRV lookup) from ``dcpinspect sim``'s Simulator.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any

import pytest

from dcpinspect.flows.records import Record
from dcpinspect.live.client import run_client_sync
from dcpinspect.live.consumer import ConsumerConfig
from dcpinspect.live.sim import Simulator
from dcpinspect.wire.dissect import dissect
from dcpinspect.wire.dissection import Dissection

pytestmark = [pytest.mark.sdk]  # deselect with -m "not sdk"; a missing SDK fails, it is never skipped

SAFETY = 120.0  # a deadline only: the SDK script ends by itself in a few seconds
VBUCKETS = 64

#: the SDK side: prints one JSON line with every result (CAS and mutation tokens as the SDK reports them)
SDK_SCRIPT = r"""
import json, sys
from datetime import timedelta
from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.diagnostics import ServiceType
from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.exceptions import DocumentNotFoundException
from couchbase.options import ClusterOptions, ClusterTimeoutOptions, UpsertOptions, RemoveOptions, WaitUntilReadyOptions

port, collection, durable = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
timeouts = ClusterTimeoutOptions(
    bootstrap_timeout=timedelta(seconds=15), connect_timeout=timedelta(seconds=5),
    kv_timeout=timedelta(seconds=5), kv_durable_timeout=timedelta(seconds=10),
)
cluster = Cluster(f"couchbase://127.0.0.1:{port}", ClusterOptions(PasswordAuthenticator("Administrator", "password"), timeout_options=timeouts))
out = []
try:
    cluster.wait_until_ready(timedelta(seconds=15), WaitUntilReadyOptions(service_types=[ServiceType.KeyValue]))
    bucket = cluster.bucket("default")

    def token(kind, key, coll, r):
        t = r.mutation_token()
        out.append({"op": kind, "key": key, "collection": coll, "cas": r.cas,
                    "vb": t.partition_id, "uuid": t.partition_uuid, "seqno": t.sequence_number, "bucket": t.bucket_name})

    for coll_name in ("_default", collection):
        coll = bucket.scope("_default").collection(coll_name)
        key = f"sdk-{coll_name}"
        token("upsert", key, coll_name, coll.upsert(key, {"n": 1, "in": coll_name}))
        got = coll.get(key)
        assert got.content_as[dict] == {"n": 1, "in": coll_name}, got.content_as[dict]
        assert got.cas == out[-1]["cas"], (got.cas, out[-1]["cas"])
        token("upsert", key + "-kept", coll_name, coll.upsert(key + "-kept", {"kept": True}))
        token("remove", key, coll_name, coll.remove(key))
        try:
            coll.get(key)
            raise AssertionError("a removed document was found")
        except DocumentNotFoundException:
            pass
    if durable:
        coll = bucket.default_collection()
        token("durable", "sdk-durable", "_default",
              coll.upsert("sdk-durable", {"durable": True}, UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY))))
        assert coll.get("sdk-durable").content_as[dict] == {"durable": True}
        token("durable", "sdk-durable-2", "_default",
              coll.upsert("sdk-durable-2", {"d": 2}, UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY))))
finally:
    cluster.close()
print("RESULT " + json.dumps(out), flush=True)
"""


def run_sdk(port: int, collection: str, durable: bool) -> list[dict[str, Any]]:
    """Run the SDK script; fail with its output if it does not finish cleanly."""
    if importlib.util.find_spec("couchbase") is None:
        pytest.fail("the official Couchbase SDK is not installed: pip install -e '.[dev]' (or deselect with -m 'not sdk')")
    proc = subprocess.Popen(
        [sys.executable, "-c", SDK_SCRIPT, str(port), collection, "1" if durable else "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=SAFETY)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the SDK did not finish within {SAFETY:g} s; its output:\n{output}")
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"the SDK failed (exit {proc.returncode}); its output:\n{output}")
    result: list[dict[str, Any]] = json.loads(lines[-1][len("RESULT ") :])
    return result


def dcp_items(host: str, port: int, vbuckets: list[int]) -> list[Dissection]:
    """What ``dcpinspect client`` streams (to each vbucket's high seqno, from the node the cluster map names)."""
    config = ConsumerConfig(
        bucket="default",
        user="Administrator",
        password="password",
        name="sdk-watch",
        vbuckets=tuple(vbuckets),
        to_latest=True,
        controls=(("enable_sync_writes", "true"),),
        cluster_map=True,
    )
    records: list[Record] = []
    run_client_sync(host, port, config, on_record=records.append, connect_timeout=SAFETY)
    return [dissect(r.event, r.context) for r in records if r.event.type == "frame" and r.direction == "s2c"]


@pytest.mark.parametrize("nodes", [1, 2], ids=["one-node", "two-nodes"])
def test_the_official_sdk_round_trip_and_dcp_sees_its_mutations(nodes: int) -> None:
    sim = Simulator(vbuckets=VBUCKETS, items=0, nodes=nodes, seed=11)
    with sim.run_in_thread() as node:
        cid = node.create_collection("sdk_coll")
        results = run_sdk(node.port, "sdk_coll", durable=True)
        assert [r["op"] for r in results] == ["upsert", "upsert", "remove"] * 2 + ["durable", "durable"]
        bucket = node.sim.cluster.buckets["default"]
        for r in results:
            vb = bucket.vbuckets[r["vb"]]
            assert r["bucket"] == "default" and r["uuid"] == vb.uuid and 0 < r["seqno"] <= vb.high_seqno and r["cas"]
        # dcpinspect's DCP client, following the cluster map, sees each SDK write with its key, CAS and seqno
        seen: dict[tuple[int, int], Dissection] = {}
        for d in dcp_items(node.host, node.port, sorted({r["vb"] for r in results})):
            seqno = d.extras.get("by_seqno", d.extras.get("commit_seqno")) if d.role == "request" else None
            if seqno is not None:
                seen[(d.frame.vbucket or 0, int(seqno))] = d
        removed = {(r["collection"], r["key"]) for r in results if r["op"] == "remove"}
        for r in results:
            d = seen.get((r["vb"], r["seqno"]))
            if r["op"] == "upsert" and (r["collection"], r["key"]) in removed:
                assert d is None  # one snapshot holds a key once: its newest version, the deletion
                continue
            assert d is not None, (r, sorted(seen))
            want = {"upsert": "DCP_MUTATION", "remove": "DCP_DELETION", "durable": "DCP_COMMIT"}[r["op"]]
            assert d.name == want, (r, d.name)
            if d.name == "DCP_COMMIT":  # a commit carries no key: its prepare does, with the CAS
                prepare = seen[(r["vb"], int(d.extras["prepared_seqno"]))]
                assert prepare.name == "DCP_PREPARE" and (prepare.key, prepare.cid) == (r["key"].encode(), 0)
                assert bucket.document(r["key"].encode(), 0).cas == r["cas"]
            else:
                assert (d.key, d.frame.cas, d.cid) == (r["key"].encode(), r["cas"], 0 if r["collection"] == "_default" else cid)
