"""Value readers: the bytes of a frame's value (and of table fields) -> values, items and problems.

:func:`read_fields` interprets a run of table fields; every other value kind of
the table (``Variant.value``) has a reader in :data:`VALUE_READERS`, found
once per frame by the dissector.  A document (``doc``) is read in up to three
steps, as its datatype says: snappy inflation, the xattrs, the document.
Readers never raise: what is wrong becomes a :class:`~.dissection.Problem`
with its byte range.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from ..protocol import spec
from ..protocol.enums import Datatype, Opcode, OpenFlag
from ..protocol.fields import BYTES, ENUM, FLAGS, INT, TEXT, Command, Field, Group, Variant
from ..protocol.flatbuf import read_table
from .dissection import Dissection, Leaf, Problem, leaf, text
from .framing import decode_leb128

__all__ = [
    "MAX_INFLATED",
    "PACKED_DATATYPES",
    "VALUE_READERS",
    "ValueReader",
    "field_problems",
    "inflate_snappy",
    "is_text",
    "read_fields",
    "read_plain_doc",
]

#: refuse to inflate snappy values claiming more than this
MAX_INFLATED = 64 * 1024 * 1024
_JSON = int(Datatype.JSON)
_SNAPPY = int(Datatype.SNAPPY)
_XATTR = int(Datatype.XATTR)
#: datatype bits that make a document more than its bytes (compressed, or xattrs first)
PACKED_DATATYPES = _SNAPPY | _XATTR
_DCP_OPEN = int(Opcode.DCP_OPEN)
_DCP_STREAM_REQ = int(Opcode.DCP_STREAM_REQ)

_tnew = tuple.__new__
#: ``reader(dissection, variant, raw, start, end, datatype, command)`` reads ``raw[start:end]`` (never empty)
ValueReader = Callable[[Dissection, Variant, bytes, int, int, int, "Command | None"], None]


# ---------------------------------------------------------------------------
# table fields


def _field_value(f: Field, raw: bytes) -> Any:
    k = f.kind
    if k == TEXT:
        return text(raw)
    if k == BYTES:
        return raw
    return int.from_bytes(raw, "big", signed=k == INT)


def field_problems(f: Field, value: Any, offset: int, d: Dissection) -> None:
    """The problems of one table field's value: invalid values or bits, unknown ones (strict fields)."""
    if not isinstance(value, int):
        return
    if f.invalid:
        if f.kind == FLAGS:
            for bit, why in f.invalid.items():
                if value & bit:
                    d.problems.append(Problem(why, offset, f.size or 0))
        elif value in f.invalid:
            d.problems.append(Problem(f.invalid[value], offset, f.size or 0))
    if not f.strict or f.names is None:
        return
    if f.kind == FLAGS:
        known = 0
        for bit in f.names:
            known |= bit
        if value & ~known:
            d.problems.append(Problem(f"unknown {f.label} bits 0x{value & ~known:0{2 * (f.size or 1)}x}", offset, f.size or 0))
    elif f.kind == ENUM and value not in f.names and not (f.invalid and value in f.invalid):
        d.problems.append(Problem(f"unknown {f.label} 0x{value:0{2 * (f.size or 1)}x}", offset, f.size or 0))


def read_fields(
    d: Dissection,
    fields: tuple[Field | Group, ...],
    raw: bytes,
    start: int,
    end: int,
    prefix: str,
    depth: int,
    out: dict[str, Any],
    *,
    quiet: bool = False,
) -> None:
    """Interpret a run of table fields over ``raw[start:end]`` into items and ``out``.

    ``quiet``: the section's length is already reported wrong; do not add
    "ends inside"/"trailing bytes" problems of its own.
    """
    pos = start
    items = d.items
    for f in fields:
        if isinstance(f, Group):
            gsize = f.size
            entries: list[dict[str, Any]] = []
            i = 0
            while gsize and pos + gsize <= end:
                vals: dict[str, Any] = {}
                read_fields(d, f.fields, raw, pos, pos + gsize, f"{prefix}{f.name}[{i}].", depth, vals)
                entries.append(vals)
                pos += gsize
                i += 1
            out[f.name] = entries
            continue
        size = end - pos if f.size is None else f.size
        if pos + size > end:
            have = end - pos
            if not quiet:
                d.problems.append(Problem(f"section ends inside {f.label} ({have} of {size} bytes)", pos, have))
            items.append(leaf(prefix + f.name, f.label, pos, have, raw[pos:end], depth, "truncated", BYTES))
            pos = end
            break
        b = raw[pos : pos + size]
        value = _field_value(f, b)
        out[f.name] = value
        items.append(leaf(prefix + f.name, f.label, pos, size, value, depth, None, f.kind, False, f))
        field_problems(f, value, pos, d)
        pos += size
    if pos < end:
        if not quiet:
            d.problems.append(Problem(f"{end - pos} unexpected trailing bytes", pos, end - pos))
        items.append(leaf(prefix + "trailing", "trailing bytes", pos, end - pos, raw[pos:end], depth, None, BYTES))


# ---------------------------------------------------------------------------
# doc: [snappy] -> [xattrs] -> document


def _doc_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """A document, read in the steps its datatype asks for."""
    if not datatype & PACKED_DATATYPES:
        read_plain_doc(d, raw, start, end, datatype)
        return
    body = raw[start:end]
    base = start  # frame offset of body[0]; -1 once inflated (then every span is the whole value)
    if datatype & _SNAPPY:
        inflated = _inflate(d, body, start)
        if inflated is None:
            return
        body, base = inflated, -1
    if datatype & _XATTR:
        rest = _xattrs(d, body, base, start, end - start)
        if rest is None:
            return
        body = rest
        if base >= 0:
            base = end - len(body)
    _document(d, body, base, start, end - start, datatype)


def read_plain_doc(d: Dissection, raw: bytes, start: int, end: int, datatype: int) -> None:
    """The common case: a plain (or JSON) document, no xattrs, not compressed (the dissector calls it directly)."""
    value = raw[start:end]
    n = end - start
    try:
        decoded: str | None = value.decode("utf-8")
    except UnicodeDecodeError:
        decoded = None
    if datatype & _JSON:
        try:
            d.document = json.loads(value)
        except (ValueError, RecursionError) as exc:
            d.problems.append(Problem(f"datatype says JSON but the document is not valid JSON: {str(exc)[:80]}", start, n))
            d.document = text(value)
        d.items.append(
            _tnew(Leaf, ("value", "Value", start, n, decoded if decoded is not None else text(value), 0, None, TEXT, False, None))
        )
        return
    if decoded is not None and (decoded.isprintable() or _printable_ws(decoded)):
        d.document = decoded
        d.items.append(_tnew(Leaf, ("value", "Value", start, n, decoded, 0, None, TEXT, False, None)))
    else:
        d.document = value
        d.items.append(_tnew(Leaf, ("value", "Value", start, n, value, 0, None, BYTES, False, None)))


def _inflate(d: Dissection, value: bytes, start: int) -> bytes | None:
    """A snappy-compressed value inflated (``None``, with a problem, if it cannot be)."""
    n = len(value)
    d.items.append(leaf("value", "Value (snappy)", start, n, value, 0, None, BYTES))
    inflated, problem = inflate_snappy(value)
    if problem is not None or inflated is None:
        d.problems.append(Problem(problem or "snappy value not inflated", start, n))
        return None
    d.items.append(leaf("value.inflated_length", "inflated length", start, n, len(inflated), 1, None, "uint"))
    return inflated


def _xattrs(d: Dissection, body: bytes, base: int, start: int, n: int) -> bytes | None:
    """Read the xattr section at the start of ``body``; the document after it (``None`` if the section is unreadable).

    ``base`` is the frame offset of ``body[0]``, or -1 when ``body`` was
    inflated: then every span is the whole value (``start``, ``n``).
    """

    def where(a: int, b: int) -> tuple[int, int]:
        return (base + a, b) if base >= 0 else (start, n)

    if len(body) < 4:
        d.problems.append(Problem("xattr datatype but value shorter than the 4-byte xattr length", start, n))
        return None
    xlen = int.from_bytes(body[:4], "big")
    d.items.append(leaf("value.xattr_length", "xattr length", *where(0, 4), xlen, 1, None, "uint"))
    if xlen + 4 > len(body):
        d.problems.append(Problem(f"xattr length {xlen} overruns the value ({len(body) - 4} bytes)", *where(0, 4)))
        return None
    pos = 4
    i = 0
    while pos < 4 + xlen:
        if pos + 4 > 4 + xlen:
            d.problems.append(Problem("xattr section ends inside a pair length", *where(pos, 4 + xlen - pos)))
            break
        plen = int.from_bytes(body[pos : pos + 4], "big")
        pair = body[pos + 4 : pos + 4 + plen]
        if pos + 4 + plen > 4 + xlen or pair.count(b"\0") != 2 or not pair.endswith(b"\0"):
            d.problems.append(Problem(f"malformed xattr pair {i}", *where(pos, min(4 + plen, 4 + xlen - pos))))
            break
        k, v, _ = pair.split(b"\0")
        d.items.append(leaf(f"value.xattrs[{i}]", "xattr", *where(pos, 4 + plen), f"{text(k)}={text(v)}", 1))
        pos += 4 + plen
        i += 1
    return body[4 + xlen :]


def _document(d: Dissection, body: bytes, base: int, start: int, n: int, datatype: int) -> None:
    """The document itself, after any inflation and xattrs (``base`` as for :func:`_xattrs`)."""
    doc: Any = body
    textual = is_text(body)
    if datatype & _JSON:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as exc:
            d.problems.append(
                Problem(
                    f"datatype says JSON but the document is not valid JSON: {str(exc)[:80]}",
                    *((base, len(body)) if base >= 0 else (start, n)),
                )
            )
            doc = text(body)
    elif textual:
        doc = text(body)
    d.document = doc
    shown: Any = text(body) if textual or datatype & _JSON else body
    kind = TEXT if textual or datatype & _JSON else BYTES
    if base < 0:
        d.items.append(leaf("value.document", "document (inflated)", start, n, shown, 1, None, TEXT if textual else BYTES))
    elif body:  # an xattr section without a document shows no document
        d.items.append(leaf("value.document", "document", base, len(body), shown, 1, None, kind))


def _printable_ws(s: str) -> bool:
    return all(c.isprintable() or c in "\r\n\t" for c in s)


def is_text(b: bytes) -> bool:
    """Whether bytes are UTF-8 text a terminal can show (printable, or tabs and newlines)."""
    if not b:
        return True
    try:
        s = b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return s.isprintable() or _printable_ws(s)


def inflate_snappy(data: bytes) -> tuple[bytes | None, str | None]:
    """A snappy (raw block) value inflated, or ``None`` and why not (the length prefix is checked before inflating)."""
    length, _used, _ = decode_leb128(data, 0)
    if length is None:
        return None, "snappy value has no valid length prefix"
    if length > MAX_INFLATED:
        return None, f"snappy value claims {length} inflated bytes (above {MAX_INFLATED})"
    if length > 22 * len(data) + 64:  # a snappy copy op expands at most ~21x: refuse before allocating
        return None, f"snappy value claims {length} inflated bytes from only {len(data)} (impossible)"
    try:
        import cramjam
    except ImportError:  # pragma: no cover - cramjam is a dependency
        return None, "snappy value not inflated: cramjam is not installed"
    try:
        out = bytes(cramjam.snappy.decompress_raw(data))
    except Exception as exc:
        return None, f"bad snappy value: {str(exc)[:80]}"
    if len(out) != length:
        return None, f"snappy value inflated to {len(out)} bytes, header said {length}"
    return out, None


# ---------------------------------------------------------------------------
# json


def _json_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """A JSON value; its keys are checked against the table's ``json_keys`` and the command's own rules."""
    value = raw[start:end]
    n = end - start
    shown = text(value)
    d.items.append(leaf("value", variant.value_label, start, n, shown))
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError) as exc:
        d.problems.append(Problem(f"value is not valid JSON: {str(exc)[:80]}", start, n))
        d.document = shown
        return
    d.document = obj
    if cmd is None or variant.json_keys is None:
        return
    rules = _JSON_RULES.get(cmd.opcode, _NO_JSON_RULES)
    if rules.needs_json_datatype and not datatype & _JSON:
        d.problems.append(Problem(f"{cmd.name} value must have datatype JSON", 5, 1))
    if not isinstance(obj, dict):
        d.problems.append(Problem(f"{cmd.name} value must be a JSON object", start, n))
        return
    for k, v in obj.items():
        a, ln = _json_member_span(shown, k, start, n)
        meaning = variant.json_keys.get(k)
        if meaning is None:
            meaning = rules.unknown_key_meaning
            if rules.unknown_key_problem:
                d.problems.append(Problem(rules.unknown_key_problem.format(key=k), a, ln))
        member = v if isinstance(v, (int, str)) and not isinstance(v, bool) else json.dumps(v)
        d.items.append(leaf(f"value.{k}", k, a, ln, member, 1, meaning))
    if rules.check is not None:
        rules.check(d, obj, start, n, shown)


def _json_member_span(source: str, key: str, start: int, n: int) -> tuple[int, int]:
    """Where the member ``key`` is in a JSON text (the whole value when it cannot be told)."""
    token = json.dumps(key)
    i = source.find(token)
    if i < 0 or not source.isascii():
        return start, n
    j = source.find(":", i + len(token))
    if j < 0:
        return start + i, len(token)
    k = j + 1
    while k < len(source) and source[k] in " \t\r\n":
        k += 1
    try:
        _, e = json.JSONDecoder().raw_decode(source, k)
    except ValueError:
        return start + i, len(token)
    return start + i, e - i


def _stream_req_json(d: Dissection, obj: dict[str, Any], start: int, n: int, shown: str) -> None:
    def span(k: str) -> tuple[int, int]:
        return _json_member_span(shown, k, start, n)

    if d.context.collections is False:
        d.problems.append(Problem("stream-request value is only accepted when collections were negotiated", start, n))
    if "uid" in obj and not isinstance(obj["uid"], str):
        d.problems.append(Problem("uid must be a JSON string", *span("uid")))
    if "sid" in obj:
        sid = obj["sid"]
        if not isinstance(sid, int) or isinstance(sid, bool):
            d.problems.append(Problem("sid must be a JSON integer", *span("sid")))
        elif not 1 <= sid <= 0xFFFF:
            d.problems.append(Problem(f"sid {sid} out of range 1..65535", *span("sid")))
        if d.context.stream_ids is False:
            d.problems.append(Problem("sid given but enable_stream_id was not negotiated (DcpStreamIdInvalid)", *span("sid")))
    elif d.context.stream_ids:
        d.problems.append(Problem("sid required: stream-ids are enabled (DcpStreamIdInvalid)", start, n))
    if "collections" in obj:
        c = obj["collections"]
        if not isinstance(c, list) or not all(isinstance(x, str) and _is_hex(x) for x in c):
            d.problems.append(Problem("collections must be an array of hex strings", *span("collections")))
    if "scope" in obj and not (isinstance(obj["scope"], str) and _is_hex(obj["scope"])):
        d.problems.append(Problem("scope must be a hex string", *span("scope")))
    if "collections" in obj and "scope" in obj:
        d.problems.append(Problem("collections and scope together are invalid (Einval)", start, n))
    if "purge_seqno" in obj and not (isinstance(obj["purge_seqno"], str) and obj["purge_seqno"].isdigit()):
        d.problems.append(Problem("purge_seqno must be a decimal string", *span("purge_seqno")))


def _is_hex(s: str) -> bool:
    return bool(s) and all(c in "0123456789abcdefABCDEF" for c in s)


def _open_json(d: Dissection, obj: dict[str, Any], start: int, n: int, shown: str) -> None:
    if "consumer_name" in obj and d.extras.get("flags", 0) & OpenFlag.PRODUCER:
        d.problems.append(Problem("consumer_name is only valid on consumer connections", start, n))


class _JsonRules(NamedTuple):
    """What a command's JSON value must obey beyond the table's ``json_keys``."""

    needs_json_datatype: bool = False
    #: meaning shown for a key the table does not list
    unknown_key_meaning: str | None = None
    #: problem reported for a key the table does not list (``{key}`` is replaced)
    unknown_key_problem: str = ""
    #: ``check(dissection, object, start, length, text)``: the rules on the members' values
    check: Callable[[Dissection, dict[str, Any], int, int, str], None] | None = None


_NO_JSON_RULES = _JsonRules()
_JSON_RULES: dict[int, _JsonRules] = {
    Opcode.DCP_OPEN: _JsonRules(True, None, "unknown DCP_OPEN value key {key!r} (only consumer_name is allowed)", _open_json),
    Opcode.DCP_STREAM_REQ: _JsonRules(False, "unknown key (ignored by the server)", "", _stream_req_json),
}


# ---------------------------------------------------------------------------
# error, sasl


def _error_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """An error response's context: JSON or text."""
    value = raw[start:end]
    shown = text(value)
    try:
        d.document = json.loads(value)
    except (ValueError, RecursionError):
        d.document = shown
    textual = is_text(value)
    d.items.append(leaf("value", "Error", start, end - start, shown if textual else value, 0, None, TEXT if textual else BYTES))


#: SCRAM mechanisms whose messages are parsed (attributes shown, proofs masked); any other mechanism is masked whole
_SCRAM_MECHANISMS = frozenset(("SCRAM-SHA1", "SCRAM-SHA256", "SCRAM-SHA512"))

#: SCRAM attributes that hold no secret (RFC 5802 §5.1): user, nonce, salt, iterations, channel binding, authzid
_SCRAM_SAFE = frozenset("nrsica")

_SCRAM_LABELS = {"n": "user", "r": "nonce", "s": "salt", "i": "iterations", "c": "channel binding", "p": "proof", "v": "verifier"}


def _scram_attrs(value: bytes) -> list[bytes] | None:
    """A SCRAM message's comma-separated parts when it is well-formed (printable ASCII, ``x=...`` attributes), else ``None``.

    A client-first message starts with its GS2 header (``n,,`` / ``y,,`` /
    ``p=...,`` then an optional ``a=authzid``): those two parts are kept as they are.
    """
    if not value or any(b < 0x21 or b > 0x7E for b in value):
        return None
    parts = value.split(b",")
    body = parts
    if parts[0] in (b"n", b"y") or parts[0].startswith(b"p="):
        if len(parts) < 3 or not (parts[1] == b"" or parts[1].startswith(b"a=")):
            return None
        # p=cb-name[,a=authzid] are attributes too (checked below)
        body = parts[2:] if parts[0] in (b"n", b"y") else parts[1:] if parts[1] else parts[2:]
    for attr in body:
        if len(attr) < 2 or attr[1:2] != b"=" or not attr[:1].isalpha():
            return None
    return parts


def _sasl_masked(d: Dissection, start: int, n: int) -> None:
    """The whole SASL payload as one masked field (it is not positively known to be safe)."""
    d.items.append(leaf("value", "Value", start, n, "*" * n, 0, "masked", TEXT, True))
    d.add_secret(start, n)


def _sasl_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    r"""SASL data: every request payload is masked unless positively known to be safe.

    Shown: a PLAIN request's authzid and user (its password masked) and
    well-formed SCRAM messages (proofs and verifiers masked).  Masked whole:
    any other mechanism (CRAM-MD5, ``PLAIN `` or ``PLAIN\0``, an unknown one),
    a PLAIN payload that is not ``authzid\0user\0password``, a SCRAM message
    that is not well-formed (one non-printable byte is enough).  Responses
    (server challenges, errors) are shown, their ``v=`` verifier masked.
    ``reveal_secrets`` shows everything.
    """
    value = raw[start:end]
    n = end - start
    items = d.items
    reveal = d.context.reveal_secrets
    request = d.role == "request"
    mech = d.key_text.upper() if request else ""
    if request and mech == "PLAIN":
        parts = value.split(b"\0")
        if len(parts) != 3:
            d.problems.append(Problem("PLAIN auth data is not authzid\\0user\\0password", start, n))
            if reveal:
                items.append(leaf("value", "Value", start, n, text(value)))
            else:
                _sasl_masked(d, start, n)
            return
        pos = start
        for name, part in zip(("authzid", "user", "password"), parts, strict=True):
            secret = name == "password" and not reveal
            if part or name != "authzid":
                shown = "********" if secret else text(part)
                items.append(leaf(f"value.{name}", name, pos, len(part), shown, 1, "masked" if secret else None, TEXT, secret))
            if secret and part:
                d.add_secret(pos, len(part))
            pos += len(part) + 1
        return
    attrs = _scram_attrs(value)
    if attrs is None or (request and mech not in _SCRAM_MECHANISMS and not reveal):
        if not reveal and (request or b"v=" in value or b"p=" in value):
            _sasl_masked(d, start, n)
            return
        textual = is_text(value)
        items.append(leaf("value", "Value", start, n, text(value) if textual else value, 0, None, TEXT if textual else BYTES))
        return
    gs2 = 2 if attrs[0] in (b"n", b"y") or attrs[0].startswith(b"p=") else 0
    pos = start
    for i, attr in enumerate(attrs):
        name = text(attr[:1])
        secret = i >= gs2 and name not in _SCRAM_SAFE and not (name == "e" and not request) and not reveal  # e=: a server's error
        shown = f"{name}=********" if secret else text(attr)
        label = _SCRAM_LABELS.get(name, "attribute") if i >= gs2 else "GS2 header"
        items.append(leaf(f"value.{name}", label, pos, len(attr), shown, 1, "masked" if secret else None, TEXT, secret))
        if secret:
            d.add_secret(pos + 2, len(attr) - 2)
        pos += len(attr) + 1


# ---------------------------------------------------------------------------
# flatbuffers, cache transfer


def _flatbuffers_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """A FlatBuffers table (system events v2): its fields by name, defaults marked."""
    table = variant.value_argument
    value = raw[start:end]
    d.items.append(leaf("value", "Value (FlatBuffers)", start, end - start, value, 0, table, BYTES))
    fields, problem = read_table(value, spec.FLATBUFFER_TABLES[table])
    if problem:
        d.problems.append(Problem(problem, start, end - start))
    for name, typ, off, size, v in fields:
        d.body[name] = v
        if off >= 0:
            d.items.append(leaf(f"value.{name}", name, start + off, size, v, 1, None, TEXT if typ == "string" else "uint"))
        else:
            d.items.append(leaf(f"value.{name}", name, start, 0, v, 1, "absent (default)", TEXT if typ == "string" else "uint"))


def _cache_records(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """DCP_CACHE_TRANSFER records: a fixed header, then the key (collection id first when negotiated) and the value."""
    pos = start
    records: list[dict[str, Any]] = []
    hdr = spec.CACHE_RECORD_HEADER
    hsize = sum(f.size or 0 for f in hdr)
    i = 0
    while pos < end:
        if pos + hsize > end:
            d.problems.append(Problem(f"cache transfer record {i} header truncated ({end - pos} of {hsize} bytes)", pos, end - pos))
            d.items.append(leaf(f"value.records[{i}]", "truncated record", pos, end - pos, raw[pos:end], 1, None, BYTES))
            break
        vals: dict[str, Any] = {}
        read_fields(d, hdr, raw, pos, pos + hsize, f"value.records[{i}].", 1, vals)
        k0 = pos + hsize
        k1 = k0 + vals["key_len"]
        v1 = k1 + vals["value_len"]
        if v1 > end:
            d.problems.append(Problem(f"cache transfer record {i} key/value overrun the value", pos, end - pos))
            break
        key = raw[k0:k1]
        if d.context.collections is not False and key:
            cid, clen, problem = decode_leb128(raw, k0, k1)
            if problem:
                d.problems.append(Problem(problem, k0, clen))
            if cid is not None:
                vals["cid"] = cid
                d.items.append(leaf(f"value.records[{i}].cid", "collection id", k0, clen, cid, 1, None, "leb128"))
                key = raw[k0 + clen : k1]
                k0 += clen
        vals["key"] = text(key)
        d.items.append(leaf(f"value.records[{i}].key", "key", k0, k1 - k0, vals["key"], 1))
        if v1 > k1:
            v = raw[k1:v1]
            textual = is_text(v)
            d.items.append(
                leaf(f"value.records[{i}].value", "value", k1, v1 - k1, text(v) if textual else v, 1, None, TEXT if textual else BYTES)
            )
        records.append(vals)
        pos = v1
        i += 1
    d.body["records"] = records


# ---------------------------------------------------------------------------
# the simple kinds, and the table of readers


def _no_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """A value where the table allows none."""
    d.problems.append(Problem(f"{d.title} must not have a value", start, end - start))
    d.items.append(leaf("value", variant.value_label, start, end - start, raw[start:end], 0, None, BYTES))


def _any_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """Bytes the table says nothing about."""
    d.items.append(leaf("value", variant.value_label, start, end - start, raw[start:end], 0, None, BYTES))


def _text_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """Text (a version string, statistics)."""
    d.document = text(raw[start:end])
    d.items.append(leaf("value", variant.value_label, start, end - start, d.document))


def _fields_value(d: Dissection, variant: Variant, raw: bytes, start: int, end: int, datatype: int, cmd: Command | None) -> None:
    """A structured value: the variant's table fields."""
    fields = variant.value
    if isinstance(fields, tuple):  # always, for this kind
        read_fields(d, fields, raw, start, end, "value.", 1, d.body)


#: value kind (``Variant.value_kind``) -> its reader
VALUE_READERS: dict[str, ValueReader] = {
    "none": _no_value,
    "any": _any_value,
    "fields": _fields_value,
    "doc": _doc_value,
    "json": _json_value,
    "text": _text_value,
    "error": _error_value,
    "sasl": _sasl_value,
    "flatbuffers": _flatbuffers_value,
    "cache_records": _cache_records,
}
