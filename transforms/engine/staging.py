"""Executor-side writes: each task of a micro-batch stages its share of the batch.

Appends (the rows of append Delta sinks) become Parquet files written by the task straight into the
table's folder, under names no commit refers to yet; the task sends the driver one small row per file
(path, size, partition values, statistics, schema). Only what is bounded or must be ordered goes to
the driver as Arrow: quarantine rows, the upsert rows (reduced to the last per key in the task), the
TCP sinks' encoded outputs, and receive times. The driver then commits each table's files in one Delta
transaction carrying the batch's app transaction (sinks.py, lake.commit_files_once), so the rows become
visible once, or never. Files of an attempt that is not committed (a replayed batch, a failed task, a
crash) are deleted: the driver journals each attempt's token before the Spark job (`StagingJournal`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import pickle
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from transforms import lake
from transforms.api import DeltaSink, TCPSink, UserFunctionError, to_record
from transforms.engine.envelope import DECODED_PREFIX
from transforms.engine.plan import QueryMode, QueryPlan
from transforms.files import write_text_atomic

# What each task returns: one row per staged file or per table of rows for the driver.
FILE, ROWS = "file", "rows"
STAGED = pa.schema([("what", pa.string()), ("sink", pa.string()), ("attempt", pa.int32()),
                    ("data", pa.binary()), ("schema", pa.binary())])
QUARANTINE_ROWS = "\x00quarantine"
RECEIVE_TIMES = "\x00receive_times"
ORDER = ("\x00seq", "\x00part")  # an upsert's or TCP sink's rows carry their input's order to the driver
QUARANTINE_COLUMNS = ("stream", "seq", "receive_time", "connection", "step", "reason", "payload")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
FILE_PREFIX = "eventide-"


@dataclass(frozen=True)
class StagingPlan:
    """What the tasks of one micro-batch need (pickled to the executors)."""

    plan: QueryPlan
    batch_id: int | None  # None: staged inside the query's own stage (`FusedStage`), before the batch is known
    token: str  # this attempt's (or query run's) id, in every file name: the journal finds uncommitted files by it
    append_roots: dict  # append sink table -> absolute table folder, for the sinks that still need this batch
    upserts: frozenset  # upsert sink tables that still need this batch
    tcp_sinks: frozenset  # TCP sinks that are on
    all_receive_times: bool  # every row's receive time (per-row latencies), else only the oldest


def new_token() -> str:
    return uuid.uuid4().hex[:16]


class StageBatch:
    """The mapInArrow function of a micro-batch's staging (envelopes in, `STAGED` rows out)."""

    def __init__(self, staging: StagingPlan):
        self.staging = staging

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        where = (task.stageId(), task.partitionId(), task.attemptNumber()) if task else (0, 0, 0)
        batches = list(batches)
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        rows = stage_table(self.staging, table, *where)
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=STAGED)


class FusedStage:
    """A direct plan's pre stage and its staging in one Python pass (mapInArrow): landing rows in,
    `STAGED` rows out. Saves the decoded rows a trip from Python to the JVM and back (bronze)."""

    def __init__(self, pre_stage, staging: StagingPlan):
        self.pre_stage, self.stage = pre_stage, StageBatch(staging)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.stage(self.pre_stage(batches))


def stage_table(staging: StagingPlan, table: pa.Table, stage: int = 0, task: int = 0, attempt: int = 0) -> list[dict]:
    """One task's share of the batch, staged: files written, and the rows the driver needs."""
    plan = staging.plan
    if table.num_rows:
        table = table.sort_by([("seq", "ascending"), ("part", "ascending")])
    kind = table.column("kind")
    out: list[dict] = []

    def ship(sink: str, rows: pa.Table) -> None:
        out.append({"what": ROWS, "sink": sink, "attempt": attempt, "data": to_ipc(rows), "schema": None})

    quarantined = of_kind(table, kind, "quarantine")
    if quarantined.num_rows:
        ship(QUARANTINE_ROWS, quarantined.select(list(QUARANTINE_COLUMNS)))
    if table.num_rows:  # shipped by every task with rows (the driver tells an empty batch by it)
        times = table.column("receive_time").drop_null()
        if len(times) and not staging.all_receive_times:
            times = pa.chunked_array([[pc.min(times).as_py()]], times.type)
        ship(RECEIVE_TIMES, pa.table({"receive_time": times}))
    outs = of_kind(table, kind, "out")
    if not outs.num_rows:
        return out
    outputs = Outputs(outs)
    batch = f"b{staging.batch_id}" if staging.batch_id is not None else f"s{stage}"
    name = f"{FILE_PREFIX}{staging.token}-{batch}-t{task}-a{attempt}-{uuid.uuid4().hex[:8]}"
    for sink in plan.sinks:
        if isinstance(sink, TCPSink):
            if sink.name in staging.tcp_sinks:
                chosen, meta = outputs.for_sink(sink)
                if chosen:
                    ship("tcp:" + sink.name, _ordered(pa.table({"bytes": pa.array(encode_all(sink, chosen), pa.binary())}), meta))
            continue
        if sink.table in staging.append_roots:
            data = direct_rows(plan, sink, outs) if plan.mode is QueryMode.DIRECT else outputs_to_table(sink, *outputs.for_sink(sink))
            for add, schema in write_files(data, Path(staging.append_roots[sink.table]), sink.partition_by, name):
                out.append({"what": FILE, "sink": sink.table, "attempt": attempt, "data": json.dumps(add).encode(),
                            "schema": schema.serialize().to_pybytes()})
        elif sink.table in staging.upserts:
            chosen, meta = outputs.for_sink(sink)
            data = outputs_to_table(sink, chosen, meta)
            if data.num_rows:
                ship(sink.table, lake.last_per_key(_ordered(data, meta), list(sink.keys), []))
    return out


# -- a batch's outputs as sink rows (both write paths) ------------------------------------------------
METADATA_COLUMNS = ("seq", "part", "stream", "receive_time", "connection")


def of_kind(table: pa.Table, kind: pa.ChunkedArray, value: str) -> pa.Table:
    return table.filter(pc.fill_null(pc.equal(kind, value), False))


class Outputs:
    """A micro-batch's "out" envelopes in order; the messages are unpickled on first use."""

    def __init__(self, table: pa.Table):
        self.table = table

    @cached_property
    def messages(self) -> list:
        return [pickle.loads(b) for b in self.table.column("msg").to_pylist()]

    @cached_property
    def metadata(self) -> EnvelopeColumns:
        return EnvelopeColumns(self.table)

    def for_sink(self, sink: DeltaSink | TCPSink) -> tuple[list, EnvelopeColumns]:
        """The outputs `sink` accepts, and the envelope columns of each."""
        sel = [i for i, out in enumerate(self.messages) if sink.wants(out)]
        if len(sel) == len(self.messages):  # the common case: the sink takes every output
            return self.messages, self.metadata
        return [self.messages[i] for i in sel], EnvelopeColumns(self.table, pa.array(sel, pa.int64()))


class EnvelopeColumns(Mapping):
    """The envelope's metadata columns (METADATA_COLUMNS) of some outputs: `[name]` as a Python list,
    made on first use, or `arrow(name)` as an Arrow array (no Python objects: receive_time's
    datetimes cost more than the rest of a batch's rows)."""

    def __init__(self, table: pa.Table, rows: pa.Array | None = None):
        self.table, self.rows, self._lists = table, rows, {}

    def arrow(self, name: str) -> pa.ChunkedArray:
        column = self.table.column(name)
        return column if self.rows is None else column.take(self.rows)

    def __getitem__(self, name: str) -> list:
        if name not in METADATA_COLUMNS:
            raise KeyError(name)
        if name not in self._lists:
            self._lists[name] = self.arrow(name).to_pylist()
        return self._lists[name]

    def __iter__(self):
        return iter(METADATA_COLUMNS)

    def __len__(self) -> int:
        return len(METADATA_COLUMNS)


def direct_rows(plan: QueryPlan, sink: DeltaSink, outs: pa.Table) -> pa.Table:
    """A direct plan's sink rows: the decoded columns and the envelope's, in the sink's schema."""
    decoded = set(plan.decoded_schema.names)
    return pa.table(
        {f.name: outs.column(DECODED_PREFIX + f.name if f.name in decoded else f.name).cast(f.type) for f in sink.schema},
        schema=sink.schema,
    )


def outputs_to_table(sink: DeltaSink, outs: list, meta: EnvelopeColumns) -> pa.Table:
    """A Delta sink's outputs as rows of its schema (or inferred), with the metadata columns it asks for."""
    records = [to_record(o) for o in outs]  # not changed below: a dict output is its own record
    if sink.schema is not None:
        # Column by column: a metadata column the sink asks for comes from the envelope, over the output's.
        columns = {n: meta.arrow(n) if n in sink.metadata else [r.get(n) for r in records] for n in sink.schema.names}
        try:
            return pa.Table.from_pydict(columns, schema=sink.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise UserFunctionError(
                f"outputs for Delta sink {sink.table!r} do not fit its schema ({e}); first output: {outs[0]!r}"
            ) from None
    records = [dict(r) for r in records]
    for col in sink.metadata:
        for r, v in zip(records, meta[col]):
            r[col] = v
    if not records:
        return pa.table({})
    return pa.Table.from_pylist(records)


def encode_all(sink: TCPSink, outs: list) -> list[bytes]:
    from transforms.framing import DEFAULT_FRAMING

    return [DEFAULT_FRAMING.encode(sink.encoder(o)) if sink.framed else sink.encoder(o) for o in outs]


def _ordered(data: pa.Table, meta: dict[str, list]) -> pa.Table:
    return data.append_column(ORDER[0], pa.array(meta["seq"], pa.int64())).append_column(
        ORDER[1], pa.array(meta["part"], pa.int32()))


def unordered(rows: pa.Table) -> pa.Table:
    """Rows shipped by the tasks, in their inputs' order, without the order columns."""
    if rows.num_rows:
        rows = rows.sort_by([(ORDER[0], "ascending"), (ORDER[1], "ascending")])
    return rows.drop_columns(list(ORDER))


# -- Arrow IPC between tasks and driver ----------------------------------------------------------------
def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


# -- Parquet files and their Delta statistics ----------------------------------------------------------
def write_files(data: pa.Table, root: Path, partition_by, name: str) -> list[tuple[dict, pa.Schema]]:
    """Write `data` as Parquet files under the table folder `root`, one per partition value; returns
    each file's add action (as a dict for `lake.commit_files_once`) and the schema of its rows
    (partition columns included, as in the table)."""
    if not data.num_rows:
        return []
    # An inferred column with no value yet has no Delta type: leave it out (it reads as null).
    data = data.drop_columns([f.name for f in data.schema if pa.types.is_null(f.type)])
    parts = list(partition_by or ())
    groups = [({}, data)] if not parts else _partition_groups(data, parts)
    written = []
    for i, (values, rows) in enumerate(groups):
        rel_dir = "/".join(f"{c}={HIVE_NULL if v is None else quote(v, safe='')}" for c, v in values.items())
        rel = f"{rel_dir}/{name}-{i}.parquet" if rel_dir else f"{name}-{i}.parquet"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        file_rows = rows.drop_columns(parts) if parts else rows
        pq.write_table(file_rows, path, compression="snappy")
        add = {
            "path": rel,  # delta-rs URI-encodes it in the log
            "size": path.stat().st_size,
            "partition_values": values,
            "modification_time": int(time.time() * 1000),
            "stats": json.dumps(file_stats(file_rows), ensure_ascii=False),
        }
        written.append((add, rows.schema))
    return written


def _partition_groups(data: pa.Table, parts: list[str]) -> list[tuple[dict, pa.Table]]:
    keys = data.select(parts).group_by(parts).aggregate([]).to_pylist()
    groups = []
    for key in keys:
        mask = None
        for c in parts:
            col = data.column(c)
            m = pc.is_null(col) if key[c] is None else pc.fill_null(pc.equal(col, pa.scalar(key[c], col.type)), False)
            mask = m if mask is None else pc.and_(mask, m)
        groups.append(({c: partition_value(key[c]) for c in parts}, data.filter(mask)))
    return groups


def partition_value(v) -> str | None:
    """A Delta partition value: the value as text (dates ISO, booleans lower case), null as None."""
    if v is None:
        return None
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S.%f")
    return str(v)


STRING_STATS_MAX = 64  # longer strings get no min/max (a truncated max would be wrong for skipping)


def file_stats(table: pa.Table) -> dict:
    """Delta statistics of one file: numRecords, and per column nullCount, minValues, maxValues (for
    the types that files are skipped by: numbers, strings, dates, timestamps, booleans)."""
    mins, maxs, nulls = {}, {}, {}
    for f in table.schema:
        col = table.column(f.name)
        nulls[f.name] = col.null_count
        t = f.type
        if col.null_count == len(col) or not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
                                                or pa.types.is_large_string(t) or pa.types.is_date(t)
                                                or pa.types.is_timestamp(t)):
            continue
        mm = pc.min_max(col)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if pa.types.is_floating(t) and (pc.any(pc.is_nan(col)).as_py() or not (math.isfinite(lo) and math.isfinite(hi))):
            continue
        if isinstance(lo, str) and max(len(lo), len(hi)) > STRING_STATS_MAX:
            continue
        mins[f.name], maxs[f.name] = _stat(lo, t), _stat(hi, t)
    return {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _stat(v, t: pa.DataType):
    if isinstance(v, dt.datetime):
        text = v.strftime("%Y-%m-%dT%H:%M:%S.%f")
        return text + "Z" if t.tz else text
    if isinstance(v, dt.date):
        return v.isoformat()
    return v


# -- attempts that were not committed -------------------------------------------------------------------
class StagingJournal:
    """One file per staged attempt under the query's checkpoint, written before the Spark job and
    removed once every table committed (or refused) the attempt. A journal left behind (a crash) names
    the token and tables whose uncommitted files are deleted on the next start."""

    def __init__(self, checkpoint: Path):
        self.folder = checkpoint / "staging"

    def open(self, token: str, batch_id: int, roots: list[str]) -> Path:
        entry = self.folder / f"{batch_id}-{token}.json"
        write_text_atomic(entry, json.dumps({"token": token, "batch_id": batch_id, "roots": roots}))
        return entry

    def close(self, entry: Path) -> None:
        entry.unlink(missing_ok=True)

    def pending(self) -> bool:
        """Whether a crash left an attempt to clean up (recover does it when the writer starts)."""
        return self.folder.is_dir() and any(self.folder.glob("*.json"))

    def recover(self) -> int:
        """Delete the files of attempts that a crash left uncommitted; returns how many."""
        removed = 0
        for entry in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else ():
            note = json.loads(entry.read_text())
            for root in note["roots"]:
                removed += discard_uncommitted(Path(root), note["token"])
            entry.unlink()
        return removed


def discard_uncommitted(root: Path, token: str) -> int:
    """Delete the files of attempt `token` under table folder `root` that the table does not refer to."""
    mine = list(root.rglob(f"{FILE_PREFIX}{token}-*.parquet")) if root.is_dir() else []
    if not mine:
        return 0
    referenced = lake.file_paths(root) if lake.exists(root) else set()
    removed = 0
    for p in mine:
        if p.relative_to(root).as_posix() not in referenced:
            p.unlink(missing_ok=True)
            removed += 1
    return removed


class InProcessBatch:
    """A micro-batch already computed, as foreachBatch would hand it to the writer, for running the
    writer without Spark (profiles, tests): `mapInArrow` runs the function here, one call per task."""

    def __init__(self, table: pa.Table, tasks: int = 1):
        self.table, self.tasks = table, max(1, tasks)

    def toArrow(self) -> pa.Table:  # Spark's names
        return self.table

    def mapInArrow(self, fn, schema) -> InProcessBatch:
        step = -(-self.table.num_rows // self.tasks) or 1
        parts = [self.table.slice(i, step) for i in range(0, max(self.table.num_rows, 1), step)]
        out = [b for part in parts for b in fn(iter(part.to_batches()))]
        return InProcessBatch(pa.Table.from_batches(out, schema=STAGED if not out else out[0].schema))
