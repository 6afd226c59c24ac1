"""The Dagster definitions load, show one lineage graph, and run from Dagster's own CLI."""

import os
import subprocess
import sys

import dagster as dg

from tests.conftest import DATA, REPO, land
from transforms import lake
from transforms.framing import iter_file_messages


def test_definitions_load_with_every_asset_in_one_lineage_graph():
    from orchestration.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"landing_logs", "landing_market", "landing_text", "bronze_log_lines", "bronze_market_data",
            "bronze_orders", "bronze_text", "quarantine", "word_count_updates", "word_totals"} <= keys
    assert dg.AssetKey("landing_text") in graph.get(dg.AssetKey("bronze_text")).parent_keys
    assert dg.AssetKey("bronze_text") in graph.get(dg.AssetKey("word_totals")).parent_keys
    assert defs.resolve_job_def("pipelines_job") is not None
    assert defs.resolve_sensor_def("new_segments_sensor") is not None


def test_new_segments_sensor_requests_a_run_only_for_new_segments(settings):
    from orchestration.definitions import defs

    sensor = defs.resolve_sensor_def("new_segments_sensor")
    resources = {"eventide": defs.resources["eventide"]}
    with dg.build_sensor_context(resources=resources) as ctx:
        assert isinstance(sensor(ctx), dg.SkipReason)
    land(settings, "text", [b"hello\n"])
    with dg.build_sensor_context(resources=resources) as ctx:
        req = sensor(ctx)
        assert isinstance(req, dg.RunRequest)
        cursor = ctx.cursor
    with dg.build_sensor_context(resources=resources, cursor=cursor) as ctx:
        assert isinstance(sensor(ctx), dg.SkipReason)


def test_dagster_asset_materialize_from_the_cli(settings):
    lines = list(iter_file_messages(DATA / "word_count" / "count_this.txt"))
    land(settings, "text", lines)
    env = {**os.environ, "EVENTIDE_HOME": str(settings.home), "DAGSTER_HOME": str(settings.home / "dagster")}
    (settings.home / "dagster").mkdir(parents=True, exist_ok=True)
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    proc = subprocess.run(
        [dagster, "asset", "materialize", "-m", "orchestration.definitions", "--select", "bronze_text"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lake.count(settings.table_path("bronze_text")) == len(lines) == 29  # empty lines are messages too
