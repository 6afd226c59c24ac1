"""A micro-batch's outputs as each sink's rows: pure Arrow functions, and the mapInArrow functions
that run them on the executors (sinks.py writes their results with Spark's Delta writer). The keyed
step can make the same rows itself (`Snapshots`, `AllSinkRowsFn.packed_rows`: the pass folded in).

`outputs_to_table` is the fast form (column by column); tests hold it equal to the row-by-row
reference (`to_record` per output, then `pa.Table.from_pylist`).
"""

from __future__ import annotations

import copy
import datetime as dt
import decimal
import pickle
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.api import DeltaSink, KafkaSink, TCPSink, UserFunctionError, to_record

METADATA_COLUMNS = ("seq", "part", "stream", "receive_time", "connection")
# An upsert's or TCP sink's rows carry their input's order, to keep the last per key / send in order.
ORDER = ("__eventide_seq", "__eventide_part")


def of_kind(table: pa.Table, kind: pa.ChunkedArray, value: str) -> pa.Table:
    return table.filter(pc.fill_null(pc.equal(kind, value), False))


class Outputs:
    """A micro-batch's "out" envelopes in order; the messages are unpickled on first use."""

    def __init__(self, table: pa.Table):
        self.table = table

    @cached_property
    def messages(self) -> list:
        return [pickle.loads(b) for b in self.table.column("msg").to_pylist()]

    @cached_property
    def records(self) -> list:
        """`to_record` of each message: made once, shared by the sinks that take every output."""
        return [to_record(o) for o in self.messages]

    @cached_property
    def metadata(self) -> EnvelopeColumns:
        return EnvelopeColumns(self.table)

    def for_sink(self, sink: DeltaSink | TCPSink) -> tuple[list, EnvelopeColumns]:
        """The outputs `sink` accepts, and the envelope columns of each."""
        sel = [i for i, out in enumerate(self.messages) if sink.wants(out)]
        if len(sel) == len(self.messages):  # the common case: the sink takes every output
            return self.messages, self.metadata
        return [self.messages[i] for i in sel], EnvelopeColumns(self.table, pa.array(sel, pa.int64()))

    def records_of(self, chosen: list) -> list | None:
        """The records of `chosen` (for_sink's), if made already."""
        return self.records if chosen is self.messages else None

    def driver_columns(self, sink: TCPSink | KafkaSink, chosen: list) -> pa.Table:
        """A TCP or Kafka sink's columns for `chosen` (for_sink's): the encoder's bytes (and the key)."""
        if isinstance(sink, TCPSink):
            return pa.table({"bytes": pa.array(encode_all(sink, chosen), pa.binary())})
        return pa.table({"bytes": pa.array([sink.encoder(o) for o in chosen], pa.binary()),
                         "key": pa.array([sink.key_of(o) for o in chosen], pa.binary())})


_IMMUTABLE = (str, int, float, complex, bytes, type(None), dt.date, dt.time, dt.timedelta, decimal.Decimal, np.generic)
_SHARED: dict[type, bool] = {}  # per type of value: whether a record may share it (immutable)


def snapshot_record(out) -> dict:
    """`to_record(out)` as it is now: a dict output copied, and a value that could change later (a list,
    a dict, an object) deep-copied. What pickling each output when it is returned gave the sinks."""
    record = to_record(out)
    if record is out:
        record = dict(record)
    for name, value in record.items():
        shared = _SHARED.get(type(value))
        if shared is None:
            shared = _SHARED[type(value)] = issubclass(type(value), _IMMUTABLE)
        if not shared:
            record[name] = copy.deepcopy(value)
    return record


class Snapshots:
    """Outputs as the keyed step folds them into the sinks' rows (AllSinkRowsFn.packed_rows): each
    output's record and, per sink, whether it wants the output and its encoded bytes, all made when the
    output was returned (`add`), so a change to the object afterwards (a state object returned, then
    changed by the next message) does not reach the sinks, as with the pickled outputs; then `done`
    with their envelope columns (METADATA_COLUMNS), in the outputs' order."""

    def __init__(self, sinks: list) -> None:
        self.messages: list[dict] = []  # the records: what the rows are made of (and errors quote)
        self.choosy = [(id(s), s) for s in sinks if s.accepts is not None]
        self.drivers = [(id(s), s) for s in sinks if isinstance(s, (TCPSink, KafkaSink))]
        self.wanted: dict[int, list[int]] = {k: [] for k, _ in self.choosy}
        self.encoded: dict[int, list] = {k: [] for k, _ in self.drivers}
        self.metadata: EnvelopeColumns | None = None

    def __len__(self) -> int:
        return len(self.messages)

    def add(self, out) -> None:
        n = len(self.messages)
        self.messages.append(snapshot_record(out))
        for k, sink in self.choosy:
            if sink.wants(out):
                self.wanted[k].append(n)
        for k, sink in self.drivers:
            if k in self.wanted and self.wanted[k][-1:] != [n]:  # the sink does not take this output
                continue
            if isinstance(sink, TCPSink):
                self.encoded[k].append(encode_all(sink, [out])[0])
            else:
                self.encoded[k].append((sink.encoder(out), sink.key_of(out)))

    def done(self, metadata: pa.Table) -> Snapshots:
        self.metadata = EnvelopeColumns(metadata)
        return self

    def for_sink(self, sink) -> tuple[list, EnvelopeColumns]:
        sel = self.wanted.get(id(sink))
        if sel is None or len(sel) == len(self.messages):
            return self.messages, self.metadata
        return [self.messages[i] for i in sel], EnvelopeColumns(self.metadata.table, pa.array(sel, pa.int64()))

    def records_of(self, chosen: list) -> list:
        return chosen

    def driver_columns(self, sink: TCPSink | KafkaSink, chosen: list) -> pa.Table:
        encoded = self.encoded[id(sink)]
        if isinstance(sink, TCPSink):
            return pa.table({"bytes": pa.array(encoded, pa.binary())})
        return pa.table({"bytes": pa.array([v for v, _ in encoded], pa.binary()),
                         "key": pa.array([k for _, k in encoded], pa.binary())})


class EnvelopeColumns(Mapping):
    """The envelope's metadata columns (METADATA_COLUMNS) of some outputs: `[name]` as a Python list,
    made on first use, or `arrow(name)` as an Arrow array (no Python objects: receive_time's
    datetimes cost more than the rest of a batch's rows)."""

    def __init__(self, table: pa.Table, rows: pa.Array | None = None):
        self.table, self.rows, self._lists = table, rows, {}

    def arrow(self, name: str) -> pa.ChunkedArray:
        column = self.table.column(name)
        return column if self.rows is None else column.take(self.rows)

    def __getitem__(self, name: str) -> list:
        if name not in METADATA_COLUMNS:
            raise KeyError(name)
        if name not in self._lists:
            self._lists[name] = self.arrow(name).to_pylist()
        return self._lists[name]

    def __iter__(self):
        return iter(METADATA_COLUMNS)

    def __len__(self) -> int:
        return len(METADATA_COLUMNS)


def outputs_to_table(sink: DeltaSink, outs: list, meta: EnvelopeColumns, records: list | None = None) -> pa.Table:
    """A Delta sink's outputs as rows of its schema (or inferred), with the metadata columns it asks for
    (`records`: their `to_record`s, if made already)."""
    if records is None:
        records = [to_record(o) for o in outs]  # not changed below: a dict output is its own record
    if sink.schema is not None:
        # Column by column: a metadata column the sink asks for comes from the envelope, over the output's.
        columns = {n: meta.arrow(n) if n in sink.metadata else [r.get(n) for r in records] for n in sink.schema.names}
        try:
            return pa.Table.from_pydict(columns, schema=sink.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise UserFunctionError(
                f"outputs for Delta sink {sink.table!r} do not fit its schema ({e}); first output: {outs[0]!r}"
            ) from None
    records = [dict(r) for r in records]
    for col in sink.metadata:
        for r, v in zip(records, meta[col]):
            r[col] = v
    if not records:
        return pa.table({})
    return pa.Table.from_pylist(records)


def encode_all(sink: TCPSink, outs: list) -> list[bytes]:
    from transforms.ingestion.framing import DEFAULT_FRAMING

    return [DEFAULT_FRAMING.encode(sink.encoder(o)) if sink.framed else sink.encoder(o) for o in outs]


def with_order(data: pa.Table, meta: EnvelopeColumns) -> pa.Table:
    return data.append_column(ORDER[0], meta.arrow("seq").cast(pa.int64())).append_column(
        ORDER[1], meta.arrow("part").cast(pa.int32()))


def inferred_schema(data: pa.Table) -> pa.Schema:
    """The Delta columns of inferred rows: a column with no value yet has no Delta type, so it is left
    out (it reads as null until a batch gives it values)."""
    return pa.schema([f for f in data.schema if not pa.types.is_null(f.type)])


def conform(data: pa.Table, schema: pa.Schema, sink: str) -> pa.Table:
    """Inferred rows in the batch's unified `schema` (a column a task did not see is null)."""
    columns = []
    for f in schema:
        if f.name not in data.column_names or pa.types.is_null(data.schema.field(f.name).type):
            columns.append(pa.nulls(data.num_rows, f.type))
            continue
        try:
            columns.append(data.column(f.name).cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise UserFunctionError(
                f"Delta sink {sink!r}: column {f.name!r} holds {data.schema.field(f.name).type} in some outputs and "
                f"{f.type} in others ({e}); declare the sink's schema (DeltaSink(..., schema=...))") from None
    return pa.table(columns, schema=schema)


# Outputs turned into Python objects at a time: a task's partition can hold millions (word count's
# 64 MB micro-batch made 11M words, and unpickled at once a Python worker grew past 12 GB).
CHUNK_ROWS = 65_536


def _output_chunks(table: pa.Table, chunk_rows: int = CHUNK_ROWS) -> Iterator[Outputs]:
    """The "out" envelopes of a task's envelopes in order (seq, part), as Outputs of at most
    `chunk_rows` each: the order is the whole partition's, only the Python objects are per chunk.
    The order is kept as row numbers and each chunk taken from the task's table: a filtered and a
    sorted copy of the whole table (word count: 24M outputs a task) tripled a worker's memory."""
    rows = pc.indices_nonzero(pc.fill_null(pc.equal(table.column("kind"), "out"), False))
    if not len(rows):
        return
    keys = pa.table({"seq": table.column("seq").take(rows), "part": table.column("part").take(rows)})
    order = rows.take(pc.sort_indices(keys, sort_keys=[("seq", "ascending"), ("part", "ascending")]))  # stable
    del keys
    for start in range(0, len(order), chunk_rows):
        yield Outputs(table.take(order.slice(start, chunk_rows)))


SINK_INDEX = "__eventide_sink"
RECEIVE_TIME = "__eventide_receive_time"
OUTPUTS = "__eventide_outputs"  # the outputs a row stands for: 1, or more for an upsert's combined row
QUARANTINE_INDEX = -1  # the quarantine envelopes' rows among the sinks' (AllSinkRowsFn)
QUARANTINE_COLUMNS = ("stream", "seq", "receive_time", "connection", "step", "reason", "payload")


def sink_column(index: int, name: str) -> str:
    """A sink's column in the rows of every sink (AllSinkRowsFn): its name under the sink's index."""
    return f"s{index}__{name}" if index >= 0 else f"q__{name}"


def last_per_key_rows(data: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """An upsert sink's rows (in their order; ORDER, RECEIVE_TIME and OUTPUTS among the columns)
    combined: each key's last row, standing for the rows of its key (OUTPUTS summed), with the earliest
    of their receive times. The simple form of what the MERGE keeps (sinks.last_per_key: each key's
    row of highest ORDER), applied to a task's rows before they leave Python."""
    positions = pa.array(range(data.num_rows), pa.int64())
    groups = data.select(list(keys)).append_column("__position", positions).append_column(
        OUTPUTS, data.column(OUTPUTS)).append_column(RECEIVE_TIME, data.column(RECEIVE_TIME)).group_by(
        list(keys), use_threads=False).aggregate([("__position", "max"), (OUTPUTS, "sum"), (RECEIVE_TIME, "min")])
    last = data.take(groups.column("__position_max"))
    last = last.set_column(last.schema.get_field_index(OUTPUTS), OUTPUTS, groups.column(f"{OUTPUTS}_sum"))
    return last.set_column(last.schema.get_field_index(RECEIVE_TIME), RECEIVE_TIME, groups.column(f"{RECEIVE_TIME}_min"))


class _Combined:
    """One upsert sink's rows of a task, combined chunk by chunk (`last_per_key_rows`). Where that keeps
    more than half a chunk's rows (keys seldom repeat), it stops: the rest pass as they are."""

    def __init__(self, keys: tuple[str, ...]):
        self.keys, self.rows, self.on = keys, None, True

    def add(self, data: pa.Table) -> pa.Table | None:
        """Take a chunk's rows; what to send now (None: held, combined)."""
        if not self.on:
            return data
        # In their order (the keyed step's folded rows come key by key, not always in it), a stable sort.
        data = data.append_column(OUTPUTS, pa.array([1] * data.num_rows, pa.int64())).sort_by(
            [(ORDER[0], "ascending"), (ORDER[1], "ascending")])
        try:
            combined = last_per_key_rows(data, self.keys)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # a key Arrow cannot group by
            self.on = False
            return data
        if combined.num_rows * 2 > data.num_rows:
            self.on = False
            return data
        self.rows = combined if self.rows is None else last_per_key_rows(pa.concat_tables([self.rows, combined]), self.keys)
        return None


class AllSinkRowsFn:
    """mapInArrow: a micro-batch's envelopes in, every sink's rows out, from one pass (each output
    unpickled once): a row per output a sink accepts, marked with the sink's index (SINK_INDEX), in the
    sink's columns (`schemas`: each sink's row schema, its own or the batch's inferred one; an upsert's
    and a TCP sink's with the ORDER columns), under `sink_column` names, the other sinks' columns null;
    and a row per quarantine envelope (QUARANTINE_INDEX, its QUARANTINE_COLUMNS). Every row carries its
    input's receive time (RECEIVE_TIME), for the batch's latencies, and the outputs it stands for
    (OUTPUTS: 1).

    With `combine`, an upsert sink's rows of a task leave combined instead: each key's last row,
    standing for the key's rows (OUTPUTS) with their earliest receive time. The MERGE keeps each key's
    last row anyway, and a word count's 1.2M outputs of 217 words were 1.2M rows through Arrow, Spark's
    cache and its aggregate. Off where every row's latency is wanted (`serve`)."""

    def __init__(self, sinks: list, indexes: list[int], schemas: dict[int, pa.Schema], envelope: pa.Schema,
                 chunk_rows: int = CHUNK_ROWS, combine: bool = False):
        self.sinks, self.indexes, self.schemas, self.chunk_rows = sinks, indexes, schemas, chunk_rows
        self.combine = combine
        self.quarantine = pa.schema([envelope.field(c) for c in QUARANTINE_COLUMNS])
        fields = [pa.field(SINK_INDEX, pa.int32()), pa.field(RECEIVE_TIME, envelope.field("receive_time").type),
                  pa.field(OUTPUTS, pa.int64())]
        fields += [pa.field(sink_column(QUARANTINE_INDEX, f.name), f.type) for f in self.quarantine]
        for i in indexes:
            fields += [pa.field(sink_column(i, f.name), f.type) for f in schemas[i]]
        self.schema = pa.schema(fields)

    def rows(self, sink, index: int, outputs: Outputs) -> pa.Table | None:
        chosen, meta = outputs.for_sink(sink)
        if not chosen:
            return None
        schema = self.schemas[index]
        if isinstance(sink, (TCPSink, KafkaSink)):  # a Kafka record: the encoder's bytes as its value, with its key
            data = outputs.driver_columns(sink, chosen)
        else:
            data = outputs_to_table(sink, chosen, meta, outputs.records_of(chosen))
            if sink.schema is None:
                data = conform(data, pa.schema([f for f in schema if f.name not in ORDER]), sink.table)
        if ORDER[0] in schema.names:
            data = with_order(data, meta)
        return data.append_column(RECEIVE_TIME, meta.arrow("receive_time"))

    def _marked(self, index: int, data: pa.Table) -> pa.Table:
        n = data.num_rows
        columns = {f.name: pa.nulls(n, f.type) for f in self.schema}
        columns[SINK_INDEX] = pa.array([index] * n, pa.int32())
        columns[OUTPUTS] = pa.array([1] * n, pa.int64())
        for name in data.column_names:
            columns[name if name in (RECEIVE_TIME, OUTPUTS) else sink_column(index, name)] = data.column(name)
        return pa.table(columns, schema=self.schema)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(batches)
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        quarantined = of_kind(table, table.column("kind"), "quarantine")
        yield from self.sink_rows(quarantined, _output_chunks(table, self.chunk_rows))

    def sink_rows(self, quarantined: pa.Table, chunks: Iterable[Outputs | Snapshots]) -> Iterator[pa.RecordBatch]:
        """The rows of a task's quarantine envelopes (QUARANTINE_COLUMNS) and outputs (in order, a chunk at
        a time)."""
        if quarantined.num_rows:
            rows = quarantined.select(list(QUARANTINE_COLUMNS)).append_column(RECEIVE_TIME, quarantined.column("receive_time"))
            yield from self._marked(QUARANTINE_INDEX, rows).to_batches()
        combined = {index: _Combined(sink.keys) for sink, index in zip(self.sinks, self.indexes)
                    if self.combine and isinstance(sink, DeltaSink) and sink.mode == "upsert"}
        # Each sink's rows stay in order; a combined upsert's are held to the end (its MERGE picks by ORDER).
        for outputs in chunks:
            for sink, index in zip(self.sinks, self.indexes):
                data = self.rows(sink, index, outputs)
                if data is not None and index in combined:
                    data = combined[index].add(data)
                if data is not None:
                    yield from self._marked(index, data).to_batches()
        for index, held in combined.items():
            if held.rows is not None:
                yield from self._marked(index, held.rows).to_batches()

    def packed_rows(self, quarantined: pa.Table, chunks: Iterable[Snapshots]) -> list[bytes]:
        """`sink_rows` as Arrow IPC streams of about `chunk_rows` rows each (PACKED_ROWS' values, each far
        from a binary value's 2 GB): what the keyed step gives when the sinks' pass is folded into it
        (keyed_state._FoldedRows)."""
        packed, held, n = [], [], 0
        for batch in [*self.sink_rows(quarantined, chunks), None]:
            if batch is not None:
                held.append(batch)
                n += batch.num_rows
                if n < self.chunk_rows:
                    continue
            if held:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, self.schema) as writer:
                    for b in held:
                        writer.write_batch(b)
                packed.append(sink.getvalue().to_pybytes())
                held, n = [], 0
        return packed


# The keyed step's output when the sinks' pass is folded into it: each group's sink rows as Arrow IPC.
PACKED_ROWS = pa.schema([("rows", pa.binary())])


def unpack_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow: PACKED_ROWS in, the sink rows they hold out (AllSinkRowsFn.schema)."""
    for batch in batches:
        for blob in batch.column(0).to_pylist():
            if blob is not None:
                yield from pa.ipc.open_stream(blob).read_all().to_batches()


class InferSchemaFn:
    """mapInArrow: "out" envelopes in, a row per task and sink without a declared schema out: the
    serialized schema of the rows it would give the sink (the driver unifies them)."""

    OUTPUT = pa.schema([("sink", pa.int32()), ("schema", pa.binary())])

    def __init__(self, sinks: list[DeltaSink], indexes: list[int], chunk_rows: int = CHUNK_ROWS):
        self.sinks, self.indexes, self.chunk_rows = sinks, indexes, chunk_rows

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(batches)
        if not batches:
            return
        for outputs in _output_chunks(pa.Table.from_batches(batches), self.chunk_rows):  # a schema per chunk:
            for sink, index in zip(self.sinks, self.indexes):  # the driver unifies them as it does the tasks'
                chosen, meta = outputs.for_sink(sink)
                if chosen:
                    schema = inferred_schema(outputs_to_table(sink, chosen, meta))
                    yield pa.RecordBatch.from_pydict({"sink": [index], "schema": [schema.serialize().to_pybytes()]},
                                                     schema=self.OUTPUT)
