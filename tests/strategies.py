"""Shared Hypothesis strategies for the property tests.

Everything here is derived from the protocol table (``spec.COMMANDS`` and
``spec_upr.UPR_BODIES``): a :class:`Case` is one frame built *within the
rules* of one table variant, with the values a dissection must give back.
"""

from __future__ import annotations

import itertools
import json
import string
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import cramjam
from hypothesis import strategies as st

from dcpinspect import DissectContext, encode
from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import OpenFlag, Status
from dcpinspect.protocol.fields import BYTES, ENUM, FLAGS, INT, TEXT, Command, Field, Group, Variant
from dcpinspect.protocol.upr import UPR_BODIES
from dcpinspect.wire.framing import encode_leb128

# ---------------------------------------------------------------------------
# the table, flattened

#: (command, response?, variant) for every variant of every command
ALL_VARIANTS: list[tuple[Command, bool, Variant]] = [
    (cmd, response, v)
    for cmd in spec.COMMANDS.values()
    for response, variants in ((False, cmd.request), (True, cmd.response))
    for v in variants
]
#: (upr header opcode, variant) for every UPR body variant
UPR_VARIANTS: list[tuple[int, Variant]] = [(op, v) for op, variants in UPR_BODIES.items() for v in variants]

#: ``when`` attributes that are not extras fields
_NOT_FIELDS = ("extlen", "status", "vlen")

SASL_MECHS = ("PLAIN", "SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "OAUTHBEARER")
HEX_DIGITS = "0123456789abcdef"


def variant_id(cmd: Command, response: bool, v: Variant) -> str:
    """A readable pytest id: ``DCP_DELETION-request-v2``."""
    return f"{cmd.name}-{'response' if response else 'request'}-{v.name or 'default'}"


def upr_variant_id(op: int, v: Variant) -> str:
    return f"upr{op}-{v.name.replace(' ', '_')}"


def selectors(v: Variant) -> dict[str, int]:
    """Extras/body fields whose value selects the variant (``version``, ``event``, UPR ``type``)."""
    return {k: w for k, w in v.when if k not in _NOT_FIELDS}


def max_uint(size: int) -> int:
    return (1 << (8 * size)) - 1


def known_bits(f: Field) -> int:
    mask = 0
    for bit in f.names or ():
        mask |= bit
    return mask


# ---------------------------------------------------------------------------
# field values within the rules

small_text = st.text(max_size=12)
nonempty_text = st.text(min_size=1, max_size=12)


def field_values(f: Field) -> st.SearchStrategy[Any]:
    """Values of one field that the table accepts (known enum values / flag bits, nothing invalid)."""
    size = f.size
    if f.kind == TEXT:
        return small_text if size is None else st.binary(min_size=size, max_size=size)
    if f.kind == BYTES:
        return st.binary(max_size=16) if size is None else st.binary(min_size=size, max_size=size)
    assert size is not None
    if f.kind == INT:
        half = 1 << (8 * size - 1)
        return st.integers(-half, half - 1)
    invalid = set(f.invalid or ())
    if f.kind == ENUM and f.names is not None and f.strict:
        return st.sampled_from(sorted(set(f.names) - invalid))
    if f.kind == FLAGS and f.names is not None and f.strict:
        bits = sorted(b for b in f.names if b not in invalid)
        return st.sets(st.sampled_from(bits)).map(sum)
    return st.integers(0, max_uint(size))


def fix_checks(vals: dict[str, Any], checks: tuple[tuple[object, ...], ...]) -> None:
    """Make ``vals`` satisfy the variant's ``checks`` (values only move within their field's rules)."""
    for _ in range(10):
        if all(_check_ok(vals, c) for c in checks):
            return
        for check in checks:
            kind = check[0]
            if kind in ("exclusive", "requires", "cache_transfer_only_with"):
                name, a, b = str(check[1]), int(check[2]), int(check[3])  # type: ignore[call-overload]
                v = vals[name]
                if kind == "exclusive" and v & a and v & b:
                    vals[name] = v & ~b
                elif kind == "requires" and v & a and not v & b:
                    vals[name] = v | b
                elif kind == "cache_transfer_only_with" and v & a and v & ~b:
                    vals[name] = v & b
            elif kind == "order":
                lo, hi = str(check[1]), str(check[2])
                if vals[lo] > vals[hi]:
                    vals[hi] = vals[lo]
            elif kind == "zero":
                vals[str(check[1])] = 0
            elif kind == "nonzero" and vals[str(check[1])] == 0:
                vals[str(check[1])] = 1
    raise AssertionError(f"could not satisfy {checks} with {vals}")


def _check_ok(vals: dict[str, Any], check: tuple[object, ...]) -> bool:
    kind = check[0]
    if kind == "exclusive":
        v = vals[str(check[1])]
        return not (v & int(check[2]) and v & int(check[3]))  # type: ignore[call-overload]
    if kind == "requires":
        v = vals[str(check[1])]
        return not (v & int(check[2]) and not v & int(check[3]))  # type: ignore[call-overload]
    if kind == "cache_transfer_only_with":
        v = vals[str(check[1])]
        return not (v & int(check[2]) and v & ~int(check[3]))  # type: ignore[call-overload]
    if kind == "order":
        return bool(vals[str(check[1])] <= vals[str(check[2])])
    if kind == "zero":
        return vals[str(check[1])] == 0
    if kind == "nonzero":
        return vals[str(check[1])] != 0
    return True  # context checks depend on the DissectContext, not the values


@st.composite
def fields_dict(draw: st.DrawFn, fields: tuple[Field | Group, ...], fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """A value for every field (groups: 0..5 entries, as dicts)."""
    fixed = fixed or {}
    out: dict[str, Any] = {}
    for f in fields:
        if f.name in fixed:
            out[f.name] = fixed[f.name]
        elif isinstance(f, Group):
            out[f.name] = draw(st.lists(fields_dict(f.fields), max_size=5))
        else:
            out[f.name] = draw(field_values(f))
    return out


# ---------------------------------------------------------------------------
# keys and values by kind

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | small_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)
hex_text = st.text(HEX_DIGITS, min_size=1, max_size=8)


@st.composite
def stream_req_json(draw: st.DrawFn) -> dict[str, Any]:
    """A DCP_STREAM_REQ value that breaks none of the value rules (collections/stream-ids unknown)."""
    obj: dict[str, Any] = {}
    if draw(st.booleans()):
        obj["uid"] = draw(hex_text)
    if draw(st.booleans()):
        obj["sid"] = draw(st.integers(1, 0xFFFF))
    which = draw(st.sampled_from(("none", "collections", "scope")))
    if which == "collections":
        obj["collections"] = draw(st.lists(hex_text, max_size=3))
    elif which == "scope":
        obj["scope"] = draw(hex_text)
    if draw(st.booleans()):
        obj["purge_seqno"] = str(draw(st.integers(0, 2**64 - 1)))
    if draw(st.booleans()):
        obj["cts"] = {"free_memory": draw(st.integers(0, 2**40)), "all_keys": draw(st.booleans())}
    return obj


def xattr_section(pairs: list[tuple[str, str]]) -> bytes:
    body = b"".join(struct.pack(">I", len(p)) + p for p in (k.encode() + b"\0" + v.encode() + b"\0" for k, v in pairs))
    return struct.pack(">I", len(body)) + body


xattr_key = st.text(string.ascii_letters + "_$", min_size=1, max_size=6)
xattr_val = st.text(string.printable.replace("\0", ""), max_size=8)


@st.composite
def doc_value(draw: st.DrawFn, required: bool, datatypes: frozenset[int] | None) -> tuple[int, bytes | None, Any]:
    """(datatype, value bytes, expected document or NOT_CHECKED) for a document value."""
    allowed = sorted(datatypes if datatypes is not None else range(8))
    if not required and draw(st.booleans()):
        return 0, None, NOT_CHECKED
    dt = draw(st.sampled_from(allowed))
    expected: Any = NOT_CHECKED
    if dt & 0x01:
        obj = draw(json_values)
        body = json.dumps(obj).encode()
        expected = obj
    else:
        body = draw(st.binary(min_size=1 if required and not dt else 0, max_size=24))
    if dt & 0x04:
        body = xattr_section(draw(st.lists(st.tuples(xattr_key, xattr_val), max_size=3))) + body
    if dt & 0x02:
        body = bytes(cramjam.snappy.compress_raw(body))
    return dt, body, expected


flatbuffer_scalars: dict[str, st.SearchStrategy[Any]] = {
    "u64": st.integers(0, 2**64 - 1),
    "u32": st.integers(0, 2**32 - 1),
    "bool": st.booleans(),
    "string": small_text,
}


def flatbuffer_values(table: str) -> st.SearchStrategy[dict[str, Any]]:
    schema = spec.FLATBUFFER_TABLES[table]
    return st.fixed_dictionaries({name: flatbuffer_scalars[typ] for name, typ in schema})


@st.composite
def cache_records(draw: st.DrawFn) -> tuple[bytes, list[dict[str, Any]]]:
    """DCP_CACHE_TRANSFER value bytes (1..3 records, keys with a LEB128 collection id) and the records expected."""
    raw = bytearray()
    expected: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        cid = draw(st.integers(0, 2**32 - 1))
        key_text = draw(small_text)
        key = encode_leb128(cid) + key_text.encode()
        value = draw(st.binary(max_size=12))
        hdr = {
            "cas": draw(st.integers(0, 2**64 - 1)),
            "by_seqno": draw(st.integers(0, 2**64 - 1)),
            "rev_seqno": draw(st.integers(0, 2**64 - 1)),
            "value_len": len(value),
            "flags": draw(st.integers(0, 2**32 - 1)),
            "expiration": draw(st.integers(0, 2**32 - 1)),
            "key_len": len(key),
            "datatype": draw(st.integers(0, 7)),
            "cache_hint": draw(st.integers(0, 255)),
        }
        raw += struct.pack(">QQQIIIHBB", *hdr.values()) + key + value
        expected.append({**hdr, "cid": cid, "key": key_text})
    return bytes(raw), expected


# ---------------------------------------------------------------------------
# cases


class _NotChecked:
    def __repr__(self) -> str:
        return "NOT_CHECKED"


NOT_CHECKED: Any = _NotChecked()


@dataclass
class Case:
    """One frame built within the rules of one table variant, and what dissecting it must give."""

    opcode: int
    response: bool
    variant: Variant
    kwargs: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    key: bytes = b""
    document: Any = NOT_CHECKED
    dialect: str = "mcbp"
    context: DissectContext | None = None  # what to dissect with (None: the default, nothing known)

    def encode(self, **changes: Any) -> bytes:
        return encode(self.opcode, **{**self.kwargs, **changes})


def key_strategy(cmd: Command, v: Variant) -> st.SearchStrategy[bytes]:
    kind = v.key
    if kind == "none":
        return st.just(b"")
    if cmd.opcode == 0x5E:  # DCP_CONTROL: only known keys
        return st.sampled_from(sorted(spec.CONTROL_KEYS)).map(str.encode)
    if cmd.opcode in (0x21, 0x22):  # SASL mechanism
        return st.sampled_from(SASL_MECHS).map(str.encode)
    if kind == "agent":
        plain = nonempty_text.filter(lambda s: not s.startswith("{"))
        as_json = st.fixed_dictionaries({"a": small_text, "i": small_text}).map(json.dumps)
        return (plain | as_json).map(str.encode)
    if kind == "doc":
        return st.binary(min_size=1, max_size=24)
    if kind in ("doc?", "any"):
        return st.binary(max_size=24)
    if kind == "text":
        return nonempty_text.map(str.encode)
    if kind == "text?":
        return small_text.map(str.encode)
    raise AssertionError(f"unknown key kind {kind!r}")


plain_part = st.text(string.ascii_letters + string.digits + "@.-", max_size=10)


@st.composite
def mcbp_case(draw: st.DrawFn, cmd: Command, response: bool, v: Variant) -> Case:
    """A frame of variant ``v`` that keeps every rule of the table."""
    status = dict(v.when).get("status", Status.SUCCESS) if response else 0
    # extras: selectors fixed, every other field drawn within its rules, then the checks
    extras = draw(fields_dict(v.extras, selectors(v)))
    fix_checks(extras, v.checks)
    key = draw(key_strategy(cmd, v))
    datatype = 0
    value: Any = None
    body: dict[str, Any] = {}
    document: Any = NOT_CHECKED
    context = None
    kind = v.value
    if isinstance(kind, tuple):
        value = draw(fields_dict(kind))
        body = value
    elif kind == "none":
        value = None
    elif kind == "any":
        value = draw(st.binary(max_size=24))
    elif kind in ("doc", "doc?"):
        datatype, value, document = draw(doc_value(kind == "doc", v.datatypes))
    elif kind in ("text", "text?"):
        text = draw(nonempty_text if kind == "text" else small_text)
        value = text.encode()
        document = text if text else NOT_CHECKED
    elif kind in ("json", "json?"):
        if cmd.opcode == 0x50:  # DCP_OPEN: only consumer_name, only on consumer connections, datatype JSON
            obj = {"consumer_name": draw(small_text)} if not extras["flags"] & OpenFlag.PRODUCER and draw(st.booleans()) else None
            datatype = 0x01 if obj is not None else 0
        elif cmd.opcode == 0x53:
            obj = draw(st.none() | stream_req_json())
        else:
            obj = draw(json_values if kind == "json" else st.none() | json_values)
        if obj is not None or kind == "json":
            value = obj if isinstance(obj, (dict, list)) else json.dumps(obj).encode()
            document = obj
    elif kind == "sasl":
        if key == b"PLAIN":
            value = b"\0".join(p.encode() for p in draw(st.tuples(plain_part, plain_part, plain_part)))
        else:
            value = draw(st.binary(max_size=24))
    elif kind.startswith("flatbuffers:"):
        value = draw(flatbuffer_values(kind.split(":", 1)[1]))
        body = value
    elif kind == "cache_records":
        value, records = draw(cache_records())
        body = {"records": records}
        # record keys carry a collection id only when collections were negotiated: say so
        context = DissectContext(collections=True)
    else:
        raise AssertionError(f"unknown value kind {kind!r}")
    if v.cas == "zero":
        cas = 0
    elif v.cas == "nonzero":
        cas = draw(st.integers(1, 2**64 - 1))
    else:
        cas = draw(st.integers(0, 2**64 - 1))
    kwargs: dict[str, Any] = {
        "response": response,
        "variant": v.name,
        "status": status,
        "extras": extras,
        "value": value,
        "key": key,
        "vbucket": draw(st.integers(0, 0xFFFF)),
        "opaque": draw(st.integers(0, 2**32 - 1)),
        "cas": cas,
        "datatype": datatype,
    }
    return Case(cmd.opcode, response, v, kwargs, extras=extras, body=body, key=key, document=document, context=context)


@st.composite
def upr_case(draw: st.DrawFn, op: int, v: Variant) -> Case:
    """A UPR-draft frame of variant ``v``."""
    if isinstance(v.value, tuple):
        value: Any = draw(fields_dict(v.value, selectors(v)))
        body = value
    else:
        value = draw(st.binary(max_size=24))
        body = {}
    kwargs = {"dialect": "upr", "value": value, "opaque": draw(st.integers(0, 2**32 - 1))}
    return Case(op, False, v, kwargs, body=body, dialect="upr")


def any_mcbp_case() -> st.SearchStrategy[Case]:
    return st.sampled_from(ALL_VARIANTS).flatmap(lambda t: mcbp_case(*t))


def any_upr_case() -> st.SearchStrategy[Case]:
    return st.sampled_from(UPR_VARIANTS).flatmap(lambda t: upr_case(*t))


# ---------------------------------------------------------------------------
# byte streams for the decoder

frame_info_payloads = st.sampled_from(
    [
        (0, b""),  # barrier
        (1, b"\x01"),  # durability level
        (1, b"\x02\x00\x10"),  # durability level + timeout
        (5, b""),  # preserve ttl
        (4, b"user"),  # impersonate
        (7, b"\x00\x01"),
        (20, b"escaped id"),  # id escape
        (3, bytes(20)),  # length escape
    ]
)


@st.composite
def alt_frame(draw: st.DrawFn) -> bytes:
    """A flexible-framing (alt magic) frame: frame infos and/or a stream id."""
    case = draw(any_mcbp_case())
    infos = draw(st.lists(frame_info_payloads, max_size=3))
    sid = draw(st.none() | st.integers(0, 0xFFFF))
    if not infos and sid is None:
        sid = draw(st.integers(0, 0xFFFF))
    return case.encode(frame_infos=infos, stream_id=sid)


@st.composite
def truncated_frame(draw: st.DrawFn) -> bytes:
    raw = draw(any_mcbp_case()).encode()
    return raw[: draw(st.integers(1, len(raw) - 1))]


@st.composite
def oversize_frame(draw: st.DrawFn) -> bytes:
    """A header declaring a body far above a small ``max_body``, followed by some of it."""
    body_length = draw(st.integers(49, 2**32 - 1))
    raw = encode(draw(st.sampled_from(sorted(spec.COMMANDS))), overrides={"body_length": body_length})
    return raw + draw(st.binary(max_size=40))


@st.composite
def big_valid_frame(draw: st.DrawFn) -> bytes:
    """A valid frame whose body is above a small ``max_body`` (48) but under the default."""
    return encode("DCP_MUTATION", extras={"by_seqno": 1}, key=b"k", value=draw(st.binary(min_size=48, max_size=80)))


def mcbp_pieces() -> st.SearchStrategy[bytes]:
    return st.one_of(
        any_mcbp_case().map(Case.encode),
        alt_frame(),
        st.binary(max_size=40),
        truncated_frame(),
        oversize_frame(),
        big_valid_frame(),
        st.sampled_from(sorted(spec.MAGICS)).map(lambda m: bytes([m])),  # lone magic bytes: resync candidates
    )


@st.composite
def upr_truncated(draw: st.DrawFn) -> bytes:
    raw = draw(any_upr_case()).encode()
    return raw[: draw(st.integers(1, len(raw) - 1))]


def upr_pieces() -> st.SearchStrategy[bytes]:
    return st.one_of(
        any_upr_case().map(Case.encode),
        st.binary(max_size=40),
        upr_truncated(),
        st.integers(1, 7).map(lambda op: struct.pack(">B3sII", op, b"\0\0\0", 0, 2**31)),  # oversize declared length
    )


def mcbp_streams(max_pieces: int = 8) -> st.SearchStrategy[bytes]:
    return st.lists(mcbp_pieces(), max_size=max_pieces).map(b"".join)


def upr_streams(max_pieces: int = 8) -> st.SearchStrategy[bytes]:
    return st.lists(upr_pieces(), max_size=max_pieces).map(b"".join)


@st.composite
def streams(draw: st.DrawFn) -> tuple[str, bytes]:
    """(dialect, bytes)."""
    dialect = draw(st.sampled_from(("mcbp", "upr")))
    return dialect, draw(mcbp_streams() if dialect == "mcbp" else upr_streams())


decoder_options = st.fixed_dictionaries(
    {},
    optional={
        "max_body": st.sampled_from((0, 24, 48, 200, 1 << 20)),
        "garbage_chunk": st.integers(1, 16),
        "aligned": st.booleans(),
    },
)

tristate = st.sampled_from((None, False, True))
contexts = st.builds(
    DissectContext,
    collections=tristate,
    xattr=tristate,
    snappy=tristate,
    json=tristate,
    delete_times=tristate,
    include_xattrs=tristate,
    stream_ids=tristate,
    reveal_secrets=st.booleans(),
)


def iter_contexts() -> Iterator[DissectContext]:
    """Every combination of the context fields the brief names, in (None, False, True)."""
    for c, x, s, sid, dt in itertools.product((None, False, True), repeat=5):
        yield DissectContext(collections=c, xattr=x, snappy=s, stream_ids=sid, delete_times=dt)


# ---------------------------------------------------------------------------
# frame-shaped fuzz: plausible headers over random bodies (random bytes rarely frame)


@st.composite
def fuzz_mcbp_frame(draw: st.DrawFn) -> bytes:
    magic = draw(st.sampled_from(sorted(spec.MAGICS)))
    opcode = draw(st.sampled_from(sorted(spec.COMMANDS)) | st.integers(0, 255))
    body = draw(st.binary(max_size=64))
    n = len(body)
    fl = draw(st.integers(0, n)) if magic in spec.ALT_MAGICS else 0
    el = draw(st.integers(0, min(255, n - fl)))
    kl = draw(st.integers(0, min(255 if magic in spec.ALT_MAGICS else 0xFFFF, n - fl - el)))
    keyfield = (fl << 8 | kl) if magic in spec.ALT_MAGICS else kl
    header = spec.HEADER.pack(
        magic,
        opcode,
        keyfield,
        el,
        draw(st.integers(0, 255)),
        draw(st.integers(0, 0xFFFF)),
        n,
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, 2**64 - 1)),
    )
    return header + body


@st.composite
def mutated_frame(draw: st.DrawFn) -> bytes:
    """A valid frame with some body bytes overwritten (header lengths kept so it still frames)."""
    raw = bytearray(draw(any_mcbp_case() | alt_frame().map(_AsCase)).encode())
    if len(raw) > spec.HEADER_SIZE:
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(spec.HEADER_SIZE, len(raw) - 1))
            raw[i] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        raw[5] = draw(st.integers(0, 255))  # datatype
    return bytes(raw)


class _AsCase:
    """Wrap ready bytes so they look like a Case to ``mutated_frame``."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def encode(self) -> bytes:
        return self.raw


@st.composite
def fuzz_upr_frame(draw: st.DrawFn) -> bytes:
    body = draw(st.binary(max_size=64))
    if body and draw(st.booleans()):
        body = bytes([draw(st.integers(0, 7))]) + body[1:]
    reserved = draw(st.sampled_from((b"\0\0\0", b"\0\1\0")))
    return struct.pack(">B3sII", draw(st.integers(1, 7)), reserved, draw(st.integers(0, 2**32 - 1)), len(body)) + body


def fuzz_streams(dialect: str) -> st.SearchStrategy[bytes]:
    if dialect == "mcbp":
        piece = st.one_of(fuzz_mcbp_frame(), mutated_frame(), any_mcbp_case().map(Case.encode), st.binary(max_size=30))
    else:
        piece = st.one_of(fuzz_upr_frame(), any_upr_case().map(Case.encode), st.binary(max_size=30))
    return st.lists(piece, max_size=5).map(b"".join)


def chunks_of(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` split at the given positions (any order, duplicates allowed: empty chunks are fed too)."""
    points = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


@st.composite
def mutated_case_frame(draw: st.DrawFn, case: Case) -> bytes:
    """A frame of ``case`` (maybe with framing extras) broken in structure-aware ways, still framed.

    Mutations keep ``body_length`` equal to the body, so the decoder still frames it
    and the dissector gets frames it must survive: flipped bytes, other datatype,
    status, magic or CAS, moved section boundaries, a replaced value.
    """
    kwargs: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        kwargs["frame_infos"] = draw(st.lists(frame_info_payloads, max_size=2))
        kwargs["stream_id"] = draw(st.none() | st.integers(0, 0xFFFF))
    raw = bytearray(case.encode(**kwargs))
    hs = spec.HEADER_SIZE
    for op in draw(st.lists(st.sampled_from(("flip", "datatype", "six", "magic", "split", "value", "cas")), min_size=1, max_size=4)):
        body = len(raw) - hs
        if op == "flip" and body:
            for _ in range(draw(st.integers(1, 4))):
                raw[draw(st.integers(hs, len(raw) - 1))] = draw(st.integers(0, 255))
        elif op == "datatype":
            raw[5] = draw(st.integers(0, 255))
        elif op == "six":
            raw[6:8] = draw(st.binary(min_size=2, max_size=2))
        elif op == "cas":
            raw[16:24] = draw(st.binary(min_size=8, max_size=8))
        elif op == "magic":
            raw[0] = draw(st.sampled_from(sorted(spec.MAGICS)))
        elif op == "value":
            fl, el, kl = _sections_of(raw)
            raw = raw[: hs + fl + el + kl] + draw(st.binary(max_size=40))
            struct.pack_into(">I", raw, 8, len(raw) - hs)
        if op in ("split", "magic"):  # new section lengths that fit the body
            body = len(raw) - hs
            if raw[0] in spec.ALT_MAGICS:
                fl = draw(st.integers(0, min(255, body)))
                el = draw(st.integers(0, min(255, body - fl)))
                kl = draw(st.integers(0, min(255, body - fl - el)))
                struct.pack_into(">BBB", raw, 2, fl, kl, el)
            else:
                el = draw(st.integers(0, min(255, body)))
                kl = draw(st.integers(0, min(0xFFFF, body - el)))
                struct.pack_into(">HB", raw, 2, kl, el)
    return bytes(raw)


def _sections_of(raw: bytes | bytearray) -> tuple[int, int, int]:
    if raw[0] in spec.ALT_MAGICS:
        return raw[2], raw[4], raw[3]
    return 0, raw[4], int.from_bytes(raw[2:4], "big")
