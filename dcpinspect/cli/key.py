"""``dcpinspect key``: did my consumer get document X, and which version? (the rows of :func:`dcpinspect.tables.history.key_history`).

Rules:

1. One read of the captures: the frames table's key columns are kept part by
   part while the parts feed the timeline (as ``stats``); the collection names
   of the system events are read only when ``--collection`` is a name.
2. Text: one line per version (an item that carried the key) in frame order:
   frame, time, connection, consumer, vbucket and stream id, command, seqno,
   CAS and its HLC time, rev seqno, snapshot and its type and bounds, and its
   fate; then one closing sentence per consumer and document: the version it
   holds at the end of the capture.  ``--json``: one object per version
   (times as seconds since the epoch), then one ``{"summary": ...}`` object.
3. Without ``--collection`` every collection's document of that key is
   listed (the ``cid`` tells them apart); with it, that collection's only (an
   id, decimal or 0x hex, or a name the capture's system events define;
   ``_default`` is 0).
4. Exit 0 when the key was seen; 1 when it was never seen on any stream (the
   reason on stdout, as the closing sentence) or a file failed; 2 on bad
   input (an unknown collection name).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..flows.records import CaptureStats
from ..wire.render import hlc_text, plural, safe_text
from .capture import capture_arguments, read_capture_parts, report_files, timeline_builder
from .command import CliError, Console

__all__ = ["ARGUMENTS", "parse_collection", "summary", "version_line"]


def parse_collection(text: str | None) -> int | str | None:
    """``--collection``: an id (decimal or 0x hex) as int, ``_default`` as 0, anything else a name to look up."""
    if text is None:
        return None
    if text == "_default":
        return 0
    try:
        cid = int(text, 0)
    except ValueError:
        return text
    if not 0 <= cid < 1 << 32:
        raise CliError(f"--collection {text!r}: a collection id is 0-0xffffffff")
    return cid


def _seq(v: Any) -> str:
    return "-" if v is None or v != v else str(int(v))  # noqa: PLR0124 - NaN / NA


def _none(v: Any) -> bool:
    try:
        return bool(v is None or v != v)  # noqa: PLR0124 - NaN / NA
    except TypeError:  # pd.NA
        return True


def version_line(row: dict[str, Any]) -> str:
    """One version as text (rule 2)."""
    sid = "" if _none(row["stream_id"]) else f" sid {int(row['stream_id'])}"
    cid = "" if _none(row["cid"]) or not int(row["cid"]) else f" cid {int(row['cid']):#x}"
    cas = "-" if _none(row["cas"]) else f"0x{int(row['cas']):016x}"
    hlc = None if _none(row["cas"]) else hlc_text(int(row["cas"]))
    snap = "none" if _none(row["snap_type"]) else f"{row['snapshot']} {row['snap_type']} {_seq(row['snap_start'])}-{_seq(row['snap_end'])}"
    ts = "-" if _none(row["ts"]) else row["ts"].strftime("%Y-%m-%d %H:%M:%S.%f")
    fate = str(row["fate"])
    if fate == "rolled back":
        fate += f" (to {_seq(row['fate_seqno'])}, frame {_seq(row['fate_frame'])})"
    elif fate != "current":
        fate += f" (by seqno {_seq(row['fate_seqno'])}, frame {_seq(row['fate_frame'])})"
    if row["dedup_violation"]:
        fate += " DEDUP VIOLATION"
    return (
        f"frame {row['frame']}  {ts}  conn {row['conn']} {safe_text(repr(row['consumer']))}  vb {row['vbucket']}{sid}{cid}  "
        f"{row['name']}  seqno {_seq(row['seqno'])}  CAS {cas}{' (' + hlc + ')' if hlc else ''}  rev {_seq(row['rev_seqno'])}  "
        f"snapshot {snap}  -> {fate}"
    )


#: item kind -> what a consumer holds when its current version is one (a mutation or commit: "version")
_HOLDS = {
    "deletion": "a deletion (tombstone) of",
    "expiration": "an expiration (tombstone) of",
    "prepare": "a pending prepare of",
    "abort": "the abort of a prepare of",
}


def summary(versions: Any, key: str, absence: str) -> list[str]:
    """The closing sentences: per consumer and document, the version it holds at the end (or why the key was never seen)."""
    from ..tables.history import ITEM_KINDS

    if not len(versions):
        return [f"{safe_text(repr(key))} {absence}"]
    out = []
    for (_cs, _lineage, vb, cid), rows in versions.groupby(["capture_set", "lineage", "vbucket", versions["cid"].fillna(0)], sort=False):
        doc = safe_text(repr(key)) + (f" (collection {int(cid):#x})" if cid else "")
        cur = rows[rows["fate"] == "current"]
        names = list(dict.fromkeys(rows["consumer"]))
        who = f"consumer {safe_text(repr(names[-1]))} (vbucket {vb}" + (
            f", resuming {', '.join(safe_text(repr(n)) for n in names[:-1])})" if len(names) > 1 else ")"
        )
        if not len(cur):
            out.append(f"{who} holds no version of {doc}: {plural(len(rows), 'version')} received, every one rolled back")
            continue
        last = cur.iloc[-1]
        who = f"consumer {safe_text(repr(last['consumer']))} (vbucket {vb}" + (
            f", resuming {', '.join(safe_text(repr(n)) for n in names if n != last['consumer'])})" if len(names) > 1 else ")"
        )
        cas = f"0x{int(last['cas']):016x}"
        hlc = hlc_text(int(last["cas"]))
        what = _HOLDS.get(ITEM_KINDS.get(str(last["name"]), ""), "version")
        out.append(
            f"{who} holds {what} {doc} seqno {_seq(last['seqno'])} (CAS {cas}{', ' + hlc if hlc else ''}), "
            f"received at frame {last['frame']}; {plural(len(rows), 'version')} received"
        )
    return out


def _read(args: argparse.Namespace, stats: CaptureStats, names: bool) -> Any:
    """One read (rule 1): the kept frame columns, the timeline's tables with the stream filters, the collection names."""
    from ..tables.history import COLUMNS, KeyTables, collection_ids, frames_of
    from ..tables.timeline import timeline_frames
    from ..tables.timeline_feed import feed_parts

    batches: list[Any] = []
    collections: dict[str, int] = {"_default": 0}

    def keep(parts: Iterable[Any]) -> Iterator[Any]:
        for part in parts:
            batches.append(part.batch.select(list(COLUMNS)))
            if names:
                for name, cid in collection_ids(part.records()).items():
                    collections.setdefault(name, cid)
            yield part

    t = feed_parts(keep(read_capture_parts(args, stats)), timeline_builder(args)).timeline()
    t.set_first = dict(stats.set_first)
    tables = timeline_frames(t)
    return KeyTables(frames_of(batches), tables, t, collections)


def _key(args: argparse.Namespace, console: Console) -> int:
    from ..tables.history import key_absence, key_versions

    collection = parse_collection(args.collection)
    stats = CaptureStats()
    read = _read(args, stats, isinstance(collection, str))
    bad = report_files(stats)
    if bad == len(stats.files):
        return 1
    if isinstance(collection, str):
        if collection not in read.collections:
            known = ", ".join(sorted(read.collections)) or "none"
            raise CliError(
                f"--collection {collection!r}: no collection of that name in the capture's system events (known: {known}); give its id"
            )
        collection = read.collections[collection]
    versions = key_versions(read.frames, read.tables, key=args.key, cid=collection)
    absence = "" if len(versions) else key_absence(read.frames, read.tables, args.key, collection=collection)
    out = console.out
    closing = summary(versions, args.key, absence)
    if args.json:
        from ..tables.stats import json_records

        for row in json_records(versions):
            out.write(json.dumps(row) + "\n")
        out.write(json.dumps({"summary": closing, "key": args.key, "collection": collection, "seen": bool(len(versions))}) + "\n")
    else:
        for row in versions.to_dict("records"):
            out.write(version_line(row) + "\n")
        out.write("".join(line + "\n" for line in closing))
    return 1 if bad or not len(versions) else 0


def _key_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Did my consumer get document KEY, and which version? Every item that carried the key, on every connection and stream "
        "(mutation, deletion, expiration, prepare, commit, abort), with its seqno, CAS and HLC time, rev seqno, snapshot and "
        "its type, and its fate (superseded in its snapshot, superseded, re-delivered, rolled back, current); then the version "
        "each consumer holds at the end. Exit 1 when the key was never seen on any stream (the reason is printed)."
    )
    p.epilog = (
        "examples:\n"
        "  dcpinspect key captures/live-failover-branches.pcap before-loss-004\n"
        "  dcpinspect key captures/live-collections.pcap airline-001 --collection airlines\n"
        "  dcpinspect key captures/live-purge-rollback.pcap purge-000 --json"
    )
    capture_arguments(p)
    p.add_argument("key", metavar="KEY", help="the document's key (without the collection prefix; it comes after the capture files)")
    p.add_argument(
        "--collection",
        metavar="C",
        help="only the document in collection C: an id (8, 0x8) or a name from the capture's system events (_default: 0)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per version, then a summary object")
    p.set_defaults(func=_key)


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"key": _key_arguments}
