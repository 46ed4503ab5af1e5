"""One JSON-lines writer and one text writer: the same line for a frame whether it comes from a capture's table or a live record."""

from __future__ import annotations

import io
import json
import random

import pandas as pd
from paths import CAPTURES

from dcpinspect import encode
from dcpinspect.capture.read import read_records
from dcpinspect.cli.output import JSON_COLUMNS, TEXT_COLUMNS, Clock, RecordPrinter, json_line, record_lines, text_line
from dcpinspect.live.tap import LiveCapture
from dcpinspect.tables.export import frame_rows, frames_table


def test_json_time_is_what_the_arrow_table_gives() -> None:
    """``ts`` (integer ns) becomes the seconds pandas' Timestamp gives for it: ``frames --json`` printed those before."""
    rnd = random.Random(13)
    values = [0, 1, 999, 1_700_000_000_123_456_500, 1_700_000_000_123_456_499, 2**63 - 1]
    values += [rnd.randrange(0, 2**63) for _ in range(3000)] + [rnd.randrange(10**18, 2 * 10**18) for _ in range(3000)]
    row = dict.fromkeys(JSON_COLUMNS)
    for ns in values:
        row["ts"] = ns
        assert json.loads(json_line(row))["ts"] == pd.Timestamp(ns, tz="UTC").timestamp(), ns
    row["ts"] = None
    assert json.loads(json_line(row))["ts"] is None


def test_live_records_print_as_the_capture_table_does() -> None:
    """Rows built from records (proxy, sniff, client) and rows of the vectorised frames table (``frames``) give the same lines."""
    for path in [CAPTURES / "messy.pcap", CAPTURES / "live-plain.pcap"]:
        records = list(read_records([str(path)]))
        table = frames_table(path)
        assert table.num_rows == len(records) > 0
        assert record_lines(records, as_json=True) == [json_line(r) for r in frame_rows(table, JSON_COLUMNS)]
        assert record_lines(records, as_json=False) == [text_line(r) for r in frame_rows(table, TEXT_COLUMNS)]


def test_the_text_line() -> None:
    cap = LiveCapture()
    conn = cap.connection(("127.0.0.1", 40000), ("127.0.0.1", 11210), ts=1_000)
    conn.data("c2s", encode("GET", key="k\x1b[2J", opaque=7, vbucket=3), ts=2_000)
    conn.data("s2c", encode("GET", response=True, status=1, opaque=7), ts=3_000)
    conn.skip("s2c", 100)
    conn.data("s2c", encode("NOOP", response=True, opaque=8), ts=4_000)
    cap.close()
    assert record_lines(cap.records, as_json=False) == [
        "      1 pkt 4 conn 1 c2s GET request vb=3 opaque=0x00000007 key='k\\x1b[2J'",
        "      2 pkt 5 conn 1 s2c GET response KeyEnoent opaque=0x00000007",
        "      3 pkt 6 conn 1 s2c gap 100 bytes [100 bytes missing from the capture]",
        "      4 pkt 6 conn 1 s2c NOOP response Success opaque=0x00000008",
    ]
    # the live tools' printers: time relative to the first record
    assert record_lines(cap.records, as_json=False, clock=Clock("r")) == [
        "      1   0.000000 pkt 4 conn 1 c2s GET request vb=3 opaque=0x00000007 key='k\\x1b[2J'",
        "      2   0.000001 pkt 5 conn 1 s2c GET response KeyEnoent opaque=0x00000007",
        "      3   0.000002 pkt 6 conn 1 s2c gap 100 bytes [100 bytes missing from the capture]",
        "      4   0.000002 pkt 6 conn 1 s2c NOOP response Success opaque=0x00000008",
    ]
    out = io.StringIO()
    printer = RecordPrinter(out, as_json=False)
    for rec in cap.records:
        printer.add(rec)
    assert printer.close()
    assert out.getvalue().splitlines()[3] == "      4   0.000002 pkt 6 conn 1 s2c NOOP response Success opaque=0x00000008"
    rows = [json.loads(line) for line in record_lines(cap.records, as_json=True)]
    assert [tuple(r) for r in rows] == [JSON_COLUMNS] * 4
    # the gap's time is when the bytes after it came
    assert [(r["name"], r["status"], r["ts"]) for r in rows] == [
        ("GET", None, 2e-6),
        ("GET", 1, 3e-6),
        (None, None, 4e-6),
        ("NOOP", 0, 4e-6),
    ]
