"""Market spread's tables as assets, with blocking great-expectations checks."""

import sys

import dagster as dg
import great_expectations.expectations as gxe
import pandas as pd

from assets.apps import application_assets
from assets.gx import validate
from assets.ingest import landing_key
from orchestration.resources import EventideSettings
from transforms import lake
from transforms.apps.market import (
    MARKET_STATE_TABLE,
    ORDER_REJECTIONS_TABLE,
    REASON_NEVER_SEEN,
    market_app,
    spread_decision,
    spread_reject_array,
)

market_assets = application_assets(
    market_app, [landing_key("market_data"), "bronze_market_data", "bronze_orders"], "market"
)

MAX_DOUBLE = sys.float_info.max


def _finite_non_negative(*columns: str) -> list:
    """NaN counts as null for GX; infinity is above the largest double."""
    out = []
    for c in columns:
        out.append(gxe.ExpectColumnValuesToNotBeNull(column=c))
        out.append(gxe.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=MAX_DOUBLE))
    return out


def _read(settings, table: str, where: str | None = None) -> pd.DataFrame | None:
    path = settings.table_path(table)
    return lake.read(path, where).to_pandas() if lake.exists(path) else None


def _no_table(table: str) -> dg.AssetCheckResult:
    # Nothing landed on the market streams yet: nothing to check (and nothing to block).
    return dg.AssetCheckResult(passed=True, metadata={"rows": 0, "note": f"no {table} table yet"})


# -- the checks as plain functions (settings in, AssetCheckResult out) -------------------------------
def market_state_prices(settings) -> dg.AssetCheckResult:
    df = _read(settings, MARKET_STATE_TABLE)
    if df is None:
        return _no_table(MARKET_STATE_TABLE)
    return validate(df, "market_state_prices", _finite_non_negative("bid", "offer"))


def market_state_rule(settings) -> dg.AssetCheckResult:
    """Every row's reject flag (and reason) is what the rule gives for its bid and offer."""
    df = _read(settings, MARKET_STATE_TABLE)
    if df is None:
        return _no_table(MARKET_STATE_TABLE)
    df["rule_reject"] = spread_reject_array(df["bid"].to_numpy(), df["offer"].to_numpy())
    df["rule_reason"] = [spread_decision(b, o)[1] for b, o in zip(df["bid"], df["offer"])]
    return validate(
        df,
        "market_state_rule",
        [
            gxe.ExpectColumnValuesToNotBeNull(column="reject"),
            gxe.ExpectColumnPairValuesToBeEqual(column_A="reject", column_B="rule_reject"),
            gxe.ExpectColumnPairValuesToBeEqual(column_A="reason", column_B="rule_reason"),
            gxe.ExpectColumnValuesToBeUnique(column="symbol"),
        ],
    )


def rejections_accounted(settings) -> dg.AssetCheckResult:
    """Each rejection's symbol is in market_state, or the rejection says the symbol was never seen."""
    df = _read(settings, ORDER_REJECTIONS_TABLE)
    if df is None:
        return _no_table(ORDER_REJECTIONS_TABLE)
    state = settings.table_path(MARKET_STATE_TABLE)
    known = set(lake.read(state, columns=["symbol"]).column("symbol").to_pylist()) if lake.exists(state) else set()
    df["symbol_accounted"] = df["symbol"].isin(known) | (df["reason"] == REASON_NEVER_SEEN)
    return validate(
        df,
        "order_rejections_accounted",
        [gxe.ExpectColumnValuesToBeInSet(column="symbol_accounted", value_set=[True]),
         gxe.ExpectColumnValuesToNotBeNull(column="reason"),
         *_finite_non_negative("price", "last_bid", "last_offer")],
    )


def rejections_of_run(settings, before_version: int | None) -> pd.DataFrame | None:
    """The rejections a run added: rows newer (by sequence) than the table at `before_version`.

    Sequences only grow, and a run appends the rejections of messages landed after the last run's.
    """
    path = settings.table_path(ORDER_REJECTIONS_TABLE)
    if before_version is None or before_version < 0 or not lake.exists(path):
        return _read(settings, ORDER_REJECTIONS_TABLE)
    seqs = lake.read(path, columns=["seq"], version=before_version).column("seq")
    last = max(seqs.to_pylist(), default=None)
    return _read(settings, ORDER_REJECTIONS_TABLE, None if last is None else f"seq > {int(last)}")


def rejections_unique_in_run(settings, before_version: int | None) -> dg.AssetCheckResult:
    df = rejections_of_run(settings, before_version)
    if df is None:
        return _no_table(ORDER_REJECTIONS_TABLE)
    result = validate(df, "order_rejections_unique", [gxe.ExpectColumnValuesToBeUnique(column="order_id")])
    return dg.AssetCheckResult(passed=result.passed, severity=result.severity,
                               metadata={**result.metadata, "since_delta_version": -1 if before_version is None else before_version})


def previous_delta_version(instance: dg.DagsterInstance, table: str) -> int | None:
    """The table's Delta version after the materialization before the latest one (None: there was none)."""
    records = instance.fetch_materializations(dg.AssetKey(table), limit=2).records
    if len(records) < 2:
        return None
    value = records[1].asset_materialization.metadata.get("delta_version")
    return None if value is None else int(value.value)


# -- the Dagster checks ------------------------------------------------------------------------------
@dg.asset_check(asset=MARKET_STATE_TABLE, blocking=True, description="bid and offer are finite and not negative")
def market_state_prices_valid(eventide: EventideSettings) -> dg.AssetCheckResult:
    return market_state_prices(eventide.get())


@dg.asset_check(asset=MARKET_STATE_TABLE, blocking=True,
                description="each symbol's reject flag and reason agree with the spread rule for its last quote")
def market_state_reject_matches_rule(eventide: EventideSettings) -> dg.AssetCheckResult:
    return market_state_rule(eventide.get())


@dg.asset_check(asset=ORDER_REJECTIONS_TABLE, blocking=True,
                description="each rejection's symbol is known to market_state or recorded as never seen; prices valid")
def order_rejections_accounted(eventide: EventideSettings) -> dg.AssetCheckResult:
    return rejections_accounted(eventide.get())


@dg.asset_check(asset=ORDER_REJECTIONS_TABLE, blocking=True,
                description="no order id twice among the rejections of the latest run")
def order_rejections_unique_in_run(context: dg.AssetCheckExecutionContext, eventide: EventideSettings
                                   ) -> dg.AssetCheckResult:
    return rejections_unique_in_run(eventide.get(), previous_delta_version(context.instance, ORDER_REJECTIONS_TABLE))


market_checks = [market_state_prices_valid, market_state_reject_matches_rule, order_rejections_accounted,
                 order_rejections_unique_in_run]

defs = dg.Definitions(assets=[market_assets], asset_checks=market_checks)
