"""The command line: one argparse tree, one record printer (an edge: it may import any layer).

Theory of operation: :func:`~.main.main` builds the tree of
:mod:`.main` - every subcommand with its one-line help - and argparse picks
the subcommand.  Only then is that subcommand's group imported and its
arguments added (:class:`~.command.CommandParser`): :mod:`.decode` (decode,
reference, examples: the core only), :mod:`.capture` (frames, show, summary,
timeline; :mod:`.export` writes ``frames --pcap``), :mod:`.fields` (fields),
:mod:`.follow` (follow), :mod:`.stats` (stats), :mod:`.key` (key),
:mod:`.lag` (lag), :mod:`.compare` (compare), :mod:`.live` (sim, client,
proxy, sniff), :mod:`.replay` (replay) and :mod:`.analyze` (Spark; :mod:`.extras` says which pip
extra a command needs when it is missing).  The chosen function turns arguments into calls of the library and
prints what comes back; records are printed by :mod:`.output`, as a JSON
line or a text line of the frames table, whichever tool produced them.

Rules:

1. The library never prints and never parses arguments: every ``argparse``,
   every ``print`` of a record and every exit status lives here.
2. A subcommand imports its heavy modules (pyarrow, the producer, the
   consumer, scapy, Spark) inside its own functions, so ``dcpinspect
   decode`` loads the core and nothing else.
3. A frames row has one JSON form (:func:`~.output.json_line`) and one text
   form (:func:`~.output.text_line`): ``frames``, ``proxy``, ``sniff`` and
   ``client --json`` all print through them.
4. Printing never stalls a socket: the live tools hand records to a
   :class:`~.output.RecordPrinter` (a bounded queue and its own thread) that
   drops and counts what the output cannot take.
5. Commands, flags, help texts, outputs and exit statuses are an interface:
   a usage error exits 2 with argparse's message, a user error 2 with
   ``dcpinspect: error: ...``, and :func:`~.main.main` returns the status
   instead of exiting.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
