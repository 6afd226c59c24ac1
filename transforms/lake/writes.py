"""Every write to the lake, through Spark's Delta writer (delta-spark): the executors write the
files, Delta commits them.

Exactly once: a micro-batch's writes carry Delta's idempotent-write identifiers, the app id
(`query@g<generation>:<table>`) and the batch id as its version. On a replayed batch Delta itself
finds that version committed and commits nothing: appends through the writer options `txnAppId` /
`txnVersion`, MERGE through the session settings of the same names, which Delta reads for DML.
The settings are set on the session the batch runs in (each streaming query has its own) and unset
after the MERGE.

Writers of different queries may commit to one table at once (every query writes the quarantine
table). Delta's optimistic concurrency refuses a conflicting commit; it is retried, and a retry of
a commit that did land is skipped by Delta like any replay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from transforms.lake.reads import exists

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
# What Delta raises when another writer committed first (its exceptions' class names).
_CONFLICTS = ("Concurrent", "MetadataChanged", "ProtocolChanged", "DELTA_CONCURRENT", "already exists")


def _column(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _retry_conflicts(write: Callable[[], None], what: str, retries: int = 8) -> None:
    for attempt in range(retries + 1):
        try:
            write()
            return
        except Exception as e:  # py4j / pyspark wrap Delta's exceptions; the name tells a conflict
            text = f"{type(e).__name__}: {e}"
            if attempt == retries or not any(c in text for c in _CONFLICTS):
                raise
            time.sleep(min(0.05 * 2**attempt, 1.0))
    raise AssertionError(f"{what}: not reached")


def append_once(df, path: str | Path, app_id: str, batch_id: int, partition_by: Sequence[str] = (),
                properties: Mapping[str, str] | None = None) -> None:
    """Append `df` as batch `batch_id` of writer `app_id`; Delta skips a batch it committed before.
    New columns are added to the table (mergeSchema); a column of another type is Delta's error.
    `properties` (delta.*): table properties set if this append creates the table (else ignored)."""
    writer = (df.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", batch_id)
              .option("mergeSchema", "true"))
    for key, value in (properties or {}).items():
        writer = writer.option(key, value)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    _retry_conflicts(lambda: writer.save(str(path)), f"append to {path}")


def merge_once(df, path: str | Path, keys: Sequence[str], app_id: str, batch_id: int,
               update: bool = True, prune: str | None = None, properties: Mapping[str, str] | None = None) -> None:
    """MERGE `df` into the table by `keys` as batch `batch_id` of `app_id` (exactly once, by Delta):
    matching rows updated (`update`) or left as they are (insert only: the first writer of a key
    wins), the others inserted. `df` holds one row per key. `prune`: a condition on the target alias
    `t` that every matching row meets (a seq range), so the MERGE reads only the files that may hold
    them. A missing table is created by the batch's rows (with `properties`, see append_once)."""
    from delta.tables import DeltaTable

    spark = df.sparkSession

    def write() -> None:
        if not exists(path):
            append_once(df, path, app_id, batch_id, properties=properties)
            return
        condition = " AND ".join([f"t.{_column(k)} = s.{_column(k)}" for k in keys] + ([f"({prune})"] if prune else []))
        merge = DeltaTable.forPath(spark, str(path)).alias("t").merge(df.alias("s"), condition).withSchemaEvolution()
        if update:
            merge = merge.whenMatchedUpdateAll()
        spark.conf.set(TXN_APP_ID, app_id)
        spark.conf.set(TXN_VERSION, str(batch_id))
        try:
            merge.whenNotMatchedInsertAll().execute()
        finally:
            spark.conf.unset(TXN_APP_ID)
            spark.conf.unset(TXN_VERSION)

    _retry_conflicts(write, f"merge into {path}")


def replace_where(df, path: str | Path, predicate: str, partition_by: Sequence[str] = ()) -> None:
    """Atomically replace the rows matching `predicate` (one day's partition) with `df`'s rows.
    Idempotent by construction: running it twice leaves the same rows."""
    writer = df.write.format("delta")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if exists(path):
        writer = writer.mode("overwrite").option("replaceWhere", predicate)
    else:
        writer = writer.mode("append")
    _retry_conflicts(lambda: writer.save(str(path)), f"replace {predicate} in {path}")
