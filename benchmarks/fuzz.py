"""Fuzz the whole core: random and mutated frames through decode, dissect and render.

Inputs (``--count``, default 10^6, all small: mostly under 200 bytes) are:

* valid frames built with :func:`dcpinspect.wire.encode` for every opcode of
  ``dcpinspect.protocol.spec.COMMANDS``, both roles and every variant name (plus the
  seed documents' packets, unknown opcodes and server magics), used as they
  are or mutated: bytes flipped, length fields changed, truncated, spliced,
  random bytes inserted or removed, turned into alt magics 0x08/0x18 with
  random framing extras, datatype bits (JSON/snappy/xattr, now and then
  unknown ones) set on random, JSON, xattr and snappy values;
* UPR-draft frames (``dialect="upr"``), mutated the same way;
* pure random byte strings, in both dialects.

Each input is held to the decoder's contracts (:meth:`Fuzzer.check_decoder`),
with random decoder options (``aligned``, ``max_body``, ``garbage_chunk``) and,
on about 12% of the inputs, one or two ``feed_gap`` calls at random points:

* never raises: no decoder call raises;
* tiling: every input byte lands in exactly one event, in order - the events
  are contiguous by offset, the sum of their lengths is the bytes fed plus the
  gap lengths, their bytes concatenated are the input, the gaps are where
  they were fed, and a frame is its header plus its declared body;
* chunking: random chunks give the same events as one ``feed`` per gap-free
  segment (decoder rule 3);
* byte-by-byte: so does feeding every byte on its own;
* gaps: ``feed_gap(0)`` calls sprinkled between the chunks change nothing,
  and a non-zero gap acts as the end of one stream and the start of another,
  unaligned one: the events equal those of each gap-free stretch decoded by a
  decoder of its own (unaligned after a gap), shifted, with the stretch's
  ``end of stream`` read as the gap.

The summary gives, per contract, the inputs it was checked on and its
failures.  ``--decoder-only`` stops there (no dissection or rendering); the
test suite runs a few thousand inputs of it (``tests/test_decoder_hostile.py``).

Memory: RSS (current and peak) and the number of Python heap blocks are printed
every 50k inputs.  RSS can step up a few times when a tiny snappy value claims
an inflated length of some MiB: cramjam allocates that much before it finds
the data corrupt, and the C allocator keeps the pages (bounded by the
dissector's 64 MiB limit); the Python block count shows whether Python objects
accumulate.

Every frame is then dissected with a random :class:`dcpinspect.DissectContext`
(collections/xattr/snappy/json/stream_ids/delete_times/include_xattrs each
True/False/None), its ``extras``/``key``/``document``/``problems``/``fields``
are touched, every event goes through ``cli.decode.event_dict`` (and ``json.dumps``),
and a sample goes through ``annotate``/``breakdown``/``annotate_html``/
``summary``/``byte_table`` and the Frame properties.

Every exception is caught and counted; the first 20 (at most 3 per
signature: stage, exception type and raising line) are printed with their
traceback and the input as hex, and every signature with its count.  Peak and current RSS are sampled every 50k
inputs.  The last line reads::

    fuzz: 1000000 inputs, 0 exceptions, 0 invariant violations (0 tiling, 0 chunking/byte-by-byte/gaps), rss MiB start/end/max 30.1/31.0/31.2

The exit status is 1 if any exception or invariant violation happened.

Usage::

    python benchmarks/fuzz.py [--count 1000000] [--seed S] [--decoder-only]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import resource
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dcpinspect import (
    DissectContext,
    EncodeError,
    Event,
    Frame,
    FrameDecoder,
    Gap,
    annotate,
    annotate_html,
    breakdown,
    byte_table,
    decode,
    dissect,
    encode,
    summary,
)
from dcpinspect.cli.decode import event_dict
from dcpinspect.protocol import spec
from dcpinspect.protocol.fields import BYTES, ENUM, FLAGS, INT, TEXT, Field, Group, Variant
from dcpinspect.protocol.upr import UPR_BODIES
from dcpinspect.wire.examples import EXAMPLES
from dcpinspect.wire.framing import encode_frame_infos, encode_leb128

try:
    import cramjam
except ImportError:  # pragma: no cover - cramjam is a dependency of the package
    cramjam = None

MAX_TRACEBACKS = 20
PER_SIGNATURE = 3  # of the first 20 tracebacks kept, at most this many per (stage, exception, location)
RSS_EVERY = 50_000
RENDER_EVERY = 20  # about one input in this many is rendered
HEX_LIMIT = 4096  # hex digits of an input kept with a traceback

_WORDS = (
    "alpha",
    "beta",
    "doc",
    "kv",
    "dcp",
    "stream",
    "seqno",
    "vbucket",
    "ünïcode",
    "日本",
    "a\tb",
    "x\x00y",
    "\x1b[31m",
    "<b>&amp;</b>",
)
_STATUS_CODES = tuple(spec.STATUS)
_DATATYPES = (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07)


# ---------------------------------------------------------------------------
# memory


def rss_mib() -> tuple[float, float]:
    """(current VmRSS, peak ru_maxrss) in MiB."""
    cur = 0.0
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) / 1024
                    break
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return cur, peak


# ---------------------------------------------------------------------------
# random values for the table's fields


def _snappy(data: bytes) -> bytes:
    if cramjam is None:
        return encode_leb128(len(data)) + data  # not valid snappy, still a length prefix
    return bytes(cramjam.snappy.compress_raw(data))


def rand_text(rng: random.Random, lo: int = 0, hi: int = 24) -> str:
    n = rng.randint(lo, hi)
    out = ""
    while len(out) < n:
        out += rng.choice(_WORDS) if rng.random() < 0.5 else chr(rng.randint(0x20, 0x7E))
    return out[:n] if rng.random() < 0.9 else out


def rand_bytes(rng: random.Random, lo: int = 0, hi: int = 32) -> bytes:
    return rng.randbytes(rng.randint(lo, hi))


def rand_json(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth < 3 and r < 0.35:
        return {rand_text(rng, 1, 8): rand_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 3 and r < 0.5:
        return [rand_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return rng.choice((0, 1, -1, 2**63, 1.5, True, False, None, "", rand_text(rng, 0, 10)))


def rand_int(rng: random.Random, f: Field) -> int:
    size = f.size or 4
    bits = 8 * size
    if f.names and f.kind in (ENUM, FLAGS) and rng.random() < 0.7:
        if f.kind == ENUM:
            return rng.choice(list(f.names))
        v = 0
        for bit in f.names:
            if rng.random() < 0.3:
                v |= bit
        return v
    r = rng.random()
    if r < 0.3:
        v = 0
    elif r < 0.4:
        v = (1 << bits) - 1
    elif r < 0.6:
        v = rng.randint(0, 300)
    else:
        v = rng.getrandbits(bits)
    if f.kind == INT and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def rand_fields(rng: random.Random, fields: Sequence[Field | Group]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        if isinstance(f, Group):
            out[f.name] = [rand_fields(rng, f.fields) for _ in range(rng.randint(0, 4))]
        elif f.kind in (BYTES, TEXT):
            if f.size is None:
                out[f.name] = rand_text(rng) if f.kind == TEXT else rand_bytes(rng)
            else:
                out[f.name] = rng.randbytes(f.size)
        else:
            out[f.name] = rand_int(rng, f)
    return out


def xattr_blob(rng: random.Random) -> bytes:
    pairs = b""
    for _ in range(rng.randint(0, 3)):
        pair = rand_text(rng, 1, 8).encode() + b"\0" + json.dumps(rand_json(rng)).encode() + b"\0"
        if rng.random() < 0.1:
            pair = pair.replace(b"\0", b"", 1)  # malformed pair
        pairs += struct.pack(">I", len(pair)) + pair
    xlen = len(pairs) if rng.random() < 0.9 else rng.randint(0, len(pairs) + 8)
    return struct.pack(">I", xlen) + pairs


def doc_value(rng: random.Random) -> tuple[bytes, int]:
    """A document value and a datatype that (mostly) describes it."""
    r = rng.random()
    if r < 0.4:
        body, dt = json.dumps(rand_json(rng)).encode(), 0x01
    elif r < 0.6:
        body, dt = rand_text(rng, 0, 60).encode(), 0x00
    elif r < 0.7:
        body, dt = rand_bytes(rng, 0, 60), 0x00
    else:
        body, dt = (b'{"a":' if rng.random() < 0.5 else b"") + rand_bytes(rng, 0, 20), rng.choice((0x00, 0x01))
    if rng.random() < 0.2:
        body, dt = xattr_blob(rng) + body, dt | 0x04
    if rng.random() < 0.15:
        body, dt = _snappy(body), dt | 0x02
    if rng.random() < 0.05:
        dt = rng.choice(_DATATYPES)
    return body, dt


def json_value(rng: random.Random, variant: Variant) -> Any:
    if variant.json_keys and rng.random() < 0.8:
        pool: dict[str, Any] = {
            "uid": rng.choice(("1a", "0", 5, "zz")),
            "sid": rng.choice((1, 5, 0, 70000, "3", True)),
            "collections": rng.choice((["8", "a"], [], [8], "8", ["xyz"])),
            "scope": rng.choice(("8", "", 8)),
            "purge_seqno": rng.choice(("12", "x", 12)),
            "cts": {"free_memory": rng.randint(0, 100), "all_keys": rng.random() < 0.5},
            "consumer_name": rand_text(rng, 0, 10),
            rand_text(rng, 1, 6): rand_json(rng),
        }
        keys = [k for k in pool if rng.random() < 0.4]
        return {k: pool[k] for k in keys}
    return rand_json(rng)


def value_for(rng: random.Random, variant: Variant, key_text: str) -> tuple[Any, int]:
    """A value for ``variant`` and its datatype."""
    kind = variant.value
    if isinstance(kind, tuple):
        if rng.random() < 0.1:
            return None, 0
        vals = rand_fields(rng, kind)
        if len(kind) == 1 and isinstance(kind[0], Group):
            return vals[kind[0].name], 0
        return vals, 0
    if kind == "none":
        return (None if rng.random() < 0.9 else rand_bytes(rng, 1, 8)), 0
    if kind in ("doc", "doc?"):
        if kind == "doc?" and rng.random() < 0.15:
            return None, 0
        return doc_value(rng)
    if kind in ("json", "json?"):
        if kind == "json?" and rng.random() < 0.2:
            return None, 0
        if rng.random() < 0.1:
            return b"{not json" + rand_bytes(rng, 0, 6), 0x01
        return json_value(rng, variant), rng.choice((0x01, 0x01, 0x00))
    if kind in ("text", "text?"):
        return (rand_text(rng) if rng.random() < 0.9 else None), 0
    if kind == "error":
        return rng.choice(
            (json.dumps({"error": {"context": rand_text(rng), "ref": "abc"}}), rand_text(rng), None, b"\xff\xfe")
        ), rng.choice((0, 1))
    if kind == "sasl":
        mech = key_text.upper()
        if mech == "PLAIN" or rng.random() < 0.3:
            parts = [rand_text(rng, 0, 6), rand_text(rng, 1, 8), rand_text(rng, 0, 12)]
            if rng.random() < 0.2:
                parts = parts[: rng.randint(0, 3)]
            return "\0".join(parts), 0
        return rng.choice(
            (
                "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
                "c=biws,r=abc,p=dHrdUg==",
                "r=abc,s=QSXCR+Q6sek8bf92,i=4096",
                "v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
                rand_text(rng),
            )
        ), 0
    if kind.startswith("flatbuffers:"):
        schema = spec.FLATBUFFER_TABLES[kind.split(":", 1)[1]]
        vals: dict[str, Any] = {}
        for name, typ in schema:
            if rng.random() < 0.7:
                vals[name] = (
                    rand_text(rng, 0, 12)
                    if typ == "string"
                    else (rng.random() < 0.5 if typ == "bool" else rng.getrandbits(32 if typ == "u32" else 64))
                )
        return vals, 0
    if kind == "cache_records":
        recs = b""
        for _ in range(rng.randint(0, 3)):
            key = (encode_leb128(rng.choice((0, 8, 300))) if rng.random() < 0.5 else b"") + rand_text(rng, 0, 10).encode()
            val = rand_bytes(rng, 0, 20)
            recs += (
                struct.pack(">QQQIIIHBB", rng.getrandbits(64), rng.randint(1, 99), 1, len(val), 0, 0, len(key), rng.choice(_DATATYPES), 0)
                + key
                + val
            )
        return recs, 0
    return rand_bytes(rng, 0, 40), 0  # any


def key_for(rng: random.Random, variant: Variant, opcode: int) -> tuple[str | bytes, int | None]:
    """A key for ``variant`` and an optional collection id."""
    kind = variant.key
    if kind == "none":
        return (b"" if rng.random() < 0.95 else rand_bytes(rng, 1, 4)), None
    if opcode == 0x5E:
        return rng.choice([*spec.CONTROL_KEYS, rand_text(rng, 1, 10)]), None
    if variant.key_label == "Mechanism":
        return rng.choice(("PLAIN", "SCRAM-SHA512", "SCRAM-SHA1", rand_text(rng, 1, 8))), None
    if kind == "agent":
        return rng.choice((json.dumps({"a": rand_text(rng, 0, 8), "i": "0123/4567"}), "{broken", rand_text(rng, 1, 20))), None
    if kind in ("doc", "doc?"):
        key = f"doc-{rng.randint(0, 10**6):0{rng.randint(1, 8)}d}" if rng.random() < 0.7 else rand_text(rng, 0, 16)
        cid = rng.choice((0, 8, 0x7F, 0x80, 0x3FFF, 0xFFFFFFFF)) if rng.random() < 0.3 else None
        return key, cid
    if kind.endswith("?") and rng.random() < 0.3:
        return b"", None
    return rand_text(rng, 1, 16), None


def build_seeds(rng: random.Random, per_variant: int) -> tuple[list[bytes], list[bytes], list[str]]:
    """(mcbp seeds, upr seeds, unexpected encode errors)."""
    mcbp: list[bytes] = []
    errors: list[str] = []

    def attempt(*args: Any, **kw: Any) -> None:
        try:
            mcbp.append(encode(*args, **kw))
        except EncodeError:
            pass
        except Exception:  # reported, the fuzzer goes on
            errors.append(f"encode{args!r} {kw!r}:\n{traceback.format_exc()}")

    for op, cmd in spec.COMMANDS.items():
        for response, variants in ((False, cmd.request), (True, cmd.response)):
            attempt(cmd.name, response=response)
            attempt(op, response=response, status=rng.choice(_STATUS_CODES), value=rand_text(rng) if response else None)
            for v in variants:
                for _ in range(per_variant):
                    when = dict(v.when)
                    extras: Any = None
                    if v.extras:
                        extras = rand_fields(rng, v.extras)
                        extras.update({k: want for k, want in when.items() if k in extras})
                        if rng.random() < 0.15:
                            extras = None
                    elif v.any_extras and rng.random() < 0.5:
                        extras = rand_bytes(rng, 1, 12)
                    key, cid = key_for(rng, v, op)
                    value, datatype = value_for(rng, v, key if isinstance(key, str) else "")
                    status = when.get("status", 0 if rng.random() < 0.8 else rng.choice(_STATUS_CODES))
                    kw: dict[str, Any] = {
                        "response": response,
                        "variant": v.name,
                        "extras": extras,
                        "key": key,
                        "cid": cid,
                        "value": value,
                        "datatype": datatype,
                        "vbucket": rng.choice((0, 1, 1023, 0xFFFF)),
                        "status": status,
                        "opaque": rng.getrandbits(32),
                        "cas": rng.choice((0, 1, rng.getrandbits(64))),
                    }
                    r = rng.random()
                    if r < 0.15:
                        kw["stream_id"] = rng.choice((0, 1, 5, 0xFFFF))
                    elif r < 0.25:
                        kw["frame_infos"] = [(rng.randint(0, 20), rand_bytes(rng, 0, 18)) for _ in range(rng.randint(1, 3))]
                    attempt(cmd.name, **kw)
    # unknown opcodes and server magics
    for _ in range(per_variant * 4):
        op = rng.randrange(256)
        attempt(
            op,
            magic=rng.choice((0x80, 0x81, 0x82, 0x83)),
            extras=rand_bytes(rng, 0, 8),
            key=rand_text(rng),
            value=rand_bytes(rng),
            datatype=rng.choice(_DATATYPES),
        )
    mcbp += [ex.data for ex in EXAMPLES if ex.dialect == "mcbp"] + [ex.drawn for ex in EXAMPLES if ex.dialect == "mcbp"]

    upr: list[bytes] = [ex.data for ex in EXAMPLES if ex.dialect == "upr"]
    for op, variants in UPR_BODIES.items():
        for v in variants:
            for _ in range(per_variant):
                try:
                    if isinstance(v.value, tuple):
                        vals = rand_fields(rng, v.value)
                        for k, want in v.when:
                            vals[k] = want
                        upr.append(encode(op, dialect="upr", value=vals or None, opaque=rng.getrandbits(32)))
                    else:
                        upr.append(encode(op, dialect="upr", value=rand_bytes(rng, 0, 40), opaque=rng.getrandbits(32)))
                except EncodeError:
                    pass
                except Exception:
                    errors.append(f"encode upr {op} {v.name}:\n{traceback.format_exc()}")
    return mcbp, upr, errors


# ---------------------------------------------------------------------------
# mutations


def _sections(b: bytes | bytearray) -> tuple[int, int, int] | None:
    """(framing length, extras length, key length) of an mcbp header, or None."""
    if len(b) < 24:
        return None
    if b[0] in (0x08, 0x18):
        return b[2], b[4], b[3]
    return 0, b[4], (b[2] << 8) | b[3]


def _fix_body_length(b: bytearray) -> None:
    if len(b) >= 24:
        struct.pack_into(">I", b, 8, len(b) - 24)


def mutate_mcbp(rng: random.Random, data: bytes, corpus: Sequence[bytes]) -> bytes:
    b = bytearray(data)
    op = rng.randrange(10)
    n = len(b)
    if op == 0 and n:  # flip bytes
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(n)
            b[i] = b[i] ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.getrandbits(8)
    elif op == 1 and n >= 24:  # length fields
        which = rng.randrange(4)
        if which == 0:  # key length
            struct.pack_into(
                ">H", b, 2, rng.choice((0, 1, 255, 256, 0xFFFF, rng.getrandbits(16), ((b[2] << 8) | b[3]) + rng.randint(-2, 2) & 0xFFFF))
            )
        elif which == 1:  # extras length
            b[4] = rng.choice((0, 1, 4, 8, 13, 16, 18, 20, 21, 24, 31, 48, 255, rng.getrandbits(8)))
        else:  # body length
            body = struct.unpack_from(">I", b, 8)[0]
            struct.pack_into(
                ">I",
                b,
                8,
                rng.choice((0, 1, body + rng.randint(-8, 8), rng.getrandbits(32), 22 * 1024 * 1024 + 1, 0xFFFFFFFF, rng.randint(0, 300)))
                & 0xFFFFFFFF,
            )
    elif op == 2 and n:  # truncate
        del b[rng.randrange(n) :]
    elif op == 3:  # splice with another seed
        other = rng.choice(corpus)
        b = b[: rng.randint(0, n)] + other[rng.randint(0, len(other)) :]
    elif op == 4:  # insert random bytes
        i = rng.randint(0, n)
        b[i:i] = rand_bytes(rng, 1, 16)
    elif op == 5 and n:  # delete a range
        i = rng.randrange(n)
        del b[i : i + rng.randint(1, 16)]
    elif op == 6:  # alt magic with random framing extras
        sec = _sections(b)
        if sec is not None and sec[2] <= 0xFF:
            fl, _el, kl = sec
            if rng.random() < 0.6:
                framing = encode_frame_infos([(rng.randint(0, 40), rand_bytes(rng, 0, 20)) for _ in range(rng.randint(0, 3))])
            else:
                framing = rand_bytes(rng, 0, 24)
            framing = framing[:255]
            is_resp = b[0] in spec.RESPONSE_MAGICS
            b[0] = 0x18 if (is_resp if rng.random() < 0.9 else not is_resp) else 0x08
            b[24 : 24 + fl] = framing
            b[2] = len(framing) if rng.random() < 0.9 else rng.getrandbits(8)
            b[3] = kl
            if rng.random() < 0.9:
                _fix_body_length(b)
    elif op == 7:  # datatype bits and a matching (or not) value
        sec = _sections(b)
        if sec is not None:
            v0 = min(len(b), 24 + sum(sec))
            value, dt = doc_value(rng)
            if rng.random() < 0.3:
                dt = rng.getrandbits(8) if rng.random() < 0.2 else rng.choice(_DATATYPES)
            b[5] = dt
            b[v0:] = value
            if rng.random() < 0.95:
                _fix_body_length(b)
    elif op == 8 and n >= 24:  # header bytes: magic, opcode, datatype, vbucket/status
        which = rng.randrange(4)
        if which == 0:
            b[0] = rng.choice((*spec.MAGICS, rng.getrandbits(8)))
        elif which == 1:
            b[1] = rng.choice((*spec.COMMANDS, rng.getrandbits(8)))
        elif which == 2:
            b[5] = rng.getrandbits(8)
        else:
            struct.pack_into(">H", b, 6, rng.choice((*_STATUS_CODES, rng.getrandbits(16))))
    else:  # duplicate a piece
        if n:
            i = rng.randrange(n)
            piece = b[i : i + rng.randint(1, 32)]
            j = rng.randint(0, n)
            b[j:j] = piece
    return bytes(b)


def mutate_upr(rng: random.Random, data: bytes, corpus: Sequence[bytes]) -> bytes:
    b = bytearray(data)
    n = len(b)
    op = rng.randrange(6)
    if op == 0 and n >= 12:  # length field
        body = struct.unpack_from(">I", b, 8)[0]
        struct.pack_into(">I", b, 8, rng.choice((0, 1, body + rng.randint(-4, 4), rng.getrandbits(32), rng.randint(0, 200))) & 0xFFFFFFFF)
    elif op == 1 and n >= 13:  # opcode / body type / reserved
        i = rng.choice((0, 1, 2, 3, 12))
        b[i] = rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 8, rng.getrandbits(8)))
    elif op == 2 and n:
        del b[rng.randrange(n) :]
    elif op == 3:
        other = rng.choice(corpus)
        b = b[: rng.randint(0, n)] + other[rng.randint(0, len(other)) :]
    elif op == 4:
        i = rng.randint(0, n)
        b[i:i] = rand_bytes(rng, 1, 16)
        if n >= 12 and rng.random() < 0.7:
            struct.pack_into(">I", b, 8, len(b) - 12)
    elif n:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(n)] = rng.getrandbits(8)
    return bytes(b)


# ---------------------------------------------------------------------------
# the fuzzer


@dataclass
class Failure:
    stage: str
    data: bytes
    detail: str
    tb: str


@dataclass
class Stats:
    inputs: int = 0
    bytes_fed: int = 0
    events: Counter[str] = field(default_factory=Counter)
    dissections: int = 0
    problems: int = 0
    rendered: int = 0
    exceptions: int = 0
    tiling_violations: int = 0
    chunking_violations: int = 0  # every decoder contract but tiling
    #: inputs each decoder contract was checked on, and the inputs that broke it (see CONTRACTS)
    contract_checks: Counter[str] = field(default_factory=Counter)
    contract_violations: Counter[str] = field(default_factory=Counter)  # failed checks (a broken input may fail several)
    with_gaps: int = 0  # inputs fed with at least one non-zero gap
    range_notes: int = 0
    signatures: Counter[str] = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    violations: list[Failure] = field(default_factory=list)
    notes: list[Failure] = field(default_factory=list)
    slowest: tuple[float, bytes, str] = (0.0, b"", "")


#: the decoder's contracts, each checked on every input (``gaps`` says more on the inputs fed with gaps)
CONTRACTS = ("never raises", "tiling", "chunking", "byte-by-byte", "gaps")

Pieces = list[list[tuple[int, int]]]  # per gap-free segment of an input, the (start, end) of each feed()


def _signature(stage: str, exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{fr.filename.rsplit('/', 1)[-1]}:{fr.lineno}" for fr in reversed(tb) if "dcpinspect" in fr.filename), "?")
    return f"{stage}: {type(exc).__name__} at {where}"


def _event_bytes(ev: Event) -> bytes:
    if isinstance(ev, Frame):
        return ev.raw
    return ev.data  # type: ignore[union-attr]


def _event_key(ev: Event) -> tuple[Any, ...]:
    if isinstance(ev, Frame):
        return ("frame", ev.offset, ev.raw, ev.header, ev.dialect)
    if isinstance(ev, Gap):
        return ("gap", ev.offset, ev.length)
    return (ev.type, ev.offset, ev.data, ev.reason)


class Fuzzer:
    def __init__(self, seed: int, per_variant: int) -> None:
        self.rng = random.Random(seed)
        self.mcbp, self.upr, self.seed_errors = build_seeds(self.rng, per_variant)
        self.stats = Stats()
        tri = (True, False, None)
        self.contexts = [
            DissectContext(
                collections=self.rng.choice(tri),
                xattr=self.rng.choice(tri),
                snappy=self.rng.choice(tri),
                json=self.rng.choice(tri),
                delete_times=self.rng.choice(tri),
                include_xattrs=self.rng.choice(tri),
                stream_ids=self.rng.choice(tri),
                reveal_secrets=self.rng.random() < 0.3,
            )
            for _ in range(512)
        ]

    # --- recording -----------------------------------------------------------
    def _exception(self, stage: str, data: bytes, detail: str, exc: BaseException) -> None:
        s = self.stats
        s.exceptions += 1
        sig = _signature(stage, exc)
        s.signatures[sig] += 1
        if len(s.failures) < MAX_TRACEBACKS and s.signatures[sig] <= PER_SIGNATURE:
            s.failures.append(Failure(stage, data, detail, traceback.format_exc()))

    def _violation(self, kind: str, data: bytes, detail: str) -> None:
        s = self.stats
        if kind == "tiling":
            s.tiling_violations += 1
        else:
            s.chunking_violations += 1
        s.contract_violations[kind.split(" (", maxsplit=1)[0]] += 1
        sig = f"violation: {kind}"
        s.signatures[sig] += 1
        if len(s.violations) < MAX_TRACEBACKS and s.signatures[sig] <= PER_SIGNATURE:
            s.violations.append(Failure(kind, data, detail, ""))

    def _note(self, data: bytes, detail: str) -> None:
        s = self.stats
        s.range_notes += 1
        if len(s.notes) < 10:
            s.notes.append(Failure("range", data, detail, ""))

    # --- inputs ----------------------------------------------------------------
    def make_input(self) -> tuple[bytes, str]:
        rng = self.rng
        r = rng.random()
        if r < 0.08:  # pure random bytes
            data = rand_bytes(rng, 0, 200)
            if rng.random() < 0.3 and data:  # start on a known magic
                data = bytes([rng.choice(tuple(spec.MAGICS))]) + data[1:]
            return data, "upr" if rng.random() < 0.3 else "mcbp"
        if r < 0.15:  # UPR draft
            data = rng.choice(self.upr)
            for _ in range(rng.choice((0, 1, 1, 2, 3))):
                data = mutate_upr(rng, data, self.upr)
            if rng.random() < 0.2:
                data += rng.choice(self.upr)
            return data, "upr"
        data = rng.choice(self.mcbp)
        for _ in range(rng.choice((0, 1, 1, 1, 2, 2, 3, 5))):
            data = mutate_mcbp(rng, data, self.mcbp)
        if len(data) >= 24 and rng.random() < 0.4:  # repair the body length: the frame passes framing, its sections need not agree
            b = bytearray(data)
            _fix_body_length(b)
            data = bytes(b)
        if rng.random() < 0.25:  # a stream of several frames
            parts = [data]
            for _ in range(rng.randint(1, 3)):
                other = rng.choice(self.mcbp)
                if rng.random() < 0.5:
                    other = mutate_mcbp(rng, other, self.mcbp)
                parts.append(other)
            rng.shuffle(parts)
            data = b"".join(parts)
        if len(data) > 1024 and rng.random() < 0.9:
            data = data[:1024]
        return data, ("mcbp" if rng.random() < 0.98 else "upr")

    def _options(self) -> dict[str, Any]:
        rng = self.rng
        opts: dict[str, Any] = {}
        if rng.random() < 0.2:
            opts["aligned"] = False
        if rng.random() < 0.1:
            opts["max_body"] = rng.choice((0, 8, 16, 64, 256))
        if rng.random() < 0.15:
            opts["garbage_chunk"] = rng.choice((1, 2, 3, 7, 16, 64))
        return opts

    def _plan(self, n: int) -> tuple[list[tuple[int, int]], list[int]]:
        """Split points: ``segments`` [(a, b)] of the input and ``gaps`` fed after each but the last."""
        rng = self.rng
        cuts: list[int] = []
        if n and rng.random() < 0.12:
            cuts = sorted(rng.randint(0, n) for _ in range(rng.randint(1, 2)))
        bounds = [0, *cuts, n]
        segments = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
        gaps = [rng.choice((0, 1, 3, 24, rng.randint(1, 5000))) for _ in cuts]
        return segments, gaps

    def _chunks(self, a: int, b: int) -> list[tuple[int, int]]:
        rng = self.rng
        n = b - a
        if n <= 0:
            return [(a, b)] if rng.random() < 0.1 else []  # feeding b"" now and then
        if n <= 64 and rng.random() < 0.05:
            return [(i, i + 1) for i in range(a, b)]
        k = rng.choice((1, 1, 2, 2, 3, 4, 6))
        cuts = sorted({a, b, *(rng.randint(a, b) for _ in range(k - 1))})
        return list(itertools.pairwise(cuts))

    # --- one input -------------------------------------------------------------
    def _feed(
        self, data: bytes, dialect: str, opts: dict[str, Any], pieces: Pieces, gaps: list[int], zero_gaps: float = 0.0
    ) -> tuple[list[Event], int]:
        """Feed ``pieces`` of ``data`` (``gaps[i]`` reported after segment ``i``) to a fresh decoder, then close it.

        With ``zero_gaps``, ``feed_gap(0)`` is also called before that share of the pieces (it must change nothing).
        """
        rng = self.rng
        dec = FrameDecoder(dialect, **opts)
        events: list[Event] = []
        for i, segment in enumerate(pieces):
            for a, b in segment:
                if zero_gaps and rng.random() < zero_gaps:
                    events += dec.feed_gap(0)
                events += dec.feed(data[a:b])
            if i < len(gaps):
                events += dec.feed_gap(gaps[i])
        events += dec.close()
        return events, dec.offset

    def _segments_apart(
        self, data: bytes, dialect: str, opts: dict[str, Any], segments: list[tuple[int, int]], gaps: list[int]
    ) -> list[Any]:
        """What a stream with gaps must decode to: each gap-free stretch by a decoder of its own (unaligned after a gap),
        offsets shifted, and the ``end of stream`` of each stretch but the last read as the gap after it."""
        stretches: list[tuple[int, int, int]] = []  # (start, end, gap after it or 0)
        start = 0
        for i, (_, b) in enumerate(segments):
            gap = gaps[i] if i < len(gaps) else 0
            if gap or i == len(segments) - 1:
                stretches.append((start, b, gap))
                start = b
        out: list[Any] = []
        shift = 0
        for k, (a, b, gap) in enumerate(stretches):
            for e in decode(data[a:b], dialect=dialect, **({**opts, "aligned": False} if k else opts)):
                key = _event_key(e)
                if gap and not isinstance(e, Frame):
                    key = (*key[:3], key[3].replace("end of stream", f"gap of {gap} bytes"))
                out.append((key[0], key[1] + shift, *key[2:]))
            shift += b - a
            if gap:
                out.append(("gap", shift, gap))
                shift += gap
        return out

    def check_decoder(self, data: bytes, dialect: str) -> tuple[list[Event], str] | None:
        """Hold the decoder to its contracts on one input; return its events and how it was fed (``None`` if it raised).

        * never raises: no call below raises;
        * tiling: the events tile the input (see ``_check_tiling``);
        * chunking: random chunks give the same events as one feed per gap-free segment;
        * byte-by-byte: so does feeding one byte at a time;
        * gaps: ``feed_gap(0)`` anywhere changes nothing, and a non-zero gap acts as the end of one stream and the
          start of another, unaligned one (the events of each gap-free stretch decoded alone, shifted).
        """
        s = self.stats
        s.inputs += 1
        opts = self._options()
        segments, gaps = self._plan(len(data))
        detail = f"dialect={dialect} options={opts} segments={segments} gaps={gaps}"
        chunking: Pieces = [self._chunks(a, b) for a, b in segments]
        by_byte: Pieces = [[(i, i + 1) for i in range(a, b)] for a, b in segments]
        s.contract_checks["never raises"] += 1
        s.with_gaps += any(gaps)
        stage = "decode"
        try:
            ref, _ = self._feed(data, dialect, opts, [[seg] for seg in segments], gaps)
            stage = "feed"
            events, final_offset = self._feed(data, dialect, opts, chunking, gaps)
            stage = "feed byte by byte"
            single, _ = self._feed(data, dialect, opts, by_byte, gaps)
            stage = "feed_gap(0)"
            zero, _ = self._feed(data, dialect, opts, chunking, gaps, zero_gaps=0.3)
            stage = "decode the gap-free stretches apart"
            apart = self._segments_apart(data, dialect, opts, segments, gaps)
        except Exception as exc:
            s.contract_violations["never raises"] += 1
            self._exception(stage, data, detail + (f" chunks={chunking}" if stage != "decode" else ""), exc)
            return None
        s.bytes_fed += len(data)
        s.contract_checks["tiling"] += 1
        self._check_tiling(data, gaps, segments, ref, None, detail + " [reference]")
        detail += f" chunks={chunking}"
        self._check_tiling(data, gaps, segments, events, final_offset, detail)
        want = [_event_key(e) for e in ref]
        for contract, got, how in (
            ("chunking", events, "chunked"),
            ("byte-by-byte", single, "byte by byte"),
            ("gaps", zero, "with feed_gap(0) calls"),
        ):
            s.contract_checks[contract] += 1
            keys = [_event_key(e) for e in got]
            if keys != want:
                same_bytes = [k[:3] for k in want] == [k[:3] for k in keys]
                kind = f"{contract} (garbage reason only)" if same_bytes else contract
                self._violation(kind, data, detail + f"\n  whole:   {ref}\n  {how}: {got}")
        if any(gaps) and apart != want:
            self._violation("gaps", data, detail + f"\n  with gaps:  {want}\n  stretches apart: {apart}")
        return events, detail

    def run_one(self, data: bytes, dialect: str) -> None:
        """The decoder contracts, then dissect, ``event_dict`` and (now and then) render every event."""
        rng = self.rng
        s = self.stats
        checked = self.check_decoder(data, dialect)
        if checked is None:
            return
        events, detail = checked
        render = rng.randrange(RENDER_EVERY) == 0
        for ev in events:
            s.events[ev.type] += 1
            ctx = rng.choice(self.contexts) if rng.random() < 0.9 else None
            if isinstance(ev, Frame):
                self._dissect(ev, ctx, data, detail)
            try:
                json.dumps(event_dict(ev, ctx))
            except Exception as exc:
                self._exception("event_dict", data, detail + f" event={ev!r} ctx={ctx}", exc)
            if render:
                self._render(ev, ctx, data, detail)

    def _check_tiling(
        self, data: bytes, gaps: list[int], segments: list[tuple[int, int]], events: list[Event], final: int | None, detail: str
    ) -> None:
        total = len(data) + sum(gaps)
        pos = 0
        body = bytearray()
        seen_gaps: list[tuple[int, int]] = []
        for ev in events:
            if ev.offset != pos:
                self._violation("tiling", data, f"{detail}\n  event {ev!r} at offset {ev.offset}, expected {pos}\n  events: {events}")
                return
            if ev.length <= 0:
                self._violation("tiling", data, f"{detail}\n  empty event {ev!r}\n  events: {events}")
                return
            if isinstance(ev, Gap):
                seen_gaps.append((ev.offset, ev.length))
            else:
                body += _event_bytes(ev)
                if isinstance(ev, Frame) and ev.length != (24 if ev.dialect == "mcbp" else 12) + ev.body_length:
                    self._violation(
                        "tiling", data, f"{detail}\n  frame {ev!r} length {ev.length} != header + declared body {ev.body_length}"
                    )
                    return
            pos += ev.length
        want_gaps = []
        off = 0
        for i, (a, b) in enumerate(segments):
            off += b - a
            if i < len(gaps) and gaps[i]:
                want_gaps.append((off, gaps[i]))
                off += gaps[i]
        if pos != total or (final is not None and final != total):
            self._violation(
                "tiling",
                data,
                f"{detail}\n  events cover {pos} bytes (decoder offset {final}), fed {len(data)} + gaps {sum(gaps)} = {total}",
            )
        elif bytes(body) != data:
            self._violation("tiling", data, f"{detail}\n  the events' bytes are not the input\n  events: {events}")
        elif seen_gaps != want_gaps:
            self._violation("tiling", data, f"{detail}\n  gaps at {seen_gaps}, fed {want_gaps}")

    def _dissect(self, fr: Frame, ctx: DissectContext | None, data: bytes, detail: str) -> None:
        s = self.stats
        try:
            d = dissect(fr, ctx)
            d.extras  # noqa: B018 - touching is the point
            d.key  # noqa: B018
            d.document  # noqa: B018
            s.problems += len(d.problems)
            s.dissections += 1
            n = len(fr.raw)
            for fv in d.fields:
                if fv.offset < 0 or fv.length < 0 or fv.offset + fv.length > n:
                    self._note(data, f"{detail} ctx={ctx}\n  {fr!r}: field {fv.path} at {fv.offset}+{fv.length} outside the {n}-byte frame")
            for p in d.problems:
                if p.offset < 0 or p.length < 0 or p.offset + p.length > n:
                    self._note(
                        data, f"{detail} ctx={ctx}\n  {fr!r}: problem {p.message!r} at {p.offset}+{p.length} outside the {n}-byte frame"
                    )
        except Exception as exc:
            self._exception("dissect", data, detail + f" frame={fr.raw.hex()} ctx={ctx}", exc)

    def _render(self, ev: Event, ctx: DissectContext | None, data: bytes, detail: str) -> None:
        rng = self.rng
        max_rows = rng.choice((None, 3, 8, 64))
        calls: list[tuple[str, Callable[[], object]]] = [
            ("annotate", lambda: annotate(ev, context=ctx, max_rows=max_rows)),
            ("annotate_html", lambda: annotate_html(ev, context=ctx, max_rows=max_rows)),
        ]
        if isinstance(ev, Frame):
            calls += [
                ("breakdown", lambda: breakdown(ev, context=ctx)),
                ("summary", lambda: summary(ev, context=ctx)),
                ("byte_table", lambda: byte_table(ev, context=ctx, style=rng.choice((None, "docs", "upr")))),
                ("dissection.as_dict", lambda: json.dumps(dissect(ev, ctx).as_dict(), default=repr)),
                ("dissection.header", lambda: dissect(ev, ctx).header),
                ("frame properties", lambda: _frame_properties(ev)),
            ]
        for name, fn in calls:
            try:
                fn()
            except Exception as exc:
                self._exception(name, data, detail + f" event={ev!r} ctx={ctx} max_rows={max_rows}", exc)
        self.stats.rendered += 1


def _frame_properties(fr: Frame) -> tuple[Any, ...]:
    return (
        fr.length,
        fr.magic,
        fr.opcode,
        fr.is_alt,
        fr.framing_extras_length,
        fr.key_length,
        fr.extras_length,
        fr.datatype,
        fr.is_response,
        fr.role,
        fr.vbucket,
        fr.status,
        fr.body_length,
        fr.opaque,
        fr.cas,
        fr.name,
        fr.framing,
        fr.extras,
        fr.key,
        fr.value,
        fr.body,
        fr.stream_id,
        repr(fr),
    )


def _hex(data: bytes) -> str:
    h = data.hex()
    return h if len(h) <= HEX_LIMIT else h[:HEX_LIMIT] + f"... ({len(data)} bytes)"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Fuzz decode/dissect/render with random and mutated frames.")
    p.add_argument("--count", type=int, default=1_000_000, help="inputs (default 1,000,000)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--per-variant", type=int, default=12, help="encoded seeds per (opcode, role, variant) (default 12)")
    p.add_argument("--decoder-only", action="store_true", help="check the decoder's contracts only (no dissect, event_dict or render)")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    fz = Fuzzer(args.seed, args.per_variant)
    s = fz.stats
    print(
        f"fuzz: seed {args.seed}; corpus {len(fz.mcbp)} mcbp + {len(fz.upr)} upr frames from {len(spec.COMMANDS)} opcodes (built in {time.perf_counter() - t0:.1f}s)"
    )
    if fz.seed_errors:
        print(f"fuzz: {len(fz.seed_errors)} unexpected encode errors while building seeds (not counted); first:\n{fz.seed_errors[0]}")
    rss_start, _ = rss_mib()
    series: list[tuple[int, float, float, int]] = [(0, rss_start, rss_mib()[1], sys.getallocatedblocks())]
    print(f"{'inputs':>9}  {'rss MiB':>8}  {'peak MiB':>8}  {'py blocks':>9}  {'elapsed s':>9}  {'exceptions':>10}  {'violations':>10}")
    print(f"{0:>9}  {rss_start:>8.1f}  {series[0][2]:>8.1f}  {series[0][3]:>9}  {0:>9.1f}  {0:>10}  {0:>10}")
    t_start = time.perf_counter()
    for i in range(1, args.count + 1):
        data, dialect = fz.make_input()
        t = time.perf_counter()
        if args.decoder_only:
            fz.check_decoder(data, dialect)
        else:
            fz.run_one(data, dialect)
        dt = time.perf_counter() - t
        if dt > s.slowest[0]:
            s.slowest = (dt, data, dialect)
        if i % RSS_EVERY == 0 or i == args.count:
            cur, peak = rss_mib()
            blocks = sys.getallocatedblocks()
            series.append((i, cur, peak, blocks))
            print(
                f"{i:>9}  {cur:>8.1f}  {peak:>8.1f}  {blocks:>9}  {time.perf_counter() - t_start:>9.1f}  {s.exceptions:>10}  {s.tiling_violations + s.chunking_violations:>10}",
                flush=True,
            )
    elapsed = time.perf_counter() - t_start

    print()
    print(f"rss MiB series (every {RSS_EVERY:,} inputs): " + " ".join(f"{cur:.1f}" for _, cur, _, _ in series))
    print("python heap blocks series (sys.getallocatedblocks): " + " ".join(str(b) for _, _, _, b in series))
    print(
        f"events: {dict(s.events)}; {s.bytes_fed:,} bytes fed; {s.dissections:,} dissections with {s.problems:,} problems; {s.rendered:,} inputs rendered"
    )
    print(
        f"time: {elapsed:.1f}s ({s.inputs / elapsed:,.0f} inputs/s); slowest input {s.slowest[0] * 1000:.1f} ms ({s.slowest[2]}, {len(s.slowest[1])} bytes: {_hex(s.slowest[1])[:200]})"
    )
    if s.signatures:
        print("\nfailure signatures:")
        for sig, n in s.signatures.most_common():
            print(f"  {n:>8}  {sig}")
    for k, f in enumerate(s.failures, 1):
        print(f"\n--- exception {k}/{len(s.failures)} in {f.stage}\ninput ({len(f.data)} bytes): {_hex(f.data)}\n{f.detail}\n{f.tb}")
    for k, f in enumerate(s.violations, 1):
        print(f"\n--- {f.stage} violation {k}/{len(s.violations)}\ninput ({len(f.data)} bytes): {_hex(f.data)}\n{f.detail}")
    if s.range_notes:
        print(f"\nnote: {s.range_notes} field/problem byte ranges outside their frame (not counted as violations); first {len(s.notes)}:")
        for f in s.notes:
            print(f"  input {_hex(f.data)[:400]}\n  {f.detail}")
    violations = s.tiling_violations + s.chunking_violations
    peak = max([rss_mib()[1]] + [max(cur, pk) for _, cur, pk, _ in series])
    end = series[-1][1]
    print(f"\ndecoder contracts ({s.with_gaps:,} inputs fed with gaps):")
    for contract in CONTRACTS:
        print(f"  {contract:<14} checked on {s.contract_checks[contract]:>9,} inputs, {s.contract_violations[contract]:>6,} failures")
    print(
        f"\nfuzz: {s.inputs} inputs, {s.exceptions} exceptions, {violations} invariant violations "
        f"({s.tiling_violations} tiling, {s.chunking_violations} chunking/byte-by-byte/gaps), rss MiB start/end/max {rss_start:.1f}/{end:.1f}/{peak:.1f}"
    )
    return 1 if s.exceptions or violations else 0


if __name__ == "__main__":
    sys.exit(main())
