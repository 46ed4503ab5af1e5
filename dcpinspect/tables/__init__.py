"""Tables: records and timelines as columns (numpy, pyarrow, pandas live here and in the views only).

Theory of operation: the frames table has one row per decoded event and the
columns of :mod:`.columns` (their Arrow, pandas and Spark types in
:mod:`.schema`).  Capture files reach it through :mod:`.columnar` (packet
headers parsed by :mod:`.packets_vector`; connections proved simple are
walked frame by frame, the rest go through the exact reassembler; JSON
documents checked in bulk by :mod:`.jsoncheck`, a choice).
:mod:`.frames_vector` builds the columns batch by batch:
headers and fixed-offset extras are gathered with numpy straight from the
table's layouts, and only the rows that need a full dissection (values, rule
checks, anything unusual) go through :func:`dcpinspect.dissect`, so the fast
path can never disagree with the exact one (a differential test proves it row
for row).  :mod:`.export` turns it into Arrow, pandas, parquet, CSV or JSON
lines; :mod:`.timeline` turns a :class:`~dcpinspect.timeline.Timeline` into
DataFrames (streams, attempts, snapshots, items, rollbacks, anomalies, flow).
Each run's files are read set by set (:mod:`dcpinspect.capture.sets`): a
row carries its ``capture_set`` and its ``set_frame``.  :mod:`.filter` is
the one display-filter language over these columns (a vectorised mask and a
per-row test, proven equal), :mod:`.fields` says what every column means,
and :mod:`.stats` and :mod:`.follow` answer tshark's ``-z`` and "follow"
questions from the same table.  The questions no other tool answers are
pure functions of the frames table and the timeline's tables, so they run
alike on one read and on ``analyze``'s output: :mod:`.history` (a
document's versions and their fates, what each rollback cost),
:mod:`.progress` (consumer lag per vbucket over time) and :mod:`.compare`
(why one consumer has what another does not).

Rules:

1. ``tables/`` is the only place that names a column or an Arrow, pandas or
   Spark type; the Spark code and the views take them from :mod:`.schema`.
2. Every row is decoded by the one decoder and dissected by the one
   dissector: the vectorised path reads its layouts and rules from the
   protocol table, never from a copy.
3. Tables never lose a row: garbage, truncated frames and gaps are rows too,
   with their problems in the ``problems`` column.
4. A packet time out of range is a null ``ts``, never a wrapped number.
"""
