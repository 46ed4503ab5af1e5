"""The simulator's named scenarios (``dcpinspect sim --scenario NAME``): scripted workloads and scenario controls.

Each is a coroutine run on the simulator's loop once it listens; :data:`SCENARIOS`
names them with a one-line description, :data:`SCENARIO_NODES` says how many data
nodes the ones that need more than one take (a failover promotes a replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .cluster import Bucket, Cluster

__all__ = ["SCENARIOS", "SCENARIO_NODES", "Scenario", "ScenarioHost"]


class ScenarioHost(Protocol):
    """What a scenario drives: the :class:`~dcpinspect.live.sim.Simulator` (its controls wake the connections)."""

    bucket: Bucket
    cluster: Cluster
    rng: random.Random

    def kick(self) -> None: ...  # noqa: D102
    def mutate(self, key: str, value: Any = None, **kw: Any) -> int: ...  # noqa: D102
    def delete(self, key: str, **kw: Any) -> int: ...  # noqa: D102
    def failover(self, vbucket: int, *, lose: int = 0, partial: int = 0) -> int: ...  # noqa: D102
    def purge(self, vbucket: int, upto: int | None = None) -> int: ...  # noqa: D102
    def create_collection(self, name: str, *, scope: str = "_default", max_ttl: int | None = None) -> int: ...  # noqa: D102
    def drop_collection(self, name: str | int) -> int: ...  # noqa: D102
    def disk_pressure(self, on: bool = True) -> None: ...  # noqa: D102
    def fail_backfills(self, vbucket: int | None = None, *, times: int = 1) -> None: ...  # noqa: D102
    def drop_cursors(self, vbucket: int | None = None) -> int: ...  # noqa: D102
    def lose_privileges(self, user: str | None = None) -> None: ...  # noqa: D102
    def drop_connections(self, node: int | None = None) -> None: ...  # noqa: D102


Scenario = Callable[[ScenarioHost], Awaitable[None]]


async def _steady(sim: ScenarioHost) -> None:
    """A mutation every 100 ms on a random existing document."""
    i = 0
    while True:
        await asyncio.sleep(0.1)
        i += 1
        n = sim.rng.randrange(max(1, 100))
        sim.mutate(f"doc-{n:04d}", {"id": n, "rev": i})


async def _failover(sim: ScenarioHost) -> None:
    """Writes for 1 s, then vbucket 0's node fails over to its replica, which lacked the last 3 items.

    The old node's streams of vbucket 0 end StateChanged and it answers NotMyVbucket for it;
    clients fetch the new cluster map, reconnect to the promoted node and roll back.  Writes go on.
    """
    steady = asyncio.ensure_future(_steady(sim))
    try:
        await asyncio.sleep(1.0)
        sim.failover(0, lose=min(3, sim.bucket.vbuckets[0].high_seqno))
        await asyncio.Event().wait()
    finally:
        steady.cancel()


async def _purge(sim: ScenarioHost) -> None:
    """Deletes a few documents then purges the tombstones of every vbucket (resuming below the purge seqno rolls back to 0)."""
    for n in range(0, 20, 2):
        with contextlib.suppress(KeyError, ValueError):
            sim.delete(f"doc-{n:04d}")
    for vb in range(len(sim.bucket.vbuckets)):
        sim.purge(vb)
    await asyncio.Event().wait()


async def _collections(sim: ScenarioHost) -> None:
    """Creates scope ``inventory`` with collection ``airlines``, writes to it, drops it after 2 s."""
    sim.bucket.create_scope("inventory")
    sim.create_collection("airlines", scope="inventory")
    for i in range(20):
        sim.mutate(f"airline-{i:03d}", {"id": i}, collection="inventory.airlines")
    await asyncio.sleep(2.0)
    sim.drop_collection("inventory.airlines")
    await asyncio.Event().wait()


async def _sync_writes(sim: ScenarioHost) -> None:
    """A prepare every 200 ms, committed (or every third one aborted) 100 ms later."""
    i = 0
    while True:
        key = f"sync-{i % 10:02d}"
        sim.bucket.prepare(key, {"id": i})
        sim.kick()
        await asyncio.sleep(0.1)
        (sim.bucket.abort if i % 3 == 2 else sim.bucket.commit)(key)
        sim.kick()
        await asyncio.sleep(0.1)
        i += 1


async def _flaky(sim: ScenarioHost) -> None:
    """Writes continuously; every 3 s all connections are dropped (streams end Disconnected: nothing is sent)."""
    steady = asyncio.ensure_future(_steady(sim))
    try:
        while True:
            await asyncio.sleep(3.0)
            sim.drop_connections()
    finally:
        steady.cancel()


async def _slow(sim: ScenarioHost) -> None:
    """Disk pressure from the start with a 2 s backfill idle limit: backfilling streams end Slow, memory streams go on."""
    sim.cluster.backfill_idle_limit = min(sim.cluster.backfill_idle_limit, 2.0)
    sim.disk_pressure(True)
    await _steady(sim)


async def _backfill_fail(sim: ScenarioHost) -> None:
    """Every backfill fails (streams from below the high seqno end BackfillFail); writes go on."""
    sim.fail_backfills(None, times=1 << 30)
    await _steady(sim)


async def _backfill_rollback(sim: ScenarioHost) -> None:
    """Backfills stall for 2 s under disk pressure while tombstones are purged: resumed streams end Rollback (sent as StateChanged)."""
    sim.disk_pressure(True)
    for n in range(0, 20, 2):
        with contextlib.suppress(KeyError, ValueError):
            sim.delete(f"doc-{n:04d}")
    await asyncio.sleep(2.0)
    for vb in range(len(sim.bucket.vbuckets)):
        sim.purge(vb)
    sim.disk_pressure(False)
    await asyncio.Event().wait()


async def _lost_privileges(sim: ScenarioHost) -> None:
    """Writes for 2 s, then every user loses its privileges: streams end LostPrivileges (OK without collections)."""
    steady = asyncio.ensure_future(_steady(sim))
    try:
        await asyncio.sleep(2.0)
        sim.lose_privileges()
        await asyncio.Event().wait()
    finally:
        steady.cancel()


async def _cursor_drop(sim: ScenarioHost) -> None:
    """Writes continuously; every 2 s the cursors of in-memory streams are dropped (they go on from a backfill)."""
    steady = asyncio.ensure_future(_steady(sim))
    try:
        while True:
            await asyncio.sleep(2.0)
            sim.drop_cursors()
    finally:
        steady.cancel()


#: name -> (description, coroutine taking the simulator)
SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "steady": ("a mutation every 100 ms", _steady),
    "failover": ("2 nodes; vbucket 0 fails over to its replica after 1 s, 3 items lost (new map, rollback)", _failover),
    "purge": ("tombstones purged at start (rollback to 0 below the purge seqno)", _purge),
    "collections": ("scope/collection created, written, dropped after 2 s", _collections),
    "sync-writes": ("prepare/commit/abort every 200 ms", _sync_writes),
    "flaky": ("connections dropped every 3 s (Disconnected)", _flaky),
    "slow": ("disk pressure: backfills stall and end Slow after 2 s", _slow),
    "backfill-fail": ("every backfill fails (BackfillFail)", _backfill_fail),
    "backfill-rollback": ("purge overtakes stalled backfills (Rollback, sent as StateChanged)", _backfill_rollback),
    "lost-privileges": ("privileges revoked after 2 s (LostPrivileges)", _lost_privileges),
    "cursor-drop": ("cursors dropped every 2 s (streams go on from a backfill)", _cursor_drop),
}
#: scenario -> the data nodes it needs (default 1)
SCENARIO_NODES: dict[str, int] = {"failover": 2}
