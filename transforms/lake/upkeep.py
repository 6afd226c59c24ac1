"""Upkeep of the lake's small files. Micro-batches every 0.25 s under `serve` write many small files;
Delta's auto compaction is off (session.py), the log checkpoints every 10 commits, and `upkeep` (run
by `serve` on a cadence and by `eventide upkeep`) compacts them (OPTIMIZE) and deletes files no
version younger than the retention needs (VACUUM, EVENTIDE_VACUUM_HOURS)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transforms.lake.reads import exists, table_files, version


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


# A table with no commit since its last upkeep is done again after this long: VACUUM's retention
# makes its old files deletable with time alone.
REVISIT_UNCHANGED_SECONDS = 3600.0


def upkeep(spark, lake: Path, vacuum_hours: float, last: dict[str, tuple[int, float]] | None = None,
           now: Callable[[], float] = time.monotonic) -> list[UpkeepResult]:
    """OPTIMIZE and VACUUM every table under `lake`. With `last` (a caller's memory across rounds: the
    table's version after its upkeep, and when), a table with no commit since then is left alone until
    REVISIT_UNCHANGED_SECONDS have passed: an idle `serve` then spends nothing on it (an upkeep is
    several Spark jobs a table, and commits a version of its own)."""
    if not lake.is_dir():
        return []
    done = []
    for path in sorted(p for p in lake.iterdir() if exists(p)):
        key = str(path)
        if last is not None and key in last:
            kept_version, at = last[key]
            if version(path) == kept_version and now() - at < REVISIT_UNCHANGED_SECONDS:
                continue
        done.append(upkeep_table(spark, path, vacuum_hours))
        if last is not None:
            last[key] = (version(path), now())
    return done


def _parquet_files(path: Path) -> int:
    return sum(1 for _ in path.rglob("*.parquet"))
