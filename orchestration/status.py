"""`eventide status`: how far each log and each query has got, from the files under the home (and,
with EVENTIDE_LOG=kafka://..., the topics' offsets) alone: no Spark session, no JVM, so fast and safe to
run next to a running `eventide serve`. Nothing here imports pyspark itself; `transforms.engine` (for
the query plans and locks) does, eagerly, but only the Python package: no JVM starts.

- A log and each query's progress in it come from the log (transforms/ingestion/log.py, `Log.status`):
  the landing log's closed segments and open journals, and what each query's file source has
  processed up to its last committed batch (read from its checkpoint); or a Kafka topic's end offset
  and the offset each query's checkpoint has committed.
- A topic an app reads straight (kafka_source) and its queries' progress come from
  transforms/ingestion/kafka_source.py (`topics_status`): the end offset of each of its partitions, and
  the offsets each query's checkpoint has committed.
- Whether `eventide serve` runs on this home (`gateway.json`), and who holds each query's lock.

JSON (`--format json`): one object, keys in this order (`null` where there is nothing):

    {"version": 1, "home": str, "generated_at": ISO-8601 UTC,
     "serve": {"running": bool, "pid": int|null, "host": str|null, "ports": {stream: port},
               "queries": bool (serve also runs the queries), "started_at": str|null},
     "logs": [{"log": str, "streams": [str], "kind": "landing"|"kafka", "segments": int,
               "messages": int (closed segments; Kafka: held by the topic), "last_seq": int|null (closed),
               "open": int (in open journals), "open_last_seq": int|null,
               "topic": str|null, "end_offset": int|null (Kafka: the next offset to be written),
               "error": str|null (Kafka: the topic could not be read),
               kind "kafka_source" only: "bootstrap": str, "end_offsets": {partition: int}}],
     "queries": [{"query": str, "app": str, "log": str, "streams": [str], "checkpoint": str,
                  "last_committed_batch": int|null, "processed_segments": int,
                  "processed_last_seq": int|null (null: processed nothing yet),
                  "processed_offset": int|null (Kafka: the next offset its checkpoint reads),
                  "lag_messages": int (messages of its streams not processed, open ones included),
                  "lag_seconds": float (now - receive time of the oldest of them; 0.0 when none),
                  "oldest_unprocessed": ISO-8601 UTC|null,
                  "held_by": {"pid": int, "command": str, "since": str}|null,
                  "tcp_in_doubt": {sink: int} (TCP batches found in doubt: a sink's sender process stopped mid-send),
                  "processed_offsets": {partition: int}|null (kafka_source: the next offset per partition it reads),
                  "state_bytes": int|null (bytes of the files of its state store under its checkpoint, every
                                 version Spark retains; null: no state, an unkeyed query or none written yet)}],
     "tables": [{"table": str, "version": int, "files": int (data files of the current version),
                 "bytes": int (their size),
                 "freshness": "PASS"|"WARN"|"FAIL"|"UNKNOWN"|null (null: the table has no freshness policy),
                 "last_materialized": ISO-8601 UTC|null, "seconds_since_materialized": float|null,
                 "fail_after_seconds": float|null, "warn_after_seconds": float|null}]}

Freshness is Dagster's judgement of the table's freshness policy (assets/freshness.py), made by the
evaluator Dagster's freshness daemon uses, against the home's Dagster instance, at the current time:
what the UI shows once that daemon (under `eventide ui`) has looked. FAIL (stale): nothing was
materialized into the table for the policy's window; UNKNOWN: never materialized.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from transforms import lake
from transforms.ingestion import open_log
from transforms.ingestion.kafka_source import KafkaTopicLog, format_topics, topics_status
from transforms.ingestion.log import LogStatus, Progress, grid
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
class QueryStatus:
    query: str
    app: str
    log: str
    streams: list[str]
    checkpoint: str
    last_committed_batch: int | None = None
    processed_segments: int = 0
    processed_last_seq: int | None = None
    processed_offset: int | None = None
    lag_messages: int = 0
    lag_seconds: float = 0.0
    oldest_unprocessed: str | None = None
    held_by: dict | None = None
    tcp_in_doubt: dict[str, int] = field(default_factory=dict)
    processed_offsets: dict[int, int] | None = None
    state_bytes: int | None = None


@dataclass
class TableStatus:
    table: str
    version: int
    files: int
    bytes: int
    freshness: str | None = None
    last_materialized: str | None = None
    seconds_since_materialized: float | None = None
    fail_after_seconds: float | None = None
    warn_after_seconds: float | None = None


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


def query_status(settings: Settings, plan, progress: Progress, now: float) -> QueryStatus:
    from transforms.engine.locks import holder_of

    checkpoint = plan.checkpoint(settings)
    oldest = progress.oldest_unprocessed_us
    holder = holder_of(settings, plan.name)
    return QueryStatus(
        query=plan.name, app=plan.app, log=plan.group, streams=list(plan.streams),
        checkpoint=str(checkpoint.absolute()), last_committed_batch=progress.last_committed_batch,
        processed_segments=progress.processed_segments, processed_last_seq=progress.processed_last_seq,
        processed_offset=progress.processed_offset, lag_messages=progress.lag_messages,
        lag_seconds=0.0 if oldest is None or not progress.lag_messages else round(max(0.0, now - oldest / 1_000_000), 3),
        oldest_unprocessed=_iso(oldest) if progress.lag_messages else None,
        held_by=None if holder is None else {k: holder.get(k) for k in ("pid", "command", "since")},
        tcp_in_doubt={f.name[len("tcp-"):-len(".in-doubt")]: len(f.read_text().splitlines())
                      for f in sorted(checkpoint.glob("tcp-*.in-doubt"))},
        processed_offsets=getattr(progress, "processed_offsets", None),
        state_bytes=state_bytes(checkpoint),
    )


def state_bytes(checkpoint: Path) -> int | None:
    """The bytes on disk of a query's state store (Spark's `state` folder of its checkpoint): every
    version Spark retains, so more than the live keys' state; None when it has none."""
    folder = checkpoint / "state"
    if not folder.is_dir():
        return None
    total = 0
    for f in folder.rglob("*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except FileNotFoundError:  # a version Spark's maintenance removed while we read
            pass
    return total


def compute_status(settings: Settings, now: float | None = None) -> Status:
    """The status of the home's logs and queries (`now`: seconds since the epoch, for the lag)."""
    now = time.time() if now is None else now
    plans = query_plans(settings)
    logs, progress = open_log(settings).status([p for p in plans if p.origin is None], now)
    topics, read = topics_status(settings, [p for p in plans if p.origin is not None], now)
    logs, progress = logs + topics, {**progress, **read}
    queries = [query_status(settings, p, progress[p.name], now) for p in plans]
    return Status(
        home=str(settings.home.absolute()), generated_at=_iso(now * 1_000_000), serve=serve_status(settings),
        logs=logs, queries=queries, tables=table_status(settings),
    )


def table_status(settings: Settings) -> list[TableStatus]:
    """Each Delta table of the home: its version, the files and bytes upkeep keeps in check, and its
    freshness as Dagster judges it."""
    out = []
    folders = [f for f in sorted(settings.lake.iterdir()) if lake.exists(f)] if settings.lake.is_dir() else []
    fresh = table_freshness(settings) if folders else {}
    for folder in folders:
        found = lake.table_files(folder)
        if found is None:
            continue
        f = fresh.get(folder.name)
        out.append(TableStatus(folder.name, found.version, found.files, found.bytes) if f is None else
                   TableStatus(folder.name, found.version, found.files, found.bytes, f.state,
                               _iso(f.last_materialized * 1_000_000 if f.last_materialized else None),
                               None if f.age_seconds is None else round(f.age_seconds, 3),
                               f.fail_after_seconds, f.warn_after_seconds))
    return out


def table_freshness(settings: Settings) -> dict:
    """Dagster's freshness judgement of every asset with a policy (assets.freshness.judge_freshness),
    against the home's Dagster instance (none yet: nothing was ever materialized, all UNKNOWN)."""
    import dagster as dg

    from assets.freshness import judge_freshness
    from orchestration.definitions import build_definitions

    defs = build_definitions(settings.registry, settings)
    home = settings.dagster_home
    with (dg.DagsterInstance.from_config(str(home)) if home.is_dir() else dg.DagsterInstance.ephemeral()) as instance:
        return judge_freshness(defs, instance)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- rendering ----------------------------------------------------------------------------------------
def _holder(h: dict | None) -> str:
    return "-" if not h else f"{h.get('command') or 'a process'} (pid {h.get('pid', '?')})"


def _processed(q: QueryStatus):
    if q.processed_offsets is None:
        return q.processed_last_seq
    return " ".join(f"{p}:{o}" for p, o in sorted((int(p), o) for p, o in q.processed_offsets.items()))


def _seconds(q: QueryStatus) -> str:
    return "-" if not q.lag_messages else f"{q.lag_seconds:.1f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"


_FRESHNESS_WORDS = {"PASS": "fresh", "WARN": "warn", "FAIL": "STALE", "UNKNOWN": "unknown"}


def _freshness(t: TableStatus) -> str:
    if t.freshness is None:
        return "-"
    word = _FRESHNESS_WORDS.get(t.freshness, t.freshness)
    if t.seconds_since_materialized is None:
        return f"{word} (never materialized)"
    return (f"{word} (data {_minutes(max(t.seconds_since_materialized, 0.0))} ago; "
            f"stale after {_minutes(t.fail_after_seconds or 0.0)})")


def format_status(status: Status, fmt: str = "table", settings: Settings | None = None) -> str:
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
    settings = settings if settings is not None else Settings(home=Path(status.home))
    lines += open_log(settings).format_logs([g for g in status.logs if g.kind != KafkaTopicLog.kind])
    topics = [g for g in status.logs if g.kind == KafkaTopicLog.kind]
    if topics:
        lines += ["", *format_topics(topics)]
    lines.append("")
    lines += grid(["QUERY", "LOG", "PROCESSED TO", "LAG", "LAG SECONDS", "STATE", "RUN BY"],
                   [[q.query, q.log, _processed(q), q.lag_messages, _seconds(q),
                     "-" if q.state_bytes is None else _size(q.state_bytes), _holder(q.held_by)]
                    for q in status.queries], left=(0, 1, 6))
    if status.tables:
        lines.append("")
        lines += grid(["TABLE", "VERSION", "FILES", "SIZE", "FRESHNESS"],
                       [[t.table, t.version, t.files, _size(t.bytes), _freshness(t)] for t in status.tables],
                       left=(0, 4))
    doubts = [f"  {q.query}, TCP sink {sink}: {n} batch(es), listed in {q.checkpoint}/tcp-{sink}.in-doubt"
              for q in status.queries for sink, n in q.tcp_in_doubt.items()]
    if doubts:
        lines += ["", "TCP batches in doubt (their sender process stopped while sending them; EVENTIDE_TCP_IN_DOUBT "
                      "says whether they were sent again or skipped):", *doubts]
    lines.append("")
    lines.append("LAG: its messages not processed (open ones too); LAG SECONDS: age of the oldest of them. "
                 "STATE: its state store's files under its checkpoint (every version Spark keeps). "
                 "RUN BY: who holds the query's lock. FILES: data files of a table's current version "
                 "(`eventide upkeep` compacts them). FRESHNESS: Dagster's judgement of the table's freshness "
                 "policy (STALE: no data within its window, EVENTIDE_FRESHNESS_MINUTES).")
    return "\n".join(lines) + "\n"
