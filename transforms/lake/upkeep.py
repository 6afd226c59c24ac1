"""Upkeep of the lake's small files. Micro-batches every 0.25 s under `serve` write many small files:
Delta's auto compaction (session.py) merges a partition's small files after a write once there are
enough of them, the log checkpoints every 10 commits, and `upkeep` (run by `serve` on a cadence and
by `eventide upkeep`) compacts what auto compaction left (OPTIMIZE) and deletes files no version
younger than the retention needs (VACUUM, EVENTIDE_VACUUM_HOURS)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transforms.lake.reads import exists, table_files


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


def upkeep(spark, lake: Path, vacuum_hours: float) -> list[UpkeepResult]:
    """OPTIMIZE and VACUUM every table under `lake`."""
    return [upkeep_table(spark, p, vacuum_hours) for p in sorted(lake.iterdir()) if exists(p)] if lake.is_dir() else []


def _parquet_files(path: Path) -> int:
    return sum(1 for _ in path.rglob("*.parquet"))
