"""The application API: Wallaroo-style plain-Python apps.

    @decoder(schema=...)                   payload bytes -> message (any record-like object)
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
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


class UserFunctionError(TypeError):
    """A user function broke its contract (wrong return type, missing key). Names the function."""


# -- decorators ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decoder:
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
class Encoder:
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
class Computation:
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
class StateComputation:
    fn: Callable
    name: str
    state: type
    batch: bool = False
    # Optional timer hook: on_timer(key, state, ctx) -> outputs, for wall-clock/event-time windows.
    on_timer: Callable | None = None

    @property
    def state_name(self) -> str:
        return f"{self.state.__module__}.{self.state.__qualname__}"

    def apply(self, msg: Any, state: Any) -> list:
        return normalize_outputs(self.name, self.fn(msg, state))


def normalize_outputs(name: str, out: Any) -> list:
    # Wallaroo's older API returned (output, state_changed); accept it.
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], bool):
        out = out[0]
    if out is None:
        return []
    if isinstance(out, list):
        return [o for o in out if o is not None]
    return [out]


def state_computation(name: str, state: type, *, batch: bool = False, on_timer: Callable | None = None):
    """`f(message, state)` with the state object of the message's key (created by `state()`).

    `batch=True`: `f(df, state)` gets the key's messages as a DataFrame in sequence order and returns
    the outputs as a DataFrame (or a list of records).
    """
    if not callable(state):
        raise TypeError(f"state_computation {name!r}: state must be a class, got {state!r}")

    def wrap(f: Callable) -> StateComputation:
        n_params = len(inspect.signature(f).parameters)
        if n_params != 2:
            raise TypeError(f"state_computation {name!r}: {f.__name__} must take (message, state), takes {n_params}")
        return StateComputation(f, name, state, batch, on_timer)

    return wrap


@dataclass(frozen=True)
class Emit:
    """What a batch state computation returns per output when it says which input message (by its
    `_seq`) the output answers; that message's sequence and landing metadata go with the output."""

    seq: int
    value: Any


# -- records ----------------------------------------------------------------------------------------
def to_record(obj: Any) -> dict:
    """A message or output as a flat dict: dicts, dataclasses and namedtuples as their fields."""
    if isinstance(obj, dict):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "_asdict"):
        return obj._asdict()
    return {"value": obj}


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

    def __post_init__(self) -> None:
        if self.mode not in ("append", "upsert"):
            raise ValueError(f"DeltaSink {self.table!r}: mode must be 'append' or 'upsert', got {self.mode!r}")
        if self.mode == "upsert" and not self.keys:
            raise ValueError(f"DeltaSink {self.table!r}: upsert needs keys=[...]")

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
    address: str | None = None  # None: from EVENTIDE_SINK_<NAME> at run time; unset = sink disabled
    framed: bool = False
    accepts: Accepts = None

    def wants(self, out: Any) -> bool:
        return _accepts(self.accepts, out)


Sink = DeltaSink | TCPSink


# -- pipelines --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pipeline:
    stream: str
    decoder: Decoder | None = None  # None: the stream's own decoder (transforms.streams)
    steps: tuple = ()  # Computation (before the key), then after key_by: StateComputation, Computations
    key_fn: Callable | None = None
    sinks: tuple = ()
    name: str | None = None

    def to(self, step: Computation | StateComputation) -> Pipeline:
        if isinstance(step, StateComputation) and self.key_fn is None:
            raise ValueError(f"pipeline {self.stream!r}: key_by(...) must come before state computation {step.name!r}")
        if not isinstance(step, (Computation, StateComputation)):
            raise TypeError(f"pipeline {self.stream!r}: .to() takes a computation or state computation, got {step!r}")
        return dataclasses.replace(self, steps=(*self.steps, step))

    def key_by(self, fn: Callable[[Any], Any] | str) -> Pipeline:
        """Route messages to their key's state: a function of the message, or a name: a field of the
        message, or the landing column `stream` or `connection` (one state per source)."""
        if self.key_fn is not None:
            raise ValueError(f"pipeline {self.stream!r} is already keyed")
        return dataclasses.replace(self, key_fn=fn, steps=(*self.steps, KeyMark()))

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
        if self.key_fn is None:
            return []
        i = next(i for i, s in enumerate(self.steps) if isinstance(s, KeyMark))
        return list(self.steps[i + 1 :])


@dataclass(frozen=True)
class KeyMark:
    """Where key_by sits in a pipeline's steps."""


def source(stream: str, decoder: Decoder | None = None) -> Pipeline:
    """A pipeline reading a landed stream (TCP through the gateway, or files through `ingest`)."""
    return Pipeline(stream=stream, decoder=decoder)


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
    """A named set of pipelines. Each pipeline (or merged group) compiles to one Spark query."""

    name: str
    pipelines: tuple = field(default_factory=tuple)
    # Bump to reprocess the landing log from the start into fresh checkpoints.
    generation: int = 1
    description: str = ""
    # Bronze queries also quarantine what the gateway could not frame (apps skip it: counted once).
    quarantine_landing_errors: bool = False

    def __init__(self, name: str, *pipelines: Pipeline | Merged, generation: int = 1, description: str = "",
                 quarantine_landing_errors: bool = False):
        if not pipelines:
            raise ValueError(f"application {name!r} has no pipelines")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "pipelines", tuple(pipelines))
        object.__setattr__(self, "generation", generation)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "quarantine_landing_errors", quarantine_landing_errors)

    def sinks(self) -> list[Sink]:
        out: list[Sink] = []
        for p in self.pipelines:
            out.extend(p.sinks)
        return out

    def streams(self) -> list[str]:
        out: list[str] = []
        for p in self.pipelines:
            for b in p.branches if isinstance(p, Merged) else (p,):
                if b.stream not in out:
                    out.append(b.stream)
        return out
