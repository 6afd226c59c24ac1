"""A failed check blocks only what depends on it (issue 12, point 2).

First Dagster's own semantics, on a tiny graph, in both executors a run can have: in process (`eventide
run`) and the multiprocess executor, which runs launched by Dagster (the new-segments sensor's pipelines
job under `eventide ui`) use. Then the whole system: `eventide run` over the four sample log days and
the sample quotes with one bad quote, which fails a check of an extra app reading `market_data`: the
daily summaries are exact, the failed check is reported with its rows, what depends on it is held back,
and the exit status is non-zero at the end.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap

import dagster as dg
import pytest

from examples.logs import SUMMARY_TABLE
from examples.market_decoder import MarketData, encode_market_data
from orchestration.definitions import build_definitions
from orchestration.runner import load_cursors
from tests.conftest import DATA, REPO, land
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages
from transforms import lake
from transforms.ingestion.framing import iter_file_messages
from transforms.settings import Settings, reset_settings


# -- Dagster's blocking checks, on their own ---------------------------------------------------------
@dg.asset
def checked():
    return 1


@dg.asset(deps=[checked])
def downstream_of_checked():
    return 2


@dg.asset
def unrelated():
    return 3


@dg.asset(deps=[unrelated])
def downstream_of_unrelated():
    return 4


@dg.asset_check(asset=checked, blocking=True)
def checked_is_good():
    return dg.AssetCheckResult(passed=False, metadata={"failed_rows": [{"id": 7}]})


TINY = dg.Definitions(assets=[checked, downstream_of_checked, unrelated, downstream_of_unrelated],
                      asset_checks=[checked_is_good],
                      jobs=[dg.define_asset_job("tiny", selection=dg.AssetSelection.all())])


def tiny_job():
    return TINY.resolve_job_def("tiny")


def _materialized(events) -> set[str]:
    return {e.asset_key.to_user_string() for e in events if e.event_type_value == "ASSET_MATERIALIZATION"}


def test_a_failed_blocking_check_skips_only_its_downstream_in_process():
    result = tiny_job().execute_in_process(raise_on_error=False)
    assert not result.success
    assert _materialized(result.all_events) == {"checked", "unrelated", "downstream_of_unrelated"}
    assert [(e.check_name, e.passed) for e in result.get_asset_check_evaluations()] == [("checked_is_good", False)]


def test_a_failed_blocking_check_skips_only_its_downstream_in_a_launched_run(tmp_path):
    """The multiprocess executor (the default of asset jobs, what a sensor-launched run uses)."""
    with dg.DagsterInstance.local_temp(str(tmp_path)) as instance:
        with dg.execute_job(dg.reconstructable(tiny_job), instance=instance, raise_on_error=False) as result:
            assert not result.success
            assert _materialized(result.all_events) == {"checked", "unrelated", "downstream_of_unrelated"}


def test_in_the_pipelines_job_a_step_waits_only_for_steps_upstream_of_its_assets():
    """The real pipelines job's plan: every step waits only for steps making (or checking) assets upstream
    of its own. So one app's failed blocking check cannot stop another app, bronze or quarantine."""
    from dagster._core.execution.api import create_execution_plan

    from orchestration.definitions import defs
    from orchestration.sensors import PIPELINES_JOB

    job = defs.resolve_job_def(PIPELINES_JOB)
    graph = defs.resolve_asset_graph()
    steps = create_execution_plan(job).steps

    def assets_of(step) -> set[dg.AssetKey]:
        keys = job.asset_layer.get_selected_entity_keys_for_node(step.handle.node_handle)
        return {k.asset_key if isinstance(k, dg.AssetCheckKey) else k for k in keys}

    by_key = {s.key: s for s in steps}
    check_steps = [s for s in steps if any(isinstance(k, dg.AssetCheckKey) for k in
                                           job.asset_layer.get_selected_entity_keys_for_node(s.handle.node_handle))]
    assert check_steps, "the bundled apps declare checks on their sinks"
    for step in steps:
        mine = assets_of(step)
        upstream = mine.union(*(graph.get_ancestor_asset_keys(k) for k in mine))
        for dep in step.get_execution_dependency_keys():
            assert assets_of(by_key[dep]) & upstream, f"{step.key} waits for {dep}, which is not upstream of it"


# -- the whole system -------------------------------------------------------------------------------
BAD_BID = 13.13  # a valid price the decoder lets through; the extra app's check refuses it

AUDIT_APP = f'''
"""Every quote's prices, with a check that refuses one bid: the test's bad quote."""
from transforms.api import Application, DeltaSink, check, computation, source


@computation("audit quote")
def audit(q):
    return {{"symbol": q.symbol, "bid": q.bid, "offer": q.offer}}


@check("no_unlucky_bid", description="no quote has the bid {BAD_BID}")
def no_unlucky_bid(df):
    bad = df[df["bid"] == {BAD_BID}]
    return bad.empty, {{"failed_rows": bad.to_dict("records")}}


app = Application("quote_audit",
                  source("market_data").to(audit).to_sink(
                      DeltaSink("quote_audit", metadata=("seq",), checks=[no_unlucky_bid])),
                  dagster_defs="dl_audit_dagster:defs")
'''

AUDIT_DAGSTER = '''
import dagster as dg


@dg.asset(deps=["quote_audit"])
def quote_audit_report():
    """Downstream of the checked table: held back when its check fails."""
    return None


defs = dg.Definitions(assets=[quote_audit_report])
'''


@pytest.mark.spark
def test_one_bad_quote_fails_its_check_and_everything_else_runs(tmp_path, monkeypatch):
    (tmp_path / "dl_audit.py").write_text(textwrap.dedent(AUDIT_APP))
    (tmp_path / "dl_audit_dagster.py").write_text(textwrap.dedent(AUDIT_DAGSTER))
    apps = "examples.logs:app,examples.market:app,dl_audit:app"
    home = tmp_path / "home"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EVENTIDE_HOME", str(home))
    monkeypatch.setenv("EVENTIDE_APPS", apps)
    reset_settings()
    settings = Settings(home=home, apps=apps)

    land(settings, "logs", log_messages(LOG_FILES))
    quotes = list(iter_file_messages(DATA / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"))[:20]
    bad = encode_market_data(MarketData("TEST", dt.datetime(2016, 9, 2, 15, 47, 52, tzinfo=dt.timezone.utc),
                                        BAD_BID, 13.5))
    land(settings, "market_data", [*quotes[:10], bad, *quotes[10:]])

    env = {**os.environ, "EVENTIDE_HOME": str(home), "EVENTIDE_APPS": apps,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    eventide = os.path.join(os.path.dirname(sys.executable), "eventide")
    proc = subprocess.run([eventide, "run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 1, out[-4000:] + proc.stderr[-4000:]
    # The automation tick is said as the runs it asked for, not as Dagster's evaluator logs it.
    assert "dagster - INFO" not in proc.stderr, proc.stderr[-4000:]

    # The daily summaries: exact, although a check of the market data failed.
    rows = sorted((r["day"].isoformat(), r["status"], r["count"])
                  for r in lake.read(settings.table_path(SUMMARY_TABLE)).to_pylist())
    assert rows == expected_summary()
    # The other apps' tables too; the checked table was written (the check reads it), its downstream not.
    assert lake.count(settings.table_path("market_state")) == 21
    assert lake.count(settings.table_path("quote_audit")) == 21
    # The report: at the end, after the summaries ran, each failure with asset, check, rows, what to do.
    tail = out[out.rindex("check FAILED"):]
    assert out.index("daily_return_code_summary: 1 run(s): 2004-03-07..2004-03-10") < out.index(tail)
    assert tail.startswith("check FAILED: quote_audit no_unlucky_bid\n")
    assert f"what it checks: no quote has the bid {BAD_BID}" in tail
    assert '"symbol": "TEST"' in tail and f'"bid": {BAD_BID}' in tail
    assert "what to do: look at the rows (`eventide show quote_audit`)" in tail
    assert "not materialized (downstream of a failure): quote_audit_report" in tail
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        def materializations(key):
            return len(instance.fetch_materializations(dg.AssetKey(key), limit=5).records)
        assert materializations("quote_audit") == 1 and materializations("quote_audit_report") == 0
        # A failed check keeps the sensors' cursors where they were (none yet): the next run, or the
        # daemon, asks for those days again.
        assert load_cursors(instance, build_definitions(settings.registry)) == {}
    assert tail.rstrip().endswith("failed")
    passed, failed = map(int, tail.rstrip().rsplit("checks: ", 1)[1].replace(" passed,", "").replace(" failed", "").split())
    assert failed == 1 and passed >= 4 * 3 + 3  # every summary check of the 4 days and the market checks
