"""Upkeep of the lake's small files. Micro-batches every 0.25 s under `serve` write many small files;
Delta's auto compaction is off (session.py), the log checkpoints every 10 commits, and `upkeep` (run
by `serve` on a cadence and by `eventide upkeep`) compacts them (OPTIMIZE), deletes files no
version younger than the retention needs (VACUUM, EVENTIDE_VACUUM_HOURS), and keeps each table's log
for EVENTIDE_LOG_RETENTION_HOURS (a commit per micro-batch would otherwise grow the log folder every
commit lists)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transforms.lake.reads import exists, last_upkeep, table_files

# The table properties keep_log_for sets to the log's retention.
RETENTIONS = ("delta.logRetentionDuration", "delta.deletedFileRetentionDuration")


@dataclass(frozen=True)
class UpkeepResult:
    table: str
    files_before: int
    files_after: int
    vacuumed: int  # files deleted from disk


def keep_log_for(spark, path: Path, hours: float) -> bool:
    """Set the table's log retention (`delta.logRetentionDuration`) to `hours` unless it is so already;
    returns whether it changed. Delta deletes the log's commit files older than that (from before the
    midnight before it) when it writes a checkpoint (every 10 commits). On a local file system a commit
    lists the whole log folder (`python -m bench.delta_log`: a one-row append 0.69 s, 2.27 s with 100,000
    more files there, 5.80 s with 300,000), and `serve` commits about once a second to a busy table
    (Delta's default keeps 30 days). Delta wants the retention of removed data files that a VACUUM
    without hours uses (`delta.deletedFileRetentionDuration`) no longer, so it is set the same; upkeep's
    VACUUM gives its own (EVENTIDE_VACUUM_HOURS)."""
    from deltalake import DeltaTable as LogReader

    wanted = f"interval {round(hours * 3600)} seconds"
    properties = LogReader(str(path)).metadata().configuration
    if all(properties.get(p) == wanted for p in RETENTIONS):
        return False
    settings = ", ".join(f"'{p}' = '{wanted}'" for p in RETENTIONS)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({settings})")
    return True


def upkeep_table(spark, path: Path, vacuum_hours: float, log_retention_hours: float | None = None) -> UpkeepResult:
    from delta.tables import DeltaTable

    before = table_files(path)
    if log_retention_hours:  # first: the upkeep's own commits stay the table's last (see upkeep)
        keep_log_for(spark, path, log_retention_hours)
    table = DeltaTable.forPath(spark, str(path))
    table.optimize().executeCompaction()
    on_disk = _parquet_files(path)
    table.vacuum(vacuum_hours)
    after = table_files(path)
    return UpkeepResult(path.name, before.files if before else 0, after.files if after else 0,
                        on_disk - _parquet_files(path))


# `serve` does a table whose latest commit is its last upkeep's again after this long: VACUUM's
# retention makes its old files deletable with time alone.
REVISIT_UNCHANGED_SECONDS = 3600.0


def upkeep(spark, lake: Path, vacuum_hours: float, revisit_after: float | None = None,
           now: Callable[[], float] = time.time, log_retention_hours: float | None = None) -> list[UpkeepResult]:
    """OPTIMIZE and VACUUM every table under `lake`, and with `log_retention_hours` keep each table's log
    that long (keep_log_for). With `revisit_after` (seconds), a table whose
    latest commit is the end of its last upkeep, younger than that, is left alone: no commit since
    means nothing to compact and no file made deletable by one (the table's own history says so, so
    the memory survives a restart, and an upkeep is several Spark jobs and two commits a table)."""
    if not lake.is_dir():
        return []
    done = []
    for path in sorted(p for p in lake.iterdir() if exists(p)):
        if revisit_after is not None and (at := last_upkeep(path)) is not None and now() - at < revisit_after:
            continue
        done.append(upkeep_table(spark, path, vacuum_hours, log_retention_hours))
    return done


def _parquet_files(path: Path) -> int:
    return sum(1 for _ in path.rglob("*.parquet"))
