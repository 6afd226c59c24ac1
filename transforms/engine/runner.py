"""Running: a plan's stream wired stage to stage, run with trigger availableNow, exactly once.

Timers: Spark fires due processing-time timers in a micro-batch, and a query only runs a batch when
a source has new data (a no-data batch needs an earlier batch of the same run, so a query restarted
with nothing new would run none), so a timer of a quiet key would wait for the next message. A query
with timers therefore also reads a clock: Spark's `rate-micro-batch` source, one tick row per batch,
so every trigger runs a batch; the pre stage drops the ticks. A run with timers uses a
processing-time trigger and stops after the first batch this run planned and executed in which the
landing had nothing new: every timer due when the run started has fired, whether or not its key got
a message. (A batch replayed from an earlier, interrupted run keeps its old timestamp, so it does not
count; the trigger interval leaves an idle gap to stop in, so the stop interrupts no batch.)
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from transforms.api import Application
from transforms.engine.checkpoints import batch_ids, clear_unplanned, explain_checkpoint_error
from transforms.engine.close_windows import (
    close_due,
    keep_close_records,
    land_close_records,
    open_keys,
    record_closed,
)
from transforms.engine.envelope import TICK_STREAM
from transforms.engine.keyed_state import stateful_step
from transforms.engine.levels import next_level
from transforms.engine.locks import QueryLock, describe, holder_of
from transforms.engine.plan import QueryPlan, plan_queries
from transforms.engine.report import RunReport
from transforms.engine.sink_rows import AllSinkRowsFn
from transforms.engine.sinks import BatchWriter, resolve_tcp_sinks
from transforms.engine.stages import make_pre_stage
from transforms.engine.state_layout import StateLayout, state_layout
from transforms.ingestion.kafka_source import plan_log
from transforms.settings import Settings
from transforms.spark import explain_task_error


def build_stream(spark, plan: QueryPlan, settings: Settings, layout: StateLayout = StateLayout.BUCKET,
                 fold: AllSinkRowsFn | None = None):
    """The streaming DataFrame of a plan, up to the sinks. `layout`: how a keyed plan's state is
    grouped (its checkpoint's, see state_layout.py); `fold`: the sinks' pass its last keyed step makes
    (BatchWriter.fold; None: it gives envelopes)."""
    df = plan_log(settings, plan).source(spark, plan)  # the home's log, or a kafka_source's topic
    df = keep_close_records(df.where(df.stream.isin(plan.streams)), plan)
    if not plan.quarantine_landing_errors:
        df = df.where(df.landing_error.isNull())
    if plan.timers:
        df = df.unionByName(clock_ticks(spark))
    from pyspark.sql.pandas.types import from_arrow_schema

    env = df.mapInArrow(make_pre_stage(plan, settings.fail_fast), from_arrow_schema(plan.stage_schema))
    if plan.keyed:
        env = stateful_step(env, plan, settings.fail_fast, layout, None if plan.levels else fold)
        for n, level in enumerate(plan.levels, start=1):  # a multi-level pipeline's next levels (engine/levels.py)
            env = next_level(env, level, settings.fail_fast, layout, fold if n == len(plan.levels) else None)
    return env


def nothing_new(plan: QueryPlan, settings: Settings) -> bool:
    """Whether a run of the plan would do nothing, decided without Spark: its last planned batch
    committed (or none planned), everything in its log read by that batch (an empty log counts), and
    no timers (due timers live in Spark's state store, so a query with timers always runs)."""
    if plan.timers:
        return False
    checkpoint = plan.checkpoint(settings)
    if last_planned_batch(checkpoint) != max(batch_ids(checkpoint / "commits"), default=-1):
        return False
    return plan_log(settings, plan).caught_up(plan)


def home_has_work(settings: Settings) -> bool:
    """Whether some query of the home (a stream's bronze or a registered app) has something to do."""
    from transforms.streams import service_applications

    bronze, apps = service_applications(settings)
    try:
        return any(not nothing_new(p, settings) for app in (*bronze, *apps) for p in plan_queries(app, settings))
    except Exception:  # an app that cannot be planned: its own run reports that
        return True


def run_query(spark, plan: QueryPlan, settings: Settings, tcp_addresses: dict[str, str] | None = None,
              progress: Callable[[str], None] | None = None) -> RunReport:
    """Process everything landed so far (trigger availableNow), exactly once; returns what it did.

    `spark` is a session, or a function that returns one: called only if the query has something to do
    (see nothing_new), so a run with nothing new starts no JVM. ConfigError before any Spark work if a
    TCP sink has no address and is not optional. A query whose lock another process holds (a running
    `eventide serve`, another run) is skipped and reported."""
    addresses = resolve_tcp_sinks(plan.app, plan.sinks, tcp_addresses)
    report = RunReport(plan.name)
    lock = QueryLock(settings, plan.name)
    if not lock.try_acquire():
        report.held_by = describe(holder_of(settings, plan.name))
        if progress:
            progress(f"{plan.name}: skipped, {report.held_by} is running it (and processes what landed)")
        return report
    try:
        if nothing_new(plan, settings):
            if progress:
                progress(f"{plan.name}: nothing new since its last committed batch")
        else:
            spark = spark() if callable(spark) else spark
            report = _run_locked(spark, plan, settings, addresses, report, progress)
        if settings.close_windows and close_due(settings, plan):
            with _CLOSING:  # one query's close records land at a time (the queries of an app run together)
                _close_windows(spark() if callable(spark) else spark, plan, settings, addresses, report, progress)
        return report
    finally:
        lock.release()


_CLOSING = threading.Lock()


def _close_windows(spark, plan: QueryPlan, settings: Settings, addresses: dict, report: RunReport,
                   progress: Callable[[str], None] | None) -> None:
    """Close every key's open windows (see close_windows.py): land a close record per key that has one,
    run the query again over them, and remember that this state is closed. A multi-level pipeline's
    levels one after the other: what closing a level emits reaches the next before it is closed."""
    layout = state_layout(plan, plan.checkpoint(settings), settings.state_layout)
    closed = 0
    for level in range(1 + len(plan.levels)):
        keys = open_keys(spark, plan, settings, layout, level)
        if keys:
            land_close_records(settings, plan, keys, level)
            _run_locked(spark, plan, settings, addresses, report, progress)
        closed += len(keys)
    report.closed_keys = closed
    record_closed(settings, plan)
    if progress:
        progress(f"{plan.name}: closed the open windows of {closed} key(s) (end of input)")


def _run_locked(spark, plan: QueryPlan, settings: Settings, addresses: dict, report: RunReport,
                progress: Callable[[str], None] | None) -> RunReport:
    started = time.time()
    said = BatchProgress(plan.name, progress) if progress else None
    writer = BatchWriter(plan, settings, report, addresses, on_batch=said.batch_done if said else None)
    planned_before = last_planned_batch(plan.checkpoint(settings))
    # Timers need batches on the clock (see above); without them, availableNow ends by itself.
    trigger = {"processingTime": TIMER_TRIGGER} if plan.timers else {"availableNow": True}
    query = start_query(spark, plan, settings, _SaysProgress(writer, said) if said else writer, trigger, writer.fold)
    try:
        if plan.timers:
            stop_after_no_data_batch(query, planned_before, plan_log(settings, plan))
        query.awaitTermination()
    except Exception as e:
        hint = explain_checkpoint_error(e, plan) or explain_task_error(e)
        if hint:
            raise RuntimeError(f"query {plan.name!r} stopped: {hint}") from e
        raise
    finally:
        writer.close()
    # Added up: a run with --close-windows runs the query again (per level) into the same report.
    report.seconds += time.time() - started
    log = plan_log(settings, plan)
    report.input_rows += sum(landing_rows(p, log) for p in query.recentProgress)
    if progress:
        progress(f"{plan.name}: {_count(report.input_rows, 'message')} in {_count(report.batches, 'batch')}, "
                 f"{report.seconds:.1f} s")
    return report


def _count(n: int, noun: str) -> str:
    """`n` with its noun: "1 batch", "2 batches", "1,000,007 messages"."""
    return f"{n:,} {noun if n == 1 else noun + ('es' if noun.endswith('ch') else 's')}"


class BatchProgress:
    """Says how far a long run has got, at most every `every` seconds: when a batch starts, what the
    batches before it wrote. Said then, not as a batch ends, so the last batch (whose numbers the run's
    closing line gives) and a run of one long batch say nothing twice."""

    def __init__(self, name: str, say: Callable[[str], None], every: float = 5.0, clock=time.monotonic):
        self.name, self.say, self.every, self.clock = name, say, every, clock
        self.last = clock()
        self.batches = self.rows = 0
        self.lag: float | None = None

    def batch_done(self, done) -> None:
        """BatchWriter's on_batch: count what the batch wrote."""
        self.batches += 1
        self.rows += sum(n for t, n in done.rows_written.items() if not t.startswith("tcp:"))
        self.lag = max(done.latencies) if done.latencies else None

    def batch_starts(self) -> None:
        now = self.clock()
        if self.batches and now - self.last >= self.every:
            self.last = now
            lag = f", oldest message {self.lag:.0f} s old" if self.lag is not None else ""
            self.say(f"{self.name}: {_count(self.batches, 'batch')}, {_count(self.rows, 'row')} written so far{lag}")


class _SaysProgress:
    """A query's foreachBatch function that lets `progress` speak before each batch's writes."""

    def __init__(self, writer: BatchWriter, progress: BatchProgress):
        self.writer, self.progress = writer, progress

    def __call__(self, batch_df, batch_id: int) -> None:
        self.progress.batch_starts()
        self.writer(batch_df, batch_id)


def start_query(spark, plan: QueryPlan, settings: Settings, writer: Callable, trigger: dict,
                fold: AllSinkRowsFn | None = None):
    """Start the plan's streaming query on its checkpoint, every batch through `writer` (`fold`: the
    writer's, see build_stream)."""
    ckpt = plan.checkpoint(settings)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    clear_unplanned(ckpt)  # a kill while batch 0 was being planned must not block every restart
    layout = state_layout(plan, ckpt, settings.state_layout) if plan.keyed else StateLayout.BUCKET
    return (
        build_stream(spark, plan, settings, layout, fold).writeStream.queryName(plan.name.replace(".", "_"))
        .foreachBatch(writer)
        .option("checkpointLocation", str(ckpt.absolute()))
        .trigger(**trigger)
        .start()
    )


TIMER_TRIGGER = "1 second"
TICK_SOURCE = "rate-micro-batch"


def last_planned_batch(checkpoint) -> int:
    """The highest batch id the checkpoint has planned (its offset log), -1 for a new one."""
    return max(batch_ids(checkpoint / "offsets"), default=-1)


def clock_ticks(spark):
    """One row per micro-batch in the landing's columns, so every trigger runs a batch (see above)."""
    from pyspark.sql import functions as F

    ticks = spark.readStream.format(TICK_SOURCE).option("rowsPerBatch", 1).option("numPartitions", 1).load()
    return ticks.select(F.lit(TICK_STREAM).alias("stream"), F.col("value").alias("seq"),
                        F.col("timestamp").alias("receive_time"), F.lit(None).cast("string").alias("connection"),
                        F.lit(None).cast("binary").alias("payload"), F.lit(None).cast("string").alias("landing_error"))


def _landing_sources(progress: dict, log) -> list[dict]:
    return [s for s in progress.get("sources", ()) if log.is_source(str(s.get("description", "")))]


def landing_rows(progress: dict, log) -> int:
    """Messages a batch read from the log (clock ticks excluded)."""
    return sum(int(s.get("numInputRows", 0)) for s in _landing_sources(progress, log))


def _executed_without_new_landing(progress: dict, log) -> bool:
    # An idle trigger also reports progress; only an executed batch ("addBatch") has fired timers.
    return "addBatch" in progress.get("durationMs", {}) and all(
        s.get("startOffset") == s.get("endOffset") for s in _landing_sources(progress, log))


def stop_after_no_data_batch(query, planned_before: int, log, poll_seconds: float = 0.05) -> None:
    """Wait until the query has executed a batch without new landing data that this run planned (so
    its clock is this run's and its due timers fired), then stop it."""
    while not query.awaitTermination(poll_seconds):
        if any(p.get("batchId", -1) > planned_before and _executed_without_new_landing(p, log)
               for p in query.recentProgress):
            query.stop()
            return


def run_application(spark, app: Application, settings: Settings, tcp_addresses: dict[str, str] | None = None,
                    progress: Callable[[str], None] | None = None) -> list[RunReport]:
    """Run the queries of `app` together, each from a thread of its own: a small query's time is mostly
    waiting (planning, its state store's commits, Delta's), which the others fill. Plan and TCP sink
    errors come before any query starts. A failed query stops none of the others (each has its own
    checkpoint and tables); the first failure, in plan order, is raised once all have ended. `progress`
    is only called from the calling thread (a Dagster step's logger is the step's)."""
    resolve_tcp_sinks(app.name, app.sinks(), tcp_addresses)
    plans = plan_queries(app, settings)
    if len(plans) <= 1:
        return [run_query(spark, p, settings, tcp_addresses, progress) for p in plans]
    said: queue.SimpleQueue[str] = queue.SimpleQueue()
    outcomes: list[RunReport | BaseException | None] = [None] * len(plans)

    def run(i: int, plan: QueryPlan) -> None:
        try:
            outcomes[i] = run_query(spark, plan, settings, tcp_addresses, said.put if progress else None)
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread, raised there
            outcomes[i] = e

    # Daemon threads: an interrupted caller (Ctrl-C) exits as it did when the queries ran in its own thread.
    threads = [threading.Thread(target=run, args=(i, p), name=f"eventide-query-{p.name}", daemon=True)
               for i, p in enumerate(plans)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        _say_all(said, progress, wait=0.2)
    _say_all(said, progress)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


def _say_all(said: queue.SimpleQueue, progress: Callable[[str], None] | None, wait: float = 0.0) -> None:
    """Say what the queries' threads queued (only queued when there is a `progress`), waiting up to
    `wait` s for the first message."""
    try:
        message = said.get(timeout=wait) if wait else said.get_nowait()
        while True:
            progress(message)
            message = said.get_nowait()
    except queue.Empty:
        pass
