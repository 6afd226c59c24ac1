"""Closing every open window at the end of a finite input (`eventide run --close-windows`).

Spark calls a key's transformWithState handler only for the key's input rows or its expired timers,
so closing the windows of *every* key needs an input row per key. After the normal run of a query:

1. the query's keyed state is read with Spark's state data source (`format("statestore")`, the
   committed state of its last batch); on the executors each key's states are unpickled and the keys
   whose window step has an open window are kept;
2. one *close record* per such key is landed in the query's own log (its first stream, connection
   `CLOSE_PREFIX + query name`, the key as payload), in one append: a logged, replayable input like any
   message, so the close is exactly once and the same on replay (a run killed during it processes the
   same records again from its checkpoint, and a key's windows are closed by one committed batch);
3. the query runs once more. Its pre stage turns a close record into a "close" envelope for its key
   without calling the user's key function; the stateful step calls the window step's `close_at_end`
   (every open window closes, reason `end_of_input`). State computations without that hook (a user's
   own) never see close records.

A multi-level pipeline (engine/levels.py) is closed level by level: its first level as above, then for
each later level the keys with an open window in that level's state (its own stateful operator) get
close records of that level (connection `CLOSE_PREFIX + query name + "#" + level`), which pass the
levels before it untouched and reach the level's key at its re-key stage; each level's close runs the
query once more, so what closing a level emits reaches the next level before that one is closed.

Every other query of the log filters the records out (`keep_close_records`): bronze tables and other
apps never see them. A query that reads a user's Kafka topic (kafka_source) is not closed: Eventide
does not write to a user's topic. `<checkpoint>/eventide-closed-at` holds the last committed batch
after a close: while no batch has committed since, nothing can be open and the state is not read again
(no Spark for a run with nothing new).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from transforms.engine.checkpoints import batch_ids
from transforms.engine.envelope import QUARANTINE_KEY
from transforms.engine.plan import QueryPlan
from transforms.engine.state_layout import StateLayout
from transforms.files import write_text_atomic
from transforms.settings import Settings

CLOSE_PREFIX = "\x00close:"  # the landing `connection` of a close record: never a gateway connection's
CLOSED_AT_FILE = "eventide-closed-at"


def close_connection(plan: QueryPlan, level: int | None = None) -> str:
    """The connection of the close records of a level of the plan's query (default: the plan's own)."""
    level = plan.level if level is None else level
    return CLOSE_PREFIX + plan.name + (f"#{level}" if level else "")


def close_connections(plan: QueryPlan) -> list[str]:
    """The connections of the close records of every level of the plan's query, first level first."""
    return [close_connection(plan, level) for level in range(len(level_plans(plan)))]


def level_plans(plan: QueryPlan) -> tuple[QueryPlan, ...]:
    """The plans of the query's levels, first to last (one for a single-level pipeline)."""
    return (plan, *plan.levels)


def window_steps(plan: QueryPlan) -> list:
    """The plan's state computations that can close at the end of input (window steps), each once."""
    steps = {}
    for b in plan.branches:
        post = b.post_steps
        if post and callable(getattr(post[0], "close_at_end", None)):
            steps[id(post[0])] = post[0]
    return list(steps.values())


def closable(plan: QueryPlan) -> bool:
    """Keyed, reading the home's log (close records are landed there), with a window step (in any level)."""
    return plan.keyed and plan.origin is None and any(window_steps(p) for p in level_plans(plan))


def keep_close_records(df, plan: QueryPlan):
    """The landing rows the plan reads: close records only if they are its own."""
    from pyspark.sql import functions as F

    if plan.origin is not None:  # a user's Kafka topic: Eventide never lands close records there
        return df
    conn = F.col("connection")
    others = conn.isNull() | ~conn.startswith(CLOSE_PREFIX)
    return df.where(others | conn.isin(close_connections(plan)) if closable(plan) else others)


def last_committed(settings: Settings, plan: QueryPlan) -> int:
    return max(batch_ids(plan.checkpoint(settings) / "commits"), default=-1)


def close_due(settings: Settings, plan: QueryPlan) -> bool:
    """Whether a close could find an open window: some batch committed since the last close."""
    committed = last_committed(settings, plan) if closable(plan) else -1
    if committed < 0:
        return False
    try:
        closed_at = int((plan.checkpoint(settings) / CLOSED_AT_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return True
    return closed_at != committed


def record_closed(settings: Settings, plan: QueryPlan) -> None:
    write_text_atomic(plan.checkpoint(settings) / CLOSED_AT_FILE, f"{last_committed(settings, plan)}\n")


def open_keys(spark, plan: QueryPlan, settings: Settings, layout, level: int = 0) -> list[str]:
    """The keys whose window step has an open window in the query's last committed state (of `level`,
    for a multi-level pipeline), sorted."""
    steps = [(sc.state_name, sc) for sc in window_steps(level_plans(plan)[level])]
    if not steps or not (plan.checkpoint(settings) / "state").is_dir():
        return []
    # Spark numbers a query's stateful operators from the last one: the last level is operator 0.
    operator = len(plan.levels) - level
    reader = spark.read.format("statestore").option("stateVarName", "states").option("operatorId", operator)
    state = reader.load(str(plan.checkpoint(settings).absolute()))
    if layout is StateLayout.BUCKET:  # a map state under the bucket: the user key is the map's key
        state = state.selectExpr("user_map_key.key AS key", "user_map_value.blob AS blob")
    else:
        state = state.selectExpr("key.key AS key", "value.blob AS blob")

    def keep_open(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            keys = []
            for key, blob in zip(frame["key"], frame["blob"]):
                states = pickle.loads(blob) if blob is not None else {}
                if any(sc.open_at_end(states.get(name)) for name, sc in steps):
                    keys.append(key)
            yield pd.DataFrame({"key": pd.Series(keys, dtype=object)})

    return sorted(r[0] for r in state.mapInPandas(keep_open, "key string").collect())


def land_close_records(settings: Settings, plan: QueryPlan, keys: list[str], level: int = 0) -> None:
    """One close record per key (of `level`) in the query's log, in one append (landing: whole segments)."""
    from transforms.ingestion import open_log
    from transforms.ingestion.landing import LandingBusy

    try:
        with open_log(settings).writer() as writer:
            writer.append_many(plan.streams[0], [k.encode("utf-8") for k in keys], close_connection(plan, level))
    except LandingBusy as e:
        raise RuntimeError(f"{plan.name}: cannot close its windows: {e}") from e


# -- in the pre stage -------------------------------------------------------------------------------
def split_close_records(plan: QueryPlan, stage):
    """The pre stage `stage`, with the plan's close records taken out before it and turned into
    "close" envelopes (kind "close", the record's key, its sequence and branch) after it. A later level's
    record passes the first level as a quarantine envelope would, its key in `payload` (levels.py)."""
    mine = pa.array(close_connections(plan), pa.string())
    first = close_connection(plan, 0)
    branch_of = {b.stream: i for i, b in enumerate(plan.branches)}
    schema = plan.stage_schema

    def run(batches):
        closes: list[pa.RecordBatch] = []

        def data():
            for b in batches:
                is_close = pc.fill_null(pc.is_in(b.column("connection"), value_set=mine), False)
                if pc.any(is_close).as_py():
                    closes.append(b.filter(is_close))
                    b = b.filter(pc.invert(is_close))
                yield b

        yield from stage(data())
        for c in closes:
            yield _close_envelopes(c, schema, branch_of, first)

    return run


def _close_envelopes(rows: pa.RecordBatch, schema: pa.Schema, branch_of: dict, first: str) -> pa.RecordBatch:
    n = rows.num_rows
    here = pc.equal(rows.column("connection"), first)  # for the first level; a later one's pass it
    cols = {
        "kind": pa.repeat(pa.scalar("close"), n),
        "seq": rows.column("seq"),
        "part": pa.repeat(pa.scalar(0, pa.int32()), n),
        "branch": pa.array([branch_of[s] for s in rows.column("stream").to_pylist()], pa.int32()),
        "key": pc.if_else(here, rows.column("payload").cast(pa.string()), pa.scalar(QUARANTINE_KEY)),
        "payload": pc.if_else(here, pa.scalar(None, pa.binary()), rows.column("payload")),
        "stream": rows.column("stream"),
        "receive_time": rows.column("receive_time"),
        "connection": rows.column("connection"),
    }
    arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)

