"""`eventide run`: materialize everything through Dagster, in this process, recorded in the instance
under `EVENTIDE_HOME/dagster` (so `make ui` shows the runs).

First the pipelines job (bronze, every registered app with the checks on its sinks, quarantine).
Then what the apps' extras say is due: every sensor and schedule of the definitions (except those
that start the pipelines job, which just ran) is evaluated once, here, and the runs it requests are
executed in this process. Sensors are asked with the cursor they left at the end of the last run
whose requested runs all succeeded, kept where the Dagster daemon keeps it (the sensor's state in the
instance under `EVENTIDE_HOME/dagster`): `eventide run`, `eventide serve` and the daemon of
`eventide ui` share one memory, so none redoes what another did. The pipelines job's own sensor is
asked before the pipelines run and its cursor kept with the others (what it would ask for, this run
does). A run with nothing new requests nothing; a sensor without a cursor yet is asked without one
and requests everything it would ever have requested; the runs must be idempotent, as partition runs
are (the log app's automation condition, DayDue, needs no cursor: it judges the days from the tables).
Standard and asset sensors, schedules, and automation condition sensors evaluated in user code
(Declarative Automation: their tick is Dagster's own evaluation of the conditions, with the checks
riding along) are asked when they run: as switched in the UI (their state in the instance), else by
their default status.

A failure stops only what depends on it: a failed blocking check (or a failed step) holds back the
assets downstream of it, in the run (Dagster's blocking checks) and in the requested runs (`run_all`
holds back a run that needs an asset the pipelines run left unusable); everything else runs, and the
summary reports each failure for the caller to print and exit non-zero at the end.

Adjacent days one sensor or schedule asks of a job whose assets allow it (a single-run backfill policy,
as the daily summary has) run as one run over their range (`merge_ranges`): a backlog of 30 days is one
run, not 30. Each day keeps its materialization and its checks' evaluations.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import dagster as dg

from transforms.settings import Settings

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
_PARTITION_TAGS = ("dagster/partition", "dagster/partition_set", "dagster/asset_partition_range")
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
_ASKED_SENSORS = ("STANDARD", "ASSET")  # run-status sensors react to events, not state; automation: below


def dagster_instance(settings: Settings) -> dg.DagsterInstance:
    import fcntl

    home = settings.dagster_home.absolute()
    os.environ["DAGSTER_HOME"] = str(home)
    # Resources read settings from the environment: make sure they see the same home and apps.
    os.environ["EVENTIDE_HOME"] = str(settings.home.absolute())
    if settings.app_registry is None:
        os.environ["EVENTIDE_APPS"] = settings.apps
    # One process at a time writes the config and creates the instance: its SQLite storages are made
    # and stamped with their schema version on first use, and two processes doing it at once (serve and
    # `eventide ui` started together) left two version rows ("alembic_version has more than one head"),
    # after which neither could open it. `eventide ui` calls this before Dagster's own processes start.
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".instance.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        write_instance_config(home)
        return dg.DagsterInstance.get()


# What Eventide needs of the instance; other keys a user adds to dagster.yaml are kept.
INSTANCE_CONFIG = {
    "telemetry": {"enabled": False},
    # One Dagster run at a time (sensor, schedule, UI, backfill): runs start a JVM each, and two runs
    # must never work over one checkpoint (the query locks would make the second skip it).
    "concurrency": {"runs": {"max_concurrent_runs": 1}},
}


WORKSPACE_FILE = Path(__file__).resolve().parents[1] / "workspace.yaml"


def _sensor_origin(name: str):
    """The origin by which the Dagster daemon knows sensor `name` of the workspace's code location
    (workspace.yaml): its instigator state, cursor included, is found under the same selector."""
    from dagster._core.definitions.repository_definition.valid_definitions import SINGLETON_REPOSITORY_NAME
    from dagster._core.remote_origin import RemoteInstigatorOrigin, RemoteRepositoryOrigin

    return RemoteInstigatorOrigin(RemoteRepositoryOrigin(_workspace_origin(), SINGLETON_REPOSITORY_NAME), name)


@cache
def _workspace_origin():
    from dagster._core.workspace.load import location_origins_from_yaml_paths

    (origin,) = location_origins_from_yaml_paths([str(WORKSPACE_FILE)])
    return origin


def _sensor_state(instance: dg.DagsterInstance, name: str):
    origin = _sensor_origin(name)
    return origin, instance.get_instigator_state(origin.get_id(), origin.get_selector().get_id())


def load_cursors(instance: dg.DagsterInstance, defs: dg.Definitions) -> dict[str, str | None]:
    """Each sensor's cursor as the Dagster instance holds it: the one memory of `eventide run`,
    `eventide serve` and the daemon under `eventide ui` / `dagster dev` (a sensor without a cursor
    yet is left out: it is asked without one, and requests everything, which idempotent runs allow)."""
    from dagster._core.scheduler.instigation import SensorInstigatorData

    cursors = {}
    for sensor in defs.sensors or ():
        _, state = _sensor_state(instance, sensor.name)
        data = state.instigator_data if state is not None else None
        if isinstance(data, SensorInstigatorData) and data.cursor is not None:
            cursors[sensor.name] = data.cursor
    return cursors


def save_cursors(instance: dg.DagsterInstance, defs: dg.Definitions, cursors: dict[str, str | None]) -> None:
    """Store the sensors' cursors in the instance, where the daemon reads them (its sensor state, made
    as the daemon makes it when there is none yet)."""
    from dagster._core.scheduler.instigation import (
        InstigatorState,
        InstigatorStatus,
        InstigatorType,
        SensorInstigatorData,
    )

    now = time.time()
    for sensor in defs.sensors or ():
        if cursors.get(sensor.name) is None:
            continue
        origin, state = _sensor_state(instance, sensor.name)
        if state is None:
            instance.add_instigator_state(InstigatorState(
                origin, InstigatorType.SENSOR, InstigatorStatus.DECLARED_IN_CODE,
                SensorInstigatorData(min_interval=sensor.minimum_interval_seconds, cursor=cursors[sensor.name],
                                     last_sensor_start_timestamp=now, sensor_type=sensor.sensor_type)))
            continue
        data = state.instigator_data
        if not isinstance(data, SensorInstigatorData):
            data = SensorInstigatorData(min_interval=sensor.minimum_interval_seconds, sensor_type=sensor.sensor_type)
        if data.cursor != cursors[sensor.name]:
            instance.update_instigator_state(state.with_data(data._replace(cursor=cursors[sensor.name])))


def pipelines_caught_up(settings: Settings) -> bool:
    """After `eventide serve` stopped: if no query of the home has anything left to do, what the
    pipelines' sensor would ask for is done, so its cursor moves on (the daemon under `eventide ui`
    then launches no pipelines run for what serve processed). False, and nothing kept, otherwise."""
    from orchestration.definitions import build_definitions
    from orchestration.sensors import PIPELINES_JOB
    from transforms.engine.runner import home_has_work

    if home_has_work(settings):
        return False
    defs = build_definitions(settings.registry)
    instance = dagster_instance(settings)
    cursors = load_cursors(instance, defs)
    due_runs(defs, instance, cursors=cursors, only_jobs=(PIPELINES_JOB,))
    save_cursors(instance, defs, cursors)
    return True


def write_instance_config(dagster_home) -> None:
    """Write `<dagster_home>/dagster.yaml` with INSTANCE_CONFIG, keeping what else it holds."""
    import yaml

    dagster_home.mkdir(parents=True, exist_ok=True)
    path = dagster_home / "dagster.yaml"
    config = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    merged = _merge(INSTANCE_CONFIG, config)
    if merged != config:
        path.write_text(yaml.safe_dump(merged, sort_keys=False))


def _merge(ours: dict, theirs: dict) -> dict:
    out = dict(theirs)
    for k, v in ours.items():
        out[k] = _merge(v, theirs.get(k) or {}) if isinstance(v, dict) else v
    return out


@dataclass(frozen=True)
class CheckFailure:
    """A failed asset check, for the report: which asset, check and partition, what it checks, and its
    metadata (the failing rows, when the check records them)."""

    asset: str
    check: str
    partition: str
    description: str
    metadata: dict
    blocking: bool

    def lines(self) -> list[str]:
        """What the user is told: which asset, check and partition, why, the rows or counts its
        metadata records, and what to do."""
        where = f"{self.asset}[{self.partition}]" if self.partition else self.asset
        lines = [f"  check FAILED: {where} {self.check}" + ("" if self.blocking else " (not blocking)")]
        if self.description:
            lines.append(f"    what it checks: {self.description}")
        for key, value in self.metadata.items():
            lines.append(f"    {key}: {_detail(value)}")
        part = f", partition {self.partition}" if self.partition else ""
        lines.append(f"    what to do: look at the rows (`eventide show {self.asset}`{part}), fix the input or the check, "
                     "then `eventide run` again" + (": what it held back runs then" if self.blocking else ""))
        return lines


def _detail(value, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class RunSummary:
    """What `run_all` did. `ok`: no step failed other than by a failed check (those are in `checks` and
    `check_failures`); `passed`: that, and every check passed."""

    ok: bool = True
    materialized: dict[str, dict] = field(default_factory=dict)
    checks: list[tuple[str, str, bool, str]] = field(default_factory=list)  # (asset, check, passed, partition)
    failures: list[str] = field(default_factory=list)
    check_failures: list[CheckFailure] = field(default_factory=list)
    # Assets a run planned but did not materialize (downstream of a failed check, or of an error).
    not_materialized: list[str] = field(default_factory=list)
    # Runs a sensor or schedule asked for, not executed: what they need was not materialized.
    held_back: list[str] = field(default_factory=list)

    @property
    def failed_checks(self) -> int:
        return sum(not c[2] for c in self.checks)

    @property
    def passed(self) -> bool:
        return self.ok and not self.failed_checks


@dataclass(frozen=True)
class DueRun:
    """A run a sensor or schedule requested: job, partition (or ""), and who asked."""

    job: str
    partition_key: str
    requested_by: str
    request: dg.RunRequest = field(compare=False, repr=False)
    through: str = ""  # the last partition of a range run as one (merge_ranges); "" = partition_key alone
    tick: AutomationTick | None = field(default=None, compare=False, repr=False)  # the automation tick that asked

    @property
    def partitions(self) -> str:
        """The partition, or the range `first..last`; "" for an unpartitioned run."""
        return f"{self.partition_key}..{self.through}" if self.through else self.partition_key

    @property
    def name(self) -> str:
        """The job, or for Declarative Automation's runs (Dagster's implicit asset job) the assets it makes."""
        if self.job == AUTOMATION_JOB and self.request.asset_selection:
            return ",".join(k.to_user_string() for k in self.request.asset_selection)
        return self.job

    @property
    def label(self) -> str:
        return f"{self.name}[{self.partitions}]" if self.partition_key else self.name


def runs_as_one(job: dg.JobDefinition) -> bool:
    """Whether Dagster lets the job run a range of partitions as one run: every asset of it has a
    single-run backfill policy (as the log app's daily summary has)."""
    graph = job.asset_layer.asset_graph
    policies = [graph.get(k).backfill_policy for k in job.asset_layer.selected_asset_keys]
    return all(p is not None and p.max_partitions_per_run is None for p in policies)  # None: no limit


def merge_ranges(defs: dg.Definitions, due: list[DueRun]) -> list[DueRun]:
    """`due` (sorted, as due_runs returns it) with each stretch of adjacent partitions of one job, asked
    by the same sensor or schedule with the same tags and config, as one run over their range, when the
    job runs as one (runs_as_one)."""
    out: list[DueRun] = []
    for run in due:
        prev = out[-1] if out else None
        if prev is not None and _extends(defs, prev, run):
            out[-1] = dataclasses.replace(prev, through=run.partition_key)
        else:
            out.append(run)
    return out


def _extends(defs: dg.Definitions, prev: DueRun, run: DueRun) -> bool:
    a, b = prev.request, run.request
    if (run.job != prev.job or not run.partition_key or not prev.partition_key or run.requested_by != prev.requested_by
            or _run_tags(a) != _run_tags(b) or a.run_config != b.run_config or a.asset_selection != b.asset_selection):
        return False
    job = defs.resolve_job_def(run.job)
    parts = job.partitions_def
    if not runs_as_one(job) or not hasattr(parts, "get_next_partition_key"):
        return False
    return parts.get_next_partition_key(prev.through or prev.partition_key) == run.partition_key


def _run_tags(req: dg.RunRequest) -> dict:
    return {k: v for k, v in (req.tags or {}).items() if not k.startswith(_PARTITION_TAGS)}


def check_evaluations(result) -> list:
    """A run's check evaluations, each once: in a run over a range, a check that evaluated each
    partition (assets.checks.check_each_partition) also returned the range's result, which is left out."""
    evaluations = result.get_asset_check_evaluations()
    per_partition = {(ev.asset_key, ev.check_name) for ev in evaluations if ev.partition is not None}
    return [ev for ev in evaluations if ev.partition is not None or (ev.asset_key, ev.check_name) not in per_partition]


def _metadata(md) -> dict:
    return {k: getattr(v, "value", v) for k, v in (md or {}).items()}


def _collect(result, summary: RunSummary, partition: str = "") -> set[dg.AssetKey]:
    """Record a run's materializations, checks and failures; returns the asset keys the run leaves
    unusable downstream: those with a failed blocking check, and those it planned but did not materialize."""
    done: set[dg.AssetKey] = set()
    for ev in result.get_asset_materialization_events():
        mat = ev.event_specific_data.materialization
        done.add(mat.asset_key)
        name = mat.asset_key.to_user_string() + (f"[{mat.partition}]" if mat.partition else "")
        summary.materialized[name] = _metadata(mat.metadata)
    blocked: set[dg.AssetKey] = set()
    for ev in check_evaluations(result):
        summary.checks.append((ev.asset_key.to_user_string(), ev.check_name, ev.passed, ev.partition or partition))
        if not ev.passed:
            blocking = bool(ev.blocking) and ev.severity == dg.AssetCheckSeverity.ERROR
            spec = result.job_def.asset_layer.asset_graph.get_check_spec(dg.AssetCheckKey(ev.asset_key, ev.check_name))
            summary.check_failures.append(CheckFailure(ev.asset_key.to_user_string(), ev.check_name, ev.partition or partition,
                                                       ev.description or spec.description or "",
                                                       _metadata(ev.metadata), blocking))
            if blocking:
                blocked.add(ev.asset_key)
    planned = set(result.job_def.asset_layer.selected_asset_keys)
    missing = planned - done
    suffix = f"[{partition}]" if partition else ""
    summary.not_materialized.extend(sorted(k.to_user_string() + suffix for k in missing))
    if not result.success:
        for ev in result.all_events:
            if ev.is_failure and ev.event_specific_data is not None:
                err = getattr(ev.event_specific_data, "error", None)
                if err is not None and err.cls_name == "DagsterAssetCheckFailedError":
                    continue  # a blocking check that failed: reported with the checks, not as an error
                summary.ok = False
                summary.failures.append(f"{ev.step_key}: {err.message.strip() if err else ev.message}")
    return blocked | missing


def due_runs(defs: dg.Definitions, instance: dg.DagsterInstance, skip_jobs: tuple[str, ...] = (),
             now: dt.datetime | None = None, cursors: dict[str, str | None] | None = None,
             only_jobs: tuple[str, ...] | None = None) -> list[DueRun]:
    """Ask every standard sensor and schedule (default RUNNING) of `defs` once and return the runs they
    request, one per (job, partition), sorted. Those targeting `skip_jobs` are not asked, nor (with
    `only_jobs`) those targeting none of `only_jobs`.

    Without `cursors` sensors are asked without a cursor (everything they would ever request); with
    it, each sensor gets its entry and the dict gets the cursor it leaves (`eventide serve` keeps one)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    resources = dict(defs.resources or {})
    repo = defs.get_repository_def()  # partitioned run requests are resolved against it
    asked: list[tuple[str, str | None, list[dg.RunRequest]]] = []
    ticks: dict[str, AutomationTick] = {}
    for sensor in defs.sensors or ():
        if _evaluates_automation(sensor):
            if only_jobs is None and _is_running(instance, sensor):
                requests, ticks[sensor.name] = _automation_requests(defs, instance, sensor, cursors)
                asked.append((sensor.name, AUTOMATION_JOB, requests))
            continue
        jobs = [t.job_name for t in sensor.targets]
        if (sensor.sensor_type.name not in _ASKED_SENSORS or not _is_running(instance, sensor)
                or set(jobs) & set(skip_jobs) or (only_jobs is not None and not set(jobs) & set(only_jobs))):
            continue
        cursor = cursors.get(sensor.name) if cursors is not None else None
        with dg.build_sensor_context(instance=instance, resources=resources, sensor_name=sensor.name,
                                     repository_def=repo, cursor=cursor) as ctx:
            data = sensor.evaluate_tick(ctx)
        if cursors is not None and data.cursor is not None:
            cursors[sensor.name] = data.cursor
        asked.append((sensor.name, jobs[0] if len(jobs) == 1 else None, list(data.run_requests or ())))
    for schedule in defs.schedules or ():
        if (not _is_running(instance, schedule) or schedule.job_name in skip_jobs
                or (only_jobs is not None and schedule.job_name not in only_jobs)):
            continue
        with dg.build_schedule_context(instance=instance, resources=resources, scheduled_execution_time=now,
                                       repository_def=repo) as ctx:
            data = schedule.evaluate_tick(ctx)
        asked.append((schedule.name, schedule.job_name, list(data.run_requests or ())))
    due: dict[tuple[str, str], DueRun] = {}
    for who, default_job, requests in asked:
        for req in requests:
            job = req.job_name or default_job
            if job is None:
                raise ValueError(f"{who} requested a run without a job name and targets several jobs")
            tags = req.tags or {}
            tick = ticks.get(who)
            if RANGE_START in tags:  # Declarative Automation's ranged run (a single-run backfill policy)
                run = DueRun(job, tags[RANGE_START], who, req, through=tags[RANGE_END], tick=tick)
            else:
                run = DueRun(job, req.partition_key or "", who, req, tick=tick)
            due.setdefault((job, run.partition_key), run)
    return [due[k] for k in sorted(due)]


AUTOMATION_JOB = "__ASSET_JOB"  # Dagster's implicit asset job: what the daemon runs an automation request in


def _evaluates_automation(sensor) -> bool:
    """An automation condition sensor evaluated in user code (use_user_code_server): its tick is
    Dagster's own evaluation of the conditions (AutomationTickEvaluationContext), which this process can
    run as the daemon's code server does. (Dagster keeps the flag private.)"""
    return sensor.sensor_type.name == "AUTOMATION" and bool(getattr(sensor, "_use_user_code_server", False))


def _is_running(instance: dg.DagsterInstance, instigator) -> bool:
    """As the daemon decides: a sensor's or schedule's status in the instance if someone switched it (in
    the UI), else its default status."""
    from dagster._core.scheduler.instigation import InstigatorStatus

    _, state = _sensor_state(instance, instigator.name)  # a schedule's state is found the same way
    if state is not None and state.status in (InstigatorStatus.RUNNING, InstigatorStatus.STOPPED):
        return state.status == InstigatorStatus.RUNNING
    return instigator.default_status.name == "RUNNING"  # DefaultSensorStatus or DefaultScheduleStatus


def _automation_requests(defs: dg.Definitions, instance: dg.DagsterInstance, sensor,
                         cursors: dict[str, str | None] | None) -> tuple[list[dg.RunRequest], AutomationTick]:
    """One tick of an automation condition sensor: the run requests of the conditions that are true now,
    each with the checks that ride along, and the tick recorded as the daemon records it (AutomationTick).
    Its cursor (the conditions' memory) is the daemon's. Several partitions of an asset come as one
    backfill request (emit_backfills), which the daemon hands to its backfill loop; here it becomes the
    runs that loop would launch (Dagster's build_run_requests_with_backfill_policies: a single-run policy
    gives a run per range of days)."""
    from dagster._core.definitions.automation_tick_evaluation_context import (
        build_run_requests_with_backfill_policies,
    )

    tick = AutomationTick.start(instance, sensor.name)
    cursor = cursors.get(sensor.name) if cursors is not None else None
    with dg.build_sensor_context(instance=instance, repository_def=defs.get_repository_def(),
                                 sensor_name=sensor.name, cursor=cursor) as ctx:
        # Dagster's evaluator says each step of the tick at INFO on its own console handler (the
        # daemon's log); here the tick is said once, as the runs it asked for, and kept in the instance.
        ctx.log.setLevel(logging.WARNING)
        data = sensor.evaluate_tick(ctx)
    if cursors is not None and data.cursor is not None:
        cursors[sensor.name] = data.cursor
    tick.evaluated(data.automation_condition_evaluations, list(data.run_requests or ()))
    requests = []
    for req in data.run_requests or ():
        if req.requires_backfill_daemon():
            runs = build_run_requests_with_backfill_policies(
                list(req.asset_graph_subset.iterate_asset_partitions()), defs.resolve_asset_graph(), instance)
            requests.extend(r.with_replaced_attrs(tags={**(req.tags or {}), **(r.tags or {})}) for r in runs)
        else:
            requests.append(req)
    return requests, tick


class AutomationTick:
    """What the sensor daemon records of an automation condition sensor's tick (dagster/_daemon/sensor.py),
    recorded the same way for `eventide run` and `serve`, so that the UI's Automation page and an asset's
    Automation tab show why they ran something as they show the daemon's: a tick of the sensor (under the
    daemon's origin and selector) and the conditions' evaluations stored under the tick's id, each
    naming the runs launched for it. The tick stays STARTED until a run it asked for ran (SUCCESS);
    one that asked for nothing is SKIPPED. One whose runs never ran (held back, serve stopped) is moved
    to SKIPPED by the next tick, as the daemon does with a dangling tick."""

    def __init__(self, instance: dg.DagsterInstance, tick):
        self.instance, self.tick = instance, tick
        self.evaluations: dict = {}  # entity key -> AutomationConditionEvaluationWithRunIds

    @classmethod
    def start(cls, instance: dg.DagsterInstance, sensor_name: str) -> AutomationTick:
        from dagster._core.scheduler.instigation import InstigatorType, TickData, TickStatus

        origin = _sensor_origin(sensor_name)
        origin_id, selector_id = origin.get_id(), origin.get_selector().get_id()
        last = next(iter(instance.get_ticks(origin_id, selector_id, limit=1)), None)
        # A tick with reserved runs is the daemon's to resume; any other STARTED one is dangling.
        if last is not None and last.status == TickStatus.STARTED and not last.unsubmitted_run_ids_with_requests:
            instance.update_tick(last.with_status(TickStatus.SKIPPED))
        return cls(instance, instance.create_tick(TickData(
            instigator_origin_id=origin_id, instigator_name=sensor_name, instigator_type=InstigatorType.SENSOR,
            status=TickStatus.STARTED, timestamp=time.time(), selector_id=selector_id)))

    def _store(self, evaluations) -> None:
        storage = self.instance.schedule_storage
        if evaluations and storage is not None and storage.supports_auto_materialize_asset_evaluations:
            storage.add_auto_materialize_asset_evaluations(evaluation_id=self.tick.tick_id,
                                                           asset_evaluations=list(evaluations))

    def evaluated(self, evaluations, requests: list[dg.RunRequest]) -> None:
        """The conditions' evaluations, stored before any run (as the daemon does), and the tick's requests
        (what the UI counts as requested); without a request the tick is over."""
        from dagster._core.scheduler.instigation import TickStatus

        self.evaluations = {ev.key: ev.with_run_ids(set()) for ev in evaluations}
        self._store(self.evaluations.values())
        # No reserved run ids: the daemon would resume a STARTED tick's unsubmitted ones, launching
        # what this process holds back or runs itself.
        self.tick = self.tick.with_run_requests(requests)
        if not requests:
            self.tick = self.tick.with_status(TickStatus.SKIPPED)
        self.instance.update_tick(self.tick)

    def ran(self, run_id: str, request: dg.RunRequest) -> None:
        """A run the tick asked for ran: the tick names it, and so does the evaluation of each asset and
        check it selected."""
        from dagster._core.scheduler.instigation import TickStatus

        self.tick = self.tick.with_run_info(run_id).with_status(TickStatus.SUCCESS)
        self.instance.update_tick(self.tick)
        updated = []
        for key in [*(request.asset_selection or ()), *(request.asset_check_keys or ())]:
            if key in self.evaluations:
                ev = self.evaluations[key]
                self.evaluations[key] = updated_ev = dataclasses.replace(ev, run_ids=ev.run_ids | {run_id})
                updated.append(updated_ev)
        self._store(updated)


def execute_due(defs: dg.Definitions, instance: dg.DagsterInstance, run: DueRun):
    req = run.request
    tags = {**_run_tags(req), "eventide/requested_by": run.requested_by}
    if run.through:
        tags.update({RANGE_START: run.partition_key, RANGE_END: run.through})
    config = req.run_config if isinstance(req.run_config, dict) else {}
    result = defs.resolve_job_def(run.job).execute_in_process(
        instance=instance, partition_key=None if run.through else (run.partition_key or None),
        run_config={**QUIET, **config}, tags=tags, asset_selection=req.asset_selection, raise_on_error=False)
    if run.tick is not None:
        run.tick.ran(result.run_id, req)
    return result


def _needs(defs: dg.Definitions, run: DueRun) -> set[dg.AssetKey]:
    """The assets a requested run materializes, and everything upstream of them."""
    graph = defs.resolve_asset_graph()
    keys = set(run.request.asset_selection or defs.resolve_job_def(run.job).asset_layer.selected_asset_keys)
    return keys.union(*(graph.get_ancestor_asset_keys(k) for k in keys))


class _SayQueries(logging.Handler):
    """Hands each query's progress, said by the app steps this process runs, to `run_all`'s `progress`."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        self.say(f"  {record.getMessage()}")


def run_all(settings: Settings, progress: Callable[[str], None] = print, summaries: bool = True,
            spark_starting: threading.Thread | None = None, started: Callable[[], None] | None = None) -> RunSummary:
    """The pipelines job, then (with `summaries`) every run the apps' sensors and schedules ask for.

    One failure stops only what depends on it. In the pipelines run, Dagster skips the steps downstream
    of a failed blocking check (or of a failed step) and runs every other one. Then each requested run
    executes unless something it needs, upstream, was left unusable by the pipelines run (its check
    failed or it was not materialized): that run is held back and reported. Everything is reported in
    the summary; the caller decides the exit status (`eventide run`: non-zero at the end).

    `spark_starting`: a thread starting the Spark session (transforms.spark.start_in_background), joined
    before anything runs or prints. `started`: called once the start is done, as the pipelines begin.

    Each query's progress (messages, batches, seconds; every few seconds in a long run) is said through
    `progress` as the steps say it to Dagster.
    """
    from assets.apps import QUERY_PROGRESS

    handler, level = _SayQueries(progress), QUERY_PROGRESS.level
    QUERY_PROGRESS.addHandler(handler)
    QUERY_PROGRESS.setLevel(logging.INFO)
    try:
        return _run_all(settings, progress, summaries, spark_starting, started)
    finally:
        QUERY_PROGRESS.removeHandler(handler)
        QUERY_PROGRESS.setLevel(level)


def _run_all(settings: Settings, progress: Callable[[str], None], summaries: bool,
             spark_starting: threading.Thread | None, started: Callable[[], None] | None) -> RunSummary:
    """`run_all`, with the query progress of its steps said through `progress` already."""
    from orchestration.definitions import build_definitions
    from orchestration.sensors import PIPELINES_JOB

    defs = build_definitions(settings.registry)  # the settings' apps (the module-level defs: the environment's)
    instance = dagster_instance(settings)
    summary = RunSummary()
    if spark_starting is not None:
        # The checks' great-expectations, imported while the JVM starts rather than in a check's step (apps
        # with no check at all, a user's own app in the tests, skip it). The starting thread imports nothing
        # (start_in_background), so this import meets no module half initialized by it.
        if summaries and defs.resolve_asset_graph().asset_check_keys:
            from assets.gx import warm_up

            try:
                warm_up()
            except Exception:  # noqa: BLE001 - the check that needs it meets the error, in its own step
                pass
        spark_starting.join()  # it swaps stdout and stderr while the JVM starts: nothing may print before
    cursors = load_cursors(instance, defs)
    # What the pipelines' sensor would ask for now, this run does: its cursor moves on with the others.
    due_runs(defs, instance, cursors=cursors, only_jobs=(PIPELINES_JOB,))
    progress("running the pipelines (bronze, apps, quarantine) through Dagster ...")
    if started is not None:
        started()
    result = defs.resolve_job_def(PIPELINES_JOB).execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET)
    unusable = _collect(result, summary)
    for name, meta in sorted(summary.materialized.items()):
        if "rows_added" in meta:
            progress(f"  {name}: +{meta['rows_added']} rows, {meta.get('total_rows')} in all")
    for f in summary.check_failures:
        progress(f"  check FAILED: {f.asset} {f.check}")
    if summary.not_materialized:
        progress(f"  not materialized (downstream of a failure): {', '.join(summary.not_materialized)}")
    if not summaries:
        if summary.passed:
            save_cursors(instance, defs, cursors)
        return summary
    progress("asking the apps' sensors and schedules what is due ...")
    due = merge_ranges(defs, due_runs(defs, instance, skip_jobs=(PIPELINES_JOB,), cursors=cursors))
    runnable = []
    for run in due:
        blocked_by = sorted(k.to_user_string() for k in _needs(defs, run) & unusable)
        if blocked_by:
            summary.held_back.append(f"{run.label} (needs {', '.join(blocked_by)})")
        else:
            runnable.append(run)
    for name in dict.fromkeys(r.name for r in runnable):
        keys = [r.partitions for r in runnable if r.name == name]
        progress(f"  {name}: {len(keys)} run(s)" + (f": {', '.join(k for k in keys if k)}" if any(keys) else ""))
    for held in summary.held_back:
        progress(f"  held back: {held}")
    if not due:
        progress("  nothing due")
    for run in runnable:
        _collect(execute_due(defs, instance, run), summary, run.partitions)
    # The cursors move on only when every requested run ran and passed; else the next run asks again.
    if summary.passed and not summary.held_back:
        save_cursors(instance, defs, cursors)
    return summary
