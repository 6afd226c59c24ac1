"""State TTL: a key whose state Spark's TTL removed (untouched for ttl_ms of processing time) starts
fresh; a key touched within the TTL continues. Both layouts of keyed state (value state per key, map
state entry per key in a bucket).

Spark's TTL counts processing time in batch timestamps. Exact without timing the machine: a TTL of
1 ms has expired by the next micro-batch (a later batch starts at least a millisecond later) but not
within a batch; a TTL of an hour has not expired within the test."""

import dataclasses

import pyarrow as pa
import pytest

from examples.words import TextLine, decode_text
from orchestration.status import state_bytes
from tests.transforms.test_market_app import land_messages
from transforms import lake
from transforms.api import Application, DeltaSink, source, state_computation
from transforms.engine import run_application
from transforms.engine.plan import TimeMode, plan_queries
from transforms.windowing import count_windows
from windows import counting

EXPIRES_BY_NEXT_BATCH_MS = 1
KEPT_MS = 3_600_000


class Count:
    def __init__(self) -> None:
        self.n = 0


def _count(line: TextLine, total: Count) -> dict:
    total.n += 1
    return {"key": line.text, "count": total.n}


count_expiring = state_computation("count, ttl 1 ms", state=Count, ttl_ms=EXPIRES_BY_NEXT_BATCH_MS)(_count)
count_kept = state_computation("count, ttl 1 h", state=Count, ttl_ms=KEPT_MS)(_count)

COUNTS = pa.schema([("seq", pa.int64()), ("key", pa.string()), ("count", pa.int64())])


def _pipeline(step, table: str):
    return (source("text", decoder=decode_text).key_by(lambda line: line.text).to(step)
            .to_sink(DeltaSink(table, schema=COUNTS, metadata=("seq",))))


ttl_app = Application("ttl_counts", _pipeline(count_expiring, "counts_expiring"), _pipeline(count_kept, "counts_kept"))

# Three segments, one micro-batch each: within a batch a key's messages go through its state in order.
SEGMENTS = (["a", "a", "b"], ["b"], ["a", "c", "b", "a"])


def _counts(settings, table: str) -> list[tuple[str, int]]:
    rows = sorted(lake.read(settings.table_path(table)).to_pylist(), key=lambda r: r["seq"])
    return [(r["key"], r["count"]) for r in rows]


@pytest.mark.spark
@pytest.mark.parametrize("layout", ["key", "bucket"])
def test_expired_key_starts_fresh(spark, settings, tmp_path, layout):
    home = dataclasses.replace(settings, home=tmp_path / layout, state_layout=layout, max_files_per_trigger=1)
    for keys in SEGMENTS:
        land_messages(home, [("text", k.encode()) for k in keys])
    reports = run_application(spark, ttl_app, home)
    assert [r.batches for r in reports] == [3, 3]  # one batch per segment: the TTL lapsed between them
    # 1 ms: every key's state from an earlier batch is gone; a second message in the same batch continues
    assert _counts(home, "counts_expiring") == [("a", 1), ("a", 2), ("b", 1), ("b", 1),
                                                ("a", 1), ("c", 1), ("b", 1), ("a", 2)]
    # 1 h: touched within the TTL, every key continues
    assert _counts(home, "counts_kept") == [("a", 1), ("a", 2), ("b", 1), ("b", 2),
                                            ("a", 3), ("c", 1), ("b", 3), ("a", 4)]
    for plan in plan_queries(ttl_app, home):  # what `eventide status` shows as each query's state size
        assert state_bytes(plan.checkpoint(home)) > 0


def test_ttl_runs_in_processing_time_without_timers(settings):
    plan = plan_queries(ttl_app, settings)[1]
    assert plan.state_ttl_ms == KEPT_MS and plan.spark_time_mode is TimeMode.PROCESSING_TIME and not plan.timers
    plain = Application("plain", source("text", decoder=decode_text).key_by(lambda line: line.text)
                        .to(dataclasses.replace(count_kept, ttl_ms=None))
                        .to_sink(DeltaSink("ttl_counts", schema=COUNTS, metadata=("seq",))))
    (plan,) = plan_queries(plain, settings)
    assert plan.state_ttl_ms is None and plan.spark_time_mode is TimeMode.NONE  # without ttl: as before


def test_window_ttl_is_kept_and_checked():
    step = count_windows(3).over(counting()).ttl(5_000)
    assert step.ttl_ms == 5_000 and step.one_message().ttl_ms == 5_000
    assert step.emit(lambda w: w).ttl_ms == 5_000
    with pytest.raises(ValueError, match="ttl_ms must be a positive"):
        count_windows(3).over(counting()).ttl(0)
    with pytest.raises(ValueError, match="ttl_ms must be a positive"):
        state_computation("bad", state=Count, ttl_ms=-1)


def test_state_computations_of_one_query_must_agree_on_ttl(settings):
    from examples.market import decode_market_data, decode_order, symbol_of
    from transforms.api import merge

    mixed = Application("mixed_ttl", merge(  # merged streams of one log: one query, a key's states together
        source("market_data", decoder=decode_market_data).key_by(symbol_of).to(count_expiring),
        source("orders", decoder=decode_order).key_by(symbol_of).to(count_kept),
    ).to_sink(DeltaSink("counts", schema=COUNTS, metadata=("seq",))))
    with pytest.raises(ValueError, match="ttl_ms differ"):
        plan_queries(mixed, settings)
