"""Bronze tables from landed streams: exact decoding, markers, quarantine."""

import json
import struct
from collections import Counter

import pandas as pd
import pytest

from tests.conftest import DATA, land
from transforms import lake
from transforms.engine import run_application
from transforms.ingestion.framing import iter_file_messages
from transforms.ingestion.landing import Lander
from transforms.streams import bronze_application

pytestmark = pytest.mark.spark

EXPECTED_STATUS = {  # ../shared/data/wallaroo/README.md
    "2004-03-07": {200: 147, 401: 48, 404: 1},
    "2004-03-08": {200: 478, 304: 12, 401: 67, 404: 2},
    "2004-03-09": {200: 205, 302: 3, 304: 22, 401: 2, 408: 1},
    "2004-03-10": {200: 205, 302: 2, 304: 79},
}


def test_bronze_log_lines_for_the_four_sample_days(spark, settings):
    with Lander(settings) as lander:
        for day in range(1, 5):
            for msg in iter_file_messages(DATA / "log_windowing" / f"day_{day}.log"):
                lander.append("logs", msg, f"file:day_{day}.log")
            lander.append("logs", b"END_OF_DAY\r\n", f"file:day_{day}.log")  # trailing CR/LF ignored
        lander.append("logs", b"this is not a log line\n", "file:bad")
        lander.append("logs", b"partial", "tcp:x", error="connection closed inside a frame")
    (report,) = run_application(spark, bronze_application("logs"), settings)
    bronze = lake.read(settings.table_path("bronze_log_lines")).to_pandas()
    lines = bronze[bronze.kind == "line"]
    assert len(lines) == 1274 and (bronze.kind == "marker").sum() == 4
    got = {str(day): dict(Counter(g.status)) for day, g in lines.groupby("day")}
    assert got == EXPECTED_STATUS
    # Every row keeps its landing metadata; sequences are unique.
    assert bronze.seq.is_unique and bronze.connection.str.startswith("file:day_").all()
    assert bronze.receive_time.notna().all()
    first = lines.sort_values("seq").iloc[0]
    assert (first.host, first.method, first.status, first.bytes) == ("64.242.88.10", "GET", 401, 12846)
    assert str(first.timestamp) == "2004-03-08 00:05:49+00:00"  # 16:05:49 -0800 in UTC; day stays as written
    assert str(first.day) == "2004-03-07"
    dash = lines[lines.status == 408].iloc[0]
    assert dash.method is None and dash.path is None and pd.isna(dash.bytes)
    quarantine = lake.read(settings.table_path("quarantine")).to_pandas().sort_values("seq")
    assert list(quarantine.step) == ["decoder decode_log_line", "gateway"]
    assert quarantine.reason.iloc[0].startswith("log line: expected a Common Log Format line")
    assert list(quarantine.payload) == [b"this is not a log line\n", b"partial"]
    assert report.input_rows == 1274 + 4 + 2
    # Delta keeps file statistics on the landing metadata and the decoded fields that are not text.
    log = sorted((settings.table_path("bronze_log_lines") / "_delta_log").glob("*.json"))
    actions = [json.loads(line) for f in log for line in f.read_text().splitlines()]
    (meta,) = [a["metaData"] for a in actions if "metaData" in a]
    stats_columns = ["stream", "seq", "receive_time", "timestamp", "day", "status", "bytes"]
    assert meta["configuration"]["delta.dataSkippingStatsColumns"] == ",".join(stats_columns)
    stats = [json.loads(a["add"]["stats"]) for a in actions if "add" in a]
    assert stats and all(sorted(s["minValues"]) == sorted(stats_columns) for s in stats), stats


def test_bronze_market_data_decodes_the_350_messages_exactly(spark, settings):
    payloads = list(iter_file_messages(DATA / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"))
    land(settings, "market_data", payloads)
    run_application(spark, bronze_application("market_data"), settings)
    rows = {r["seq"]: r for r in lake.read(settings.table_path("bronze_market_data")).to_pylist()}
    assert len(rows) == 350
    for seq, p in enumerate(payloads, start=1):
        _, sym, t, bid, offer = struct.unpack(">B4s21sdd", p)
        r = rows[seq]
        assert (r["symbol"], r["bid"], r["offer"]) == (sym.decode().strip(), bid, offer)
        assert r["transact_time"].strftime("%Y%m%d-%H:%M:%S.%f")[:-3] == t.decode()
    symbols = (DATA / "market_spread" / "symbols.txt").read_text().split()
    assert sorted(r["symbol"] for r in rows.values()) == sorted(symbols)


def test_a_micro_batch_is_bounded_by_landing_bytes_not_segments(spark, settings, tmp_path):
    """Six small segments make one micro-batch by default; a byte bound of about two segments cuts
    the same run into three batches, and the table is the same."""
    import dataclasses
    import shutil

    lines = [msg for day in (1, 2) for msg in iter_file_messages(DATA / "log_windowing" / f"day_{day}.log")]
    for i in range(6):
        land(settings, "logs", lines[i * 100 : (i + 1) * 100])
    segments = sorted(p for p in (settings.landing / "logs").rglob("*.parquet"))
    assert len(segments) == 6
    bounded = dataclasses.replace(settings, home=tmp_path / "bounded",
                                  max_bytes_per_trigger=int(max(p.stat().st_size for p in segments) * 2.5))
    shutil.copytree(settings.landing, bounded.landing)
    rows = []
    for s, batches in ((settings, 1), (bounded, 3)):
        (report,) = run_application(spark, bronze_application("logs"), s)
        assert (report.batches, report.input_rows) == (batches, 600)
        rows.append(lake.read(s.table_path("bronze_log_lines")).sort_by("seq"))  # the same landing, copied
    assert rows[0].equals(rows[1])
