"""Predict-then-check exercises for the teaching notebooks.

Theory of operation
-------------------
A notebook asks before it tells.  Each exercise goes through four cells:

1. the question, in markdown;
2. the learner's prediction: ``quiz.predict(1, None)`` - the learner replaces
   ``None`` with an answer before running the cells that follow;
3. the cells that make it happen (a live session, a capture read, the rule);
4. the answer, in a cell whose source is hidden and whose output is collapsed
   (``quiz.answer(1, 15, why="...")``, tagged ``answer`` by
   ``notebooks/build.py``), then ``quiz.check(1, observed)``: the value the
   cells above actually produced.

Rules:

1. :meth:`Exercises.check` compares the stored answer with what was observed.
   If they differ the *notebook* is wrong (the prose or the simulator changed
   under it) and it raises :class:`ExerciseError`: the test suite executes every
   notebook, so a stale answer fails CI.  A wrong *prediction* never raises: it
   is shown beside the answer.
2. Answers compare by value; a ``set`` answer compares with ``set(observed)``
   (order-free questions such as "which frames are broken?"), a ``float``
   answer within ``tolerance``.
3. An exercise is checked once, after its answer; :func:`report` lists every
   exercise made in this interpreter (the test suite reads it after a run) with
   whether it was answered, checked and held.
4. Everything shown is escaped: answers may quote wire text.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Exercise", "ExerciseError", "Exercises", "report"]

_NOT_GIVEN = object()


class ExerciseError(AssertionError):
    """A notebook's stored answer disagrees with what its own cells observed."""


@dataclass
class Exercise:
    """One question: the learner's prediction, the stored answer, what was observed."""

    number: int | str
    prediction: Any = None
    answer: Any = _NOT_GIVEN
    why: str = ""
    observed: Any = _NOT_GIVEN
    tolerance: float = 0.0

    @property
    def answered(self) -> bool:
        """Whether the answer cell ran."""
        return self.answer is not _NOT_GIVEN

    @property
    def checked(self) -> bool:
        """Whether the check cell ran."""
        return self.observed is not _NOT_GIVEN

    def matches(self, value: Any) -> bool:
        """Whether ``value`` is this exercise's answer (rule 2)."""
        if not self.answered:
            return False
        return _same(self.answer, value, self.tolerance)


def _same(answer: Any, value: Any, tolerance: float) -> bool:
    if isinstance(answer, (set, frozenset)):
        try:
            return set(answer) == set(value)
        except TypeError:
            return False
    if isinstance(answer, float) and isinstance(value, (int, float)):
        return math.isclose(answer, float(value), abs_tol=tolerance)
    if isinstance(answer, (list, tuple)) and isinstance(value, (list, tuple)):
        return len(answer) == len(value) and all(_same(a, v, tolerance) for a, v in zip(answer, value, strict=True))
    try:
        return bool(answer == value)
    except (TypeError, ValueError):
        return False


def _text(value: Any) -> str:
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(map(repr, value))) + "}" if value else "{}"
    return repr(value)


class Shown:
    """What a cell shows: plain text for a terminal, collapsible HTML for a notebook."""

    def __init__(self, text: str, body: str, *, summary: str | None = None) -> None:
        self.text = text
        self._body = body
        self._summary = summary

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        if self._summary is None:
            return f"<div class='dcpinspect-exercise'>{self._body}</div>"
        return f"<details class='dcpinspect-exercise'><summary>{html.escape(self._summary)}</summary>{self._body}</details>"


_ALL: list[Exercises] = []


class Exercises:
    """A notebook's exercises (rules in the module docstring)."""

    def __init__(self, notebook: str = "") -> None:
        self.notebook = notebook
        self.items: dict[int | str, Exercise] = {}
        _ALL.append(self)

    def _get(self, n: int | str) -> Exercise:
        return self.items.setdefault(n, Exercise(n))

    def predict(self, n: int | str, value: Any) -> Shown:
        """Record the learner's prediction for exercise ``n`` (``None``: none given)."""
        ex = self._get(n)
        ex.prediction = value
        if value is None:
            msg = f"Exercise {n}: no prediction yet - put yours in place of None, then run on."
        else:
            msg = f"Exercise {n}: your prediction is {_text(value)}. Run on to find out."
        return Shown(msg, html.escape(msg))

    def answer(self, n: int | str, value: Any, *, why: str = "", tolerance: float = 0.0) -> Shown:
        """Store the answer to exercise ``n``; shown collapsed so it does not give itself away."""
        ex = self._get(n)
        ex.answer, ex.why, ex.tolerance = value, why, tolerance
        text = f"Answer {n}: {_text(value)}" + (f" - {why}" if why else "")
        body = f"<p><b>{html.escape(_text(value))}</b></p>" + (f"<p>{html.escape(why)}</p>" if why else "")
        return Shown(text, body, summary=f"Answer {n} (click to open)")

    def check(self, n: int | str, observed: Any) -> Shown:
        """Compare the stored answer with what the cells above observed (rule 1)."""
        ex = self._get(n)
        if not ex.answered:
            raise ExerciseError(f"exercise {n} has no stored answer: run its answer cell first")
        ex.observed = observed
        if not ex.matches(observed):
            raise ExerciseError(f"exercise {n}: the notebook's answer {_text(ex.answer)} is not what happened ({_text(observed)})")
        lines = [f"Exercise {n}: observed {_text(observed)}, as the answer said."]
        if ex.prediction is None:
            lines.append("You made no prediction; try the next one before you run it.")
        elif ex.matches(ex.prediction):
            lines.append(f"Your prediction {_text(ex.prediction)} was right.")
        else:
            lines.append(f"Your prediction was {_text(ex.prediction)}; see the answer above for why it is {_text(ex.answer)}.")
        return Shown("\n".join(lines), "".join(f"<p>{html.escape(line)}</p>" for line in lines))

    def summary(self) -> list[dict[str, Any]]:
        """One row per exercise: number, answered, checked, held (its answer matched what was observed)."""
        return [
            {
                "notebook": self.notebook,
                "exercise": ex.number,
                "answered": ex.answered,
                "checked": ex.checked,
                "held": ex.checked and ex.matches(ex.observed),
            }
            for ex in self.items.values()
        ]


def report() -> list[dict[str, Any]]:
    """Every exercise made in this interpreter (:meth:`Exercises.summary` of each notebook's set)."""
    return [row for quiz in _ALL for row in quiz.summary()]
