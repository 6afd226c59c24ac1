"""The log generator: its lines are Common Log Format the decoder reads, and its expected counts are
the truth the benchmarks verify against. No Spark."""

import datetime as dt
from collections import Counter

import pytest

from examples.log_generate import (
    MARKER,
    day_line_counts,
    expected_counts,
    generate_logs,
    iter_log_days,
    iter_log_payloads,
)
from examples.logs_decoder import parse_log_line
from transforms.ingestion.framing import iter_file_messages

LINES, DAYS = 6_000, 4


def recount(payloads) -> tuple[Counter, int]:
    """(day, status) counts of the parsed lines, and the number of markers."""
    counts: Counter = Counter()
    markers = 0
    for p in payloads:
        rec = parse_log_line(p.decode())
        if rec.is_marker:
            markers += 1
        else:
            counts[(rec.day, rec.status)] += 1
    return counts, markers


def test_every_line_parses_and_the_expected_counts_match_a_recount():
    expected: dict = {}
    payloads = list(iter_log_payloads(LINES, DAYS, expected=expected))
    counts, markers = recount(payloads)
    assert markers == DAYS
    assert sum(counts.values()) == LINES
    assert dict(counts) == expected == expected_counts(LINES, DAYS)


def test_days_follow_each_other_with_a_marker_after_each_and_time_never_goes_back():
    payloads = list(iter_log_payloads(LINES, DAYS, start="2004-03-07"))
    assert payloads[-1] == MARKER and all(p.endswith(b"\n") for p in payloads if p != MARKER)
    days, stamps, day_of_lines = [], [], set()
    for p in payloads:
        if p == MARKER:
            assert stamps == sorted(stamps) and len(day_of_lines) == 1
            days.append(day_of_lines.pop())
            stamps = []
            continue
        rec = parse_log_line(p.decode())
        assert b" -0800] " in p and rec.day == (rec.timestamp - dt.timedelta(hours=8)).date()
        stamps.append(rec.timestamp)
        day_of_lines.add(rec.day)
    assert days == [dt.date(2004, 3, 7) + dt.timedelta(days=i) for i in range(DAYS)]


def test_the_mix_is_realistic():
    records = [parse_log_line(p.decode()) for p in iter_log_payloads(20_000, 2, markers=False)]
    statuses = Counter(r.status for r in records)
    assert statuses[200] / len(records) > 0.7
    assert {304, 302, 401, 404, 500, 408} <= set(statuses)
    assert statuses[408] < statuses[500] < statuses[404]
    assert {r.method for r in records} == {"GET", "POST", "HEAD", "OPTIONS", None}
    assert all(r.method is None and r.path is None and r.bytes is None for r in records if r.status == 408)
    assert any(r.bytes is None for r in records if r.status == 304)
    assert len({r.host for r in records}) > 500
    assert len({r.path for r in records}) > 100


def test_crlf_lines_end_in_crlf_and_count_the_same():
    lf = list(iter_log_payloads(LINES, DAYS))
    crlf = list(iter_log_payloads(LINES, DAYS, crlf=True))
    assert all(p.endswith(b"\r\n") for p in crlf if p != MARKER)
    assert [p.replace(b"\r\n", b"\n") for p in crlf] == lf
    assert recount(crlf) == recount(lf)


def test_without_markers_there_are_only_lines():
    payloads = list(iter_log_payloads(LINES, DAYS, markers=False))
    assert len(payloads) == LINES and MARKER not in payloads


def test_the_same_seed_gives_the_same_bytes_and_another_seed_does_not():
    first = list(iter_log_payloads(2_000, 3, seed=7))
    assert list(iter_log_payloads(2_000, 3, seed=7)) == first
    assert list(iter_log_payloads(2_000, 3, seed=8)) != first
    assert expected_counts(2_000, 3, seed=7) != expected_counts(2_000, 3, seed=8)


@pytest.mark.parametrize("lines,days,variation", [(10_000, 7, 0.3), (100, 7, 0.0), (5, 7, 0.3), (1_000, 1, 0.3)])
def test_day_volumes_add_up(lines, days, variation):
    counts = day_line_counts(lines, days, daily_variation=variation)
    assert len(counts) == days and sum(counts) == lines
    if lines >= days:
        assert min(counts) >= 1
    if variation == 0.0:
        assert max(counts) - min(counts) <= 1
    assert [len(d.lines) for d in iter_log_days(lines, days, daily_variation=variation)] == counts


def test_one_file_with_markers_reads_back_as_the_same_messages(tmp_path):
    result = generate_logs(tmp_path / "all.log", LINES, DAYS, crlf=True)
    (path,) = result["files"]
    messages = list(iter_file_messages(path))
    assert [m.rstrip(b"\r\n") if m.startswith(MARKER) else m for m in messages] == list(
        iter_log_payloads(LINES, DAYS, crlf=True))
    assert result["lines"] == LINES and result["markers"] == DAYS and result["bytes"] == path.stat().st_size
    assert dict(recount(messages)[0]) == result["expected"] == expected_counts(LINES, DAYS)


def test_a_folder_gets_one_plain_log_file_per_day(tmp_path):
    result = generate_logs(tmp_path / "logs", LINES, DAYS, markers=True)
    assert [p.name for p in result["files"]] == [f"access-2004-03-{d:02d}.log" for d in range(7, 7 + DAYS)]
    messages = [m for p in result["files"] for m in iter_file_messages(p)]
    counts, markers = recount(messages)
    assert markers == 0 and result["markers"] == 0  # a web server's files: markers come from the sender
    assert dict(counts) == result["expected"]
    assert result["days"] == [dt.date(2004, 3, 7) + dt.timedelta(days=i) for i in range(DAYS)]
