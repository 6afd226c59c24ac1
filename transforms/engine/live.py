"""Queries that run continuously (`eventide serve`): each plan's query on its processing-time trigger,
with the same checkpoint, writers and app transactions as `eventide run`, so either may follow the
other over one home. A query holds its lock while it runs (locks.py): a run started meanwhile skips
it, and a live query waits for a run in progress to finish before it starts.

A query that fails is reported and started again after a backoff (1 s, doubling up to a minute);
its checkpoint makes the restart exactly once. `stop` lets the batch in flight commit first. A query
whose checkpoint's list of files grew by `file_list_restart_mb` is restarted the same way, so it
forgets what it will never read again (ingestion/archive.py, forget_archived).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from transforms.engine.checkpoints import explain_checkpoint_error, file_list_bytes
from transforms.engine.locks import QueryLock, describe, holder_of
from transforms.engine.plan import QueryPlan
from transforms.engine.report import RunReport
from transforms.engine.runner import start_query
from transforms.engine.sinks import BatchDone, BatchWriter
from transforms.ingestion.kafka_source import plan_log
from transforms.settings import Settings
from transforms.spark import explain_task_error

MAX_BACKOFF_SECONDS = 60.0
TIMER_MIN_TRIGGER_SECONDS = 1.0


class LiveQuery:
    """One plan, run until stopped. `poll()` regularly (from one thread): it starts the query once its
    lock is free and restarts it after a failure."""

    def __init__(self, spark, plan: QueryPlan, settings: Settings, tcp_addresses: dict[str, str | None],
                 on_batch: Callable[[BatchDone], None] | None = None, say: Callable[[str], None] = print,
                 trigger_seconds: float | None = None):
        self.spark, self.plan, self.settings = spark, plan, settings
        self.addresses, self.on_batch, self.say = tcp_addresses, on_batch, say
        seconds = trigger_seconds if trigger_seconds is not None else settings.trigger_interval
        if plan.timers:  # it runs a batch every trigger, data or not (the clock's tick, see runner)
            seconds = max(seconds, TIMER_MIN_TRIGGER_SECONDS)
        self.trigger = f"{seconds} seconds"
        self.lock = QueryLock(settings, plan.name, command="eventide serve")
        self.report = RunReport(plan.name)
        self.query = None
        self.writer: BatchWriter | None = None
        self.failures = 0
        self.restart_at = 0.0  # monotonic time before which a failed query is not started again
        self.file_list_at_start = 0  # bytes of its checkpoint's list of files when the query started
        self.waiting_said = False

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def running(self) -> bool:
        return self.query is not None and self.query.isActive

    def poll(self) -> None:
        if self.query is not None and not self.query.isActive:
            self._failed(self.query.exception())
        if self.query is None and time.monotonic() >= self.restart_at:
            self._start()

    def _start(self) -> None:
        if not self.lock.try_acquire():
            if not self.waiting_said:
                self.say(f"{self.name}: waiting for {describe(holder_of(self.settings, self.name))} to finish with it")
                self.waiting_said = True
            return
        self.writer = BatchWriter(self.plan, self.settings, self.report, self.addresses, self.on_batch,
                                  per_row_latencies=True)
        try:
            self.query = start_query(self.spark, self.plan, self.settings, self.writer, {"processingTime": self.trigger},
                                     self.writer.fold)
        except Exception as e:  # noqa: BLE001 - a query that cannot start is retried like one that failed
            self._failed(e)
            return
        self.file_list_at_start = file_list_bytes(self.plan.checkpoint(self.settings))

    def restart_if_file_list_grew(self, grace_seconds: float = 30.0) -> bool:
        """Restart the query (keeping its lock) once its checkpoint's list of files grew by
        `file_list_restart_mb` since it started: Spark rewrites that list every tenth batch and loads it at
        a start, and a start forgets the archived segments in it. Returns whether it restarted."""
        limit = self.settings.file_list_restart_mb * 1e6
        if not limit or not self.running:
            return False
        grown = file_list_bytes(self.plan.checkpoint(self.settings)) - self.file_list_at_start
        if grown < limit:
            return False
        return self._restart(f"so that it forgets the archived segments it read (its checkpoint's list of files "
                             f"grew {grown / 1e6:.1f} MB)", grace_seconds)

    def restart_if_source_outgrown(self, grace_seconds: float = 30.0) -> bool:
        """Restart the query (keeping its lock) once its source reads more than it may still need: a query
        that started listing the landing archive and has read all of it holds back the archive's compaction
        while it lists it (ingestion/archive.py). Returns whether it restarted."""
        if not self.running or not plan_log(self.settings, self.plan).source_outgrown(self.plan):
            return False
        return self._restart("so that it stops listing the landing archive it has read", grace_seconds)

    def _restart(self, why: str, grace_seconds: float) -> bool:
        """Stop the query after its batch in flight and start it again, keeping its lock; says why."""
        self.say(f"{self.name}: restarting, {why}")
        self._stop_query(grace_seconds)
        self._start()
        return True

    def _failed(self, error) -> None:
        self.failures += 1
        wait = min(MAX_BACKOFF_SECONDS, 2.0 ** (self.failures - 1))
        first_line = (explain_checkpoint_error(error, self.plan) or explain_task_error(error)
                      or str(error).strip().splitlines()[0]) if error else "stopped"
        self.say(f"{self.name}: query failed ({first_line}); restarting in {wait:.0f} s (failure {self.failures})")
        self._close_writer()
        self.query = None
        self.restart_at = time.monotonic() + wait

    def stop(self, grace_seconds: float = 30.0) -> None:
        """Let the batch in flight commit (up to `grace_seconds`), then stop and give the lock back."""
        self._stop_query(grace_seconds)
        self.lock.release()

    def _stop_query(self, grace_seconds: float) -> None:
        q = self.query
        if q is not None:
            deadline = time.monotonic() + grace_seconds
            while q.isActive and q.status.get("isTriggerActive") and time.monotonic() < deadline:
                time.sleep(0.05)
            q.stop()
        self._close_writer()
        self.query = None

    def _close_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
