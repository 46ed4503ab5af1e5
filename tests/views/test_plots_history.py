"""The lost segment of a rollback on the branch tree: drawn where the consumer lost items, labelled with the counts."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from paths import CAPTURES

from dcpinspect.tables.history import read_tables, rollback_losses
from dcpinspect.views import plots


def test_the_lost_segment_is_marked_on_the_abandoned_branch() -> None:
    r = read_tables(CAPTURES / "live-failover-branches.pcap")
    losses = rollback_losses(r.frames, r.tables)
    fig = plots.plot_branches(r.timeline, 0, losses=losses)
    a = fig.axes[0]
    (band,) = [ln for ln in a.lines if ln.get_gid() == "rollback-loss:0"]
    assert list(band.get_xdata()) == [12.0, 15.0]  # from the rollback seqno to the last seqno lost
    lane = next(
        y for y, t in zip(a.get_yticks(), a.get_yticklabels(), strict=False) if t.get_text().startswith(f"0x{losses['uuid'][0]:016x}")
    )
    assert list(band.get_ydata()) == [lane, lane]  # on the lane of the uuid the request sent
    assert "3 items cut: 3 keys possibly lost" in [t.get_text() for t in a.texts]
    without = plots.plot_branches(r.timeline, 0)
    assert not [ln for ln in without.axes[0].lines if ln.get_gid() == "rollback-loss:0"]
    other = plots.plot_branches(r.timeline, 1, losses=losses)  # vbucket 1 had no rollback: nothing marked
    assert not [ln for ln in other.axes[0].lines if (ln.get_gid() or "").startswith("rollback-loss")]
