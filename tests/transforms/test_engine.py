"""The engine on real Spark and real Delta tables: word count, ordering, quarantine, the README app."""

import json
import re

import pytest

from examples.words import word_count
from tests.conftest import DATA, REPO, land
from transforms import lake
from transforms.api import Application, DeltaSink, source, state_computation
from transforms.engine import run_application

pytestmark = pytest.mark.spark

EXPECTED = json.loads((DATA / "word_count" / "_expected.json").read_text())
LINES = [ln for ln in (DATA / "word_count" / "count_this.txt").read_bytes().splitlines(keepends=True) if ln.strip()]


def _word_results(settings):
    updates = lake.read(settings.table_path("word_count_updates")).to_pandas().sort_values(["seq", "part"])
    totals = lake.read(settings.table_path("word_totals")).to_pandas()
    return updates, dict(zip(totals.word, totals["count"]))


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_word_count_equals_expected_whatever_the_partitions(spark, settings, partitions):
    land(settings, "text", LINES)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))  # a new checkpoint takes it
    try:
        (report,) = run_application(spark, word_count, settings)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    updates, totals = _word_results(settings)
    assert len(updates) == 482
    assert totals == EXPECTED
    # The upsert's rows leave each task combined (a row per word), still counted as every output.
    assert report.rows_written == {"word_count_updates": 482, "word_totals": 482}
    # Running counts: each word's updates count 1, 2, 3, ... in sequence order.
    for word, group in updates.groupby("word"):
        assert list(group["count"]) == list(range(1, EXPECTED[word] + 1)), word


def test_word_count_split_across_runs_equals_one_run(spark, settings):
    land(settings, "text", LINES[:7])
    first = run_application(spark, word_count, settings)
    land(settings, "text", LINES[7:])
    run_application(spark, word_count, settings)
    again = run_application(spark, word_count, settings)  # nothing new: writes nothing
    updates, totals = _word_results(settings)
    assert totals == EXPECTED and len(updates) == 482
    assert first[0].rows_written["word_count_updates"] < 482
    assert again[0].input_rows == 0 and not again[0].rows_written


def test_a_run_killed_while_planning_its_first_batch_leaves_no_checkpoint_that_blocks_the_next(spark, settings):
    """Killed between writing batch 0's offsets to Spark's temp file and renaming it, a process leaves
    only that temp file and its checksum; Spark then refuses the checkpoint on every start
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY, seen in the kill -9 test of serve). The next run starts
    the query afresh and the results are exact."""
    from transforms.engine import plan_queries

    land(settings, "text", LINES)
    (plan,) = plan_queries(word_count, settings)
    offsets = plan.checkpoint(settings) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.5b2f0d9e-kill.tmp").write_text('v1\n{"batchWatermarkMs":0,')  # cut short by the kill
    (offsets / "..0.5b2f0d9e-kill.tmp.crc").write_bytes(b"crc")
    run_application(spark, word_count, settings)
    updates, totals = _word_results(settings)
    assert totals == EXPECTED and len(updates) == 482


class Seen:
    def __init__(self):
        self.n = 0


@state_computation("explode on x", state=Seen)
def explode_on_x(line, seen):
    if "x" in line.text:
        raise ValueError(f"cannot handle {line.text.strip()!r}")
    seen.n += 1
    return {"text": line.text.strip(), "n": seen.n}


def test_a_raising_user_function_lands_in_quarantine_and_the_rest_goes_on(spark, settings):
    land(settings, "text", [b"a1\n", b"x2\n", b"a3\n", b"\xff\xfe\n"])
    app = Application("fragile", source("text").key_by(lambda line: line.text[0]).to(explode_on_x).to_sink(DeltaSink("fragile_out")))
    (report,) = run_application(spark, app, settings)
    out = lake.read(settings.table_path("fragile_out")).to_pylist()
    assert sorted((r["text"], r["n"]) for r in out) == [("a1", 1), ("a3", 2)]
    q = lake.read(settings.table_path("quarantine")).to_pylist()
    by_step = {r["step"]: r for r in q}
    assert set(by_step) == {"explode on x", "decoder decode_text"}
    assert "ValueError: cannot handle 'x2'" in by_step["explode on x"]["reason"]
    assert (by_step["explode on x"]["payload"], by_step["explode on x"]["seq"]) == (b"x2\n", 2)
    assert by_step["decoder decode_text"]["payload"] == b"\xff\xfe\n"
    assert report.quarantined == 2


def test_the_readmes_own_app_runs(spark):
    """The app of the README's "Write and serve your own app", run as its commands promise."""
    from transforms.testing import run_app

    readme = (REPO / "README.md").read_text()
    code = re.search(r"## Write and serve your own app.*?```python\n(.*?)```", readme, re.S).group(1)
    namespace = {"__name__": "__main__"}  # like a script: Spark's workers get its functions by value
    exec(compile(code, "README.md", "exec"), namespace)
    commands = re.search(r"## Write and serve your own app.*?```sh\n(.*?)```", readme, re.S).group(1)
    lines = re.search(r"printf '(.*?)'", commands).group(1).encode().decode("unicode_escape").splitlines(True)
    result = run_app(namespace["app"], {"temps": [line.encode() for line in lines]}, spark=spark)
    assert [(r["sensor"], r["peak"]) for r in result.outputs("temp_peaks")] == [("garage", 4.0), ("kitchen", 23.0)]
    assert "# garage 4.0, kitchen 23.0" in commands and result.quarantine == []
