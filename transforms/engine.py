"""The engine: compiles an Application's pipelines into Spark Structured Streaming queries.

One query per pipeline (or merged group of pipelines):

    landing/<group> (file stream of closed parquet segments)
      -> pre stage (mapInArrow): decode, stateless computations, key function
      -> groupBy(key).transformWithStateInPandas: each key's messages in sequence order through
         the state computation, holding the key's state object in RocksDB
      -> foreachBatch: outputs to Delta sinks (each commit carrying the app transaction
         (query, batch id), checked before writing), TCP sinks, and the quarantine table.

Every row between stages is an "envelope": sequence, part (position among the outputs of one
input message), the pickled message, and the input's landing metadata. Errors in user code become
quarantine envelopes and flow to the quarantine table; with `fail_fast` they stop the query.
"""

from __future__ import annotations

import contextvars
import logging
import pickle
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import BinaryType, StructField, StructType

from transforms import lake
from transforms.api import (
    Application,
    Computation,
    DeltaSink,
    Emit,
    Merged,
    Pipeline,
    StateComputation,
    TCPSink,
    UserFunctionError,
    normalize_outputs,
    to_record,
)
from transforms.landing import LANDING_DDL
from transforms.settings import Settings

log = logging.getLogger("eventide.engine")

ENVELOPE = pa.schema(
    [
        ("kind", pa.string()),  # "msg" (keyed, before state), "out" (to sinks), "quarantine"
        ("seq", pa.int64()),
        ("part", pa.int32()),
        ("branch", pa.int32()),
        ("key", pa.string()),
        ("msg", pa.binary()),
        ("stream", pa.string()),
        ("receive_time", pa.timestamp("us", tz="UTC")),
        ("connection", pa.string()),
        ("step", pa.string()),
        ("reason", pa.string()),
        ("payload", pa.binary()),
    ]
)
DECODED_PREFIX = "m__"  # decoded message columns beside the envelope (a decoder may have a field `kind` too)
QUARANTINE_KEY = "\x00quarantine"  # quarantine envelopes pass through the stateful step untouched

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


# -- message serialization -------------------------------------------------------------------------
_BY_VALUE: set[type] = set()


def dumps(obj: Any) -> bytes:
    """Pickle a message, output or state. Classes defined in a user's `__main__` script cannot be found
    by name in Spark's workers, so those (remembered per type) go through cloudpickle, by value."""
    if type(obj) not in _BY_VALUE:
        try:
            return pickle.dumps(obj, protocol=5)
        except (pickle.PicklingError, AttributeError, TypeError):
            _BY_VALUE.add(type(obj))
    from pyspark import cloudpickle

    return cloudpickle.dumps(obj, protocol=5)


# -- context for user code (timers, key) ------------------------------------------------------------
@dataclass
class Context:
    key: str
    processing_time_ms: int = 0
    watermark_ms: int = 0
    handle: Any = None

    def register_timer(self, at_ms: int) -> None:
        """Call `on_timer` of the state computation at (processing or event) time `at_ms`."""
        if self.handle is None:
            raise RuntimeError("timers need a pipeline declared with timers (time_mode)")
        self.handle.registerTimer(int(at_ms))


_context: contextvars.ContextVar[Context | None] = contextvars.ContextVar("eventide_context", default=None)


def current_context() -> Context:
    ctx = _context.get()
    if ctx is None:
        raise RuntimeError("current_context() is only available inside a state computation")
    return ctx


# -- compiled plan ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueryPlan:
    """One Spark query: its branches (one for a plain pipeline), sinks and names."""

    app: str
    name: str
    group: str
    branches: tuple[Pipeline, ...]
    sinks: tuple
    keyed: bool
    generation: int
    # Bronze queries quarantine what the gateway could not frame; app queries skip it (counted once).
    quarantine_landing_errors: bool = False
    time_mode: str = "None"
    # "envelope": messages travel pickled. "direct": decode straight into the one Delta sink's columns
    # (bronze). "columnar": decoded columns go straight to a batch state computation (no objects).
    mode: str = "envelope"
    # direct/columnar: the decoded columns (for merged branches, the union of their decoders' columns)
    decoded_schema: pa.Schema | None = None

    @property
    def stage_schema(self) -> pa.Schema:
        """What the pre stage emits: the envelope, plus the decoded columns in direct/columnar mode."""
        if self.mode == "envelope":
            return ENVELOPE
        extra = [pa.field(DECODED_PREFIX + f.name, f.type) for f in self.decoded_schema]
        return pa.schema(list(ENVELOPE) + extra)

    @property
    def streams(self) -> list[str]:
        return [b.stream for b in self.branches]

    def app_id(self, sink: str) -> str:
        return f"{self.name}@g{self.generation}:{sink}"

    def checkpoint(self, settings: Settings) -> Path:
        return settings.checkpoints / self.name / f"v{self.generation}"


def plan_queries(app: Application, settings: Settings, decoders: dict | None = None) -> list[QueryPlan]:
    """Split an application into query plans; resolve each source's decoder."""
    from transforms.streams import stream_decoder

    plans = []
    for i, p in enumerate(app.pipelines):
        branches = p.branches if isinstance(p, Merged) else (p,)
        shared_steps = p.steps if isinstance(p, Merged) else ()
        resolved = []
        for b in branches:
            dec = b.decoder or (decoders or {}).get(b.stream) or stream_decoder(b.stream)
            resolved.append(Pipeline(b.stream, dec, b.steps + shared_steps, b.key_fn, b.sinks, b.name))
        groups = {settings.group_of(b.stream) for b in resolved}
        if len(groups) > 1:
            raise ValueError(
                f"application {app.name!r}: merged pipelines read streams {[b.stream for b in resolved]} "
                f"from different sequence groups {sorted(groups)}; streams that share state must share a group "
                "(EVENTIDE_STREAM_GROUPS)"
            )
        keyed = {b.key_fn is not None for b in resolved}
        if len(keyed) > 1:
            raise ValueError(f"application {app.name!r}: merged pipelines must all be keyed")
        sinks = p.sinks
        if not sinks:
            raise ValueError(f"application {app.name!r}: pipeline {i} has no sink (.to_sink(...))")
        timed = any(getattr(s, "on_timer", None) for b in resolved for s in b.post_steps)
        mode, decoded = _choose_mode(resolved, sinks, keyed == {True}, timed)
        name = app.name if len(app.pipelines) == 1 else f"{app.name}.{p.name if isinstance(p, Pipeline) and p.name else i}"
        plans.append(
            QueryPlan(
                app=app.name,
                name=name,
                group=groups.pop(),
                branches=tuple(resolved),
                sinks=tuple(sinks),
                keyed=keyed.pop(),
                generation=app.generation,
                quarantine_landing_errors=app.quarantine_landing_errors,
                time_mode="ProcessingTime" if timed else "None",
                mode=mode,
                decoded_schema=decoded,
            )
        )
    return plans


def _choose_mode(branches: list[Pipeline], sinks: tuple, keyed: bool, timed: bool) -> tuple[str, pa.Schema | None]:
    """Columns instead of pickled objects where nothing needs the objects (same results, faster)."""
    if any(b.pre_steps or b.decoder.schema is None for b in branches):
        return "envelope", None
    if not keyed:
        sink = sinks[0]
        if len(branches) == 1 and len(sinks) == 1 and isinstance(sink, DeltaSink) and sink.schema is not None and sink.accepts is None:
            return "direct", branches[0].decoder.schema
        return "envelope", None
    first = branches[0].post_steps[0] if branches[0].post_steps else None
    if timed or not (isinstance(first, StateComputation) and first.batch):
        return "envelope", None
    if any(not isinstance(b.key_fn, str) or b.key_fn != branches[0].key_fn or not b.post_steps or b.post_steps[0] is not first
           for b in branches):
        return "envelope", None
    union: dict[str, pa.Field] = {}
    for b in branches:
        for f in b.decoder.schema:
            if f.name in union and union[f.name].type != f.type:
                return "envelope", None  # same name, different types: keep objects
            union.setdefault(f.name, f)
    return "columnar", pa.schema(list(union.values()))


# -- user-code calls --------------------------------------------------------------------------------
class _Quarantine(Exception):
    def __init__(self, step: str, reason: str):
        super().__init__(reason)
        self.step = step
        self.reason = reason


def _describe(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def _call(step_name: str, fail_fast: bool, fn: Callable, *args):
    try:
        return fn(*args)
    except UserFunctionError as e:
        # A broken contract (e.g. wrong return type): the message says which function and what it returned.
        if fail_fast:
            raise
        raise _Quarantine(step_name, str(e)) from None
    except Exception as e:
        if fail_fast:
            raise RuntimeError(f"{step_name!r} raised on a message (EVENTIDE_FAIL_FAST is on): {_describe(e)}") from e
        raise _Quarantine(step_name, _describe(e)) from None


def _apply_steps(steps: list, msgs: list, fail_fast: bool) -> list:
    for step in steps:
        if getattr(step, "batch", False):
            msgs = _apply_batch_computation(step, msgs, fail_fast) if msgs else []
            continue
        nxt = []
        for m in msgs:
            nxt.extend(_call(step.name, fail_fast, step.apply, m))
        msgs = nxt
    return msgs


def _apply_batch_computation(step: Computation, msgs: list, fail_fast: bool) -> list:
    df = pd.DataFrame.from_records([to_record(m) for m in msgs])
    out = _call(step.name, fail_fast, step.fn, df)
    return _frame_to_records(step.name, out)


def _frame_to_records(name: str, out: Any) -> list:
    if out is None:
        return []
    if isinstance(out, pd.DataFrame):
        return out.to_dict("records")
    if isinstance(out, list):
        return out
    raise UserFunctionError(f"batch function {name!r} returned {type(out).__name__}, expected a pandas DataFrame")


# -- pre stage: decode, stateless steps, key --------------------------------------------------------
LANDING_KEYS = ("stream", "connection")


def _key_of(key_fn, msg, cols: dict, i: int, fail_fast: bool):
    if isinstance(key_fn, str):
        rec = to_record(msg)
        if key_fn in rec:
            return rec[key_fn]
        if key_fn in LANDING_KEYS:
            return cols[key_fn][i]
        raise _Quarantine("key_by", f"message has no field {key_fn!r}: {msg!r}")
    return _call("key_by", fail_fast, key_fn, msg)


def decode_columns(dec, payloads: pa.Array, fail_fast: bool) -> tuple[pa.Table, list]:
    """Decode a column of payloads into `dec.schema` columns; errors[i] is None or why row i failed."""
    if dec.column_fn is not None:
        table = dec.column_fn(payloads)
        errors = table.column("_error").to_pylist()
        table = table.drop_columns(["_error"]).cast(dec.schema)
    else:
        records, errors = [], []
        for p in payloads.to_pylist():
            try:
                records.append(to_record(_call(f"decoder {dec.name}", fail_fast, dec.fn, p)))
                errors.append(None)
            except _Quarantine as q:
                records.append({})
                errors.append(q.reason)
        table = pa.Table.from_pylist(records, schema=dec.schema)
    if fail_fast and any(e is not None for e in errors):
        bad = next(e for e in errors if e is not None)
        raise RuntimeError(f"decoder {dec.name!r} failed on a message (EVENTIDE_FAIL_FAST is on): {bad}")
    return table, errors


def make_columnar_stage(plan: QueryPlan, fail_fast: bool):
    """Direct/columnar pre stage: decode whole columns; no Python object per message."""
    import numpy as np
    import pyarrow.compute as pc

    branches = plan.branches
    union = plan.decoded_schema
    schema = plan.stage_schema
    ok_kind = "out" if plan.mode == "direct" else "msg"
    key = branches[0].key_fn

    def decode_all(batch: pa.RecordBatch):
        """Each branch decodes its own rows; the results are put back in input order."""
        several = len(branches) > 1
        streams = np.asarray(batch.column("stream").to_pylist(), dtype=object) if several else None
        payloads = batch.column("payload")
        n = batch.num_rows
        tables, positions = [], []
        errors: list = [None] * n
        branch_no = np.zeros(n, dtype=np.int32)
        steps: list = [None] * n
        for bno, b in enumerate(branches):
            idx = np.nonzero(streams == b.stream)[0] if several else np.arange(n)
            if not len(idx):
                continue
            t, errs = decode_columns(b.decoder, payloads.take(pa.array(idx)) if several else payloads, fail_fast)
            t = pa.table({f.name: t.column(f.name) if f.name in t.column_names else pa.nulls(t.num_rows, f.type)
                          for f in union}, schema=union)
            tables.append(t)
            positions.append(idx)
            branch_no[idx] = bno
            for i, e in zip(idx, errs):
                if e is not None:
                    errors[i] = e
                    steps[i] = f"decoder {b.decoder.name}"
        decoded = pa.concat_tables(tables).take(pa.array(np.argsort(np.concatenate(positions), kind="stable")))
        return decoded, errors, steps, branch_no

    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            payloads = batch.column("payload")
            decoded, errors, steps, branch_no = decode_all(batch)
            landing_error = batch.column("landing_error")
            if landing_error.null_count == n and all(e is None for e in errors):  # the usual batch: all good
                landing_errors = reasons = steps = [None] * n
                bad = pa.array(np.zeros(n, dtype=bool))
            else:
                landing_errors = landing_error.to_pylist()
                reasons = [le if le is not None else e for le, e in zip(landing_errors, errors)]
                steps = ["gateway" if le is not None else st for le, st in zip(landing_errors, steps)]
                bad = pa.array([r is not None for r in reasons], pa.bool_())
            cols = {
                "kind": pc.if_else(bad, "quarantine", ok_kind),
                "seq": batch.column("seq"),
                "part": pa.array(np.zeros(n, dtype=np.int32)),
                "branch": pa.array(branch_no),
                "msg": pa.nulls(n, pa.binary()),
                "stream": batch.column("stream"),
                "receive_time": batch.column("receive_time"),
                "connection": batch.column("connection"),
                "step": pa.array(steps, pa.string()),
                "reason": pa.array(reasons, pa.string()),
                "payload": pc.if_else(bad, payloads, pa.scalar(None, pa.binary())),
            }
            if plan.mode == "columnar":
                if key in decoded.column_names:
                    keys = decoded.column(key).cast(pa.string())
                elif key in LANDING_KEYS:
                    keys = batch.column(key)
                else:
                    raise ValueError(f"key_by({key!r}): not a decoded field nor one of {LANDING_KEYS}")
                cols["key"] = pc.if_else(bad, QUARANTINE_KEY, keys)
            else:
                cols["key"] = pa.nulls(n, pa.string())
            for f in union:
                cols[DECODED_PREFIX + f.name] = pc.if_else(bad, pa.scalar(None, f.type), decoded.column(f.name))
            arrays = []
            for f in schema:
                col = cols[f.name]
                if isinstance(col, pa.ChunkedArray):
                    col = col.combine_chunks()
                arrays.append(col.cast(f.type))
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    return stage


def _emit(out: dict, cols: dict, i: int, kind, seq, part, branch, key, msg, step, reason, payload) -> None:
    """Append one envelope to `out`, carrying input row i's landing metadata."""
    for name, value in (("kind", kind), ("seq", seq), ("part", part), ("branch", branch), ("key", key), ("msg", msg),
                        ("step", step), ("reason", reason), ("payload", payload)):
        out[name].append(value)
    for name in ("stream", "receive_time", "connection"):
        out[name].append(cols[name][i])


def make_pre_stage(plan: QueryPlan, fail_fast: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    if plan.mode != "envelope":
        return make_columnar_stage(plan, fail_fast)
    by_stream = {b.stream: (i, b) for i, b in enumerate(plan.branches)}
    quarantine_landing = plan.quarantine_landing_errors
    keyed = plan.keyed

    def pre_stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            cols = batch.to_pydict()
            out: dict[str, list] = {f.name: [] for f in ENVELOPE}

            def quarantine(i, step, reason, out=out, cols=cols):
                _emit(out, cols, i, "quarantine", cols["seq"][i], 0, by_stream[cols["stream"][i]][0], QUARANTINE_KEY,
                      None, step, reason, cols["payload"][i])

            # Decode every row, then run the steps over the whole micro-batch: (input row, message) pairs,
            # so a batch computation sees all of them at once and one-message steps see one at a time.
            items: dict[int, list] = {}  # branch -> [(row, message)]
            for i in range(batch.num_rows):
                branch_no, branch = by_stream[cols["stream"][i]]
                if cols["landing_error"][i] is not None:
                    if quarantine_landing:
                        quarantine(i, "gateway", cols["landing_error"][i])
                    continue
                dec = branch.decoder
                try:
                    msg = _call(f"decoder {dec.name}", fail_fast, dec.fn, cols["payload"][i])
                except _Quarantine as q:
                    quarantine(i, q.step, q.reason)
                    continue
                if msg is not None:
                    items.setdefault(branch_no, []).append((i, msg))
            for branch_no, pairs in items.items():
                branch = plan.branches[branch_no]
                for step in branch.pre_steps:
                    pairs = _apply_step_to_rows(step, pairs, fail_fast, quarantine)
                parts: dict[int, int] = {}
                for i, m in pairs:
                    try:
                        key = None
                        if keyed:
                            key = _key_of(branch.key_fn, m, cols, i, fail_fast)
                            if key is None:
                                raise _Quarantine("key_by", f"key function returned None for {m!r}")
                            key = str(key)
                    except _Quarantine as q:
                        quarantine(i, q.step, q.reason)
                        continue
                    part = parts[i] = parts.get(i, -1) + 1
                    _emit(out, cols, i, "msg" if keyed else "out", cols["seq"][i], part, branch_no, key, dumps(m),
                          None, None, None)
            yield pa.RecordBatch.from_pydict(out, schema=ENVELOPE)

    return pre_stage


def _apply_step_to_rows(step: Computation, pairs: list, fail_fast: bool, quarantine: Callable) -> list:
    """One stateless step over (input row, message) pairs; a failure quarantines the input row it came from."""
    if not step.batch:
        out = []
        for i, m in pairs:
            try:
                out.extend((i, o) for o in _call(step.name, fail_fast, step.apply, m))
            except _Quarantine as q:
                quarantine(i, q.step, q.reason)
        return out
    if not pairs:
        return []
    try:
        records = _apply_batch_computation(step, [{**to_record(m), "_row": i} for i, m in pairs], fail_fast)
        if any("_row" not in r for r in records):
            raise UserFunctionError(f"batch computation {step.name!r} must keep the `_row` column (which input each row answers)")
    except (_Quarantine, UserFunctionError) as e:
        if fail_fast and isinstance(e, UserFunctionError):
            raise
        reason = e.reason if isinstance(e, _Quarantine) else str(e)
        for i in sorted({i for i, _ in pairs}):
            quarantine(i, step.name, reason)
        return []
    return [(int(r.pop("_row")), r) for r in records]


# -- stateful stage ---------------------------------------------------------------------------------
class KeyedStateProcessor(StatefulProcessor):
    """Holds each key's state objects (one per state class) pickled in a RocksDB value state."""

    def __init__(self, plan: QueryPlan, fail_fast: bool):
        self.plan = plan
        self.fail_fast = fail_fast

    def init(self, handle) -> None:
        self.handle = handle
        self.value = handle.getValueState("states", StructType([StructField("blob", BinaryType(), True)]))

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
            yield df[ENVELOPE.names]
            return
        seq = df["seq"].to_numpy()
        if not (len(seq) < 2 or (seq[1:] > seq[:-1]).all()):  # usually already in order: skip the sort
            df = df.sort_values(["seq", "part"], kind="stable").reset_index(drop=True)
        states = self._load()
        token = _context.set(self._context(key, timerValues, self.plan.time_mode != "None"))
        columns = [DECODED_PREFIX + n for n in self.plan.decoded_schema.names] if self.plan.mode == "columnar" else None
        try:
            out = _run_key(df, states, self.plan.branches, self.fail_fast, columns)
        finally:
            _context.reset(token)
        self.value.update((dumps(states),))
        yield out

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        (key,) = key
        states = self._load()
        token = _context.set(self._context(key, timerValues, True))
        rows = []
        try:
            for bno, b in enumerate(self.plan.branches):
                sc = b.post_steps[0]
                if isinstance(sc, StateComputation) and sc.on_timer:
                    state = _state_for(states, sc)
                    outs = normalize_outputs(sc.name, sc.on_timer(key, state, expiredTimerInfo.getExpiryTimeInMs()))
                    rows.extend(("out", -1, j, bno, dumps(o)) for j, o in enumerate(outs))
        finally:
            _context.reset(token)
        self.value.update((dumps(states),))
        yield _envelope_frame(rows, key)

    def close(self) -> None:
        pass


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

    def frame(self, key: str, src: pd.DataFrame | None) -> pd.DataFrame:
        import numpy as np

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
        return pd.DataFrame(data, columns=ENVELOPE.names)


# Spark rejects float64 columns where it expects strings: an empty frame must keep the right types.
_EMPTY_ENVELOPE = ENVELOPE.empty_table().to_pandas()


def _envelope_frame(rows: list[tuple], key: str) -> pd.DataFrame:
    """Envelopes without an input row (timer outputs): (kind, seq, part, branch, msg)."""
    out = _Rows()
    for kind, seq, part, branch, msg in rows:
        out.add(kind, seq, part, branch, msg, None, None, None)
    return out.frame(key, None)


def _run_key(df: pd.DataFrame, states: dict, branches: tuple, fail_fast: bool, columns: list[str] | None = None) -> pd.DataFrame:
    """Apply one key's messages (sorted by sequence) to its state; runs of one batch-form branch go together."""
    key = df["key"].iat[0]
    seqs = df["seq"].tolist()
    parts = df["part"].tolist()
    branch_col = df["branch"].tolist()
    msgs = df["msg"].tolist()
    plans = []  # per branch: (state computation or None, steps after it)
    for b in branches:
        post = b.post_steps
        if post and isinstance(post[0], StateComputation):
            plans.append((post[0], post[1:]))
        else:
            plans.append((None, post))
    out = _Rows()
    n = len(seqs)
    i = 0
    while i < n:
        bno = branch_col[i]
        sc, rest = plans[bno]
        if sc is not None and sc.batch:
            j = i
            while j < n and plans[branch_col[j]][0] is sc:  # a shared (merged) computation takes every branch
                j += 1
            if columns is not None:  # columnar plan: the messages are the decoded columns themselves
                whole = i == 0 and j == n
                frame = df[columns] if whole else df.iloc[i:j][columns].reset_index(drop=True)
                frame = frame.set_axis([c[len(DECODED_PREFIX):] for c in columns], axis=1)
                frame["_stream"] = df["stream"].to_numpy()[i:j]
            else:
                frame = pd.DataFrame.from_records([to_record(pickle.loads(m)) for m in msgs[i:j]])
            _run_batch(out, seqs, parts, branch_col, frame, i, j, sc, rest, states, fail_fast)
            i = j
            continue
        try:
            msg = pickle.loads(msgs[i])
            if sc is not None:
                state = states.get(sc.state_name)
                if state is None:
                    state = states[sc.state_name] = sc.state()
                outs = _call(sc.name, fail_fast, sc.apply, msg, state)
            else:
                outs = [msg]
            if rest:
                outs = _apply_steps(rest, outs, fail_fast)
        except _Quarantine as q:
            out.add("quarantine", seqs[i], parts[i], bno, None, q.step, q.reason, i)
        else:
            base = parts[i] * 1000
            for j, o in enumerate(outs):
                out.add("out", seqs[i], base + j, bno, dumps(o), None, None, i)
        i += 1
    return out.frame(key, df)


def _run_batch(out: _Rows, seqs, parts, branch_col, frame: pd.DataFrame, i, j, sc: StateComputation, rest, states,
               fail_fast) -> None:
    frame["_seq"] = seqs[i:j]
    try:
        result = _call(sc.name, fail_fast, sc.fn, frame, _state_for(states, sc))
        records = _frame_to_records(sc.name, result)
        records = _apply_steps(rest, records, fail_fast)
    except _Quarantine as q:
        for k in range(i, j):
            out.add("quarantine", seqs[k], parts[k], branch_col[k], None, q.step, q.reason, k)
        return
    # Each output names the input it answers (`Emit(seq, value)` or a `_seq` field; default: the last).
    position = {s: k for k, s in enumerate(seqs[i:j], start=i)}
    for n_out, rec in enumerate(records):
        s = None
        if isinstance(rec, Emit):
            s, rec = rec.seq, rec.value
        elif isinstance(rec, dict):
            s = rec.pop("_seq", None)
        k = position.get(int(s), j - 1) if s is not None else j - 1
        out.add("out", seqs[k], n_out, branch_col[k], dumps(rec), None, None, k)


# -- sinks ------------------------------------------------------------------------------------------
def outputs_to_table(sink: DeltaSink, outs: list, meta: dict[str, list]) -> pa.Table:
    records = [dict(to_record(o)) for o in outs]
    for col in sink.metadata:
        for r, v in zip(records, meta[col]):
            r[col] = v
    if sink.schema is not None:
        names = sink.schema.names
        try:
            return pa.Table.from_pylist([{n: r.get(n) for n in names} for r in records], schema=sink.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise UserFunctionError(
                f"outputs for Delta sink {sink.table!r} do not fit its schema ({e}); first output: {outs[0]!r}"
            ) from None
    if not records:
        return pa.table({})
    return pa.Table.from_pylist(records)


class TCPConnection:
    """A TCP sink's connection, opened on first use and kept for the run."""

    def __init__(self, address: str):
        host, _, port = address.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.sock = None

    def send(self, data: bytes) -> None:
        import socket

        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=30)
        self.sock.sendall(data)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@dataclass
class RunReport:
    query: str
    batches: int = 0
    input_rows: int = 0
    rows_written: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0
    skipped_batches: int = 0  # replayed batches whose commits were already in the lake
    seconds: float = 0.0
    max_lag_seconds: float | None = None




def make_batch_writer(plan: QueryPlan, settings: Settings, report: RunReport, tcp_addresses: dict[str, str]):
    import os

    conns: dict[str, TCPConnection] = {}
    quarantine_path = settings.table_path(QUARANTINE_TABLE)

    def tcp_address(sink: TCPSink) -> str | None:
        return tcp_addresses.get(sink.name) or sink.address or os.environ.get(f"EVENTIDE_SINK_{sink.name.upper()}")

    def write_batch(batch_df, batch_id: int) -> None:
        table = batch_df.toArrow() if hasattr(batch_df, "toArrow") else pa.Table.from_pandas(batch_df.toPandas())
        table = table.sort_by([("seq", "ascending"), ("part", "ascending")]) if table.num_rows else table
        kind = table.column("kind")
        wrote_any = False
        # Quarantine first: a bad message is never lost, even if a sink below fails.
        q = table.filter(pc.fill_null(pc.equal(kind, "quarantine"), False))
        if q.num_rows and q.column("payload").null_count:
            q = _with_landed_payloads(q, settings, plan.group)
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
        if q.num_rows or lake.exists(quarantine_path):
            wrote_any |= lake.append_once(quarantine_path, qtable, plan.app_id("quarantine"), batch_id)
        report.quarantined += q.num_rows

        o = table.filter(pc.fill_null(pc.equal(kind, "out"), False))
        if plan.mode == "direct":
            wrote_any |= _write_direct(plan, settings, report, o, batch_id)
            o = o.slice(0, 0)
        outs = [pickle.loads(b) for b in o.column("msg").to_pylist()]
        meta = {c: o.column(c).to_pylist() for c in ("seq", "part", "stream", "receive_time", "connection")}
        for sink in plan.sinks:
            sel = [i for i, out in enumerate(outs) if sink.wants(out)]
            chosen = [outs[i] for i in sel]
            sub_meta = {c: [v[i] for i in sel] for c, v in meta.items()}
            if isinstance(sink, DeltaSink):
                data = outputs_to_table(sink, chosen, sub_meta)
                path = settings.table_path(sink.table)
                if data.num_columns == 0:
                    continue  # nothing to infer a schema from yet; the batch has no rows for this sink
                if sink.mode == "append":
                    wrote = lake.append_once(path, data, plan.app_id(sink.table), batch_id, sink.partition_by)
                else:
                    wrote = lake.merge_once(path, data, list(sink.keys), plan.app_id(sink.table), batch_id,
                                            order_by=[c for c in ("seq", "part") if c in data.column_names])
                wrote_any |= wrote
                if wrote:
                    report.rows_written[sink.table] = report.rows_written.get(sink.table, 0) + data.num_rows
            else:
                addr = tcp_address(sink)
                if not addr or not chosen:
                    continue
                _send_tcp_once(plan, settings, sink, addr, chosen, batch_id, conns)
                report.rows_written[f"tcp:{sink.name}"] = report.rows_written.get(f"tcp:{sink.name}", 0) + len(chosen)
        report.batches += 1
        if not wrote_any and table.num_rows:
            report.skipped_batches += 1
        rt = table.column("receive_time").drop_null()
        if len(rt):
            oldest = min(rt.to_pylist())
            lag = time.time() - oldest.timestamp()
            report.max_lag_seconds = max(report.max_lag_seconds or 0.0, lag)

    def close() -> None:
        for c in conns.values():
            c.close()

    write_batch.close = close
    return write_batch


def _with_landed_payloads(q: pa.Table, settings: Settings, group: str) -> pa.Table:
    """Messages quarantined after the pre stage travel without their payload (it is not shuffled):
    take it from the landing log, so every quarantine row holds the exact bytes that failed."""
    from transforms.landing import payloads_for

    payloads = q.column("payload").to_pylist()
    seqs = q.column("seq").to_pylist()
    landed = payloads_for(settings, group, [s for s, p in zip(seqs, payloads) if p is None])
    filled = [p if p is not None else landed.get(s) for s, p in zip(seqs, payloads)]
    return q.set_column(q.schema.get_field_index("payload"), "payload", pa.array(filled, pa.binary()))


def _write_direct(plan: QueryPlan, settings: Settings, report: RunReport, o: pa.Table, batch_id: int) -> bool:
    """Direct plans: the decoded columns are the sink's rows already."""
    (sink,) = plan.sinks
    decoded = set(plan.decoded_schema.names)
    data = pa.table(
        {f.name: o.column(DECODED_PREFIX + f.name if f.name in decoded else f.name).cast(f.type) for f in sink.schema},
        schema=sink.schema,
    )
    wrote = lake.append_once(settings.table_path(sink.table), data, plan.app_id(sink.table), batch_id, sink.partition_by)
    if wrote:
        report.rows_written[sink.table] = report.rows_written.get(sink.table, 0) + data.num_rows
    return wrote


def _send_tcp_once(plan, settings, sink: TCPSink, addr: str, outs: list, batch_id: int, conns: dict) -> None:
    """Send a batch's encoded outputs unless this batch was already sent (marker file per sink)."""
    from transforms.framing import DEFAULT_FRAMING

    marker = plan.checkpoint(settings) / f"tcp-{sink.name}.sent"
    if marker.exists() and int(marker.read_text() or -1) >= batch_id:
        return
    data = b"".join(DEFAULT_FRAMING.encode(sink.encoder(o)) if sink.framed else sink.encoder(o) for o in outs)
    conn = conns.setdefault(sink.name, TCPConnection(addr))
    try:
        conn.send(data)
    except OSError as e:
        conn.close()
        raise RuntimeError(f"TCP sink {sink.name!r} could not write to {addr}: {e}. Is the receiver listening?") from e
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(batch_id))


# -- running ----------------------------------------------------------------------------------------
def build_stream(spark, plan: QueryPlan, settings: Settings):
    """The streaming DataFrame of a plan, up to the sinks."""
    src_dir = settings.landing / plan.group
    src_dir.mkdir(parents=True, exist_ok=True)
    reader = spark.readStream.schema(LANDING_DDL)
    if settings.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", settings.max_files_per_trigger)
    df = reader.parquet(str(src_dir.absolute()))
    df = df.where(df.stream.isin(plan.streams))
    if not plan.quarantine_landing_errors:
        df = df.where(df.landing_error.isNull())
    from pyspark.sql.pandas.types import from_arrow_schema

    env = df.mapInArrow(make_pre_stage(plan, settings.fail_fast), from_arrow_schema(plan.stage_schema))
    if plan.keyed:
        env = env.groupBy("key").transformWithStateInPandas(
            statefulProcessor=KeyedStateProcessor(plan, settings.fail_fast),
            outputStructType=from_arrow_schema(ENVELOPE),
            outputMode="Append",
            timeMode=plan.time_mode,
        )
    return env


def run_query(spark, plan: QueryPlan, settings: Settings, tcp_addresses: dict[str, str] | None = None,
              progress: Callable[[str], None] | None = None) -> RunReport:
    """Process everything landed so far (trigger availableNow), exactly once; returns what it did."""
    report = RunReport(plan.name)
    stream = build_stream(spark, plan, settings)
    writer = make_batch_writer(plan, settings, report, tcp_addresses or {})
    ckpt = plan.checkpoint(settings)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    query = (
        stream.writeStream.queryName(plan.name.replace(".", "_"))
        .foreachBatch(writer)
        .option("checkpointLocation", str(ckpt.absolute()))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        writer.close()
    report.seconds = time.time() - started
    report.input_rows = sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
    if progress:
        progress(f"{plan.name}: {report.input_rows} messages in {report.batches} batches, {report.seconds:.1f} s")
    return report


def run_application(spark, app: Application, settings: Settings, tcp_addresses: dict[str, str] | None = None,
                    progress: Callable[[str], None] | None = None) -> list[RunReport]:
    return [run_query(spark, p, settings, tcp_addresses, progress) for p in plan_queries(app, settings)]
