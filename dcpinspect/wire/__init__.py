"""Wire: bytes -> events -> dissections, and back (sans-IO; stdlib only; imports only ``protocol``).

Theory of operation: :class:`~.decoder.FrameDecoder` takes one direction of a
byte stream, fed in chunks of any size, and reports :mod:`.events`: a
:class:`~.events.Frame` for every complete frame with a plausible header,
:class:`~.events.Garbage` for bytes skipped while resynchronising,
:class:`~.events.Truncated` for a frame the stream cut short, and
:class:`~.events.Gap` for bytes the source knows are missing.  A ``Frame`` is a
plain tuple ``(offset, raw, dialect)``; nothing more is read from it until
asked.  :func:`~.dissect.dissect` reads a frame in the context of its
connection (:class:`~.dissection.DissectContext`) into a
:class:`~.dissection.Dissection`: values by name, the byte span of every field,
and the problems found.  It interprets the protocol table: it picks the
variant with :func:`~.dissect.select_variant`, reads the value with a reader
from :data:`~.values.VALUE_READERS`, and checks the variant's typed rules.
:func:`~.encode.encode` builds frames from the same table (and the same
``select_variant``), so every variant round-trips.  :mod:`.framing` is the
codec both directions share (LEB128 collection ids, flexible-framing frame
infos); :mod:`.render` draws frames and dissections the way the protocol docs
do, and :mod:`.examples` holds the docs' worked examples.

Rules:

1. ``wire/`` never raises on input bytes: decoding, dissecting and rendering
   any bytes returns events, problems and text.  Only local misuse raises
   (feeding a closed decoder, ``encode`` arguments that make no frame).
2. Every input byte lands in exactly one event, in order: the events of a
   stream tile it, gaps included.
3. The events do not depend on how the input was chunked.
4. Memory is bounded: an implausibly large declared body is garbage, never
   buffered, and garbage is reported in pieces of at most ``garbage_chunk``.
5. Dissection reports what is wrong as a :class:`~.dissection.Problem` with
   the offending byte range; a frame's meaning comes only from the table and
   the connection context, and an unknown context guesses nothing.
6. No module here writes an opcode, magic, status or datatype bit as a
   number: they come from ``protocol.enums`` and the table.
7. ``wire/`` knows nothing of connections, directions or time (``flows``
   does), and imports nothing but ``protocol`` and the standard library.
8. ``Frame`` stays a tuple, and the dissector looks up its tables once per
   frame: the hot paths are measured by ``benchmarks/bench_decode.py``.
"""
