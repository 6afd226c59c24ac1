"""The stateful step (transformWithStateInPandas).

Each key's messages go in sequence order through the pipeline's state computation, which sees the
key's state object; the state objects of a key (one per state class) are pickled together in one
RocksDB value. Outputs leave as "out" envelopes; quarantine envelopes pass through untouched.

Two layouts of the same step (a checkpoint keeps the one it started with, see state_layout.py):
- `KeyedStateProcessor` groups by key: one Spark group per key per batch, the state in a value
  state. The reference form, and the one for timers (Spark's timers belong to a group).
- `BucketedStateProcessor` groups by a hash bucket of the key: one group per bucket per batch, each
  key's state in a map state under it. Spark's per-group costs (a pandas frame in, one out, its
  Arrow conversion, the implicit-key calls) were most of a small batch: measured 1.6 ms a key.
  Its input arrives packed (`pack_by_bucket`): one row per bucket per Arrow batch holding that
  bucket's envelopes as Arrow IPC. PySpark 4.1 hands transformWithStateInPandas its input row by row
  in Python (itertuples, then a DataFrame built from the tuples), which was most of a one-key
  query's time (1M log lines: ~8 s on one core); packed, it sees a few rows per batch.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from transforms.api import Context, Emit, StateComputation, to_record
from transforms.engine.close_windows import window_steps
from transforms.engine.envelope import (
    DECODED_PREFIX,
    ENVELOPE,
    QUARANTINE_KEY,
    Quarantined,
    call_user,
    dumps,
    frame_to_records,
    spark_frame,
)
from transforms.engine.plan import QueryMode, QueryPlan
from transforms.engine.sink_rows import PACKED_ROWS, AllSinkRowsFn, Snapshots
from transforms.engine.stages import apply_steps
from transforms.engine.state_layout import STATE_BUCKETS, StateLayout


# -- the processor ---------------------------------------------------------------------------------
class KeyedStateProcessor(StatefulProcessor):
    """Holds each key's state objects (one per state class) pickled in a RocksDB value state."""

    def __init__(self, plan: QueryPlan, fail_fast: bool, fold: AllSinkRowsFn | None = None):
        self.plan = plan
        self.fail_fast = fail_fast
        self.fold = fold
        self.closable = bool(window_steps(plan))  # only a window step gets close records

    def init(self, handle) -> None:
        self.handle = handle
        self.value = handle.getValueState("states", StructType([StructField("blob", BinaryType(), True)]),
                                          self.plan.state_ttl_ms)  # None: no TTL, the state never expires

    def _load(self) -> dict:
        row = self.value.get()  # None when the key has no state yet (one state-store call, not two)
        return pickle.loads(row[0]) if row is not None else {}

    def _context(self, key: str, timer_values, timers: bool) -> Context:
        return Context(key, _safe(timer_values.getCurrentProcessingTimeInMs),
                       _safe(timer_values.getCurrentWatermarkInMs), handle=self.handle if timers else None)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        (key,) = key
        frames = list(rows)
        df = frames[0].reset_index(drop=True) if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        if key == QUARANTINE_KEY:
            yield df[ENVELOPE.names] if self.fold is None else _passed_on(_rows(self.fold), df, 0, len(df)).frame(None, df)
            return
        seq = df["seq"].to_numpy()
        if not (len(seq) < 2 or (seq[1:] > seq[:-1]).all()):  # usually already in order: skip the sort
            df = df.take(input_order(df)).reset_index(drop=True)
        states = self._load()
        ctx = self._context(key, timerValues, self.plan.timers)
        columns = [DECODED_PREFIX + n for n in self.plan.decoded_schema.names] if self.plan.mode is QueryMode.COLUMNAR else None
        out = _run_key(df, states, self.plan.branches, self.fail_fast, columns, ctx, self.closable, self.fold)
        self.value.update((dumps(states),))
        yield out

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        (key,) = key
        states = self._load()
        ctx = self._context(key, timerValues, True)
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        out = _rows(self.fold)
        fired = _fire_each(branch_plans(self.plan.branches), lambda sc: sc.on_timer, self.fail_fast,
                           lambda sc: call_user(f"{sc.name} (on_timer)", self.fail_fast, sc.fire_timer, key,
                                                _state_for(states, sc), expiry, ctx))
        for bno, outs in fired:
            if isinstance(outs, Quarantined):  # no input message: a quarantine row with sequence -1
                out.add("quarantine", -1, len(out), bno, None, outs.step, outs.reason, None)
            else:
                for o in outs:
                    out.output(-1, len(out), bno, o, None)
        self.value.update((dumps(states),))
        yield out.frame(key, None)

    def close(self) -> None:
        pass


def input_order(df: pd.DataFrame, keys: np.ndarray | None = None) -> np.ndarray:
    """The positions of a group's input envelopes in the order the state step takes them: key by key
    (`keys`: codes of the key column, None for a group of one key), each key's by the landing sequence
    of the input they answer, then by the key of the previous level that produced them (a later
    level: one input's outputs from several keys, key by key; none at the first level, and none before
    the others), then by their place among that key's outputs. A total order, however Spark's shuffle
    delivered the rows, so a replayed batch is decided as the first time."""
    origins, _ = pd.factorize(df["origin"], sort=True)  # missing -> -1: first
    order = (df["part"].to_numpy(), origins, df["seq"].to_numpy())
    return np.lexsort(order if keys is None else (*order, keys))


class BucketedStateProcessor(StatefulProcessor):
    """Grouped by `bucket` (a hash of the key, see `with_buckets`): each key's rows of the bucket in
    sequence order through its state, the key's state objects pickled in a map state entry. Only for
    plans without timers."""

    def __init__(self, plan: QueryPlan, fail_fast: bool, fold: AllSinkRowsFn | None = None):
        if plan.timers:
            raise ValueError(f"{plan.name}: timers belong to a Spark group: use KeyedStateProcessor")
        self.plan = plan
        self.fail_fast = fail_fast
        self.fold = fold
        self.closable = bool(window_steps(plan))  # only a window step gets close records

    def init(self, handle) -> None:
        self.states = handle.getMapState("states", StructType([StructField("key", StringType(), False)]),
                                         StructType([StructField("blob", BinaryType(), True)]),
                                         self.plan.state_ttl_ms)  # per entry: each user key expires alone

    def handleInputRows(self, bucket, rows, timerValues) -> Iterator[pd.DataFrame]:
        df = unpack(rows)
        codes, _ = pd.factorize(df["key"], sort=False)
        order = input_order(df, codes)
        if (order[1:] < order[:-1]).any():  # often in order already (one key, or keys apart): no copy
            df = df.take(order)
            df.index = pd.RangeIndex(len(df))
            codes = codes[order]
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]).tolist()
        ends = starts[1:] + [len(df)]
        rows_in = _Input(df, self.closable)
        keys = df["key"].tolist()
        now, watermark = _safe(timerValues.getCurrentProcessingTimeInMs), _safe(timerValues.getCurrentWatermarkInMs)
        columns = [DECODED_PREFIX + n for n in self.plan.decoded_schema.names] if self.plan.mode is QueryMode.COLUMNAR else None
        out = _rows(self.fold)
        for lo, hi in zip(starts, ends):
            key = keys[lo]
            if key == QUARANTINE_KEY:
                if self.fold is None:
                    yield df.iloc[lo:hi][ENVELOPE.names]
                else:
                    _passed_on(out, df, lo, hi)
                continue
            found = self.states.getValue((key,))
            states = pickle.loads(found[0]) if found is not None else {}
            _run_rows(out, rows_in, lo, hi, states, self.plan.branches, self.fail_fast, columns,
                      Context(key, now, watermark))
            self.states.updateValue((key,), (dumps(states),))
            if self.fold is not None and len(out) >= _FOLDED_ROWS_HELD:  # a bucket's outputs held a part at a time
                yield out.frame(None, df)
                out = _rows(self.fold)
        yield out.frame(None, df)

    def close(self) -> None:
        pass


def with_buckets(env):
    """The envelopes with the `bucket` column BucketedStateProcessor is grouped by."""
    from pyspark.sql import functions as F

    return env.withColumn("bucket", F.pmod(F.xxhash64("key"), F.lit(STATE_BUCKETS)).cast("int"))


PACKED = pa.schema([("bucket", pa.int32()), ("rows", pa.binary())])


def pack_by_bucket(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow: envelopes with their bucket in, one row per bucket per batch out, holding the
    bucket's envelopes (in their order, without the bucket column) as an Arrow IPC stream."""
    for batch in batches:
        if not batch.num_rows:
            continue
        buckets = batch.column("bucket").to_numpy(zero_copy_only=False)
        order = np.argsort(buckets, kind="stable")  # stable: each bucket's rows keep their order
        sorted_buckets = buckets[order]
        table = pa.Table.from_batches([batch.drop_columns(["bucket"])]).take(pa.array(order))
        starts = np.flatnonzero(np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]])
        ends = np.r_[starts[1:], len(order)]
        packed = []
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table.slice(lo, hi - lo))
            packed.append(sink.getvalue().to_pybytes())
        yield pa.RecordBatch.from_arrays([pa.array(sorted_buckets[starts], pa.int32()), pa.array(packed, pa.binary())],
                                         schema=PACKED)


def unpack(frames: Iterator[pd.DataFrame]) -> pd.DataFrame:
    """A bucket's packed rows as one frame of envelopes, converted as Spark converts its input (time
    stamps tz-naive in UTC, the session's zone; dates as datetime.date)."""
    tables = [pa.ipc.open_stream(blob).read_all() for frame in frames for blob in frame["rows"]]
    return spark_frame(tables[0] if len(tables) == 1 else pa.concat_tables(tables))


def stateful_step(env, plan: QueryPlan, fail_fast: bool, layout: StateLayout, fold: AllSinkRowsFn | None = None):
    """The envelopes through the plan's stateful step (one transformWithStateInPandas operator), in the
    checkpoint's `layout`. A multi-level pipeline has one per level (engine/levels.py).

    With `fold` (the last level's, when every sink's columns are known before the batch: sinks.BatchWriter),
    the step makes the sinks' rows itself, from the outputs it holds, instead of pickling each output for
    a pass of its own that unpickles it: each group's rows leave as Arrow IPC (PACKED_ROWS)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if layout is StateLayout.BUCKET:
        packed = with_buckets(env).mapInArrow(pack_by_bucket, from_arrow_schema(PACKED))
        grouped, processor = packed.groupBy("bucket"), BucketedStateProcessor(plan, fail_fast, fold)
    else:
        grouped, processor = env.groupBy("key"), KeyedStateProcessor(plan, fail_fast, fold)
    return grouped.transformWithStateInPandas(
        statefulProcessor=processor,
        outputStructType=from_arrow_schema(ENVELOPE if fold is None else PACKED_ROWS),
        outputMode="Append",
        timeMode=plan.spark_time_mode.value,
    )




def _safe(fn: Callable) -> int:
    try:
        return int(fn())
    except Exception:
        return 0


def _state_for(states: dict, sc: StateComputation):
    st = states.get(sc.state_name)
    if st is None:
        st = states[sc.state_name] = sc.state()
    return st


class _Rows:
    """Output envelopes of one key, column by column; `src` is the input row each came from."""

    __slots__ = ("kind", "seq", "part", "branch", "msg", "step", "reason", "src")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, [])

    def add(self, kind, seq, part, branch, msg, step, reason, src) -> None:
        self.kind.append(kind)
        self.seq.append(seq)
        self.part.append(part)
        self.branch.append(branch)
        self.msg.append(msg)
        self.step.append(step)
        self.reason.append(reason)
        self.src.append(src)

    def output(self, seq, part, branch, obj, src) -> None:
        """An output of input row `src`: pickled now, so a later change to the object does not reach it."""
        self.add("out", seq, part, branch, dumps(obj), None, None, src)

    def __len__(self) -> int:
        return len(self.kind)

    def frame(self, key: str | None, src: pd.DataFrame | None) -> pd.DataFrame:
        """The envelopes as a frame; `key` None: each row's key is its input row's (several keys)."""
        n = len(self.kind)
        if n == 0:
            return _EMPTY_ENVELOPE.copy()
        data = {
            "kind": self.kind,
            "seq": np.asarray(self.seq, dtype=np.int64),
            "part": np.asarray(self.part, dtype=np.int32),
            "branch": np.asarray(self.branch, dtype=np.int32),
            "key": [key] * n,
            "msg": self.msg,
        }
        if src is not None and n:
            idx = np.asarray(self.src, dtype=np.int64)
            if key is None:
                data["key"] = src["key"].array.take(idx)
            for c in ("stream", "receive_time", "connection"):
                data[c] = src[c].array.take(idx)  # typed take: no per-row Timestamp objects
            payloads = src["payload"].array
            data["payload"] = [payloads[i] if k == "quarantine" else None for i, k in zip(self.src, self.kind)]
        else:
            data["stream"] = [None] * n
            data["receive_time"] = pd.array([pd.NaT] * n, dtype="datetime64[us, UTC]")
            data["connection"] = [None] * n
            data["payload"] = [None] * n
        data["step"] = self.step
        data["reason"] = self.reason
        data["origin"] = [None] * n  # outputs: the re-key stage names their key as the next level's origin
        return pd.DataFrame(data, columns=ENVELOPE.names)


# Spark rejects float64 columns where it expects strings: an empty frame must keep the right types.
_EMPTY_ENVELOPE = ENVELOPE.empty_table().to_pandas()
_EMPTY_PACKED_ROWS = PACKED_ROWS.empty_table().to_pandas()
_RECEIVE_TIME = ENVELOPE.field("receive_time").type
_FOLDED_ROWS_HELD = 262_144  # outputs a bucket's folded rows hold before they leave (between keys)


class _FoldedRows:
    """The sinks' pass folded into the keyed step (stateful_step's `fold`), in _Rows' place: each output
    is snapshot for the sinks when it is returned (sink_rows.Snapshots), and `frame` gives the sinks'
    rows of the outputs and quarantine envelopes held, as Arrow IPC (PACKED_ROWS)."""

    __slots__ = ("fold", "snapshots", "seq", "part", "src", "q_seq", "q_step", "q_reason", "q_src")

    def __init__(self, fold: AllSinkRowsFn) -> None:
        self.fold = fold
        self.snapshots = Snapshots(fold.sinks)
        self.seq, self.part, self.src = [], [], []  # each output's
        self.q_seq, self.q_step, self.q_reason, self.q_src = [], [], [], []  # each quarantine row's

    def output(self, seq, part, branch, obj, src) -> None:
        self.snapshots.add(obj)
        self.seq.append(seq)
        self.part.append(part)
        self.src.append(src)

    def add(self, kind, seq, part, branch, msg, step, reason, src) -> None:
        if kind != "quarantine":  # outputs come through `output`
            raise ValueError(f"folded rows take outputs through output(), not add({kind!r})")
        self.q_seq.append(seq)
        self.q_step.append(step)
        self.q_reason.append(reason)
        self.q_src.append(src)

    def __len__(self) -> int:
        return len(self.seq) + len(self.q_seq)

    def frame(self, key: str | None, src: pd.DataFrame | None) -> pd.DataFrame:
        if not len(self):
            return _EMPTY_PACKED_ROWS.copy()
        outputs = pa.table({"seq": pa.array(self.seq, pa.int64()), "part": pa.array(self.part, pa.int32()),
                            **_landing_columns(src, self.src)})
        quarantined = pa.table({"seq": pa.array(self.q_seq, pa.int64()), **_landing_columns(src, self.q_src),
                                "step": pa.array(self.q_step, pa.string()), "reason": pa.array(self.q_reason, pa.string()),
                                "payload": pa.array([None if src is None else src["payload"].iat[i] for i in self.q_src],
                                                    pa.binary())})
        chunks = [self.snapshots.done(outputs)] if len(self.snapshots) else []
        return pd.DataFrame({"rows": self.fold.packed_rows(quarantined, chunks)}, columns=PACKED_ROWS.names, dtype=object)


def _landing_columns(src: pd.DataFrame | None, rows) -> dict[str, pa.Array]:
    """The landing metadata (stream, receive_time, connection) of input rows `rows` of `src` (None: a
    timer's outputs, which answer no input)."""
    n = len(rows)
    if src is None:
        return {"stream": pa.nulls(n, pa.string()), "receive_time": pa.nulls(n, _RECEIVE_TIME),
                "connection": pa.nulls(n, pa.string())}
    idx = np.asarray(rows, dtype=np.int64)
    return {"stream": pa.array(src["stream"].to_numpy(dtype=object)[idx], pa.string()),
            "receive_time": pa.array(src["receive_time"].to_numpy()[idx], from_pandas=True).cast(_RECEIVE_TIME),
            "connection": pa.array(src["connection"].to_numpy(dtype=object)[idx], pa.string())}


def _rows(fold: AllSinkRowsFn | None) -> _Rows | _FoldedRows:
    return _Rows() if fold is None else _FoldedRows(fold)


def _passed_on(out: _Rows | _FoldedRows, df: pd.DataFrame, lo: int, hi: int) -> _Rows | _FoldedRows:
    """Quarantine envelopes lo..hi of `df` (they pass the stateful step untouched) added to `out`."""
    for i in range(lo, hi):
        out.add("quarantine", int(df["seq"].iat[i]), int(df["part"].iat[i]), int(df["branch"].iat[i]), None,
                df["step"].iat[i], df["reason"].iat[i], i)
    return out


class _Input:
    """One group's input rows (sorted: each key's rows together, in sequence order) as lists."""

    __slots__ = ("df", "seqs", "parts", "branch", "msgs", "closes")

    def __init__(self, df: pd.DataFrame, closable: bool = True) -> None:
        self.df = df
        self.seqs = df["seq"].tolist()
        self.parts = df["part"].tolist()
        self.branch = df["branch"].tolist()
        self.msgs = df["msg"].tolist()
        # Rows that are close records (engine/close_windows.py), by position: only a plan with a window
        # step gets any, so the others skip the scan (it is per group, per batch).
        self.closes = set(np.flatnonzero(df["kind"].to_numpy() == "close").tolist()) if closable else frozenset()


def _run_key(df: pd.DataFrame, states: dict, branches: tuple, fail_fast: bool, columns: list[str] | None = None,
             ctx: Context | None = None, closable: bool = True, fold: AllSinkRowsFn | None = None) -> pd.DataFrame:
    """Apply one key's messages (sorted by sequence) to its state: its output envelopes (with `fold`, the
    sinks' rows instead)."""
    key = df["key"].iat[0]
    out = _rows(fold)
    _run_rows(out, _Input(df, closable), 0, len(df), states, branches, fail_fast, columns, ctx or Context(key))
    return out.frame(key, df)


def _run_rows(out: _Rows, rows: _Input, lo: int, hi: int, states: dict, branches: tuple, fail_fast: bool,
              columns: list[str] | None, ctx: Context) -> None:
    """Apply rows lo..hi (one key's, in sequence order) to the key's state; runs of one batch-form
    branch go together. Outputs go to `out`, naming their input row by its position in `rows`."""
    df, seqs, parts, branch_col, msgs, closes = rows.df, rows.seqs, rows.parts, rows.branch, rows.msgs, rows.closes
    plans = branch_plans(branches)
    i = lo
    while i < hi:
        if i in closes:
            ctx.seq, ctx.row = seqs[i], (df, i)
            _close_at_end(out, seqs[i], i, plans, states, fail_fast, ctx)
            i += 1
            continue
        bno = branch_col[i]
        sc, rest = plans[bno]
        if sc is not None and sc.batch:
            j = i
            while j < hi and j not in closes and plans[branch_col[j]][0] is sc:  # a shared (merged) computation takes every branch
                j += 1
            if columns is not None:  # columnar plan: the messages are the decoded columns themselves
                whole = i == 0 and j == len(df)
                frame = df[columns] if whole else df.iloc[i:j][columns].reset_index(drop=True)
                frame = frame.set_axis([c[len(DECODED_PREFIX):] for c in columns], axis=1)
                frame["_stream"] = df["stream"].to_numpy()[i:j]
                folded = df["msg"].iloc[i:j]  # a columnar message carries none, a folded run its Folded
                if folded.notna().any():
                    frame["_folded"] = [None if m is None else pickle.loads(m) for m in folded.tolist()]
            else:
                frame = pd.DataFrame.from_records([to_record(pickle.loads(m)) for m in msgs[i:j]])
            ctx.seq, ctx.row = None, None
            _run_batch(out, seqs, parts, branch_col, frame, i, j, sc, rest, states, fail_fast, ctx)
            i = j
            continue
        try:
            msg = pickle.loads(msgs[i])
            if sc is not None:
                ctx.seq, ctx.row = seqs[i], (df, i)  # the row: its connection and receive time, read if asked
                outs = call_user(sc.name, fail_fast, sc.apply, msg, _state_for(states, sc), ctx)
            else:
                outs = [msg]
            if rest:
                outs = apply_steps(rest, outs, fail_fast)
        except Quarantined as q:
            out.add("quarantine", seqs[i], parts[i], bno, None, q.step, q.reason, i)
        else:
            base = parts[i] * 1000
            for j, o in enumerate(outs):
                out.output(seqs[i], base + j, bno, o, i)
        i += 1


def branch_plans(branches: tuple) -> list[tuple]:
    """Per branch: (its state computation or None, the steps after it)."""
    plans = []
    for b in branches:
        post = b.post_steps
        plans.append((post[0], post[1:]) if post and isinstance(post[0], StateComputation) else (None, post))
    return plans


def _fire_each(plans: list, wants: Callable, fail_fast: bool, call: Callable) -> Iterator[tuple[int, list | Quarantined]]:
    """Each branch's state computation that `wants` it, once (merged branches share one), called
    without an input message (a timer, a close record): (branch, its outputs through the steps after
    it), or (branch, Quarantined)."""
    fired = set()
    for bno, (sc, rest) in enumerate(plans):
        if sc is None or id(sc) in fired or not wants(sc):
            continue
        fired.add(id(sc))
        try:
            outs = call(sc)
            yield bno, (apply_steps(rest, outs, fail_fast) if rest else outs)
        except Quarantined as q:
            yield bno, q


def _close_at_end(out: _Rows, seq: int, row: int, plans: list, states: dict, fail_fast: bool, ctx: Context) -> None:
    """A close record for the key: each window step (`close_at_end`, once if merged) closes every open
    window; its outputs answer the record. Other state computations are not called."""
    part = 0
    fired = _fire_each(plans, lambda sc: callable(getattr(sc, "close_at_end", None)), fail_fast,
                       lambda sc: call_user(f"{sc.name} (close at end of input)", fail_fast, sc.close_at_end, ctx.key,
                                            _state_for(states, sc), ctx))
    for bno, outs in fired:
        if isinstance(outs, Quarantined):
            out.add("quarantine", seq, part, bno, None, outs.step, outs.reason, row)
            part += 1
            continue
        for o in outs:
            out.output(seq, part, bno, o, row)
            part += 1


def _run_batch(out: _Rows, seqs, parts, branch_col, frame: pd.DataFrame, i, j, sc: StateComputation, rest, states,
               fail_fast, ctx: Context) -> None:
    frame["_seq"] = seqs[i:j]
    try:
        result = call_user(sc.name, fail_fast, sc.call, frame, _state_for(states, sc), ctx)
        records = frame_to_records(sc.name, result)
        records = apply_steps(rest, records, fail_fast)
    except Quarantined as q:
        folded = frame["_folded"].tolist() if "_folded" in frame.columns else [None] * (j - i)
        for k, f in zip(range(i, j), folded):
            for s in ([seqs[k]] if f is None else f.seqs()):  # a folded run: each message it holds
                out.add("quarantine", s, parts[k], branch_col[k], None, q.step, q.reason, k)
        return
    # Each output names the input it answers (`Emit(seq, value)` or a `_seq` field; default: the last).
    position: dict | None = None  # built when first asked: one entry per input row
    for n_out, rec in enumerate(records):
        s = None
        if isinstance(rec, Emit):
            s, rec = rec.seq, rec.value
        elif isinstance(rec, dict):
            s = rec.pop("_seq", None)
        if s is not None and position is None:
            position = {s: k for k, s in enumerate(seqs[i:j], start=i)}
        k = position.get(int(s), j - 1) if s is not None else j - 1
        out.output(seqs[k], n_out, branch_col[k], rec, k)
