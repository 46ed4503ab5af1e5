"""Speed of the bulk JSON check: the old Arrow-behind-guards ``_json_suspects`` and ``tables.jsoncheck.json_suspects``.

Both run in the same process on the same buffers; each figure is the best of
``--runs`` runs, in CPU time (``time.process_time``), in documents per second.
The old check is kept here verbatim (as ``frames_vector`` called it: a list of
memoryviews built from the frame buffer, then ``_json_suspects``), so the
comparison survives its removal.

Data sets (each value sits in one buffer with 30 bytes of non-JSON between
values, as the values of frames do):

* ``travel``: ``--docs`` generated documents of 100-2000 bytes in the style of
  Couchbase's travel-sample (airlines, routes with schedules, hotels with
  reviews, landmarks, airports; a third with non-ASCII text, half with
  ``\\uXXXX`` escapes, half compact);
* ``captures``: the values flagged JSON in ``captures/*.pcap`` (small
  documents: the per-value overhead), repeated to ``--docs``;
* ``travel 1% broken``: ``travel`` with one document in a hundred cut short or
  with a stray byte inside (the path where Arrow's read fails and goes on
  after the bad value).

Usage::

    python benchmarks/bench_jsoncheck.py [--docs N] [--runs R] [--seed S]

It is a measurement, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from dcpinspect.capture.read import read_records
from dcpinspect.protocol.enums import Datatype, Magic
from dcpinspect.tables.jsoncheck import json_suspects
from dcpinspect.wire.events import Frame

ROOT = Path(__file__).resolve().parents[1]
GAP = 30  # bytes between values in the buffer (a frame's header, extras and key)

# ---------------------------------------------------------------------------
# the old check, verbatim from frames_vector (before jsoncheck)

_JSON_PARSE = pajson.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore")
_MAX_BRACKETS = 256


def _old_json_suspects(values: list[memoryview]) -> np.ndarray:
    n = len(values)
    bad = np.zeros(n, bool)
    if not n:
        return bad
    lens = np.fromiter(map(len, values), np.int64, n)
    joined = b"\n".join(values)
    arr = np.frombuffer(joined, np.uint8)
    starts = np.concatenate(([0], np.cumsum(lens + 1)[:-1]))
    bad |= arr[starts] != ord("{")
    ctrl = np.flatnonzero((arr < 0x20) & (arr != 0x0A))
    if len(ctrl):
        bad[np.searchsorted(starts, ctrl, side="right") - 1] = True
    for i in np.flatnonzero(lens > _MAX_BRACKETS):
        v = bytes(values[i])
        if v.count(b"[") + v.count(b"{") > _MAX_BRACKETS:
            bad[i] = True
    try:
        joined.decode("utf-8")
    except UnicodeDecodeError:
        for j in range(n):
            try:
                bytes(values[j]).decode("utf-8")
            except UnicodeDecodeError:
                bad[j] = True
    good = np.flatnonzero(~bad)
    if not len(good):
        return bad
    if len(good) < n:
        joined = b"\n".join(values[i] for i in good)
    try:
        parsed = pajson.read_json(
            io.BytesIO(joined),
            parse_options=_JSON_PARSE,
            read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, len(joined) + 1)),
        )
        ok = parsed.num_rows == len(good)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = False
    if not ok:
        for i in good:
            try:
                json.loads(bytes(values[i]))
            except (ValueError, RecursionError):
                bad[i] = True
    return bad


def old_json_suspects(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The old check as the frames table called it: memoryviews of the frame buffer, then ``_json_suspects``."""
    mv = memoryview(buf)
    return _old_json_suspects([mv[x:y] for x, y in zip(starts.tolist(), (starts + lens).tolist(), strict=True)])


# ---------------------------------------------------------------------------
# data

_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]
_UNICODE = ["Zürich", "São Paulo", "Kraków", "東京", "café", "naïve", "Ålesund", "Москва"]


def _travel_doc(rng: random.Random, i: int) -> dict[str, object]:
    words = _WORDS + _UNICODE if rng.random() < 0.35 else _WORDS
    kind = rng.random()
    if kind < 0.25:
        d: dict[str, object] = {
            "name": f"airline_{i}",
            "type": "airline",
            "id": i,
            "iata": "Q5",
            "icao": "MLA",
            "callsign": "MILE-AIR",
            "country": rng.choice(["United States", "France", "United Kingdom"]),
        }
        for k in range(rng.randint(2, 30)):
            d[f"field_{k}"] = rng.choice(
                [rng.randint(-(10**9), 10**9), round(rng.random() * 1000, 6), " ".join(rng.choices(words, k=rng.randint(1, 8))), True, None]
            )
        return d
    if kind < 0.5:
        return {
            "id": i, "type": "route", "airline": "AF", "airlineid": "airline_137", "sourceairport": "TLV", "destinationairport": "MRS", "stops": 0, "equipment": "320",
            "distance": rng.random() * 3000,
            "schedule": [{"day": rng.randint(0, 6), "utc": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00", "flight": f"AF{rng.randint(100, 999)}"} for _ in range(rng.randint(1, 25))],
        }  # fmt: skip
    if kind < 0.8:
        return {
            "title": "Hotel " + rng.choice(words), "name": "The " + rng.choice(words) + " Inn", "address": f"{rng.randint(1, 999)} {rng.choice(words)} Street", "type": "hotel", "id": i,
            "geo": {"lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180), "accuracy": "ROOFTOP"}, "free_internet": rng.random() < 0.5, "price": None,
            "public_likes": [f"{rng.choice(words)} {rng.choice(words)}" for _ in range(rng.randint(0, 6))],
            "reviews": [
                {"author": rng.choice(words) + " " + rng.choice(words), "content": " ".join(rng.choices(words, k=rng.randint(5, 40))), "date": "2013-06-22 18:33:50 +0300",
                 "ratings": {"Cleanliness": rng.randint(1, 5), "Location": rng.randint(1, 5), "Overall": rng.randint(1, 5)}}
                for _ in range(rng.randint(0, 3))
            ],
        }  # fmt: skip
    if kind < 0.9:
        return {
            "title": rng.choice(words),
            "name": rng.choice(words),
            "type": "landmark",
            "id": i,
            "activity": "see",
            "content": " ".join(rng.choices(words, k=rng.randint(10, 150))),
            "geo": {"lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180)},
        }
    return {
        "airportname": rng.choice(words).title() + " Intl",
        "city": rng.choice(words),
        "country": "France",
        "faa": "CDG",
        "icao": "LFPG",
        "id": i,
        "type": "airport",
        "tz": "Europe/Paris",
        "geo": {"alt": rng.randint(0, 3000), "lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180)},
    }


def travel_docs(n: int, seed: int) -> list[bytes]:
    """``n`` travel-sample-like documents of 100-2000 bytes."""
    rng = random.Random(seed)
    out: list[bytes] = []
    i = 0
    while len(out) < n:
        compact = rng.random() < 0.5
        s = json.dumps(_travel_doc(rng, i), ensure_ascii=rng.random() < 0.5, separators=(",", ":") if compact else None).encode()
        i += 1
        if 100 <= len(s) <= 2000:
            out.append(s)
    return out


def capture_docs() -> list[bytes]:
    """The values flagged JSON in the shipped captures."""
    docs = []
    for path in sorted(glob.glob(str(ROOT / "captures" / "*.pcap"))):
        for r in read_records([path]):
            e = r.event
            if type(e) is not Frame or e[2] != "mcbp":
                continue
            raw = e[1]
            if len(raw) < 24 or raw[0] not in (Magic.CLIENT_REQUEST, Magic.CLIENT_RESPONSE) or not raw[5] & Datatype.JSON:
                continue
            v0 = 24 + raw[4] + int.from_bytes(raw[2:4], "big")
            if len(raw) > v0:
                docs.append(raw[v0:])
    return docs


def layout(docs: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The values in one buffer, GAP bytes of non-JSON around each."""
    gap = b"\x80\x01" * (GAP // 2)
    lens = np.array([len(d) for d in docs], np.int64)
    starts = np.cumsum(np.concatenate(([GAP], lens[:-1] + GAP)))
    return np.frombuffer(gap + gap.join(docs) + gap, np.uint8), starts, lens


# ---------------------------------------------------------------------------


def best(fn: Callable[[], np.ndarray], runs: int) -> tuple[float, np.ndarray]:
    t, out = float("inf"), np.zeros(0, bool)
    for _ in range(runs):
        t0 = time.process_time()
        out = fn()
        t = min(t, time.process_time() - t0)
    return t, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, pyarrow {pa.__version__}, {platform.machine()}, pinned to one core, best of {args.runs} (CPU time)"
    )
    travel = travel_docs(args.docs, args.seed)
    caps = capture_docs()
    broken = list(travel)
    rng = random.Random(args.seed)
    for n, i in enumerate(rng.sample(range(len(broken)), len(broken) // 100)):
        d = broken[i]
        k = rng.randint(1, len(d) - 2)
        broken[i] = d[:k] if n % 2 else d[:k] + b"#" + d[k + 1 :]  # cut short, or a stray byte inside (still {...})
    sets = {
        "travel": travel,
        "captures": (caps * (args.docs // max(len(caps), 1) + 1))[: args.docs] if caps else [],
        "travel 1% broken": broken,
    }
    print(
        f"{'data':18} {'docs':>8} {'MiB':>6} {'old docs/s':>11} {'new docs/s':>11} {'ratio':>6} {'old suspects':>13} {'new suspects':>13} {'invalid':>8}"
    )
    for name, docs in sets.items():
        if not docs:
            print(f"{name:18} (no documents)")
            continue
        buf, starts, lens = layout(docs)
        t_old, s_old = best(lambda b=buf, s=starts, n=lens: old_json_suspects(b, s, n), args.runs)
        t_new, s_new = best(lambda b=buf, s=starts, n=lens: json_suspects(b, s, n), args.runs)
        invalid = 0
        for d, sus in zip(docs, s_new.tolist(), strict=True):
            try:
                json.loads(d)
            except (ValueError, RecursionError):
                invalid += 1
                if not sus:
                    print(f"  CONTRACT BROKEN: called clean but invalid: {d[:80]!r}")
        n = len(docs)
        print(
            f"{name:18} {n:8} {lens.sum() / 2**20:6.1f} {n / t_old:11,.0f} {n / t_new:11,.0f} {t_old / t_new:5.2f}x {int(s_old.sum()):13} {int(s_new.sum()):13} {invalid:8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
