"""The sinks (foreachBatch): each micro-batch's quarantine rows and outputs, written exactly once
through Spark's Delta writer.

`BatchWriter` is the foreachBatch function. It keeps the batch (persist), counts its rows by kind,
writes the quarantine rows first (a bad message is never lost, even if a sink fails), then lets one
writer per sink write its share: the TCP sinks first (answers do not wait for the lake), then the
Delta sinks in the plan's order. A direct plan (bronze) makes one pass instead: its one sink's append,
then its rare quarantine rows (a failed append stops the batch, whose replay writes both). The executors turn the outputs into every
sink's rows in one Python pass (sink_rows.AllSinkRowsFn: each output unpickled once), which a keyed plan
whose sinks' columns are all declared folds into its keyed step (`BatchWriter.fold`: the step makes the
rows from the outputs it holds, and none is pickled); a Delta sink's
rows go to the lake (append, or MERGE of the last row per key), a TCP sink's encoded bytes to the
driver, in order, and out through the sink's sender process. `WRITERS` maps each kind of sink of
transforms.api to its writer class, so a new kind of sink is a new class there.

Exactly once: Delta writes carry Delta's idempotent-write identifiers (app id = query, generation and
table; version = batch id), so Delta skips a replayed batch (lake/writes.py); a TCP sink keeps a
marker file of the last batch it sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from transforms import lake
from transforms.api import DeltaSink, KafkaSink, TCPSink
from transforms.engine.envelope import DECODED_PREFIX, ENVELOPE
from transforms.engine.kafka_sink import (
    KAFKA_SCHEME,
    TransactionalSink,
    kafka_destination,
    parse_kafka_address,
)
from transforms.engine.plan import QueryMode, QueryPlan
from transforms.engine.report import RunReport
from transforms.engine.sink_rows import (
    ORDER,
    OUTPUTS,
    QUARANTINE_COLUMNS,
    QUARANTINE_INDEX,
    RECEIVE_TIME,
    SINK_INDEX,
    AllSinkRowsFn,
    InferSchemaFn,
    sink_column,
    unpack_rows,
)
from transforms.files import write_text_atomic
from transforms.settings import ConfigError, Settings

QUARANTINE_TABLE = "quarantine"
QUARANTINE_SCHEMA = pa.schema(
    [
        ("query", pa.string()),
        ("stream", pa.string()),
        ("seq", pa.int64()),
        ("receive_time", pa.timestamp("us", tz="UTC")),
        ("connection", pa.string()),
        ("step", pa.string()),
        ("reason", pa.string()),
        ("payload", pa.binary()),
        ("batch_id", pa.int64()),
    ]
)
# A direct plan's quarantine rows as observed: receive_time in epoch microseconds (QuarantineWriter casts it).
_QUARANTINE_ROWS = pa.schema([pa.field(c, pa.int64()) if c == "receive_time" else QUARANTINE_SCHEMA.field(c)
                              for c in QUARANTINE_COLUMNS])
# What a writer did with a batch: wrote it, found it committed before (a replay), or had nothing for it.
NEW, REPLAYED = "new", "replayed"


# -- the foreachBatch function ----------------------------------------------------------------------
@dataclass(frozen=True)
class BatchDone:
    """What one micro-batch of a query wrote, for whoever watches a running query (`on_batch`).
    `latencies`: seconds from the gateway's receipt of each input to the batch's commit, one per output
    or quarantine row that carries a receive time."""

    query: str
    batch_id: int
    rows_written: dict[str, int]  # table (or "tcp:<sink>") -> rows this batch
    latencies: list[float]
    committed_at: float
    replayed: bool  # a batch whose writes were all in the lake already


def _col(name: str):
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def last_per_key(rows, keys):
    """Each key's last row (highest ORDER), without the ORDER columns: a hash aggregate (max_by) that
    keeps one row per key, where a window sorted every row (word count: 12M rows of 217 keys a batch)."""
    from pyspark.sql import functions as F

    kept = [c for c in rows.columns if c not in ORDER]
    last = F.max_by(F.struct(*(_col(c) for c in kept)), F.struct(_col(ORDER[0]), _col(ORDER[1])))
    return rows.groupBy(*(_col(k) for k in keys)).agg(last.alias("__last")).select(
        *(F.col("__last").getField(c).alias(c) for c in kept))


class BatchWriter:
    """One query's foreachBatch function; `close()` when the query ends. `on_batch`, if given, hears
    about every batch after its writes (called on the query's thread: keep it quick); with
    `per_row_latencies` its latencies hold one value per row, else only the oldest row's."""

    def __init__(self, plan: QueryPlan, settings: Settings, report: RunReport,
                 tcp_addresses: Mapping[str, str | None], on_batch: Callable[[BatchDone], None] | None = None,
                 per_row_latencies: bool = False):
        ctx = WriteContext(plan, settings, report, tcp_addresses)
        self.plan = plan
        self.settings = settings
        self.report = report
        self.on_batch = on_batch
        self.per_row_latencies = per_row_latencies
        self.quarantine = QuarantineWriter(ctx)
        self.sinks = make_sink_writers(ctx)
        self.fold = self._fold()

    def _fold(self) -> AllSinkRowsFn | None:
        """The sinks' pass for the keyed step to fold in (keyed_state.stateful_step): a keyed plan's whose
        active sinks' columns are all known before a batch (no Delta sink inferring its schema)."""
        writers = [w for w in self.sinks if w.active]
        if not self.plan.keyed or any(isinstance(w, DeltaSinkWriter) and w.sink.schema is None for w in writers):
            return None
        return self._sinks_pass(writers, {w.index: w.row_schema(None) for w in writers})

    def _sinks_pass(self, writers: list[SinkWriter], schemas: dict[int, pa.Schema]) -> AllSinkRowsFn:
        return AllSinkRowsFn([w.sink for w in writers], [w.index for w in writers], schemas, batch_df_schema(self.plan),
                             combine=not self.per_row_latencies)  # combined rows keep only their earliest latency

    def __call__(self, batch_df, batch_id: int) -> None:
        report = self.report
        before = dict(report.rows_written)
        # This thread's jobs run in the query's own scheduler pool (spark.py: FAIR between pools).
        batch_df.sparkSession.sparkContext.setLocalProperty("spark.scheduler.pool", self.plan.name)
        if self.plan.mode is QueryMode.DIRECT:
            rows, outcomes, received = self._write_direct(batch_df, batch_id)
        else:
            rows, outcomes, received = self._write_envelopes(batch_df, batch_id)
        wrote_any = NEW in outcomes
        report.batches += 1
        replayed = bool(rows) and REPLAYED in outcomes and not wrote_any
        if replayed:
            report.skipped_batches += 1
        now = time.time()
        if received:
            report.max_lag_seconds = max(report.max_lag_seconds or 0.0, now - min(received))
        if self.on_batch is not None:
            written = {k: v - before.get(k, 0) for k, v in report.rows_written.items() if v != before.get(k, 0)}
            self.on_batch(BatchDone(self.plan.name, batch_id, written, [now - t for t in received], now, replayed))

    def _received(self, oldest, times) -> list[float]:
        if self.per_row_latencies and times is not None:  # microseconds: a million datetimes cost the driver 1.3 s
            return [t / 1e6 for t in times if t is not None]
        return [oldest.timestamp()] if oldest is not None else []

    def _write_direct(self, batch_df, batch_id: int) -> tuple[int, list, list[float]]:
        """A direct plan (bronze): the decoded columns are the rows; Spark casts them, no Python here.

        One pass over the batch: the sink's append also counts it, finds its oldest receive time and
        brings its quarantine rows (few: bad messages) to the driver, through Spark's `observe`, instead
        of keeping the batch (persist) for a pass of counting first; that was a third of bronze's time.
        A replay (Delta holds the batch: its append would run nothing, so nothing would be observed)
        gathers the same in a pass of its own."""
        from pyspark.sql import functions as F

        (sink,) = self.sinks  # a direct plan has one Delta sink (plan._choose_mode)
        bad = F.col("kind") == "quarantine"
        quarantined = F.struct(*(F.unix_micros(c).alias(c) if c == "receive_time" else F.col(c)
                                 for c in QUARANTINE_COLUMNS))
        stats = [F.count(F.lit(1)).alias("n"), F.min("receive_time").alias("oldest"),
                 F.collect_list(F.when(bad, quarantined)).alias("quarantined"),  # nulls (good rows) left out
                 *([F.collect_list(F.unix_micros("receive_time")).alias("times")] if self.per_row_latencies else [])]
        if sink.committed(batch_id):
            seen = batch_df.agg(*stats).collect()[0].asDict()
            outcome = sink.write_direct(batch_df.where(F.col("kind") == "out"), batch_id)
        else:
            from pyspark.sql import Observation

            observation = Observation(f"{self.plan.name}#{batch_id}#{uuid.uuid4().hex}")
            outcome = sink.write_direct(batch_df.observe(observation, *stats).where(F.col("kind") == "out"), batch_id)
            seen = dict(observation.get)
        n, q_rows = int(seen["n"] or 0), seen["quarantined"] or []
        outcomes = [sink.counted(batch_id, n - len(q_rows), outcome)]
        if q_rows:  # after the sink: a failed append stops the batch, and its replay writes both
            q = pa.Table.from_pylist([r.asDict() for r in q_rows], schema=_QUARANTINE_ROWS)
            outcomes.append(self.quarantine.write(q, batch_df.sparkSession, batch_id))
        received = self._received(seen["oldest"], seen.get("times")) if n else []
        return n, outcomes, received

    def _write_envelopes(self, batch_df, batch_id: int) -> tuple[int, list, list[float]]:
        """Every sink's rows and the quarantine rows from one Python pass over the batch (each output
        unpickled once), kept while they are written. One Spark job runs the query's stages, that
        pass, and brings the counts and the TCP sinks' bytes to the driver: the answers go out, then the
        lake's writes run (appends side by side, MERGEs one after another)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        source, shapes = batch_df, {}
        inferred = [w for w in self.sinks if isinstance(w, DeltaSinkWriter) and w.sink.schema is None]  # none if folded
        if inferred:  # the inferred columns first: a pass of their own over the kept batch
            source = batch_df.persist(StorageLevel.MEMORY_AND_DISK)
            shapes = infer_schemas(source, [w.index for w in inferred], [w.sink for w in inferred])
            shapes = {i: _with_table_types(s, w.root) for w, (i, s) in zip(inferred, shapes.items())}
        writers = [w for w in self.sinks if w.active and (not isinstance(w, DeltaSinkWriter) or w.sink.schema is not None
                                                          or shapes.get(w.index) is not None)]
        schemas = {w.index: w.row_schema(shapes.get(w.index)) for w in writers}
        if self.fold is not None:  # the keyed step made the rows (stateful_step's fold): unpacked, no Python pass
            rows = source.mapInArrow(unpack_rows, from_arrow_schema(self.fold.schema))
        else:
            fn = self._sinks_pass(writers, schemas)
            rows = source.mapInArrow(fn, from_arrow_schema(fn.schema))
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # The TCP and Kafka sinks' rows come to the driver, which sends them (DRIVER_COLUMNS).
            driver = [w for w in writers if w.DRIVER_COLUMNS]
            tcp = [w.index for w in driver]
            is_tcp = F.col(SINK_INDEX).isin(tcp) if tcp else F.lit(False)
            tcp_rows = F.struct(*(F.col(sink_column(w.index, c)).alias(f"{c}{w.index}") for w in driver
                                  for c in (*w.DRIVER_COLUMNS, *ORDER))) if tcp else F.lit(None)
            extra = [F.collect_list(F.unix_micros(RECEIVE_TIME)).alias("times")] if self.per_row_latencies else []
            groups = {r[SINK_INDEX]: r for r in rows.groupBy(SINK_INDEX).agg(
                F.sum(OUTPUTS).alias("n"), F.min(RECEIVE_TIME).alias("oldest"),
                F.collect_list(F.when(is_tcp, tcp_rows)).alias("tcp"), *extra).collect()}
            outcomes = []
            if QUARANTINE_INDEX in groups:
                q = rows.where(F.col(SINK_INDEX) == QUARANTINE_INDEX).select(
                    *(_col(sink_column(QUARANTINE_INDEX, c)).alias(c) for c in QUARANTINE_COLUMNS)).toArrow()
                outcomes.append(self.quarantine.write(q, batch_df.sparkSession, batch_id))
            # TCP and Kafka sinks first: an answer goes out before the lake's commits (each sink is
            # exactly once on its own: a crash between them replays the batch, and each skips what it has).
            for w in driver:
                if w.index in groups:
                    i = w.index
                    payloads = [(r[f"{ORDER[0]}{i}"], r[f"{ORDER[1]}{i}"], *(r[f"{c}{i}"] for c in w.DRIVER_COLUMNS))
                                for r in groups[i]["tcp"]]
                    outcomes.append(w.send(sorted(payloads, key=lambda p: (p[0], p[1])), batch_id))
            deltas = [w for w in writers if isinstance(w, DeltaSinkWriter) and w.index in groups]
            outcomes += write_side_by_side([
                (w.sink.mode == "upsert", lambda w=w: w.write(
                    rows.where(F.col(SINK_INDEX) == w.index).select(
                        *(_col(sink_column(w.index, f.name)).alias(f.name) for f in schemas[w.index])),
                    groups[w.index]["n"], batch_id))
                for w in deltas])
        finally:
            rows.unpersist()
            if source is not batch_df:
                source.unpersist()
        received = [t for r in groups.values() for t in self._received(r["oldest"], r["times"] if extra else None)]
        return sum(r["n"] for r in groups.values()), outcomes, received

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def batch_df_schema(plan: QueryPlan) -> pa.Schema:
    """The envelope columns the sinks' pass reads (the stateful step's output, or the pre stage's)."""
    return ENVELOPE if plan.keyed else plan.stage_schema


def write_side_by_side(writes: list[tuple[bool, Callable[[], str]]]) -> list[str]:
    """Run the Delta writes of a batch at once (each a Spark job of its own, the cores shared), the
    MERGEs one after another: a MERGE takes Delta's idempotent-write identifiers from its session's
    settings, which two MERGEs at once would share (an append takes them as writer options). Every
    write finishes (or fails) before this returns; the first failure is raised."""
    if len(writes) <= 1:
        return [fn() for _, fn in writes]
    from concurrent.futures import ThreadPoolExecutor

    merges = [fn for is_merge, fn in writes if is_merge]
    others = [fn for is_merge, fn in writes if not is_merge]
    jobs = [lambda: [fn() for fn in merges]] if merges else []
    jobs += [lambda fn=fn: [fn()] for fn in others]
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="eventide-delta-write") as pool:
        futures = [pool.submit(job) for job in jobs]
    results, errors = [], []
    for f in futures:
        try:
            results += f.result()
        except Exception as e:  # noqa: BLE001 - raised below, once every write has ended
            errors.append(e)
    if errors:
        raise errors[0]
    return results


SMALL_BATCH_ROWS = 100_000


def _few_files(rows, n: int):
    """A small batch's rows in one task, so its append writes one file (per partition value), not one
    per shuffle partition: fewer small files for upkeep under serve's frequent batches."""
    return rows.coalesce(1) if n <= SMALL_BATCH_ROWS else rows


def _with_table_types(schema: pa.Schema | None, root: Path) -> pa.Schema | None:
    """An inferred batch schema, with the types the table already has for its columns (a batch whose
    integers the table holds as doubles is cast, not refused)."""
    if schema is None or not lake.exists(root):
        return schema
    table = lake.arrow_schema(root)
    return pa.schema([table.field(f.name) if f.name in table.names else f for f in schema])


def infer_schemas(batch, indexes: list[int], sinks: list[DeltaSink]) -> dict[int, pa.Schema | None]:
    """The batch's columns of each sink without a declared schema: each task's rows' schema, unified
    (None: the batch has no rows for the sink). A type that differs between tasks is promoted where
    Arrow can (int to double), else an error naming the sink."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from transforms.api import UserFunctionError

    found: dict[int, list[pa.Schema]] = {}
    for r in batch.mapInArrow(InferSchemaFn(sinks, indexes), from_arrow_schema(InferSchemaFn.OUTPUT)).collect():
        found.setdefault(r["sink"], []).append(pa.ipc.read_schema(pa.py_buffer(r["schema"])))
    unified = {}
    for i in indexes:
        schemas = found.get(i)
        if not schemas:
            unified[i] = None
            continue
        try:
            unified[i] = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            sink = sinks[indexes.index(i)]
            raise UserFunctionError(f"Delta sink {sink.table!r}: the batch's outputs disagree on column types ({e}); "
                                    "declare the sink's schema (DeltaSink(..., schema=...))") from None
    return unified


# -- writers -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WriteContext:
    """What every writer of a query needs: its plan, the settings, the report it counts into, and the
    resolved TCP addresses (`resolve_tcp_sinks`)."""

    plan: QueryPlan
    settings: Settings
    report: RunReport
    tcp_addresses: Mapping[str, str | None]

    def count(self, name: str, rows: int) -> None:
        self.report.rows_written[name] = self.report.rows_written.get(name, 0) + rows


class SinkWriter:
    """Writes one sink's share of each micro-batch. `row_schema` says the columns it wants from the
    executors' pass over the outputs (sink_rows.AllSinkRowsFn); `write(rows, n, batch_id)` gets them
    (n rows) as a DataFrame and returns NEW, or REPLAYED for a batch it had written before. A writer
    with DRIVER_COLUMNS gets its rows on the driver instead: `send(rows, batch_id)`, rows of (seq, part,
    *DRIVER_COLUMNS) in their inputs' order."""

    DRIVER_COLUMNS: tuple[str, ...] = ()

    def __init__(self, sink: Any, ctx: WriteContext, index: int):
        self.sink, self.ctx, self.index = sink, ctx, index

    @property
    def active(self) -> bool:
        return True

    def row_schema(self, inferred: pa.Schema | None) -> pa.Schema:
        raise NotImplementedError

    def write(self, rows, n: int, batch_id: int) -> str | None:
        raise NotImplementedError

    def write_direct(self, outs, batch_id: int) -> bool:
        raise TypeError(f"{type(self).__name__} takes no direct plan")

    def close(self) -> None:
        pass


class DeltaSinkWriter(SinkWriter):
    """Appends to or upserts into a Delta table (MERGE of each key's last row), exactly once by
    Delta's idempotent writes."""

    sink: DeltaSink

    def __init__(self, sink: DeltaSink, ctx: WriteContext, index: int):
        super().__init__(sink, ctx, index)
        self.root = ctx.settings.table_path(sink.table)
        self.app_id = ctx.plan.app_id(sink.table)
        self.done: int | None = None  # the last batch committed (read once), for the report only

    def committed(self, batch_id: int) -> bool:
        """Whether the table holds the batch already: only to report a replay (Delta skips it itself)."""
        if self.done is None:
            done = lake.committed_batch(self.root, self.app_id)
            self.done = -1 if done is None else done
        return self.done >= batch_id

    def row_schema(self, inferred: pa.Schema | None) -> pa.Schema:
        schema = self.sink.schema if self.sink.schema is not None else inferred
        if self.sink.mode == "upsert":  # the order columns pick each key's last row
            schema = pa.schema([*schema, pa.field(ORDER[0], pa.int64()), pa.field(ORDER[1], pa.int32())])
        return schema

    def write(self, rows, n: int, batch_id: int) -> str:
        replay = self.committed(batch_id)
        sink = self.sink
        if sink.mode == "append":
            lake.append_once(_few_files(rows, n), self.root, self.app_id, batch_id, sink.partition_by,
                             sink.table_properties)
        else:
            lake.merge_once(last_per_key(rows, sink.keys), self.root, list(sink.keys), self.app_id, batch_id,
                            properties=sink.table_properties)
        return self.counted(batch_id, n, replay)

    def write_direct(self, outs, batch_id: int) -> bool:
        """A direct plan's rows: the decoded columns (and the envelope's), cast to the sink's schema;
        whether the table held the batch already (a replay). Counted by `counted` once the rows are
        known. One file per input split (no coalescing: a small batch reads few segments)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        replay = self.committed(batch_id)
        decoded = set(self.ctx.plan.decoded_schema.names)
        types = from_arrow_schema(self.sink.schema)
        rows = outs.select(*(_col(DECODED_PREFIX + f.name if f.name in decoded else f.name).cast(f.dataType).alias(f.name)
                             for f in types.fields))
        lake.append_once(rows, self.root, self.app_id, batch_id, self.sink.partition_by, self.sink.table_properties)
        return replay

    def counted(self, batch_id: int, n: int, replay: bool) -> str:
        """NEW (its `n` rows counted) or REPLAYED, for a batch written or found written."""
        if replay:
            return REPLAYED
        self.done = batch_id
        self.ctx.count(self.sink.table, n)
        return NEW


class TCPSinkWriter(SinkWriter):
    """Sends encoded outputs over one connection kept for the run; a marker file per sink records the
    last batch sent, so a replayed batch is not sent twice. No address: the sink is off.

    The send itself happens in a sender process of the sink's own (transforms/tcp_relay.py), which
    finishes a batch it was handed even when this process is killed: a plain TCP receiver acknowledges
    nothing, so a send cut in the middle could not be told apart from one that finished. Only a kill
    of the sender process itself leaves a batch in doubt (the marker says "N sending M"): a replay
    resends it or skips it (settings.tcp_in_doubt), appends the case to `tcp-<sink>.in-doubt` next to
    the marker, and says so."""

    sink: TCPSink
    DRIVER_COLUMNS = ("bytes",)

    def __init__(self, sink: TCPSink, ctx: WriteContext, index: int):
        super().__init__(sink, ctx, index)
        self.address = ctx.tcp_addresses.get(sink.name)
        self.marker = ctx.plan.checkpoint(ctx.settings) / f"tcp-{sink.name}.sent"
        self.in_doubt_log = self.marker.with_suffix(".in-doubt")
        self.sender = TCPSender(self.address, self.marker, f"TCP sink {sink.name!r} ({ctx.plan.name})") if self.address else None

    @property
    def active(self) -> bool:
        return self.sender is not None

    def row_schema(self, inferred: pa.Schema | None) -> pa.Schema:
        return pa.schema([("bytes", pa.binary()), (ORDER[0], pa.int64()), (ORDER[1], pa.int32())])

    def send(self, payloads: list[tuple[int, int, bytes]], batch_id: int) -> str | None:
        """Send the batch's encoded outputs, (seq, part, bytes) in their inputs' order, unless sent before."""
        encoded = [p for _, _, p in payloads]
        sent = self._send_once(lambda: b"".join(encoded), batch_id)
        self.ctx.count(f"tcp:{self.sink.name}", len(encoded))  # replays count too, as they always have
        return NEW if sent else None

    def _read_marker(self) -> tuple[int, int | None]:
        """(last batch sent, batch whose send started and did not finish, or None)."""
        if not self.marker.exists():
            return -1, None
        parts = self.marker.read_text().split()
        return (int(parts[0]) if parts else -1), (int(parts[2]) if len(parts) == 3 else None)

    def _send_once(self, encoded: Callable[[], bytes], batch_id: int) -> bool:
        self.sender.start()  # returns once no earlier sender of the sink is left: the marker is final
        last, sending = self._read_marker()
        if last >= batch_id:
            return False
        data = encoded()
        if sending == batch_id and self._in_doubt(batch_id, len(data)) == "skip":
            write_text_atomic(self.marker, str(batch_id))
            return False
        try:
            self.sender.send(batch_id, last, data)
        except OSError as e:
            raise RuntimeError(f"TCP sink {self.sink.name!r} could not write to {self.address}: {e}") from e
        return True

    def _in_doubt(self, batch_id: int, size: int) -> str:
        action = self.ctx.settings.tcp_in_doubt
        record = {"batch": batch_id, "bytes": size, "action": action, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(self.in_doubt_log, "a") as f:
            f.write(json.dumps(record) + "\n")
        what = "sent again: the receiver may get part of it twice" if action == "resend" else "skipped: the receiver may miss part of it"
        print(f"TCP sink {self.sink.name!r} ({self.ctx.plan.name}): batch {batch_id} ({size} bytes) was being sent when "
              f"its sender process stopped, so the receiver may hold none, part or all of it; {what} "
              f"(EVENTIDE_TCP_IN_DOUBT=resend|skip; recorded in {self.in_doubt_log})", file=sys.stderr, flush=True)
        self.ctx.report.tcp_in_doubt.append(batch_id)
        return action

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()


class KafkaSinkWriter(SinkWriter):
    """Produces a batch's encoded outputs (the encoder's bytes as values, the key function's as keys) as
    one Kafka transaction with a record of the batch id, and skips a batch committed before: exactly
    once for read_committed consumers (transforms/engine/kafka_sink.py). No address: the sink is off."""

    sink: KafkaSink
    DRIVER_COLUMNS = ("bytes", "key")

    def __init__(self, sink: KafkaSink, ctx: WriteContext, index: int):
        super().__init__(sink, ctx, index)
        address = ctx.tcp_addresses.get(sink.name)
        self.kafka = None
        if address:
            servers, topic = parse_kafka_address(address)
            self.kafka = TransactionalSink(
                servers, topic, txn_id=f"eventide.{ctx.plan.app_id(sink.name)}.{_home_id(ctx.settings)}",
                where=f"Kafka sink {sink.name!r} ({ctx.plan.name}) to topic {topic!r} at {servers}",
                switch_off=f"EVENTIDE_SINK_{sink.name.upper()}=off")

    @property
    def active(self) -> bool:
        return self.kafka is not None

    def row_schema(self, inferred: pa.Schema | None) -> pa.Schema:
        return pa.schema([("bytes", pa.binary()), ("key", pa.binary()), (ORDER[0], pa.int64()), (ORDER[1], pa.int32())])

    def send(self, rows: list[tuple], batch_id: int) -> str:
        """The batch's (seq, part, value, key) rows as one transaction, unless committed before."""
        self.kafka.start()
        self.ctx.count(f"tcp:{self.sink.name}", len(rows))  # not a table: counted as the TCP sinks are
        if self.kafka.committed(batch_id):
            return REPLAYED
        self.kafka.commit(batch_id, [(value, key) for _, _, value, key in rows])
        return NEW

    def close(self) -> None:
        if self.kafka is not None:
            self.kafka.close()


def _home_id(settings: Settings) -> str:
    """A short id of the home, so that two homes' sinks of one name on one cluster do not fence each other."""
    import hashlib

    return hashlib.sha1(str(settings.home.absolute()).encode()).hexdigest()[:8]


QUARANTINE_KEYS = ("stream", "seq", "step")


class QuarantineWriter:
    """Writes a micro-batch's quarantine envelopes to the quarantine table, with the exact payloads:
    one row per (stream, seq, step). A payload its stream's decoder rejects is rejected by every query
    reading the stream (bronze and each app): the first query to write it keeps the row (its name is in
    `query`), the others insert nothing. An insert-only MERGE with Delta's idempotent-write
    identifiers: exactly once. The rows come to the driver (they are few: bad messages) to take the
    payloads that did not travel with them from the landing log."""

    def __init__(self, ctx: WriteContext):
        self.ctx = ctx
        self.path = ctx.settings.table_path(QUARANTINE_TABLE)
        self.app_id = ctx.plan.app_id("quarantine")

    def write(self, q: pa.Table, spark, batch_id: int) -> str:
        """`q`: the batch's quarantine envelopes (QUARANTINE_COLUMNS), on the driver."""
        plan = self.ctx.plan
        done = lake.committed_batch(self.path, self.app_id)
        if q.column("payload").null_count:
            q = _with_landed_payloads(q, self.ctx.settings, plan)
        qtable = pa.table(
            {
                "query": pa.array([plan.name] * q.num_rows, pa.string()),
                "stream": q.column("stream"),
                "seq": q.column("seq"),
                "receive_time": q.column("receive_time").cast(pa.timestamp("us", tz="UTC")),
                "connection": q.column("connection"),
                "step": q.column("step"),
                "reason": q.column("reason"),
                "payload": q.column("payload"),
                "batch_id": pa.array([batch_id] * q.num_rows, pa.int64()),
            },
            schema=QUARANTINE_SCHEMA,
        )
        qtable = _first_per_key(qtable)  # a MERGE source must not repeat a key
        seqs = pa.compute.min_max(qtable.column("seq"))
        df = spark.createDataFrame(qtable)
        lake.merge_once(df, self.path, QUARANTINE_KEYS, self.app_id, batch_id, update=False,
                        prune=f"t.seq >= {seqs['min']} AND t.seq <= {seqs['max']}")
        self.ctx.report.quarantined += q.num_rows
        return REPLAYED if done is not None and done >= batch_id else NEW

    def close(self) -> None:
        pass


def _first_per_key(table: pa.Table) -> pa.Table:
    seen, keep = set(), []
    for i, key in enumerate(zip(*(table.column(k).to_pylist() for k in QUARANTINE_KEYS))):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return table.take(keep)


def _with_landed_payloads(q: pa.Table, settings: Settings, plan: QueryPlan) -> pa.Table:
    """Messages quarantined after the pre stage travel without their payload (it is not shuffled):
    take it from the log the plan reads (the home's, or a kafka_source's topic), so every quarantine row
    holds the exact bytes that failed."""
    from transforms.ingestion.kafka_source import plan_log

    payloads = q.column("payload").to_pylist()
    seqs = q.column("seq").to_pylist()
    missing = [s for s, p in zip(seqs, payloads) if p is None]
    landed = plan_log(settings, plan).payloads_for(plan.group, missing) if missing else {}
    filled = [p if p is not None else landed.get(s) for s, p in zip(seqs, payloads)]
    return q.set_column(q.schema.get_field_index("payload"), "payload", pa.array(filled, pa.binary()))


# -- building the writers of a query -----------------------------------------------------------------
# The writer of each kind of sink of transforms.api.
WRITERS: dict[type, type[SinkWriter]] = {DeltaSink: DeltaSinkWriter, TCPSink: TCPSinkWriter, KafkaSink: KafkaSinkWriter}


def make_sink_writers(ctx: WriteContext) -> list[SinkWriter]:
    """One writer per sink of the plan, in the plan's order (a TCP sink sent to kafka://... is a Kafka sink)."""
    writers = []
    for i, sink in enumerate(ctx.plan.sinks):
        sink = kafka_destination(sink, ctx.tcp_addresses.get(sink.name))
        writer = WRITERS.get(type(sink))
        if writer is None:
            raise TypeError(f"query {ctx.plan.name!r}: no writer for sink {sink!r} (known: {[t.__name__ for t in WRITERS]})")
        writers.append(writer(sink, ctx, i))
    return writers


# -- TCP sinks: addresses and connections ---------------------------------------------------------------
OFF = "off"


def resolve_tcp_sinks(app: str, sinks, tcp_addresses: Mapping[str, str] | None = None,
                      environ: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """Each TCP or Kafka sink's address ("HOST:PORT", or "kafka://HOST:PORT/TOPIC"), or None for a sink
    that is off.

    From `tcp_addresses`, else `EVENTIDE_SINK_<NAME>=off`, else the sink's own (a TCP sink's `address`, a
    Kafka sink's `bootstrap` and `topic`), else `EVENTIDE_SINK_<NAME>`; a TCP sink's address may be a
    `kafka://HOST:PORT/TOPIC` (then its encoder's bytes go to that topic). A set `EVENTIDE_SINK_<NAME>`
    overrides a Kafka sink's own. A sink without an address is off only when declared `optional=True`:
    otherwise ConfigError, before any Spark work, so outputs are never dropped unnoticed.
    """
    given = tcp_addresses or {}
    resolved: dict[str, str | None] = {}
    for sink in sinks:
        if not isinstance(sink, (TCPSink, KafkaSink)):
            continue
        kind = "TCP" if isinstance(sink, TCPSink) else "Kafka"
        var = f"EVENTIDE_SINK_{sink.name.upper()}"
        env = environ.get(var, "").strip()
        own = sink.address if isinstance(sink, TCPSink) else (
            f"{KAFKA_SCHEME}{sink.bootstrap}/{sink.topic}" if sink.bootstrap and sink.topic else None)
        if given.get(sink.name):
            address, origin = given[sink.name], f"tcp_addresses[{sink.name!r}]"
        elif env.lower() == OFF:
            address, origin = OFF, var
        elif own and not (kind == "Kafka" and env):
            address, origin = own, "address=..." if kind == "TCP" else "bootstrap=..., topic=..."
        else:
            address, origin = env or None, var
        if address is not None and address.strip().lower() == OFF:
            resolved[sink.name] = None
            continue
        if address is None:
            if sink.optional:
                resolved[sink.name] = None
                continue
            what = "HOST:PORT" if kind == "TCP" else "kafka://HOST:PORT/TOPIC"
            given_as = "address=..." if kind == "TCP" else "bootstrap=... and topic=..."
            raise ConfigError(
                f"{kind} sink {sink.name!r} of app {app!r} has no address: set {var}={what} (or pass {given_as}), or "
                f"declare it {type(sink).__name__}(..., optional=True) to send only when that variable is set"
            )
        if address.startswith(KAFKA_SCHEME) or kind == "Kafka":
            if parse_kafka_address(address) is None:
                raise ConfigError(f"{kind} sink {sink.name!r} of app {app!r}: {origin}={address!r} is not "
                                  "kafka://HOST:PORT/TOPIC (a topic of letters, digits, ., _ and -)")
            resolved[sink.name] = address
            continue
        _, _, port = address.rpartition(":")
        if not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"TCP sink {sink.name!r} of app {app!r}: {origin}={address!r} is not HOST:PORT "
                              "or kafka://HOST:PORT/TOPIC")
        resolved[sink.name] = address
    return resolved


class TCPSender:
    """The query's side of a TCP sink's sender process (transforms/tcp_relay.py): started on first use
    and kept for the run; `send` hands a batch over whole and returns once it is sent and marked."""

    STOP_SECONDS = 60.0  # a sender finishing a batch to a slow receiver (its socket times out at 30 s)

    def __init__(self, address: str, marker: Path, name: str):
        self.address, self.marker, self.name = address, marker, name
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        import transforms

        self.marker.parent.mkdir(parents=True, exist_ok=True)
        root = str(Path(transforms.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        # Its own session: a signal to the queries' process group (Ctrl-C) or a kill of that process
        # does not stop a send half way.
        self.proc = subprocess.Popen([sys.executable, "-m", "transforms.tcp_relay", str(self.marker), self.address],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)
        while (line := self._reply()) != "ready":
            if not line.startswith("waiting "):
                raise RuntimeError(f"{self.name}: its sender process did not start (exit code {self.proc.poll()})")
            print(f"{self.name}: waiting for the previous sender (pid {line.split()[1]}) to finish its batch",
                  file=sys.stderr, flush=True)

    def _reply(self) -> str:
        return self.proc.stdout.readline().decode().strip()

    def send(self, batch_id: int, last: int, data: bytes) -> None:
        try:
            self.proc.stdin.write(b"%d %d %d\n" % (batch_id, last, len(data)))
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the reply below says what happened to the sender
        reply = self._reply()
        if reply == f"sent {batch_id}":
            return
        if reply.startswith("error "):
            raise OSError(reply[len("error "):])
        proc = self.proc
        self.close()
        raise OSError(f"its sender process stopped (exit code {proc.returncode})")

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # the end of its input: it exits once its batch is sent
        except BrokenPipeError:
            pass
        try:
            proc.wait(self.STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
