"""Keyed state in hash buckets (the default: one Spark group per bucket per batch) gives the same tables
as one Spark group per key (the reference form), over several micro-batches and runs, for the
one-message and the batch form; a checkpoint keeps the layout it started with."""

import dataclasses
import shutil

import pytest

from examples.market import market_app, market_app_per_message
from examples.words import word_count
from tests.transforms.test_market_app import land_messages
from tests.transforms.test_market_batch import _tables, random_stream
from tests.transforms.test_write_paths import DATA, _canonical
from transforms.engine import run_application
from transforms.engine.plan import TimeMode, plan_queries
from transforms.engine.state_layout import LAYOUT_FILE, StateLayout, state_layout
from transforms.settings import Settings
from transforms.testing import run_app


def _answers(settings) -> tuple:
    """Market's tables without the landing's receive times (these homes landed apart)."""
    return tuple([{k: v for k, v in r.items() if k != "receive_time"} for r in rows] for rows in _tables(settings))


def _layout_of(settings, query: str) -> str:
    (record,) = (settings.checkpoints / query).glob(f"v*/{LAYOUT_FILE}")
    return record.read_text().strip()


@pytest.mark.spark
@pytest.mark.parametrize("app", [market_app, market_app_per_message], ids=["batch form", "one-message form"])
def test_market_bucketed_equals_per_key(spark, settings, tmp_path, app):
    msgs = random_stream(5, n=900)
    landed = dataclasses.replace(settings, home=tmp_path / "landed")
    runs = []  # the landing's files after each half: two runs, each of three segments in two micro-batches
    for half in (msgs[:450], msgs[450:]):
        for start in range(0, len(half), 150):
            land_messages(landed, half[start : start + 150])
        runs.append({p.relative_to(landed.landing) for p in landed.landing.rglob("*") if p.is_file()})
    results = {}
    for layout in ("key", "bucket"):
        home = dataclasses.replace(settings, home=tmp_path / layout, max_files_per_trigger=2, state_layout=layout)
        for files in runs:  # the very same messages, receive times included
            for f in files:
                (home.landing / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(landed.landing / f, home.landing / f)
            run_application(spark, app, home)
        assert _layout_of(home, app.name) == StateLayout(layout if layout == "key" else "bucket-64").value
        results[layout] = _tables(home)
    state, rejections = results["key"]
    assert len(rejections) > 50 and len(state) == 7  # six symbols and ZZZ, quoted rarely
    assert results["bucket"] == results["key"]


@pytest.mark.spark
def test_word_count_bucketed_equals_per_key(spark):
    lines = (DATA / "word_count" / "count_this.txt").read_text().splitlines()[:300] + [b"\xff\xfe bad utf-8"]
    by_key, bucketed = (run_app(word_count, {"text": lines}, settings=Settings(state_layout=layout), spark=spark)
                        for layout in ("key", "bucket"))
    assert by_key.tables["word_totals"].num_rows > 100 and by_key.quarantine
    for name in by_key.tables:
        assert _canonical(bucketed.tables[name]) == _canonical(by_key.tables[name]), name
    assert bucketed.tcp == by_key.tcp
    assert bucketed.quarantine == by_key.quarantine


@pytest.mark.spark
def test_checkpoint_started_per_key_stays_per_key(spark, settings, tmp_path):
    """A checkpoint with state grouped by key (or from before buckets) is continued grouped by key:
    Spark refuses state of another layout, and the answers must not change."""
    msgs = random_stream(8, n=600)
    reference = dataclasses.replace(settings, home=tmp_path / "reference")
    land_messages(reference, msgs)
    run_application(spark, market_app, reference)

    home = dataclasses.replace(settings, home=tmp_path / "home", state_layout="key")
    land_messages(home, msgs[:300])
    run_application(spark, market_app, home)
    next((home.checkpoints / market_app.name).glob(f"v*/{LAYOUT_FILE}")).unlink()  # as before buckets
    home = dataclasses.replace(home, state_layout="bucket")
    land_messages(home, msgs[300:])
    run_application(spark, market_app, home)
    assert _layout_of(home, market_app.name) == "key"
    assert _answers(home) == _answers(reference)


def test_layout_of_a_checkpoint(tmp_path):
    (plan,) = plan_queries(market_app, Settings(home=tmp_path))
    fresh = tmp_path / "fresh"
    assert state_layout(plan, fresh) is StateLayout.BUCKET
    assert state_layout(plan, fresh, "key") is StateLayout.BUCKET  # recorded: the record wins
    assert state_layout(plan, tmp_path / "asked", "key") is StateLayout.KEY
    timed = dataclasses.replace(plan, time_mode=TimeMode.PROCESSING_TIME)
    assert state_layout(timed, tmp_path / "timers") is StateLayout.KEY
    old = tmp_path / "old"
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text("v1\n")
    assert state_layout(plan, old) is StateLayout.KEY
    assert (old / LAYOUT_FILE).read_text() == "key\n"
    (old / LAYOUT_FILE).write_text("sideways\n")
    with pytest.raises(ValueError, match="unknown state layout 'sideways'.*start a new generation"):
        state_layout(plan, old)
