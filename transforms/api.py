"""The application API: Wallaroo-style plain-Python apps.

    @decoder(schema=...)                   payload bytes -> message (any record-like object) | Reject(reason)
    @computation("name")                   message -> message | None
    @computation_multi("name")             message -> list of messages
    @state_computation("name", state=Cls)  (message, state) -> output | list | None | (output, changed)
    @encoder                               output -> bytes for a TCP sink

Batch forms (`batch=True`) receive and return pandas DataFrames, for logic that vectorizes; a batch
state computation gets one key's messages in sequence order plus that key's state, and must give the
same outputs as its one-message form would.

Pipelines: `source("text").to(split).key_by(word_of).to(count).to_sink(DeltaSink(...), TCPSink(...))`.
`merge(p1, p2)` joins keyed pipelines so they share one keyed state (by state class); an
`Application` is built from its pipelines and compiled to Spark by `transforms.engine`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


class UserFunctionError(TypeError):
    """A user function broke its contract (wrong return type, missing key). Names the function."""


# -- decorators ------------------------------------------------------------------------------------
def _load_by_reference(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _ByReference:
    """A decorated function pickles as "module.name" when that names it, so Spark's workers import the
    app's module instead of receiving a copy of the function and its globals (a global such as a
    `struct.Struct` cannot be copied). Functions of scripts (`__main__`) and local ones go by value."""

    def __reduce_ex__(self, protocol):
        fn = getattr(self, "fn", None)
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        if module and module != "__main__" and "<locals>" not in qualname and module in sys.modules:
            try:
                named = _load_by_reference(module, qualname)
            except AttributeError:
                named = None
            if named is self:
                return _load_by_reference, (module, qualname)
        return super().__reduce_ex__(protocol)


@dataclass(frozen=True)
class Decoder(_ByReference):
    fn: Callable[[bytes], Any]
    name: str
    schema: pa.Schema | None = None
    header_length: int = 4
    length_fmt: str = ">I"
    batch: bool = False

    # Optional column form: pyarrow BinaryArray of payloads -> pyarrow Table of `schema` columns plus
    # `_error` (None where decoded). It must equal `fn` row for row; the engine then moves messages
    # as typed columns instead of Python objects (see engine: "direct" and "columnar" plans).
    column_fn: Callable | None = field(default=None, compare=False)

    def __call__(self, payload: bytes) -> Any:
        return self.fn(payload)

    def column_form(self, fn: Callable) -> Callable:
        """Register the vectorized form: `@my_decoder.column_form`."""
        if self.schema is None:
            raise TypeError(f"decoder {self.name!r}: a column form needs schema=...")
        object.__setattr__(self, "column_fn", fn)
        return fn


def decoder(
    fn: Callable | None = None,
    *,
    header_length: int = 4,
    length_fmt: str = ">I",
    schema: pa.Schema | None = None,
    batch: bool = False,
    name: str | None = None,
):
    """Declare a payload decoder. `schema` (pyarrow) types the bronze table and empty batches.

    The framing arguments say how the source frames payloads (Wallaroo's `header_length` and
    `length_fmt`); the gateway strips the frame before the decoder sees the payload.
    """

    def wrap(f: Callable) -> Decoder:
        return Decoder(f, name or f.__name__, schema, header_length, length_fmt, batch)

    return wrap(fn) if fn is not None else wrap


@dataclass(frozen=True)
class Reject:
    """What a decoder returns for a payload it refuses for its content (a price below zero, say):
    the payload goes to `quarantine` with `reason` word for word, as when the decoder raises (the
    reason is then the error and where it was raised). A column form says the same with the reason
    in its `_error` column."""

    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason:
            raise UserFunctionError(f"Reject(reason) takes a non-empty str, got {self.reason!r}")


@dataclass(frozen=True)
class Encoder(_ByReference):
    fn: Callable[[Any], bytes]
    name: str

    def __call__(self, output: Any) -> bytes:
        data = self.fn(output)
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise UserFunctionError(f"encoder {self.name!r} returned {type(data).__name__}, expected bytes or str")
        return bytes(data)


def encoder(fn: Callable | None = None, *, name: str | None = None):
    def wrap(f: Callable) -> Encoder:
        return Encoder(f, name or f.__name__)

    return wrap(fn) if fn is not None else wrap


@dataclass(frozen=True)
class Computation(_ByReference):
    fn: Callable
    name: str
    multi: bool = False
    batch: bool = False

    def apply(self, msg: Any) -> list:
        """One message in, the list of messages out (empty for a filtered one)."""
        out = self.fn(msg)
        if self.multi:
            if out is None:
                return []
            if isinstance(out, (str, bytes)) or not isinstance(out, (list, tuple)):
                raise UserFunctionError(
                    f"computation_multi {self.name!r} returned {type(out).__name__}, expected a list"
                )
            return list(out)
        return [] if out is None else [out]


def computation(name: str, *, batch: bool = False):
    """One message in, one out (or None to filter). `batch=True`: DataFrame in, DataFrame out."""

    def wrap(f: Callable) -> Computation:
        return Computation(f, name, multi=False, batch=batch)

    return wrap


def computation_multi(name: str):
    """One message in, a list of messages out."""

    def wrap(f: Callable) -> Computation:
        return Computation(f, name, multi=True)

    return wrap


@dataclass(frozen=True)
class StateComputation(_ByReference):
    fn: Callable
    name: str
    state: type
    batch: bool = False
    # Optional timer hook: on_timer(key, state, expiry_ms[, ctx]) -> outputs (see `Context`).
    on_timer: Callable | None = None
    # True when `fn` takes a third parameter, the `Context` (key, time, timers) of the call.
    with_context: bool = False
    # Time to live of a key's state: untouched that long (processing time), Spark's TTL removes it.
    ttl_ms: int | None = None

    @property
    def state_name(self) -> str:
        return f"{self.state.__module__}.{self.state.__qualname__}"

    def apply(self, msg: Any, state: Any, ctx: Context | None = None) -> list:
        return normalize_outputs(self.name, self.call(msg, state, ctx))

    def call(self, msg_or_frame: Any, state: Any, ctx: Context | None = None) -> Any:
        """Call `fn` as declared: with the context only when it takes one."""
        if self.with_context:
            return self.fn(msg_or_frame, state, ctx)
        return self.fn(msg_or_frame, state)

    @property
    def reads(self) -> tuple[str, ...] | None:
        """The message fields the batch form reads (a columnar query carries only those); None: all."""
        return None

    def fire_timer(self, key: str, state: Any, expiry_ms: int, ctx: Context | None = None) -> list:
        """Call `on_timer` for a timer of `key` that expired at `expiry_ms`; its outputs."""
        if self.on_timer is None:
            return []
        if _n_params(self.on_timer) == 4:
            return normalize_outputs(self.name, self.on_timer(key, state, expiry_ms, ctx))
        return normalize_outputs(self.name, self.on_timer(key, state, expiry_ms))


def normalize_outputs(name: str, out: Any) -> list:
    # Wallaroo's older API returned (output, state_changed); accept it.
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], bool):
        out = out[0]
    if out is None:
        return []
    if isinstance(out, list):
        return [o for o in out if o is not None]
    return [out]


def state_computation(name: str, state: type, *, batch: bool = False, on_timer: Callable | None = None,
                      ttl_ms: int | None = None):
    """`f(message, state)` with the state object of the message's key (created by `state()`).

    `f(message, state, ctx)` also gets the call's `Context`: its key, processing time, watermark,
    the message's sequence number, and `ctx.register_timer(at_ms)`. `on_timer(key, state, expiry_ms)`
    (or `(key, state, expiry_ms, ctx)`) is called when a timer of the key fires; its outputs go to the
    sinks like `f`'s. Declaring `on_timer` runs the pipeline's stateful step with processing-time timers.

    `batch=True`: `f(df, state)` / `f(df, state, ctx)` gets the key's messages as a DataFrame in
    sequence order (column `_seq`) and returns the outputs as a DataFrame (or a list of records).

    `ttl_ms`: a key whose state is not updated for that many milliseconds (processing time) loses it
    (Spark's state TTL); its next message starts from a fresh `state()`.
    """
    check_ttl_ms(name, ttl_ms)
    if not callable(state):
        raise TypeError(f"state_computation {name!r}: state must be a class, got {state!r}")
    if on_timer is not None and (not callable(on_timer) or _n_params(on_timer) not in (3, 4)):
        raise TypeError(
            f"state_computation {name!r}: on_timer must be a function of (key, state, expiry_ms) or "
            f"(key, state, expiry_ms, ctx), got {on_timer!r}"
        )

    def wrap(f: Callable) -> StateComputation:
        n_params = _n_params(f)
        if n_params not in (2, 3):
            raise TypeError(
                f"state_computation {name!r}: {f.__name__} must take (message, state) or (message, state, ctx), "
                f"takes {n_params}"
            )
        return StateComputation(f, name, state, batch, on_timer, with_context=n_params == 3, ttl_ms=ttl_ms)

    return wrap


def check_ttl_ms(step: str, ttl_ms: int | None) -> None:
    if ttl_ms is not None and (isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0):
        raise ValueError(f"{step!r}: ttl_ms must be a positive whole number of milliseconds (or None: the "
                         f"state never expires), got {ttl_ms!r}")


@dataclass(frozen=True)
class Emit:
    """What a batch state computation returns per output when it says which input message (by its
    `_seq`) the output answers; that message's sequence and landing metadata go with the output."""

    seq: int
    value: Any


# -- records ----------------------------------------------------------------------------------------
_DATACLASS_FIELDS: dict[type, tuple[str, ...]] = {}  # a dataclass' field names: dataclasses.fields() is slow


def to_record(obj: Any) -> dict:
    """A message or output as a flat dict: dicts, dataclasses and namedtuples as their fields (a dict
    is returned as it is: copy it before changing it)."""
    names = _DATACLASS_FIELDS.get(type(obj))
    if names is not None:
        return {n: getattr(obj, n) for n in names}
    if isinstance(obj, dict):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _DATACLASS_FIELDS[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
        return {n: getattr(obj, n) for n in names}
    if hasattr(obj, "_asdict"):
        return obj._asdict()
    return {"value": obj}


# -- checks -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """A check on a Delta sink's table: great-expectations `expectations` validated against the whole
    table, or a plain function `fn(df) -> bool | (bool, dict)` of the table as a pandas DataFrame
    (the dict is shown with the result). Failing blocks everything downstream of the table."""

    name: str
    fn: Callable[[Any], Any] | None = None
    expectations: tuple = ()
    description: str = ""
    blocking: bool = True

    def __post_init__(self) -> None:
        if (self.fn is None) == (not self.expectations):
            raise ValueError(f"check {self.name!r}: give either a function or expectations, not both or neither")


def check(name: str | None = None, *, description: str = "", blocking: bool = True):
    """Decorate `f(df) -> bool | (bool, metadata dict)`: a check of a Delta sink's table.
    `f(df, settings)` also gets the settings, to compare with another table (`settings.table_path`)."""

    def wrap(f: Callable) -> Check:
        return Check(name or f.__name__, fn=f, description=description or (f.__doc__ or "").strip(), blocking=blocking)

    return wrap


def expect(name: str, *expectations, description: str = "", blocking: bool = True) -> Check:
    """A check made of great-expectations expectations, e.g.
    `expect("positive", gx.expectations.ExpectColumnValuesToBeBetween(column="count", min_value=1))`."""
    return Check(name, expectations=tuple(expectations), description=description, blocking=blocking)


# -- sinks ------------------------------------------------------------------------------------------
Accepts = type | tuple | Callable[[Any], bool] | None


def _accepts(accepts: Accepts, out: Any) -> bool:
    if accepts is None:
        return True
    if isinstance(accepts, (type, tuple)):
        return isinstance(out, accepts)
    return bool(accepts(out))


@dataclass(frozen=True)
class DeltaSink:
    """Write outputs to a Delta table: `mode="append"`, or `mode="upsert"` by `keys` (last output wins).

    `metadata` adds envelope columns of the message that produced each output: any of
    seq, part, stream, receive_time, connection.
    """

    table: str
    mode: str = "append"
    keys: Sequence[str] = ()
    schema: pa.Schema | None = None
    accepts: Accepts = None
    metadata: Sequence[str] = ()
    partition_by: Sequence[str] = ()
    # Checks on the table, run after every materialization as blocking Dagster asset checks.
    checks: Sequence[Check] = ()
    # Stale (Dagster's freshness policy) after this many minutes without data; None: EVENTIDE_FRESHNESS_MINUTES;
    # 0: no policy (a table written only now and then, like rejections, or once a day, like closed windows).
    freshness_minutes: float | None = None
    # The columns whose per-file statistics Delta keeps for data skipping (the table property
    # delta.dataSkippingStatsColumns, set when the table is created); None: Delta's default, the first 32.
    # Statistics on long strings cost more to write than they save to read (bronze keeps none).
    stats_columns: Sequence[str] | None = None

    def __post_init__(self) -> None:
        for c in self.checks:
            if not isinstance(c, Check):
                raise TypeError(f"DeltaSink {self.table!r}: checks take Check objects (see transforms.api.check), got {c!r}")
        if self.freshness_minutes is not None and self.freshness_minutes != 0 and not self.freshness_minutes >= 1:
            raise ValueError(f"DeltaSink {self.table!r}: freshness_minutes must be 0 (no freshness policy) or at least 1 "
                             f"(Dagster's shortest freshness window), got {self.freshness_minutes!r}")
        if self.mode not in ("append", "upsert"):
            raise ValueError(f"DeltaSink {self.table!r}: mode must be 'append' or 'upsert', got {self.mode!r}")
        if self.mode == "upsert" and not self.keys:
            raise ValueError(f"DeltaSink {self.table!r}: upsert needs keys=[...]")
        if self.stats_columns is not None:
            if isinstance(self.stats_columns, str) or not all(isinstance(c, str) and c for c in self.stats_columns):
                raise TypeError(f"DeltaSink {self.table!r}: stats_columns takes a list of column names, "
                                f"got {self.stats_columns!r}")
            known = self.schema.names + list(self.metadata) if self.schema is not None else None
            unknown = [c for c in self.stats_columns if known is not None and c not in known]
            if unknown:
                raise ValueError(f"DeltaSink {self.table!r}: stats_columns {unknown} are not columns of the table "
                                 f"({known})")

    @property
    def table_properties(self) -> dict[str, str]:
        """The Delta table properties the sink sets when it creates its table."""
        if self.stats_columns is None:
            return {}
        return {"delta.dataSkippingStatsColumns": ",".join(c if c.isidentifier() else f"`{c}`" for c in self.stats_columns)}

    @property
    def name(self) -> str:
        return self.table

    def wants(self, out: Any) -> bool:
        return _accepts(self.accepts, out)


@dataclass(frozen=True)
class TCPSink:
    """Connect to `address` ("HOST:PORT") and write each encoded output; `framed` adds Wallaroo framing."""

    name: str
    encoder: Encoder
    address: str | None = None  # None: from EVENTIDE_SINK_<NAME> at run time
    framed: bool = False
    accepts: Accepts = None
    # True: send only when an address is set (else the sink is off). False: no address stops the app at start.
    optional: bool = False

    def wants(self, out: Any) -> bool:
        return _accepts(self.accepts, out)


@dataclass(frozen=True)
class KafkaSink:
    """Produce each encoded output as one Kafka record: the encoder's bytes as the value, `key(output)`
    (bytes or str; None: no key) as the record's key, to `topic` at `bootstrap` ("HOST:PORT[,HOST:PORT]").
    `EVENTIDE_SINK_<NAME>=kafka://HOST:PORT/TOPIC` (or `off`) overrides both. Exactly once for
    `read_committed` consumers: each micro-batch is one Kafka transaction (see docs/kafka.md, "Kafka as a
    source and a sink")."""

    name: str
    encoder: Encoder
    topic: str | None = None
    key: Callable[[Any], Any] | None = None
    bootstrap: str | None = None
    accepts: Accepts = None
    # True: produce only when an address is set (else the sink is off). False: no address stops the app at start.
    optional: bool = False

    def wants(self, out: Any) -> bool:
        return _accepts(self.accepts, out)

    def key_of(self, out: Any) -> bytes | None:
        """The record key of an output (bytes), or None."""
        if self.key is None:
            return None
        k = self.key(out)
        if k is None or isinstance(k, bytes):
            return k
        if isinstance(k, str):
            return k.encode()
        if isinstance(k, (bytearray, memoryview)):
            return bytes(k)
        raise UserFunctionError(f"KafkaSink {self.name!r}: key function returned {type(k).__name__}, expected bytes, str or None")


Sink = DeltaSink | TCPSink | KafkaSink


# -- pipelines --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pipeline:
    stream: str
    decoder: Decoder | None = None  # None: the decoder another registered app declares for the stream
    steps: tuple = ()  # Computation (before the key), then after key_by: StateComputation, Computations
    key_fn: Callable | None = None
    sinks: tuple = ()
    name: str | None = None
    port: int | None = None  # the gateway port for this stream (EVENTIDE_PORTS overrides; None: assigned)
    bronze_table: str | None = None  # default: bronze_<stream>
    origin: KafkaTopic | None = None  # None: the landed stream (gateway, ingest); else read from there (kafka_source)

    def to(self, step: Computation | StateComputation) -> Pipeline:
        """Add a step. A state computation comes first after its key_by; one after another state
        computation (stateless steps may sit between them) starts a new level keyed as the first (see
        `levels`)."""
        if isinstance(step, StateComputation) and self.key_fn is None:
            raise ValueError(f"pipeline {self.stream!r}: key_by(...) must come before state computation {step.name!r}")
        if not isinstance(step, (Computation, StateComputation)):
            raise TypeError(f"pipeline {self.stream!r}: .to() takes a computation or state computation, got {step!r}")
        if isinstance(step, StateComputation):
            check_level_start(f"pipeline {self.stream!r}", self.levels[-1][1], step)
        return dataclasses.replace(self, steps=(*self.steps, step))

    def key_by(self, fn: Callable[[Any], Any] | str) -> Pipeline:
        """Route messages to their key's state: a function of the message, or a name: a field of the
        message, or the landing column `stream` or `connection` (one state per source). On a keyed
        pipeline, after its state computation: key the outputs again, for the next level's state."""
        if self.key_fn is None:
            return dataclasses.replace(self, key_fn=fn, steps=(*self.steps, KeyMark()))
        check_rekey(f"pipeline {self.stream!r}", self.levels[-1][1])
        return dataclasses.replace(self, steps=(*self.steps, KeyMark(fn)))

    def to_sink(self, *sinks: Sink) -> Pipeline:
        return dataclasses.replace(self, sinks=(*self.sinks, *sinks))

    def named(self, name: str) -> Pipeline:
        return dataclasses.replace(self, name=name)

    # The parts around the key: stateless steps before it, state computation and steps after it.
    @property
    def pre_steps(self) -> list[Computation]:
        out = []
        for s in self.steps:
            if isinstance(s, KeyMark):
                break
            out.append(s)
        return out

    @property
    def post_steps(self) -> list:
        """The first level's steps: its state computation and the stateless steps after it."""
        levels = self.levels
        return levels[0][1] if levels else []

    @property
    def levels(self) -> list[tuple[Callable | str | None, list]]:
        """The keyed part, level by level: (key, steps) for each key_by and for each state computation
        that follows another one. A level's steps are its state computation and the stateless steps
        after it, up to the next level; its key is what key_by gave (None: the key the messages have,
        for a state computation chained without key_by). Each level's outputs are the next one's
        messages. [] for an unkeyed pipeline."""
        if self.key_fn is None:
            return []
        start = next(i for i, s in enumerate(self.steps) if isinstance(s, KeyMark))
        return split_levels(self.key_fn, self.steps[start + 1:])


def split_levels(key: Callable | str | None, steps) -> list[tuple[Callable | str | None, list]]:
    """The steps after a pipeline's first key_by (keyed by `key`), level by level (see Pipeline.levels)."""
    levels: list[tuple[Any, list]] = [(key, [])]
    for s in steps:
        if isinstance(s, KeyMark):
            levels.append((s.fn, []))
        elif isinstance(s, StateComputation) and any(isinstance(x, StateComputation) for x in levels[-1][1]):
            levels.append((None, [s]))
        else:
            levels[-1][1].append(s)
    return levels


@dataclass(frozen=True)
class KeyMark:
    """Where key_by sits in a pipeline's steps. `fn`: the key of a later key_by (the first one's is
    the pipeline's `key_fn`); None keeps the key the messages have."""

    fn: Callable | str | None = None


def check_level_start(where: str, level: list, step: StateComputation) -> None:
    """A state computation starts its level (after key_by, or after the previous level's state
    computation): refuse one that would follow stateless steps of a level without state."""
    if level and not any(isinstance(s, StateComputation) for s in level):
        raise ValueError(
            f"{where}: state computation {step.name!r} comes after step {level[0].name!r}, and Eventide runs a "
            "state computation first after its key_by: move the step before key_by (a step after an earlier "
            "state computation goes with that one)"
        )


def check_rekey(where: str, level: list) -> None:
    """key_by on a keyed pipeline starts the next level: the current one must have its state computation."""
    if not any(isinstance(s, StateComputation) for s in level):
        raise ValueError(
            f"{where} is already keyed and has no state computation since: key_by again only after a state "
            "computation or window step (each key_by starts a level of keyed state); drop one of the key_bys"
        )


def source(stream: str, decoder: Decoder | None = None, *, port: int | None = None,
           bronze_table: str | None = None) -> Pipeline:
    """A pipeline reading a landed stream (TCP through the gateway, or files through `ingest`).

    Declaring a source declares its stream: `decoder` turns each payload into a message (another app
    reading the same stream may omit it, or must give the same one), `port` is the gateway's port for
    it (else `EVENTIDE_PORTS`, else a free port, printed by `eventide serve`), `bronze_table` names the
    stream's decoded copy (default `bronze_<stream>`).
    """
    if not isinstance(stream, str) or not stream.isidentifier():
        raise ValueError(f"source({stream!r}): a stream name is a Python-style identifier, e.g. 'temps'")
    if decoder is not None and not isinstance(decoder, Decoder):
        raise TypeError(f"source({stream!r}): decoder must be made with @decoder, got {decoder!r}")
    return Pipeline(stream=stream, decoder=decoder, port=port, bronze_table=bronze_table)


KAFKA_PARTITION_SHIFT = 40  # a Kafka-sourced message's seq: partition << 40 | (offset + 1)


@dataclass(frozen=True)
class KafkaTopic:
    """Where a Kafka-sourced stream reads: `topic` at `bootstrap` ("HOST:PORT[,HOST:PORT]"), from
    `starting_offsets` ("earliest", "latest", or Spark's JSON of offsets per partition) on its first run;
    later runs go on from the offsets in the query's checkpoint."""

    topic: str
    bootstrap: str
    starting_offsets: str = "earliest"


def kafka_source(stream: str, decoder: Decoder, *, topic: str, bootstrap: str,
                 starting_offsets: str = "earliest") -> Pipeline:
    """A pipeline reading a user's Kafka topic straight (no gateway, no landing, no bronze table): the
    decoder gets each record's value bytes. Each message carries its record's metadata where a landed one
    carries its landing's: `seq` is `partition << 40 | offset + 1` (`kafka_position(seq)` gives both back;
    `ctx.seq` in a state computation, `_seq` in a batch form), `receive_time` the record's timestamp and
    `connection` its key as text (UTF-8; `key_by("connection")` keys by the Kafka key). Offsets live in the
    query's checkpoint: each record reaches the tables exactly once."""
    if not isinstance(stream, str) or not stream.isidentifier():
        raise ValueError(f"kafka_source({stream!r}): a stream name is a Python-style identifier, e.g. 'trades'")
    if not isinstance(decoder, Decoder):
        raise TypeError(f"kafka_source({stream!r}): decoder must be made with @decoder, got {decoder!r}")
    if not topic or not bootstrap:
        raise ValueError(f"kafka_source({stream!r}): give topic=... and bootstrap='HOST:PORT'")
    return Pipeline(stream=stream, decoder=decoder, origin=KafkaTopic(topic, bootstrap, starting_offsets))


def kafka_position(seq: int) -> tuple[int, int]:
    """(partition, offset) of a Kafka-sourced message's `seq` (see kafka_source)."""
    return seq >> KAFKA_PARTITION_SHIFT, (seq & ((1 << KAFKA_PARTITION_SHIFT) - 1)) - 1


@dataclass(frozen=True)
class KafkaRecord:
    """Where a Kafka-sourced message came from: its record's `key` (as text, UTF-8; None: no key),
    `partition`, `offset` and `timestamp_ms` (the record's timestamp, ms since the epoch)."""

    key: str | None
    partition: int
    offset: int
    timestamp_ms: int | None


def kafka_record(ctx: Context) -> KafkaRecord:
    """The Kafka record of the message a state computation is called with (`f(message, state, ctx)`),
    from what the message carries: its `seq` (partition and offset), `connection` (the key) and receive
    time (the record's timestamp). One-message form only: a batch form has the `_seq` column
    (`kafka_position`), and `on_timer` has no message. Only for a pipeline made with `kafka_source`: a
    landed message has no record (its seq would read as partition 0)."""
    if not isinstance(ctx, Context):
        raise TypeError(f"kafka_record(ctx): expected the Context a state computation gets as its third "
                        f"parameter (f(message, state, ctx)), got {type(ctx).__name__}")
    if ctx.seq is None:
        raise ValueError(f"kafka_record(ctx) for key {ctx.key!r}: no message here (a batch form or on_timer); in "
                         "a batch form, kafka_position(seq) gives each `_seq`'s partition and offset")
    partition, offset = kafka_position(ctx.seq)
    return KafkaRecord(ctx.connection, partition, offset, ctx.receive_time_ms)


@dataclass(frozen=True)
class Merged:
    """Keyed pipelines sharing one keyed state; each branch keeps its own steps.

    `.to(state_computation)` after `merge` gives the branches one shared state computation; a batch one
    then sees a key's messages of every branch together, in sequence order (column `_stream` says
    which stream each came from).
    """

    branches: tuple[Pipeline, ...]
    sinks: tuple = ()
    steps: tuple = ()

    def to(self, step: StateComputation | Computation) -> Merged:
        if any(b.post_steps for b in self.branches):
            raise ValueError("merge(...).to(...): the merged pipelines already have their own state computations")
        return dataclasses.replace(self, steps=(*self.steps, step))

    def key_by(self, fn: Callable[[Any], Any] | str) -> Merged:
        """Key the shared state computation's outputs again, for the next level's state (see Pipeline.key_by)."""
        check_rekey("merge(...)", split_levels(None, self.steps)[-1][1])
        return dataclasses.replace(self, steps=(*self.steps, KeyMark(fn)))

    def to_sink(self, *sinks: Sink) -> Merged:
        return dataclasses.replace(self, sinks=(*self.sinks, *sinks))


def merge(*pipelines: Pipeline) -> Merged:
    if len(pipelines) < 2:
        raise ValueError("merge needs at least two pipelines")
    for p in pipelines:
        if p.key_fn is None:
            raise ValueError(f"merge: pipeline {p.stream!r} must be keyed (key_by) to share state")
    return Merged(tuple(pipelines))


@dataclass(frozen=True)
class Application:
    """A named set of pipelines. Each pipeline (or merged group) compiles to one Spark query.

    `dagster_defs` names (`module:attribute`) a `dagster.Definitions` of the app's own extra assets,
    checks, sensors or schedules (the log app's daily summaries): the composition root merges it.
    """

    name: str
    pipelines: tuple = field(default_factory=tuple)
    # Bump to reprocess the landing log from the start into fresh checkpoints.
    generation: int = 1
    description: str = ""
    # Bronze queries also quarantine what the gateway could not frame (apps skip it: counted once).
    quarantine_landing_errors: bool = False
    dagster_defs: str | None = None

    def __init__(self, name: str, *pipelines: Pipeline | Merged, generation: int = 1, description: str = "",
                 quarantine_landing_errors: bool = False, dagster_defs: str | None = None):
        if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
            raise ValueError(f"application name {name!r}: use letters, digits and underscores, e.g. 'temps'")
        if not pipelines:
            raise ValueError(f"application {name!r} has no pipelines")
        for p in pipelines:
            if not isinstance(p, (Pipeline, Merged)):
                raise TypeError(f"application {name!r}: expected pipelines (source(...)...), got {p!r}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "pipelines", tuple(pipelines))
        object.__setattr__(self, "generation", generation)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "quarantine_landing_errors", quarantine_landing_errors)
        object.__setattr__(self, "dagster_defs", dagster_defs)

    def sources(self) -> list[Pipeline]:
        """Every source pipeline (merged ones flattened), in declaration order; `landed()` for those
        reading landed streams (not a Kafka topic of their own)."""
        out: list[Pipeline] = []
        for p in self.pipelines:
            out.extend(p.branches if isinstance(p, Merged) else (p,))
        return out

    def sinks(self) -> list[Sink]:
        out: list[Sink] = []
        for p in self.pipelines:
            out.extend(p.sinks)
        return out

    def streams(self) -> list[str]:
        return list(dict.fromkeys(b.stream for b in self.sources()))

    def landed(self) -> list[Pipeline]:
        """The source pipelines of landed streams (the gateway's and `ingest`'s), without kafka_source ones."""
        return [b for b in self.sources() if b.origin is None]


# -- the context of a state computation call ----------------------------------------------------------
def _n_params(f: Callable) -> int:
    return len(inspect.signature(f).parameters)


@dataclass
class Context:
    """What a state computation (`f(message, state, ctx)`) or timer hook knows about its call.

    - `key`: the key whose state this is (what `key_by` gave, as a string);
    - `processing_time_ms`: the wall clock of the micro-batch (Spark's batch timestamp), in ms;
    - `watermark_ms`: Spark's event-time watermark (0: the query defines none);
    - `seq`: the landing sequence number of the message (one-message form; None in batch form and
      in `on_timer`, where a batch's messages carry theirs in the `_seq` column);
    - `connection`, `receive_time_ms`: the message's connection and receive time in ms (a Kafka-sourced
      message: its record's key and timestamp; `kafka_record(ctx)` gives the whole record); None where
      `seq` is;
    - `register_timer(at_ms)`: call the state computation's `on_timer(key, state, at_ms[, ctx])` once
      processing time reaches `at_ms`. Only for state computations declared with `on_timer`.

    Timers fire in micro-batches: under `eventide run` every run of a query with timers ends with one
    batch without new messages, which fires every timer due by then (also of keys that got no new
    message); a timer due later fires in the first run after it is due. Under the Dagster service the
    pipelines run when new messages land (`new_segments_sensor`), so there a timer fires in the first
    such run after it is due: a quiet system fires it with the next message landed or `eventide run`.

    Tests may build one: `Context(key="k", processing_time_ms=1000)` (timers then raise).
    """

    key: str
    processing_time_ms: int = 0
    watermark_ms: int = 0
    seq: int | None = None
    handle: Any = field(default=None, repr=False, compare=False)  # Spark's processor handle, for timers
    # The engine's input frame and the message's position in it: `connection` and `receive_time_ms` are
    # read from it only when asked (most calls never ask). Tests may give a one-row frame.
    row: tuple[Any, int] | None = field(default=None, repr=False, compare=False)

    @property
    def connection(self) -> str | None:
        if self.row is None:
            return None
        frame, i = self.row
        value = frame["connection"].iat[i]
        return value if isinstance(value, str) else None  # None, or pandas' NaN for a missing one

    @property
    def receive_time_ms(self) -> int | None:
        if self.row is None:
            return None
        frame, i = self.row
        value = frame["receive_time"].iat[i]
        return None if value is None or value != value else value.value // 1_000_000  # a Timestamp's ns; NaT != NaT

    def register_timer(self, at_ms: int) -> None:
        """Call `on_timer` of the state computation when processing time reaches `at_ms` (ms)."""
        if self.handle is None:
            raise RuntimeError(
                f"register_timer({at_ms}) for key {self.key!r}: timers need a state computation declared with "
                "on_timer=... (@state_computation(name, state=..., on_timer=fn)), run by the engine"
            )
        self.handle.registerTimer(int(at_ms))
