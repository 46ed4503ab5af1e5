"""Two consumers compared (``dcpinspect.tables.compare``): sessions recorded live with the simulator, each with a known answer.

Each scenario runs the simulator (``captures/make_live_samples.py``'s plumbing:
client -> tap proxy -> simulator, or the clients' own capture with two nodes),
keeps the pcap in a temporary folder, and the comparison of its consumers is
checked against what the scenario did.  The waits are on what the clients
received (never on time).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest
from paths import CAPTURES

from dcpinspect.tables.compare import (
    COMPARISON_COLUMNS,
    PER_VBUCKET_COLUMNS,
    Comparison,
    compare,
    compare_consumers,
    read_consumer,
    select_consumer,
)


@pytest.fixture(scope="module")
def mls() -> Iterator[ModuleType]:
    """``captures/make_live_samples.py`` as a module (its dataclasses look their module up in ``sys.modules``)."""
    spec_ = importlib.util.spec_from_file_location("make_live_samples", CAPTURES / "make_live_samples.py")
    assert spec_ is not None and spec_.loader is not None
    mod = importlib.util.module_from_spec(spec_)
    sys.modules["make_live_samples"] = mod
    try:
        spec_.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules["make_live_samples"]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compare")


def _record(mls: ModuleType, out: Path, name: str, scenario: Callable[[Any], None], **sim: Any) -> Path:
    with mls.live(out, name, **sim) as lv:
        scenario(lv)
    return out / f"live-{name}.pcap"


def rows(c: Comparison, vbucket: int = 0) -> list[tuple[str, int, int, str]]:
    """(only_in, seqno_from, seqno_to, reason) of one vbucket's differences."""
    t = c.table[c.table["vbucket"] == vbucket]
    return [(r.only_in, int(r.seqno_from), int(r.seqno_to), r.reason) for r in t.itertuples()]


def counts(c: Comparison, vbucket: int = 0) -> dict[str, Any]:
    return c.per_vbucket[c.per_vbucket["vbucket"] == vbucket].iloc[0].to_dict()


# ---------------------------------------------------------------------------
# a collections filter


@pytest.fixture(scope="module")
def filtered(mls: ModuleType, out: Path) -> Path:
    """Three default-collection documents, collection 8 ('airlines'), two of its, then 'airline-0' again in the default collection.

    One consumer streams collection 8 only, the other everything.
    """

    def scenario(lv: Any) -> None:
        lv.sim.create_collection("airlines")
        for i in range(2):
            lv.sim.mutate(f"airline-{i}", {"id": i}, collection="airlines")
        lv.sim.mutate("airline-0", {"id": "default"})  # the same key in the default collection
        mls.run(
            mls.run_client(
                "127.0.0.1", lv.port, lv.config("only-airlines", vbuckets=(0,), to_latest=True, stream_value={"collections": ["8"]})
            )
        )
        mls.run(mls.run_client("127.0.0.1", lv.port, lv.config("everything", vbuckets=(0,), to_latest=True)))

    return _record(mls, out, "cmp-filter", scenario, vbuckets=1, items=3, seed=21)


def test_a_collections_filter_explains_the_default_collection_documents(filtered: Path) -> None:
    c = compare(filtered, consumer_a="only-airlines", consumer_b="everything")
    assert rows(c) == [("b", 1, 3, "filter"), ("b", 7, 7, "filter")]  # the common items 4-6 between them: two runs
    row = c.table.iloc[0]
    assert row["items"] == 3 and all(k.startswith("doc-") for k in row["keys"])
    assert "collections 0x8" in row["explanation"] and "collection 0x0" in row["explanation"]
    assert c.table.iloc[1]["keys"] == ["airline-0"]  # the key of collection 8 is common; the default collection's is not
    _frames, tables = read_consumer(filtered)
    request = tables["attempts"][tables["attempts"]["conn"] == 1]["frame"].tolist()
    assert row["evidence_a"] == request  # a's stream request is the evidence
    n = counts(c)
    assert (n["items_a"], n["items_b"], n["common"], n["only_a"], n["only_b"]) == (3, 7, 3, 0, 4)  # the system event and two airlines
    assert "only in b: seqnos 1-3 (3 items: doc-0000, doc-0001, doc-0002) - filter" in c.story


def test_without_the_filter_column_the_difference_is_unexplained(filtered: Path) -> None:
    """The attempts table of ``analyze`` has no ``filter`` column: the same rows, the reason unknown (rule 2)."""
    frames, tables = read_consumer(filtered)
    bare = {**tables, "attempts": tables["attempts"].drop(columns=["filter"])}
    c = compare_consumers(select_consumer(frames, bare, "only-airlines"), select_consumer(frames, bare, "everything"))
    assert rows(c) == [("b", 1, 3, "unknown"), ("b", 7, 7, "unknown")]
    assert "not explained by the captured frames" in c.table.iloc[0]["explanation"]


# ---------------------------------------------------------------------------
# a resume point, and a stream that stops early


@pytest.fixture(scope="module")
def starts(mls: ModuleType, out: Path) -> Path:
    """'first' streams 0 to 4, 'early' streams open-ended and stops at 4; after 4 more writes 'resume' resumes from 'first', 'full' streams 0 to 8."""

    def scenario(lv: Any) -> None:
        first = mls.run(mls.run_client("127.0.0.1", lv.port, lv.config("first", vbuckets=(0,), to_latest=True)))

        async def early() -> None:
            client = lv.client(lv.config("early", vbuckets=(0,)))
            await client.start()
            await mls.client_until(client, lambda c: mls.streamed_to(c, 0) >= 4, "seqno 4")
            await client.stop()

        mls.run(early())
        mls._settle(lv.proxy)  # its connection is gone at the proxy too: the writes below cannot reach it
        for i in range(4):
            lv.sim.mutate(f"later-{i}", {"n": i})
        mls.run(mls.run_client("127.0.0.1", lv.port, lv.config("resume", vbuckets=(0,), to_latest=True, resume=first)))
        mls.run(mls.run_client("127.0.0.1", lv.port, lv.config("full", vbuckets=(0,), to_latest=True)))

    return _record(mls, out, "cmp-starts", scenario, vbuckets=1, items=4, seed=22)


def test_a_resume_point_explains_the_seqnos_before_it(starts: Path) -> None:
    c = compare(starts, consumer_a="full", consumer_b="resume")
    assert rows(c) == [("a", 1, 4, "start")]
    assert "at seqno 4 (a resume point)" in c.table.iloc[0]["explanation"]
    n = counts(c)
    assert (n["items_a"], n["items_b"], n["common"], n["last_a"], n["last_b"]) == (8, 4, 4, 8, 8)


def test_a_stream_closed_early_explains_what_it_lacks(starts: Path) -> None:
    c = compare(starts, consumer_a="full", consumer_b="early")
    assert rows(c) == [("a", 5, 8, "ended")]
    text = c.table.iloc[0]["explanation"]
    assert text.startswith("b's stream reached seqno 4 with no stream end: its connection's last frame is"), text
    frames, _tables = read_consumer(starts)
    early = select_consumer(frames, _tables, "early")
    assert c.table.iloc[0]["evidence_b"] == [int(early[0]["frame"].max())]  # the client closed the connection


def test_the_same_consumer_twice_has_no_difference(starts: Path) -> None:
    c = compare(starts, starts, consumer_a="full", consumer_b="full")
    assert c.table.empty and list(c.table.columns) == list(COMPARISON_COLUMNS)
    assert list(c.per_vbucket.columns) == list(PER_VBUCKET_COLUMNS)
    assert "the same items" in c.story and pd.isna(counts(c)["diverge_at"])


def test_selectors_that_name_nothing_say_what_there_is(starts: Path) -> None:
    with pytest.raises(ValueError, match=r"no consumer named 'nobody' \(DCP_OPEN names: 'early', 'first', 'full', 'resume'\)"):
        compare(starts, consumer_a="nobody", consumer_b="full")
    with pytest.raises(ValueError, match=r"no connection 9 \(connections: 1, 2, 3, 4\)"):
        compare(starts, conn_a=9, consumer_b="full")
    with pytest.raises(ValueError, match="name the two to compare"):
        compare(starts)


# ---------------------------------------------------------------------------
# dedup across snapshots


@pytest.fixture(scope="module")
def deduped(mls: ModuleType, out: Path) -> Path:
    """'live' streams while 'k' is written three times (each update received before the next); 'late' backfills afterwards."""

    def scenario(lv: Any) -> None:
        async def live_then_late() -> None:
            client = lv.client(lv.config("live", vbuckets=(0,)))
            await client.start()
            await mls.client_until(client, lambda c: mls.streamed_to(c, 0) >= 2, "the backfill")
            for n in range(3):
                seqno = lv.sim.mutate("k", {"n": n})
                await mls.client_until(client, lambda c, s=seqno: mls.streamed_to(c, 0) >= s, f"update {n}")
            await client.stop()

        mls.run(live_then_late())
        mls.run(mls.run_client("127.0.0.1", lv.port, lv.config("late", vbuckets=(0,), to_latest=True)))

    return _record(mls, out, "cmp-dedup", scenario, vbuckets=1, items=2, seed=23)


def test_dedup_across_snapshots(deduped: Path) -> None:
    c = compare(deduped, consumer_a="live", consumer_b="late")
    assert rows(c) == [("a", 3, 4, "dedup")]
    row = c.table.iloc[0]
    assert row["keys"] == ["k", "k"] and "only at later seqnos" in row["explanation"]
    one = compare_consumers(*[select_consumer(*read_consumer(deduped), n) for n in ("live", "late")], vbucket=0)
    assert one.per_vbucket.iloc[0]["common"] == 3  # the two documents and k at 5


# ---------------------------------------------------------------------------
# a failover: one consumer rolled back, the other connected later


@pytest.fixture(scope="module")
def failed_over(mls: ModuleType, out: Path) -> Path:
    """Vbucket 0 at 10, five more writes streamed, then it fails over losing 3 (branch point 12): 'through' rolls back; 'after' connects later."""

    def scenario(lv: Any) -> None:
        def write(prefix: str, upto: int) -> None:
            for key in lv.keys_in(0, prefix, upto - lv.high(0)):
                lv.sim.mutate(key, {"vb": 0})

        write("before", 10)

        async def through() -> None:
            client = lv.client(lv.config("through", vbuckets=(0,), end_seqno=18))
            await client.start()
            await mls.client_until(client, lambda c: mls.streamed_to(c, 0) >= 10, "caught up")
            write("before-loss", 15)
            await mls.client_until(client, lambda c: mls.streamed_to(c, 0) >= 15, "at 15")
            lv.sim.failover(0, lose=3)
            await mls.client_until(client, lambda c: len(c.streams[0].position.failover_log) == 2, "rolled back")
            write("after-failover", 18)
            await mls.within(client.wait(), "the stream to 18")

        mls.run(through())

        async def after() -> None:
            client = lv.client(lv.config("after", vbuckets=(0,), to_latest=True))
            await client.start()
            await mls.within(client.wait(), "the later consumer")

        mls.run(after())

    return _record(mls, out, "cmp-failover", scenario, nodes=2, vbuckets=2, items=0, seed=24)


def test_a_failover_rollback_and_a_later_consumer_on_the_new_branch(failed_over: Path) -> None:
    c = compare(failed_over, consumer_a="through", consumer_b="after", vbucket=0)
    assert rows(c) == [("a", 13, 15, "rollback")]
    row = c.table.iloc[0]
    assert all(k.startswith("before-loss") for k in row["keys"]) and "rolled back to 12" in row["explanation"]
    assert "which b's history replaced at seqno 12 by" in row["explanation"]
    n = counts(c)
    assert (n["items_a"], n["items_b"], n["common"]) == (21, 18, 18)  # a's three dropped items count as received
    assert n["branches_a"] == n["branches_b"] and n["branches_a"].count("@") == 2 and n["branches_a"].endswith("@12")
    assert pd.isna(n["diverge_at"])  # both end on the same history: the difference is what a dropped


def test_a_consumer_that_never_saw_the_failover_diverges(failed_over: Path) -> None:
    """'through''s first connection alone (cut by StateChanged before the failover's new log): its history diverges from 'after''s at 12."""
    c = compare(failed_over, conn_a=1, consumer_b="after", vbucket=0)
    assert counts(c)["diverge_at"] == 12
    assert rows(c) == [("a", 13, 15, "branch"), ("b", 13, 15, "branch"), ("b", 16, 18, "ended")]
    assert "the histories diverge at seqno 12 (a's log has no later entry, b's has 0x" in c.table.iloc[0]["explanation"]


def test_one_consumer_holds_what_the_other_received_and_dropped(failed_over: Path) -> None:
    """'through''s first connection holds 13-15; 'through' as a whole (both connections) rolled back to 12 and dropped them."""
    c = compare(failed_over, conn_a=1, consumer_b="through", vbucket=0)
    assert rows(c) == [("a", 13, 15, "rollback"), ("b", 13, 15, "branch"), ("b", 16, 18, "ended")]
    row = c.table.iloc[0]
    _frames, tables = read_consumer(failed_over)
    rollback = int(tables["rollbacks"]["response_frame"].iloc[0])
    assert row["explanation"] == f"b received them, then rolled back to 12 (frame {rollback}) and dropped them"
    assert row["evidence_b"] == [*row["evidence_a"], rollback]  # the same items' frames, and the rollback
    assert "ended StateChanged" in c.table.iloc[2]["explanation"]
    n = counts(c)
    assert (n["items_a"], n["items_b"], n["common"], n["only_a"], n["only_b"]) == (15, 21, 15, 3, 6)


def test_a_rollback_to_zero_with_nothing_received_drops_nothing() -> None:
    """live-purge-rollback: the resume rolled back to 0 before any item; only what the first run never asked for differs."""
    _frames, tables = read_consumer(CAPTURES / "live-purge-rollback.pcap")
    assert tables["rollbacks"]["rollback_seqno"].tolist() == [0]
    c = compare(CAPTURES / "live-purge-rollback.pcap")
    assert rows(c) == [("b", 16, 20, "ended")] and not c.items["dropped"].any()


# ---------------------------------------------------------------------------
# a capture that starts mid-stream


def test_a_capture_that_starts_mid_stream(mls: ModuleType, deduped: Path, tmp_path: Path) -> None:
    """The dedup session cut after the packet that carried 'live''s item at seqno 3: no stream request, no backfill of 'live'."""
    from dcpinspect.tables.export import frames_df

    frames, tables = frames_df(deduped), read_consumer(deduped)[1]
    live = select_consumer(frames, tables, "live")[0]
    cut_after = int(live[live["frame"].isin(tables["items"][tables["items"]["seqno"] == 3]["frame"])]["packet"].max())
    header, records = mls.read_pcap(deduped)
    cut = tmp_path / "mid-stream.pcap"
    cut.write_bytes(header + b"".join(records[cut_after:]))  # packets are numbered from 1
    c = compare(cut, deduped, conn_a=1, consumer_b="late")  # conn 1 of the cut capture: 'live', its DCP_OPEN cut off
    assert rows(c) == [("a", 4, 4, "dedup"), ("b", 1, 2, "start")]
    start = c.table.iloc[1]["explanation"]
    assert start == "a's capture starts mid-stream: no stream request, first item seqno 4", start
    n = counts(c)
    assert (n["items_a"], n["items_b"], n["common"]) == (2, 3, 1)


# ---------------------------------------------------------------------------
# the plot


def test_the_plot_marks_the_dropped_items_and_the_difference(failed_over: Path) -> None:
    from dcpinspect.views.drawing import frames_of
    from dcpinspect.views.plots_compare import REASON_COLOURS, plot_compare

    c = compare(failed_over, consumer_a="through", consumer_b="after", vbucket=0)
    fig = plot_compare(c)
    (ax,) = fig.axes
    tagged = {artist.get_gid(): artist for artist in [*ax.lines, *ax.collections] if artist.get_gid()}
    dropped = c.items[(c.items["side"] == "a") & c.items["dropped"]]
    assert sorted(frames_of(tagged["dropped:0:a"])) == sorted(int(f) for f in dropped["frame"])
    assert [int(s) for s in dropped["seqno"]] == [13, 14, 15]
    assert list(frames_of(tagged["diff:0"])) == c.table.iloc[0]["evidence_a"]
    assert len(frames_of(tagged["items:0:b"])) == 18 and "dropped:0:b" not in tagged
    band = tagged["diff:0"]
    assert tuple(band.get_facecolor()[0][:3]) == tuple(int(REASON_COLOURS["rollback"][i : i + 2], 16) / 255 for i in (1, 3, 5))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["vb 0 a", "vb 0 b"]


def test_the_same_answer_from_tables_as_spark_writes_them(failed_over: Path) -> None:
    """Every table through ``arrow_for_spark`` (uint64 as decimals, failover logs as structs) and back: the same comparison."""
    from dcpinspect.spark.analysis import arrow_for_spark

    frames, tables = read_consumer(failed_over)
    spark = {name: arrow_for_spark(df).to_pandas() for name, df in tables.items()}
    assert isinstance(spark["attempts"]["failover_log"].iloc[0][0], dict)
    pick = [select_consumer(frames, spark, name) for name in ("through", "after")]
    c = compare_consumers(*pick, vbucket=0)
    assert rows(c) == [("a", 13, 15, "rollback")]
    assert c.table.equals(compare(failed_over, consumer_a="through", consumer_b="after", vbucket=0).table)


def test_records_give_what_the_capture_gives(filtered: Path) -> None:
    """A live session's records (here read back from its capture) make the same consumers as the capture file."""
    from dcpinspect.capture.read import read_records
    from dcpinspect.tables.compare import consumer_from_records

    frames, tables = consumer_from_records(read_records(str(filtered)))
    c = compare_consumers(select_consumer(frames, tables, "only-airlines"), select_consumer(frames, tables, "everything"))
    assert c.table.equals(compare(filtered, consumer_a="only-airlines", consumer_b="everything").table)
    assert rows(c) == [("b", 1, 3, "filter"), ("b", 7, 7, "filter")]
    direct = compare(list(read_records(str(filtered))), consumer_a="only-airlines", consumer_b="everything")
    assert direct.table.equals(c.table) and "records" in direct.story


def test_a_filters_table_is_read_when_there_is_one(filtered: Path) -> None:
    """A ``filters`` table (frame, collections, scope: what the key-history tables carry) stands in for the attempts' ``filter``."""
    frames, tables = read_consumer(filtered)
    attempts = tables["attempts"]
    filters = pd.DataFrame(
        {
            "conn": attempts["conn"],
            "frame": attempts["frame"],
            "collections": [[8] if v else None for v in attempts["filter"]],
            "scope": [None] * len(attempts),
        }
    )
    with_table = {**tables, "attempts": attempts.drop(columns=["filter"]), "filters": filters}
    c = compare_consumers(select_consumer(frames, with_table, "only-airlines"), select_consumer(frames, with_table, "everything"))
    assert rows(c) == [("b", 1, 3, "filter"), ("b", 7, 7, "filter")]
    assert c.table.equals(compare(filtered, consumer_a="only-airlines", consumer_b="everything").table)
