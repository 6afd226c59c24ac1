"""Archiving the landing under `eventide serve`: segments every query reading a log has committed move
out of the folder Spark's file source lists on every trigger (archive_segments), so that folder stays
small over a day of low-latency operation. The log stays whole and replayable: readers of the landing
(`list_segments`, quarantine replay, recovery) see both folders, and a query with archived segments still
to read (one that has committed nothing yet, or stopped partway through the archive) lists both
(reads_archive). A query that no longer lists the archive forgets the archived segments in its
checkpoint (forget_archived), and the archive keeps its segments' row counts for `eventide status`.

The archive is compacted (compact_archive): runs of small archived segments are merged into one segment
named for the range they span, so a day of `serve` (up to 345,600 segments a log) is not a day of small
files for the next new query, replay or recovery to list. Merging renames what a query's checkpoint
remembers, so it waits until no query may still see the archive's files as new: none lists the archive
now (a marker under the archive while it runs, see note_listing) and none stopped partway through it.

"Every query" is every checkpoint under the home that reads the log (its latest generation), and every
registered query of the log that has no checkpoint yet, so a segment is archived only once nothing may
still need to read it from the live folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from transforms.engine.checkpoints import (
    forget_source_files,
    has_commits,
    landing_log_of,
    latest_checkpoints,
    processed_segments,
)
from transforms.engine.locks import holder_of
from transforms.engine.plan import QueryPlan
from transforms.files import fsync_dir, write_text_atomic
from transforms.ingestion.segments import covering, outermost, parse_segment_name, segment_name
from transforms.settings import Settings

COMPACT_LOG = logging.getLogger("eventide.landing.archive")


def last_read_seq(read: set[str]) -> int | None:
    """The last sequence number of the segments a query has read (None: none yet)."""
    return max((parse_segment_name(name)[1] for name in read), default=None)


def reads_archive(settings: Settings, group: str, read: set[str]) -> bool:
    """Whether a query that has read the segments `read` of log `group` must still list the archive: it
    holds a segment after the last one the query read. True for a query that read nothing yet (it
    starts from the beginning) and for one stopped partway through the archive, however many batches
    it committed; once false it stays false, since only segments every query committed are archived
    (archive.py) and a query reads its log in sequence order."""
    archive = settings.landing_archive / group
    if not archive.is_dir():
        return False
    last = last_read_seq(read)
    return any((seqs := parse_segment_name(p.name)) and (last is None or seqs[0] > last) for p in archive.iterdir())


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
    return forget_source_files(plan.checkpoint(settings), archived_names(archive))[1]


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


# -- compaction ------------------------------------------------------------------------------------------
# A merged segment's largest size (and no larger than a query's batch may be: see _runs), and a run's most
# files (a small segment costs about 1 ms to open, read and delete: a run about 2 s here), so that a round
# of serve's main loop, which archives every 10 s, merges no more than a run once it has taken a while.
COMPACT_TARGET_BYTES = 128 * 1024 * 1024
COMPACT_RUN_FILES = 2_000
COMPACT_ROUND_SECONDS = 2.0
LOCK_FILE = ".lock"  # held by a compaction, and briefly by a query's start as it takes up the archive
LISTING = ".listing"  # a file per query that lists the archive (named for the query) while it runs
COMPACTING = ".compacting-"  # a merged segment being written (hidden: Spark's listing skips dot files)


def archived_ranges(archive: Path) -> list[tuple[int, int, str]]:
    """(first, last, name) of the archive's segments, in sequence order, without the segments a merged
    one holds (left behind by a compaction cut short: see outermost)."""
    try:
        names = os.listdir(archive)
    except FileNotFoundError:
        return []
    return outermost([(*seqs, n) for n in names if (seqs := parse_segment_name(n))])


def archived_names(archive: Path) -> Callable[[str], bool]:
    """Whether a segment name is archived: in the archive itself, or merged into a segment there."""
    ranges = archived_ranges(archive)

    def archived(name: str) -> bool:
        seqs = parse_segment_name(name)
        return seqs is not None and covering(ranges, *seqs) is not None

    return archived


@contextlib.contextmanager
def _archive_lock(archive: Path, wait: bool = True) -> Iterator[bool]:
    """The archive's lock (flock: a holder that dies lets go); yields whether it was taken."""
    archive.mkdir(parents=True, exist_ok=True)
    with open(archive / LOCK_FILE, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def note_listing(settings: Settings, plan: QueryPlan, lists_archive: bool) -> None:
    """Say, before `plan`'s query starts, whether it lists the archive of its log. Called by the process
    that holds the query's lock (locks.py), so the marker is true while that lock is held: compaction
    waits for a marker whose query's lock is held, and removes one whose lock is free (its process
    stopped). Taken under the archive's lock, so no compaction is halfway while the query first lists."""
    archive = settings.landing_archive / plan.group
    marker = archive / LISTING / plan.name
    if not lists_archive:
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
        return
    with _archive_lock(archive):
        _settle(archive)
        marker.parent.mkdir(exist_ok=True)
        marker.touch()


def lists_archive(settings: Settings, plan: QueryPlan) -> bool:
    """Whether `plan`'s query was started listing the archive (note_listing) and is marked so still."""
    return (settings.landing_archive / plan.group / LISTING / plan.name).exists()


def compact_archive(settings: Settings, log: str, min_files: int | None = None) -> int:
    """Merge runs of the archive's small segments into one segment each; returns how many segments were
    merged (0 if the archive holds fewer than `min_files` small ones in a row, or a query may still read
    it as it was). Each merged segment is written hidden, made durable, renamed into place, and only then
    are the segments it holds deleted: a crash at any point leaves every message in the archive once as
    readers see it (list_segments and Spark's listing skip the hidden file; outermost, the replaced ones)."""
    min_files = settings.archive_compact_files if min_files is None else min_files
    archive = settings.landing_archive / log
    if not min_files or _segment_files(archive) < min_files:  # the common case, every 10 s: one listing
        return 0
    with _archive_lock(archive, wait=False) as locked:
        if not locked:  # a query is taking the archive up: the next round
            return 0
        _settle(archive)
        listing, partway = _readers_of_archive(settings, log, archive)
        if partway and _BLOCKED_SAID.get(str(archive)) != partway:  # once per set of queries, not every round
            COMPACT_LOG.warning(
                "the landing archive of log %r (%d segments) is not compacted while %s, stopped partway through "
                "it, may still read it as it is: run it again (`eventide run`, or serve) and it reads the rest; "
                "if its app is gone, remove its checkpoint under %s", log, _segment_files(archive),
                ", ".join(partway), settings.checkpoints)
        _BLOCKED_SAID[str(archive)] = partway
        if listing or partway:
            return 0
        merged, start = 0, time.monotonic()
        max_bytes = min(COMPACT_TARGET_BYTES, settings.max_bytes_per_trigger or COMPACT_TARGET_BYTES)
        for run in _runs(archive, archived_ranges(archive), max_bytes, settings.max_messages_per_trigger):
            merged += _merge(archive, run)
            if time.monotonic() - start >= COMPACT_ROUND_SECONDS:  # the rest in the next rounds
                break
        return merged


_BLOCKED_SAID: dict[str, list[str]] = {}  # archive -> the readers a warning last named


def _segment_files(archive: Path) -> int:
    """Segment files in the archive, those a merged one holds included (so a cut compaction is settled)."""
    try:
        return sum(1 for name in os.listdir(archive) if parse_segment_name(name))
    except FileNotFoundError:
        return 0


def _settle(archive: Path) -> None:
    """Finish what a compaction cut short: its hidden merged file, and segments a merged one holds."""
    names = os.listdir(archive)
    for name in names:
        if name.startswith(COMPACTING):
            (archive / name).unlink()
    kept = {r[2] for r in archived_ranges(archive)}
    inner = [n for n in names if parse_segment_name(n) and n not in kept]
    for name in inner:
        (archive / name).unlink()
    if inner:
        fsync_dir(archive)
        COMPACT_LOG.warning("archive of log %r: removed %d segment(s) already merged (a compaction was cut short)",
                            archive.name, len(inner))


def _readers_of_archive(settings: Settings, log: str, archive: Path) -> tuple[list[str], list[str]]:
    """Queries that may still see the archive's files as new, so that merging them would be read twice:
    those listing the archive now (a marker, and the query's lock held), and those stopped partway through
    it (a checkpoint that committed less than the whole archive; one planned, not committed, may replay
    its files)."""
    listing = []
    for marker in (archive / LISTING).iterdir() if (archive / LISTING).is_dir() else ():
        if holder_of(settings, marker.name) is not None:
            listing.append(marker.name)
        else:  # its process stopped without saying: the lock is what tells
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()
    partway = [ckpt.parent.name for ckpt in latest_checkpoints(settings.checkpoints)
               if landing_log_of(ckpt) == log and ckpt.parent.name not in listing
               and reads_archive(settings, log, processed_segments(ckpt)[1])]
    return listing, partway


def _runs(archive: Path, ranges: list[tuple[int, int, str]], max_bytes: int, max_rows: int) -> list[list[tuple]]:
    """Runs of consecutive segments to merge, each within `max_bytes` and `max_rows` (0: no bound) and
    COMPACT_RUN_FILES: a query's batch bound (EVENTIDE_MAX_BYTES_PER_TRIGGER, _MESSAGES_PER_TRIGGER) cannot
    split a file, so a merged segment must not hold more than one batch may. Runs of one segment are left
    as they are (a merged segment under the bounds is merged again with the segments after it)."""
    import pyarrow.parquet as pq

    noted = archived_rows(archive)
    runs, run, size, rows = [], [], 0, 0
    for r in ranges:
        n_bytes = (archive / r[2]).stat().st_size
        n_rows = noted.get(r[2])
        if n_rows is None:  # not noted (a crash between a move and its note): from the footer
            n_rows = pq.read_metadata(archive / r[2]).num_rows
        if run and ((max_bytes and size + n_bytes > max_bytes) or (max_rows and rows + n_rows > max_rows)
                    or len(run) >= COMPACT_RUN_FILES):
            runs.append(run)
            run, size, rows = [], 0, 0
        run.append(r)
        size, rows = size + n_bytes, rows + n_rows
    runs.append(run)
    return [r for r in runs if len(r) >= 2]


def _merge(archive: Path, run: list[tuple[int, int, str]]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = [archive / r[2] for r in run]
    final = archive / segment_name(run[0][0], run[-1][1])
    tmp = archive / f"{COMPACTING}{final.name}"
    rows = 0
    with open(tmp, "wb") as f:
        # Row groups of about 64 MB in memory (a run is up to COMPACT_TARGET_BYTES compressed), not one a
        # small segment: readers pay per row group.
        with pq.ParquetWriter(f, pq.read_schema(paths[0]), compression="zstd") as writer:
            buffered, size = [], 0
            for i, p in enumerate(paths):
                buffered.append(pq.ParquetFile(p).read())  # half read_table's cost on a small file
                size += buffered[-1].nbytes
                if i == len(paths) - 1 or size >= 64 * 1024 * 1024:
                    table = pa.concat_tables(buffered)
                    writer.write_table(table, row_group_size=table.num_rows)
                    rows += table.num_rows
                    buffered, size = [], 0
        f.flush()
        os.fsync(f.fileno())
    stamp = paths[-1].stat().st_mtime_ns  # Spark reads by modification time: it keeps the run's place
    os.utime(tmp, ns=(stamp, stamp))
    os.rename(tmp, final)
    fsync_dir(archive)
    for p in paths:
        p.unlink()
    fsync_dir(archive)
    noted = archived_rows(archive)
    kept = {r[2] for r in archived_ranges(archive)}
    noted = {name: n for name, n in noted.items() if name in kept} | {final.name: rows}
    write_text_atomic(archive / ROWS_FILE, "".join(f"{name} {n}\n" for name, n in sorted(noted.items())))
    COMPACT_LOG.info("archive of log %r: merged %d segments into %s (%d messages)", archive.name, len(paths),
                     final.name, rows)
    return len(paths)
