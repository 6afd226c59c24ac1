"""The lake: the only module that touches delta-rs.

Every write that a streaming micro-batch makes carries an app transaction `(app_id, batch_id)`.
delta-rs records it but does not skip a retried write, so `append_once` / `merge_once` check
`transaction_version(app_id)` first: a batch replayed after a crash commits nothing twice.

Reads go through delta-rs' QueryBuilder (DataFusion), not `to_pyarrow_table()`, which can abort
the interpreter at exit (delta-rs #2184).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError


def exists(path: str | Path) -> bool:
    return DeltaTable.is_deltatable(str(path))


def version(path: str | Path) -> int | None:
    """The table's latest version, or None if there is no table yet."""
    try:
        return DeltaTable(str(path)).version()
    except TableNotFoundError:
        return None


def committed_batch(path: str | Path, app_id: str) -> int | None:
    """The last batch id committed to the table under `app_id`, or None."""
    try:
        return DeltaTable(str(path)).transaction_version(app_id)
    except TableNotFoundError:
        return None


def _commit(app_id: str, batch_id: int, metadata: dict[str, str] | None) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app_id, batch_id)], custom_metadata=metadata)


def append_once(
    path: str | Path,
    data: pa.Table,
    app_id: str,
    batch_id: int,
    partition_by: Sequence[str] | None = None,
    metadata: dict[str, str] | None = None,
) -> bool:
    """Append `data` as batch `batch_id` of writer `app_id`, unless that batch is already committed.

    Returns True if it wrote. An empty batch still commits (the table records the batch as done).
    """
    done = committed_batch(path, app_id)
    if done is not None and done >= batch_id:
        return False
    write_deltalake(
        str(path),
        data,
        mode="append",
        partition_by=list(partition_by) if partition_by else None,
        schema_mode="merge",
        commit_properties=_commit(app_id, batch_id, metadata),
    )
    return True


def merge_once(
    path: str | Path,
    data: pa.Table,
    keys: Sequence[str],
    app_id: str,
    batch_id: int,
    order_by: Sequence[str] | None = None,
) -> bool:
    """Upsert rows by `keys` as batch `batch_id` of `app_id`, exactly once.

    With several rows per key in `data`, the last wins (by `order_by`, else by row order).
    """
    done = committed_batch(path, app_id)
    if done is not None and done >= batch_id:
        return False
    if data.num_rows:
        data = _last_per_key(data, keys, order_by or [])
    if not exists(path):
        write_deltalake(str(path), data, mode="append", commit_properties=_commit(app_id, batch_id, None))
        return True
    predicate = " AND ".join(f"t.{k} = s.{k}" for k in keys)
    (
        DeltaTable(str(path))
        .merge(data, predicate, source_alias="s", target_alias="t", commit_properties=_commit(app_id, batch_id, None))
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    return True


def insert_new_once(
    path: str | Path,
    data: pa.Table,
    keys: Sequence[str],
    app_id: str,
    batch_id: int,
    prune: str | None = None,
    retries: int = 5,
) -> bool:
    """Insert the rows of `data` whose `keys` are not in the table yet (the first writer of a key wins;
    a stored row is never updated), as batch `batch_id` of `app_id`, exactly once. Returns True if it
    committed. An empty `data` still commits, recording the batch.

    `prune`: an SQL condition on the target alias `t` that every matching row meets (e.g. a seq
    range), so the merge reads only the files that may hold them. Writers of other queries may commit
    at the same time (several queries write one quarantine table): a conflicting commit is retried, the
    app transaction checked again first, so a retry never inserts twice.
    """
    data = _last_per_key(data, keys, []) if data.num_rows else data
    for attempt in range(retries + 1):
        done = committed_batch(path, app_id)
        if done is not None and done >= batch_id:
            return False
        try:
            if exists(path) and data.num_rows:
                predicate = " AND ".join([f"t.{k} = s.{k}" for k in keys] + ([f"({prune})"] if prune else []))
                metrics = (
                    DeltaTable(str(path))
                    .merge(data, predicate, source_alias="s", target_alias="t",
                           commit_properties=_commit(app_id, batch_id, None))
                    .when_not_matched_insert_all()
                    .execute()
                )
                if metrics.get("num_target_rows_inserted", 0):
                    return True
                data = data.slice(0, 0)  # every key was there: delta-rs did not commit; record the batch
            write_deltalake(str(path), data, mode="append", schema_mode="merge",
                            commit_properties=_commit(app_id, batch_id, None))
            return True
        except CommitFailedError:
            if attempt == retries:
                raise
            time.sleep(0.05 * 2**attempt)
    return False  # not reached


def _last_per_key(data: pa.Table, keys: Sequence[str], order_by: Sequence[str]) -> pa.Table:
    df = data.to_pandas()
    if order_by:
        df = df.sort_values(list(order_by), kind="stable")
    df = df.drop_duplicates(list(keys), keep="last")
    return pa.Table.from_pandas(df, schema=data.schema, preserve_index=False)


def replace_where(
    path: str | Path,
    data: pa.Table,
    predicate: str,
    partition_by: Sequence[str] | None = None,
    metadata: dict[str, str] | None = None,
) -> None:
    """Atomically replace the rows matching `predicate` (e.g. one day's partition) with `data`.

    Idempotent by construction: running it twice leaves the same rows.
    """
    if not exists(path):
        write_deltalake(str(path), data, mode="append", partition_by=list(partition_by or []) or None)
        return
    write_deltalake(
        str(path),
        data,
        mode="overwrite",
        predicate=predicate,
        partition_by=list(partition_by) if partition_by else None,
        commit_properties=CommitProperties(custom_metadata=metadata) if metadata else None,
    )


def _normalize(table: pa.Table) -> pa.Table:
    """DataFusion returns view types (Utf8View, BinaryView); pandas and Spark want the plain ones."""
    fields = []
    for f in table.schema:
        t = f.type
        if t == pa.string_view():
            t = pa.string()
        elif t == pa.binary_view():
            t = pa.binary()
        fields.append(pa.field(f.name, t, f.nullable))
    schema = pa.schema(fields)
    return table if schema == table.schema else table.cast(schema)


def query(sql: str, **tables: str | Path) -> pa.Table:
    """Run SQL over named Delta tables: `query("select * from t where day = '2004-03-07'", t=path)`."""
    qb = QueryBuilder()
    for name, path in tables.items():
        qb.register(name, DeltaTable(str(path)))
    return _normalize(pa.table(qb.execute(sql).read_all()))


def read(path: str | Path, where: str | None = None, columns: Sequence[str] | None = None, version: int | None = None) -> pa.Table:
    """A whole table (or the rows matching `where`, at `version`) as Arrow. Missing table: error."""
    dt = DeltaTable(str(path), version=version)
    cols = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    sql = f"select {cols} from t" + (f" where {where}" if where else "")
    qb = QueryBuilder().register("t", dt)
    return _normalize(pa.table(qb.execute(sql).read_all()))


def count(path: str | Path, where: str | None = None) -> int:
    if not exists(path):
        return 0
    sql = "select count(*) as n from t" + (f" where {where}" if where else "")
    return int(query(sql, t=path).column("n")[0].as_py())


def to_spark(spark, path: str | Path, where: str | None = None, version: int | None = None):
    """A Delta table (or a version of it) as a Spark DataFrame, read through delta-rs."""
    return spark.createDataFrame(read(path, where, version=version))
