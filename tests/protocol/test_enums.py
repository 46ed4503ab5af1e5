"""The generated enums match the table, and the file is current."""

import os

from paths import ROOT

from dcpinspect.protocol import enums, spec
from dcpinspect.protocol.reference import enums_source

ENUMS = ROOT / "dcpinspect" / "protocol" / "enums.py"


def test_enums_file_is_current() -> None:
    text = enums_source()
    if os.environ.get("DCPINSPECT_UPDATE_GOLDENS"):
        ENUMS.write_text(text)
    assert ENUMS.read_text() == text, "run: python -m dcpinspect.protocol.reference --enums > dcpinspect/protocol/enums.py"


def test_every_table_number_has_a_member() -> None:
    assert {int(m) for m in enums.Opcode} == set(spec.COMMANDS)
    assert {m.name for m in enums.Opcode} == set(spec.OPCODES)
    assert {int(m) for m in enums.Status} == set(spec.STATUS)
    assert {int(m) for m in enums.Feature} == set(spec.FEATURES)
    assert {int(m) for m in enums.Magic} == set(spec.MAGICS)
    assert {int(m) for m in enums.StreamEndStatus} == set(spec.STREAM_END_STATUS)
    assert {int(m) for m in enums.OpenFlag} == set(spec.DCP_OPEN_FLAGS)
    assert {int(m) for m in enums.StreamReqFlag} == set(spec.STREAM_REQ_FLAGS)
    assert {int(m) for m in enums.SnapshotFlag} == set(spec.SNAPSHOT_FLAGS)


def test_members_are_plain_ints_on_the_hot_path() -> None:
    assert enums.Opcode.DCP_MUTATION == 0x57 and hash(enums.Opcode.DCP_MUTATION) == hash(0x57)
    assert {0x57: "x"}[enums.Opcode.DCP_MUTATION] == "x"
    assert enums.Status.ROLLBACK == 0x23
    assert enums.StreamReqFlag.STRICT_VB_UUID | enums.StreamReqFlag.IGNORE_PURGED_TOMBSTONES == 0xA0
