"""Executor-side staging without Spark: the files a task writes, their statistics, the commit of the
driver, and the clean-up of attempts that were never committed."""

import datetime as dt
import math
from dataclasses import dataclass

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transforms import lake
from transforms.engine.staging import (
    FILE_PREFIX,
    StagingJournal,
    discard_uncommitted,
    file_stats,
    write_files,
)

UTC = dt.timezone.utc
SCHEMA = pa.schema([("day", pa.string()), ("n", pa.int64()), ("x", pa.float64()), ("s", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC")), ("d", pa.date32())])

rows = st.lists(st.fixed_dictionaries({
    "day": st.sampled_from(["2004-03-07", "a b", "x:y%/=z", "ü", None]),
    "n": st.one_of(st.none(), st.integers(-2**62, 2**62)),
    "x": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    "s": st.one_of(st.none(), st.text(max_size=80)),
    "ts": st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2100, 1, 1),
                                            timezones=st.just(UTC))),
    "d": st.one_of(st.none(), st.dates(min_value=dt.date(1971, 1, 1), max_value=dt.date(2100, 1, 1))),
}), min_size=1, max_size=30)


def _sorted(t: pa.Table) -> list[dict]:
    def key(r):
        return tuple((v is None, str(v)) for v in r.values())
    return sorted(({k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                   for r in t.select(SCHEMA.names).to_pylist()), key=key)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(rows, min_size=1, max_size=3))
def test_staged_files_committed_read_like_write_deltalake_and_filter_alike(tmp_path_factory, batches):
    """The reference form is delta-rs' own writer: same rows, and the statistics skip no matching file."""
    root = tmp_path_factory.mktemp("t")
    staged, reference = root / "staged", root / "reference"
    for i, batch in enumerate(batches):
        data = pa.Table.from_pylist(batch, schema=SCHEMA)
        files = write_files(data, staged, ["day"], f"{FILE_PREFIX}tok{i}-b{i}")
        assert lake.commit_files_once(staged, files, "q", i, SCHEMA, ["day"])
        assert not lake.commit_files_once(staged, files, "q", i, SCHEMA, ["day"])  # a replay commits nothing
        write_deltalake(str(reference), data, mode="append", partition_by=["day"])
    assert _sorted(lake.read(staged)) == _sorted(lake.read(reference))
    probe = batches[0][0]
    # NaN compares as the largest float in DataFusion but is left out of statistics: filter on x only without it.
    nan = any(isinstance(r["x"], float) and math.isnan(r["x"]) for b in batches for r in b)
    for col in ("n", "s", "ts", "d") + (() if nan else ("x",)):
        v = probe[col]
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        lit = f"'{v.isoformat()}'" if isinstance(v, (dt.date, dt.datetime)) else (repr(v) if not isinstance(v, str) else "'" + v.replace("'", "''") + "'")
        if isinstance(v, dt.datetime):
            lit = f"arrow_cast({lit}, 'Timestamp(Microsecond, Some(\"UTC\"))')"
        for op in ("=", ">=", "<="):
            where = f"{col} {op} {lit}"
            assert _sorted(lake.read(staged, where)) == _sorted(lake.read(reference, where)), where


def test_file_stats_leave_out_what_would_skip_wrongly():
    t = pa.table({"x": [1.0, float("nan")], "s": ["a" * 100, "b"], "n": pa.array([None, None], pa.int64()),
                  "ts": pa.array([dt.datetime(2004, 3, 7, 1, 2, 3, 456789, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
                  .take([0, 0])})
    stats = file_stats(t)
    assert stats["numRecords"] == 2 and stats["nullCount"] == {"x": 0, "s": 0, "n": 2, "ts": 0}
    assert stats["minValues"] == {"ts": "2004-03-07T01:02:03.456789Z"}  # NaN, long strings, all null: none


def test_a_file_of_another_type_is_refused_and_a_new_column_added(tmp_path):
    root = tmp_path / "t"
    first = pa.table({"a": pa.array([1], pa.int64())})
    assert lake.commit_files_once(root, write_files(first, root, (), f"{FILE_PREFIX}x-b0"), "q", 0)
    wrong = pa.table({"a": ["text"]})
    with pytest.raises(ValueError, match=r"column 'a' is .* in the table but a batch wrote string; declare the sink's schema"):
        lake.commit_files_once(root, write_files(wrong, root, (), f"{FILE_PREFIX}x-b1"), "q", 1)
    wider = pa.table({"a": pa.array([2], pa.int64()), "b": ["new"]})
    assert lake.commit_files_once(root, write_files(wider, root, (), f"{FILE_PREFIX}x-b2"), "q", 2)
    assert sorted(lake.read(root).to_pylist(), key=lambda r: r["a"]) == [{"a": 1, "b": None}, {"a": 2, "b": "new"}]


def test_an_attempt_a_crash_left_uncommitted_is_deleted_on_the_next_start(tmp_path):
    root, checkpoint = tmp_path / "t", tmp_path / "ckpt"
    data = pa.table({"day": ["d1", "d2"], "n": [1, 2]})
    committed = write_files(data, root, ["day"], f"{FILE_PREFIX}tok1-b0")
    journal = StagingJournal(checkpoint)
    entry = journal.open("tok1", 0, [str(root)])
    assert lake.commit_files_once(root, committed, "q", 0, partition_by=["day"])
    journal.close(entry)
    journal.open("tok2", 1, [str(root)])  # batch 1 staged, then the process died before its commit
    orphans = write_files(data, root, ["day"], f"{FILE_PREFIX}tok2-b1")
    assert all((root / a["path"]).exists() for a, _ in orphans)
    assert StagingJournal(checkpoint).recover() == 2
    on_disk = sorted(p.name for p in root.rglob("*.parquet"))
    assert on_disk == sorted(p.name for p in root.rglob(f"{FILE_PREFIX}tok1-*.parquet")) and len(on_disk) == 2
    assert sorted(r["n"] for r in lake.read(root).to_pylist()) == [1, 2]
    assert discard_uncommitted(root, "tok1") == 0  # committed files are never touched


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
    import pickle

    from transforms.api import DeltaSink
    from transforms.engine.envelope import ENVELOPE
    from transforms.engine.staging import Outputs, outputs_to_table

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
