"""``analyze``'s report on Spark against the single process: every connection with its file and set, opcode plots per set for big runs.

1. A capture set with a TLS connection (port 11207) and a connection that
   carries no memcached frame: ``analyze``'s report lists both with their file
   and set, row for row as :func:`~dcpinspect.views.report.report_from_captures`
   does, and its ``connections`` table holds them with their set and file.
2. A run over the frame sample's threshold (monkeypatched small) of two
   capture sets still draws frames per opcode for each set.
"""

from __future__ import annotations

import html
import re
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pcapfactory import Conn, Msg, write_capture

from dcpinspect import encode
from dcpinspect.flows.reassembly import TLS_PORTS
from dcpinspect.spark import analysis
from dcpinspect.spark.analysis import analyze
from dcpinspect.views.report import report_from_captures

pytestmark = pytest.mark.spark
MUT = {"rev_seqno": 1, "flags": 0, "expiration": 0, "lock_time": 0, "nmeta": 0, "nru": 0}
TLS_PORT = min(TLS_PORTS)


def dcp(n: int, *, vb: int, client: int) -> Conn:
    """A DCP connection streaming ``n`` mutations of vbucket ``vb``."""
    op = 0x100 + vb
    msgs = [
        Msg("c2s", encode("DCP_OPEN", key="conn", extras={"flags": 1}, opaque=2)),
        Msg("s2c", encode("DCP_OPEN", response=True, opaque=2)),
        Msg("c2s", encode("DCP_STREAM_REQ", vbucket=vb, opaque=op, extras={"end_seqno": 2**64 - 1})),
        Msg("s2c", encode("DCP_STREAM_REQ", response=True, opaque=op, value=[(0xFEEDDECA, 0)])),
    ]
    items = b"".join(
        encode("DCP_MUTATION", vbucket=vb, opaque=op, extras={**MUT, "by_seqno": i + 1}, key=f"doc-{i}", value=b"v") for i in range(n)
    )
    return Conn(client=("10.0.0.1", client), msgs=[*msgs, Msg("s2c", items)])


def tls() -> Conn:
    """A connection to the TLS port: a ClientHello and a ServerHello's record header, never decoded."""
    hello = b"\x16\x03\x01" + struct.pack(">H", 40) + bytes(40)
    return Conn(
        client=("10.0.0.1", 40001),
        server=("10.0.0.2", TLS_PORT),
        msgs=[Msg("c2s", hello), Msg("s2c", b"\x16\x03\x03" + struct.pack(">H", 20) + bytes(20))],
    )


def silent() -> Conn:
    """A memcached connection that sends nothing: opened and closed."""
    return Conn(client=("10.0.0.1", 40002), msgs=[])


def captures(tmp_path: Path, n: int = 30) -> list[str]:
    """Two unrelated captures (two capture sets): the first with a TLS and a silent connection beside DCP."""
    a = write_capture(tmp_path / "a.pcap", [dcp(n, vb=0, client=50000), tls(), silent()], ts0=1_700_000_000.0)
    b = write_capture(tmp_path / "b.pcap", [dcp(n, vb=1, client=50001)], ts0=1_800_000_000.0)
    return [str(a.path), str(b.path)]


def connection_rows(page: str) -> dict[int, list[str]]:
    """The report's connections table: conn -> its cells as text."""
    section = re.search(r"<section id='connections'>(.*?)</section>", page, re.S)
    assert section is not None
    rows = {}
    for cid, body in re.findall(r"<tr id='conn-(\d+)'>(.*?)</tr>", section.group(1), re.S):
        rows[int(cid)] = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)]
    return rows


def run(spark: Any, paths: list[str], out: Path) -> tuple[dict[str, Any], str]:
    res = analyze(spark, paths, str(out), split_size=4096, partitions=2)
    return res, (out / "report.html").read_text()


def test_tls_and_silent_connections_are_listed_with_file_and_set_as_in_one_process(spark: Any, tmp_path: Path) -> None:
    paths = captures(tmp_path)
    res, page = run(spark, paths, tmp_path / "o")
    got, want = connection_rows(page), connection_rows(report_from_captures(paths))
    assert res["connections"] == len(want) == 4
    assert got == want
    by_label = {cells[3]: cells for cells in got.values()}
    tls_row = next(cells for label, cells in by_label.items() if label.endswith(f":{TLS_PORT}"))
    assert tls_row[1:3] == ["1", "a.pcap"] and "TLS" in tls_row[-1]
    silent_row = by_label["10.0.0.1:40002 -> 10.0.0.2:11210"]
    assert silent_row[1:3] == ["1", "a.pcap"] and silent_row[-1] == "no memcached frames decoded"
    # the connections table holds them too, with set and file; the others keep their columns' types
    table = pq.read_table(tmp_path / "o" / "connections")
    rows = {r["conn"]: r for r in table.to_pylist()}
    assert sorted(rows) == sorted(got)
    assert all(r["capture_set"] in (1, 2) and r["file"].endswith(".pcap") for r in rows.values())
    assert {(rows[int(c)]["capture_set"], Path(rows[int(c)]["file"]).name) for c, cells in got.items()} == {
        (int(cells[1]), cells[2]) for cells in got.values()
    }
    assert {table.schema.field(k).type for k in ("conn", "open_flags", "bytes_lost")} == {pa.int64()}  # not float64 where null


def test_a_sampled_run_of_two_sets_draws_frames_per_opcode_for_each(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = captures(tmp_path, n=40)
    monkeypatch.setattr(analysis, "_SAMPLED", 10)
    res, page = run(spark, paths, tmp_path / "o")
    assert res["frames"] > 10  # sampled
    assert "a sample of the frames table" in page
    assert "does not say which set" not in page
    for s in (1, 2):
        assert f"alt='frames per opcode, set {s}'" in page
