"""`eventide show`: print a Delta table as a table, CSV or JSON lines; `eventide sql`: the same for the
result of Spark SQL over the home's tables (each named as `show` names it).

Binary columns (a quarantined payload) print so that the bytes can be recovered exactly: in CSV and
JSON as base64 under the column's name plus `_base64`; in the table as a Python bytes literal
(`b'\\xff'` is one byte, `b'\\\\xff'` four), readable for text payloads and never ambiguous.
"""

from __future__ import annotations

import base64
import json

import pyarrow as pa

from transforms import lake
from transforms.settings import ConfigError, Settings

BASE64_SUFFIX = "_base64"


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def _text(v):
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def _base64(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode("ascii")


def _literal(v: bytes | None) -> str | None:
    return None if v is None else repr(bytes(v))


def show_table(settings: Settings, table: str, fmt: str = "table", where: str | None = None, limit: int | None = None) -> str:
    path = settings.table_path(table)
    if not lake.exists(path):
        known = sorted(p.name for p in settings.lake.iterdir() if lake.exists(p)) if settings.lake.is_dir() else []
        raise ConfigError(f"no table {table!r} in {settings.lake}; tables: {', '.join(known) or 'none yet (run `eventide run`)'}")
    data: pa.Table = lake.read(path, where)
    sort = [c for c in ("day", "seq", "symbol", "word", "status") if c in data.column_names]
    if sort and data.num_rows:
        data = data.sort_by([(c, "ascending") for c in sort])
    if limit is not None:
        data = data.slice(0, limit)
    return format_rows(data, fmt)


def sql_query(settings: Settings, sql: str, fmt: str = "table") -> str:
    """Run Spark SQL over the home's Delta tables (registered in the session's catalog by name)."""
    from transforms.spark import get_spark

    spark = get_spark(settings)
    lake.register_tables(spark, settings.lake)
    try:
        data = spark.sql(sql).toArrow()
    except Exception as e:  # Spark's analysis errors say what is wrong with the query
        from pyspark.errors import PySparkException

        if not isinstance(e, PySparkException):
            raise
        known = ", ".join(t.name for t in spark.catalog.listTables()) or "none yet (run `eventide run`)"
        raise ConfigError(f"the query failed: {str(e).splitlines()[0]}\n  tables: {known}") from None
    return format_rows(data, fmt)


def format_rows(data: pa.Table, fmt: str) -> str:
    """Rows as an aligned table, CSV, or JSON (one object per line)."""
    binary = {f.name for f in data.schema if _is_binary(f.type)}
    exact = fmt in ("json", "csv")  # machine formats: base64, under a name that says so
    columns = [c + BASE64_SUFFIX if c in binary and exact else c for c in data.column_names]
    as_binary = _base64 if exact else _literal
    rows = [{name: (as_binary(v) if k in binary else _text(v)) for name, (k, v) in zip(columns, r.items())}
            for r in data.to_pylist()]
    if fmt == "json":
        return "".join(json.dumps(r, default=str) + "\n" for r in rows)
    import pandas as pd

    df = pd.DataFrame(rows, columns=columns)
    if fmt == "csv":
        return df.to_csv(index=False)
    return (df.to_string(index=False) if len(df) else f"(no rows; columns: {', '.join(columns)})") + "\n"
