"""A run killed with SIGKILL, at a random moment and between the Delta commits of one batch, and run
again: every landed message is in bronze or quarantine exactly once, and the stateful word count is exact."""

import json
import os
import random

import pytest

from tests.conftest import DATA
from tests.crash import run_python, without_batch_bound
from transforms import lake
from transforms.ingestion.framing import iter_file_messages
from transforms.ingestion.landing import Lander

pytestmark = pytest.mark.spark

RUN = """
from transforms.settings import get_settings
from transforms.spark import get_spark
from transforms.engine import run_application
from transforms.streams import bronze_application
from examples.words import word_count
s = get_settings()
spark = get_spark(s)
for app in (bronze_application("logs"), word_count):
    run_application(spark, app, s)
print("COMPLETE")
"""


def test_sigkill_and_rerun_leaves_every_message_exactly_once(settings):
    """Killed twice, then run to the end: once anywhere in bronze, once between the two Delta commits of one
    word count batch (the updates appended, the totals' MERGE to come). Every landed message is then in
    bronze or quarantine once, and both word count tables are exact: Delta skips the updates' replayed
    commit, the totals get theirs. (These were two tests, 103 and 44 s, each with JVMs of its own.)"""
    from examples.words import word_count
    from transforms.engine import plan_queries

    random.seed(7)
    landed = {}
    with Lander(settings) as lander:
        for day in range(1, 5):
            for i, msg in enumerate(iter_file_messages(DATA / "log_windowing" / f"day_{day}.log")):
                landed[lander.append("logs", msg, f"day{day}")] = msg
                if i % 10 == 3:
                    landed[lander.append("logs", b"garbage %d\n" % i, "bad")] = b"garbage"
                if i % 60 == 59:
                    lander.flush()  # many small segments -> many micro-batches to die in
        for line in (DATA / "word_count" / "count_this.txt").read_bytes().splitlines(keepends=True):
            if line.strip():
                lander.append("text", line, "words")
                lander.flush()
    env = {**os.environ, "EVENTIDE_HOME": str(settings.home), "EVENTIDE_MAX_FILES_PER_TRIGGER": "2"}
    bronze = settings.table_path("bronze_log_lines")
    (plan,) = plan_queries(word_count, settings)
    updates, totals = settings.table_path("word_count_updates"), settings.table_path("word_totals")

    def batches() -> list:
        return [lake.committed_batch(p, plan.app_id(p.name)) if lake.exists(p) else None for p in (updates, totals)]

    def between_commits() -> bool:
        done = batches()
        return done[0] is not None and done[0] >= 2 and (done[1] is None or done[1] < done[0])

    outcomes = [run_python(RUN, env, lambda: (lake.version(bronze) or -1) >= 3, jitter=0.8)]  # mid bronze
    outcomes.append(run_python(RUN, env, between_commits, poll=0.005))
    state = batches()
    outcomes.append(run_python(RUN, without_batch_bound(env)))  # to the end
    spark_log = settings.home / "logs" / "spark.log"  # the JVMs' own stdout and stderr: why one went away
    assert outcomes[:2] == ["killed", "killed"] and outcomes[2] == "complete", "\n---\n".join(
        [*outcomes, "the JVMs' log ends:", spark_log.read_text(errors="replace")[-4000:] if spark_log.exists() else "none"])
    assert state[1] is None or state[1] < state[0], state  # killed in between: the totals lacked a batch

    good = lake.read(bronze, columns=["seq"]).column("seq").to_pylist()
    bad = lake.read(settings.table_path("quarantine"), columns=["seq"]).column("seq").to_pylist()
    assert len(good) == len(set(good)) and len(bad) == len(set(bad))
    assert sorted(good + bad) == sorted(landed)
    assert sorted(bad) == sorted(s for s, m in landed.items() if m == b"garbage")

    expected = json.loads((DATA / "word_count" / "_expected.json").read_text())
    ups = lake.read(updates).to_pandas()
    assert len(ups) == 482 and not ups.duplicated(["seq", "part"]).any()
    assert {r["word"]: r["count"] for r in lake.read(totals).to_pylist()} == expected
    assert batches()[0] == batches()[1]  # both tables end at the same batch
