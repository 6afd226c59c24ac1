"""The bucketed step's packed input (keyed_state.pack_by_bucket / unpack), without Spark: unpacking a
bucket's packed rows gives its envelopes in their order, as Spark's own conversion would give them."""

import datetime as dt

import pandas as pd
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.engine.envelope import ENVELOPE
from transforms.engine.keyed_state import PACKED, pack_by_bucket, unpack

SCHEMA = pa.schema([*ENVELOPE, pa.field("m__day", pa.date32()), pa.field("bucket", pa.int32())])
T0 = dt.datetime(2004, 3, 7, 16, 5, 49, tzinfo=dt.timezone.utc)


def _batch(rows: list[tuple[int, str | None, bytes | None]], first_seq: int) -> pa.RecordBatch:
    n = len(rows)
    cols = {f.name: pa.nulls(n, f.type) for f in SCHEMA}
    cols.update({
        "kind": pa.array(["msg" if k is not None else "quarantine" for _, k, _ in rows]),
        "seq": pa.array(range(first_seq, first_seq + n), pa.int64()),
        "part": pa.array([0] * n, pa.int32()), "branch": pa.array([0] * n, pa.int32()),
        "key": pa.array([k for _, k, _ in rows], pa.string()),
        "msg": pa.array([m for _, _, m in rows], pa.binary()),
        "receive_time": pa.array([T0 + dt.timedelta(microseconds=i) for i in range(n)], ENVELOPE.field("receive_time").type),
        "m__day": pa.array([dt.date(2004, 3, 7 + i % 3) for i in range(n)], pa.date32()),
        "bucket": pa.array([b for b, _, _ in rows], pa.int32()),
    })
    return pa.RecordBatch.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)


row = st.tuples(st.integers(0, 3), st.one_of(st.none(), st.sampled_from("abc")), st.one_of(st.none(), st.binary(max_size=5)))


@settings(max_examples=100, deadline=None)
@given(batches=st.lists(st.lists(row, min_size=0, max_size=12), max_size=4))
def test_unpacking_a_buckets_packed_rows_gives_its_envelopes_in_order(batches):
    inputs, seq = [], 1
    for rows in batches:
        inputs.append(_batch(rows, seq))
        seq += len(rows)
    packed = list(pack_by_bucket(iter(inputs)))
    assert all(b.schema == PACKED for b in packed)
    assert sum(b.num_rows for b in packed) == sum(len({r[0] for r in rows}) for rows in batches)  # one per bucket per batch
    whole = pa.Table.from_batches(inputs, schema=SCHEMA).to_pandas()
    for bucket in range(4):
        blobs = [blob for b in packed for bkt, blob in zip(b.column("bucket").to_pylist(), b.column("rows").to_pylist())
                 if bkt == bucket]
        if not blobs:
            assert not (whole["bucket"] == bucket).any()
            continue
        got = unpack(iter([pd.DataFrame({"bucket": [bucket] * len(blobs), "rows": blobs})]))
        want = whole[whole["bucket"] == bucket].drop(columns=["bucket"]).reset_index(drop=True)
        # Spark hands a pandas UDF its time stamps tz-naive in the session's zone (UTC), in ns.
        want["receive_time"] = want["receive_time"].dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")
        assert got["receive_time"].dtype == "datetime64[ns]"
        pd.testing.assert_frame_equal(got, want)
        assert got["m__day"].map(type).eq(dt.date).all()
