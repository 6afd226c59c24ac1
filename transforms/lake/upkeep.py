"""Upkeep of the lake's small files. Micro-batches every 0.25 s under `serve` write many small files;
Delta's auto compaction is off (session.py), the log checkpoints every 10 commits, and `upkeep` (run
by `serve` on a cadence and by `eventide upkeep`) compacts them (OPTIMIZE) and deletes files no
version younger than the retention needs (VACUUM, EVENTIDE_VACUUM_HOURS)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transforms.lake.reads import exists, last_upkeep, table_files


@dataclass(frozen=True)
class UpkeepResult:
    table: str
    files_before: int
    files_after: int
    vacuumed: int  # files deleted from disk


def upkeep_table(spark, path: Path, vacuum_hours: float) -> UpkeepResult:
    from delta.tables import DeltaTable

    before = table_files(path)
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
           now: Callable[[], float] = time.time) -> list[UpkeepResult]:
    """OPTIMIZE and VACUUM every table under `lake`. With `revisit_after` (seconds), a table whose
    latest commit is the end of its last upkeep, younger than that, is left alone: no commit since
    means nothing to compact and no file made deletable by one (the table's own history says so, so
    the memory survives a restart, and an upkeep is several Spark jobs and two commits a table)."""
    if not lake.is_dir():
        return []
    done = []
    for path in sorted(p for p in lake.iterdir() if exists(p)):
        if revisit_after is not None and (at := last_upkeep(path)) is not None and now() - at < revisit_after:
            continue
        done.append(upkeep_table(spark, path, vacuum_hours))
    return done


def _parquet_files(path: Path) -> int:
    return sum(1 for _ in path.rglob("*.parquet"))
