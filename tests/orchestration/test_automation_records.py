"""`eventide run` and `serve` record their Declarative Automation ticks as the sensor daemon does, so the
UI shows why they ran something: read back here through the UI's own GraphQL API (the webserver's
schema over the workspace's code location, in this process), a tick of daily_summary_automation naming
the run it launched and the days it requested, the summary's condition evaluation under the tick's
evaluation id with the days that were true and the run; serve's next ask, with nothing new, a SKIPPED
tick. Real Spark, Delta and Dagster instance under the home."""

import sys

import pytest
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster_graphql.test.utils import execute_dagster_graphql

from examples.logs import SUMMARY_TABLE
from orchestration.runner import dagster_instance, run_all
from orchestration.service import FollowUps
from tests.conftest import REPO, land
from tests.transforms.test_logs_app import LOG_FILES, log_messages

pytestmark = pytest.mark.spark

SENSOR = "daily_summary_automation"
DAYS = ["2004-03-07", "2004-03-08", "2004-03-09"]  # the three files' days, each closed by its marker

TICKS = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { ticks(limit: 10) {
      tickId status runIds autoMaterializeAssetEvaluationId
      requestedMaterializationsForAssets { assetKey { path } partitionKeys }
    } } }
  }
}"""

EVALUATIONS = """
query Evaluations($assetKey: AssetKeyInput!) {
  assetConditionEvaluationRecordsOrError(assetKey: $assetKey, limit: 10) {
    __typename
    ... on AssetConditionEvaluationRecords { records {
      evaluationId runIds numRequested rootUniqueId
      evaluationNodes { uniqueId expandedLabel numTrue }
    } }
  }
}"""

TRUE_PARTITIONS = """
query True($assetKey: AssetKeyInput!, $evaluationId: ID!, $node: String!) {
  truePartitionsForAutomationConditionEvaluationNode(assetKey: $assetKey, evaluationId: $evaluationId,
                                                     nodeUniqueId: $node)
}"""


def _query(workspace, query: str, variables: dict) -> dict:
    result = execute_dagster_graphql(workspace.create_request_context(), query, variables)
    assert not result.errors, result.errors
    return result.data


def test_run_and_serve_record_ticks_and_evaluations_the_ui_shows(spark, settings, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(settings.dagster_home.absolute()))  # restored after the test
    land(settings, "logs", log_messages(LOG_FILES[:3]))
    said = []
    assert run_all(settings, progress=said.append).passed, said
    assert f"  {SUMMARY_TABLE}: 1 run(s): {DAYS[0]}..{DAYS[-1]}" in said, said
    instance = dagster_instance(settings)
    (run,) = [r for r in instance.get_runs() if r.tags.get("eventide/requested_by") == SENSOR]
    # serve's follow-ups ask the same sensor: nothing new, so a tick that launched nothing.
    assert FollowUps(settings, said.append).run_due() == 0

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name="orchestration.definitions",
                             working_directory=str(REPO)),
        location_name="orchestration.definitions")
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget([origin])) as workspace:
        sensor = _query(workspace, TICKS, {"selector": {
            "repositoryLocationName": "orchestration.definitions", "repositoryName": "__repository__",
            "sensorName": SENSOR}})["sensorOrError"]
        assert sensor["__typename"] == "Sensor", sensor
        serve_tick, run_tick = sensor["sensorState"]["ticks"]  # newest first; nothing else ticked
        assert (serve_tick["status"], serve_tick["runIds"]) == ("SKIPPED", [])
        assert (run_tick["status"], run_tick["runIds"]) == ("SUCCESS", [run.run_id])
        (requested,) = run_tick["requestedMaterializationsForAssets"]
        assert (requested["assetKey"]["path"], sorted(requested["partitionKeys"])) == ([SUMMARY_TABLE], DAYS)
        evaluation_id = run_tick["autoMaterializeAssetEvaluationId"]
        assert evaluation_id == run_tick["tickId"]  # the daemon's: evaluations are stored under the tick's id

        key = {"path": [SUMMARY_TABLE]}
        records = _query(workspace, EVALUATIONS, {"assetKey": key})["assetConditionEvaluationRecordsOrError"]
        assert records["__typename"] == "AssetConditionEvaluationRecords", records
        (record,) = [r for r in records["records"] if r["evaluationId"] == evaluation_id]
        assert (record["runIds"], record["numRequested"]) == ([run.run_id], len(DAYS))
        labels = [" ".join(n["expandedLabel"]) for n in record["evaluationNodes"]]
        assert "day_due" in labels, labels  # why it fired: the condition tree, DayDue among it
        true = _query(workspace, TRUE_PARTITIONS, {"assetKey": key, "evaluationId": evaluation_id,
                                                   "node": record["rootUniqueId"]})
        assert sorted(true["truePartitionsForAutomationConditionEvaluationNode"]) == DAYS

