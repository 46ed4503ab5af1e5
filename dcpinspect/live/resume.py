"""Where a DCP consumer resumes from: the per-vbucket positions and their JSON form.

A resume point is what a stream request needs to continue a stream without
rollback (kv_engine's ``docs/dcp``, "stream request" and "rollback"): the last seqno, the
bounds of the snapshot it belongs to, and the failover log that names the
history.  :class:`ResumeState` is the persistence format: a version-1 JSON
document, one entry per vbucket.

1. Every number is an unsigned 64-bit integer; anything else is refused with
   ``ValueError`` (a state file is input, never trusted).
2. ``snap_start <= seqno <= snap_end`` always holds for a stored position.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol.rules import MAX_SEQNO

__all__ = ["ResumeState", "VbState", "u64"]


def u64(v: Any) -> int:
    """``v`` if it is an unsigned 64-bit integer (``ValueError`` otherwise; a bool is not one)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SEQNO:
        raise ValueError(f"{v!r} is not an unsigned 64-bit integer")
    return v


@dataclass
class VbState:
    """Where a vbucket's stream stands: enough to resume it.

    ``seqno`` is the last seqno received, ``snap_start``/``snap_end`` the
    bounds of the snapshot it belongs to (equal to ``seqno`` once that
    snapshot is complete), ``vb_uuid`` the newest failover-log entry's uuid,
    ``failover_log`` the log as ``(uuid, seqno)`` pairs, newest first.
    """

    vb_uuid: int = 0
    seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0
    failover_log: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "vb_uuid": self.vb_uuid,
            "seqno": self.seqno,
            "snap_start": self.snap_start,
            "snap_end": self.snap_end,
            "failover_log": [[u, s] for u, s in self.failover_log],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VbState:
        """Inverse of :meth:`to_dict` (raises ``ValueError`` on a malformed entry)."""
        try:
            st = cls(
                vb_uuid=u64(d.get("vb_uuid", 0)),
                seqno=u64(d.get("seqno", 0)),
                snap_start=u64(d.get("snap_start", d.get("seqno", 0))),
                snap_end=u64(d.get("snap_end", d.get("seqno", 0))),
                failover_log=[(u64(u), u64(s)) for u, s in d.get("failover_log", [])],
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed vbucket state: {exc}") from None
        if not st.snap_start <= st.seqno <= st.snap_end:
            raise ValueError(f"snapshot {st.snap_start}..{st.snap_end} does not contain seqno {st.seqno}")
        return st


@dataclass
class ResumeState:
    """Per-vbucket resume points of a consumer; JSON-serialisable.

    >>> s = ResumeState(bucket="default", vbuckets={0: VbState(vb_uuid=7, seqno=3, snap_start=3, snap_end=3, failover_log=[(7, 0)])})
    >>> ResumeState.from_json(s.to_json()) == s
    True
    """

    bucket: str = ""
    vbuckets: dict[int, VbState] = field(default_factory=dict)

    def to_json(self) -> str:
        """The state as a JSON document."""
        return json.dumps(
            {"version": 1, "bucket": self.bucket, "vbuckets": {str(vb): st.to_dict() for vb, st in sorted(self.vbuckets.items())}},
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ResumeState:
        """Parse :meth:`to_json` output (raises ``ValueError`` if it is not one)."""
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"resume state is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("vbuckets"), dict):
            raise ValueError("not a dcpinspect resume state (version 1)")
        vbs: dict[int, VbState] = {}
        for k, v in doc["vbuckets"].items():
            if not str(k).isdigit() or not isinstance(v, dict):
                raise ValueError(f"bad vbucket entry {k!r}")
            vbs[int(k)] = VbState.from_dict(v)
        return cls(bucket=str(doc.get("bucket", "")), vbuckets=vbs)

    def copy(self) -> ResumeState:
        """A deep copy."""
        return copy.deepcopy(self)
