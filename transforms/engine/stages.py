"""The pre stage (mapInArrow): decode each landed payload, run the stateless steps, key the message.

It emits envelopes: "msg" rows for the stateful step when the pipeline is keyed, "out" rows for the
sinks when it is not, "quarantine" rows for what failed. Direct and columnar plans decode whole
columns and carry the decoded columns beside the envelope instead of pickled messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from transforms.api import Computation, Reject, UserFunctionError, to_record
from transforms.engine.close_windows import closable, split_close_records
from transforms.engine.envelope import (
    DECODED_PREFIX,
    ENVELOPE,
    QUARANTINE_KEY,
    TICK_STREAM,
    Quarantined,
    call_user,
    dumps,
    frame_to_records,
    spark_frame,
)
from transforms.engine.plan import QueryMode, QueryPlan

LANDING_KEYS = ("stream", "connection")  # landing columns a pipeline may key by


def _key_of(key_fn, msg, cols: dict, i: int, fail_fast: bool):
    if isinstance(key_fn, str):
        rec = to_record(msg)
        if key_fn in rec:
            return rec[key_fn]
        if key_fn in LANDING_KEYS:
            return cols[key_fn][i]
        raise Quarantined("key_by", f"message has no field {key_fn!r}: {msg!r}")
    return call_user("key_by", fail_fast, key_fn, msg)


def decode_one(dec, payload: bytes, fail_fast: bool):
    """One payload through a decoder's one-payload form: the message, or Quarantined when the decoder
    raised or returned `Reject(reason)` (a rejection for the payload's content, kept word for word)."""
    step = f"decoder {dec.name}"
    msg = call_user(step, fail_fast, dec.fn, payload)
    if isinstance(msg, Reject):
        if fail_fast:
            raise RuntimeError(f"{step!r} rejected a message (EVENTIDE_FAIL_FAST is on): {msg.reason}")
        raise Quarantined(step, msg.reason)
    return msg


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
                records.append(to_record(decode_one(dec, p, fail_fast)))
                errors.append(None)
            except Quarantined as q:
                records.append({})
                errors.append(q.reason)
        table = pa.Table.from_pylist(records, schema=dec.schema)
    if fail_fast and any(e is not None for e in errors):
        bad = next(e for e in errors if e is not None)
        raise RuntimeError(f"decoder {dec.name!r} failed on a message (EVENTIDE_FAIL_FAST is on): {bad}")
    return table, errors


def make_columnar_stage(plan: QueryPlan, fail_fast: bool):
    """Direct/columnar pre stage: decode whole columns; no Python object per message."""
    branches = plan.branches
    union = plan.decoded_schema
    schema = plan.stage_schema
    ok_kind = "out" if plan.mode is QueryMode.DIRECT else "msg"
    key = branches[0].key_fn
    prefold = branches[0].post_steps[0] if plan.prefold else None  # the window step whose runs this stage folds

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
                "payload": _only_where(bad, payloads),
                "origin": pa.nulls(n, pa.string()),
            }
            if plan.mode is QueryMode.COLUMNAR:
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
            out = pa.RecordBatch.from_arrays(arrays, schema=schema)
            yield prefold_runs(prefold, out, fail_fast, PREFOLD_MIN_RUN) if prefold is not None else out

    return stage


def _only_where(bad: pa.Array, values: pa.Array) -> pa.Array:
    """`values` where `bad`, null elsewhere, holding only those values: `if_else` would keep every value's
    bytes behind the nulls (a whole batch's payloads sent back to the JVM for a few quarantined rows)."""
    is_bad = bad.to_numpy(zero_copy_only=False)
    if not is_bad.any():
        return pa.nulls(len(values), values.type)
    return values.filter(bad).take(pa.array(np.cumsum(is_bad) - 1, mask=~is_bad))  # row i: its place among the bad


# A shorter run travels as its messages: folding it would cost more than the rows it saves.
PREFOLD_MIN_RUN = 64


def prefold_runs(step, batch: pa.RecordBatch, fail_fast: bool, min_run: int) -> pa.RecordBatch:
    """A columnar pre stage's envelopes with each key's runs of messages folded for the keyed `step` (a
    window step that prefolds, see plan._prefolds): a run's last row stands for it, carrying the pickled
    `windows.Folded` in `msg`; its other rows are dropped. The keyed step takes far fewer rows, and the
    folding runs here, on every core, rather than in the key's one task.

    A run joins a key's messages only across rows whose sequence numbers are consecutive in this batch:
    every number between two of them is then in this batch (the query's sequence numbers are unique),
    so no other task holds a message of the key between them. A gap (another stream's message, a row
    filtered out, the next file) ends the run. If folding raises, the batch goes on unfolded, and the
    keyed step meets the error as it would have."""
    kind = batch.column("kind").to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(kind == "msg")
    if len(rows) < min_run:
        return batch
    codes, _ = pd.factorize(batch.column("key").take(pa.array(rows)).to_numpy(zero_copy_only=False))
    by_key = np.argsort(codes, kind="stable")  # each key's messages together, in the batch's order
    order, codes = rows[by_key], codes[by_key]
    seq = batch.column("seq").to_numpy()
    contiguous = np.cumsum(np.r_[True, seq[1:] != seq[:-1] + 1])  # equal: consecutive numbers between
    branch = batch.column("branch").to_numpy()
    breaks = np.r_[True, (codes[1:] != codes[:-1]) | (contiguous[order][1:] != contiguous[order][:-1])
                   | (branch[order][1:] != branch[order][:-1])]
    decoded = [n for n in batch.schema.names if n.startswith(DECODED_PREFIX)]
    frame = spark_frame(pa.Table.from_batches([batch.select(decoded)]).take(pa.array(order)))
    frame = frame.set_axis([c[len(DECODED_PREFIX):] for c in decoded], axis=1)
    frame["_stream"] = batch.column("stream").take(pa.array(order)).to_numpy(zero_copy_only=False)
    frame["_seq"] = seq[order]
    try:
        runs = call_user(step.name, fail_fast, step.prefold, frame, breaks, min_run)
    except Quarantined:
        return batch
    if not runs:
        return batch
    keep = np.ones(batch.num_rows, dtype=bool)
    msg = batch.column("msg").to_pylist()
    for lo, hi, folded in runs:
        keep[order[lo:hi - 1]] = False
        msg[order[hi - 1]] = dumps(folded)
    columns = [pa.array(msg, pa.binary()) if name == "msg" else batch.column(name) for name in batch.schema.names]
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema).filter(pa.array(keep))


class _Envelopes:
    """A pre stage's output envelopes, column by column; `src` is the input row each came from, whose
    landing metadata (stream, receive time, connection) it carries: taken from the batch's Arrow
    columns at the end, not row by row."""

    __slots__ = ("src", "kind", "seq", "part", "branch", "key", "msg", "step", "reason", "payload")
    CARRIED = ("stream", "receive_time", "connection")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, [])

    def add(self, i: int, kind, seq, part, branch, key, msg, step, reason, payload) -> None:
        self.src.append(i)
        self.kind.append(kind)
        self.seq.append(seq)
        self.part.append(part)
        self.branch.append(branch)
        self.key.append(key)
        self.msg.append(msg)
        self.step.append(step)
        self.reason.append(reason)
        self.payload.append(payload)

    def batch(self, landing: pa.RecordBatch) -> pa.RecordBatch:
        rows = pa.array(self.src, pa.int64())
        arrays = [
            landing.column(f.name).take(rows).cast(f.type) if f.name in self.CARRIED
            else pa.nulls(len(rows), f.type) if f.name == "origin"  # the first level's messages have none
            else pa.array(getattr(self, f.name), f.type)
            for f in ENVELOPE
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=ENVELOPE)


def make_pre_stage(plan: QueryPlan, fail_fast: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The plan's pre stage, for mapInArrow: landing rows in, envelopes (`plan.stage_schema`) out."""
    if plan.mode is QueryMode.ENVELOPE:
        stage = _make_envelope_stage(plan, fail_fast)
    else:
        stage = make_columnar_stage(plan, fail_fast)
    if closable(plan):  # close records (eventide run --close-windows) reach their key undecoded
        stage = split_close_records(plan, stage)
    if not plan.timers:
        return stage

    def without_ticks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # The clock's ticks (see runner) only make the batch run.
        return stage(b.filter(pc.not_equal(b.column("stream"), TICK_STREAM)) for b in batches)

    return without_ticks


def _make_envelope_stage(plan: QueryPlan, fail_fast: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    by_stream = {b.stream: (i, b) for i, b in enumerate(plan.branches)}
    quarantine_landing = plan.quarantine_landing_errors
    keyed = plan.keyed
    kind = "msg" if keyed else "out"

    def pre_stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            # As Python values only what the steps read (receive_time's datetimes would cost the most).
            cols = {c: batch.column(c).to_pylist() for c in ("stream", "seq", "connection", "payload", "landing_error")}
            out = _Envelopes()

            def quarantine(i, step, reason, out=out, cols=cols):
                out.add(i, "quarantine", cols["seq"][i], 0, by_stream[cols["stream"][i]][0], QUARANTINE_KEY,
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
                    msg = decode_one(dec, cols["payload"][i], fail_fast)
                except Quarantined as q:
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
                                raise Quarantined("key_by", f"key function returned None for {m!r}")
                            key = str(key)
                    except Quarantined as q:
                        quarantine(i, q.step, q.reason)
                        continue
                    part = parts[i] = parts.get(i, -1) + 1
                    out.add(i, kind, cols["seq"][i], part, branch_no, key, dumps(m), None, None, None)
            yield out.batch(batch)

    return pre_stage


def _apply_step_to_rows(step: Computation, pairs: list, fail_fast: bool, quarantine: Callable) -> list:
    """One stateless step over (input row, message) pairs; a failure quarantines the input row it came from."""
    if not step.batch:
        out = []
        for i, m in pairs:
            try:
                out.extend((i, o) for o in call_user(step.name, fail_fast, step.apply, m))
            except Quarantined as q:
                quarantine(i, q.step, q.reason)
        return out
    if not pairs:
        return []
    try:
        records = apply_batch_computation(step, [{**to_record(m), "_row": i} for i, m in pairs], fail_fast)
        if any("_row" not in r for r in records):
            raise UserFunctionError(f"batch computation {step.name!r} must keep the `_row` column (which input each row answers)")
    except (Quarantined, UserFunctionError) as e:
        if fail_fast and isinstance(e, UserFunctionError):
            raise
        reason = e.reason if isinstance(e, Quarantined) else str(e)
        for i in sorted({i for i, _ in pairs}):
            quarantine(i, step.name, reason)
        return []
    return [(int(r.pop("_row")), r) for r in records]


# -- stateless steps (also after the state computation) ---------------------------------------
def apply_steps(steps: list, msgs: list, fail_fast: bool) -> list:
    """Stateless steps over messages: one-message steps one at a time, batch steps on all of them."""
    for step in steps:
        if getattr(step, "batch", False):
            msgs = apply_batch_computation(step, msgs, fail_fast) if msgs else []
            continue
        nxt = []
        for m in msgs:
            nxt.extend(call_user(step.name, fail_fast, step.apply, m))
        msgs = nxt
    return msgs


def apply_batch_computation(step: Computation, msgs: list, fail_fast: bool) -> list:
    """A batch computation: all messages in as one DataFrame, records out."""
    df = pd.DataFrame.from_records([to_record(m) for m in msgs])
    out = call_user(step.name, fail_fast, step.fn, df)
    return frame_to_records(step.name, out)
