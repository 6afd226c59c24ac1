"""Planning: an Application's pipelines become QueryPlans, one Spark query each.

A plan resolves each source's decoder, checks that the engine can run the pipeline, and picks how
messages travel (QueryMode) and whether the stateful step needs timers (TimeMode).

A multi-level pipeline (key_by again after a state computation, or a state computation right after
another: `Pipeline.levels`) is still one query: its first level is the plan itself, each later level a
plan of its own in `QueryPlan.levels`, run as one more stateful operator of the same query
(engine/levels.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import pyarrow as pa

from transforms.api import Application, DeltaSink, KafkaTopic, KeyMark, Merged, Pipeline, StateComputation
from transforms.engine.envelope import DECODED_PREFIX, ENVELOPE
from transforms.settings import Settings

# The envelope columns a direct plan's rows do not carry: the keyed step's and the next level's.
DIRECT_UNUSED = ("part", "branch", "key", "msg", "origin")


class QueryMode(str, Enum):
    """How messages travel from the pre stage to the sinks. Every mode gives the same results."""

    ENVELOPE = "envelope"
    """Messages travel pickled in envelopes: works for every pipeline."""
    DIRECT = "direct"
    """Unkeyed, one schema'd Delta sink (bronze): the decoded columns are the sink's rows."""
    COLUMNAR = "columnar"
    """Keyed into a batch state computation by a field name: the decoded columns go to it as a
    DataFrame, no Python object per message."""


class TimeMode(str, Enum):
    """The stateful step's time mode; the values are what Spark's transformWithState takes."""

    NONE = "None"
    """No timers."""
    PROCESSING_TIME = "ProcessingTime"
    """A state computation has `on_timer`: timers fire on processing time."""


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
    time_mode: TimeMode = TimeMode.NONE
    mode: QueryMode = QueryMode.ENVELOPE
    # direct/columnar: the decoded columns (for merged branches, the union of their decoders' columns)
    decoded_schema: pa.Schema | None = None
    # Where the query reads: None, the home's log (landed streams); a KafkaTopic, a user's topic (kafka_source)
    origin: KafkaTopic | None = None
    # The state computation's ttl_ms: Spark removes a key's state untouched that long (processing time)
    state_ttl_ms: int | None = None
    # A multi-level pipeline's later levels, in order: each a plan of one level's steps (its branches keyed
    # by that level's key, no sinks), run as the next stateful operator of this query. Their timers count in
    # this plan's time_mode (the query's clock); each level's own time_mode and state_ttl_ms are its own.
    levels: tuple[QueryPlan, ...] = ()
    # Which level of its query a plan runs: 0 the query's own plan, k its levels[k - 1]
    level: int = 0
    # The pre stage folds each key's runs of messages for the first step (a WindowComputation that
    # prefolds: see stages.prefold_runs); the keyed step merges them
    prefold: bool = False

    @property
    def messages_as_objects(self) -> bool:
        """Whether its messages travel as Python objects (envelope mode): a message then costs a stage
        far more memory than a column's value, so a micro-batch is bounded by messages too
        (landing.bytes_per_trigger)."""
        return self.mode is QueryMode.ENVELOPE

    @property
    def stage_schema(self) -> pa.Schema:
        """What the pre stage emits: the envelope, plus the decoded columns in direct/columnar mode. A
        direct plan's rows go straight to its sink or the quarantine, so they leave out what only the
        steps after a pre stage read (DIRECT_UNUSED: null in every row, yet bytes on the way back)."""
        if self.mode is QueryMode.ENVELOPE:
            return ENVELOPE
        envelope = [f for f in ENVELOPE if not (self.mode is QueryMode.DIRECT and f.name in DIRECT_UNUSED)]
        return pa.schema(envelope + [pa.field(DECODED_PREFIX + f.name, f.type) for f in self.decoded_schema])

    @property
    def streams(self) -> list[str]:
        return [b.stream for b in self.branches]

    @property
    def timers(self) -> bool:
        return self.time_mode is not TimeMode.NONE

    @property
    def spark_time_mode(self) -> TimeMode:
        """What transformWithState runs in: Spark's state TTL needs processing time (even without timers)."""
        return TimeMode.PROCESSING_TIME if self.state_ttl_ms is not None else self.time_mode

    def app_id(self, sink: str) -> str:
        return f"{self.name}@g{self.generation}:{sink}"

    def checkpoint(self, settings: Settings) -> Path:
        return settings.checkpoints / self.name / f"v{self.generation}"


def plan_queries(app: Application, settings: Settings, decoders: dict | None = None) -> list[QueryPlan]:
    """Split an application into query plans; resolve each source's decoder."""
    plans = []
    for i, p in enumerate(app.pipelines):
        branches = p.branches if isinstance(p, Merged) else (p,)
        shared_steps = p.steps if isinstance(p, Merged) else ()
        resolved = []
        for b in branches:
            dec = b.decoder or (decoders or {}).get(b.stream) or settings.registry.stream(b.stream).decoder
            resolved.append(Pipeline(b.stream, dec, b.steps + shared_steps, b.key_fn, b.sinks, b.name, origin=b.origin))
        for b in resolved:
            _check_steps(app.name, b)
        origins = {b.origin for b in resolved}
        if len(origins) > 1 or (len(resolved) > 1 and None not in origins):
            raise ValueError(
                f"application {app.name!r}: merged pipelines read {[b.stream for b in resolved]}, of which a "
                "kafka_source: a Kafka topic has no one order with another source, so they cannot share keyed "
                "state; give each its own pipeline and state"
            )
        origin = origins.pop()
        groups = {settings.group_of(b.stream) if origin is None else f"kafka:{origin.topic}" for b in resolved}
        if len(groups) > 1:
            raise ValueError(
                f"application {app.name!r}: merged pipelines read streams {[b.stream for b in resolved]} "
                f"from different sequence groups {sorted(groups)}; streams that share state must share a group "
                "(register the app so that its merged streams land together)"
            )
        keyed = {b.key_fn is not None for b in resolved}
        if len(keyed) > 1:
            raise ValueError(f"application {app.name!r}: merged pipelines must all be keyed")
        sinks = p.sinks
        if not sinks:
            raise ValueError(f"application {app.name!r}: pipeline {i} has no sink (.to_sink(...))")
        timed = any(_timed(steps) for b in resolved for _, steps in b.levels)  # the query's clock: any level's timers
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
                time_mode=TimeMode.PROCESSING_TIME if timed else TimeMode.NONE,
                mode=mode,
                decoded_schema=decoded,
                origin=origin,
                state_ttl_ms=_state_ttl_ms(app.name, resolved),
            )
        )
        plans[-1] = replace(plans[-1], levels=_later_levels(app.name, plans[-1]))
        plans[-1] = replace(plans[-1], prefold=settings.prefold and _prefolds(plans[-1]))
    return plans


def _prefolds(plan: QueryPlan) -> bool:
    """Whether the pre stage may fold runs for the plan's first step: a columnar plan of one level whose
    state computation (shared by every branch, see _choose_mode) says it may."""
    if plan.mode is not QueryMode.COLUMNAR or plan.levels or plan.timers:
        return False
    first = plan.branches[0].post_steps[0]
    return bool(getattr(first, "prefolds", False))


class KeepKey:
    """The key of a level chained without key_by (a state computation right after another): the key
    its messages already have. Pickles as the module's one instance."""

    def __reduce__(self):
        return "KEEP_KEY"

    def __repr__(self) -> str:
        return "KEEP_KEY"


KEEP_KEY = KeepKey()


def _timed(steps) -> bool:
    return any(getattr(s, "on_timer", None) for s in steps)


def _later_levels(app: str, first: QueryPlan) -> tuple[QueryPlan, ...]:
    """The plans of the levels after the first of the query planned as `first`: each branch's steps of
    that level, keyed by the level's key (KEEP_KEY when chained without key_by)."""
    branches = first.branches
    per_branch = [b.levels for b in branches]
    if len({len(levels) for levels in per_branch}) > 1:
        raise ValueError(
            f"application {app!r}: merged pipelines {[b.stream for b in branches]} have different numbers of levels "
            f"({[len(levels) for levels in per_branch]}): a merge shares each level's keyed state, so every branch "
            "needs the same key_bys and state computations after the merge; give the extra ones to merge(...)"
        )
    out = []
    for k in range(1, len(per_branch[0])):
        level = tuple(
            Pipeline(b.stream, None, (KeyMark(), *levels[k][1]), KEEP_KEY if levels[k][0] is None else levels[k][0],
                     name=b.name, origin=b.origin)
            for b, levels in zip(branches, per_branch))
        timed = any(_timed(b.post_steps) for b in level)
        out.append(replace(first, branches=level, sinks=(), keyed=True, mode=QueryMode.ENVELOPE, decoded_schema=None,
                           time_mode=TimeMode.PROCESSING_TIME if timed else TimeMode.NONE,
                           state_ttl_ms=_state_ttl_ms(app, level), levels=(), level=k))
    return tuple(out)


def _state_ttl_ms(app: str, branches) -> int | None:
    """The state TTL of a query (or of one level of a multi-level pipeline): a key's state computations
    keep their states in one value, so they expire together and must declare the same ttl_ms."""
    steps = {s.name: s.ttl_ms for b in branches for s in b.post_steps if isinstance(s, StateComputation)}
    if len(set(steps.values())) > 1:
        raise ValueError(f"application {app!r}: the state computations of one query keep a key's states "
                         f"together, so they expire together; their ttl_ms differ: {steps}; give them the same")
    return next(iter(steps.values()), None)


def _check_steps(app: str, b: Pipeline) -> None:
    """The engine runs a state computation only first after its key_by (or right after the previous
    level's): reject the rest here, not at run time (where every message would go to quarantine)."""
    where = f"application {app!r}: pipeline on stream {b.stream!r}"
    for s in b.pre_steps:
        if isinstance(s, StateComputation):
            raise ValueError(f"{where} has state computation {s.name!r} before key_by; key the pipeline first")
    for _, post in b.levels:
        states = [s for s in post if isinstance(s, StateComputation)]
        if states and post[0] is not states[0]:
            raise ValueError(
                f"{where} has step {post[0].name!r} between key_by and state computation {states[0].name!r}; "
                "Eventide runs the state computation first after key_by — move the step before key_by"
            )


def _choose_mode(branches: list[Pipeline], sinks: tuple, keyed: bool, timed: bool) -> tuple[QueryMode, pa.Schema | None]:
    """Columns instead of pickled objects where nothing needs the objects (same results, faster)."""
    if any(b.pre_steps or b.decoder.schema is None for b in branches):
        return QueryMode.ENVELOPE, None
    if not keyed:
        sink = sinks[0]
        if len(branches) == 1 and len(sinks) == 1 and isinstance(sink, DeltaSink) and sink.schema is not None and sink.accepts is None:
            return QueryMode.DIRECT, branches[0].decoder.schema
        return QueryMode.ENVELOPE, None
    first = branches[0].post_steps[0] if branches[0].post_steps else None
    if timed or not (isinstance(first, StateComputation) and first.batch):
        return QueryMode.ENVELOPE, None
    if any(not isinstance(b.key_fn, str) or b.key_fn != branches[0].key_fn or not b.post_steps or b.post_steps[0] is not first
           for b in branches):
        return QueryMode.ENVELOPE, None
    union: dict[str, pa.Field] = {}
    for b in branches:
        for f in b.decoder.schema:
            if f.name in union and union[f.name].type != f.type:
                return QueryMode.ENVELOPE, None  # same name, different types: keep objects
            union.setdefault(f.name, f)
    if first.reads is not None:  # only what the state step reads travels to it
        unknown = [c for c in first.reads if c not in union]
        if unknown:
            raise ValueError(f"{first.name!r} reads field(s) {unknown} that no decoder of its pipeline gives "
                             f"(decoded fields: {list(union)}); fix the aggregator's columns=... or the decoder")
        keep = {*first.reads, branches[0].key_fn}  # the key too, when it is a decoded field
        union = {name: f for name, f in union.items() if name in keep}
    return QueryMode.COLUMNAR, pa.schema(list(union.values()))
