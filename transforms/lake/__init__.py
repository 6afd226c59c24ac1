"""The lake: the one room that knows where tables live and how Delta is read, written and kept.

- session.py: the jars and settings a Spark session needs for Delta, and the home's tables in its catalog;
- writes.py: every write, through Spark's Delta writer (delta-spark), exactly once by Delta's own
  idempotent writes (txnAppId / txnVersion);
- reads.py: JVM-free reads through delta-rs (status, show, checks, tests), never a write;
- upkeep.py: compaction and vacuum.

Spark reads a table the standard way: `spark.read.format("delta").load(path)`.
"""

from transforms.lake.reads import (
    TableFiles,
    arrow_schema,
    committed_batch,
    count,
    engine_info,
    exists,
    last_upkeep,
    query,
    read,
    table_files,
    version,
)
from transforms.lake.session import configure, delta_spark_conf, jar_paths, register_tables
from transforms.lake.upkeep import REVISIT_UNCHANGED_SECONDS, UpkeepResult, upkeep
from transforms.lake.writes import append_once, merge_once, replace_where

__all__ = [
    "REVISIT_UNCHANGED_SECONDS", "TableFiles", "UpkeepResult", "append_once", "arrow_schema", "configure", "committed_batch", "count", "delta_spark_conf", "engine_info",
    "exists", "jar_paths", "last_upkeep", "merge_once", "query", "read", "register_tables", "replace_where", "table_files",
    "upkeep", "version",
]
