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
        data = last_per_key(data, keys, order_by or [])
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
    data = last_per_key(data, keys, []) if data.num_rows else data
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


def last_per_key(data: pa.Table, keys: Sequence[str], order_by: Sequence[str]) -> pa.Table:
    """The last row of each key (by `order_by`, else by row order)."""
    df = data.to_pandas()
    if order_by:
        df = df.sort_values(list(order_by), kind="stable")
    df = df.drop_duplicates(list(keys), keep="last")
    return pa.Table.from_pandas(df, schema=data.schema, preserve_index=False)


def commit_files_once(
    path: str | Path,
    files: Sequence[tuple[dict, pa.Schema]],
    app_id: str,
    batch_id: int,
    schema: pa.Schema | None = None,
    partition_by: Sequence[str] | None = None,
) -> bool:
    """Commit Parquet files already written into the table's folder (engine/staging.py: each an add
    action as a dict, and the schema of its rows) as batch `batch_id` of `app_id`, in one transaction,
    unless that batch is committed already: then False, and the files are the caller's to delete.

    delta-rs does not check an append's schema: each file's columns are checked against the table's
    here (a type that differs is an error naming the column; a new column is added to the table
    first). A new table takes `schema`, else the files' columns. No files still commits (the table
    records the batch), or creates the table when `schema` is given."""
    from deltalake import Schema
    from deltalake.transaction import AddAction, create_table_with_add_actions

    done = committed_batch(path, app_id)
    if done is not None and done >= batch_id:
        return False
    adds = [AddAction(a["path"], a["size"], a["partition_values"], a["modification_time"], True, a["stats"])
            for a, _ in files]
    parts = list(partition_by or [])
    commit = _commit(app_id, batch_id, None)
    if not exists(path):
        full = schema or _unified([s for _, s in files], str(path))
        if full is None:
            return False  # nothing to infer the table's columns from yet
        create_table_with_add_actions(str(path), Schema.from_arrow(full), adds, mode="append", partition_by=parts,
                                      commit_properties=commit)
        return True
    table = DeltaTable(str(path))
    current = {f.name: f.type for f in table.schema().fields}
    new: dict[str, pa.Field] = {}
    for _, s in files:
        for f in s:
            if f.name not in current:
                new.setdefault(f.name, f)
            elif Schema.from_arrow(pa.schema([f])).fields[0].type != current[f.name]:
                raise ValueError(
                    f"Delta table {path}: column {f.name!r} is {current[f.name]} in the table but a batch wrote "
                    f"{f.type}; declare the sink's schema (DeltaSink(..., schema=...)) so every batch writes the same types"
                )
    if new:
        table.alter.add_columns(list(Schema.from_arrow(pa.schema(list(new.values()))).fields))
        table = DeltaTable(str(path))
    table.create_write_transaction(adds, "append", table.schema(), partition_by=parts or None, commit_properties=commit)
    return True


def _unified(schemas: list[pa.Schema], path: str) -> pa.Schema | None:
    if not schemas:
        return None
    try:
        return pa.unify_schemas(schemas)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"Delta table {path}: the batch's files disagree on column types ({e}); declare the "
                         "sink's schema (DeltaSink(..., schema=...))") from None


def file_paths(path: str | Path) -> set[str]:
    """The data files of the table's current version, as paths relative to its folder (on disk)."""
    from urllib.parse import unquote

    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    return {unquote(p) for p in actions.column("path").to_pylist()}


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


# Reader features under which a table's rows are exactly the rows of its Parquet files: they change the
# log (checkpoints, vacuum) or allow types that the files store as they are.
_PLAIN_PARQUET_READER_FEATURES = frozenset(
    {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "variantType", "variantType-preview"}
)
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _refuse_unless_plain_parquet(dt: DeltaTable, path: str | Path) -> None:
    """Raise ValueError if the table's rows are not simply the rows of its Parquet files."""
    protocol = dt.protocol()
    features = set(protocol.reader_features or ())
    mode = dt.metadata().configuration.get("delta.columnMapping.mode") or "none"
    if "deletionVectors" in features:
        what = "deletion vectors (reader feature 'deletionVectors'): its files can still hold deleted rows"
    elif "columnMapping" in features or mode.lower() != "none":
        what = f"column mapping (delta.columnMapping.mode = {mode!r}): its files name the columns differently"
    elif protocol.min_reader_version > 3:
        what = f"reader version {protocol.min_reader_version}"
    elif unknown := sorted(features - _PLAIN_PARQUET_READER_FEATURES):
        what = f"the reader feature(s) {', '.join(map(repr, unknown))}"
    else:
        return
    raise ValueError(
        f"to_spark: the Delta table at {path} (version {dt.version()}) uses {what}, which a plain Parquet read of "
        "its files cannot honour. Read it through delta-rs with lake.read(...) instead (on the driver), or "
        "rewrite the table without the feature (e.g. write lake.read(...)'s rows to a new table)."
    )


def _hadoop_path(uri: str) -> str:
    """A URI (delta-rs' form: percent-encoded) as a Hadoop path, which Spark takes literally (never decodes)."""
    from urllib.parse import unquote, urlsplit

    u = urlsplit(uri)
    if u.scheme == "file":
        return f"file:{unquote(u.path)}"
    return f"{u.scheme}://{u.netloc}{unquote(u.path)}"


def _spark_location(table_uri: str, add_path: str) -> tuple[str, str | None]:
    """A data file's location as a Hadoop path, and its path on disk relative to the table root (None if the
    log gives an absolute URI).

    The log's paths are URI-encoded: `s=a%2520b/...` is the folder `s=a%20b` on disk. (`DeltaTable.file_uris()`
    is no help: it leaves the root percent-encoded, `/tmp/a%20b/t/...` for a table in `/tmp/a b/t`.)"""
    from urllib.parse import unquote, urlsplit

    if len(urlsplit(add_path).scheme) > 1:
        return _hadoop_path(add_path), None
    relative = unquote(add_path)
    return f"{_hadoop_path(table_uri).rstrip('/')}/{relative}", relative


def _no_glob(location: str) -> str:
    """`location` with Hadoop's glob characters escaped: Spark globs each path it is given."""
    import re

    return re.sub(r"([\\*?\[\]{}])", r"\\\1", location)


def _spark_unescaped(text: str) -> str | None:
    """`text` decoded as Spark's partition discovery decodes a folder name (`unescapePathName`): each `%XX` becomes
    the one character U+00XX, so a non-ASCII value (several UTF-8 bytes) does not come back. None if a `%` does
    not start two hex digits."""
    import re

    if re.search(r"%(?![0-9A-Fa-f]{2})", text):
        return None
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def _discovered_exactly(relative: str, names: Sequence[str], values: Sequence, types: Sequence) -> bool:
    """Whether Spark's partition discovery (basePath = the table root, the table's types) reads exactly
    `values` from the folders of the file at `relative`. Only strings, integers, dates and booleans qualify:
    the text of a timestamp, decimal or float is not worth re-deriving."""
    from pyspark.sql import types as T

    folders = relative.split("/")[:-1]
    if len(folders) != len(names):
        return False
    for folder, name, value, dtype in zip(folders, names, values, types):
        key, eq, raw = folder.partition("=")
        if not eq or not raw or _spark_unescaped(key) != name:
            return False
        if value is None or raw == _HIVE_NULL:
            if not (value is None and raw == _HIVE_NULL):
                return False
        elif isinstance(dtype, T.StringType):  # Spark decodes a string's folder, and only a string's
            if _spark_unescaped(raw) != value:
                return False
        elif isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            if raw != str(value):
                return False
        elif isinstance(dtype, T.DateType):
            if raw != value.isoformat():
                return False
        elif isinstance(dtype, T.BooleanType):
            if raw != ("true" if value else "false"):
                return False
        else:
            return False
    return True


def _literal(value, dtype):
    """A Spark literal column holding `value` (from the log, as Arrow gives it) as `dtype`, exactly."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if value is None:
        return F.lit(None).cast(dtype)
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):  # ISO text: with its offset if aware
        return F.lit(value.isoformat()).cast(dtype)
    if isinstance(dtype, T.BinaryType):
        return F.lit(bytearray(value)).cast(dtype)
    return F.lit(value).cast(dtype)


def _union_all(frames: list):
    """Union DataFrames of the same columns, as a balanced tree (not a chain as deep as the list)."""
    while len(frames) > 1:
        pairs = [frames[i : i + 2] for i in range(0, len(frames), 2)]
        frames = [pair[0].union(pair[1]) if len(pair) == 2 else pair[0] for pair in pairs]
    return frames[0]


def to_spark(spark, path: str | Path, where: str | None = None, version: int | None = None):
    """A Delta table (or a version of it) as a Spark DataFrame that the executors read from its Parquet files.

    The file list is delta-rs' at a pinned version (`version`, else the current one): later commits do not
    change what the DataFrame reads, but its files must still exist when it runs (a vacuum removes an old
    version's files). The schema is the table's, columns in its order. Partition values are the log's, exactly:
    files whose `col=value` folders Spark's partition discovery decodes to those values are read in one scan
    (basePath = the table root; Spark prunes it by partition filters), the others (non-ASCII strings,
    timestamps, decimals, floats) one scan per partition with the values as literal columns. `where` is a Spark
    SQL condition. A table whose rows are not its files' rows (deletion vectors, column mapping, unknown reader
    features) is refused with a ValueError: read it with `read` instead.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    dt = DeltaTable(str(path), version=version)
    _refuse_unless_plain_parquet(dt, path)
    arrow_schema = pa.schema(dt.schema().to_arrow())  # delta-rs gives an arro3 schema
    schema = from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True)
    partitions = list(dt.metadata().partition_columns)
    types = [schema[c].dataType for c in partitions]
    actions = pa.table(dt.get_add_actions(flatten=True))
    logged = [actions.column(f"partition.{c}").to_pylist() for c in partitions]  # typed, None for null
    values = list(zip(*logged)) if partitions else [()] * actions.num_rows

    discovered: list[str] = []  # files whose partition values Spark reads from their folders
    groups: dict[tuple, list[str]] = {}  # partition values -> files, for literal columns
    for add_path, vals in zip(actions.column("path").to_pylist(), values):
        location, relative = _spark_location(dt.table_uri, add_path)
        if not partitions or (relative is not None and _discovered_exactly(relative, partitions, vals, types)):
            discovered.append(_no_glob(location))
        else:
            groups.setdefault(vals, []).append(_no_glob(location))

    def column(name: str):
        return F.col("`" + name.replace("`", "``") + "`")

    frames = []
    if discovered:
        reader = spark.read.schema(schema)
        if partitions:
            reader = reader.option("basePath", _hadoop_path(dt.table_uri).rstrip("/"))
        frames.append(reader.parquet(*discovered).select(*map(column, schema.fieldNames())))
    data_schema = StructType([f for f in schema.fields if f.name not in partitions])
    for vals, files in groups.items():
        # No basePath: each file's folder is its base, so Spark discovers no partition columns of its own.
        literal = {c: _literal(v, t).alias(c) for c, v, t in zip(partitions, vals, types)}
        frame = spark.read.schema(data_schema).parquet(*files)
        frames.append(frame.select(*(literal.get(n, column(n)) for n in schema.fieldNames())))
    if not frames:  # no files: no rows (from Arrow: a local relation, where an empty list would make an RDD)
        frames.append(spark.createDataFrame(arrow_schema.empty_table(), schema=schema))
    df = _union_all(frames)
    return df.where(where) if where else df
