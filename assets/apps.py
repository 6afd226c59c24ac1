"""Turns an Application into a Dagster multi-asset: one asset per Delta sink table.

Materializing it runs the application's queries over everything landed (availableNow, own
checkpoint, exactly once) and records what the run did as metadata. The checks an app declares on
its sinks become asset checks of these assets (assets/checks.py).
"""

import logging
import re

import dagster as dg

from assets.freshness import stream_table_policy
from assets.resources import EventideSettings, SparkResource
from transforms import lake
from transforms.api import Application, DeltaSink
from transforms.engine import RunReport, run_application

# Each query's progress (messages, batches, seconds) as the step says it to Dagster, also said here: a
# process that runs the steps itself and shows its own console (`eventide run`, orchestration/runner.py)
# prints it. Without a handler, as in the UI's runs, Python drops INFO records: they stay in Dagster's log.
QUERY_PROGRESS = logging.getLogger("eventide.queries")


def dagster_name(name: str) -> str:
    """An app name as a Dagster op or group name (those allow letters, digits and underscores only)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def delta_sinks(app: Application) -> list[DeltaSink]:
    seen: dict[str, DeltaSink] = {}
    for sink in app.sinks():
        if isinstance(sink, DeltaSink):
            seen.setdefault(sink.table, sink)
    return list(seen.values())


def run_metadata(reports: list[RunReport]) -> dict:
    secs = sum(r.seconds for r in reports)
    rows_in = sum(r.input_rows for r in reports)
    lags = [r.max_lag_seconds for r in reports if r.max_lag_seconds is not None]
    return {
        "batches": dg.MetadataValue.int(sum(r.batches for r in reports)),
        "input_messages": dg.MetadataValue.int(rows_in),
        "messages_per_second": dg.MetadataValue.float(round(rows_in / secs, 1) if secs else 0.0),
        "max_lag_seconds": dg.MetadataValue.float(round(max(lags), 3) if lags else 0.0),
        "quarantined": dg.MetadataValue.int(sum(r.quarantined for r in reports)),
        # Batches replayed after a crash whose commits were already in the lake (written nothing twice).
        "replayed_batches": dg.MetadataValue.int(sum(r.skipped_batches for r in reports)),
        # Queries another process (a running `eventide serve`) holds: not run here, processed there.
        **({"held_by": "; ".join(f"{r.query}: {r.held_by}" for r in reports if r.held_by)}
           if any(r.held_by for r in reports) else {}),
    }


def table_metadata(settings, table: str, reports: list[RunReport]) -> dict:
    path = settings.table_path(table)
    return {
        "rows_added": dg.MetadataValue.int(sum(r.rows_written.get(table, 0) for r in reports)),
        "total_rows": dg.MetadataValue.int(lake.count(path)),
        "delta_version": dg.MetadataValue.int(lake.version(path) if lake.exists(path) else -1),
        **run_metadata(reports),
        "path": dg.MetadataValue.path(str(path)),
    }


def application_assets(app: Application, deps: list, group: str,
                       freshness_minutes: float = 0.0) -> dg.AssetsDefinition:
    """One asset per Delta sink table of `app`, all made by one run of the app's queries, each with the
    freshness policy of a stream-fed table (assets/freshness.py): stale after the sink's
    `freshness_minutes`, else after `freshness_minutes` (0: no policy). An app without a Delta sink (TCP
    only) is one asset named after it, so it still runs with the others."""
    tables = [
        dg.AssetSpec(
            sink.table,
            deps=deps,
            group_name=group,
            kinds={"spark", "delta"},
            description=f"{app.description or app.name}: Delta table `{sink.table}` ({sink.mode}).",
            freshness_policy=stream_table_policy(
                freshness_minutes if sink.freshness_minutes is None else sink.freshness_minutes),
        )
        for sink in delta_sinks(app)
    ]
    specs = tables or [dg.AssetSpec(dagster_name(app.name), deps=deps, group_name=group, kinds={"spark", "tcp"},
                                    description=f"{app.description or app.name} (no Delta table: TCP sinks only).")]

    @dg.multi_asset(name=dagster_name(app.name), specs=specs, can_subset=False)
    def _run_app(context: dg.AssetExecutionContext, eventide: EventideSettings, spark: SparkResource):
        settings = eventide.get()
        # The session is started only by a query with something to do: a run with nothing new needs no JVM.
        def say(message: str) -> None:
            context.log.info(message)
            QUERY_PROGRESS.info(message)

        reports = run_application(lambda: spark.session(settings), app, settings, progress=say)
        for spec in specs:
            meta = table_metadata(settings, spec.key.path[-1], reports) if tables else run_metadata(reports)
            yield dg.MaterializeResult(asset_key=spec.key, metadata=meta)

    return _run_app
