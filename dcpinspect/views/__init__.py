"""Views: what a person looks at - plots, a report page, the explorer and the stepper in a notebook.

Theory of operation
-------------------
The views read what the layers below built and never decode bytes themselves:
the frames table (:mod:`dcpinspect.tables`), the timeline
(:mod:`dcpinspect.timeline`), and a frame's annotation
(:mod:`dcpinspect.wire.render`).  Each interactive view is a plain-Python
model under a thin widget:

* :mod:`.store` - :class:`~.store.FrameStore`, the frames table as Arrow
  batches with each row's raw bytes and dissection context, so any frame is
  annotated again in O(1) (a table without bytes has its capture re-read once).
* :mod:`.explorer` - :class:`~.explorer.ExplorerModel`: filters evaluated with
  Arrow compute, paging (only the visible page becomes Python rows), the
  selection and its annotation, the pictures beside it
  (:class:`~.explorer.Shown`) and which frame a click on them hits, live
  records folded in every ``interval`` seconds.
* :mod:`.background` - the one door to threads and event loops
  (:class:`~.background.Background`): a capture read in a thread after its
  first chunk, a live fold on the running loop or a timer.
* :mod:`.stepper` - :class:`~.stepper.StepperModel`, a session replayed frame
  by frame through one timeline builder; one differ per part of the state
  says what each frame changed.
* :mod:`.panels` - the explorer's question panels (a key's history, what a
  rollback cost, consumer lag), cut out of the store and the timeline,
  bounded, computed only while open.
* :mod:`.replay_view` and :mod:`.replay_widget` - a running replay's
  divergences and connections as DataFrames, a model refreshed by a timer on
  the server's event loop, and its thin widget.
* :mod:`.widgets` - :func:`~.widgets.explore` and :func:`~.widgets.stepper`,
  ipywidgets views that mirror a model and pass the user's actions to it.
* :mod:`.plots` (on the drawing kit :mod:`.drawing`) and :mod:`.report` -
  matplotlib figures of a timeline, bounded whatever the capture's size, and
  one self-contained HTML page of an analysis.
* :mod:`.plots_history`, :mod:`.plots_lag` and :mod:`.plots_compare` - the
  pictures of the questions :mod:`dcpinspect.tables` answers: a rollback's
  lost segment on the branch tree, consumer lag per vbucket, two consumers'
  seqnos side by side.
* :mod:`.labels` - a seqno and a frame list entry as text.
* :mod:`.exercises` - :class:`~.exercises.Exercises`, the teaching notebooks'
  predict-then-check questions: a stored answer that disagrees with what the
  notebook's own cells observed fails the run.

A model tells its listeners what changed (``rows``, ``filters``, ``page``,
``selection``; ``position`` for the stepper); a widget redraws from the model
on each.  So a model works the same in a notebook, in a terminal (its
``text()``), in an exported page (its ``_repr_html_``) and in a test.

Rules
-----
1. Models (store, explorer, stepper, background, labels) import no widget
   toolkit and no matplotlib at import time; a test imports them and checks.
2. Widgets hold no state of their own: the filters, the page, the selection,
   the pictures shown and what a click hits all live in the model, and two
   views of one model always agree.
3. Nothing here decodes a frame or infers protocol behaviour: the wire layer
   annotates, the timeline reconstructs; a view only shows.
4. No opcode, magic, status or flag is written as a number here; seqno 2^64-1
   is :data:`dcpinspect.protocol.rules.MAX_SEQNO`, shown as ``max``.
5. Threads and event loops are reached only through a
   :class:`~.background.Runner`, which a test replaces with one it runs by
   hand; no model reads the clock, and the stepper's terminal player waits
   only through the ``sleep`` it is given.
6. Every piece of text that came off the wire is escaped in HTML and kept as
   text in plain output.
7. Plots use matplotlib's object-oriented API only, never pyplot, and draw a
   bounded number of things (streams, connections, branches, points), saying
   in the title what they left out.
8. Only public names of the layers below are used.
"""
