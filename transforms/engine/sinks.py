"""The sinks (foreachBatch): each micro-batch's quarantine rows and outputs, written exactly once.

`BatchWriter` is the foreachBatch function. The executors stage the micro-batch (staging.py: the
append sinks' Parquet files written, the bounded rest shipped); the driver writes the quarantine
rows first (a bad message is never lost, even if a sink fails), then lets one writer per sink, in the
plan's order, commit its share. A writer has `commit(staged, batch_id)` (True if it wrote the batch,
False if it had already), `write(outputs, batch_id)` (the same from the whole batch collected on the
driver: the reference form, `EVENTIDE_WRITE_PATH=driver`) and `close()`; `WRITERS` maps each kind of
sink of transforms.api to its writer class, so a new kind of sink is a new class there.

Exactly once: Delta writes carry the app transaction (query, batch id) and check it before writing;
a TCP sink keeps a marker file of the last batch it sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from transforms import lake
from transforms.api import DeltaSink, TCPSink
from transforms.engine.envelope import ENVELOPE
from transforms.engine.plan import QueryMode, QueryPlan
from transforms.engine.staging import (
    FILE,
    QUARANTINE_COLUMNS,
    QUARANTINE_ROWS,
    RECEIVE_TIMES,
    STAGED,
    Outputs,
    StageBatch,
    StagingJournal,
    StagingPlan,
    direct_rows,
    discard_uncommitted,
    encode_all,
    from_ipc,
    new_token,
    of_kind,
    outputs_to_table,
    unordered,
)
from transforms.files import write_text_atomic
from transforms.settings import ConfigError, Settings

if TYPE_CHECKING:
    from transforms.engine.runner import RunReport

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


class BatchWriter:
    """One query's foreachBatch function; `close()` when the query ends. `on_batch`, if given, hears
    about every batch after its writes (called on the query's thread: keep it quick); with
    `per_row_latencies` its latencies hold one value per row, else only the oldest row's.

    Two write paths, same tables (a test holds them equal): `settings.write_path == "executor"` (the
    default) stages the batch on the executors (staging.py: they write the append sinks' Parquet files;
    the driver commits them and the bounded rest); `"driver"`, the reference form, collects the whole
    batch to the driver and writes it there with delta-rs."""

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
        self.journal = StagingJournal(plan.checkpoint(settings))
        self.fused: StagingPlan | None = None  # a direct plan stages inside the query's own stage
        self.fused_entry = None
        if settings.write_path == "executor":
            self.journal.recover()  # files of attempts that a crash left uncommitted
            if plan.mode is QueryMode.DIRECT:
                # One token for the query run: the tasks stage before the batch (or its replay) is known.
                self.fused = self._staging_plan(None, every_sink=True)
                self.fused_entry = self.journal.open(self.fused.token, -1, sorted(self.fused.append_roots.values()))

    def _staging_plan(self, batch_id: int | None, every_sink: bool = False) -> StagingPlan:
        def needed(w) -> bool:
            return every_sink or not w.committed(batch_id)

        deltas = [w for w in self.sinks if isinstance(w, DeltaSinkWriter)]
        return StagingPlan(
            plan=self.plan, batch_id=batch_id, token=new_token(),
            append_roots={w.sink.table: str(w.root.absolute()) for w in deltas if w.sink.mode == "append" and needed(w)},
            upserts=frozenset(w.sink.table for w in deltas if w.sink.mode == "upsert" and needed(w)),
            tcp_sinks=frozenset(w.sink.name for w in self.sinks if isinstance(w, TCPSinkWriter) and w.sender is not None),
            all_receive_times=self.per_row_latencies,
        )

    def __call__(self, batch_df, batch_id: int) -> None:
        report = self.report
        before = dict(report.rows_written)
        if self.settings.write_path == "executor":
            wrote_any, received, rows = self._write_staged(batch_df, batch_id)
        else:
            wrote_any, received, rows = self._write_collected(batch_df, batch_id)
        report.batches += 1
        if not wrote_any and rows:
            report.skipped_batches += 1
        now = time.time()
        received_s = pc.divide(received.cast(pa.int64()), 1e6)  # epoch seconds
        oldest = pc.min(received_s)
        if oldest.is_valid:
            report.max_lag_seconds = max(report.max_lag_seconds or 0.0, now - oldest.as_py())
        if self.on_batch is not None:
            written = {k: v - before.get(k, 0) for k, v in report.rows_written.items() if v != before.get(k, 0)}
            latencies = pc.subtract(pa.scalar(now), received_s).to_pylist()
            self.on_batch(BatchDone(self.plan.name, batch_id, written, latencies, now, bool(rows) and not wrote_any))

    # Each path returns: whether it wrote anything, the receive times, and whether the batch had rows.
    def _write_collected(self, batch_df, batch_id: int) -> tuple[bool, pa.ChunkedArray, int]:
        """The reference path: the whole batch on the driver, written there."""
        table = batch_df.toArrow() if hasattr(batch_df, "toArrow") else pa.Table.from_pandas(batch_df.toPandas())
        table = table.sort_by([("seq", "ascending"), ("part", "ascending")]) if table.num_rows else table
        kind = table.column("kind")
        wrote_any = self.quarantine.write(of_kind(table, kind, "quarantine"), batch_id)
        outputs = Outputs(of_kind(table, kind, "out"))
        for sink in self.sinks:
            wrote_any |= sink.write(outputs, batch_id)
        received = table.column("receive_time").drop_null()
        if not self.per_row_latencies and len(received):
            received = pa.chunked_array([[pc.min(received).as_py()]], received.type)
        return wrote_any, received, table.num_rows

    def _write_staged(self, batch_df, batch_id: int) -> tuple[bool, pa.ChunkedArray, int]:
        """The executors stage the batch in one Spark job; the driver commits what they staged."""
        from pyspark.sql.pandas.types import from_arrow_schema

        if self.fused is not None:  # the query's rows are staged already (runner.build_stream)
            staging, entry = self.fused, None
            result = batch_df.toArrow()
        else:
            staging = self._staging_plan(batch_id)
            entry = self.journal.open(staging.token, batch_id, sorted(staging.append_roots.values()))
            result = batch_df.mapInArrow(StageBatch(staging), from_arrow_schema(STAGED)).toArrow()
        staged = Staged.of(result, staging)
        q = staged.rows.get(QUARANTINE_ROWS)
        wrote_any = self.quarantine.write(q if q is not None else EMPTY_QUARANTINE, batch_id)
        for sink in self.sinks:
            wrote_any |= sink.commit(staged, batch_id)
        if entry is not None:
            self.journal.close(entry)
        times = staged.rows.get(RECEIVE_TIMES)
        received = times.column("receive_time") if times is not None else pa.chunked_array([], pa.timestamp("us", tz="UTC"))
        return wrote_any, received, int(staged.had_rows)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        if self.fused_entry is not None:  # the run's files that no commit took (a replay's, a retried task's)
            for root in self.fused.append_roots.values():
                discard_uncommitted(Path(root), self.fused.token)
            self.journal.close(self.fused_entry)
            self.fused_entry = None


@dataclass
class Staged:
    """What the executors staged for one batch: each append table's files, and the tables of rows
    for the driver by name (quarantine, upserts, TCP sinks, receive times)."""

    staging: StagingPlan
    files: dict[str, list[tuple[dict, pa.Schema]]]
    rows: dict[str, pa.Table]
    retried: set[str]  # tables with files from a retried task: earlier attempts may have left some
    had_rows: bool  # every task with rows ships their receive times

    @classmethod
    def of(cls, result: pa.Table, staging: StagingPlan) -> Staged:
        files: dict[str, list] = {}
        parts: dict[str, list[pa.Table]] = {}
        retried: set[str] = set()
        for r in result.to_pylist():
            if r["what"] == FILE:
                schema = pa.ipc.read_schema(pa.py_buffer(r["schema"]))
                files.setdefault(r["sink"], []).append((json.loads(r["data"]), schema))
                if r["attempt"]:
                    retried.add(r["sink"])
            else:
                parts.setdefault(r["sink"], []).append(from_ipc(r["data"]))
        rows = {k: pa.concat_tables(v, promote_options="permissive") for k, v in parts.items()}
        return cls(staging, files, rows, retried, RECEIVE_TIMES in rows)


EMPTY_QUARANTINE = pa.schema([(c, ENVELOPE.field(c).type) for c in QUARANTINE_COLUMNS]).empty_table()


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
    """Writes one sink's share of each micro-batch: True if it wrote the batch, False if it had
    already (a replay) or had nothing to write."""

    def __init__(self, sink: Any, ctx: WriteContext):
        self.sink, self.ctx = sink, ctx

    def write(self, outputs: Outputs, batch_id: int) -> bool:
        """The reference path: write this sink's share of the whole batch, collected on the driver."""
        raise NotImplementedError

    def commit(self, staged: Staged, batch_id: int) -> bool:
        """The executor path: commit what the executors staged for this sink."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class DeltaSinkWriter(SinkWriter):
    """Appends to or upserts into a Delta table, each commit carrying the app transaction."""

    sink: DeltaSink

    def __init__(self, sink: DeltaSink, ctx: WriteContext):
        super().__init__(sink, ctx)
        self.root = ctx.settings.table_path(sink.table)
        self.app_id = ctx.plan.app_id(sink.table)
        self.done: int | None = None  # the last batch committed, read once: after that, this writer commits them

    def committed(self, batch_id: int) -> bool:
        if self.done is None:
            self.done = lake.committed_batch(self.root, self.app_id)
            self.done = -1 if self.done is None else self.done
        return self.done >= batch_id

    def commit(self, staged: Staged, batch_id: int) -> bool:
        sink = self.sink
        if sink.mode == "append":
            if sink.table not in staged.staging.append_roots:
                return False  # committed before (a replayed batch): the executors wrote nothing for it
            files = staged.files.get(sink.table, [])
            wrote = lake.commit_files_once(self.root, files, self.app_id, batch_id, sink.schema, sink.partition_by)
            if not wrote:  # a replay (a direct plan stages before it knows): its files go
                for add, _ in files:
                    (self.root / add["path"]).unlink(missing_ok=True)
            elif sink.table in staged.retried:
                discard_uncommitted(self.root, staged.staging.token)
            rows = sum(json.loads(add["stats"])["numRecords"] for add, _ in files)
        else:
            if sink.table not in staged.staging.upserts:
                return False
            data = staged.rows.get(sink.table)
            data = unordered(data) if data is not None else (sink.schema.empty_table() if sink.schema is not None else None)
            if data is None:
                return False
            wrote = lake.merge_once(self.root, data, list(sink.keys), self.app_id, batch_id)
            rows = data.num_rows
        if wrote:
            self.done = batch_id
            self.ctx.count(sink.table, rows)
        return wrote

    def write(self, outputs: Outputs, batch_id: int) -> bool:
        sink = self.sink
        data = outputs_to_table(sink, *outputs.for_sink(sink))
        if data.num_columns == 0:
            return False  # nothing to infer a schema from yet; the batch has no rows for this sink
        if sink.mode == "append":
            wrote = lake.append_once(self.root, data, self.app_id, batch_id, sink.partition_by)
        else:
            wrote = lake.merge_once(self.root, data, list(sink.keys), self.app_id, batch_id,
                                    order_by=[c for c in ("seq", "part") if c in data.column_names])
        if wrote:
            self.ctx.count(sink.table, data.num_rows)
        return wrote


class DirectDeltaWriter(DeltaSinkWriter):
    """Direct plans: the decoded columns are the one Delta sink's rows already (no objects)."""

    sink: DeltaSink

    def write(self, outputs: Outputs, batch_id: int) -> bool:
        data = direct_rows(self.ctx.plan, self.sink, outputs.table)
        wrote = lake.append_once(self.root, data, self.app_id, batch_id, self.sink.partition_by)
        if wrote:
            self.ctx.count(self.sink.table, data.num_rows)
        return wrote


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

    def __init__(self, sink: TCPSink, ctx: WriteContext):
        super().__init__(sink, ctx)
        self.address = ctx.tcp_addresses.get(sink.name)
        self.marker = ctx.plan.checkpoint(ctx.settings) / f"tcp-{sink.name}.sent"
        self.in_doubt_log = self.marker.with_suffix(".in-doubt")
        self.sender = TCPSender(self.address, self.marker, f"TCP sink {sink.name!r} ({ctx.plan.name})") if self.address else None

    def write(self, outputs: Outputs, batch_id: int) -> bool:
        if self.sender is None:
            return False
        chosen, _ = outputs.for_sink(self.sink)
        if not chosen:
            return False
        sent = self._send_once(lambda: b"".join(encode_all(self.sink, chosen)), batch_id)
        self.ctx.count(f"tcp:{self.sink.name}", len(chosen))  # replays count too, as they always have
        return sent

    def commit(self, staged: Staged, batch_id: int) -> bool:
        rows = staged.rows.get("tcp:" + self.sink.name)
        if self.sender is None or rows is None or not rows.num_rows:
            return False
        encoded = unordered(rows).column("bytes")
        sent = self._send_once(lambda: b"".join(encoded.to_pylist()), batch_id)
        self.ctx.count(f"tcp:{self.sink.name}", len(encoded))
        return sent

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


QUARANTINE_KEYS = ("stream", "seq", "step")


class QuarantineWriter:
    """Writes a micro-batch's quarantine envelopes to the quarantine table, with the exact payloads:
    one row per (stream, seq, step). A payload its stream's decoder rejects is rejected by every query
    reading the stream (bronze and each app): the first query to write it keeps the row (its name is in
    `query`), the others insert nothing. Insert-only merge with the app transaction: exactly once."""

    def __init__(self, ctx: WriteContext):
        self.ctx = ctx
        self.path = ctx.settings.table_path(QUARANTINE_TABLE)

    def write(self, q: pa.Table, batch_id: int) -> bool:
        plan = self.ctx.plan
        if q.num_rows and q.column("payload").null_count:
            q = _with_landed_payloads(q, self.ctx.settings, plan.group)
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
        wrote = False
        # Once the table exists every batch commits, empty or not, so a replayed batch shows as skipped.
        if q.num_rows or lake.exists(self.path):
            seqs = pc.min_max(qtable.column("seq")) if q.num_rows else None
            prune = f"t.seq >= {seqs['min']} AND t.seq <= {seqs['max']}" if seqs else None
            wrote = lake.insert_new_once(self.path, qtable, QUARANTINE_KEYS, plan.app_id("quarantine"), batch_id,
                                         prune=prune)
        self.ctx.report.quarantined += q.num_rows
        return wrote

    def close(self) -> None:
        pass


def _with_landed_payloads(q: pa.Table, settings: Settings, group: str) -> pa.Table:
    """Messages quarantined after the pre stage travel without their payload (it is not shuffled):
    take it from the landing log, so every quarantine row holds the exact bytes that failed."""
    from transforms.landing import payloads_for

    payloads = q.column("payload").to_pylist()
    seqs = q.column("seq").to_pylist()
    landed = payloads_for(settings, group, [s for s, p in zip(seqs, payloads) if p is None])
    filled = [p if p is not None else landed.get(s) for s, p in zip(seqs, payloads)]
    return q.set_column(q.schema.get_field_index("payload"), "payload", pa.array(filled, pa.binary()))


# -- building the writers of a query -----------------------------------------------------------------
# The writer of each kind of sink of transforms.api.
WRITERS: dict[type, type[SinkWriter]] = {DeltaSink: DeltaSinkWriter, TCPSink: TCPSinkWriter}


def make_sink_writers(ctx: WriteContext) -> list[SinkWriter]:
    """One writer per sink of the plan, in the plan's order."""
    plan = ctx.plan
    if plan.mode is QueryMode.DIRECT:
        (sink,) = plan.sinks
        return [DirectDeltaWriter(sink, ctx)]
    writers = []
    for sink in plan.sinks:
        writer = WRITERS.get(type(sink))
        if writer is None:
            raise TypeError(f"query {plan.name!r}: no writer for sink {sink!r} (known: {[t.__name__ for t in WRITERS]})")
        writers.append(writer(sink, ctx))
    return writers


# -- TCP sinks: addresses and connections ---------------------------------------------------------------
OFF = "off"


def resolve_tcp_sinks(app: str, sinks, tcp_addresses: Mapping[str, str] | None = None,
                      environ: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """Each TCP sink's address ("HOST:PORT"), or None for a sink that is off.

    From `tcp_addresses`, else `EVENTIDE_SINK_<NAME>=off`, else the sink's `address`, else
    `EVENTIDE_SINK_<NAME>`. A sink without an address is off only when declared `optional=True`:
    otherwise ConfigError, before any Spark work, so outputs are never dropped unnoticed.
    """
    given = tcp_addresses or {}
    resolved: dict[str, str | None] = {}
    for sink in sinks:
        if not isinstance(sink, TCPSink):
            continue
        var = f"EVENTIDE_SINK_{sink.name.upper()}"
        env = environ.get(var, "").strip()
        if given.get(sink.name):
            address, origin = given[sink.name], f"tcp_addresses[{sink.name!r}]"
        elif env.lower() == OFF:
            address, origin = OFF, var
        elif sink.address:
            address, origin = sink.address, "address=..."
        else:
            address, origin = env or None, var
        if address is not None and address.strip().lower() == OFF:
            resolved[sink.name] = None
            continue
        if address is None:
            if sink.optional:
                resolved[sink.name] = None
                continue
            raise ConfigError(
                f"TCP sink {sink.name!r} of app {app!r} has no address: set {var}=HOST:PORT (or pass "
                f"address=...), or declare it TCPSink(..., optional=True) to send only when that variable is set"
            )
        _, _, port = address.rpartition(":")
        if not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"TCP sink {sink.name!r} of app {app!r}: {origin}={address!r} is not HOST:PORT")
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
