"""Archiving the landing under `eventide serve`: segments every query reading a log has committed move
out of the folder Spark's file source lists on every trigger (archive_segments), so that folder stays
small over a day of low-latency operation. The log stays whole and replayable: readers of the landing
(`list_segments`, quarantine replay, recovery) see both folders, and a query that has committed nothing
yet reads both (runner.build_stream).

"Every query" is every checkpoint under the home that reads the log (its latest generation), and every
registered query of the log that has no checkpoint yet, so a segment is archived only once nothing may
still need to read it from the live folder.
"""

from __future__ import annotations

import os
from collections import defaultdict

from transforms.engine.checkpoints import has_commits, landing_log_of, latest_checkpoints, processed_segments
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


def archive_segments(settings: Settings, group: str, names: set[str]) -> int:
    """Move these closed segments of a log from the live folder to the archive; returns how many.

    Spark's file source lists the live folder on every trigger (measured: 58 ms with 1,000 files,
    650 ms with 40,000), so under `eventide serve` the live folder must only hold what some query may
    still read. A rename on one file system: a segment is in exactly one of the two folders."""
    live, archive = settings.landing / group, settings.landing_archive / group
    moved = 0
    for name in sorted(names):
        if not parse_segment_name(name) or not (live / name).exists():
            continue
        archive.mkdir(parents=True, exist_ok=True)
        os.rename(live / name, archive / name)
        moved += 1
    if moved:
        fsync_dir(archive)
        fsync_dir(live)
    return moved
