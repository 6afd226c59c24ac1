"""The one composition root: every asset, check, job, schedule, sensor and resource of Eventide,
built from the registered apps (`EVENTIDE_APPS`, transforms/registry.py).

    landing_<stream> -> <bronze table> -> each app's Delta tables (+ the checks on its sinks)
                                       -> quarantine

Per registered app: one multi-asset (one asset per Delta sink table, group = the app's name),
downstream of the landing and bronze assets of the streams it reads; the checks declared on its
sinks as blocking asset checks; and its own extras (`Application(dagster_defs="module:attribute")`,
a `dagster.Definitions` of more assets, checks, jobs, sensors or schedules) merged in. Extras use the
resources `eventide` and `spark` defined here, and do not define them again.
"""

from __future__ import annotations

import importlib

import dagster as dg

from assets.apps import application_assets, dagster_name
from assets.checks import sink_checks
from assets.ingest import ingest_definitions, stream_deps
from assets.resources import EventideSettings, SparkResource
from orchestration.sensors import PIPELINES_JOB, new_segments_sensor
from transforms.registry import AppLoadError, RegisteredApp, Registry
from transforms.settings import Settings


def load_dagster_defs(registered: RegisteredApp) -> dg.Definitions:
    """Import the app's `dagster_defs` ("module:attribute"); AppLoadError names the app and the entry."""
    app, entry = registered.app, registered.app.dagster_defs
    where = f"app {app.name!r} (module {registered.module}): dagster_defs {entry!r}"
    module_name, sep, attr = entry.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"{where}: expected module:attribute, e.g. myapp_dagster:defs")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise AppLoadError(f"{where}: no module {module_name!r} on the Python path; put it next to the app "
                               "or add its folder to PYTHONPATH") from None
        raise AppLoadError(f"{where}: importing module {module_name!r} failed: {e}") from e
    except Exception as e:
        raise AppLoadError(f"{where}: importing module {module_name!r} failed: {type(e).__name__}: {e}") from e
    defs = getattr(module, attr, None)
    if not isinstance(defs, dg.Definitions):
        found = "missing" if defs is None else f"of type {type(defs).__name__}"
        raise AppLoadError(f"{where}: {module_name}.{attr} is {found}; expected a dagster.Definitions")
    return defs


def app_definitions(registry: Registry, registered: RegisteredApp, freshness_minutes: float = 0.0) -> dg.Definitions:
    app = registered.app
    assets = application_assets(app, stream_deps(registry, app.streams()), dagster_name(app.name), freshness_minutes)
    return dg.Definitions(assets=[assets], asset_checks=sink_checks(app))


def _unpartitioned_keys(parts: list[dg.Definitions]) -> list[dg.AssetKey]:
    keys: list[dg.AssetKey] = []
    for d in parts:
        for a in d.assets or ():
            if isinstance(a, dg.AssetsDefinition) and a.partitions_def is None and a.is_materializable:
                keys.extend(a.keys)
    return keys


def build_definitions(registry: Registry, settings: Settings | None = None) -> dg.Definitions:
    """Everything of the registered apps; `settings` (default: the environment's) give the tables fed by
    streams their freshness policy (EVENTIDE_FRESHNESS_MINUTES)."""
    freshness_minutes = (settings or Settings()).freshness_minutes
    parts = [ingest_definitions(registry, freshness_minutes)]
    for r in registry.registered:
        parts.append(app_definitions(registry, r, freshness_minutes))
        if r.app.dagster_defs:
            parts.append(load_dagster_defs(r))
    # Everything that is not partitioned runs together: bronze, the apps, quarantine (and an app's
    # unpartitioned extras). Partitioned extras run from their own jobs, sensors and schedules.
    pipelines_job = dg.define_asset_job(
        PIPELINES_JOB,
        selection=dg.AssetSelection.assets(*_unpartitioned_keys(parts)),
        description="Run every pipeline over what has landed (availableNow), exactly once, with the checks.",
    )
    return dg.Definitions.merge(
        *parts,
        dg.Definitions(
            jobs=[pipelines_job],
            sensors=[new_segments_sensor],
            resources={"eventide": EventideSettings(), "spark": SparkResource()},
            # Every run (sensor, schedule, UI, backfill, `dagster asset materialize`) runs its steps in
            # one process with one Spark session: the default, a process per step, started a JVM per asset.
            executor=dg.in_process_executor,
        ),
    )


defs = build_definitions(Settings().registry)
