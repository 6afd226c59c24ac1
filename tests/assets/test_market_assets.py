"""Market spread through Dagster: both tables as assets, the checks declared on its sinks plus the one of
its Dagster extras, and that a failing check blocks."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from assets.apps import application_assets
from assets.checks import check_result, sink_checks
from assets.ingest import stream_deps
from assets.resources import EventideSettings, SparkResource
from examples.market import (
    MARKET_STATE_TABLE,
    ORDER_REJECTIONS_TABLE,
    PRICES_VALID,
    REASON_SPREAD,
    market_app,
    reject_matches_rule,
    rejections_accounted,
)
from examples.market_assets import order_rejections_unique_in_run
from examples.market_decoder import encode_order, parse_order
from examples.market_generate import order_payloads, read_symbols
from transforms import lake
from transforms.ingestion.framing import iter_file_messages
from transforms.ingestion.landing import Lander
from transforms.spark import get_spark

pytestmark = pytest.mark.spark


def market_app_registry():
    from transforms.registry import registry_of

    return registry_of([market_app])

market_assets = application_assets(market_app, stream_deps(market_app_registry(), market_app.streams()), "market_spread")
market_checks = [*sink_checks(market_app), order_rejections_unique_in_run]

NBBO = Path(__file__).resolve().parents[2] / "data" / "wallaroo" / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"


@dg.asset(deps=[MARKET_STATE_TABLE, ORDER_REJECTIONS_TABLE])
def downstream_of_market() -> None:
    """Stands for anything that reads the market tables: it must not run after a failed check."""


def materialize(instance):
    return dg.materialize(
        [market_assets, *market_checks, downstream_of_market],
        instance=instance,
        resources={"eventide": EventideSettings(), "spark": SparkResource()},
        raise_on_error=False,
    )


def checks(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {ev.check_name: ev for ev in result.get_asset_check_evaluations()}


def materialized(result) -> set[str]:
    return {ev.asset_key.to_user_string() for ev in result.get_asset_materialization_events()}


def land(settings, msgs) -> None:
    with Lander(settings) as lander:
        for stream, payload in msgs:
            lander.append(stream, payload, "test")


def test_market_assets_with_blocking_checks(spark, settings):
    assert all(spec.blocking for c in market_checks for spec in c.check_specs)
    orders = order_payloads(read_symbols(), 400, seed=5, unknown_share=0.1)
    land(settings, [("market_data", p) for p in iter_file_messages(NBBO)] + [("orders", p) for p in orders])
    instance = dg.DagsterInstance.ephemeral()

    first = materialize(instance)
    assert first.success
    assert {name: ev.passed for name, ev in checks(first).items()} == {
        "market_state_prices_valid": True,
        "market_state_reject_matches_rule": True,
        "order_rejections_accounted": True,
        "order_rejections_unique_in_run": True,
    }
    assert materialized(first) == {MARKET_STATE_TABLE, ORDER_REJECTIONS_TABLE, "downstream_of_market"}
    meta = {ev.asset_key.to_user_string(): ev.materialization.metadata for ev in first.get_asset_materialization_events()}
    assert meta[MARKET_STATE_TABLE]["total_rows"].value == 350
    rejected = lake.read(settings.table_path(ORDER_REJECTIONS_TABLE)).to_pylist()
    assert meta[ORDER_REJECTIONS_TABLE]["total_rows"].value == len(rejected) > 40
    assert {r["reason"] for r in rejected} >= {"never seen"}

    # Second run: one order id seen in the first run again (fine), and one order id twice in this run.
    reused = dataclasses.replace(parse_order(orders[0]), symbol="Z900")
    dup = dataclasses.replace(reused, order_id="DUP001")
    land(settings, [("orders", encode_order(o)) for o in (reused, dup, dup)])
    second = materialize(instance)
    evs = checks(second)
    assert evs["order_rejections_unique_in_run"].passed is False
    sample = evs["order_rejections_unique_in_run"].metadata["expectations"].value
    assert next(iter(sample.values()))["sample"] == ["DUP001", "DUP001"]  # not the id reused across runs
    assert evs["order_rejections_accounted"].passed and evs["market_state_prices_valid"].passed
    assert "downstream_of_market" not in materialized(second)  # blocked by the failed check
    assert not second.success

    # Tables that break the rules make the other checks fail too.
    state_path = settings.table_path(MARKET_STATE_TABLE)
    rows = {r["symbol"]: r for r in lake.read(state_path).to_pylist()}
    bad = [dict(rows["AA"], bid=-1.0), dict(rows["BAC"], offer=math.nan), dict(rows["TGT"], reject=False, reason=None)]
    spark = get_spark(settings)
    lake.merge_once(spark.createDataFrame(pa.Table.from_pylist(bad, schema=lake.read(state_path).schema)), state_path,
                    ["symbol"], "test", 0)
    prices = check_result(PRICES_VALID, settings, MARKET_STATE_TABLE)
    rule = check_result(reject_matches_rule, settings, MARKET_STATE_TABLE)
    assert not prices.passed and not rule.passed
    outcomes = prices.metadata["expectations"].value
    assert [v["unexpected_count"] for v in outcomes.values()] == [0, 1, 1, 0]  # bid < 0; offer NaN
    assert rule.metadata["rows"].value == 350
    assert "TGT" in rule.metadata["sample"].value  # in reject state by the rule, stored as accepting
    rej_path = settings.table_path(ORDER_REJECTIONS_TABLE)
    row = lake.read(rej_path).to_pylist()[0]
    stray = dict(row, symbol="QQQQ", reason=REASON_SPREAD, seq=row["seq"] + 10_000)
    lake.append_once(spark.createDataFrame(pa.Table.from_pylist([stray], schema=lake.read(rej_path).schema)), rej_path,
                     "test", 0)
    assert not check_result(rejections_accounted, settings, ORDER_REJECTIONS_TABLE).passed

    # Nothing landed on the market streams at all: nothing to check, nothing blocked.
    empty = dataclasses.replace(settings, home=settings.home.parent / "empty")
    assert check_result(PRICES_VALID, empty, MARKET_STATE_TABLE).passed
    assert check_result(rejections_accounted, empty, ORDER_REJECTIONS_TABLE).passed
