"""Multi-level pipelines: a pipeline that keys again runs every level in one Spark query.

    source("events", decoder=...)
        .key_by("key").to(event_time_windows(50, event_time="ms").over(total))              # level 1
        .to(event_time_windows(1000, event_time=lambda w: w.end_ms - 1).over(sum_of_sums))  # level 2, same key
        .key_by(region_of).to(...)                                                          # level 3, a new key

Each key_by, and each state computation right after another (stateless steps may sit between them),
starts a level (`Pipeline.levels`); its plan is `QueryPlan.levels[k]` (the first level is the query's
plan itself). The query chains the levels' stateful operators:

    pre stage -> transformWithState (level 1) -> re-key -> transformWithState (level 2) -> ... -> sinks

The re-key stage (mapInArrow, `make_rekey_stage`) turns a level's outputs ("out" envelopes) into the
next level's messages ("msg" envelopes) under their new key: the level's key function of the output,
or the key they have (KEEP_KEY). Quarantine rows pass through every level untouched, and a key function
that raises quarantines its output (step `key_by`). A close record of a later level (`eventide run
--close-windows`, close_windows.py) passes the levels before it the same way and gets its key (which it
carries in `payload`) at its own level's re-key stage.

Order: an output keeps the sequence number of the input message it answers (-1 for what a timer
emitted), its `origin` is the key that produced it, and its `part` is renumbered to its rank among the
outputs of that input (so parts stay small through any number of levels). A level sees its key's
messages in (seq, origin, part) order (`keyed_state.input_order`): inputs in landing order; one input's
outputs from several keys of the previous level key by key; each key's in the order it produced them;
a timer's outputs first in their micro-batch. A total order, whatever partitions and arrival order
Spark's shuffle gives (a partition's ranks alone tie across partitions), so a replayed batch is decided
as the first time. Every level's state lives in the query's one checkpoint, each level's in its own operator,
in the checkpoint's one layout (grouped by key when any level has timers); the query commits a batch
once all levels have run it, and its sink writes carry the batch id as a single-level query's do: kill
-9 anywhere replays the whole batch through every level, exactly once.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.engine.close_windows import close_connection
from transforms.engine.envelope import ENVELOPE, QUARANTINE_KEY, Quarantined
from transforms.engine.keyed_state import stateful_step
from transforms.engine.plan import KEEP_KEY, QueryPlan
from transforms.engine.stages import _key_of


def make_rekey_stage(level: QueryPlan, fail_fast: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow: the previous level's output envelopes in, `level`'s input envelopes out (a whole
    partition at once: the outputs of one input are renumbered together)."""
    keys = [b.key_fn for b in level.branches]
    closes_here = close_connection(level)  # close records of this level

    def rekey(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(batches)
        if not batches:
            return
        table = pa.Table.from_batches(batches, schema=ENVELOPE)
        if not table.num_rows:
            return
        kind = table.column("kind").to_pylist()
        key = table.column("key").to_pylist()
        origin = table.column("origin").to_pylist()
        step = table.column("step").to_pylist()
        reason = table.column("reason").to_pylist()
        msg = table.column("msg")
        msgs = msg.to_pylist()  # once: a scalar per row costs 20x more
        payload = table.column("payload")
        branch = table.column("branch").to_pylist()
        cols = {c: table.column(c).to_pylist() for c in ("stream", "connection")}  # key_by("stream"|"connection")
        for i, k in enumerate(kind):
            if k == "close" and cols["connection"][i] == closes_here:
                key[i] = payload[i].as_py().decode("utf-8")
                continue
            if k != "out":
                key[i] = QUARANTINE_KEY  # quarantine rows (and later levels' close records) pass the level
                continue
            fn = keys[branch[i]]
            kind[i], origin[i] = "msg", key[i]  # the key that produced it: its order at the next level
            if fn is KEEP_KEY:
                continue
            try:
                m = pickle.loads(msgs[i])
                new = _key_of(fn, m, cols, i, fail_fast)
                if new is None:
                    raise Quarantined("key_by", f"key function returned None for {m!r}")
                key[i] = str(new)
            except Quarantined as q:
                kind[i], key[i], step[i], reason[i] = "quarantine", QUARANTINE_KEY, q.step, q.reason
        quarantined = pa.array([k == "quarantine" for k in kind])
        parts = ranks_within(table.column("seq").to_numpy(), table.column("part").to_numpy())
        for name, column in (("kind", pa.array(kind, pa.string())), ("key", pa.array(key, pa.string())),
                             ("step", pa.array(step, pa.string())), ("reason", pa.array(reason, pa.string())),
                             ("origin", pa.array(origin, pa.string())),
                             ("msg", pc.if_else(quarantined, pa.scalar(None, pa.binary()), msg)),
                             ("part", pa.array(parts, pa.int32()))):
            table = table.set_column(table.schema.get_field_index(name), name, column)
        yield from table.to_batches()

    return rekey


def ranks_within(seq: np.ndarray, part: np.ndarray) -> np.ndarray:
    """Each row's rank among the rows of its `seq`, in `part` order (ties in row order): the parts of a
    level's outputs renumbered from 0, the order kept."""
    n = len(seq)
    order = np.lexsort((np.arange(n), part, seq))
    s = seq[order]
    starts = np.r_[True, s[1:] != s[:-1]] if n else np.zeros(0, dtype=bool)
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = np.arange(n) - first
    return ranks


def next_level(env, level: QueryPlan, fail_fast: bool, layout, fold=None):
    """The previous level's output envelopes through `level`: re-keyed, then its stateful operator (the
    last level's with the sinks' pass folded in: stateful_step's `fold`)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    rekeyed = env.mapInArrow(make_rekey_stage(level, fail_fast), from_arrow_schema(ENVELOPE))
    return stateful_step(rekeyed, level, fail_fast, layout, fold)
