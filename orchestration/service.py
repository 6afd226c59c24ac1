"""`eventide serve`: the gateway plus, in one Spark session, every registered app's queries running
continuously (transforms/engine/live.py), watched by Dagster.

- Every stream's bronze query and every app's queries start on a processing-time trigger
  (`EVENTIDE_TRIGGER_INTERVAL`, 0.5 s) over the same checkpoints as `eventide run`; one line says
  when all of them run. A failed query is restarted with backoff.
- Each committed batch is reported to Dagster as a runless materialization of the tables it changed,
  at most one per table every `EVENTIDE_REPORT_INTERVAL` seconds (rows added, Delta version,
  throughput, latency percentiles from gateway receipt to commit).
- Every 10 s, landing segments every query has committed move to the archive
  (transforms/ingestion/archive.py), so the folder Spark lists each trigger stays small.
- Every EVENTIDE_UPKEEP_MINUTES (10), the lake's small files are compacted and old ones vacuumed
  (transforms/lake/upkeep.py), on a thread of its own next to the queries.
- After tables change, the apps' sensors (with cursors kept here) and schedules are asked what is due
  and the runs they request execute here, in this process and JVM: the log app's daily summaries
  follow the log windows without anything run by hand. They are asked at least once a minute, so
  the summary's automation closes a day with no marker and no later line by the clock (real time).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from transforms.engine.sinks import BatchDone
from transforms.settings import Settings

SCHEDULE_EVERY_SECONDS = 60.0
ARCHIVE_EVERY_SECONDS = 10.0  # how often committed landing segments move out of the queries' folder
STOP_GRACE_SECONDS = 15.0  # how long batches in flight get to commit when serve stops


def stop_all(queries, grace_seconds: float) -> None:
    """Stop every query, after letting the batches in flight commit (one deadline for all of them)."""
    deadline = time.monotonic() + grace_seconds
    for q in queries:
        q.stop(max(0.0, deadline - time.monotonic()))


@dataclass
class _Pending:
    rows: int = 0
    batches: int = 0
    latencies: list[float] = field(default_factory=list)
    first_at: float = 0.0
    last_at: float = 0.0


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p95 / p99 / max of `values` (nearest rank), rounded to the millisecond."""
    if not values:
        return {}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))]

    return {"p50": round(rank(50), 3), "p95": round(rank(95), 3), "p99": round(rank(99), 3), "max": round(ordered[-1], 3)}


class DagsterReporter:
    """Collects committed batches (from the queries' threads) and reports them to the Dagster instance,
    throttled per table. `flush(force)` from one thread."""

    def __init__(self, settings: Settings):
        from orchestration.runner import dagster_instance

        self.settings = settings
        self.interval = settings.report_interval
        self.instance = dagster_instance(settings)
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._last_report: dict[str, float] = {}  # table -> when its last event was sent
        self._last_commit: dict[str, float] = {}  # table -> the last commit its last event covered
        self.changed = threading.Event()  # a table changed since the follow-ups last looked

    def on_batch(self, done: BatchDone) -> None:
        tables = [t for t, n in done.rows_written.items() if n and not t.startswith("tcp:")]
        if not tables:
            return
        with self._lock:
            for t in tables:
                p = self._pending.setdefault(t, _Pending(first_at=done.committed_at))
                p.rows += done.rows_written[t]
                p.batches += 1
                p.latencies.extend(done.latencies)
                p.last_at = done.committed_at
        self.changed.set()

    def flush(self, force: bool = False) -> int:
        """Report every table whose last report is older than the interval (all, with `force`)."""
        import dagster as dg

        from transforms import lake

        now = time.time()
        with self._lock:
            due = {t: p for t, p in self._pending.items()
                   if force or now - self._last_report.get(t, 0.0) >= self.interval}
            for t in due:
                del self._pending[t]
                self._last_report[t] = now
        for table, p in due.items():
            path = self.settings.table_path(table)
            span = max(p.last_at - self._last_commit.get(table, p.first_at), 1e-3)
            meta = {
                "rows_added": dg.MetadataValue.int(p.rows),
                "batches": dg.MetadataValue.int(p.batches),
                "delta_version": dg.MetadataValue.int(lake.version(path) if lake.exists(path) else -1),
                "rows_per_second": dg.MetadataValue.float(round(p.rows / span, 1)),
                **{f"latency_{k}_seconds": dg.MetadataValue.float(v) for k, v in percentiles(p.latencies).items()},
                "source": dg.MetadataValue.text("eventide serve"),
            }
            self.instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=table, metadata=meta))
            self._last_commit[table] = p.last_at
        return len(due)


class FollowUps:
    """Asks the apps' sensors and schedules what is due and runs it here (one at a time)."""

    def __init__(self, settings: Settings, say: Callable[[str], None]):
        from orchestration.definitions import build_definitions
        from orchestration.runner import dagster_instance, load_cursors

        self.settings, self.say = settings, say
        self.defs = build_definitions(settings.registry)
        self.instance = dagster_instance(settings)
        self.cursors: dict[str, str | None] = load_cursors(self.instance, self.defs)  # the daemon's too
        self.runs = 0

    def run_due(self, stopping: Callable[[], bool] = lambda: False) -> int:
        """Run what is due, one run at a time; stop between runs once `stopping()` (the rest stays due:
        the sensor's cursor is only kept when every run it asked for ran)."""
        from orchestration.runner import (
            RunSummary,
            _collect,
            due_runs,
            execute_due,
            merge_ranges,
            save_cursors,
        )
        from orchestration.sensors import PIPELINES_JOB

        before = dict(self.cursors)
        due = merge_ranges(self.defs, due_runs(self.defs, self.instance, skip_jobs=(PIPELINES_JOB,),
                                               cursors=self.cursors))
        for run in due:
            if stopping():
                self.cursors = before
                return 0
            summary = RunSummary()
            _collect(execute_due(self.defs, self.instance, run), summary, run.partitions)
            what = run.label
            failed = [f"{f.asset} {f.check}" for f in summary.check_failures] + summary.failures
            self.say(f"{what} (asked by {run.requested_by}): " + (f"FAILED {'; '.join(failed)}" if failed else "done"))
            self.runs += 1
        if self.cursors != before:
            save_cursors(self.instance, self.defs, self.cursors)
        return len(due)


class Service:
    """The queries of every registered app (and every stream's bronze), run until `stop()`."""

    def __init__(self, settings: Settings, say: Callable[[str], None] = print, dagster: bool = True,
                 schedule_every: float = SCHEDULE_EVERY_SECONDS):
        """`schedule_every`: seconds between asking the sensors and schedules when no table changed."""
        self.settings, self.say, self.dagster = settings, say, dagster
        self.schedule_every = schedule_every
        self.queries = []
        self.reporter: DagsterReporter | None = None
        self.follow_ups: FollowUps | None = None
        self.all_running = threading.Event()
        self.archived = 0  # landing segments moved to the archive (transforms/ingestion/archive.py)
        self.upkept = 0  # rounds of lake upkeep (compaction, vacuum) done
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="eventide-queries", daemon=True)
        self._follow_thread = threading.Thread(target=self._follow_main, name="eventide-follow-ups", daemon=True)

    def start(self) -> Service:
        self._thread.start()
        return self

    def _plans(self):
        from orchestration.status import query_plans
        from transforms.streams import service_applications

        self._bronze_apps = {a.name for a in service_applications(self.settings)[0]}
        return query_plans(self.settings)

    def _trigger_of(self, plan) -> float:
        """Bronze is off the answer path: it runs less often, in bigger batches, and leaves the cores
        to the apps' queries (measured: at 1k msgs/s the bronze queries took half of 2 cores)."""
        s = self.settings
        return max(s.trigger_interval, s.bronze_trigger_interval) if plan.app in self._bronze_apps else s.trigger_interval

    def _main(self) -> None:
        from transforms.engine.live import LiveQuery
        from transforms.engine.sinks import resolve_tcp_sinks
        from transforms.spark import get_spark

        try:
            plans = self._plans()
            addresses = {}
            for p in plans:
                addresses.update(resolve_tcp_sinks(p.app, p.sinks, None))
            if self.dagster:
                self.reporter = DagsterReporter(self.settings)
                self.follow_ups = FollowUps(self.settings, self.say)
            self.say(f"starting Spark and {len(plans)} queries ...")
            spark = get_spark(self.settings)
            on_batch = self.reporter.on_batch if self.reporter else None
            self.queries = [LiveQuery(spark, p, self.settings, addresses, on_batch, self.say, self._trigger_of(p))
                            for p in plans]
        except BaseException as e:  # noqa: BLE001 - reported by serve, which then stops
            self.error = e
            self.say(f"the queries could not start: {e}")
            return
        if self.dagster:
            self._follow_thread.start()
        started = last_archive = last_upkeep = time.monotonic()
        upkeep: threading.Thread | None = None
        try:
            while not self._stop.is_set():
                for q in self.queries:
                    q.poll()
                if time.monotonic() - last_archive >= ARCHIVE_EVERY_SECONDS:
                    last_archive = time.monotonic()
                    self._archive(plans)
                every = self.settings.upkeep_minutes * 60
                if every and time.monotonic() - last_upkeep >= every and not (upkeep and upkeep.is_alive()):
                    last_upkeep = time.monotonic()
                    upkeep = threading.Thread(target=self._upkeep, args=(spark,), name="eventide-upkeep", daemon=True)
                    upkeep.start()
                if not self.all_running.is_set() and all(q.running for q in self.queries):
                    self.all_running.set()
                    # What the start built (Dagster, Spark's client, the plans) lives as long as serve: out of
                    # the collector's way, which otherwise scans it again and again as the gateway allocates.
                    gc.freeze()
                    self.say(f"all {len(self.queries)} queries running (trigger every "
                             f"{self.settings.trigger_interval:g} s), {time.monotonic() - started:.1f} s after start")
                self._stop.wait(0.2)
        finally:
            stop_all(self.queries, STOP_GRACE_SECONDS)

    def _wait_for_bronze(self) -> None:
        """Let the bronze queries commit the segments landed so far before follow-up runs read the
        tables: bronze runs less often than the apps' queries, and the follow-ups' checks compare the
        apps' tables with bronze. Bounded: under a busy stream, it goes on after two bronze cycles."""
        from transforms.ingestion import open_log

        log = open_log(self.settings)
        bronze = [q.plan for q in self.queries if q.plan.app in self._bronze_apps]
        wanted = {p.name: log.position(p.group) for p in bronze}
        deadline = time.monotonic() + 2 * self.settings.bronze_trigger_interval + 5
        while not self._stop.is_set() and time.monotonic() < deadline:
            if all(log.reached(p, wanted[p.name]) for p in bronze):
                return
            time.sleep(0.2)

    def _upkeep(self, spark) -> None:
        """Compact and vacuum the lake (transforms/lake/upkeep.py) next to the running queries: a MERGE
        that meets a compaction retries, and Delta commits each batch once either way."""
        from transforms import lake

        try:
            done = lake.upkeep(spark, self.settings.lake, self.settings.vacuum_hours,
                               log_retention_hours=self.settings.log_retention_hours,
                               revisit_after=lake.REVISIT_UNCHANGED_SECONDS)
        except Exception as e:  # noqa: BLE001 - the tables stay as they are; the next round tries again
            self.say(f"lake upkeep failed (the next round tries again): {e}")
            return
        self.upkept += 1
        changed = [f"{r.table} {r.files_before}->{r.files_after} files" for r in done if r.files_before != r.files_after]
        if changed:
            self.say(f"lake upkeep: {', '.join(changed)}")

    def _archive(self, plans) -> None:
        from transforms.ingestion import open_log

        try:
            moved = open_log(self.settings).upkeep(plans)  # the landing archives what every query committed
        except OSError as e:  # the log stays as it is; the next round tries again
            self.say(f"archiving the landing failed: {e}")
            return
        self.archived += moved
        # A long-running query's list of files stays short (live.py). The queries of a log grow theirs
        # together: one restart a round spreads them out, and the others go on answering meanwhile.
        for q in self.queries:
            try:
                if q.restart_if_file_list_grew(STOP_GRACE_SECONDS) or q.restart_if_source_outgrown(STOP_GRACE_SECONDS):
                    break
            except OSError as e:  # it goes on as it is; the next round tries again
                self.say(f"{q.name}: could not read its checkpoint to see whether to restart it: {e}")

    def _follow_main(self) -> None:
        last_schedules = 0.0
        while not self._stop.is_set():
            changed = self.reporter.changed.wait(min(self.settings.report_interval, self.schedule_every))
            if self._stop.is_set():
                break
            try:
                self.reporter.flush()
                due_by_clock = time.monotonic() - last_schedules >= self.schedule_every
                if changed or due_by_clock:
                    self.reporter.changed.clear()
                    if due_by_clock:
                        last_schedules = time.monotonic()
                    self._wait_for_bronze()
                    self.follow_ups.run_due(stopping=self._stop.is_set)
            except Exception as e:  # noqa: BLE001 - a failed follow-up is reported; the queries go on
                self.say(f"follow-up runs failed: {e}")

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        if self.reporter:
            self.reporter.changed.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._follow_thread.is_alive():
            self._follow_thread.join(timeout)
        if self.reporter:
            self.reporter.flush(force=True)

    def summary(self) -> str:
        batches = sum(q.report.batches for q in self.queries)
        restarts = sum(q.failures for q in self.queries)
        return (f"{len(self.queries)} queries, {batches} batches, {restarts} restarts, "
                f"{self.archived} landing segments archived")

