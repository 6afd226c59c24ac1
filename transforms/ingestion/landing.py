"""Landing: the append-only, replayable log the gateway and `ingest` write and every pipeline reads.

Layout (one folder per sequence group, so streams that share state form one ordered log):

    landing/<group>/.journal-<first seq>            open segment, append-only records (crash-safe)
    landing/<group>/seg-<first seq>-<last seq>.parquet   closed segments, immutable

A segment becomes visible to Spark only when closed: written to a dot-file (Spark's file source
ignores those), fsynced, then renamed. Spark's file source takes files in modification-time order
(milliseconds), so a group's segments are closed in sequence order, each in a later millisecond than
the one before, and a file stream over the folder sees messages in arrival order across batches; at a
query's start, unread segments whose times lost that order (a home copied with `cp -r`) get it back
(`order_unread_segments`). The sequence number is global for the whole landing area and survives
restarts (recovered from the files).

On start, a leftover journal (the gateway crashed) is turned into a segment: every whole record is
kept; a torn tail is landed as a quarantine record with the reason, never silently dropped.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.files import fsync_dir
from transforms.ingestion.log import (
    LANDING_DDL,
    LANDING_SCHEMA,
    Log,
    LogStatus,
    LogWriter,
    Progress,
    grid,
    messages_per_trigger,
)
from transforms.ingestion.segments import covering, outermost, parse_segment_name, segment_name
from transforms.settings import Settings

__all__ = ["LANDING_DDL", "LANDING_SCHEMA", "Lander", "LandingBusy", "LandingLog"]

_REC_HEAD = struct.Struct(">II")  # body length, crc32(body)
_BODY_HEAD = struct.Struct(">qqHHH")  # seq, receive time (us), len stream, len connection, len error


MS_NS = 1_000_000  # Spark's file source compares files' times in milliseconds
# The file source's maxFileAge: by default it forgets a file it read once the newest it read is 7 days
# newer, and reads a forgotten file again if its time changes (a copy, a restore, a `touch`): a
# duplicate in every table. The log is read by name: no file is forgotten. A restart loads every file
# the source's log names before forgetting any, so `run` holds no more; `serve` keeps the files it read
# for its life (a few hundred bytes a segment), as its next restart would.
NEVER_FORGET = "36500d"
_ORDERING = threading.Lock()  # one query at a time gives its log's unread segments their order back
# Under the queries' progress logger: `eventide run` says it with their lines (else it goes to stderr).
ORDER_LOG = logging.getLogger("eventide.queries.landing")


class LandingBusy(RuntimeError):
    pass


def list_segments(settings: Settings, group: str | None = None, archived: bool = True) -> list[Path]:
    """The closed segments of a log (or of every log), in sequence order: the live ones the queries
    read (`landing/<log>/`) and, with `archived`, those every query has committed, moved out of the
    queries' way (`landing-archive/<log>/`, see archive.py). Both together are the whole log, each message
    once: segments a merged archive segment holds, left by a compaction cut short, are not listed."""
    groups = [group] if group else sorted(settings.registry.logs)
    roots = [settings.landing, settings.landing_archive] if archived else [settings.landing]
    out: list[Path] = []
    for g in groups:
        found = [(*seqs, p) for root in roots if (root / g).is_dir()
                 for p in (root / g).iterdir() if (seqs := parse_segment_name(p.name))]
        out.extend(r[2] for r in outermost(found))
    return out


def _record_encoder(stream: str, conn: str, err: str | None):
    """The journal's record of a message of `stream` from `conn` (with `err`: quarantined input), as
    encode(seq, recv_us, payload); the names are encoded once for all the records of a read."""
    # Lengths are stored in 2 bytes: keep names and reasons within that.
    s, c, e = stream.encode()[:65535], conn.encode()[:65535], (err or "").encode()[:65535]
    names, pack_head, pack_rec, crc = s + c + e, _BODY_HEAD.pack, _REC_HEAD.pack, zlib.crc32

    def encode(seq: int, recv_us: int, payload: bytes) -> bytes:
        body = pack_head(seq, recv_us, len(s), len(c), len(e)) + names + payload
        return pack_rec(len(body), crc(body)) + body

    return encode


def _encode_record(seq: int, recv_us: int, stream: str, conn: str, err: str | None, payload: bytes) -> bytes:
    return _record_encoder(stream, conn, err)(seq, recv_us, payload)


def _chunks_by_size(payloads: pa.Array, limit: int):
    """(start, end) index ranges of consecutive payloads of about `limit` bytes each (at least one each):
    each range ends with the payload that brings it to `limit` or more."""
    import numpy as np
    import pyarrow.compute as pc

    ends = np.cumsum(pc.binary_length(payloads).to_numpy(zero_copy_only=False), dtype=np.int64)
    start, done = 0, 0
    while start < len(ends):
        end = int(np.searchsorted(ends, done + limit, side="left")) + 1  # the payload reaching the limit, included
        end = min(max(end, start + 1), len(ends))
        yield start, end
        start, done = end, int(ends[end - 1])


def _read_journal(path: Path) -> tuple[list[tuple], bytes]:
    """Whole records of a journal, and the torn bytes after the last whole record."""
    data = path.read_bytes()
    records = []
    pos = 0
    while len(data) - pos >= _REC_HEAD.size:
        n, crc = _REC_HEAD.unpack_from(data, pos)
        body = data[pos + _REC_HEAD.size : pos + _REC_HEAD.size + n]
        if len(body) < n or zlib.crc32(body) != crc:
            break
        seq, recv_us, ls, lc, le = _BODY_HEAD.unpack_from(body)
        o = _BODY_HEAD.size
        stream = body[o : o + ls].decode()
        conn = body[o + ls : o + ls + lc].decode()
        err = body[o + ls + lc : o + ls + lc + le].decode() or None
        payload = body[o + ls + lc + le :]
        records.append((stream, seq, recv_us, conn, payload, err))
        pos += _REC_HEAD.size + n
    return records, data[pos:]


@dataclass
class _OpenSegment:
    group: str
    path: Path
    file: object
    opened_at: float
    first_seq: int
    rows: list[tuple] = field(default_factory=list)
    size: int = 0


class Lander(LogWriter):
    """Single writer of the landing area (an exclusive lock enforces it across processes)."""

    def __init__(self, settings: Settings, clock=time.time):
        self.settings = settings
        self.clock = clock
        self.root = settings.landing
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.root / ".lock", "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            holder = self._lock_file.read().strip() or "another process"
            self._lock_file.close()
            raise LandingBusy(
                f"the landing area {self.root} is in use by process {holder} (a running `eventide serve`?). "
                "Send through the gateway with `eventide send`, or stop it first."
            ) from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()
        self._open: dict[str, _OpenSegment] = {}
        self._groups: dict[str, str] = {}  # stream -> its log; asking the registry per message cost half of ingest
        self._closed_at: dict[str, float] = {}  # when each log's last segment closed (clock time)
        self._stamped_ns: dict[str, int] = {}  # each log's last segment's modification time (see _stamp)
        self.segments_closed = 0
        self.messages_landed = 0
        try:
            self._next_seq = self._recover() + 1
        except BaseException:
            self._release()
            raise

    # -- recovery ------------------------------------------------------------------------------
    def _recover(self) -> int:
        """Turn leftover journals into segments; returns the last sequence number in use.

        Two passes: first the highest sequence anywhere (segments and every journal's whole records),
        then torn tails are numbered after it, so no number is given twice across groups.
        """
        last = max((parse_segment_name(p.name)[1] for p in list_segments(self.settings)), default=0)
        pending = []
        for group_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for tmp in group_dir.glob(".seg-*"):
                tmp.unlink()  # never renamed: its journal is still there
            closed = max((parse_segment_name(p.name)[1] for p in list_segments(self.settings, group_dir.name)), default=0)
            for journal in sorted(group_dir.glob(".journal-*")):
                records, torn = _read_journal(journal)
                records = [r for r in records if r[1] > closed]  # closed already, journal not yet deleted
                last = max([last, *(r[1] for r in records)])
                pending.append((group_dir, journal, records, torn))
        for group_dir, journal, records, torn in pending:
            if torn:
                last += 1
                reason = f"torn journal record after a crash ({len(torn)} bytes) in {journal.name}"
                records.append((self._torn_stream(group_dir.name), last, int(journal.stat().st_mtime * 1e6),
                                "recovery", torn, reason))
            if records:
                self._write_segment(group_dir, sorted(records, key=lambda r: r[1]))
            journal.unlink()
        return last

    def _torn_stream(self, group: str) -> str:
        streams = self.settings.registry.logs.get(group, [])
        return streams[0] if streams else group

    # -- writing -------------------------------------------------------------------------------
    def append(self, stream: str, payload: bytes, connection: str = "", error: str | None = None) -> int:
        """Land one message (or, with `error`, one quarantined piece of input). Returns its sequence."""
        group = self._group_of(stream)
        seg = self._open.get(group)
        if seg is None:
            seg = self._open_segment(group)
        seq = self._next_seq
        self._next_seq += 1
        recv_us = int(self.clock() * 1_000_000)
        rec = _encode_record(seq, recv_us, stream, connection, error, payload)
        seg.file.write(rec)
        seg.rows.append((stream, seq, recv_us, connection, payload, error))
        seg.size += len(rec)
        self.messages_landed += 1
        if seg.size >= self.settings.segment_max_bytes:
            self._close_segment(group)
        return seq

    def append_received(self, stream: str, payloads: list[bytes], connection: str = "") -> None:
        """Land the messages of one read from a connection: the records `append` would journal, written
        at once, with one receive time (they arrived together). Measured over 300k log lines in reads of
        about 490: 2.5-2.6 us a message, against 3.8-4.4 us for an `append` each."""
        if not payloads:
            return
        group, limit = self._group_of(stream), self.settings.segment_max_bytes
        recv_us, encode = int(self.clock() * 1_000_000), _record_encoder(stream, connection, None)
        i = 0
        while i < len(payloads):
            seg = self._open.get(group) or self._open_segment(group)
            first, start, records, size = self._next_seq, i, [], seg.size
            while i < len(payloads) and size < limit:  # the segment closes after the payload reaching it
                records.append(encode(first + i - start, recv_us, payloads[i]))
                size += len(records[-1])
                i += 1
            seg.file.write(b"".join(records))
            seg.rows.extend((stream, first + k, recv_us, connection, payloads[start + k], None) for k in range(i - start))
            seg.size = size
            self._next_seq = first + i - start
            self.messages_landed += i - start
            if size >= limit:
                self._close_segment(group)

    def append_many(self, stream: str, payloads, connection: str = "") -> None:
        """Land messages of a file in order (a list of bytes or a pyarrow binary array), straight into
        closed segments (no journal: each segment is written whole, then renamed, so a crash leaves whole
        segments only, as closing a journal does). The group's open segment is closed first, so what was
        appended before stays before."""
        if not len(payloads):
            return
        payloads = payloads if isinstance(payloads, pa.Array) else pa.array(payloads, pa.binary())
        group = self._group_of(stream)
        if group in self._open:
            self._close_segment(group)
        group_dir = self.root / group
        group_dir.mkdir(parents=True, exist_ok=True)
        recv_us = int(self.clock() * 1_000_000)
        for start, end in _chunks_by_size(payloads, self.settings.segment_max_bytes):
            first = self._next_seq
            self._next_seq += end - start
            n = end - start
            table = pa.Table.from_arrays(
                [
                    pa.repeat(pa.scalar(stream, pa.string()), n),
                    pa.array(range(first, first + n), pa.int64()),
                    pa.repeat(pa.scalar(recv_us, pa.int64()), n).cast(pa.timestamp("us", tz="UTC")),
                    pa.repeat(pa.scalar(connection, pa.string()), n),
                    payloads.slice(start, n),
                    pa.nulls(n, pa.string()),
                ],
                schema=LANDING_SCHEMA,
            )
            self._write_table(group_dir, table, first, first + n - 1)
            self.segments_closed += 1
            self.messages_landed += n
        self._closed_at[group] = self.clock()

    def _group_of(self, stream: str) -> str:
        group = self._groups.get(stream)
        if group is None:
            group = self._groups[stream] = self.settings.group_of(stream)
        return group

    def sync(self) -> None:
        """Push buffered journal bytes to the OS, so a crash of this process loses nothing."""
        for seg in self._open.values():
            seg.file.flush()

    def tick(self) -> None:
        self.rotate_due()

    def rotate_due(self) -> int:
        """Close segments older than segment_max_seconds, or quiet for segment_quiet_seconds when no
        segment of their log closed within segment_max_seconds. Returns how many were closed."""
        now, limit, quiet = self.clock(), self.settings.segment_max_seconds, self.settings.segment_quiet_seconds

        def due(g: str, s: _OpenSegment) -> bool:
            if now - s.opened_at >= limit:
                return True
            last_append = s.rows[-1][2] / 1_000_000 if s.rows else s.opened_at  # the last row's receive time
            return quiet > 0 and now - last_append >= quiet and now - self._closed_at.get(g, float("-inf")) >= limit

        closing = [g for g, s in self._open.items() if due(g, s)]
        for g in closing:
            self._close_segment(g)
        return len(closing)

    def flush(self) -> None:
        """Close every open segment, making all landed messages visible to the pipelines."""
        for g in list(self._open):
            self._close_segment(g)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._release()

    def _release(self) -> None:
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()

    def __enter__(self) -> Lander:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def _open_segment(self, group: str) -> _OpenSegment:
        d = self.root / group
        d.mkdir(parents=True, exist_ok=True)
        path = d / f".journal-{self._next_seq:020d}"
        seg = _OpenSegment(group, path, open(path, "ab"), self.clock(), self._next_seq)
        self._open[group] = seg
        return seg

    def _close_segment(self, group: str) -> None:
        seg = self._open.pop(group)
        self._closed_at[group] = self.clock()
        seg.file.flush()
        os.fsync(seg.file.fileno())
        seg.file.close()
        if seg.rows:
            self._write_segment(seg.path.parent, seg.rows)
            self.segments_closed += 1
        seg.path.unlink()

    def _write_segment(self, group_dir: Path, rows: list[tuple]) -> Path:
        cols = list(zip(*rows))
        table = pa.Table.from_arrays(
            [
                pa.array(cols[0], pa.string()),
                pa.array(cols[1], pa.int64()),
                pa.array(cols[2], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array(cols[3], pa.string()),
                pa.array(cols[4], pa.binary()),
                pa.array(cols[5], pa.string()),
            ],
            schema=LANDING_SCHEMA,
        )
        return self._write_table(group_dir, table, cols[1][0], cols[1][-1])

    def _write_table(self, group_dir: Path, table: pa.Table, first: int, last: int) -> Path:
        final = group_dir / segment_name(first, last)
        tmp = group_dir / f".{final.name}.tmp"
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        self._stamp(group_dir, tmp)
        os.rename(tmp, final)
        fsync_dir(group_dir)
        return final

    def _stamp(self, group_dir: Path, tmp: Path) -> None:
        """Give a segment a modification time in a later millisecond than its log's previous segment.
        Spark's file source reads files in modification-time order at millisecond resolution (ties in
        listing order), and a query bounded per batch must take a log's segments in sequence order."""
        before = self._stamped_ns.get(group_dir.name)
        if before is None:
            live = list_segments(self.settings, group_dir.name, archived=False)
            before = max((p.stat().st_mtime_ns for p in live), default=0)
        now = time.time_ns()
        stamp = max(now, before + MS_NS)
        os.utime(tmp, ns=(now, stamp))
        self._stamped_ns[group_dir.name] = stamp


def _spark_ms(path: Path) -> int | None:
    """A file's modification time as Spark's file source sees it (milliseconds); None if it is gone (moved
    to the archive by a running serve: every query has read it)."""
    try:
        return path.stat().st_mtime_ns // MS_NS
    except FileNotFoundError:
        return None


class LandingOutOfOrder(RuntimeError):
    """A keyed query read a later part of its log before an earlier one."""


def order_unread_segments(settings: Settings, plan, read: set[str], with_archive: bool) -> int:
    """Make the segments `plan`'s query has not read yet (`read`: those it has) come to it in sequence
    order; returns how many were given new modification times (0 when they were in order).

    Spark's file source takes files by modification time, so segments whose times are not in sequence
    order (a home copied without them: `cp -r`, not `cp -a`) would reach a query bounded per batch out
    of order, and keyed state would cut its windows wrong. Their times are set again, in sequence order,
    ending now (no query reads a file it has read again for a new time: see NEVER_FORGET). Raises
    LandingOutOfOrder if a keyed query already read past a segment it has not read."""
    from transforms.ingestion.archive import last_read_seq

    unread = [p for p in list_segments(settings, plan.group, archived=with_archive) if p.name not in read]
    if read and plan.keyed:
        last_read = last_read_seq(read)
        behind = [p.name for p in unread if parse_segment_name(p.name)[0] < last_read]
        if behind:
            raise LandingOutOfOrder(
                f"query {plan.name!r} has read log {plan.group!r} up to sequence {last_read}, but not segment "
                f"{behind[0]} ({len(behind)} such): it read the log out of order, so its keyed state and tables "
                "may hold windows cut wrong (the segments' modification times were not in sequence order, as "
                "after `cp -r` of a home; copy with `cp -a` or `rsync -a`). Process the log again: start a new "
                f"generation of app {plan.app!r} (Application(..., generation={plan.generation + 1}))")
    with _ORDERING:  # the queries of one app start together, from threads: one sets the times, once
        timed = [(p, t) for p in unread if (t := _spark_ms(p)) is not None]
        unread, times = [p for p, _ in timed], [t for _, t in timed]
        if all(a < b for a, b in zip(times, times[1:])):
            return 0
        now = time.time_ns() // MS_NS * MS_NS
        for i, p in enumerate(unread):
            stamp = now - (len(unread) - i) * MS_NS
            with contextlib.suppress(FileNotFoundError):  # archived meanwhile: read by every query
                os.utime(p, ns=(stamp, stamp))
        return len(unread)



def read_landed(settings: Settings, group: str) -> pa.Table:
    """Every closed segment of a group, in sequence order (for tests, baselines and the CLI)."""
    segs = list_segments(settings, group)
    if not segs:
        return LANDING_SCHEMA.empty_table()
    return pa.concat_tables(read_segment(settings, p, schema=LANDING_SCHEMA) for p in segs)


def read_segment(settings: Settings, path: Path, **kwargs) -> pa.Table:
    """A segment's rows; if a running serve archived it since it was listed, from the archive, and if
    the archive merged it since, its rows of the merged segment."""
    archive = settings.landing_archive / path.parent.name
    try:
        return pq.read_table(path, **kwargs)
    except FileNotFoundError:
        pass
    try:
        return pq.read_table(archive / path.name, **kwargs)
    except FileNotFoundError:
        from transforms.ingestion.archive import archived_ranges

        first, last = parse_segment_name(path.name)
        merged = covering(archived_ranges(archive), first, last)
        if merged is None:
            raise
    filters = [("seq", ">=", first), ("seq", "<=", last), *kwargs.pop("filters", [])]
    return pq.read_table(archive / merged, filters=filters, **kwargs)


def payloads_for(settings: Settings, group: str, seqs: list[int]) -> dict[int, bytes]:
    """The landed payloads of these sequence numbers (reading only the segments that hold them)."""
    wanted = set(seqs)
    found: dict[int, bytes] = {}
    for seg in list_segments(settings, group):
        first, last = parse_segment_name(seg.name)
        hits = [s for s in wanted if first <= s <= last]
        if not hits:
            continue
        table = read_segment(settings, seg, columns=["seq", "payload"], filters=[("seq", "in", hits)])
        found.update(zip(table.column("seq").to_pylist(), table.column("payload").to_pylist()))
        wanted -= set(hits)
        if not wanted:
            break
    return found


def bytes_per_trigger(settings: Settings, group: str, messages_as_objects: bool) -> int:
    """Spark's maxBytesPerTrigger for a query of this log (0: no bound). Spark's file source bounds a
    batch by file bytes only; a query whose messages become Python objects is also bounded by
    `max_messages_per_trigger`, turned into bytes with the log's own bytes per message (its segments'
    sizes over the sequence numbers their names span), since a segment's compression makes bytes say
    little about messages."""
    bound = settings.max_bytes_per_trigger
    max_messages = messages_per_trigger(settings, messages_as_objects)
    if not max_messages:
        return bound
    segments = list_segments(settings, group, archived=False) or list_segments(settings, group)
    spans = [parse_segment_name(p.name) for p in segments]
    messages = sum(last - first + 1 for first, last in spans)
    if not messages:  # nothing landed yet: no measure (serve's own segments are small anyway)
        return bound
    size = sum(_size(p) for p in segments)
    by_messages = max(1, int(max_messages * size / messages))
    return min(bound, by_messages) if bound else by_messages


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # archived meanwhile (serve's upkeep): a rough measure is enough
        return 0


# -- the landing as the log (log.py) ---------------------------------------------------------------------
class LandingLog(Log):
    """The embedded landing folder as the log every query reads (its checkpoint: Spark's file source)."""

    kind = "landing"

    def describe(self) -> str:
        return f"the landing folder {self.settings.landing}"

    def writer(self) -> Lander:
        return Lander(self.settings)

    def source(self, spark, plan):
        from transforms.engine.checkpoints import processed_segments
        from transforms.ingestion.archive import forget_archived, note_listing, reads_archive

        settings = self.settings
        (settings.landing / plan.group).mkdir(parents=True, exist_ok=True)
        read = processed_segments(plan.checkpoint(settings))[1]
        with_archive = reads_archive(settings, plan.group, read)
        note_listing(settings, plan, with_archive)  # before it lists: the archive is not compacted under it
        if not with_archive:
            forget_archived(settings, plan)
        if restamped := order_unread_segments(settings, plan, read, with_archive):
            ORDER_LOG.warning(
                "%s: %d landing segment(s) of log %r had modification times out of sequence order (a copied "
                "home?); set again in sequence order, so the query reads them in order", plan.name, restamped, plan.group)
        reader = spark.readStream.schema(LANDING_DDL).option("maxFileAge", NEVER_FORGET)
        if settings.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", settings.max_files_per_trigger)
        elif max_bytes := bytes_per_trigger(settings, plan.group, plan.messages_as_objects):
            reader = reader.option("maxBytesPerTrigger", max_bytes)
        return reader.option("basePath", str(settings.home.absolute())).parquet(landing_path(plan, settings, with_archive))

    def is_source(self, description: str) -> bool:
        return description.startswith("FileStreamSource")

    def caught_up(self, plan) -> bool:
        from transforms.engine.checkpoints import processed_segments
        from transforms.ingestion.archive import reads_archive

        processed = processed_segments(plan.checkpoint(self.settings))[1]
        if reads_archive(self.settings, plan.group, processed):  # see landing_path
            return False
        return all(seg.name in processed for seg in list_segments(self.settings, plan.group, archived=False))

    def position(self, group: str) -> set[str]:
        return {s.name for s in list_segments(self.settings, group, archived=False)}

    def mark(self, group: str) -> str | None:
        return max(self.position(group), default=None)

    def reached(self, plan, position: set[str]) -> bool:
        from transforms.engine.checkpoints import processed_segments
        from transforms.ingestion.archive import archived_names

        processed = processed_segments(plan.checkpoint(self.settings))[1]
        # A segment archived since is one every query committed (its name may be forgotten, or merged
        # into a larger segment: archive.py).
        archived = archived_names(self.settings.landing_archive / plan.group)
        return all(name in processed or archived(name) for name in position)

    def upkeep(self, plans: list) -> int:
        from transforms.ingestion.archive import archive_committed, compact_archive

        moved = archive_committed(self.settings, plans)
        for log in sorted({p.group for p in plans} | moved.keys()):
            compact_archive(self.settings, log)
        return sum(moved.values())

    def source_outgrown(self, plan) -> bool:
        from transforms.engine.checkpoints import processed_segments
        from transforms.ingestion.archive import lists_archive, reads_archive

        return lists_archive(self.settings, plan) and not reads_archive(
            self.settings, plan.group, processed_segments(plan.checkpoint(self.settings))[1])

    def read(self, group: str, columns: list[str] | None = None) -> pa.Table:
        if columns is None:
            return read_landed(self.settings, group)
        segs = list_segments(self.settings, group)
        if not segs:
            return LANDING_SCHEMA.empty_table().select(columns)
        return pa.concat_tables(read_segment(self.settings, p, columns=columns) for p in segs)

    def payloads_for(self, group: str, seqs: list[int]) -> dict[int, bytes]:
        return payloads_for(self.settings, group, seqs)

    def status(self, plans: list, now: float) -> tuple[list[LogStatus], dict[str, Progress]]:
        logs = {name: _LogFiles(self.settings, name, streams)
                for name, streams in sorted(self.settings.registry.logs.items())}
        return [g.status() for g in logs.values()], {p.name: _progress(self.settings, p, logs[p.group]) for p in plans}

    def format_logs(self, logs: list[LogStatus]) -> list[str]:
        return grid(["LOG", "SEGMENTS", "MESSAGES", "LAST SEQ", "OPEN"],
                    [[g.log, g.segments, g.messages, g.last_seq, g.open] for g in logs]) + [
            "", "OPEN: landed, not yet in a closed segment (not visible to queries). "
                "PROCESSED TO: the last sequence a query committed (-: nothing yet)."]


def landing_path(plan, settings: Settings, with_archive: bool) -> str:
    """What the query's file source reads, as a Hadoop glob under the home: the live folder of its
    log, and also the archive (archive.py) while it holds segments the query has not read
    (`reads_archive`: a new query starts from the beginning; one stopped partway through the archive
    goes on from where it stopped). Always a glob, with the home as base path: Spark sets a plain path as
    its own base path, and a query that read the archive re-reads the last batch's files after a
    restart (to set its source up) with whatever path it has then."""
    live = settings.landing.name
    folders = f"{live},{settings.landing_archive.name}" if with_archive else live
    return f"{settings.home.absolute()}/{{{folders}}}/{plan.group}"


# -- status (no Spark) -----------------------------------------------------------------------------------
@dataclass
class _Segment:
    path: Path
    first: int
    last: int
    rows: int


def _footer_rows(settings: Settings, path: Path) -> int:
    """A segment's row count from its Parquet footer; if a running serve moved or merged it since it was
    listed, its rows as `read_segment` finds them."""
    try:
        return pq.read_metadata(path).num_rows
    except FileNotFoundError:
        return read_segment(settings, path, columns=["seq"]).num_rows


class _LogFiles:
    """One landing log read once: its segments (row counts from the Parquet footers) and open records.
    Journals are read before the segments are listed, so a journal closed in between is counted once
    (its records then also in a segment: dropped from the open ones by sequence)."""

    def __init__(self, settings: Settings, log: str, streams: list[str]):
        self.settings, self.name, self.streams = settings, log, streams
        self.archive = settings.landing_archive / log
        folder = settings.landing / log
        records = []
        for journal in sorted(folder.glob(".journal-*")) if folder.is_dir() else ():
            try:
                records.extend(_read_journal(journal)[0])
            except FileNotFoundError:
                continue  # closed meanwhile: its records are in a segment now
        from transforms.ingestion.archive import archived_rows

        noted = archived_rows(self.archive)
        self.segments = []
        for path in list_segments(settings, log):
            first, last = parse_segment_name(path.name)
            rows = noted.get(path.name) if path.parent == self.archive else None
            if rows is None:
                rows = _footer_rows(settings, path)
            self.segments.append(_Segment(path, first, last, rows))
        closed = max((s.last for s in self.segments), default=0)
        # (stream, seq, receive time in us) of the records landed but not in a closed segment yet
        self.open = sorted(((r[0], r[1], r[2]) for r in records if r[1] > closed), key=lambda r: r[1])
        self._counts: dict[Path, dict[str, int]] = {}

    def status(self) -> LogStatus:
        return LogStatus(
            log=self.name, streams=list(self.streams), segments=len(self.segments),
            messages=sum(s.rows for s in self.segments),
            last_seq=max((s.last for s in self.segments), default=None),
            open=len(self.open), open_last_seq=self.open[-1][1] if self.open else None,
        )

    def rows_of(self, seg: _Segment, streams: list[str]) -> int:
        """Messages of `streams` in a segment: its footer's row count when the log holds only those
        streams, else a count over its `stream` column."""
        import pyarrow.compute as pc

        if set(self.streams) <= set(streams):
            return seg.rows
        if seg.path not in self._counts:
            column = read_segment(self.settings, seg.path, columns=["stream"]).column("stream")
            self._counts[seg.path] = {v["values"]: v["counts"] for v in pc.value_counts(column).to_pylist()}
        return sum(self._counts[seg.path].get(s, 0) for s in streams)

    def oldest_receive_us(self, seg: _Segment, streams: list[str]) -> int | None:
        """The earliest receive time (us since the epoch) of `streams` in a segment (two columns read)."""
        import pyarrow.compute as pc

        filtered = not set(self.streams) <= set(streams)
        table = read_segment(self.settings, seg.path,
                             columns=["stream", "receive_time"] if filtered else ["receive_time"])
        times = table.column("receive_time")
        if filtered:
            times = times.filter(pc.is_in(table.column("stream"), value_set=pa.array(streams, pa.string())))
        oldest = pc.min(times.cast(pa.timestamp("us", tz="UTC")))
        return oldest.value if oldest.is_valid else None  # microseconds since the epoch


def _progress(settings: Settings, plan, log: _LogFiles) -> Progress:
    """Processed segments are those the query's file source listed up to the offset of its last
    committed batch (engine/checkpoints.py); the rest of the log's segments, plus the open journals,
    are the lag."""
    from transforms.engine.checkpoints import processed_segments
    from transforms.ingestion.archive import last_read_seq

    committed, names = processed_segments(plan.checkpoint(settings))
    streams = list(plan.streams)
    last = last_read_seq(names)
    # An archived segment up to the last one read was read, though its name may be forgotten (archive.py).
    pending = [s for s in log.segments if s.path.name not in names
               and not (s.path.parent == log.archive and last is not None and s.last <= last)]
    lag = sum(log.rows_of(s, streams) for s in pending)
    open_records = [r for r in log.open if r[0] in streams]
    oldest = None
    for seg in pending:
        if log.rows_of(seg, streams):
            oldest = log.oldest_receive_us(seg, streams)
            if oldest is not None:
                break
    if oldest is None and open_records:
        oldest = min(r[2] for r in open_records)
    return Progress(last_committed_batch=committed, processed_segments=len(log.segments) - len(pending),
                    processed_last_seq=last,
                    lag_messages=lag + len(open_records), oldest_unprocessed_us=oldest)
