"""workspace.yaml loads, and the Dagster webserver serves the lineage the UI draws."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from tests.conftest import REPO
from transforms.ports import free_port

BIN = os.path.dirname(sys.executable)


def test_workspace_validates():
    proc = subprocess.run([os.path.join(BIN, "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "All code locations passed validation" in proc.stderr + proc.stdout


QUERY = """{ assetNodes { assetKey { path } dependencyKeys { path } groupName
             assetChecksOrError { ... on AssetChecks { checks { name blocking } } } } }"""


def test_webserver_serves_the_lineage(tmp_path):
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "EVENTIDE_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [os.path.join(BIN, "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 120
        nodes = None
        while time.time() < deadline and nodes is None:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": QUERY}).encode(),
                                             headers={"Content-Type": "application/json"})
                nodes = json.loads(urllib.request.urlopen(req, timeout=10).read())["data"]["assetNodes"]
            except (OSError, KeyError, TypeError):
                time.sleep(1)
        assert nodes, "the webserver did not answer within 120 s"
        deps = {"/".join(n["assetKey"]["path"]): {"/".join(d["path"]) for d in n["dependencyKeys"]} for n in nodes}
        assert "landing_logs" in deps["bronze_log_lines"]
        assert "bronze_log_lines" in deps["log_windows"]
        assert "log_windows" in deps["daily_return_code_summary"]
        assert deps["market_state"] == {"landing_market_data", "landing_orders", "bronze_market_data", "bronze_orders"}
        assert "landing_orders" in deps["bronze_orders"]
        groups = {"/".join(n["assetKey"]["path"]): n["groupName"] for n in nodes}
        assert groups["market_state"] == "market_spread" and groups["daily_return_code_summary"] == "logs"
        checks = {"/".join(n["assetKey"]["path"]): {c["name"]: c["blocking"] for c in n["assetChecksOrError"].get("checks", [])}
                  for n in nodes}
        assert len(checks["daily_return_code_summary"]) >= 3
        assert checks["market_state"] == {"market_state_prices_valid": True, "market_state_reject_matches_rule": True}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
