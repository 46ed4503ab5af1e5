"""The protocol: the declarative table and the behaviour beside it (stdlib only; the bottom layer).

Theory of operation: every fact about the memcached binary protocol and DCP
is written here once, as data or as a pure function of integers, and every
other layer reads it from here.  :mod:`.spec` (and :mod:`.upr` for the UPR
draft) is the table of commands, variants and fields, in the vocabulary of
:mod:`.fields`; it drives decoding, encoding, labels and :mod:`.reference`
(REFERENCE.md).  :mod:`.enums` is generated from the table.  :mod:`.session`
holds what messages *do* (stream messages, context effects, DCP_CONTROL
keys, stream-end reasons); :mod:`.rules` holds the rollback decision and the
flow-control sizes.  :mod:`.flatbuf` reads and writes the FlatBuffers that
some values carry.

Rules:

1. ``protocol/`` imports nothing else from the package: it is data plus pure
   functions of ints, bytes and strings.
2. No module outside ``protocol/`` writes an opcode, magic, status or flag as a
   number: it names an :mod:`.enums` member or a set from :mod:`.session`.
3. :mod:`.enums` is generated (``python -m dcpinspect.protocol.reference --enums``);
   a test fails when it and the table disagree.
4. A behaviour used by more than one peer (producer, consumer, timeline) is a
   set, a table or a function here, never a copy in each.
"""
