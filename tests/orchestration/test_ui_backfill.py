"""A backfill of several days launched as the Dagster UI launches it: the `launchPartitionBackfill`
GraphQL mutation over the workspace, then the daemon's own iterations (the backfill daemon plans the
runs, the queued-run coordinator launches them). It runs as ONE run over the range (the summary's
single-run backfill policy), recounts each day from bronze and checks each day.

The only departure from `eventide ui`: the run launcher executes the run in this process
(Dagster's SyncInMemoryRunLauncher) instead of starting a run worker, so the run uses the test's
Spark session. Real Spark, Delta and Dagster instance under the home."""

import logging
import sys

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.instance.ref import InstanceRef
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from examples.logs import BRONZE_TABLE, SUMMARY_TABLE
from orchestration.runner import QUIET, RANGE_END, RANGE_START, dagster_instance
from tests.conftest import REPO, land
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages
from transforms import lake

pytestmark = pytest.mark.spark

DAYS = ["2004-03-07", "2004-03-08", "2004-03-09"]  # the landed files hold 2004-03-10 too: outside the range
CHECKS = ("rows_are_valid", "total_matches_bronze", "reconciles_with_bronze")
IN_PROCESS_LAUNCHER = {"module": "dagster._core.launcher.sync_in_memory_run_launcher", "class": "SyncInMemoryRunLauncher"}


def _bronze_only(settings, instance) -> None:
    """Land the four days and make bronze only: a backfill recounts from bronze, nothing else."""
    from orchestration.definitions import build_definitions

    land(settings, "logs", log_messages(LOG_FILES))
    job = dg.define_asset_job("bronze_logs", selection=dg.AssetSelection.assets(BRONZE_TABLE))
    defs = dg.Definitions.merge(build_definitions(settings.registry), dg.Definitions(jobs=[job]))
    assert defs.resolve_job_def(job.name).execute_in_process(instance=instance, run_config=QUIET).success


def test_a_ui_backfill_of_three_days_runs_as_one_run_with_exact_summaries(spark, settings, monkeypatch):
    from orchestration.definitions import defs

    assert defs.resolve_assets_def(SUMMARY_TABLE).backfill_policy == dg.BackfillPolicy.single_run()
    monkeypatch.setenv("DAGSTER_HOME", str(settings.dagster_home.absolute()))  # restored after the test
    _bronze_only(settings, dagster_instance(settings))
    assert not lake.exists(settings.table_path(SUMMARY_TABLE))

    ref = InstanceRef.from_dir(str(settings.dagster_home.absolute()), overrides={"run_launcher": IN_PROCESS_LAUNCHER})
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name="orchestration.definitions",
                             working_directory=str(REPO)),
        location_name="orchestration.definitions")
    with dg.DagsterInstance.from_ref(ref) as instance, \
            WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget([origin])) as workspace:
        runs_before = {r.run_id for r in instance.get_runs()}
        # What the UI sends when days of the asset are selected and "Launch backfill" is pressed.
        launched = execute_dagster_graphql(workspace.create_request_context(), LAUNCH_PARTITION_BACKFILL_MUTATION, {
            "backfillParams": {"assetSelection": [{"path": [SUMMARY_TABLE]}], "partitionNames": DAYS,
                               "fromFailure": False, "tags": []}}).data["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]

        log = logging.getLogger("test_ui_backfill")
        for _ in range(4):  # the daemon's loops, one iteration at a time
            list(execute_backfill_iteration(workspace, log))
            list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))
            status = instance.get_backfill(backfill_id).status
            if status != BulkActionStatus.REQUESTED:
                break
        assert status == BulkActionStatus.COMPLETED_SUCCESS, status

        (run,) = [r for r in instance.get_runs() if r.run_id not in runs_before]  # one run, not one per day
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags["dagster/backfill"] == backfill_id
        assert (run.tags[RANGE_START], run.tags[RANGE_END]) == (DAYS[0], DAYS[-1])

        summary = dg.AssetKey(SUMMARY_TABLE)
        assert instance.get_materialized_partitions(summary) == set(DAYS)
        records = {(rec.partition, name): rec.status.value
                   for name in CHECKS
                   for rec in instance.event_log_storage.get_asset_check_execution_history(
                       dg.AssetCheckKey(summary, name), limit=20)
                   if rec.run_id == run.run_id and rec.partition is not None}
        assert records == {(d, name): "SUCCEEDED" for d in DAYS for name in CHECKS}

    stored = sorted((r["day"].isoformat(), r["status"], r["count"])
                    for r in lake.read(settings.table_path(SUMMARY_TABLE)).to_pylist())
    assert stored == [row for row in expected_summary() if row[0] in DAYS]
