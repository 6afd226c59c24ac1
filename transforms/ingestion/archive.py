"""Archiving the landing under `eventide serve`: segments every query reading a log has committed move
out of the folder Spark's file source lists on every trigger (transforms/ingestion/landing.py,
archive_segments), so that folder stays small over a day of low-latency operation. The log stays whole
and replayable: readers of the landing (`list_segments`, quarantine replay, recovery) see both folders,
and a query that has committed nothing yet reads both (runner.build_stream).

"Every query" is every checkpoint under the home that reads the log (its latest generation), and every
registered query of the log that has no checkpoint yet, so a segment is archived only once nothing may
still need to read it from the live folder.
"""

from __future__ import annotations

from collections import defaultdict

from transforms.engine.checkpoints import has_commits, landing_log_of, latest_checkpoints, processed_segments
from transforms.engine.plan import QueryPlan
from transforms.ingestion.landing import archive_segments
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
