"""Run Wireshark's ``tshark`` as an independent decoder of memcached binary / DCP captures.

:func:`tshark_frames` returns one record per Couchbase PDU that tshark's
``couchbase`` dissector found, in capture order, so tests can compare
dcpinspect's reading of a capture with Wireshark's.  :data:`TSHARK` is None
when tshark is not installed (tests should skip); set the ``TSHARK``
environment variable to use another binary.

Field names (checked against ``tshark -G fields`` of Wireshark 4.0):
``couchbase.magic``, ``couchbase.opcode``, ``couchbase.opaque``,
``couchbase.vbucket`` (requests only), ``couchbase.status`` (responses only),
``couchbase.key``, ``couchbase.total_bodylength``,
``couchbase.extras.by_seqno`` (mutation/deletion/expiration extras); also
useful: ``couchbase.extras.start_seqno``/``end_seqno`` (stream request,
snapshot marker), ``couchbase.key.collection_id``,
``couchbase.dcp.failover_log.vbucket_uuid``/``.seqno``, ``couchbase.cas``,
``couchbase.extras.flags``, ``couchbase.flex_frame.frame.dcp_stream_id``.

Values are tshark's display strings: hex fields as ``0x..`` (magic ``0x80``,
opcode ``0x57``, status ``0x0000``), decimal ones as digits.  Beware that
Wireshark 4.0 shows the opaque byte-swapped (wire 0x00001000 is displayed
``0x00100000``); :func:`opaque_value` undoes that.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["DEFAULT_FIELDS", "TSHARK", "TsharkError", "needs_tshark", "opaque_value", "tshark_frames", "tshark_version"]

#: the tshark binary, or None when it is not installed
TSHARK: str | None = os.environ.get("TSHARK") or shutil.which("tshark")


def needs_tshark(test: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a test ``tshark`` (``-m "not tshark"`` leaves it out), and skip it where tshark is not installed."""
    return pytest.mark.tshark(pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")(test))


DEFAULT_FIELDS: tuple[str, ...] = (
    "frame.number",
    "tcp.stream",
    "couchbase.magic",
    "couchbase.opcode",
    "couchbase.opaque",
    "couchbase.vbucket",
    "couchbase.status",
    "couchbase.key",
    "couchbase.total_bodylength",
    "couchbase.extras.by_seqno",
)

#: occurrences of one field in one packet are joined with this byte: a comma
#: would be ambiguous, since keys may contain commas
_AGGREGATOR = "\x1f"
#: present once in every Couchbase PDU: counts the PDUs of a packet
_COUNTER = "couchbase.magic"
_PER_PACKET = ("frame.number", "tcp.stream")


def _packet_level(name: str) -> bool:
    """Fields of other protocols (frame, ip, tcp...) describe the packet, shared by its PDUs."""
    return not name.startswith("couchbase")


def _one_or_many(values: list[str]) -> str | list[str] | None:
    return None if not values else values[0] if len(values) == 1 else values


class TsharkError(RuntimeError):
    """tshark is missing, timed out, or failed; carries the command and its stderr."""

    def __init__(self, message: str, cmd: Sequence[str] = (), stderr: str = "", partial: list[dict[str, Any]] | None = None) -> None:
        detail = f"{message}\n  command: {' '.join(cmd)}" if cmd else message
        if stderr:
            detail += f"\n  stderr: {stderr.strip()}"
        super().__init__(detail)
        self.cmd = list(cmd)
        self.stderr = stderr
        #: the PDUs tshark printed before it failed (e.g. on a truncated file)
        self.partial = partial or []


def _clean_stderr(text: str) -> str:
    noise = ("Running as user", "This could be dangerous")
    return "\n".join(line for line in text.splitlines() if line.strip() and not any(n in line for n in noise))


def _run(args: list[str], timeout: float) -> tuple[str, str, int]:
    if TSHARK is None:
        raise TsharkError("tshark is not installed (set TSHARK or install the tshark package)")
    cmd = [TSHARK, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False, env={**os.environ, "LC_ALL": "C.UTF-8"})
    except subprocess.TimeoutExpired as exc:
        raise TsharkError(f"tshark timed out after {timeout} s", cmd) from exc
    except OSError as exc:
        raise TsharkError(f"cannot run tshark: {exc}", cmd) from exc
    return proc.stdout.decode("utf-8", "replace"), _clean_stderr(proc.stderr.decode("utf-8", "replace")), proc.returncode


def tshark_version(*, timeout: float = 30.0) -> str | None:
    """tshark's version number (e.g. ``"4.0.17"``), or None when tshark is absent or broken."""
    if TSHARK is None:
        return None
    try:
        out, _, rc = _run(["--version"], timeout)
    except TsharkError:
        return None
    if rc != 0 or not out:
        return None
    first = out.splitlines()[0]  # "TShark (Wireshark) 4.0.17 (Git v4.0.17 packaged as ...)"
    words = first.split()
    return next((w for w in words if w[:1].isdigit()), first)


def opaque_value(shown: str) -> int:
    """The wire opaque from tshark's display of ``couchbase.opaque`` (Wireshark 4.0 shows it byte-swapped)."""
    return int.from_bytes(int(shown, 16).to_bytes(4, "big"), "little")


def _base_args(path: str | Path, ports: Iterable[int], out_of_order: bool) -> list[str]:
    args = ["-r", str(path), "-n", "-o", "tcp.desegment_tcp_streams:TRUE", "-o", "couchbase.desegment_pdus:TRUE"]
    if out_of_order:
        args += ["-o", "tcp.reassemble_out_of_order:TRUE"]
    for port in ports:
        args += ["-d", f"tcp.port=={int(port)},couchbase"]
    return args


_FIELDS_ESCAPES = str.maketrans({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"})


def _escape(value: str) -> str:
    """Escape a string as ``-T fields`` does in 4.0 (``\\b \\t \\n \\f \\r`` only; backslashes stay)."""
    return value.translate(_FIELDS_ESCAPES)


def _walk(node: Any, wanted: set[str], found: dict[str, list[str]]) -> None:
    """Collect string values of ``wanted`` fields anywhere in a tshark JSON subtree."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in wanted:
                values = v if isinstance(v, list) else [v]
                found.setdefault(k, []).extend(_escape(x) for x in values if isinstance(x, str))
            if isinstance(v, (dict, list)):
                _walk(v, wanted, found)
    elif isinstance(node, list):
        for item in node:
            _walk(item, wanted, found)


def _json_records(base: list[str], fields: Sequence[str], frames: set[int], timeout: float) -> dict[int, list[dict[str, Any]]]:
    """Per-PDU records of the given frames, from tshark's JSON tree (used when ``-T fields`` is ambiguous)."""
    protocols = dict.fromkeys(["frame", "tcp", *(name.split(".")[0] for name in fields), "couchbase"])
    args = [*base, "-T", "json", "--no-duplicate-keys", "-J", " ".join(protocols), "-Y", "couchbase"]
    out, err, rc = _run(args, timeout)
    try:
        packets = json.loads(out) if out.strip() else []
    except json.JSONDecodeError as exc:
        raise TsharkError(f"tshark printed invalid JSON (exit {rc}): {exc}", [str(TSHARK), *args], err) from exc
    wanted = {name for name in fields if not _packet_level(name)}
    shared_names = {name for name in fields if _packet_level(name)}
    result: dict[int, list[dict[str, Any]]] = {}
    for pkt in packets:
        layers = pkt.get("_source", {}).get("layers", {})
        number = int(layers.get("frame", {}).get("frame.number", "0"))
        if number not in frames:
            continue
        shared: dict[str, list[str]] = {}
        _walk({k: v for k, v in layers.items() if k != "couchbase"}, shared_names, shared)
        pdus = layers.get("couchbase", [])
        recs = []
        for pdu in pdus if isinstance(pdus, list) else [pdus]:
            found: dict[str, list[str]] = {}
            _walk(pdu, wanted, found)
            rec: dict[str, Any] = {}
            for name in fields:
                rec[name] = _one_or_many(shared.get(name, []) if name in shared_names else found.get(name, []))
            recs.append(rec)
        result[number] = recs
    return result


def _split_rows(out: str, names: list[str]) -> Iterator[tuple[int, dict[str, list[str]]]]:
    for line in out.split("\n"):  # not splitlines(): keys may hold \x0b, \x1c...
        if not line:
            continue
        cols = line.split("\t")
        cols += [""] * (len(names) - len(cols))
        row = {name: (col.split(_AGGREGATOR) if col else []) for name, col in zip(names, cols, strict=False)}
        number = int(row["frame.number"][0]) if row["frame.number"] else 0
        yield number, row


def tshark_frames(
    path: str | Path,
    *,
    ports: Iterable[int] = (11210, 11211, 11209),
    fields: Sequence[str] = DEFAULT_FIELDS,
    out_of_order: bool = True,
    timeout: float = 120.0,
) -> list[dict[str, str | list[str] | None]]:
    """One dict per Couchbase PDU tshark decodes in ``path``, in capture order.

    Runs ``tshark -r PATH -n -o tcp.desegment_tcp_streams:TRUE
    -d tcp.port==P,couchbase ... -T fields -E separator=/t -E occurrence=a
    -E aggregator=<0x1f> -e FIELD ...``: one row per packet, where a packet
    that completes several PDUs has several occurrences of each field.  The
    occurrences are split into per-PDU records when that is unambiguous
    (every field occurs 0 or N times for N PDUs).  Optional fields such as
    ``couchbase.key`` or ``couchbase.extras.by_seqno`` can be absent from
    some PDUs of a packet, and repeated fields (failover log entries) occur
    several times in one PDU; those packets are read again from tshark's
    JSON tree (``-T json --no-duplicate-keys``), which keeps PDUs apart.

    Each record has every name of ``fields`` (``frame.number`` and
    ``tcp.stream`` are always added) mapped to tshark's display string,
    ``None`` when the PDU lacks the field, or a list when it occurs several
    times in the PDU.  Fields of other protocols (``frame.*``, ``ip.*``,
    ``tcp.srcport``...) describe the packet and are repeated in the record of
    each PDU it completes.  A PDU spanning several segments is reported in the
    frame that completes it.  ``out_of_order`` (default True) sets
    ``tcp.reassemble_out_of_order``, which Wireshark leaves off: without it
    tshark stops finding PDUs in a stream after an out-of-order segment.

    Raises :class:`TsharkError` when tshark is absent, times out, rejects a
    field name, or exits non-zero (``partial`` then holds what it printed,
    e.g. the PDUs before the cut of a truncated file).
    """
    names = list(dict.fromkeys([*_PER_PACKET, *fields]))
    query = names if _COUNTER in names else [*names, _COUNTER]
    base = _base_args(path, ports, out_of_order)
    args = [*base, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", f"aggregator={_AGGREGATOR}", "-E", "quote=n"]
    for name in query:
        args += ["-e", name]
    out, err, rc = _run(args, timeout)
    if rc != 0 and not out:
        raise TsharkError(f"tshark failed (exit {rc})", [str(TSHARK), *args], err)

    records: list[dict[str, Any]] = []
    ambiguous: set[int] = set()  # frames whose occurrences cannot be split by position
    for number, row in _split_rows(out, query):
        n = len(row[_COUNTER])
        if n == 0:
            continue
        if any(len(row[name]) not in (0, n) for name in names if not _packet_level(name)):
            ambiguous.add(number)
            records.append({"frame.number": str(number), "__ambiguous__": n})
            continue
        for i in range(n):
            rec: dict[str, Any] = {}
            for name in names:
                if _packet_level(name):
                    rec[name] = _one_or_many(row[name])
                else:
                    rec[name] = row[name][i] if row[name] else None
            records.append(rec)
    if ambiguous:
        try:
            resolved = _json_records(base, names, ambiguous, timeout)
        except TsharkError:
            if rc == 0:
                raise
            resolved = {}  # the file is broken anyway: report what -T fields could split
        expanded: list[dict[str, Any]] = []
        for rec in records:
            if "__ambiguous__" not in rec:
                expanded.append(rec)
                continue
            number = int(rec["frame.number"])
            pdus = resolved.get(number)
            if rc != 0 and pdus is None:
                continue
            if pdus is None or len(pdus) != rec["__ambiguous__"]:
                raise TsharkError(
                    f"frame {number}: -T fields shows {rec['__ambiguous__']} PDUs, JSON {0 if pdus is None else len(pdus)}",
                    [str(TSHARK), *args],
                    err,
                )
            expanded.extend(pdus)
        records = expanded
    if rc != 0:
        raise TsharkError(f"tshark exited {rc}", [str(TSHARK), *args], err, partial=records)
    return records
