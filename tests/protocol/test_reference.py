"""The table is consistent, complete for DCP, and REFERENCE.md is generated from it."""

from __future__ import annotations

import subprocess
import sys

from paths import ROOT

from dcpinspect.protocol import spec
from dcpinspect.protocol.enums import Opcode
from dcpinspect.protocol.reference import reference_markdown, reference_rows, reply_of
from dcpinspect.protocol.rules import REPLIES
from dcpinspect.protocol.session import EXPECTS_RESPONSE, STREAM_MESSAGES
from dcpinspect.tables.export import reference_frame


def test_reference_md_is_current() -> None:
    assert (ROOT / "REFERENCE.md").read_text() == reference_markdown(), "run: python -m dcpinspect reference > REFERENCE.md"


def test_every_dcp_opcode_in_the_table() -> None:
    for op in range(0x50, 0x68):
        assert op in spec.COMMANDS, hex(op)
        assert spec.COMMANDS[op].name.startswith("DCP_")
    for name in (
        "HELLO",
        "SASL_LIST_MECHS",
        "SASL_AUTH",
        "SASL_STEP",
        "SELECT_BUCKET",
        "GET_ERROR_MAP",
        "GET_CLUSTER_CONFIG",
        "GET_ALL_VB_SEQNOS",
        "GET_FAILOVER_LOG",
        "STAT",
        "NOOP",
    ):
        assert name in spec.OPCODES
    for name in (
        "GET",
        "GETQ",
        "GETK",
        "GETKQ",
        "SET",
        "ADD",
        "REPLACE",
        "SETQ",
        "ADDQ",
        "REPLACEQ",
        "DELETE",
        "INCREMENT",
        "DECREMENT",
        "APPEND",
        "PREPEND",
        "QUIT",
        "FLUSH",
        "VERSION",
        "TOUCH",
        "GAT",
    ):
        assert name in spec.OPCODES
    assert spec.OPCODES["GET_FAILOVER_LOG"] == 0x96


def test_names_and_codes_unique() -> None:
    assert len(spec.OPCODES) == len(spec.COMMANDS)
    assert len(set(spec.STATUS.values())) == len(spec.STATUS)


def test_variant_layouts_add_up() -> None:
    for cmd in spec.COMMANDS.values():
        for v in cmd.request + cmd.response:
            sizes = [f.size for f in v.extras]
            assert None not in sizes, (cmd.name, v.name)
            assert v.extras_len == sum(sizes)  # type: ignore[arg-type]
            if v.extras:
                assert v.extras_struct is not None and v.extras_struct.size == v.extras_len
            names = [f.name for f in v.extras]
            assert len(names) == len(set(names)), (cmd.name, v.name)
            for attr, _ in v.when:
                assert attr in ("extlen", "status", "vlen") or attr in names, (cmd.name, attr)


def test_extras_sizes_match_facts() -> None:
    want = {
        0x50: 8,
        0x51: 4,
        0x53: 48,
        0x55: 4,
        0x57: 31,
        0x59: 20,
        0x5B: 1,
        0x5D: 4,
        0x5F: 13,
        0x60: 31,
        0x61: 8,
        0x62: 16,
        0x63: 16,
        0x64: 8,
        0x65: 4,
    }
    for op, n in want.items():
        assert {v.extras_len for v in spec.COMMANDS[op].request} == {n}, hex(op)
    assert {v.extras_len for v in spec.COMMANDS[0x56].request} == {20, 1}
    assert {v.extras_len for v in spec.COMMANDS[0x58].request} == {18, 21}


def test_reference_rows_and_frame() -> None:
    rows = reference_rows()
    assert {r["dialect"] for r in rows} == {"mcbp", "upr"}
    names = {r["name"] for r in rows}
    assert all(c.name in names for c in spec.COMMANDS.values())
    df = reference_frame(dialect="mcbp")
    assert len(df) == sum(r["dialect"] == "mcbp" for r in rows)
    sr = df[(df["name"] == "DCP_STREAM_REQ") & (df["role"] == "request") & (df["section"] == "extras")]
    assert list(sr["label"]) == ["flags", "reserved", "start seqno", "end seqno", "vb UUID", "snapshot start seqno", "snapshot end seqno"]
    assert list(sr["offset"]) == ["0", "4", "8", "16", "24", "32", "40"]


def test_core_imports_nothing_heavy() -> None:
    code = (
        "import sys, dcpinspect, dcpinspect.protocol.reference, dcpinspect.wire.examples, dcpinspect.cli.main;"
        "heavy = {'pandas','numpy','scapy','pyspark','matplotlib','ipywidgets','pyarrow','cramjam'} & set(m.split('.')[0] for m in sys.modules);"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_every_dcp_opcode_has_a_reply_fact() -> None:
    dcp = [op for op in Opcode if op.name.startswith("DCP_")]
    assert [int(op) for op in dcp] == list(range(Opcode.DCP_OPEN, Opcode.DCP_CACHE_TRANSFER_END + 1))
    assert set(REPLIES) == set(dcp)
    assert all(isinstance(op, Opcode) and text.strip() for op, text in REPLIES.items())
    # the facts the teaching notebooks lean on
    assert REPLIES[Opcode.DCP_NOOP] == "yes, mandatory"
    assert REPLIES[Opcode.DCP_MUTATION] == "no (errors only)"
    assert REPLIES[Opcode.DCP_BUFFER_ACKNOWLEDGEMENT] == "no"
    assert "Ack flag" in REPLIES[Opcode.DCP_SNAPSHOT_MARKER]
    assert REPLIES[Opcode.DCP_SET_VBUCKET_STATE].startswith("yes")
    # a request the session rules expect an answer to is one the reply fact says is answered
    for op in EXPECTS_RESPONSE:
        if op in REPLIES:
            assert REPLIES[Opcode(op)].startswith("yes"), Opcode(op).name
    for op in STREAM_MESSAGES - {int(Opcode.DCP_SNAPSHOT_MARKER), int(Opcode.DCP_SET_VBUCKET_STATE)}:
        assert REPLIES[Opcode(op)].startswith("no"), Opcode(op).name


def test_the_reply_column_in_the_frame_and_the_markdown() -> None:
    df = reference_frame(dialect="mcbp")
    requests = df[df["role"] == "request"].drop_duplicates("name").set_index("name")["reply"]
    for op, text in REPLIES.items():
        assert requests[op.name] == text
    assert set(df[df["role"] == "response"]["reply"]) == {""}  # a response is never answered
    assert requests["HELLO"] == "" and set(reference_frame(dialect="upr")["reply"]) == {""}
    assert reply_of(0xFFFF) == ""
    md = reference_markdown()
    table = md[md.index("## Does the receiver reply? (DCP)") : md.index("## Commands")]
    assert all(f"| 0x{int(op):02x} | {op.name} | {text} |" in table for op, text in REPLIES.items())
    noop = md[md.index("### 0x5c DCP_NOOP request") :]
    assert noop[: noop.index("###", 3)].count("Reply: yes, mandatory.") == 1
