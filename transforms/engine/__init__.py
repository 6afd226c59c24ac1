"""The engine: compiles an Application's pipelines into Spark Structured Streaming queries.

One query per pipeline (or merged group of pipelines). The modules follow a message's path:

    plan.py          Application -> one QueryPlan per query: decoders resolved, steps checked, QueryMode
    runner.py        wires a plan's stages and runs them (trigger availableNow), exactly once:
      landing/<group>    file stream of closed parquet segments
      stages.py          pre stage (mapInArrow): decode, stateless computations, key function
      keyed_state.py     transformWithStateInPandas grouped by a hash bucket of the key (by the key
                         itself with timers): each key's messages in sequence order through the state
                         computation, the key's state objects held in RocksDB
      levels.py          a multi-level pipeline's later levels: re-keyed, then each its own
                         transformWithStateInPandas, in the same query
      sink_rows.py       every sink's rows from one Python pass over the batch (mapInArrow)
      sinks.py           foreachBatch: quarantine rows first, then one writer per sink: TCP first (a
                         marker file per sink; the bytes go out through the sink's own sender
                         process, transforms/tcp_relay.py, so a kill never cuts a batch), then Delta
                         through Spark's Delta writer (txnAppId = query and table, txnVersion = batch
                         id: Delta skips a replayed batch)
    envelope.py      the rows between the stages, and how user code is called

Every row between stages is an envelope: sequence, part (position among the outputs of one input
message), the pickled message, the input's landing metadata, and at a later level of a multi-level
pipeline the key of the level before that produced it (origin, part of its order: levels.py). Errors in user code become
quarantine envelopes and flow to the quarantine table; with `fail_fast` they stop the query.
"""

from transforms.engine.envelope import ENVELOPE, dumps
from transforms.engine.keyed_state import Context, KeyedStateProcessor
from transforms.engine.plan import QueryMode, QueryPlan, TimeMode, plan_queries
from transforms.engine.report import RunReport
from transforms.engine.runner import build_stream, nothing_new, run_application, run_query
from transforms.engine.sinks import QUARANTINE_SCHEMA, QUARANTINE_TABLE, BatchWriter, resolve_tcp_sinks
from transforms.engine.stages import make_pre_stage

__all__ = [
    "ENVELOPE",
    "QUARANTINE_SCHEMA",
    "QUARANTINE_TABLE",
    "BatchWriter",
    "Context",
    "KeyedStateProcessor",
    "QueryMode",
    "QueryPlan",
    "RunReport",
    "TimeMode",
    "build_stream",
    "dumps",
    "make_pre_stage",
    "nothing_new",
    "plan_queries",
    "resolve_tcp_sinks",
    "run_application",
    "run_query",
]
