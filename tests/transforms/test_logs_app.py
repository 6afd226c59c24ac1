"""The log application: windows per source, the summaries computed from them or from bronze.

Pure tests first (the window function on the sample logs, the encoders), then two Spark scenarios
that must give the README's summary: logs without markers landed in two runs, and all four days
concatenated in one CRLF file.
"""

import datetime as dt
import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from examples.logs import (
    FROM_BRONZE,
    FROM_WINDOWS,
    SUMMARY_TABLE,
    WINDOWS_TABLE,
    LogSourceState,
    WindowStatusCount,
    encode_count_line,
    encode_window_json,
    log_app,
    summarize_day,
    summarize_days,
    uncovered_line_count,
    window_lines,
    write_summaries,
    write_summary,
)
from examples.logs_decoder import parse_log_line
from transforms.api import Context, to_record
from transforms.ingestion.framing import iter_file_messages
from windows import WindowResult

DATA = Path(__file__).resolve().parents[2] / "data" / "wallaroo"
LOG_FILES = [DATA / "log_windowing" / f"day_{d}.log" for d in range(1, 5)]
MARKER = b"END_OF_DAY"


def expected_summary() -> list[tuple[str, int, int]]:
    """The README's daily return-code table as (day, status, count), sorted."""
    text = (DATA / "README.md").read_text()
    block = text.split("This is what Eventide's summaries must show:", 1)[1].split("```")[1]
    rows = sorted((d, int(s), int(n)) for d, s, n in re.findall(r"(\d{4}-\d\d-\d\d) (\d{3}) (\d+)", block))
    assert len(rows) == 15
    return rows


def log_messages(files=LOG_FILES, markers=True) -> list[bytes]:
    """The messages the sender sends: each line with its newline, END_OF_DAY after each file."""
    out = []
    for f in files:
        out.extend(iter_file_messages(f))
        if markers:
            out.append(MARKER)
    return out


def crlf_concatenation(tmp_path: Path) -> Path:
    path = tmp_path / "all_days_crlf.log"
    path.write_bytes(b"".join(f.read_bytes().replace(b"\n", b"\r\n") for f in LOG_FILES))
    return path


def summary_rows(tables) -> list[tuple[str, int, int]]:
    return sorted((r["day"].isoformat(), r["status"], r["count"]) for t in tables for r in t.to_pylist())


# -- pure ---------------------------------------------------------------------------------------------
def test_batch_window_function_equals_the_one_message_form_and_the_readme():
    records = [parse_log_line(m.decode()) for m in log_messages()]
    # Only the fields the step declares it reads: what the engine's columnar query carries to it.
    assert window_lines.reads == ("kind", "day", "status")
    frame = pd.DataFrame.from_records([to_record(r) for r in records])[list(window_lines.reads)]
    frame["_seq"] = range(1, len(frame) + 1)
    assert window_lines.batch and window_lines.with_context  # the fast form is the one the app runs
    batch = window_lines.fn(frame, LogSourceState(), Context("logs"))
    state, reference = LogSourceState(), window_lines.one_message()
    one_by_one = [o for seq, r in enumerate(records, 1) for o in reference.apply(r, state, Context("logs", seq=seq))]
    assert batch == one_by_one
    rows = [o for o in batch if isinstance(o, WindowStatusCount)]
    assert sorted((r.day.isoformat(), r.status, r.count) for r in rows) == expected_summary()
    windows = [o for o in batch if isinstance(o, WindowResult)]
    assert [(w.window_id, w.close_reason.value) for w in windows] == [
        ("logs/1-196", "marker"), ("logs/198-756", "marker"), ("logs/758-990", "marker"), ("logs/992-1277", "marker")]


def test_encoders_write_the_seed_lines_and_wallaroo_json():
    records = [parse_log_line(m.decode()) for m in log_messages(LOG_FILES[:1])]
    frame = pd.DataFrame.from_records([to_record(r) for r in records])
    frame["_seq"] = range(1, len(frame) + 1)
    out = window_lines.fn(frame, LogSourceState(), Context("logs"))
    lines = b"".join(encode_count_line(o) for o in out if isinstance(o, WindowStatusCount))
    assert lines == b"2004-03-07 200 147\n2004-03-07 401 48\n2004-03-07 404 1\n"
    (window,) = [o for o in out if isinstance(o, WindowResult)]
    assert encode_window_json(window) == b'{"200": 147, "401": 48, "404": 1}'
    assert json.loads(encode_window_json(window)) == {"200": 147, "401": 48, "404": 1}


# -- Spark ----------------------------------------------------------------------------------------------
def run_logs(spark, settings):
    from transforms.engine import run_application
    from transforms.streams import bronze_application

    for app in (bronze_application("logs"), log_app):
        run_application(spark, app, settings)


def summarize_all(settings, days):
    """What the summary asset does for each partition (without Dagster)."""
    summaries = [summarize_day(settings, d) for d in days]
    for s in summaries:
        write_summary(settings, s)
    return summaries


def closed_windows(settings):
    from transforms import lake

    t = lake.query("select distinct window_id, day, close_reason, first_seq, last_seq from w order by first_seq",
                   w=settings.table_path(WINDOWS_TABLE))
    return [(r["day"].isoformat(), r["close_reason"]) for r in t.to_pylist()]


@pytest.mark.spark
def test_logs_without_markers_close_by_day_change_across_runs(spark, settings):
    from tests.conftest import land
    from transforms import lake

    days = [dt.date(2004, 3, d) for d in range(7, 11)]
    land(settings, "logs", log_messages(LOG_FILES[:2], markers=False))
    run_logs(spark, settings)
    assert closed_windows(settings) == [("2004-03-07", "day_change")]  # 03-08 is still open
    land(settings, "logs", log_messages(LOG_FILES[2:], markers=False))
    run_logs(spark, settings)
    assert closed_windows(settings) == [("2004-03-07", "day_change"), ("2004-03-08", "day_change"),
                                        ("2004-03-09", "day_change")]
    assert uncovered_line_count(settings, days[-1]) == 286  # the last day never closed: no marker, no next day

    summaries = summarize_all(settings, days)
    assert [s.source for s in summaries] == [FROM_WINDOWS] * 3 + [FROM_BRONZE]
    assert summary_rows([lake.read(settings.table_path(SUMMARY_TABLE))]) == expected_summary()
    # Summarizing again writes nothing: the partitions already hold these rows.
    version = lake.version(settings.table_path(SUMMARY_TABLE))
    assert not any(write_summary(settings, s) for s in summarize_all(settings, days))
    assert lake.version(settings.table_path(SUMMARY_TABLE)) == version

    # The range form (what a run or backfill of several days does) decides each day as the one-day
    # form does, and its counts are bronze's, counted here in plain Python from delta-rs' read.
    ranged = summarize_days(settings, days)
    assert [(s.day, s.source, s.reason, s.bronze_lines, s.uncovered_lines) for s in ranged] == [
        (s.day, s.source, s.reason, s.bronze_lines, s.uncovered_lines) for s in summaries]
    assert all(r.rows.equals(s.rows) for r, s in zip(ranged, summaries))
    bronze = lake.read(settings.table_path("bronze_log_lines"), columns=["kind", "day", "status"]).to_pylist()
    for recompute in summarize_days(settings, days, recompute=True):
        plain = Counter(r["status"] for r in bronze if r["kind"] == "line" and r["day"] == recompute.day)
        assert {(r["status"], r["count"]) for r in recompute.rows.to_pylist()} == set(plain.items())
        assert recompute.bronze_lines == sum(plain.values())


@pytest.mark.spark
def test_a_range_of_changed_days_is_replaced_in_one_commit(spark, settings):
    from tests.conftest import land
    from transforms import lake

    days = [dt.date(2004, 3, d) for d in range(7, 11)]
    land(settings, "logs", log_messages(LOG_FILES))
    run_logs(spark, settings)
    path = settings.table_path(SUMMARY_TABLE)
    assert write_summaries(settings, summarize_days(settings, days[:1])) == [True]
    version = lake.version(path)
    # Day 1 holds its rows already: only the other three are replaced, in one commit.
    assert write_summaries(settings, summarize_days(settings, days)) == [False, True, True, True]
    assert lake.version(path) == version + 1
    assert summary_rows([lake.read(path)]) == expected_summary()


@pytest.mark.spark
def test_one_concatenated_crlf_file_gives_the_same_summary(spark, settings, tmp_path):
    from tests.conftest import land
    from transforms import lake

    messages = log_messages([crlf_concatenation(tmp_path)])  # one END_OF_DAY, after the whole file
    assert messages[0].endswith(b"\r\n") and messages[-1] == MARKER
    land(settings, "logs", messages)
    run_logs(spark, settings)
    assert closed_windows(settings) == [("2004-03-07", "day_change"), ("2004-03-08", "day_change"),
                                        ("2004-03-09", "day_change"), ("2004-03-10", "marker")]
    summaries = summarize_all(settings, [dt.date(2004, 3, d) for d in range(7, 11)])
    assert {s.source for s in summaries} == {FROM_WINDOWS}
    assert summary_rows(s.rows for s in summaries) == expected_summary()
    assert lake.count(settings.table_path("quarantine")) == 0


@pytest.mark.spark
@pytest.mark.parametrize("max_ranges", [256, 0], ids=["ranges as an expression", "an existence join"])
def test_bronze_counts_and_uncovered_lines_in_one_query_equal_their_definitions(spark, settings, max_ranges,
                                                                                 monkeypatch):
    """The summary's one query over bronze (counts by day and status, and lines in no closed window of
    their source: the windows' merged ranges as an expression, or an existence join when they are many)
    against the definitions computed here row by row: a line in two overlapping windows counts once,
    another source's window covers nothing, a marker is no line. The counts are remembered per bronze
    version: a new commit is read again."""
    import examples.logs
    from examples.logs import BRONZE_TABLE, bronze_counts, counts_and_uncovered
    from transforms import lake

    monkeypatch.setattr(examples.logs, "MAX_RANGES_IN_EXPRESSION", max_ranges)

    d1, d2 = dt.date(2004, 3, 7), dt.date(2004, 3, 8)
    lines = [("a", seq, "line", d1 if seq < 20 else d2, (200, 404, 500)[seq % 3]) for seq in range(30)]
    lines += [("b", seq, "line", d1, 200) for seq in range(5)] + [("a", 30, "marker", None, None)]
    bronze = "stream string, seq long, kind string, day date, status int"
    windows = [("a", 0, 9, d1, 200, 1), ("a", 5, 14, d1, 200, 1),  # overlapping ranges
               ("a", 25, 29, d2, 200, 1), ("c", 0, 100, d1, 200, 1)]  # c: no bronze lines
    for rows, schema, table in ((lines, bronze, BRONZE_TABLE),
                                (windows, "source string, first_seq long, last_seq long, day date, status int, "
                                          "count long", WINDOWS_TABLE)):
        spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(
            str(settings.table_path(table).absolute()))

    def covered(stream, seq):
        return any(src == stream and lo <= seq <= hi for src, lo, hi, *_ in windows)

    line_rows = [r for r in lines if r[2] == "line"]
    want_counts = {d: sorted(Counter(st for _, _, _, day, st in line_rows if day == d).items()) for d in (d1, d2)}
    want_uncovered = {d: sum(1 for s, q, _, day, _ in line_rows if day == d and not covered(s, q)) for d in (d1, d2)}
    counts, uncovered = counts_and_uncovered(settings, [d1, d2])
    assert uncovered == want_uncovered == {d1: 5 + 5, d2: 5}  # a: 15..19 and 20..24; b: all five
    assert {d: sorted((r["status"], r["count"]) for r in t.to_pylist()) for d, t in counts.items()} == want_counts
    assert bronze_counts(settings, [d1, d2]) == counts

    version = lake.version(settings.table_path(BRONZE_TABLE))
    spark.createDataFrame([("a", 31, "line", d2, 200)], bronze).write.format("delta").mode("append").save(
        str(settings.table_path(BRONZE_TABLE).absolute()))
    assert lake.version(settings.table_path(BRONZE_TABLE)) == version + 1
    again = bronze_counts(settings, [d1, d2])
    assert [(r["status"], r["count"]) for r in again[d2].to_pylist() if r["status"] == 200] == [
        (200, dict(want_counts[d2])[200] + 1)]


def test_merged_ranges_hold_the_same_sequence_numbers_as_the_windows():
    import random

    import pyarrow as pa

    from examples.logs import merged_ranges

    rnd = random.Random(7)
    for _ in range(200):
        windows = [(rnd.choice("ab"), lo, lo + rnd.randrange(0, 6)) for lo in (rnd.randrange(0, 40) for _ in range(rnd.randrange(1, 8)))]
        merged = merged_ranges(pa.table({"source": [w[0] for w in windows], "first_seq": [w[1] for w in windows],
                                         "last_seq": [w[2] for w in windows]}))
        for src in "abc":
            want = {q for s, lo, hi in windows if s == src for q in range(lo, hi + 1)}
            rs = merged.get(src, [])
            assert {q for lo, hi in rs for q in range(lo, hi + 1)} == want
            assert all(hi + 1 < lo for (_, hi), (lo, _) in zip(rs, rs[1:]))  # sorted, apart: none touch


@pytest.mark.spark
def test_the_ranges_expression_says_what_the_ranges_hold(spark):
    """`within_ranges_sql`'s binary search, evaluated by Spark for 60 random sets of ranges at once
    (one query: the set chosen per row), against membership computed here."""
    import random

    from examples.logs import within_ranges_sql

    rnd = random.Random(11)
    cases, rows = [], []
    for case in range(60):
        ranges, at = {}, 0
        for src in rnd.sample(["a", "b", "it's"], rnd.randrange(1, 4)):
            rs = []
            for _ in range(rnd.randrange(1, 12)):
                at += rnd.randrange(2, 5)
                rs.append((at, at + rnd.randrange(0, 4)))
                at = rs[-1][1]
            ranges[src] = rs
        cases.append(ranges)
        rows += [(case, src, q) for src in ("a", "b", "it's") for q in range(0, at + 3)]
    expr = "case " + " ".join(f"when c = {i} then {within_ranges_sql('s', 'q', r)}" for i, r in enumerate(cases)) + " end"
    got = {(r.c, r.s, r.q): r.inside for r in
           spark.createDataFrame(rows, "c int, s string, q long").selectExpr("c", "s", "q", f"{expr} as inside").collect()}
    want = {(c, s, q): any(lo <= q <= hi for lo, hi in cases[c].get(s, [])) for c, s, q in rows}
    assert got == want and sum(want.values()) > 100
