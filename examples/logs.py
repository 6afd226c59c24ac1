"""The log application: return-code counts per window of a log source, and the daily summaries.

Wallaroo's log example, written with the public API: each source's lines form one window at a time,
closed by an `END_OF_DAY` marker, by the first line of a new day (logs without markers, or two days
between markers, still give one window per day) or by a count limit. A closed window yields its
counts by (day, status):

- `log_windows` (Delta, append, exactly once): one row per (window, day, status) with how the
  window closed and the sequence range it covers. Days with lines in a still open window are not
  complete there yet;
- TCP `log_counts`: the seed's format, a line `2004-03-07 200 147` per (day, status);
- TCP `log_windows_json`: Wallaroo's output, one framed JSON object per window `{"200": 147, ...}`.

The second half of the module computes a day's summary (day, status, count) from `log_windows` or
from `bronze_log_lines` (the recompute), used by the Dagster wiring in `examples/logs_assets.py`.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections import Counter
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from examples.logs_decoder import LogRecord, decode_log_line
from transforms import lake
from transforms.api import Application, DeltaSink, TCPSink, encoder, source
from transforms.settings import Settings
from transforms.windowing import field_is, trigger_windows
from windows import Aggregator, TriggerState, WindowResult

SOURCE = "logs"  # the stream, and the key: one window at a time per source
WINDOWS_TABLE = "log_windows"
SUMMARY_TABLE = "daily_return_code_summary"
BRONZE_TABLE = "bronze_log_lines"
MAX_LINES_PER_WINDOW: int | None = None  # the count trigger; off: a day's counts are small state


# -- windows ----------------------------------------------------------------------------------------
def _add_line(acc: Counter, rec: LogRecord) -> Counter:
    acc[(rec.day, int(rec.status))] += 1
    return acc


def _add_lines(acc: Counter, frame: pd.DataFrame) -> Counter:
    for (day, status), n in frame.groupby(["day", "status"], sort=False).size().items():
        acc[(day, int(status))] += int(n)
    return acc


def _merge_counts(acc: Counter, other: Counter) -> Counter:
    acc.update(other)
    return acc


# Counts by (day, status); `add_frame` folds a micro-batch's lines at once (the batch form), and `merge`
# lets the engine fold runs of lines where it decodes them, on every core (Settings.prefold).
STATUS_COUNTS = Aggregator(create=Counter, add=_add_line, add_frame=_add_lines, merge=_merge_counts,
                           columns=("day", "status"))


class LogSourceState(TriggerState):
    """A source's open window (its counts by (day, status) so far)."""


@dataclass(frozen=True)
class WindowStatusCount:
    """One row of `log_windows`."""

    window_id: str
    source: str
    day: dt.date
    status: int
    count: int
    close_reason: str
    first_seq: int
    last_seq: int


def window_rows(w: WindowResult) -> list[WindowStatusCount]:
    return [
        WindowStatusCount(w.window_id, w.key, day, status, n, w.close_reason.value, w.first_seq, w.last_seq)
        for (day, status), n in sorted(w.value.items())
    ]


def window_outputs(w: WindowResult) -> list:
    """Per closed window: its rows (table and line sink), then the window itself (JSON sink)."""
    return [*window_rows(w), w]


# The window step: field names (not lambdas) let it fold each micro-batch as one DataFrame.
window_lines = (
    trigger_windows(is_marker=field_is("kind", "marker"), boundary="day", max_count=MAX_LINES_PER_WINDOW)
    .over(STATUS_COUNTS, name="window log lines", state=LogSourceState)
    .emit(window_outputs)
)
LOG_WINDOWS = window_lines.window  # the windows.TriggerWindows definition


# -- sinks ------------------------------------------------------------------------------------------
@encoder
def encode_count_line(row: WindowStatusCount) -> bytes:
    return f"{row.day.isoformat()} {row.status} {row.count}\n".encode()


@encoder
def encode_window_json(w: WindowResult) -> bytes:
    by_status: Counter = Counter()
    for (_day, status), n in w.value.items():
        by_status[status] += n
    return json.dumps({str(s): by_status[s] for s in sorted(by_status)}).encode()


LOG_WINDOWS_SCHEMA = pa.schema(
    [
        ("window_id", pa.string()),
        ("source", pa.string()),
        ("day", pa.date32()),
        ("status", pa.int32()),
        ("count", pa.int64()),
        ("close_reason", pa.string()),
        ("first_seq", pa.int64()),
        ("last_seq", pa.int64()),
    ]
)

log_app = Application(
    "logs",
    source(SOURCE, decoder=decode_log_line, port=7101, bronze_table=BRONZE_TABLE)
    .key_by("stream")  # one window at a time per source (the stream)
    .to(window_lines)
    .to_sink(
        # Windows close about once a day (a marker or a day change): stale after a day and its grace, not the hour.
        DeltaSink(WINDOWS_TABLE, schema=LOG_WINDOWS_SCHEMA, accepts=WindowStatusCount, freshness_minutes=30 * 60),
        TCPSink("log_counts", encode_count_line, accepts=WindowStatusCount, optional=True),
        TCPSink("log_windows_json", encode_window_json, framed=True, accepts=WindowResult, optional=True),
    ),
    description="Return-code counts per log window (closed by END_OF_DAY, a new day or a count)",
    # The daily summaries, their checks and their Declarative Automation (Dagster wiring only).
    dagster_defs="examples.logs_assets:defs",
)
app = log_app  # the entry registered by default: examples.logs:app


# -- daily summaries (delta-rs only: no JVM) --------------------------------------------------------
SUMMARY_SCHEMA = pa.schema([("day", pa.date32()), ("status", pa.int32()), ("count", pa.int64())])
FROM_WINDOWS = "log_windows"
FROM_BRONZE = "bronze_log_lines"


@dataclass(frozen=True)
class DaySummary:
    day: dt.date
    rows: pa.Table  # SUMMARY_SCHEMA, sorted by status
    source: str  # FROM_WINDOWS or FROM_BRONZE
    reason: str  # why that source
    bronze_lines: int
    uncovered_lines: int  # bronze lines of the day in no closed window

    @property
    def total(self) -> int:
        return sum(self.rows.column("count").to_pylist())


def parse_day(day: str | dt.date) -> dt.date:
    return day if isinstance(day, dt.date) else dt.date.fromisoformat(day)


def _day_sql(day: dt.date) -> str:
    return f"day = '{day.isoformat()}'"  # a date object's isoformat: nothing to escape


def _days_sql(days: list[dt.date]) -> str:
    return _day_sql(days[0]) if len(days) == 1 else f"day IN ({', '.join(repr(d.isoformat()) for d in days)})"


def _as_summary(table: pa.Table) -> pa.Table:
    return table.select(SUMMARY_SCHEMA.names).cast(SUMMARY_SCHEMA) if table.num_rows else SUMMARY_SCHEMA.empty_table()


def _by_day(table: pa.Table, days: list[dt.date]) -> dict[dt.date, pa.Table]:
    """A summary table of several days split into one table per day (sorted by status; empty: none)."""
    table = _as_summary(table).sort_by([("day", "ascending"), ("status", "ascending")])
    column = table.column("day").to_pylist()
    return {d: table.filter(pa.array([c == d for c in column], pa.bool_())) for d in days}


def _spark(settings: Settings):
    from transforms.spark import get_spark

    return get_spark(settings)


def _table(settings: Settings, name: str, version: int | None = None):
    """A Delta table as Spark reads it (a filter on `day` skips the files whose statistics rule it out);
    at `version` if given, else its latest."""
    reader = _spark(settings).read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(str(settings.table_path(name).absolute()))


def _in_days(days: list[dt.date]):
    from pyspark.sql import functions as F

    return F.col("day").isin(list(days))


def _bronze_lines(settings: Settings, days: list[dt.date], version: int | None = None):
    from pyspark.sql import functions as F

    return _table(settings, BRONZE_TABLE, version).where((F.col("kind") == "line") & _in_days(days))


# Bronze's counts by (table, Delta version, days): a version never changes, so the summary's recompute
# and its checks' (one run, the same bronze) share one Spark query over bronze instead of three.
_BRONZE_COUNTS: dict[tuple, dict[dt.date, pa.Table]] = {}
_BRONZE_COUNTS_KEPT = 8
_BRONZE_COUNTS_LOCK = threading.Lock()  # `eventide serve` runs its follow-ups on threads of its own


def _bronze_counts_key(settings: Settings, days: list[dt.date]) -> tuple | None:
    path = settings.table_path(BRONZE_TABLE)
    version = lake.version(path) if days else None
    return None if version is None else (str(path.absolute()), version, tuple(days))


def _remember(key: tuple, counts: dict[dt.date, pa.Table]) -> dict[dt.date, pa.Table]:
    with _BRONZE_COUNTS_LOCK:
        while len(_BRONZE_COUNTS) >= _BRONZE_COUNTS_KEPT:
            _BRONZE_COUNTS.pop(next(iter(_BRONZE_COUNTS)))
        _BRONZE_COUNTS[key] = counts
    return dict(counts)


def _remembered(key: tuple) -> dict[dt.date, pa.Table] | None:
    with _BRONZE_COUNTS_LOCK:
        counts = _BRONZE_COUNTS.get(key)
    return None if counts is None else dict(counts)


def bronze_counts(settings: Settings, days: list[dt.date]) -> dict[dt.date, pa.Table]:
    """The recompute, for several days in one Spark query: every decoded line of each day in bronze,
    counted by status (an empty table for a day without lines). Read at bronze's latest version, and
    remembered for that version."""
    from pyspark.sql import functions as F

    days = [parse_day(d) for d in days]
    key = _bronze_counts_key(settings, days)
    if key is None:
        return {d: SUMMARY_SCHEMA.empty_table() for d in days}
    remembered = _remembered(key)
    if remembered is not None:
        return remembered
    counted = _bronze_lines(settings, days, key[1]).groupBy("day", "status").agg(F.count(F.lit(1)).alias("count"))
    return _remember(key, _by_day(counted.toArrow(), days))


def _closed_windows(settings: Settings, columns: list[str], days: list[dt.date] | None = None) -> pa.Table | None:
    """The windows table's `columns` (of `days`' windows if given), or None when there is no table.
    Read through delta-rs, as the checks read small tables: one row per closed window and status, where
    Spark's first read of a Delta table in a run rebuilds its log state in jobs of its own (measured, the
    summary's queries over 1M lines cold: 11.1-12.6 s against 14.7-16.1 s; warm 1.7 against 2.8-3.2 s)."""
    path = settings.table_path(WINDOWS_TABLE)
    if not lake.exists(path):
        return None
    return lake.read(path, where=_days_sql(days) if days else None, columns=columns)


def window_counts(settings: Settings, days: list[dt.date]) -> dict[dt.date, pa.Table]:
    """Each day's counts summed over its closed windows, for several days at once."""
    days = [parse_day(d) for d in days]
    windows = _closed_windows(settings, ["day", "status", "count"], days) if days else None
    if windows is None:
        return {d: SUMMARY_SCHEMA.empty_table() for d in days}
    summed = windows.group_by(["day", "status"]).aggregate([("count", "sum")])
    return _by_day(summed.rename_columns([{"count_sum": "count"}.get(n, n) for n in summed.column_names]), days)


# Closed windows' sequence ranges as one expression up to this many merged ranges; more go through a join.
MAX_RANGES_IN_EXPRESSION = 256


def merged_ranges(windows: pa.Table) -> dict[str, list[tuple[int, int]]]:
    """Each source's closed windows' [first_seq, last_seq] ranges merged where they overlap or touch
    (sequence numbers are integers), sorted: a seq lies in one of them iff it lies in some window's."""
    by_source: dict[str, list[tuple[int, int]]] = {}
    for src, first, last in zip(*(windows.column(c).to_pylist() for c in ("source", "first_seq", "last_seq"))):
        by_source.setdefault(src, []).append((first, last))
    merged = {}
    for src, ranges in by_source.items():
        out: list[list[int]] = []
        for first, last in sorted(ranges):
            if out and first <= out[-1][1] + 1:
                out[-1][1] = max(out[-1][1], last)
            else:
                out.append([first, last])
        merged[src] = [(a, b) for a, b in out]
    return merged


def within_ranges_sql(source_col: str, seq_col: str, ranges: dict[str, list[tuple[int, int]]]) -> str:
    """A SQL condition: `seq_col` lies in one of its source's sorted, disjoint `ranges`. A binary search
    written out as nested CASEs (a few comparisons a row), where the existence join it replaces matched
    each line against every window of its source (1.5 s of a cold 1M run's summary)."""
    def search(rs: list[tuple[int, int]]) -> str:
        if len(rs) == 1:
            return f"{seq_col} between {rs[0][0]} and {rs[0][1]}"
        mid = len(rs) // 2
        return f"case when {seq_col} < {rs[mid][0]} then {search(rs[:mid])} else {search(rs[mid:])} end"

    def quoted(s: str) -> str:
        return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return "(" + " or ".join(f"({source_col} = {quoted(src)} and {search(rs)})" for src, rs in sorted(ranges.items())) + ")"


def counts_and_uncovered(settings: Settings, days: list[dt.date]) -> tuple[dict[dt.date, pa.Table], dict[dt.date, int]]:
    """`bronze_counts` and, per day, the bronze lines whose sequence number lies in no closed window of
    their source, in one Spark query over bronze (a line in two windows' ranges still counts once: the
    ranges are merged, or joined by existence when they are many). The counts are remembered as
    `bronze_counts` remembers them."""
    days = [parse_day(d) for d in days]
    key = _bronze_counts_key(settings, days)
    if key is None:
        return {d: SUMMARY_SCHEMA.empty_table() for d in days}, dict.fromkeys(days, 0)
    lines = _bronze_lines(settings, days, key[1])
    windows = _closed_windows(settings, ["source", "first_seq", "last_seq"])  # every day's: coverage is by seq
    covered, tables = "false", {"b": lines}
    if windows is not None and windows.num_rows:
        ranges = merged_ranges(windows)
        if sum(len(r) for r in ranges.values()) <= MAX_RANGES_IN_EXPRESSION:
            covered = within_ranges_sql("b.stream", "b.seq", ranges)
        else:  # the same answer as a join (Spark's codegen would choke on an expression that large)
            covered = ("exists(select 1 from {w} as w where w.source = b.stream "
                       "and b.seq between w.first_seq and w.last_seq)")
            tables["w"] = _spark(settings).createDataFrame(windows)
    rows = _spark(settings).sql(
        f"select day, status, count(*) as count, count_if(not covered) as uncovered "
        f"from (select day, status, {covered} as covered from {{b}} as b) group by day, status", **tables).toArrow()
    uncovered = dict.fromkeys(days, 0)
    for day, n in zip(rows.column("day").to_pylist(), rows.column("uncovered").to_pylist()):
        uncovered[day] += n
    return _remember(key, _by_day(rows.drop_columns(["uncovered"]), days)), uncovered


def uncovered_line_counts(settings: Settings, days: list[dt.date]) -> dict[dt.date, int]:
    """Per day, the bronze lines whose sequence number lies in no closed window of their source (one
    Spark query for all the days)."""
    return counts_and_uncovered(settings, days)[1]


def uncovered_line_count(settings: Settings, day: str | dt.date) -> int:
    return uncovered_line_counts(settings, [parse_day(day)])[parse_day(day)]


def line_total(rows: pa.Table) -> int:
    """The lines a summary table counts."""
    return sum(rows.column("count").to_pylist())


def summarize_days(settings: Settings, days: list[str | dt.date], recompute: bool = False) -> list[DaySummary]:
    """Each day's summary, as `summarize_day` decides it, for a whole range in one Spark query (bronze's
    counts with its uncovered lines) and one read of the small windows table, instead of three or four
    queries per day."""
    days = [parse_day(d) for d in days]
    bronze, uncovered = counts_and_uncovered(settings, days)
    if recompute:
        return [DaySummary(d, bronze[d], FROM_BRONZE, "recompute requested (backfill)", line_total(bronze[d]), uncovered[d])
                for d in days]
    windows = window_counts(settings, days)
    return [_decide(d, windows[d], bronze[d], uncovered[d]) for d in days]


def _decide(day: dt.date, windows: pa.Table, bronze: pa.Table, uncovered: int) -> DaySummary:
    """Day D's summary. From `log_windows` when closed windows cover every bronze line of D;
    otherwise (no closed window yet, or lines of D still in an open window or not yet through the
    app) recomputed from bronze, which holds every decoded line of D."""
    lines = line_total(bronze)
    if not windows.num_rows:
        return DaySummary(day, bronze, FROM_BRONZE, "no closed window for the day", lines, lines)
    if uncovered:
        return DaySummary(day, bronze, FROM_BRONZE, f"{uncovered} line(s) of the day are not in a closed window yet",
                          lines, uncovered)
    return DaySummary(day, windows, FROM_WINDOWS, "closed windows cover every line of the day", lines, 0)


def summarize_day(settings: Settings, day: str | dt.date, recompute: bool = False) -> DaySummary:
    """Day D's summary (see `_decide`; a backfill's `recompute` counts bronze whatever the windows say)."""
    return summarize_days(settings, [day], recompute)[0]


def stored_summaries(settings: Settings, days: list[str | dt.date]) -> dict[dt.date, pa.Table]:
    """The summary table's rows of each day, sorted by status (one read, no JVM)."""
    days = [parse_day(d) for d in days]
    path = settings.table_path(SUMMARY_TABLE)
    if not days or not lake.exists(path):
        return {d: SUMMARY_SCHEMA.empty_table() for d in days}
    return _by_day(lake.read(path, where=_days_sql(days)), days)


def stored_summary(settings: Settings, day: str | dt.date) -> pa.Table:
    return stored_summaries(settings, [day])[parse_day(day)]


def write_summaries(settings: Settings, summaries: list[DaySummary]) -> list[bool]:
    """Replace the partitions of the days whose stored rows differ, atomically in one commit; for each
    summary, whether its day was replaced (False: it already held these rows, nothing written)."""
    stored = stored_summaries(settings, [s.day for s in summaries])
    changed = [s for s in summaries if not stored[s.day].equals(s.rows)]
    if changed:
        rows = _spark(settings).createDataFrame(pa.concat_tables([s.rows for s in changed]))
        lake.replace_where(rows, settings.table_path(SUMMARY_TABLE), _days_sql([s.day for s in changed]),
                           partition_by=["day"])
    replaced = {s.day for s in changed}
    return [s.day in replaced for s in summaries]


def write_summary(settings: Settings, summary: DaySummary) -> bool:
    """Replace the day's partition atomically; False (no commit) if it already holds these rows."""
    return write_summaries(settings, [summary])[0]


# -- which days need a summary ----------------------------------------------------------------------
def day_end_utc(day: dt.date) -> dt.datetime:
    """The latest instant a calendar day as written can end: midnight at UTC-12, the westernmost zone.
    (Lines carry their own zone; bronze keeps the written day and the UTC instant, not the offset.)"""
    return dt.datetime.combine(day + dt.timedelta(days=1), dt.time(12), tzinfo=dt.timezone.utc)


def is_day_over(day: dt.date, grace_hours: float, now: dt.datetime) -> bool:
    return day_end_utc(day) + dt.timedelta(hours=grace_hours) <= now
