"""Freshness policies (Dagster's `FreshnessPolicy.time_window`) for the tables a stream feeds, and their
judgement through Dagster's own evaluators against an instance: what the daemon's freshness loop
records for the UI, and what `eventide status` prints.

A table fed by a stream (each bronze table, each app's Delta sink table) is stale once nothing was
materialized into it for `EVENTIDE_FRESHNESS_MINUTES`: under `eventide serve`, a materialization is
reported whenever batches changed the table (orchestration/service.py), so a table whose stream went
quiet turns stale; under `eventide run`, every run of the pipelines materializes every table.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

import dagster as dg

WARN_SHARE = 0.5  # warn when half the window has passed without data


def stream_table_policy(minutes: float) -> dg.FreshnessPolicy | None:
    """The policy of a stream-fed table: fail after `minutes` without data, warn after half of it (when
    that is still a minute, Dagster's floor); None for 0 (no policy)."""
    if not minutes:
        return None
    fail = dt.timedelta(minutes=minutes)
    warn = fail * WARN_SHARE
    return dg.FreshnessPolicy.time_window(fail_window=fail, warn_window=warn if warn >= dt.timedelta(minutes=1) else None)


@dataclass(frozen=True)
class Freshness:
    """An asset's freshness as Dagster judges it now: `state` is PASS, WARN, FAIL or UNKNOWN (never
    materialized); `last_materialized` is seconds since the epoch, or None, and `age_seconds` how long
    before the judgement that was (by Dagster's clock)."""

    asset: str
    state: str
    last_materialized: float | None
    age_seconds: float | None
    fail_after_seconds: float | None
    warn_after_seconds: float | None


def judge_freshness(defs: dg.Definitions, instance: dg.DagsterInstance) -> dict[str, Freshness]:
    """Every asset of `defs` with a freshness policy, judged by the evaluator Dagster's freshness daemon
    uses for that kind of policy (FRESHNESS_EVALUATORS_BY_POLICY_TYPE), against `instance`, at Dagster's
    current time. Keyed by the asset's user string (a table name)."""
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView
    from dagster._core.definitions.freshness_evaluator import FRESHNESS_EVALUATORS_BY_POLICY_TYPE
    from dagster._core.definitions.temporal_context import TemporalContext
    from dagster._time import get_current_datetime

    now = get_current_datetime()  # the clock the evaluators read
    # A loading context over the instance, as the daemon's request context is.
    view = AssetGraphView(temporal_context=TemporalContext(effective_dt=now,
                                                           last_event_id=instance.event_log_storage.get_maximum_record_id()),
                          instance=instance, asset_graph=defs.resolve_asset_graph())
    nodes = [n for n in view.asset_graph.asset_nodes if n.freshness_policy_or_from_metadata is not None]

    async def judge_all():
        return await asyncio.gather(*(
            FRESHNESS_EVALUATORS_BY_POLICY_TYPE[type(n.freshness_policy_or_from_metadata)]().evaluate_freshness(
                context=view, node=n)
            for n in nodes))

    states = asyncio.run(judge_all())
    records = {r.asset_entry.asset_key: r.asset_entry for r in instance.get_asset_records([n.key for n in nodes])}
    out = {}
    for node, state in zip(nodes, states):
        policy = node.freshness_policy_or_from_metadata
        entry = records.get(node.key)
        last = entry.last_materialization if entry else None
        fail, warn = getattr(policy, "fail_window", None), getattr(policy, "warn_window", None)
        name = node.key.to_user_string()
        out[name] = Freshness(name, state.value, last.timestamp if last else None,
                              now.timestamp() - last.timestamp if last else None,
                              fail.to_timedelta().total_seconds() if fail else None,
                              warn.to_timedelta().total_seconds() if warn else None)
    return out
