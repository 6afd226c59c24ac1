"""`eventide show`: print a Delta table as a table, CSV or JSON lines."""

from __future__ import annotations

import json

import pyarrow as pa

from transforms import lake
from transforms.settings import ConfigError, Settings


def _text(v):
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "backslashreplace")
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


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
    rows = [{k: _text(v) for k, v in r.items()} for r in data.to_pylist()]
    if fmt == "json":
        return "".join(json.dumps(r, default=str) + "\n" for r in rows)
    import pandas as pd

    df = pd.DataFrame(rows, columns=data.column_names)
    if fmt == "csv":
        return df.to_csv(index=False)
    return (df.to_string(index=False) if len(df) else f"(no rows; columns: {', '.join(data.column_names)})") + "\n"
