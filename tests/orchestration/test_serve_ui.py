"""`eventide serve` next to `eventide ui` on one home, as the README runs them: both come up, and the
Dagster UI shows the tables serve writes as they change (runless materializations with serve's
metadata), while its pipelines sensor leaves the queries to serve. Real processes, real Spark, real
Dagster webserver and daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request

import dagster as dg
import pytest

from examples.market import MARKET_STATE_TABLE
from orchestration.definitions import build_definitions
from orchestration.runner import due_runs, load_cursors
from orchestration.sensors import PIPELINES_JOB
from orchestration.status import compute_status
from tests.orchestration.test_serve import (
    EVENTIDE,
    NBBO,
    START_SECONDS,
    _drain,
    _env,
    _rows,
    _send,
    _wait_for,
)
from tests.services import Service
from tests.tcp import Receiver
from transforms.ingestion import open_log
from transforms.ports import free_port
from transforms.settings import Settings

MATERIALIZATIONS = """{ assetOrError(assetKey: {path: ["%s"]}) { ... on Asset { assetMaterializations(limit: 10) {
    runId metadataEntries { label ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text } } } } } }"""
SENSOR_TICKS = """{ sensorsOrError(repositorySelector: {repositoryName: "__repository__", repositoryLocationName: "%s"}) {
    ... on Sensors { results { name sensorState { ticks(limit: 5) { status skipReason } } } } } }"""


def _graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=10).read())["data"]


def _served_materializations(port: int, table: str) -> list[dict]:
    """The UI's materializations of `table` that serve reported: {label: value} each, newest first."""
    try:
        asset = _graphql(port, MATERIALIZATIONS % table)["assetOrError"]
    except (OSError, KeyError, TypeError, ValueError):
        return []
    out = []
    for m in asset.get("assetMaterializations") or ():
        meta = {e["label"]: e.get("intValue", e.get("text")) for e in m["metadataEntries"]}
        if meta.get("source") == "eventide serve" and m["runId"] == "":
            out.append(meta)
    return out


@pytest.mark.spark
def test_serve_next_to_the_ui_shows_the_tables_live(tmp_path):
    home, receiver = tmp_path / "home", Receiver()
    ports = {"market_data": free_port(), "orders": free_port()}
    ui_port = free_port()
    env = _env(home, EVENTIDE_APPS="examples.market:app", EVENTIDE_SINK_ORDER_RESULTS=receiver.address,
               EVENTIDE_PORTS=",".join(f"{k}={v}" for k, v in ports.items()))
    service = Service(env, tmp_path, [EVENTIDE, "serve"])
    ui = subprocess.Popen([EVENTIDE, "ui", "--port", str(ui_port)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    try:
        service.wait_for_line("all ", timeout=START_SECONDS)
        assert _wait_for(lambda: _graphql_up(ui_port), 180), "the Dagster UI did not come up within 180 s"
        assert _served_materializations(ui_port, MARKET_STATE_TABLE) == []  # nothing written yet

        _send(ports["market_data"], NBBO.read_bytes())
        assert len(_wait_for(lambda: len(_rows(home, MARKET_STATE_TABLE)) >= 350 and _rows(home, MARKET_STATE_TABLE),
                             60)) == 350
        # serve reports each table at most every report_interval (5 s): the UI has it soon after.
        seen = _wait_for(lambda: _served_materializations(ui_port, MARKET_STATE_TABLE), 60)
        assert seen, "the UI shows no materialization of market_state from serve"
        assert sum(m["rows_added"] for m in seen) == 350 and seen[0]["delta_version"] >= 0
        assert {"rows_per_second", "latency_p99_seconds", "batches"} <= set(seen[0]), seen[0]

        # The daemon's pipelines sensor sees serve and leaves the queries to it: no run requested.
        ticks = _wait_for(lambda: [t for t in _sensor_ticks(ui_port) if "eventide serve (pid" in t[1]], 90)
        assert ticks, _sensor_ticks(ui_port)
        assert all(status == "SKIPPED" for status, _ in _sensor_ticks(ui_port)), _sensor_ticks(ui_port)
        settings = Settings.from_env(env)
        assert _wait_for(lambda: all(q.lag_messages == 0 for q in compute_status(settings).queries), 60)
    finally:
        # The UI first: a daemon tick in flight while serve stops would write back the cursor it read
        # (a known race between two writers of one sensor's state; the README says so).
        os.killpg(ui.pid, signal.SIGKILL)
        ui.wait()
        code = service.stop(signal.SIGINT)  # Ctrl-C in serve's terminal: the same clean stop as SIGTERM
        receiver.close()
    assert code == 0, service.output
    out = "\n".join(service.output + _drain(service))
    assert "stopping the queries" in out and "eventide serve stopped" in out
    assert len(_rows(home, MARKET_STATE_TABLE)) == 350
    # serve left every query caught up: the pipelines sensor, asked now with the cursor the instance holds
    # (as the daemon will ask it), requests nothing. Its cursor names the log's last live segment, or is
    # none at all when serve's upkeep had archived every segment (nothing left for the sensor to see).
    assert "the pipelines sensor's cursor moves on" in out
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        defs = build_definitions(settings.registry)
        cursors = load_cursors(instance, defs)
        live = {g for g in settings.registry.logs if open_log(settings).mark(g) is not None}
        assert set(json.loads(cursors.get("new_segments_sensor") or "{}")) == live, (cursors, live)
        assert due_runs(defs, instance, cursors=cursors, only_jobs=(PIPELINES_JOB,)) == []


def _graphql_up(port: int) -> bool:
    try:
        return "assetNodes" in _graphql(port, "{ assetNodes { assetKey { path } } }")
    except (OSError, KeyError, TypeError, ValueError):
        return False


def _sensor_ticks(port: int) -> list[tuple[str, str]]:
    """(status, skip reason) of the pipelines sensor's latest ticks (empty until it has ticked)."""
    try:
        data = _graphql(port, SENSOR_TICKS % "orchestration.definitions")["sensorsOrError"]
    except (OSError, KeyError, TypeError, ValueError):
        return []
    for s in data.get("results") or ():
        if s["name"] == "new_segments_sensor":
            return [(t["status"], t["skipReason"] or "") for t in s["sensorState"]["ticks"]]
    return []
