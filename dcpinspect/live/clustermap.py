r"""Cluster maps: the JSON a data node answers GET_CLUSTER_CONFIG (0xb5) with, and reading one back.

Pure, no I/O.  A config names the data nodes (``nodesExt``: host and kv port, the
array index is the node's server index) and, for a bucket, which node holds each
vbucket (``vBucketServerMap.vBucketMap``: vbucket -> [active, replica...], -1 none).
What a config must look like for real clients follows the official SDK's parser
(couchbase-cxx-client core/topology/configuration_json.hxx): the JSON types are
part of the contract (``rev`` an integer, ``collectionsManifestUid`` a hex *string*,
``services`` in every ``nodesExt`` entry, ``services.kv`` the port really listening).
The simulator advertises only the kv service: a client pings every service a config
names, and it serves no HTTP.

1. :func:`config_json` builds what a simulated node answers: the global config
   without a bucket, the bucket's (with its vbucket map) with one.
2. :func:`parse_config` reads any server's config into a :class:`ClusterMap`; a
   missing or ``$HOST`` hostname means the host the client connected to.

>>> from dcpinspect.live.cluster import Cluster
>>> cluster = Cluster(seed=1)
>>> bucket = cluster.create_bucket("default", vbuckets=4)
>>> cfg = config_json(cluster, bucket, node=0)
>>> cfg["vBucketServerMap"]["vBucketMap"]
[[0], [0], [0], [0]]
>>> import json
>>> m = parse_config(json.dumps(cfg).encode(), connected=("127.0.0.1", 11210))
>>> m.bucket, m.nodes, m.active_node(3)
('default', (('127.0.0.1', 11210),), 0)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .cluster import Bucket, Cluster

__all__ = ["DEFAULT_KV_PORT", "HOST_PLACEHOLDER", "ClusterMap", "config_json", "parse_config"]

#: the kv port a config names for a node whose listening address is not known (kv_engine's default)
DEFAULT_KV_PORT = 11210
#: a hostname clients replace with the host they connected to
HOST_PLACEHOLDER = "$HOST"
#: what the simulator's buckets say they can do (names the SDK recognises; each is served)
_BUCKET_CAPABILITIES = ("collections", "durableWrite", "dcp", "cbhello", "cccp", "nodesExt", "xattr")


@dataclass(frozen=True)
class ClusterMap:
    """One cluster map: its revision, the data nodes and (for a bucket) the vbucket map.

    ``nodes`` holds (host, kv port) by server index (port 0: the node offers no kv
    service); ``vbucket_map`` is vbucket -> (active node, replica nodes...), -1 for
    none; ``bucket`` is the bucket's name (``None`` for a global config);
    ``this_node`` is the one entry marked ``thisNode`` (``None``: none, or several).
    """

    rev: int
    nodes: tuple[tuple[str, int], ...]
    vbucket_map: tuple[tuple[int, ...], ...]
    bucket: str | None
    this_node: int | None = None

    def active_node(self, vb: int) -> int | None:
        """The server index of the node holding ``vb`` active (``None``: unknown vbucket or no active copy)."""
        if not 0 <= vb < len(self.vbucket_map) or not self.vbucket_map[vb]:
            return None
        node = self.vbucket_map[vb][0]
        return node if 0 <= node < len(self.nodes) else None


def _node_entry(address: tuple[str, int] | None, *, this: bool) -> dict[str, Any]:
    host, port = address if address is not None else (HOST_PLACEHOLDER, DEFAULT_KV_PORT)
    return {"services": {"kv": int(port)}, "hostname": host, "thisNode": this}


def config_json(cluster: Cluster, bucket: Bucket | None, *, node: int) -> dict[str, Any]:
    """What node ``node`` answers GET_CLUSTER_CONFIG with: the global config, or ``bucket``'s.

    Every node of the cluster is listed in ``nodesExt`` (``thisNode`` marks ``node``) with
    only its kv port; a node whose address is not known yet is ``$HOST`` on the default
    port.  The revision is the cluster's (bumped whenever a vbucket map changes).
    """
    nodes = [_node_entry(a, this=i == node) for i, a in enumerate(cluster.addresses)]
    cfg: dict[str, Any] = {"rev": int(cluster.rev), "revEpoch": 1}
    if bucket is None:
        cfg["nodesExt"] = nodes
        return cfg
    vmap = bucket.vbucket_map()
    uuid = getattr(bucket, "uuid", None)
    cfg.update(
        {
            "name": bucket.name,
            "uuid": uuid if isinstance(uuid, str) else hashlib.sha256(bucket.name.encode()).hexdigest()[:32],
            "nodeLocator": "vbucket",
            "bucketType": "membase",
            "collectionsManifestUid": f"{bucket.manifest.uid:x}",
            "bucketCapabilitiesVer": "",
            "bucketCapabilities": list(_BUCKET_CAPABILITIES),
            "nodesExt": nodes,
            "vBucketServerMap": {
                "hashAlgorithm": "CRC",
                "numReplicas": max((len(row) - 1 for row in vmap), default=0),
                "serverList": [f"{e['hostname']}:{e['services']['kv']}" for e in nodes],
                "vBucketMap": vmap,
            },
        }
    )
    return cfg


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is not an integer ({type(value).__name__})")
    return value


def _node(entry: Any, i: int, connected: tuple[str, int]) -> tuple[str, int]:
    if not isinstance(entry, dict):
        raise ValueError(f"nodesExt[{i}] is not an object")
    services = entry.get("services")
    if not isinstance(services, dict):
        raise ValueError(f"nodesExt[{i}] has no services object")
    port = _int(services["kv"], f"nodesExt[{i}].services.kv") if "kv" in services else 0
    host = entry.get("hostname")
    if host is not None and not isinstance(host, str):
        raise ValueError(f"nodesExt[{i}].hostname is not a string")
    if not host or host == HOST_PLACEHOLDER:
        host = connected[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 literal
    return host, port


def _map_rows(rows: Any, nodes: int) -> tuple[tuple[int, ...], ...]:
    if not isinstance(rows, Sequence) or isinstance(rows, str):
        raise ValueError("vBucketMap is not an array")
    out = []
    for vb, row in enumerate(rows):
        if not isinstance(row, list) or not row:
            raise ValueError(f"vBucketMap[{vb}] is not a non-empty array")
        ids = tuple(_int(n, f"vBucketMap[{vb}] entry") for n in row)
        if any(n < -1 or n >= nodes for n in ids):
            raise ValueError(f"vBucketMap[{vb}] names a server index outside nodesExt ({list(ids)})")
        out.append(ids)
    return tuple(out)


def parse_config(value: bytes, *, connected: tuple[str, int]) -> ClusterMap:
    """Read a GET_CLUSTER_CONFIG value (or a pushed config) into a :class:`ClusterMap`.

    ``connected`` is the (host, port) the client is connected to: it replaces a missing,
    empty or ``$HOST`` hostname.  Raises ValueError (one line) for anything a client
    could not route with: not JSON, no ``nodesExt``, a node without ``services``, a
    non-integer port or revision, a vbucket map naming an unknown node.
    """
    try:
        cfg = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"config is not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError("config is not a JSON object")
    rev = _int(cfg["rev"], "rev") if "rev" in cfg else 0
    entries = cfg.get("nodesExt")
    if not isinstance(entries, list) or not entries:
        raise ValueError("config has no nodesExt array")
    nodes = tuple(_node(e, i, connected) for i, e in enumerate(entries))
    vmap: tuple[tuple[int, ...], ...] = ()
    server_map = cfg.get("vBucketServerMap")
    if server_map is not None:
        if not isinstance(server_map, dict):
            raise ValueError("vBucketServerMap is not an object")
        vmap = _map_rows(server_map.get("vBucketMap", []), len(nodes))
    name = cfg.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError("name is not a string")
    marked = [i for i, e in enumerate(entries) if e.get("thisNode") is True]
    return ClusterMap(rev=rev, nodes=nodes, vbucket_map=vmap, bucket=name, this_node=marked[0] if len(marked) == 1 else None)
