"""The packets drawn in the seed documents, as bytes, with their errata.

These are the project's founding test vectors and its first teaching
material.  ``drawn`` is exactly what a seed's grid shows; ``data`` is the
frame as it should be where the drawing is incomplete or self-contradictory
(else the same bytes).  ``errata`` say, for each disagreement between a seed's
drawing and its own breakdown, what the bytes hold - the bytes win - and they
are shown as problems on the example's dissection.
"""

from __future__ import annotations

from dataclasses import dataclass

from .decoder import Event, decode
from .dissect import Dissection, dissect

__all__ = ["EXAMPLES", "SeedExample", "example"]


@dataclass(frozen=True)
class SeedExample:
    """One packet drawn in a seed document."""

    name: str
    seed: str
    title: str
    dialect: str
    drawn: bytes
    data: bytes
    errata: tuple[tuple[str, int, int], ...] = ()

    def events(self) -> list[Event]:
        """Decode the (corrected) bytes."""
        return decode(self.data, dialect=self.dialect)

    def dissect(self) -> Dissection:
        """Dissect the example's frame, with its errata attached as problems."""
        frames = [e for e in self.events() if e.type == "frame"]
        if not frames:
            raise ValueError(f"{self.name} holds no complete frame")
        d = dissect(frames[0])  # type: ignore[arg-type]
        for message, offset, length in self.errata:
            d.add_problem("seed erratum: " + message, offset, length)
        return d


def _h(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


_REQ_000 = "80530000 30000000 00000030 00001000 00000000 00000000 00000000 00000000 00000000 00ffeedd ffffffff ffffffff 00000000 feeddeca 00000000 00ffeedd 00000000 00ffeeff"
_RETRY_000 = "80530000 30000000 00000030 00001000 00000000 00000000 00000000 00000000 00000000 00000000 ffffffff ffffffff 00000000 feeddeca 00000000 00000000"
_UPR_REQ = (
    "01000000 0400002d 00000018 0100000c 00000000 00000000 ffffffff ffffffff 00000000 0003c58a 00000000 00000a78" + b"replication_12".hex()
)
_UPR_46 = ("the breakdown labels request id 0x0000002D as (46); 0x2D is 45", 4, 4)
_UPR_ID = ("the breakdown gives request id 0x0000002D, but bytes 4-7 hold 04 00 00 2D = 0x0400002D (the bytes win)", 4, 4)
_OPEN = "80500018 08000000 00000020 00000001 00000000 00000000 00000000 00000000" + b"bucketstream vb[100-105]".hex()

EXAMPLES: tuple[SeedExample, ...] = (
    SeedExample(
        "stream-req-rollback-request",
        "000",
        "DCP_STREAM_REQ that will be rolled back (start 0xffeedd, uuid 0xfeeddeca)",
        "mcbp",
        _h(_REQ_000),
        _h(_REQ_000),
        (("the breakdown gives snapshot start seqno 0x0000000000000000, but bytes 56-63 hold 0x0000000000ffeedd (the bytes win)", 56, 8),),
    ),
    SeedExample(
        "stream-req-rollback-response",
        "000",
        "DCP_STREAM_REQ response: Rollback to 0",
        "mcbp",
        _h("81530000 00000023 00000008 00001000 00000000 00000000 00000000 00000000"),
        _h("81530000 00000023 00000008 00001000 00000000 00000000 00000000 00000000"),
    ),
    SeedExample(
        "stream-req-retry",
        "000",
        "DCP_STREAM_REQ retry from 0 with the same uuid",
        "mcbp",
        _h(_RETRY_000),
        _h(_RETRY_000 + "00000000 00000000"),
        (("the drawing stops at 64 of the frame's 72 bytes; snapshot end seqno (64-71) is taken from its breakdown (0)", 64, 8),),
    ),
    SeedExample(
        "stream-req-success",
        "000",
        "DCP_STREAM_REQ response: Success with a 4-entry failover log",
        "mcbp",
        _h(
            "81530000 00000000 00000040 00001000 00000000 00000000 00000000 feeddeca 00000000 00005432"
            " 00000000 00decafe 00000000 01343214 00000000 feedface 00000000 00000004 00000000 deadbeef 00000000 00006524"
        ),
        _h(
            "81530000 00000000 00000040 00001000 00000000 00000000 00000000 feeddeca 00000000 00005432"
            " 00000000 00decafe 00000000 01343214 00000000 feedface 00000000 00000004 00000000 deadbeef 00000000 00006524"
        ),
    ),
    SeedExample("open-request", "002", "DCP_OPEN of a consumer named 'bucketstream vb[100-105]'", "mcbp", _h(_OPEN), _h(_OPEN)),
    SeedExample(
        "open-response",
        "002",
        "DCP_OPEN response: Success",
        "mcbp",
        _h("81500000 00000000 00000000 00000001 00000000 00000000"),
        _h("81500000 00000000 00000000 00000001 00000000 00000000"),
    ),
    SeedExample(
        "add-stream-request",
        "004",
        "DCP_ADD_STREAM for vbucket 5 with the takeover flag",
        "mcbp",
        _h("80510000 04000005 00000004 00000001 00000000 00000000 00000001"),
        _h("80510000 04000005 00000004 00000001 00000000 00000000 00000001"),
    ),
    SeedExample(
        "add-stream-response",
        "004",
        "DCP_ADD_STREAM response carrying the stream's opaque 0x1000",
        "mcbp",
        _h("81510000 04000000 00000004 00000001 00000000 00000000 00001000"),
        _h("81510000 04000000 00000004 00000001 00000000 00000000 00001000"),
        (("the breakdown writes the opaque's offsets as (24,27); a 4-byte field is (24-27)", 24, 4),),
    ),
    SeedExample(
        "upr-header",
        "003",
        "UPR header (request id 0x0A, no body)",
        "upr",
        _h("01000000 0000000a 00000000"),
        _h("01000000 0000000a 00000000"),
    ),
    SeedExample(
        "upr-stream-request",
        "003",
        "UPR Stream Request for vbucket 12, group 'replication_12'",
        "upr",
        _h(_UPR_REQ),
        _h(_UPR_REQ.replace("00000018", "00000032", 1)),
        (
            _UPR_ID,
            _UPR_46,
            (
                "the length field holds 0x18 (24, also in the breakdown) but the drawing carries 50 body bytes (group id included): corrected to 0x32",
                8,
                4,
            ),
        ),
    ),
    SeedExample(
        "upr-ok-response",
        "003",
        "UPR Stream OK response",
        "upr",
        _h("02000000 0000002d 00000001 01"),
        _h("02000000 0000002d 00000001 01"),
        (_UPR_46,),
    ),
    SeedExample(
        "upr-not-my-vbucket-response",
        "003",
        "UPR Stream Not My VBucket response",
        "upr",
        _h("02000000 0000002d 00000001 02"),
        _h("02000000 0000002d 00000001 02"),
        (_UPR_46,),
    ),
    SeedExample(
        "upr-rollback-response",
        "003",
        "UPR Stream Rollback response to seqno 0x45A8",
        "upr",
        _h("02000000 0000002d 00000001 03000000 00000045 a8"),
        _h("02000000 0000002d 00000009 03000000 00000045 a8"),
        (_UPR_46, ("the length field holds 1 where the breakdown says 9 and 9 body bytes are drawn: corrected to 9", 8, 4)),
    ),
    SeedExample(
        "upr-failover-log-request",
        "003",
        "UPR Failover Log Request",
        "upr",
        _h("01000000 0400002d 00000001 02"),
        _h("01000000 0400002d 00000001 02"),
        (_UPR_ID, _UPR_46),
    ),
    SeedExample(
        "upr-failover-log-response",
        "003",
        "UPR failover log (OK response with two <VBucket UUID, High Seqno> pairs)",
        "upr",
        _h("02000000 0000002d 00000021 01000000 0000000d f2000000 000000f2 94000000 0000007b 43000000 00000093 21"),
        _h("02000000 0000002d 00000021 01000000 0000000d f2000000 000000f2 94000000 0000007b 43000000 00000093 21"),
        (_UPR_46, ("the seed titles this failover-log response 'UPR Stream Rollback Response Message'; its type byte is 1 (OK)", 12, 1)),
    ),
)

#: the unfinished 'stream message' drawings of seed 003: 16 bytes of a 24-byte
#: memcached-framed header (the UPR draft over the memcached header), cut short; their ('@') label is wrong
#: (0x94 is not '@').  They decode as a truncated frame.
UNFINISHED_UPR_STREAM_MESSAGE = _h("80940005 04000000 00000009 00000000")


def example(name: str) -> SeedExample:
    """The seed example called ``name``."""
    for ex in EXAMPLES:
        if ex.name == name:
            return ex
    raise KeyError(name)
