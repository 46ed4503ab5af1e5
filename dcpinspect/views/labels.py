"""Values as the views write them in text: a seqno, one line per frame of the frame list."""

from __future__ import annotations

from typing import Any

from ..protocol.rules import MAX_SEQNO

__all__ = ["row_label", "seqno_label"]


def seqno_label(v: int | None) -> str:
    """A seqno as text: ``max`` for 2^64-1, ``-`` for unknown."""
    return "-" if v is None else ("max" if v == MAX_SEQNO else str(v))


def row_label(r: dict[str, Any]) -> str:
    """One entry of the frame list (a row of the explorer's page), plain text: a Select widget renders it as text, never HTML."""
    bits = [f"{r['frame']:>8}", r["dir"] or "", r["name"] or r["type"] or ""]
    if r["vbucket"] is not None:
        bits.append(f"vb {r['vbucket']}")
    if r["status_name"]:
        bits.append(str(r["status_name"]))
    if r["key"]:
        key = str(r["key"])
        bits.append(repr(key[:40] + ("..." if len(key) > 40 else "")))
    if r["seqno"] is not None:
        bits.append(f"seqno {seqno_label(r['seqno'])}")
    if r["problems"]:
        bits.append(f"! {len(r['problems'])} problem(s)")
    return "  ".join(bits)
