"""The notebooks' predict-then-check exercises: a stale answer fails, a wrong prediction never does."""

from __future__ import annotations

import pytest

from dcpinspect.views.exercises import ExerciseError, Exercises, report


def test_a_checked_answer_that_held_is_reported() -> None:
    quiz = Exercises("t1")
    quiz.predict(1, 15)
    assert "15" in repr(quiz.answer(1, 15, why="the fork"))
    shown = quiz.check(1, 15)
    assert "was right" in repr(shown)
    assert quiz.summary() == [{"notebook": "t1", "exercise": 1, "answered": True, "checked": True, "held": True}]
    assert quiz.summary()[0] in report()


def test_a_stale_answer_fails_the_notebook() -> None:
    quiz = Exercises("t2")
    quiz.answer(1, 15)
    with pytest.raises(ExerciseError, match="15 is not what happened"):
        quiz.check(1, 20)


def test_a_wrong_prediction_is_shown_not_raised() -> None:
    quiz = Exercises("t3")
    quiz.predict("a", 3)
    quiz.answer("a", 1)
    assert "Your prediction was 3" in repr(quiz.check("a", 1))


def test_a_check_before_its_answer_is_an_error() -> None:
    with pytest.raises(ExerciseError, match="no stored answer"):
        Exercises("t4").check(1, 1)


def test_sets_compare_without_order_and_floats_within_tolerance() -> None:
    quiz = Exercises("t5")
    quiz.answer(1, {20, 23})
    quiz.check(1, [23, 20])
    quiz.answer(2, 0.2, tolerance=0.05)
    quiz.check(2, 0.23)
    quiz.answer(3, [1, (2, 3)])
    quiz.check(3, (1, [2, 3]))
    quiz.answer(4, {1})
    with pytest.raises(ExerciseError):
        quiz.check(4, 1)


def test_the_answer_is_collapsed_and_escaped() -> None:
    quiz = Exercises("t6")
    html = quiz.answer(1, "<script>alert(1)</script>", why="<b>")._repr_html_()
    assert html.startswith("<details") and "<script>" not in html and "&lt;b&gt;" in html
    assert "<script>" not in quiz.predict(1, "<script>")._repr_html_()
