"""Market spread's Dagster extras: the one check that needs the Dagster instance.

`order_rejections_unique_in_run` looks only at the rejections the latest run added, which it finds
from the table's Delta version recorded by the materialization before it. The checks that need only
the tables are declared on the app's sinks (examples/market.py). Registered through the app:
`dagster_defs="examples.market_assets:defs"`.
"""

import dagster as dg
import pandas as pd

from assets.gx import validate
from assets.resources import EventideSettings
from examples.market import ORDER_REJECTIONS_TABLE
from transforms import lake


def _read(settings, table: str, where: str | None = None) -> pd.DataFrame | None:
    path = settings.table_path(table)
    return lake.read(path, where).to_pandas() if lake.exists(path) else None


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
    if df is None:  # nothing landed on the market streams yet: nothing to check (and nothing to block)
        return dg.AssetCheckResult(passed=True, metadata={"rows": 0, "note": f"no {ORDER_REJECTIONS_TABLE} table yet"})
    result = validate(df, "order_rejections_unique",
                      [{"type": "expect_column_values_to_be_unique", "kwargs": {"column": "order_id"}}])
    return dg.AssetCheckResult(passed=result.passed, severity=result.severity,
                               metadata={**result.metadata, "since_delta_version": -1 if before_version is None else before_version})


def previous_delta_version(instance: dg.DagsterInstance, table: str) -> int | None:
    """The table's Delta version after the materialization before the latest one (None: there was none)."""
    records = instance.fetch_materializations(dg.AssetKey(table), limit=2).records
    if len(records) < 2:
        return None
    value = records[1].asset_materialization.metadata.get("delta_version")
    return None if value is None else int(value.value)


@dg.asset_check(asset=ORDER_REJECTIONS_TABLE, blocking=True,
                description="no order id twice among the rejections of the latest run")
def order_rejections_unique_in_run(context: dg.AssetCheckExecutionContext, eventide: EventideSettings
                                   ) -> dg.AssetCheckResult:
    return rejections_unique_in_run(eventide.get(), previous_delta_version(context.instance, ORDER_REJECTIONS_TABLE))


defs = dg.Definitions(asset_checks=[order_rejections_unique_in_run])
