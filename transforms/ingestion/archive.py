"""Archiving the landing under `eventide serve`: segments every query reading a log has committed move
out of the folder Spark's file source lists on every trigger (archive_segments), so that folder stays
small over a day of low-latency operation. The log stays whole and replayable: readers of the landing
(`list_segments`, quarantine replay, recovery) see both folders, and a query with archived segments still
to read (one that has committed nothing yet, or stopped partway through the archive) lists both
(landing.reads_archive). A query that no longer lists the archive forgets the archived segments in its
checkpoint (forget_archived), and the archive keeps its segments' row counts for `eventide status`.

"Every query" is every checkpoint under the home that reads the log (its latest generation), and every
registered query of the log that has no checkpoint yet, so a segment is archived only once nothing may
still need to read it from the live folder.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from transforms.engine.checkpoints import (
    forget_source_files,
    has_commits,
    landing_log_of,
    latest_checkpoints,
    processed_segments,
)
from transforms.engine.plan import QueryPlan
from transforms.files import fsync_dir
from transforms.ingestion.segments import parse_segment_name
from transforms.settings import Settings


def archive_committed(settings: Settings, plans: list[QueryPlan]) -> dict[str, int]:
    """Archive what every query of each log has committed; returns segments moved per log."""
    readers: dict[str, list] = defaultdict(list)
    for ckpt in latest_checkpoints(settings.checkpoints):
        log = landing_log_of(ckpt)
        if log is not None:
            readers[log].append(ckpt)
    blocked = {p.group for p in plans if not has_commits(p.checkpoint(settings))}  # may still read it all
    moved = {}
    for log, checkpoints in readers.items():
        if log in blocked:
            continue
        common: set[str] | None = None
        for ckpt in checkpoints:
            names = processed_segments(ckpt)[1]
            common = names if common is None else common & names
        if common:
            moved[log] = archive_segments(settings, log, common)
    return moved


def forget_archived(settings: Settings, plan: QueryPlan) -> int:
    """Let `plan`'s checkpoint forget the archived segments its query read; returns how many it forgot.
    Call it before the query starts, and only when the query no longer lists the archive (landing's
    `reads_archive`): it never sees those files again, so it need not remember them.

    Spark's file source remembers every file it read and rewrites the whole list every tenth batch, so
    under `serve` (up to four segments a second a log) a query's start and every tenth batch cost more
    each day (measured, 300,000 entries, about a day of one busy log: a start 2.6 s instead of 0.3, every
    tenth batch 1.4-2.0 s instead of 0.3; `python -m bench.file_list`). `serve` restarts a query whose list
    grew (live.py), and each start forgets."""
    archive = settings.landing_archive / plan.group
    if not archive.is_dir():
        return 0
    return forget_source_files(plan.checkpoint(settings), set(os.listdir(archive)).__contains__)[1]


def archive_segments(settings: Settings, group: str, names: set[str]) -> int:
    """Move these closed segments of a log from the live folder to the archive; returns how many.

    Spark's file source lists the live folder on every trigger (measured: 58 ms with 1,000 files,
    650 ms with 40,000), so under `eventide serve` the live folder must only hold what some query may
    still read. A rename on one file system: a segment is in exactly one of the two folders."""
    live, archive = settings.landing / group, settings.landing_archive / group
    moved = []
    for name in sorted(names):
        if not parse_segment_name(name) or not (live / name).exists():
            continue
        archive.mkdir(parents=True, exist_ok=True)
        os.rename(live / name, archive / name)
        moved.append(name)
    if moved:
        fsync_dir(archive)
        fsync_dir(live)
        _note_rows(archive, moved)
    return len(moved)


# The archive's row counts by segment (`<name> <rows>` a line), so `eventide status` need not open every
# archived segment's footer (50,000 segments, about 3.5 hours of one busy log: 3.65 s -> 0.49 s; bench.file_list).
ROWS_FILE = ".rows"


def _note_rows(archive: Path, names: list[str]) -> None:
    """Append the row counts of newly archived segments to ROWS_FILE: a cache (a segment it lacks, after a
    crash say, has its footer read instead), so it is neither fsynced nor locked against a torn line."""
    import pyarrow.parquet as pq

    lines = "".join(f"{name} {pq.read_metadata(archive / name).num_rows}\n" for name in names)
    with (archive / ROWS_FILE).open("a") as f:
        f.write(lines)


def archived_rows(archive: Path) -> dict[str, int]:
    """The row counts ROWS_FILE holds for the segments of an archive folder ({} if none)."""
    try:
        text = (archive / ROWS_FILE).read_text()
    except FileNotFoundError:
        return {}
    rows = {}
    for line in text.splitlines():
        name, _, count = line.partition(" ")
        if count.isdigit():
            rows[name] = int(count)
    return rows
