"""Flows: TCP segments -> byte streams -> records with their connection's context (pure; no I/O).

Theory of operation: a capture, a proxy or a sniffer hands over TCP
:class:`~.reassembly.Segment` objects.  :class:`~.reassembly.Reassembler`
puts each direction of each connection back in order, names the client and
the server, and reports gaps and overlaps instead of guessing; each direction
feeds one :class:`~dcpinspect.wire.decoder.FrameDecoder`.  :mod:`.records`
numbers the decoded events as :class:`~.records.Record` tuples (frame,
connection, direction, time, packet), and :mod:`.session` follows what each
connection negotiated so every frame is dissected with the context of *its*
connection.

Rules:

1. ``flows/`` knows nothing about files or sockets; timestamps are whatever the
   source put in the segments (``TS_UNKNOWN`` when out of range).
2. Every payload byte of a captured connection ends in exactly one event of its
   direction: a frame, garbage, a truncated frame or a gap.
3. Memory is bounded per connection: pending reorder buffers, pending session
   requests and closed connections are capped, and what is dropped is counted.
4. :class:`~.session.ConnState` is the only connection-context tracker: the
   timeline, the consumer and the producer use it too.
"""
