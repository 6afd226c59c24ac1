"""Log app benchmark: generated Apache logs landed, then `eventide run` through Dagster until
`daily_return_code_summary` holds every day, verified against the generator's counts.

Next to it, on the same data: a pure-Python single-process loop over the same landed segments
(parse each line, count (day, status)), and DuckDB computing the summary in batch from the raw log
files (what a user could do instead). And the time to backfill one day as the history grows,
which should not depend on the history.

    python -m bench.logs [--sizes 1000000,4000000] [--days 30] [--histories 10,40,160]
                         [--lines-per-day 5000] [--max-minutes 15] [--no-stage-profile]
                         [--max-files-per-trigger N]

Prints JSON on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.processes import load_average
from examples.log_generate import START_DAY, generate_logs, iter_log_days
from examples.logs_decoder import parse_log_line
from transforms import lake
from transforms.ingestion.landing import Lander, list_segments
from transforms.settings import Settings

SIZES = (1_000_000, 4_000_000)
DAYS = 30
HISTORIES = (10, 40, 160)
RANGE_DAYS = 30  # the backfill of a range: one run against a run per day
LINES_PER_DAY = 5_000
MAX_MINUTES = 15.0  # a size whose extrapolated engine time exceeds this is skipped, not run
STAGE_PROFILE_LINES = 100_000
SEED = 1
CLF_REGEX = r'^(\S+) (\S+) (\S+) \[([^\]]+)\] "([^"]*)" (\d{3}) (\d+|-)\r?$'  # logs_decoder's, for DuckDB

_t0 = time.perf_counter()


def progress(msg: str) -> None:
    print(f"[bench.logs {time.perf_counter() - _t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _rate(lines: int, seconds: float) -> int:
    return round(lines / seconds) if seconds > 0 else 0


@contextlib.contextmanager
def _home(prefix: str) -> Iterator[Settings]:
    """A fresh EVENTIDE_HOME (the environment agrees: Dagster resources read it), removed after."""
    path = Path(tempfile.mkdtemp(prefix=f"eventide-bench-{prefix}-"))
    saved = os.environ.get("EVENTIDE_HOME")
    os.environ["EVENTIDE_HOME"] = str(path)
    try:
        yield Settings.from_env()
    finally:
        if saved is None:
            os.environ.pop("EVENTIDE_HOME", None)
        else:
            os.environ["EVENTIDE_HOME"] = saved
        shutil.rmtree(path, ignore_errors=True)


# -- landing ----------------------------------------------------------------------------------------
def land_logs(settings: Settings, lines: int, days: int, seed: int = SEED, start: str = START_DAY,
              daily_variation: float = 0.3) -> tuple[dict, float]:
    """Land the generated messages (lines, END_OF_DAY after each day) as the gateway would.
    Returns the expected (day, status) counts and the seconds spent in the Lander only (generation
    of each day happens before its timed landing loop)."""
    expected: dict = {}
    landing_s = 0.0
    landed = 0
    next_report = 500_000
    marker = settings.marker.encode()
    started = time.perf_counter()
    lander = Lander(settings)
    landing_s += time.perf_counter() - started
    try:
        for log_day in iter_log_days(lines, days, seed, start=start, daily_variation=daily_variation):
            payloads = [line.encode() for line in log_day.lines]
            payloads.append(marker)
            started = time.perf_counter()
            for p in payloads:
                lander.append("logs", p, "bench")
            landing_s += time.perf_counter() - started
            for status, count in log_day.status_counts.items():
                expected[(log_day.day, status)] = count
            landed += len(log_day.lines)
            if landed >= next_report:
                progress(f"  landed {landed:,} of {lines:,} lines")
                next_report += 500_000
    finally:
        started = time.perf_counter()
        lander.close()  # closes the open segment: part of landing
        landing_s += time.perf_counter() - started
    return expected, landing_s


# -- the real path: `eventide run` --------------------------------------------------------------------
@contextlib.contextmanager
def _query_timer(queries: list[dict]) -> Iterator[None]:
    """Record every engine query `run_all` runs (name, seconds, input rows, batches).

    Wraps transforms.engine.runner.run_query, which run_application looks up at call time."""
    import transforms.engine.runner as engine

    original = engine.run_query

    def timed_run_query(spark, plan, settings, *args, **kwargs):
        started = time.perf_counter()
        report = original(spark, plan, settings, *args, **kwargs)
        queries.append({"query": plan.name, "seconds": round(time.perf_counter() - started, 3),
                        "input_rows": report.input_rows, "batches": report.batches})
        return report

    engine.run_query = timed_run_query
    try:
        yield
    finally:
        engine.run_query = original


def timed_run_all(settings: Settings, spark_progress: SparkProgress | None = None, summaries: bool = True) -> dict:
    """`eventide run` (orchestration.runner.run_all) with its phases timed: the pipelines job (each
    engine query, the rest is Dagster and empty-stream overhead) and the daily summary runs."""
    from orchestration.runner import run_all

    marks: dict[str, float] = {}

    def on_progress(msg: str) -> None:
        if msg.startswith("asking the apps"):  # run_all's second phase: the daily summaries
            marks["summaries_start"] = time.perf_counter()
        progress(f"  run: {msg.strip()}")

    queries: list[dict] = []
    batches_before = len(spark_progress.batches) if spark_progress else 0
    started = time.perf_counter()
    with _query_timer(queries):
        summary = run_all(settings, progress=on_progress, summaries=summaries)
    ended = time.perf_counter()
    summaries_start = marks.get("summaries_start", ended)
    if not summary.ok:
        raise RuntimeError(f"eventide run failed: {summary.failures}")
    failed_checks = [c for c in summary.checks if not c[2]]
    if failed_checks:
        raise RuntimeError(f"eventide run: checks failed: {failed_checks}")
    pipelines_s = summaries_start - started
    if spark_progress:
        spark_ms = spark_progress.durations(batches_before)
        for q in queries:
            q["spark_duration_ms"] = spark_ms.get(q["query"].replace(".", "_"), {})
    by_query = {q["query"]: q for q in queries}
    summary_days = [k for k in summary.materialized if k.startswith("daily_return_code_summary[")]
    return {
        "total_s": round(ended - started, 3),
        "pipelines_job_s": round(pipelines_s, 3),
        "queries": queries,
        "bronze_logs_query_s": by_query.get("bronze_logs", {}).get("seconds"),
        "logs_app_query_s": by_query.get("logs", {}).get("seconds"),
        "other_queries_s": round(sum(q["seconds"] for q in queries if q["query"] not in ("bronze_logs", "logs")), 3),
        "dagster_overhead_in_pipelines_s": round(pipelines_s - sum(q["seconds"] for q in queries), 3),
        "summaries_s": round(ended - summaries_start, 3),
        "summary_days": len(summary_days),
        "summary_sources": dict(Counter(summary.materialized[k].get("source") for k in summary_days)),
        "checks_passed": sum(1 for c in summary.checks if c[2]),
    }


def stored_summary_counts(settings: Settings) -> dict:
    from examples.logs import SUMMARY_TABLE

    path = settings.table_path(SUMMARY_TABLE)
    if not lake.exists(path):
        return {}
    return {(r["day"], r["status"]): r["count"] for r in lake.read(path).to_pylist()}


def _mismatch(what: str, got: dict, expected: dict) -> str | None:
    if got == expected:
        return None
    wrong = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
    sample = [(str(d), s, got.get((d, s)), expected.get((d, s))) for d, s in wrong[:5]]
    return f"{what}: {len(wrong)} (day, status) counts differ, e.g. (day, status, got, expected) {sample}"


class SparkProgress:
    """Every micro-batch's progress report (durationMs: getBatch, queryPlanning, addBatch = running the
    batch through the workers and the foreachBatch writer, walCommit, ...), via a query listener."""

    def __init__(self) -> None:
        self.batches: list[dict] = []
        self.error: str | None = None
        self.warmup_s: float | None = None
        self.log_path: Path | None = None  # Spark's JVM output (transforms.spark sends it there)

    def log_errors(self, limit: int = 5) -> list[str]:
        """The last error lines of Spark's log (why a query died: e.g. the driver out of heap)."""
        if self.log_path is None or not self.log_path.exists():
            return []
        lines = self.log_path.read_text(errors="replace").splitlines()
        errors = [ln.strip() for ln in lines if ("Error" in ln or " ERROR " in ln) and not ln.lstrip().startswith("at ")]
        return errors[-limit:]

    def attach(self, spark) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        batches = self.batches

        class Recorder(StreamingQueryListener):
            def onQueryStarted(self, event) -> None:
                pass

            def onQueryProgress(self, event) -> None:
                p = event.progress
                batches.append({"query": p.name, "rows": p.numInputRows, "duration_ms": dict(p.durationMs)})

            def onQueryIdle(self, event) -> None:
                pass

            def onQueryTerminated(self, event) -> None:
                pass

        try:
            spark.streams.addListener(Recorder())
        except Exception as e:  # e.g. Spark Connect without a listener bus here: times stay coarser
            self.error = f"{type(e).__name__}: {e}"

    def durations(self, since: int) -> dict[str, dict[str, int]]:
        """Per query, the summed durationMs of the batches reported after index `since`."""
        time.sleep(1.0)  # progress events arrive asynchronously, shortly after a query ends
        out: dict[str, Counter] = {}
        for b in self.batches[since:]:
            out.setdefault(b["query"], Counter()).update(b["duration_ms"])
        return {q: dict(c) for q, c in out.items()}


@contextlib.contextmanager
def _spark_session() -> Iterator[SparkProgress]:
    """Start Spark once, outside every timed section, over a home that outlives the per-run homes,
    and warm it up with a tiny untimed `eventide run` (Python workers, JIT, Dagster and GX imports)."""
    from transforms import spark as spark_module

    recorder = SparkProgress()
    owned = spark_module._session is None  # else started by another benchmark in this process
    spark_home = Path(tempfile.mkdtemp(prefix="eventide-bench-spark-"))
    try:
        started = time.perf_counter()
        recorder.attach(spark_module.get_spark(Settings(home=spark_home)))
        recorder.log_path = spark_home / "logs" / "spark.log"
        progress(f"Spark session ready in {time.perf_counter() - started:.1f} s; warm-up run ...")
        with _home("warmup") as settings:
            land_logs(settings, 2_000, 2)
            recorder.warmup_s = timed_run_all(settings, recorder)["total_s"]
        progress(f"warm-up run: {recorder.warmup_s:.1f} s (not counted)")
        yield recorder
    finally:
        try:
            if owned:
                spark_module.stop_spark()
        except Exception as e:  # the JVM may be gone already (e.g. out of memory): still clean up
            progress(f"stopping Spark: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(spark_home, ignore_errors=True)


# -- baselines ----------------------------------------------------------------------------------------
def python_loop_counts(settings: Settings) -> tuple[dict, float]:
    """Wallaroo's model in one process: every landed payload parsed, (day, status) counted."""
    started = time.perf_counter()
    counts: Counter = Counter()
    marker = settings.marker
    for seg in list_segments(settings, "logs"):
        for payload in pq.read_table(seg, columns=["payload"]).column("payload").to_pylist():
            rec = parse_log_line(payload.decode(), marker)
            if not rec.is_marker:
                counts[(rec.day, rec.status)] += 1
    return dict(counts), time.perf_counter() - started


def duckdb_counts(files: list[Path]) -> tuple[dict, float]:
    """The summary in batch from the raw log files: read_csv one column, the CLF regex, group by."""
    import duckdb

    started = time.perf_counter()
    con = duckdb.connect()
    rows = con.execute(
        """
        with parsed as (
          select regexp_extract(line, $re, ['host', 'ident', 'user', 'ts', 'request', 'status', 'bytes']) as f
          from read_csv($files, columns = {'line': 'VARCHAR'}, header = false, delim = '\t', quote = '',
                        escape = '', auto_detect = false)
        )
        select strptime(split_part(f.ts, ':', 1), '%d/%b/%Y')::date as day, f.status::integer as status,
               count(*) as n
        from parsed where f.status <> '' group by all
        """,
        {"re": CLF_REGEX, "files": [str(f) for f in files]},
    ).fetchall()
    con.close()
    return {(d, s): n for d, s, n in rows}, time.perf_counter() - started


# -- where the engine's Python time goes ------------------------------------------------------------------
class _FakeValueState:
    """A key's RocksDB value state, in memory (answers both `exists()` + `get()` styles)."""

    def __init__(self) -> None:
        self.row = None

    def exists(self) -> bool:
        return self.row is not None

    def get(self):
        return self.row

    def update(self, row) -> None:
        self.row = row


class _FakeHandle:
    def getValueState(self, name, schema):  # Spark's name
        return _FakeValueState()


class _FakeTimerValues:
    def getCurrentProcessingTimeInMs(self) -> int:  # Spark's name
        return int(time.time() * 1000)

    def getCurrentWatermarkInMs(self) -> int:  # Spark's name
        return 0


def profile_python_stages(settings: Settings, max_rows: int = STAGE_PROFILE_LINES) -> dict:
    """Run the engine's Python stages in this process over the first `max_rows` landed messages,
    the way Spark calls them (the mapInArrow pre stage, the stateful processor, the foreachBatch
    writer into a scratch lake), and time each in seconds per million messages. The rest of a query's
    time is Spark's: scan, Arrow transfer to and from the Python workers, shuffle, state store, and
    the pre stage runs on both cores while the state step and the writer run on one.

    Uses engine entry points that change while the engine is optimized: a failure is reported, not raised."""

    try:
        from examples.logs import log_app
        from transforms import engine
        from transforms.streams import bronze_application

        tables, rows = [], 0
        for seg in list_segments(settings, "logs"):
            tables.append(pq.read_table(seg))
            rows += tables[-1].num_rows
            if rows >= max_rows:
                break
        landed = pa.concat_tables(tables).slice(0, max_rows)
        batches = landed.to_batches(max_chunksize=10_000)  # Spark's default Arrow batch size for Python UDFs
        per_m = 1e6 / landed.num_rows

        def timed(fn):
            started = time.perf_counter()
            value = fn()
            return value, round((time.perf_counter() - started) * per_m, 2)

        out: dict = {"messages": landed.num_rows}
        for name, app in (("bronze", bronze_application("logs")), ("logs", log_app)):
            plan = engine.plan_queries(app, settings)[0]
            out[f"{name}_plan_mode"] = getattr(plan, "mode", "envelope")
            pre = engine.make_pre_stage(plan, False)
            staged, out[f"{name}_pre_stage_s_per_m"] = timed(lambda pre=pre: pa.Table.from_batches(list(pre(iter(batches)))))
            if plan.keyed:
                processor = engine.KeyedStateProcessor(plan, False)
                processor.init(_FakeHandle())
                frame = staged.to_pandas()
                key = frame["key"].iat[0]
                outputs, out[f"{name}_state_step_s_per_m"] = timed(
                    lambda p=processor, f=frame, k=key: _concat_frames(p.handleInputRows((k,), iter([f]), _FakeTimerValues())))
                staged = pa.Table.from_pandas(outputs, schema=engine.ENVELOPE, preserve_index=False)
                out[f"{name}_state_step_outputs"] = staged.num_rows
            if not plan.keyed:  # the sink rows of an object-producing plan (a direct plan has none: Spark casts)
                continue
            from transforms.engine.sink_rows import Outputs, of_kind, outputs_to_table

            outs = Outputs(of_kind(staged, staged.column("kind"), "out"))
            _, out[f"{name}_sink_rows_s_per_m"] = timed(
                lambda o=outs, p=plan: [outputs_to_table(s, *o.for_sink(s)) for s in p.sinks if hasattr(s, "table")])
        return out
    except Exception as e:  # the profile is an extra: the benchmark goes on
        return {"error": f"{type(e).__name__}: {e}"}


def _concat_frames(frames) -> object:
    import pandas as pd

    return pd.concat(list(frames), ignore_index=True)


# -- one size ----------------------------------------------------------------------------------------
def bench_size(lines: int, days: int, spark_progress: SparkProgress | None = None, stage_profile: bool = True) -> dict:
    out: dict = {"lines": lines, "days": days}
    with _home(f"logs-{lines}") as settings:
        progress(f"{lines:,} lines over {days} days: landing ...")
        expected, landing_s = land_logs(settings, lines, days)
        segments = list_segments(settings, "logs")
        out.update(landing_s=round(landing_s, 3), landing_lines_per_s=_rate(lines, landing_s),
                   segments=len(segments), landed_bytes=sum(p.stat().st_size for p in segments))
        progress(f"  landed in {landing_s:.1f} s ({out['landing_lines_per_s']:,} lines/s), "
                 f"{len(segments)} segments; eventide run ...")

        run = timed_run_all(settings, spark_progress)
        out["run"] = run
        problem = _mismatch("engine summary", stored_summary_counts(settings), expected)
        if problem:
            raise RuntimeError(problem)
        out["verified"] = True
        out["engine_s"] = run["total_s"]
        out["engine_lines_per_s"] = _rate(lines, run["total_s"])
        out["landing_plus_engine_lines_per_s"] = _rate(lines, landing_s + run["total_s"])
        progress(f"  eventide run: {run['total_s']:.1f} s ({out['engine_lines_per_s']:,} lines/s), "
                 f"summary verified; Python loop baseline ...")

        loop_counts, loop_s = python_loop_counts(settings)
        problem = _mismatch("python loop", loop_counts, expected)
        if problem:
            raise RuntimeError(problem)
        out.update(python_loop_s=round(loop_s, 3), python_loop_lines_per_s=_rate(lines, loop_s),
                   engine_vs_loop_ratio=round(loop_s / run["total_s"], 3))
        progress(f"  Python loop: {loop_s:.1f} s; DuckDB baseline ...")

        raw = generate_logs(settings.home / "raw-logs", lines, days, seed=SEED)  # the same lines, as files
        duck_counts, duck_s = duckdb_counts(raw["files"])
        problem = _mismatch("duckdb", duck_counts, expected)
        if problem:
            raise RuntimeError(problem)
        out.update(raw_log_bytes=raw["bytes"], duckdb_s=round(duck_s, 3), duckdb_lines_per_s=_rate(lines, duck_s),
                   engine_vs_duckdb_ratio=round(duck_s / run["total_s"], 4))
        progress(f"  DuckDB: {duck_s:.2f} s")
        if stage_profile:
            progress("  profiling the engine's Python stages in-process ...")
            out["python_stages"] = profile_python_stages(settings)
    return out


# -- backfill as the history grows --------------------------------------------------------------------
def _time_backfill(settings: Settings, day: str, repeats: int) -> float:
    from orchestration.backfill import backfill

    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        failed = backfill(settings, day, progress=lambda m: None)
        best = min(best, time.perf_counter() - started)
        if failed:
            raise RuntimeError(f"backfill of {day} failed")
    return best


def _time_range_backfill(settings: Settings, first: dt.date, days: int) -> dict:
    """A backfill of `days` days as one run (the daily summary's single-run policy) against one run per
    day; before each, the range's summaries are deleted, so each writes them all; the tables compared."""
    from examples.logs import SUMMARY_SCHEMA, SUMMARY_TABLE
    from orchestration.backfill import backfill

    last = (first + dt.timedelta(days=days - 1)).isoformat()
    out: dict = {"days": days}
    counts = {}
    for name, one_run in (("per_day_runs", False), ("one_run", True)):
        progress(f"  backfill of {days} days, {name.replace('_', ' ')} ...")
        from transforms.spark import get_spark

        lake.replace_where(get_spark(settings).createDataFrame(SUMMARY_SCHEMA.empty_table()),
                           settings.table_path(SUMMARY_TABLE), f"day <= '{last}'", partition_by=["day"])
        started = time.perf_counter()
        if backfill(settings, first.isoformat(), last, progress=lambda m: None, one_run=one_run):
            raise RuntimeError(f"backfill of {days} days ({name}) failed")
        out[f"{name}_s"] = round(time.perf_counter() - started, 3)
        counts[name] = {k: v for k, v in stored_summary_counts(settings).items() if k[0].isoformat() <= last}
        progress(f"    {out[f'{name}_s']:.1f} s")
    problem = _mismatch("backfill as one run", counts["one_run"], counts["per_day_runs"])
    if problem or len({k[0] for k in counts["one_run"]}) != days:
        raise RuntimeError(problem or f"the backfill summarized {len({k[0] for k in counts['one_run']})} of {days} days")
    out["one_run_speedup"] = round(out["per_day_runs_s"] / out["one_run_s"], 2)
    return out


def bench_backfill(histories: tuple[int, ...] = HISTORIES, lines_per_day: int = LINES_PER_DAY,
                   repeats: int = 2, spark_progress: SparkProgress | None = None) -> dict:
    """One home whose history grows to each size in turn (only the new days are landed and run);
    at each, the best of `repeats` backfills of the first day (the same lines every time)."""
    first = dt.date.fromisoformat(START_DAY)
    day = first.isoformat()
    points: list[dict] = []
    want: dict = {}
    with _home("backfill") as settings:
        have = 0
        for history in sorted(histories):
            new_days = history - have
            start = (first + dt.timedelta(days=have)).isoformat()
            progress(f"backfill history {history} days: landing {new_days} more days of {lines_per_day:,} lines ...")
            expected, landing_s = land_logs(settings, new_days * lines_per_day, new_days, seed=SEED + have,
                                            start=start, daily_variation=0.0)
            if not have:
                want = {k: v for k, v in expected.items() if k[0] == first}
            run = timed_run_all(settings, spark_progress, summaries=False)  # the history's bronze and windows; summaries are per day
            have = history
            if not points:
                _time_backfill(settings, day, 1)  # warm-up: first Dagster job run, GX import
            progress(f"  pipelines {run['total_s']:.1f} s; timing the backfill of {day} ...")
            seconds = _time_backfill(settings, day, repeats)
            got = {k: v for k, v in stored_summary_counts(settings).items() if k[0] == first}
            problem = _mismatch(f"backfill of {day}", got, want)
            if problem:
                raise RuntimeError(problem)
            points.append({"history_days": history, "bronze_lines": history * lines_per_day,
                           "backfill_day_s": round(seconds, 3), "pipelines_for_new_days_s": run["total_s"],
                           "landing_new_days_s": round(landing_s, 3)})
            progress(f"  backfill of one day with {history} days of history: {seconds:.2f} s")
        ranged = _time_range_backfill(settings, first, min(RANGE_DAYS, have))
    times = [p["backfill_day_s"] for p in points]
    return {
        "range": ranged,
        "lines_per_day": lines_per_day,
        "backfilled_day": day,
        "repeats": repeats,
        "points": points,
        "largest_over_smallest_history_ratio": round(times[-1] / times[0], 3) if times else None,
    }


# -- everything ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """Set an environment variable for a while (None: leave it as it is)."""
    saved = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved


def bench_logs(results: dict, sizes: tuple[int, ...] = SIZES, days: int = DAYS,
               histories: tuple[int, ...] = HISTORIES, lines_per_day: int = LINES_PER_DAY,
               max_minutes: float = MAX_MINUTES, stage_profile: bool = True,
               max_files_per_trigger: int | None = None) -> dict:
    """Fill results["logs"] with the backfill series and a run per size (the largest ones skipped, with
    an estimate, when the measured throughput says they would take more than `max_minutes`).

    `max_files_per_trigger` (EVENTIDE_MAX_FILES_PER_TRIGGER) bounds a micro-batch to that many
    landing segments; by default one micro-batch takes everything landed, which the driver must hold.
    The backfill series runs first; a size that fails is recorded with its error (and Spark's) and
    ends the benchmark."""
    with _env("EVENTIDE_MAX_FILES_PER_TRIGGER", None if max_files_per_trigger is None else str(max_files_per_trigger)):
        return _bench_logs(results, sizes, days, histories, lines_per_day, max_minutes, stage_profile)


def _bench_logs(results: dict, sizes, days, histories, lines_per_day, max_minutes, stage_profile) -> dict:
    settings = Settings.from_env()
    out: dict = {"cpus": os.cpu_count(), "load_average_at_start": load_average(),
                 "settings": {"max_files_per_trigger": settings.max_files_per_trigger,
                              "segment_max_bytes": settings.segment_max_bytes,
                              "spark_master": settings.spark_master,
                              "spark_shuffle_partitions": settings.spark_shuffle_partitions},
                 "runs": [], "skipped": [], "failed": []}
    results["logs"] = out
    with _spark_session() as spark_progress:
        out["warmup_run_s"] = spark_progress.warmup_s
        out["spark_listener_error"] = spark_progress.error
        if histories:  # first: a size that kills the JVM (driver out of heap) must not take it along
            out["backfill"] = bench_backfill(tuple(histories), lines_per_day, spark_progress=spark_progress)
        rate = None  # lines/s of landing + engine, measured on the last size run
        for lines in sorted(sizes):
            if rate:
                estimate = lines / rate
                if estimate > max_minutes * 60:
                    progress(f"skipping {lines:,} lines: about {estimate / 60:.0f} min at the measured "
                             f"{rate:,.0f} lines/s (limit {max_minutes:g} min)")
                    out["skipped"].append({"lines": lines, "estimated_landing_plus_engine_s": round(estimate),
                                           "from_rate_lines_per_s": round(rate), "basis": "linear"})
                    continue
            try:
                run = bench_size(lines, days, spark_progress, stage_profile=stage_profile and not out["runs"])
            except Exception as e:
                progress(f"{lines:,} lines failed: {type(e).__name__}: {e}")
                out["failed"].append({"lines": lines, "error": f"{type(e).__name__}: {e}"[:2000],
                                      "spark_log_errors": spark_progress.log_errors()})
                break  # Spark may be gone
            out["runs"].append(run)
            rate = run["landing_plus_engine_lines_per_s"]
            progress(f"  result: {json.dumps({k: v for k, v in run.items() if k not in ('run', 'python_stages')})}")
    out["load_average_at_end"] = load_average()
    return results


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_ints, default=SIZES, help="comma-separated line counts")
    parser.add_argument("--days", type=int, default=DAYS, help="days the lines of each size spread over")
    parser.add_argument("--histories", type=_ints, default=HISTORIES, help="backfill history sizes in days ('' skips)")
    parser.add_argument("--lines-per-day", type=int, default=LINES_PER_DAY)
    parser.add_argument("--max-minutes", type=float, default=MAX_MINUTES)
    parser.add_argument("--no-stage-profile", action="store_true")
    parser.add_argument("--max-files-per-trigger", type=int, default=None,
                        help="landing segments per micro-batch (default: EVENTIDE_MAX_FILES_PER_TRIGGER or no limit)")
    args = parser.parse_args(argv)
    results: dict = {}
    bench_logs(results, args.sizes, args.days, args.histories, args.lines_per_day, args.max_minutes,
               stage_profile=not args.no_stage_profile, max_files_per_trigger=args.max_files_per_trigger)
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
