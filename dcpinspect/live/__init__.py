"""Live peers: a simulated data node, a DCP client, a tap proxy and a sniffer (an edge over capture, flows, wire, protocol).

Theory of operation: the protocol logic is sans-IO.  The producer
(:mod:`.producer` with :mod:`.producer_streams`, :mod:`.producer_snapshots`,
:mod:`.producer_frames` and :mod:`.kv`, over the data model of :mod:`.cluster`
and :mod:`.vbucket`: one or more data nodes behind one cluster map,
:mod:`.clustermap`) and the consumer (:mod:`.consumer` with
:mod:`.consumer_states`, :mod:`.consumer_streams`, :mod:`.consumer_map` and
:mod:`.resume`; :mod:`.consumer_cluster` runs one per node, following the map)
take bytes and the time in and give bytes and events out; :mod:`.sasl` is
pure too.  Thin shells put them on sockets: :mod:`.sim` serves a producer
with asyncio, :mod:`.client` drives a consumer with asyncio, :mod:`.proxy`
forwards bytes unchanged between a client and a server, :mod:`.replay`
(with :mod:`.replay_script` and :mod:`.replay_server`) serves a capture's
recorded producer to new clients, and :mod:`.sniff`
reads packets from an interface.  Whatever bytes a shell sees go to
:mod:`.tap` (:class:`~.tap.LiveCapture`): synthesised TCP segments into the
same reassembly, decoder and connection context as a capture file, so live
traffic becomes the same records (and, optionally, a pcap with SASL secrets
masked).

Rules:

1. Protocol behaviour lives in the sans-IO peers, never in a shell: a shell
   only moves bytes, reads the clock and calls back.
2. Servers and proxies bind 127.0.0.1 unless told otherwise.
3. Records leave through callbacks (``on_record``, ``on_event``, ``on_notice``);
   ``live/`` never prints, never parses a command line and never imports
   ``timeline/``, ``tables/``, ``views/`` or ``cli/`` (the command lines are
   :mod:`dcpinspect.cli.live`).
4. Forwarding never waits on decoding or output: the proxy queues what it
   forwarded for a decoding thread and skips (a gap) what it cannot queue.
5. Memory is bounded on long runs: closed connections leave counters, not
   records, and what is dropped is counted.
6. A pcap written from live traffic has every SASL secret overwritten with
   ``*`` (same length) unless ``keep_secrets`` is asked for; records always
   hold the bytes as they passed.
7. What a long-running shell writes is on disk while it runs: the client
   flushes its pcap, then its resume state, every second (a timer on its
   event loop) and on exit, however it ends.
"""
