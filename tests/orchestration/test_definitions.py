"""The Dagster definitions are built from the registered apps: one lineage graph with every app,
the checks declared on their sinks, their own extras, and Dagster's CLI running a user's app."""

import os
import subprocess
import sys
import textwrap

import dagster as dg
import pytest

from tests.conftest import REPO, land
from transforms import lake
from transforms.api import Application, DeltaSink, source
from transforms.registry import AppLoadError, RegisteredApp
from transforms.settings import ConfigError, Settings, reset_settings

DEFAULT_APPS = "examples.logs:app,examples.market:app,examples.words:app"

# A user's app, written outside the repo: its own stream, a Delta sink with a function check and a
# great-expectations check, and its own Dagster extras (an asset downstream of its table).
TEMPS_APP = '''
"""Temperatures in, Kelvin out."""
from dataclasses import dataclass

import great_expectations as gx
import pyarrow as pa

from transforms.api import Application, DeltaSink, check, computation, decoder, expect, source


@dataclass
class Reading:
    sensor: str
    celsius: float


@decoder(schema=pa.schema([("sensor", pa.string()), ("celsius", pa.float64())]))
def decode_reading(payload: bytes) -> Reading:
    sensor, celsius = payload.decode().split(",")
    return Reading(sensor, float(celsius))


@dataclass
class Kelvin:
    sensor: str
    kelvin: float


@computation("to kelvin")
def to_kelvin(r: Reading) -> Kelvin:
    return Kelvin(r.sensor, r.celsius + 273.15)


@check("every_sensor_named")
def every_sensor_named(df):
    return bool((df["sensor"].str.len() > 0).all()), {"sensors": sorted(df["sensor"].unique())}


app = Application(
    "temps",
    source("temps", decoder=decode_reading)
    .to(to_kelvin)
    .to_sink(DeltaSink("temps_kelvin", checks=[
        every_sensor_named,
        expect("above_absolute_zero", gx.expectations.ExpectColumnValuesToBeBetween(column="kelvin", min_value=0)),
    ])),
    dagster_defs="temps_dagster:defs",
)
'''

TEMPS_DAGSTER = '''
import dagster as dg


@dg.asset(deps=["temps_kelvin"], group_name="temps")
def temps_report() -> None:
    """Anything a user builds on the app's table."""


defs = dg.Definitions(assets=[temps_report])
'''


@pytest.fixture
def user_app(tmp_path, monkeypatch):
    """The temps app in a folder outside the repo, registered with the bundled apps; its settings."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "temps_app.py").write_text(textwrap.dedent(TEMPS_APP))
    (folder / "temps_dagster.py").write_text(textwrap.dedent(TEMPS_DAGSTER))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("EVENTIDE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EVENTIDE_APPS", f"{DEFAULT_APPS},temps_app:app")
    reset_settings()
    yield Settings(), folder
    reset_settings()


def _keys(keys) -> set[str]:
    return {k.to_user_string() for k in keys}


def test_definitions_load_with_every_asset_in_one_lineage_graph():
    from orchestration.definitions import defs

    graph = defs.resolve_asset_graph()
    assert {"landing_logs", "landing_market_data", "landing_orders", "landing_text", "bronze_log_lines",
            "bronze_market_data", "bronze_orders", "bronze_text", "quarantine", "log_windows", "market_state",
            "order_rejections", "word_count_updates", "word_totals"} <= _keys(graph.get_all_asset_keys())
    assert _keys(graph.get(dg.AssetKey("bronze_text")).parent_keys) == {"landing_text"}
    assert _keys(graph.get(dg.AssetKey("word_totals")).parent_keys) == {"landing_text", "bronze_text"}
    assert _keys(graph.get(dg.AssetKey("market_state")).parent_keys) == {
        "landing_market_data", "landing_orders", "bronze_market_data", "bronze_orders"}
    assert {graph.get(dg.AssetKey(k)).group_name for k in ("market_state", "order_rejections")} == {"market_spread"}
    assert graph.get(dg.AssetKey("word_totals")).group_name == "word_count"
    # The checks declared on the market sinks, and the one of its Dagster extras, all blocking.
    market_checks = {c for c in graph.asset_check_keys if c.asset_key.to_user_string() in ("market_state", "order_rejections")}
    assert {c.name for c in market_checks} == {"market_state_prices_valid", "market_state_reject_matches_rule",
                                               "order_rejections_accounted", "order_rejections_unique_in_run"}
    assert all(graph.get_check_spec(c).blocking for c in market_checks)
    pipelines = defs.resolve_job_def("pipelines_job")
    assert "daily_return_code_summary" not in _keys(pipelines.asset_layer.executable_asset_keys)  # partitioned
    assert {"quarantine", "market_state", "word_totals"} <= _keys(pipelines.asset_layer.executable_asset_keys)
    assert defs.resolve_sensor_def("new_segments_sensor") is not None


def test_no_framework_module_imports_the_examples():
    for folder in ("assets", "orchestration", "transforms", "windows"):
        for path in (REPO / folder).rglob("*.py"):
            if path.relative_to(REPO).as_posix() in ("orchestration/demo.py", "orchestration/cli.py"):
                continue  # the demo sends the bundled sample data; `generate` writes it
            text = path.read_text()
            assert "from examples" not in text and "import examples" not in text, path


def test_the_sensors_tick_at_the_interval_the_settings_give():
    """EVENTIDE_SENSOR_INTERVAL_SECONDS sets how often the daemon may tick every sensor (the definitions
    are built at import: a fresh interpreter reads it), and a value below 1 s is refused."""
    probe = ("from orchestration.definitions import defs; "
             "print(sorted((s.name, s.minimum_interval_seconds) for s in defs.sensors))")
    env = {**os.environ, "EVENTIDE_SENSOR_INTERVAL_SECONDS": "7"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[('daily_summary_automation', 7), ('new_segments_sensor', 7)]", out.stderr[-2000:]
    with pytest.raises(ConfigError, match="EVENTIDE_SENSOR_INTERVAL_SECONDS=0"):
        Settings(sensor_interval_seconds=0)


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


def test_new_segments_sensor_skips_while_serve_runs_the_queries(settings):
    from orchestration.definitions import defs
    from transforms.ingestion.gateway import forget_ports, record_ports

    sensor = defs.resolve_sensor_def("new_segments_sensor")
    resources = {"eventide": defs.resources["eventide"]}
    land(settings, "text", [b"hello\n"])
    record_ports(settings, {"text": 1}, queries=False)  # a gateway only: the pipelines must still run
    with dg.build_sensor_context(resources=resources) as ctx:
        assert isinstance(sensor(ctx), dg.RunRequest)
    record_ports(settings, {"text": 1}, queries=True)  # this process plays a running `eventide serve`
    try:
        with dg.build_sensor_context(resources=resources) as ctx:
            skip = sensor(ctx)
        assert isinstance(skip, dg.SkipReason) and "runs the pipelines continuously" in skip.skip_message
    finally:
        forget_ports(settings)


def test_a_users_app_is_in_the_lineage_with_its_checks_extras_and_sensor(user_app):
    from orchestration.definitions import build_definitions

    settings, _folder = user_app
    defs = build_definitions(settings.registry)
    graph = defs.resolve_asset_graph()
    assert _keys(graph.get(dg.AssetKey("temps_kelvin")).parent_keys) == {"landing_temps", "bronze_temps"}
    assert _keys(graph.get(dg.AssetKey("bronze_temps")).parent_keys) == {"landing_temps"}
    assert graph.get(dg.AssetKey("temps_kelvin")).group_name == "temps"
    checks = {c.name: graph.get_check_spec(c) for c in graph.asset_check_keys if c.asset_key == dg.AssetKey("temps_kelvin")}
    assert set(checks) == {"every_sensor_named", "above_absolute_zero"}
    assert all(spec.blocking for spec in checks.values())
    assert _keys(graph.get(dg.AssetKey("temps_report")).parent_keys) == {"temps_kelvin"}  # its own extras
    job_assets = _keys(defs.resolve_job_def("pipelines_job").asset_layer.executable_asset_keys)
    assert {"bronze_temps", "temps_kelvin", "temps_report", "word_totals"} <= job_assets
    assert "bronze_temps" in _keys(graph.get(dg.AssetKey("quarantine")).parent_keys)

    # The segment sensor watches the user's landing log too.
    sensor = defs.resolve_sensor_def("new_segments_sensor")
    with dg.build_sensor_context(resources={"eventide": defs.resources["eventide"]}) as ctx:
        assert isinstance(sensor(ctx), dg.SkipReason)
    land(settings, "temps", [b"kitchen,20.5"])
    with dg.build_sensor_context(resources={"eventide": defs.resources["eventide"]}) as ctx:
        req = sensor(ctx)
    assert isinstance(req, dg.RunRequest) and req.tags["eventide/new_segments"] == "temps"


def test_dagster_defs_that_do_not_load_name_the_app():
    from orchestration.definitions import load_dagster_defs

    def load(entry: str):
        app = Application("mine", source("text").to_sink(DeltaSink("mine_table")), dagster_defs=entry)
        return load_dagster_defs(RegisteredApp("my_module:app", app))

    with pytest.raises(AppLoadError, match=r"app 'mine' \(module my_module\): dagster_defs 'no_such_module:defs': no module"):
        load("no_such_module:defs")
    with pytest.raises(AppLoadError, match=r"dagster_defs 'examples.logs:log_app'.* is of type Application; expected a dagster.Definitions"):
        load("examples.logs:log_app")
    with pytest.raises(AppLoadError, match="expected module:attribute"):
        load("examples.logs_assets")
    assert isinstance(load("examples.logs_assets:defs"), dg.Definitions)


@pytest.mark.spark
def test_dagster_asset_materialize_runs_a_users_app_and_its_checks(user_app, tmp_path):
    settings, folder = user_app
    land(settings, "temps", [b"kitchen,20.5", b"garage,-3.0", b"attic,31.25"])
    env = {**os.environ, "PYTHONPATH": str(folder), "DAGSTER_HOME": str(settings.home / "dagster")}
    (settings.home / "dagster").mkdir(parents=True, exist_ok=True)
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    proc = subprocess.run(
        [dagster, "asset", "materialize", "-m", "orchestration.definitions", "--select", "bronze_temps,temps_kelvin"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lake.count(settings.table_path("bronze_temps")) == 3
    rows = sorted(lake.read(settings.table_path("temps_kelvin")).to_pylist(), key=lambda r: r["sensor"])
    assert [(r["sensor"], round(r["kelvin"], 2)) for r in rows] == [("attic", 304.4), ("garage", 270.15), ("kitchen", 293.65)]

    instance = dg.DagsterInstance.from_config(str(settings.home / "dagster"))
    passed = {}
    for name in ("every_sensor_named", "above_absolute_zero"):
        record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(dg.AssetKey("temps_kelvin"), name))
        passed[name] = record.event.dagster_event.event_specific_data.passed if record and record.event else None
    assert passed == {"every_sensor_named": True, "above_absolute_zero": True}
    # One process for the run's steps (one Spark session), not a process per step.
    (run,) = instance.get_runs()
    kinds = {e.dagster_event.event_type_value for e in instance.all_logs(run.run_id) if e.dagster_event}
    assert "STEP_SUCCESS" in kinds and not kinds & {"STEP_WORKER_STARTING", "STEP_WORKER_STARTED"}


def test_dagster_project_tools_list_and_check_the_definitions(tmp_path):
    """`dg list defs` and `dg check defs` work next to workspace.yaml ([tool.dg] in pyproject.toml)."""
    import json

    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "EVENTIDE_HOME": str(tmp_path / "home"),
           "EVENTIDE_APPS": DEFAULT_APPS, "VIRTUAL_ENV": sys.prefix}
    dg_cli = os.path.join(os.path.dirname(sys.executable), "dg")
    listed = subprocess.run([dg_cli, "list", "defs", "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert listed.returncode == 0, listed.stderr[-3000:]
    defs = json.loads(listed.stdout)
    assets = {a["asset_key"] for a in defs["assets"]}
    assert {"bronze_log_lines", "log_windows", "daily_return_code_summary", "market_state", "word_totals"} <= assets
    assert {s["name"] for s in defs["sensors"]} == {"new_segments_sensor", "daily_summary_automation"}
    checked = subprocess.run([dg_cli, "check", "defs"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert "All definitions loaded successfully." in checked.stdout + checked.stderr
