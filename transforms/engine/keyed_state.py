"""The stateful step (transformWithStateInPandas, grouped by key).

Each key's messages go in sequence order through the pipeline's state computation, which sees the
key's state object; the state objects of a key (one per state class) are pickled together in one
RocksDB value state. Outputs leave as "out" envelopes; quarantine envelopes pass through untouched.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import BinaryType, StructField, StructType

from transforms.api import Context, Emit, StateComputation, to_record
from transforms.engine.envelope import (
    DECODED_PREFIX,
    ENVELOPE,
    QUARANTINE_KEY,
    Quarantined,
    call_user,
    dumps,
    frame_to_records,
)
from transforms.engine.plan import QueryMode, QueryPlan
from transforms.engine.stages import apply_steps


# -- the processor ---------------------------------------------------------------------------------
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
        ctx = self._context(key, timerValues, self.plan.timers)
        columns = [DECODED_PREFIX + n for n in self.plan.decoded_schema.names] if self.plan.mode is QueryMode.COLUMNAR else None
        out = _run_key(df, states, self.plan.branches, self.fail_fast, columns, ctx)
        self.value.update((dumps(states),))
        yield out

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        (key,) = key
        states = self._load()
        ctx = self._context(key, timerValues, True)
        rows = []
        fired = set()  # merged branches share one state computation: fire it once
        for bno, b in enumerate(self.plan.branches):
            sc, rest = b.post_steps[0], b.post_steps[1:]
            if isinstance(sc, StateComputation) and sc.on_timer and id(sc) not in fired:
                fired.add(id(sc))
                state = _state_for(states, sc)
                try:
                    outs = call_user(f"{sc.name} (on_timer)", self.fail_fast, sc.fire_timer, key, state,
                                     expiredTimerInfo.getExpiryTimeInMs(), ctx)
                    outs = apply_steps(rest, outs, self.fail_fast) if rest else outs  # like the messages' outputs
                except Quarantined as q:  # no input message: a quarantine row with sequence -1
                    rows.append(("quarantine", -1, len(rows), bno, None, q.step, q.reason))
                    continue
                rows.extend(("out", -1, len(rows) + j, bno, dumps(o)) for j, o in enumerate(outs))
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
    """Envelopes without an input row (timer outputs): (kind, seq, part, branch, msg[, step, reason])."""
    out = _Rows()
    for kind, seq, part, branch, msg, *why in rows:
        step, reason = why or (None, None)
        out.add(kind, seq, part, branch, msg, step, reason, None)
    return out.frame(key, None)


def _run_key(df: pd.DataFrame, states: dict, branches: tuple, fail_fast: bool, columns: list[str] | None = None,
             ctx: Context | None = None) -> pd.DataFrame:
    """Apply one key's messages (sorted by sequence) to its state; runs of one batch-form branch go together."""
    key = df["key"].iat[0]
    ctx = ctx or Context(key)
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
            ctx.seq = None
            _run_batch(out, seqs, parts, branch_col, frame, i, j, sc, rest, states, fail_fast, ctx)
            i = j
            continue
        try:
            msg = pickle.loads(msgs[i])
            if sc is not None:
                ctx.seq = seqs[i]
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
                out.add("out", seqs[i], base + j, bno, dumps(o), None, None, i)
        i += 1
    return out.frame(key, df)


def _run_batch(out: _Rows, seqs, parts, branch_col, frame: pd.DataFrame, i, j, sc: StateComputation, rest, states,
               fail_fast, ctx: Context) -> None:
    frame["_seq"] = seqs[i:j]
    try:
        result = call_user(sc.name, fail_fast, sc.call, frame, _state_for(states, sc), ctx)
        records = frame_to_records(sc.name, result)
        records = apply_steps(rest, records, fail_fast)
    except Quarantined as q:
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
