"""Landing (external), one bronze asset per stream, and the quarantine table."""


import dagster as dg

from assets.apps import application_assets
from orchestration.resources import EventideSettings
from transforms import lake
from transforms.engine import QUARANTINE_TABLE
from transforms.settings import DEFAULT_STREAM_GROUPS
from transforms.streams import STREAMS, bronze_application

LANDING_GROUPS = sorted(set(DEFAULT_STREAM_GROUPS.values()))


def landing_key(stream: str) -> dg.AssetKey:
    return dg.AssetKey(f"landing_{DEFAULT_STREAM_GROUPS[stream]}")


landing_specs = [
    dg.AssetSpec(
        f"landing_{group}",
        group_name="ingest",
        kinds={"parquet"},
        description=f"Closed landing segments of sequence group `{group}` ({', '.join(s for s, g in DEFAULT_STREAM_GROUPS.items() if g == group)}), "
        "written by `eventide serve` / `eventide ingest`.",
    )
    for group in LANDING_GROUPS
]

bronze_assets = [application_assets(bronze_application(s), [landing_key(s)], "ingest") for s in STREAMS]
BRONZE_KEYS = [dg.AssetKey(s.bronze_table) for s in STREAMS.values()]


@dg.asset(name=QUARANTINE_TABLE, deps=BRONZE_KEYS, group_name="ingest", kinds={"delta"})
def quarantine(eventide: EventideSettings) -> dg.MaterializeResult:
    """Every message no step could handle, with the query, step and reason. Written by all queries."""
    path = eventide.get().table_path(QUARANTINE_TABLE)
    if not lake.exists(path):
        return dg.MaterializeResult(metadata={"total_rows": 0})
    by = lake.query("select query, step, count(*) as n from t group by query, step order by n desc", t=path).to_pylist()
    return dg.MaterializeResult(
        metadata={
            "total_rows": sum(r["n"] for r in by),
            "by_query_and_step": dg.MetadataValue.md(
                "| query | step | rows |\n|---|---|---|\n" + "\n".join(f"| {r['query']} | {r['step']} | {r['n']} |" for r in by)
            ),
            "delta_version": lake.version(path),
        }
    )


defs = dg.Definitions(assets=[*landing_specs, *bronze_assets, quarantine])
