"""`eventide status`: how far each landing log and each query has got, from the files under the home
alone (no Spark session, no JVM: fast, and safe to run next to a running `eventide serve`). Nothing
here imports pyspark itself; `transforms.engine` (for the query plans and locks) does, eagerly, but
only the Python package: no JVM starts.

- A landing log (`<home>/landing/<log>`): its closed segments (messages, last sequence) and the
  messages still in open journals ("open": landed, not yet visible to the queries).
- A query (every stream's bronze query and every registered app's queries): what its Spark checkpoint
  says it has processed, read without Spark. `commits/<batch>` files say which batches committed; the
  offset log `offsets/<batch>` gives, per source, how far a batch read (the file source's offset is
  `{"logOffset": n}`: its own batch counter, which falls behind the query's batch ids when the query
  also reads the timer clock); the file source's metadata log `sources/<i>/<n>` (and
  `<n>.compact`, every 10 entries) names the files of each of its batches. Processed segments are
  those the file source listed up to the offset of the last committed batch; the rest of the log's
  segments, plus the open journals, are the lag.
- Whether `eventide serve` runs on this home (`gateway.json`), and who holds each query's lock.

JSON (`--format json`): one object, keys in this order (`null` where there is nothing):

    {"version": 1, "home": str, "generated_at": ISO-8601 UTC,
     "serve": {"running": bool, "pid": int|null, "host": str|null, "ports": {stream: port},
               "queries": bool (serve also runs the queries), "started_at": str|null},
     "logs": [{"log": str, "streams": [str], "segments": int, "messages": int (closed segments),
               "last_seq": int|null (closed), "open": int (in open journals), "open_last_seq": int|null}],
     "queries": [{"query": str, "app": str, "log": str, "streams": [str], "checkpoint": str,
                  "last_committed_batch": int|null, "processed_segments": int,
                  "processed_last_seq": int|null (null: processed nothing yet),
                  "lag_messages": int (messages of its streams not processed, open ones included),
                  "lag_seconds": float (now - receive time of the oldest of them; 0.0 when none),
                  "oldest_unprocessed": ISO-8601 UTC|null,
                  "held_by": {"pid": int, "command": str, "since": str}|null,
                  "tcp_in_doubt": {sink: int} (TCP batches found in doubt: a sink's sender process stopped mid-send)}],
     "tables": [{"table": str, "version": int, "files": int (data files of the current version),
                 "bytes": int (their size)}]}
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from transforms import lake
from transforms.engine.checkpoints import processed_segments
from transforms.ingestion.landing import _read_journal, list_segments, parse_segment_name
from transforms.settings import Settings

FORMAT_VERSION = 1


@dataclass
class ServeStatus:
    running: bool = False
    pid: int | None = None
    host: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    queries: bool = False
    started_at: str | None = None


@dataclass
class LogStatus:
    log: str
    streams: list[str]
    segments: int = 0
    messages: int = 0
    last_seq: int | None = None
    open: int = 0
    open_last_seq: int | None = None


@dataclass
class QueryStatus:
    query: str
    app: str
    log: str
    streams: list[str]
    checkpoint: str
    last_committed_batch: int | None = None
    processed_segments: int = 0
    processed_last_seq: int | None = None
    lag_messages: int = 0
    lag_seconds: float = 0.0
    oldest_unprocessed: str | None = None
    held_by: dict | None = None
    tcp_in_doubt: dict[str, int] = field(default_factory=dict)


@dataclass
class TableStatus:
    table: str
    version: int
    files: int
    bytes: int


@dataclass
class Status:
    home: str
    generated_at: str
    serve: ServeStatus
    logs: list[LogStatus]
    queries: list[QueryStatus]
    tables: list[TableStatus] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"version": FORMAT_VERSION, **dataclasses.asdict(self)}


# -- the landing ---------------------------------------------------------------------------------------
@dataclass
class _Segment:
    path: Path
    first: int
    last: int
    rows: int


def _read(read, archive: Path, path: Path, **kwargs):
    """`read(path)`, or of the same segment in the archive if a running serve just moved it there."""
    try:
        return read(path, **kwargs)
    except FileNotFoundError:
        return read(archive / path.name, **kwargs)


class _Log:
    """One landing log read once: its segments (row counts from the Parquet footers) and open records.
    Journals are read before the segments are listed, so a journal closed in between is counted once
    (its records then also in a segment: dropped from the open ones by sequence)."""

    def __init__(self, settings: Settings, log: str, streams: list[str]):
        self.name, self.streams = log, streams
        self.archive = settings.landing_archive / log
        folder = settings.landing / log
        records = []
        for journal in sorted(folder.glob(".journal-*")) if folder.is_dir() else ():
            try:
                records.extend(_read_journal(journal)[0])
            except FileNotFoundError:
                continue  # closed meanwhile: its records are in a segment now
        self.segments = []
        for path in list_segments(settings, log):
            first, last = parse_segment_name(path.name)
            self.segments.append(_Segment(path, first, last, _read(pq.read_metadata, self.archive, path).num_rows))
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
        if set(self.streams) <= set(streams):
            return seg.rows
        if seg.path not in self._counts:
            column = _read(pq.read_table, self.archive, seg.path, columns=["stream"]).column("stream")
            self._counts[seg.path] = {v["values"]: v["counts"] for v in pc.value_counts(column).to_pylist()}
        return sum(self._counts[seg.path].get(s, 0) for s in streams)

    def oldest_receive_us(self, seg: _Segment, streams: list[str]) -> int | None:
        """The earliest receive time (us since the epoch) of `streams` in a segment (two columns read)."""
        filtered = not set(self.streams) <= set(streams)
        table = _read(pq.read_table, self.archive, seg.path,
                      columns=["stream", "receive_time"] if filtered else ["receive_time"])
        times = table.column("receive_time")
        if filtered:
            times = times.filter(pc.is_in(table.column("stream"), value_set=pa.array(streams, pa.string())))
        oldest = pc.min(times.cast(pa.timestamp("us", tz="UTC")))
        return oldest.value if oldest.is_valid else None  # microseconds since the epoch


# -- everything ---------------------------------------------------------------------------------------
def query_plans(settings: Settings) -> list:
    """Every stream's bronze query, then every registered app's queries (as `eventide serve` runs them)."""
    from transforms.engine.plan import plan_queries
    from transforms.streams import service_applications

    bronze, apps = service_applications(settings)
    return [p for app in bronze + apps for p in plan_queries(app, settings)]


def _iso(us: int | float | None) -> str | None:
    if us is None:
        return None
    return dt.datetime.fromtimestamp(us / 1_000_000, dt.timezone.utc).isoformat(timespec="milliseconds")


def serve_status(settings: Settings) -> ServeStatus:
    from transforms.ingestion.gateway import running_gateway

    record = running_gateway(settings)
    if record is None:
        return ServeStatus()
    return ServeStatus(running=True, pid=record["pid"], host=record.get("host"), ports=dict(record["ports"]),
                       queries=bool(record.get("queries", False)), started_at=record.get("started_at"))


def query_status(settings: Settings, plan, log: _Log, now: float) -> QueryStatus:
    from transforms.engine.locks import holder_of

    checkpoint = plan.checkpoint(settings)
    committed, names = processed_segments(checkpoint)
    streams = list(plan.streams)
    done = [parse_segment_name(n) for n in names]
    pending = [s for s in log.segments if s.path.name not in names]
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
    lag += len(open_records)
    holder = holder_of(settings, plan.name)
    return QueryStatus(
        query=plan.name, app=plan.app, log=plan.group, streams=streams, checkpoint=str(checkpoint.absolute()),
        last_committed_batch=committed, processed_segments=len(names),
        processed_last_seq=max((d[1] for d in done), default=None),
        lag_messages=lag,
        lag_seconds=0.0 if oldest is None else round(max(0.0, now - oldest / 1_000_000), 3),
        oldest_unprocessed=_iso(oldest),
        held_by=None if holder is None else {k: holder.get(k) for k in ("pid", "command", "since")},
        tcp_in_doubt={f.name[len("tcp-"):-len(".in-doubt")]: len(f.read_text().splitlines())
                      for f in sorted(checkpoint.glob("tcp-*.in-doubt"))},
    )


def compute_status(settings: Settings, now: float | None = None) -> Status:
    """The status of the home's landing logs and queries (`now`: seconds since the epoch, for the lag)."""
    now = time.time() if now is None else now
    logs = {name: _Log(settings, name, streams) for name, streams in sorted(settings.registry.logs.items())}
    queries = [query_status(settings, p, logs[p.group], now) for p in query_plans(settings)]
    return Status(
        home=str(settings.home.absolute()), generated_at=_iso(now * 1_000_000), serve=serve_status(settings),
        logs=[log.status() for log in logs.values()], queries=queries, tables=table_status(settings),
    )


def table_status(settings: Settings) -> list[TableStatus]:
    """Each Delta table of the home: its version, and the files and bytes upkeep keeps in check."""
    out = []
    for folder in sorted(settings.lake.iterdir()) if settings.lake.is_dir() else []:
        found = lake.table_files(folder) if lake.exists(folder) else None
        if found is not None:
            out.append(TableStatus(folder.name, found.version, found.files, found.bytes))
    return out


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- rendering ----------------------------------------------------------------------------------------
def _grid(headers: list[str], rows: list[list], left: tuple[int, ...] = (0,)) -> list[str]:
    """Columns padded to their widest cell; the columns at `left` left-aligned, the rest (numbers) right."""
    cells = [headers] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) if i in left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in cells]


def _holder(h: dict | None) -> str:
    return "-" if not h else f"{h.get('command') or 'a process'} (pid {h.get('pid', '?')})"


def _seconds(q: QueryStatus) -> str:
    return "-" if not q.lag_messages else f"{q.lag_seconds:.1f}"


def format_status(status: Status, fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps(status.to_dict(), indent=2) + "\n"
    s = status.serve
    if s.running:
        what = "gateway and queries" if s.queries else "gateway only (`eventide run` processes)"
        ports = ", ".join(f"{k}={v}" for k, v in sorted(s.ports.items())) or "none"
        serve = f"running, pid {s.pid}, {what}; ports {ports}; since {s.started_at}"
    else:
        serve = "not running"
    lines = [f"home: {status.home}", f"eventide serve: {serve}", ""]
    lines += _grid(["LOG", "SEGMENTS", "MESSAGES", "LAST SEQ", "OPEN"],
                   [[g.log, g.segments, g.messages, g.last_seq, g.open] for g in status.logs])
    lines.append("")
    lines += _grid(["QUERY", "LOG", "PROCESSED TO", "LAG", "LAG SECONDS", "RUN BY"],
                   [[q.query, q.log, q.processed_last_seq, q.lag_messages, _seconds(q), _holder(q.held_by)]
                    for q in status.queries], left=(0, 1, 5))
    if status.tables:
        lines.append("")
        lines += _grid(["TABLE", "VERSION", "FILES", "SIZE"],
                       [[t.table, t.version, t.files, _size(t.bytes)] for t in status.tables])
    doubts = [f"  {q.query}, TCP sink {sink}: {n} batch(es), listed in {q.checkpoint}/tcp-{sink}.in-doubt"
              for q in status.queries for sink, n in q.tcp_in_doubt.items()]
    if doubts:
        lines += ["", "TCP batches in doubt (their sender process stopped while sending them; EVENTIDE_TCP_IN_DOUBT "
                      "says whether they were sent again or skipped):", *doubts]
    lines.append("")
    lines.append("OPEN: landed, not yet in a closed segment (not visible to queries). "
                 "PROCESSED TO: the last sequence a query committed (-: nothing yet).")
    lines.append("LAG: its messages not processed (open ones too); LAG SECONDS: age of the oldest of them. "
                 "RUN BY: who holds the query's lock. FILES: data files of a table's current version "
                 "(`eventide upkeep` compacts them).")
    return "\n".join(lines) + "\n"
