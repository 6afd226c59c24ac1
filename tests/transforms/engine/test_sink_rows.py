"""A micro-batch's outputs as sink rows, without Spark: the columnar forms against the row-by-row
reference, and every sink's rows from one pass against each sink's own."""

import datetime as dt
import pickle
from dataclasses import dataclass

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.api import DeltaSink, TCPSink
from transforms.engine.envelope import ENVELOPE
from transforms.engine.sink_rows import (
    ORDER,
    OUTPUTS,
    RECEIVE_TIME,
    SINK_INDEX,
    AllSinkRowsFn,
    Outputs,
    last_per_key_rows,
    outputs_to_table,
    sink_column,
    with_order,
)

UTC = dt.timezone.utc


# -- a batch's outputs as sink rows: the columnar form against the row-by-row reference ----------------
@dataclass
class _Reading:
    sensor: str
    value: float


def _reference_rows(sink, outs: list, meta: dict) -> pa.Table:
    """The simple form: a dict per output, the envelope's metadata over it, Arrow from the rows."""
    from transforms.api import to_record

    records = [dict(to_record(o)) for o in outs]
    for col in sink.metadata:
        for r, v in zip(records, meta[col]):
            r[col] = v
    return pa.Table.from_pylist([{n: r.get(n) for n in sink.schema.names} for r in records], schema=sink.schema)


outputs = st.lists(st.one_of(
    st.builds(_Reading, st.sampled_from(["a", "b", "ü"]), st.floats(allow_nan=False)),
    st.fixed_dictionaries({"sensor": st.one_of(st.none(), st.text(max_size=5)),
                           "value": st.one_of(st.none(), st.integers(-1000, 1000)), "seq": st.integers(0, 9)}),
    st.integers(),  # not for the sink: `wants` leaves it out
), max_size=20)


@settings(max_examples=60, deadline=None)
@given(outs=outputs, with_meta=st.booleans())
def test_outputs_to_table_equals_the_row_by_row_form(outs, with_meta):
    schema = pa.schema([("sensor", pa.string()), ("value", pa.float64()), ("seq", pa.int64()),
                        ("receive_time", pa.timestamp("us", tz="UTC"))])
    sink = DeltaSink("readings", schema=schema, metadata=("seq", "receive_time") if with_meta else (),
                     accepts=lambda o: not isinstance(o, int))
    n = len(outs)
    table = pa.table({
        "kind": ["out"] * n, "seq": list(range(100, 100 + n)), "part": [0] * n,
        "msg": [pickle.dumps(o) for o in outs],
        "stream": ["s"] * n,
        "receive_time": [dt.datetime(2004, 3, 7, 0, 0, i, tzinfo=UTC) for i in range(n)],
        "connection": [None] * n,
    }, schema=pa.schema([ENVELOPE.field(c) for c in ("kind", "seq", "part", "msg", "stream", "receive_time",
                                                     "connection")]))
    chosen, meta = Outputs(table).for_sink(sink)
    assert all(not isinstance(o, int) for o in chosen)
    got = outputs_to_table(sink, chosen, meta)
    want = _reference_rows(sink, chosen, {c: meta[c] for c in meta})
    assert got.equals(want)


def _envelopes(outs: list) -> pa.Table:
    n = len(outs)
    given = {
        "kind": ["out"] * n, "seq": list(range(100, 100 + n)), "part": [0] * n,
        "msg": [pickle.dumps(o) for o in outs], "stream": ["s"] * n,
        "receive_time": [dt.datetime(2004, 3, 7, 0, 0, i % 60, tzinfo=UTC) for i in range(n)],
    }
    return pa.table({f.name: given.get(f.name, [None] * n) for f in ENVELOPE}, schema=ENVELOPE)


def _last_by_order(rows: list[dict], keys: tuple[str, ...]) -> dict:
    """The simple form of what an upsert's MERGE keeps: per key, the row of highest ORDER."""
    last: dict = {}
    for r in sorted(rows, key=lambda r: (r[ORDER[0]], r[ORDER[1]])):
        last[tuple(r[k] for k in keys)] = {n: v for n, v in r.items() if n not in ORDER}
    return last


@settings(max_examples=60, deadline=None)
@given(outs=outputs, tasks=st.integers(1, 3), chunk_rows=st.sampled_from([1, 2, 3, 65_536]), backwards=st.booleans(),
       combine=st.booleans())
def test_every_sinks_rows_from_one_pass_equal_each_sinks_own(outs, tasks, chunk_rows, backwards, combine):
    """AllSinkRowsFn (one pass, each output unpickled once, split over tasks, unpickled a chunk at a
    time) gives each sink exactly the rows outputs_to_table gives it alone, in order; combined, an
    upsert's rows keep what its MERGE keeps (each key's last row), the outputs they stand for and the
    earliest receive time."""
    schema = pa.schema([("sensor", pa.string()), ("value", pa.float64())])
    appended = DeltaSink("readings", schema=schema, accepts=lambda o: not isinstance(o, int))
    upserted = DeltaSink("latest", mode="upsert", keys=("sensor",), schema=schema, accepts=lambda o: not isinstance(o, int))
    sent = TCPSink("numbers", encoder=lambda o: str(o).encode(), accepts=lambda o: isinstance(o, int), optional=True)
    order = [pa.field(ORDER[0], pa.int64()), pa.field(ORDER[1], pa.int32())]
    schemas = {0: schema, 1: pa.schema([*schema, *order]), 2: pa.schema([("bytes", pa.binary()), *order])}
    table = _envelopes(outs)
    fn = AllSinkRowsFn([appended, upserted, sent], [0, 1, 2], schemas, table.schema, chunk_rows, combine=combine)
    step = max(1, -(-table.num_rows // tasks))
    parts = [table.slice(i, step) for i in range(0, table.num_rows, step)]
    if backwards:  # a task's envelopes out of order (as the stateful step gives them): put back in order
        parts = [p.take(pa.array(range(p.num_rows - 1, -1, -1), pa.int64())) for p in parts]
    got = pa.Table.from_batches([b for p in parts for b in fn(iter(p.to_batches()))], schema=fn.schema)
    for i, sink in enumerate([appended, upserted]):
        mine = got.filter(pa.compute.equal(got.column(SINK_INDEX), i))
        chosen, meta = Outputs(table).for_sink(sink)
        want = outputs_to_table(sink, chosen, meta)
        assert sum(mine.column(OUTPUTS).to_pylist()) == len(chosen)
        if combine and sink is upserted:
            names = [f.name for f in schemas[i]]
            rows = pa.table({n: mine.column(sink_column(i, n)) for n in names}).to_pylist()
            assert _last_by_order(rows, sink.keys) == _last_by_order(with_order(want, meta).to_pylist(), sink.keys)
            times = [t for t in meta.arrow("receive_time").to_pylist() if t is not None]
            assert min(mine.column(RECEIVE_TIME).to_pylist(), default=None) == min(times, default=None)
            continue
        rows = pa.table({f.name: mine.column(sink_column(i, f.name)) for f in schema}, schema=schema)
        assert rows.equals(want)
        assert mine.column(RECEIVE_TIME).to_pylist() == meta.arrow("receive_time").to_pylist()
    mine = got.filter(pa.compute.equal(got.column(SINK_INDEX), 2))
    assert mine.column(sink_column(2, "bytes")).to_pylist() == [str(o).encode() for o in outs if isinstance(o, int)]
    assert mine.column(sink_column(2, ORDER[0])).to_pylist() == [100 + j for j, o in enumerate(outs) if isinstance(o, int)]


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.sampled_from([1, 2, None]), st.integers(0, 5),
                               st.integers(1, 3), st.one_of(st.none(), st.integers(0, 59))), max_size=30))
def test_last_per_key_rows_equals_the_last_row_of_each_key(rows):
    """The combined rows of an upsert (two key columns, nulls among them): each key's last row, the
    outputs summed, the earliest receive time, against a loop over the rows in order."""
    times = [None if t is None else dt.datetime(2004, 3, 7, 0, 0, t, tzinfo=UTC) for *_, t in rows]
    table = pa.table({"k1": [r[0] for r in rows], "k2": [r[1] for r in rows], "v": [r[2] for r in rows],
                      OUTPUTS: [r[3] for r in rows], RECEIVE_TIME: times},
                     schema=pa.schema([("k1", pa.string()), ("k2", pa.int64()), ("v", pa.int64()), (OUTPUTS, pa.int64()),
                                       (RECEIVE_TIME, pa.timestamp("us", tz="UTC"))]))
    want: dict = {}
    for (k1, k2, v, n, _), t in zip(rows, times):
        _, total, earliest = want.get((k1, k2), (None, 0, None))
        earliest = t if earliest is None else earliest if t is None else min(earliest, t)
        want[(k1, k2)] = (v, total + n, earliest)
    got = last_per_key_rows(table, ("k1", "k2")).to_pylist()
    assert len(got) == len(want)
    assert {(r["k1"], r["k2"]): (r["v"], r[OUTPUTS], r[RECEIVE_TIME]) for r in got} == want


# -- the sinks' pass folded into the keyed step, against the pass over its envelopes -------------------
class _Tally:
    def __init__(self) -> None:
        self.n = 0
        self.seen: list = []
        self.summary = {"sensor": "all", "n": 0, "history": self.seen}  # returned, then changed


@dataclass
class _Count:
    sensor: str
    n: int
    history: list


def _as_set(rows: list[dict]) -> list:
    return sorted(rows, key=repr)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.sampled_from(["a", "b", "ü"]), st.integers(-5, 5)), max_size=25),
       batch_form=st.booleans(), combine=st.booleans(), quarantined=st.lists(st.integers(0, 24), max_size=3),
       chunk_rows=st.sampled_from([1, 3, 65_536]))
def test_the_folded_keyed_step_gives_each_sink_the_rows_of_the_pass(values, batch_form, combine, quarantined, chunk_rows):
    """The keyed step with the sinks' pass folded in (each output snapshot when returned) gives each
    sink the rows AllSinkRowsFn gives over the same step's pickled envelopes: the appended rows, what an
    upsert's MERGE keeps and the outputs it counts, a TCP sink's bytes in order, the quarantine rows.
    The state computation returns a dict and a list of its state that it goes on changing: the rows hold
    each output as it was when returned."""
    import numpy as np
    import pandas as pd

    from transforms.api import Emit, source, state_computation
    from transforms.engine.keyed_state import _passed_on, _rows, _run_key
    from transforms.engine.sink_rows import PACKED_ROWS, QUARANTINE_INDEX, unpack_rows

    if batch_form:
        @state_computation("tally", state=_Tally, batch=True)
        def tally(frame, state):  # answers the inputs backwards: outputs name their input (Emit)
            out = []
            for seq, v in zip(frame["_seq"].tolist(), frame["value"].tolist()):
                state.n += 1
                state.seen.append(state.n)
                out.append(Emit(seq, {"sensor": str(v), "n": state.n, "history": state.seen}))
            return out[::-1]
    else:
        @state_computation("tally", state=_Tally)
        def tally(v, state):
            state.n += 1
            state.seen.append(state.n)
            if isinstance(v, int) and v < 0:
                return [state.n]  # for the TCP sink only
            state.summary["n"] = state.n
            return [_Count(str(v), state.n, state.seen), state.summary]

    branches = (source("s").key_by(lambda v: "k").to(tally),)
    n = len(values)
    kinds = ["quarantine" if i in quarantined else "msg" for i in range(n)]
    df = pd.DataFrame({
        "kind": kinds, "seq": np.arange(10, 10 + n, dtype=np.int64), "part": np.zeros(n, np.int32),
        "branch": np.zeros(n, np.int32), "key": "k",
        "msg": [None if k == "quarantine" else pickle.dumps({"value": v} if batch_form else v) for k, v in zip(kinds, values)],
        "stream": "s", "receive_time": pd.Series(pd.date_range("2004-03-07", periods=n, freq="s"), dtype="datetime64[ns]"),
        "connection": "c", "step": [("decode" if k == "quarantine" else None) for k in kinds],
        "reason": [("bad" if k == "quarantine" else None) for k in kinds],
        "payload": [(b"x" if k == "quarantine" else None) for k in kinds], "origin": None})
    msgs = df[df["kind"] == "msg"].reset_index(drop=True)
    bad = df[df["kind"] == "quarantine"].reset_index(drop=True)  # they pass the stateful step untouched
    columns = [("sensor", pa.string()), ("n", pa.int64()), ("history", pa.list_(pa.int64()))]
    appended = DeltaSink("counts", schema=pa.schema([*columns, ("seq", pa.int64())]), metadata=("seq",),
                         accepts=lambda o: not isinstance(o, int))
    upserted = DeltaSink("latest", mode="upsert", keys=("sensor",), schema=pa.schema(columns),
                         accepts=lambda o: not isinstance(o, int))
    sent = TCPSink("numbers", encoder=lambda o: repr(o).encode(), accepts=lambda o: isinstance(o, int), optional=True)
    order = [pa.field(ORDER[0], pa.int64()), pa.field(ORDER[1], pa.int32())]
    schemas = {0: appended.schema, 1: pa.schema([*upserted.schema, *order]), 2: pa.schema([("bytes", pa.binary()), *order])}
    fn = AllSinkRowsFn([appended, upserted, sent], [0, 1, 2], schemas, ENVELOPE, chunk_rows, combine=combine)

    envelopes = pd.concat([_run_key(msgs, {}, branches, False), bad], ignore_index=True) if len(msgs) else bad
    envelopes = envelopes.assign(receive_time=envelopes["receive_time"].astype("datetime64[ns]"))
    table = pa.Table.from_pandas(envelopes[ENVELOPE.names], schema=ENVELOPE, preserve_index=False)
    want = pa.Table.from_batches(list(fn(iter(table.to_batches()))), schema=fn.schema)

    frames = [_run_key(msgs, {}, branches, False, fold=fn)] if len(msgs) else []
    if len(bad):
        frames.append(_passed_on(_rows(fn), bad, 0, len(bad)).frame(None, bad))
    blobs = pa.table({"rows": [b for f in frames for b in f["rows"].tolist()]}, schema=PACKED_ROWS)
    got = pa.Table.from_batches(list(unpack_rows(iter(blobs.to_batches()))), schema=fn.schema)

    def of(t, i):
        return t.filter(pa.compute.equal(t.column(SINK_INDEX), i))

    for i in (0, 1, 2):
        names = [f.name for f in schemas[i]]
        rows = {w: pa.table({c: of(t, i).column(sink_column(i, c)) for c in names}).to_pylist() for w, t in
                (("want", want), ("got", got))}
        assert sum(of(got, i).column(OUTPUTS).to_pylist()) == sum(of(want, i).column(OUTPUTS).to_pylist())
        if i == 1:
            assert _last_by_order(rows["got"], upserted.keys) == _last_by_order(rows["want"], upserted.keys)
        elif i == 2:
            key = lambda r: (r[ORDER[0]], r[ORDER[1]])  # noqa: E731 - the driver sends in this order
            assert sorted(rows["got"], key=key) == sorted(rows["want"], key=key)
        else:
            assert _as_set(rows["got"]) == _as_set(rows["want"])
    q = [f"q__{c}" for c in ("seq", "step", "reason", "payload", "stream", "connection", "receive_time")]
    assert _as_set(of(got, QUARANTINE_INDEX).select(q).to_pylist()) == _as_set(of(want, QUARANTINE_INDEX).select(q).to_pylist())
    assert len(of(got, QUARANTINE_INDEX)) == len(bad)
