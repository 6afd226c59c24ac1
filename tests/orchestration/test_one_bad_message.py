"""The report of issue 12, reproduced: a fresh home with one log day and one absurd market-data quote
(bid -1e308, offer 1e308). `eventide run` once put the quote in `bronze_market_data` and `market_state`,
where the blocking check `market_state_prices_valid` failed and the run exited 1. The decoder now refuses
it where it enters: it waits in quarantine with its reason, and everything else runs and passes."""

import datetime as dt

import pytest

from examples.logs import SUMMARY_TABLE
from examples.market_decoder import MarketData, encode_market_data
from tests.conftest import land
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages
from transforms import lake

pytestmark = pytest.mark.spark

ABSURD = encode_market_data(MarketData("AA", dt.datetime(2016, 9, 2, 15, 47, 52, tzinfo=dt.timezone.utc), -1e308, 1e308))


def _rows(settings, table: str) -> list[dict]:
    path = settings.table_path(table)
    return lake.read(path).to_pylist() if lake.exists(path) else []


def test_an_absurd_quote_waits_in_quarantine_and_the_run_passes(spark, settings):
    from orchestration.runner import run_all

    land(settings, "logs", log_messages(LOG_FILES[:1]))
    land(settings, "market_data", [ABSURD])
    summary = run_all(settings, progress=lambda _: None)

    assert summary.ok, summary.failures
    failed = [c for c in summary.checks if not c[2]]
    assert summary.checks and not failed
    # The market checks ran (and passed), and so did the day's summary's.
    assert {c[1] for c in summary.checks} >= {"market_state_prices_valid", "market_state_reject_matches_rule",
                                              "rows_are_valid", "reconciles_with_bronze"}

    quarantined = [r for r in _rows(settings, "quarantine") if r["stream"] == "market_data"]
    assert quarantined, "the absurd quote is not in quarantine"
    assert {(r["step"], r["reason"], r["payload"]) for r in quarantined} == {
        ("decoder decode_market_data", "market data: expected a finite bid >= 0, got -1e+308", ABSURD)}
    assert _rows(settings, "bronze_market_data") == []
    assert _rows(settings, "market_state") == []

    summary_rows = sorted((r["day"].isoformat(), r["status"], r["count"]) for r in _rows(settings, SUMMARY_TABLE))
    assert summary_rows == [r for r in expected_summary() if r[0] == "2004-03-07"]
