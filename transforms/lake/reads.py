"""JVM-free reads of the lake through delta-rs: `status`, `show`, the asset checks, the demo's
printout and the tests read small tables in milliseconds without starting Spark (a JVM costs 2-5 s).
Every write goes through Spark (writes.py); tests/transforms/test_lake.py holds that delta-rs reads
every table delta-spark writes here.

Reads go through delta-rs' QueryBuilder (DataFusion), not `to_pyarrow_table()`, which can abort the
interpreter at exit (delta-rs #2184).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError


def exists(path: str | Path) -> bool:
    return DeltaTable.is_deltatable(str(path))


def version(path: str | Path) -> int | None:
    """The table's latest version, or None if there is no table yet."""
    try:
        return DeltaTable(str(path)).version()
    except TableNotFoundError:
        return None


def committed_batch(path: str | Path, app_id: str) -> int | None:
    """The last batch id committed to the table under the app transaction `app_id`, or None."""
    try:
        return DeltaTable(str(path)).transaction_version(app_id)
    except TableNotFoundError:
        return None


def arrow_schema(path: str | Path) -> pa.Schema:
    """The table's columns as an Arrow schema."""
    return pa.schema(DeltaTable(str(path)).schema().to_arrow())


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


def read(path: str | Path, where: str | None = None, columns: Sequence[str] | None = None,
         version: int | None = None) -> pa.Table:
    """A whole table (or the rows matching `where`, at `version`) as Arrow. Missing table: error."""
    dt = DeltaTable(str(path), version=version)
    cols = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    sql = f"select {cols} from t" + (f" where {where}" if where else "")
    return _normalize(pa.table(QueryBuilder().register("t", dt).execute(sql).read_all()))


def count(path: str | Path, where: str | None = None) -> int:
    if not exists(path):
        return 0
    sql = "select count(*) as n from t" + (f" where {where}" if where else "")
    return int(query(sql, t=path).column("n")[0].as_py())


@dataclass(frozen=True)
class TableFiles:
    """A table's current version: its data files and their bytes (what upkeep keeps small)."""

    version: int
    files: int
    bytes: int


def table_files(path: str | Path) -> TableFiles | None:
    """Files and bytes of the table's current version, or None if there is no table."""
    try:
        dt = DeltaTable(str(path))
    except TableNotFoundError:
        return None
    actions = pa.table(dt.get_add_actions(flatten=True))
    size = int(pa.compute.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0
    return TableFiles(dt.version(), actions.num_rows, size)


def last_upkeep(path: str | Path) -> float | None:
    """When the table's latest commit ended an upkeep (a completed VACUUM, upkeep's last commit), in
    seconds since the epoch; None when a later commit (or none such) came after it."""
    history = DeltaTable(str(path)).history(1)
    latest = history[0] if history else {}
    if latest.get("operation") == "VACUUM END" and (latest.get("operationParameters") or {}).get("status") == "COMPLETED":
        return latest["timestamp"] / 1000
    return None


def engine_info(path: str | Path) -> str | None:
    """The engine that made the table's latest commit (`commitInfo.engineInfo`), if it says."""
    history = DeltaTable(str(path)).history(1)
    return history[0].get("engineInfo") if history else None
