"""Capture: pcap and pcapng files <-> TCP segments (the file edge of the core; struct only).

Theory of operation: :class:`~.pcapfile.CaptureReader` walks the records of a
pcap or pcapng file (:class:`~.pcapfile.RawPacket`: link type, bytes, time,
number, offsets in the file); :func:`~.packets.parse_packet` peels the link,
IP and TCP headers into a :class:`~dcpinspect.flows.reassembly.Segment`;
:mod:`.read` hands those segments, file after file, to the record builders of
:mod:`dcpinspect.flows.records` (:func:`~.read.read_records`,
:func:`~.read.read_chunks`).  For many readers of one big file,
:func:`~.pcapfile.split_ranges` cuts it at record boundaries and
:func:`~.pcapfile.read_range` reads one range as the whole-file reader would.
:mod:`.pcapwrite` writes pcap files: packets as captured (whole, or the
packets a selection of frames came from), or TCP conversations with
synthesised headers.

Rules:

1. Hostile files are expected: every declared length is checked against
   :data:`~.pcapfile.MAX_RECORD` and what is left of the file before anything
   is read; nothing reserves more memory than the file holds.
2. A file that is not a capture, or whose header is corrupt, raises
   :class:`~.pcapfile.CaptureError` (path and byte offset); a bad record later
   ends the file with a problem, keeping every packet before it.
3. Offsets are the file's: of a record, of a packet's bytes, of a problem -
   also when a range is read on its own.
4. A packet time no table can hold becomes ``TS_UNKNOWN`` (null ``ts``), one
   problem per file counting them.
5. Packets that are not TCP over a supported link type are counted by kind
   and skipped, never guessed at.
6. A gzip'ed file (known by its magic bytes, never its name) is read as a
   stream of bounded pieces; its offsets are positions in the decompressed
   bytes, and a cut or corrupt gzip tail keeps every packet before it.
7. :mod:`.sets` groups the files of a run into capture sets (the files of one
   recording) from their names and the heads and tails of their packets;
   each set is read as one capture, and nothing joins across sets.
"""
