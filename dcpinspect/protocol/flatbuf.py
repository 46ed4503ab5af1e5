"""A minimal, bounds-checked FlatBuffers table reader (system events v2: kv_engine docs/dcp/documentation/commands/system_event.md).

Only what the ``Collections.VB`` schema needs: a root table of scalars
(u64/u32/bool) and strings.  FlatBuffers is little-endian.  Every offset is
checked; a malformed buffer gives a message, never an exception.
"""

from __future__ import annotations

import struct

__all__ = ["FlatField", "read_table"]

_SCALARS = {"u64": struct.Struct("<Q"), "u32": struct.Struct("<I"), "bool": struct.Struct("<B")}
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")

#: (name, type, offset within the buffer or -1 when absent/default, size, value)
FlatField = tuple[str, str, int, int, object]


def read_table(buf: bytes, schema: tuple[tuple[str, str], ...]) -> tuple[list[FlatField], str | None]:
    """Read the root table of ``buf`` per ``schema``; return its fields and an error (or ``None``)."""
    n = len(buf)
    out: list[FlatField] = []
    if n < 4:
        return out, f"FlatBuffers payload of {n} bytes is too short for a root offset"
    table = _U32.unpack_from(buf, 0)[0]
    if table + 4 > n:
        return out, f"FlatBuffers root table offset {table} outside the {n}-byte payload"
    vtable = table - _I32.unpack_from(buf, table)[0]
    if vtable < 0 or vtable + 4 > n:
        return out, f"FlatBuffers vtable offset {vtable} outside the payload"
    vt_size, _tbl_size = _U16.unpack_from(buf, vtable)[0], _U16.unpack_from(buf, vtable + 2)[0]
    if vt_size < 4 or vtable + vt_size > n or vt_size % 2:
        return out, f"FlatBuffers vtable size {vt_size} invalid"
    slots = (vt_size - 4) // 2
    for i, (name, typ) in enumerate(schema):
        rel = _U16.unpack_from(buf, vtable + 4 + 2 * i)[0] if i < slots else 0
        if rel == 0:
            default: object = "" if typ == "string" else (False if typ == "bool" else 0)
            out.append((name, typ, -1, 0, default))
            continue
        pos = table + rel
        if typ == "string":
            if pos + 4 > n:
                return out, f"FlatBuffers field {name} outside the payload"
            spos = pos + _U32.unpack_from(buf, pos)[0]
            if spos + 4 > n:
                return out, f"FlatBuffers string {name} offset outside the payload"
            slen = _U32.unpack_from(buf, spos)[0]
            if spos + 4 + slen > n:
                return out, f"FlatBuffers string {name} ({slen} bytes) overruns the payload"
            text = buf[spos + 4 : spos + 4 + slen].decode("utf-8", "backslashreplace")
            out.append((name, typ, spos, 4 + slen, text))
            continue
        st = _SCALARS[typ]
        if pos + st.size > n:
            return out, f"FlatBuffers field {name} outside the payload"
        value = st.unpack_from(buf, pos)[0]
        out.append((name, typ, pos, st.size, bool(value) if typ == "bool" else value))
    return out, None


def build_table(values: dict[str, object], schema: tuple[tuple[str, str], ...]) -> bytes:
    """Build a FlatBuffers root table (for tests and the simulator): scalars inline, strings after."""
    present = [(i, name, typ) for i, (name, typ) in enumerate(schema) if name in values]
    # layout: [root u32][vtable][table: soffset i32, fields...][strings]
    slots = max((i for i, _, _ in present), default=-1) + 1
    vt_size = 4 + 2 * slots
    vtable_pos = 4
    table_pos = vtable_pos + vt_size
    table_pos += (-table_pos) % 4
    rel: dict[int, int] = {}
    strings: list[tuple[int, bytes]] = []  # (position in body of the uoffset, data)
    cursor = 4  # after soffset
    for i, name, typ in present:
        if typ == "string":
            cursor += (-cursor) % 4
            rel[i] = cursor
            strings.append((cursor, str(values[name]).encode()))
            cursor += 4
        else:
            size = _SCALARS[typ].size
            cursor += (-cursor) % size
            rel[i] = cursor
            cursor += size
    table = bytearray(cursor)
    struct.pack_into("<i", table, 0, table_pos - vtable_pos)
    for i, name, typ in present:
        if typ != "string":
            v = values[name]
            _SCALARS[typ].pack_into(table, rel[i], int(bool(v)) if typ == "bool" else int(v))  # type: ignore[call-overload]
    out = bytearray(table_pos)
    struct.pack_into("<I", out, 0, table_pos)
    struct.pack_into("<HH", out, vtable_pos, vt_size, cursor)
    for i in range(slots):
        struct.pack_into("<H", out, vtable_pos + 4 + 2 * i, rel.get(i, 0))
    out += table
    for pos_in_table, data in strings:
        out += bytes((-len(out)) % 4)
        spos = len(out)
        absolute = table_pos + pos_in_table
        struct.pack_into("<I", out, absolute, spos - absolute)
        out += struct.pack("<I", len(data)) + data + b"\0"
    return bytes(out)
