"""The checks an app declares on its Delta sinks, as blocking Dagster asset checks.

`DeltaSink(table, checks=[...])` takes `transforms.api.Check`s; each reads the sink's whole table as
a pandas DataFrame after the app ran:
- `expect(name, *expectations)`: great-expectations expectations validated over it (assets/gx.py);
- `@check(name)` on `fn(df) -> bool | (bool, metadata dict)`. A function of two arguments is called
  `fn(df, settings)`, for a rule that needs another table too (each rejection's symbol is in
  `market_state`).
A table that does not exist yet (nothing written) passes: nothing to check, nothing to block.
"""

import inspect
import json
import re
from collections.abc import Callable

import dagster as dg
import numpy as np
import pandas as pd

from assets.gx import validate
from assets.resources import EventideSettings
from transforms import lake
from transforms.api import Application, Check, DeltaSink, UserFunctionError

_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def _metadata_value(v):
    if isinstance(v, dg.MetadataValue):
        return v
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return dg.MetadataValue.text("None") if v is None else v
    return dg.MetadataValue.json(json.loads(json.dumps(v, default=str)))


def _function_result(check: Check, table: str, df: pd.DataFrame, settings) -> dg.AssetCheckResult:
    takes_settings = len(inspect.signature(check.fn).parameters) >= 2
    out = check.fn(df, settings) if takes_settings else check.fn(df)
    passed, meta = out if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) else (out, {})
    if not isinstance(passed, (bool, np.bool_)):
        raise UserFunctionError(f"check {check.name!r} of table {table!r} returned {out!r}; "
                                "expected a bool or (bool, dict of metadata)")
    metadata = {"rows": len(df), **{str(k): _metadata_value(v) for k, v in meta.items()}}
    return dg.AssetCheckResult(passed=bool(passed), metadata=metadata)


def check_result(check: Check, settings, table: str) -> dg.AssetCheckResult:
    """Run one check over the table as stored now."""
    path = settings.table_path(table)
    if not lake.exists(path):
        return dg.AssetCheckResult(passed=True, metadata={"rows": 0, "note": f"no {table} table yet"})
    df = lake.read(path).to_pandas()
    if check.fn is not None:
        return _function_result(check, table, df, settings)
    return validate(df, f"{table}-{check.name}", list(check.expectations))


def _asset_check(table: str, check: Check) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=table, name=check.name, blocking=check.blocking, description=check.description or None)
    def _check(eventide: EventideSettings) -> dg.AssetCheckResult:
        return check_result(check, eventide.get(), table)

    return _check


def sink_checks(app: Application) -> list[dg.AssetChecksDefinition]:
    """One asset check per Check on the app's Delta sinks; ValueError names a bad or repeated name."""
    out, seen = [], set()
    for sink in app.sinks():
        if not isinstance(sink, DeltaSink):
            continue
        for check in sink.checks:
            where = f"app {app.name!r}, DeltaSink {sink.table!r}: check {check.name!r}"
            if not _NAME.match(check.name):
                raise ValueError(f"{where}: a check name takes letters, digits and underscores only (Dagster's rule)")
            if (sink.table, check.name) in seen:
                raise ValueError(f"{where} is declared twice; give each check of a table its own name")
            seen.add((sink.table, check.name))
            out.append(_asset_check(sink.table, check))
    return out


def check_each_partition(context: dg.AssetCheckExecutionContext,
                         evaluate: Callable[[list[str]], dict[str, dg.AssetCheckResult]]) -> dg.AssetCheckResult:
    """A partitioned check over the partitions of its run: one, or a range (a backfill run as one run).
    `evaluate(keys)` judges every partition of the run at once (one read for all of them) and returns
    each one's result.

    Dagster records one evaluation per check and run, without a partition when the run covers a range.
    So in a range each partition's evaluation is logged as its own event, which gives each partition
    its check status, and the result returned is the range's: passed if every partition passed."""
    if context.has_partition_key:
        return evaluate([context.partition_key])[context.partition_key]
    (spec,) = context.check_specs
    failed = []
    results = evaluate(list(context.partition_keys))
    for key in context.partition_keys:
        result = results[key]
        context.op_execution_context.log_event(dg.AssetCheckEvaluation(
            asset_key=spec.asset_key, check_name=spec.name, passed=result.passed, metadata=result.metadata,
            severity=result.severity, blocking=spec.blocking, partition=key))
        if not result.passed:
            failed.append(key)
    return dg.AssetCheckResult(passed=not failed, metadata={
        "partitions": len(context.partition_keys), "failed_partitions": dg.MetadataValue.json(failed)})
