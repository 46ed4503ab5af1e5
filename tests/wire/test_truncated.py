"""A frame the capture cut short, with its header captured: dissected as far as its bytes go, the missing part marked."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from dcpinspect.protocol.spec import HEADER_SIZE
from dcpinspect.wire.decoder import decode
from dcpinspect.wire.dissect import dissect, dissect_truncated, not_captured
from dcpinspect.wire.encode import encode
from dcpinspect.wire.events import Frame, Truncated
from dcpinspect.wire.render import annotate, breakdown, byte_table

VALUE = json.dumps({"name": "ada", "n": 1234}).encode()
MUTATION = encode("DCP_MUTATION", key=b"user::1", value=VALUE, extras={"by_seqno": 5, "rev_seqno": 1}, vbucket=3, opaque=0x1000, datatype=1)
EXTRAS_END = HEADER_SIZE + 31
KEY_END = EXTRAS_END + len(b"user::1")


def cut(n: int) -> Truncated:
    """The decoder's event for the mutation's first ``n`` bytes (the stream ended there)."""
    (ev,) = decode(MUTATION[:n])
    assert isinstance(ev, Truncated)
    return ev


def test_golden_truncated_mutation(golden: Callable[[str, str], None]) -> None:
    """The grid of the captured bytes, every field captured whole, the value as far as it goes, then the missing bytes."""
    d = dissect_truncated(cut(len(MUTATION) - 5))
    assert d is not None
    golden("truncated-mutation", byte_table(d, max_rows=None) + "\n\n" + breakdown(d))


@pytest.mark.parametrize("n", [HEADER_SIZE, HEADER_SIZE + 6, EXTRAS_END, EXTRAS_END + 3, KEY_END, KEY_END + 10, len(MUTATION) - 1])
def test_every_cut_is_dissected_as_far_as_it_goes(n: int) -> None:
    d = dissect_truncated(cut(n))
    assert d is not None and d.name == "DCP_MUTATION" and d.frame.raw == MUTATION[:n]  # never zero-filled
    assert d.missing == len(MUTATION) - n
    *others, last = d.problems
    assert last.message == not_captured(len(MUTATION) - n, len(MUTATION)) and last.offset == n
    assert not others  # nothing the missing bytes alone caused (a short extras section, JSON cut halfway)
    whole = dissect(Frame(0, MUTATION))
    if n >= EXTRAS_END:
        assert d.extras == whole.extras  # the extras were captured whole: read as usual
    if n >= KEY_END:
        assert d.key == b"user::1"
    assert any(f.path.startswith("header.") for f in d.fields)


def test_the_missing_part_reads_naturally() -> None:
    assert not_captured(1234, 1318) == "… 1,234 bytes not captured (the frame is 1,318 bytes)"
    assert not_captured(1, 25) == "… 1 byte not captured (the frame is 25 bytes)"
    assert "5 bytes not captured" in annotate(dissect_truncated(cut(len(MUTATION) - 5)))  # type: ignore[arg-type]


def test_no_header_no_dissection() -> None:
    """Fewer than 24 bytes, or no known magic: nothing to dissect (shown as bytes, as before)."""
    assert dissect_truncated(Truncated(0, MUTATION[: HEADER_SIZE - 1], "end of stream")) is None
    assert dissect_truncated(Truncated(0, b"\x00" * 40, "end of stream")) is None


def test_a_real_problem_of_a_whole_section_is_kept() -> None:
    """A problem of the header, found with the extras captured whole, stays (only the missing bytes' own are dropped)."""
    bad = bytearray(MUTATION)
    bad[5] |= 0x80  # an unknown datatype bit
    (ev,) = decode(bytes(bad[: len(bad) - 3]))
    d = dissect_truncated(ev)  # type: ignore[arg-type]
    assert d is not None and any("unknown datatype bits" in p.message for p in d.problems)


def test_annotate_and_decode_dissect_a_truncated_event() -> None:
    from dcpinspect.cli.main import main
    from dcpinspect.wire.render import annotate_html

    ev = cut(len(MUTATION) - 5)
    text = annotate(ev)
    assert text.startswith("truncated:") and "Key          (55-61): user::1" in text and "5 bytes not captured" in text
    assert "user::1" in annotate_html(ev) and "not captured" in annotate_html(ev)
    # cut inside the extras: only the fields that start in the captured bytes are listed
    short = annotate(cut(HEADER_SIZE + 8))
    listed = [line.split("(")[0].strip() for line in short.splitlines() if "): " in line or line.endswith("):")]
    assert "by seqno" in listed and "rev seqno" not in listed and "Key" not in listed
    import io

    out = io.StringIO()
    assert main(["decode", MUTATION[: HEADER_SIZE + 8].hex()], out=out) == 0
    assert "by seqno" in out.getvalue() and "bytes not captured" in out.getvalue()
