"""Time in the text output (``-t``, as tshark's): formats, references taken before a filter, per capture set; and show's header."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from clirun import run
from paths import CAPTURES

from dcpinspect.cli.output import TIME_FORMATS, Clock, seconds_text, utc_text

RETRY = CAPTURES / "seed-000-rollback-retry.pcap"
MESSY = CAPTURES / "messy.pcap"
NS = 1_000_000_000


def times(out: str, mode: str) -> dict[int, str]:
    """frame -> its time column, from ``frames`` text lines."""
    width = 2 if mode == "ad" else 1  # the date and the time of day
    return {int(line.split()[0]): " ".join(line.split()[1 : 1 + width]) for line in out.splitlines()}


def test_formats() -> None:
    ns = int(datetime(2026, 1, 2, 10, 11, 12, 123456, tzinfo=UTC).timestamp()) * NS + 123_456_789
    assert utc_text(ns) == "2026-01-02 10:11:12.123456"
    assert utc_text(ns, date=False) == "10:11:12.123456"
    assert seconds_text(ns) == f"{ns // NS}.123456"
    assert seconds_text(-1_500) == "-0.000001" and seconds_text(0) == "0.000000" and seconds_text(2 * NS + 7_000) == "2.000007"
    row = {"ts": ns, "ts_first": None}
    assert Clock("ad").value(row) == "2026-01-02 10:11:12.123456"
    assert Clock("a").value(row) == "10:11:12.123456"
    assert Clock("e").value(row) == seconds_text(ns)
    for mode in TIME_FORMATS:
        assert Clock(mode).value({"ts": None}) == "?"
    with pytest.raises(ValueError, match="unknown time format"):
        Clock("x")


def test_relative_and_deltas_remember_what_they_saw() -> None:
    rows = [{"ts": t, "ts_first": f, "capture_set": s} for t, f, s in [(10, 8, 1), (15, 15, 1), (100, 100, 2), (21, 21, 1)]]
    r = Clock("r")
    assert [r.value(row) for row in rows] == [seconds_text(x) for x in (2, 7, 0, 13)]  # from each set's first frame's start
    d = Clock("d")
    assert [d.value(row) for row in rows] == ["?", seconds_text(5), seconds_text(85), seconds_text(-79)]


@pytest.mark.parametrize("mode", ["r", "d", "a", "ad", "e"])
def test_a_filter_does_not_move_the_reference(mode: str) -> None:
    """Every format but ``dd`` gives a frame the same time whether or not a filter hides the frames before it."""
    code, everything = run("frames", "--no-progress", "-t", mode, str(MESSY), str(RETRY))
    assert code == 0
    code, some = run("frames", "--no-progress", "-t", mode, "--filter", "role == 'response' or type != 'frame'", str(MESSY), str(RETRY))
    assert code == 0
    shown = times(some, mode)
    assert 0 < len(shown) < len(times(everything, mode))
    assert shown == {n: t for n, t in times(everything, mode).items() if n in shown}


def test_delta_displayed_and_capture_sets() -> None:
    code, out = run("frames", "--no-progress", "-t", "e", "--filter", "role == 'response'", str(RETRY))
    epoch = [float(t) for t in times(out, "e").values()]
    code, out = run("frames", "--no-progress", "-t", "dd", "--filter", "role == 'response'", str(RETRY))
    assert code == 0
    deltas = list(times(out, "dd").values())
    assert deltas[0] == "?" and [float(x) for x in deltas[1:]] == pytest.approx([b - a for a, b in itertools.pairwise(epoch)])
    # two unrelated captures: two capture sets, each relative to its own start
    code, out = run("frames", "--no-progress", str(RETRY), str(MESSY))
    starts = [line.split()[1] for line in out.splitlines() if line.split()[0] in ("1", "5")]
    assert starts == ["0.000000", "0.000000"]


def test_show_header_time_is_the_list_time() -> None:
    for mode in ("r", "ad", "d"):
        _, listed = run("frames", "--no-progress", "-t", mode, str(RETRY))
        code, shown = run("show", "--no-progress", "-t", mode, "--frame", "3", str(RETRY))
        assert code == 0
        head = next(line for line in shown.splitlines() if line.startswith("== frame 3 "))
        assert f"  time {times(listed, mode)[3]}  " in head
    _, shown = run("show", "--no-progress", "-t", "r", "--filter", "frame == 3", str(RETRY))
    assert f"  time {times(listed, 'r')[3]}  " not in shown  # listed is -t d now: a different number
    _, listed = run("frames", "--no-progress", str(RETRY))
    assert f"  time {times(listed, 'r')[3]}  " in shown  # relative to the capture start, not to the first frame shown
