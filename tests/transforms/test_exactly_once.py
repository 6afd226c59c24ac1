"""A run killed with SIGKILL at any moment and run again: every landed message is in bronze or
quarantine exactly once, and the stateful word count is exact."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import DATA, REPO
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
    updates = settings.table_path("word_count_updates")

    def committed(path, at_least):
        return lambda: (lake.version(path) or -1) >= at_least

    outcomes = [
        run_python(RUN, env, committed(bronze, 3), jitter=0.8),  # mid bronze
        run_python(RUN, env, committed(updates, 2), jitter=0.8),  # mid word count
        run_python(RUN, without_batch_bound(env)),  # to the end
    ]
    spark_log = settings.home / "logs" / "spark.log"  # the JVMs' own stdout and stderr: why one went away
    assert outcomes[:2] == ["killed", "killed"] and outcomes[2] == "complete", "\n---\n".join(
        [*outcomes, "the JVMs' log ends:", spark_log.read_text(errors="replace")[-4000:] if spark_log.exists() else "none"])

    good = lake.read(bronze, columns=["seq"]).column("seq").to_pylist()
    bad = lake.read(settings.table_path("quarantine"), columns=["seq"]).column("seq").to_pylist()
    assert len(good) == len(set(good)) and len(bad) == len(set(bad))
    assert sorted(good + bad) == sorted(landed)
    assert sorted(bad) == sorted(s for s, m in landed.items() if m == b"garbage")

    expected = json.loads((DATA / "word_count" / "_expected.json").read_text())
    ups = lake.read(updates).to_pandas()
    assert len(ups) == 482 and not ups.duplicated(["seq", "part"]).any()
    totals = lake.read(settings.table_path("word_totals")).to_pylist()
    assert {r["word"]: r["count"] for r in totals} == expected


WORDS = """
from transforms.settings import get_settings
from transforms.spark import get_spark
from transforms.engine import run_application
from examples.words import word_count
s = get_settings()
run_application(get_spark(s), word_count, s)
print("COMPLETE")
"""


def test_sigkill_between_the_delta_commits_of_two_tables_of_one_batch(settings):
    """Word count writes two tables per batch: the updates (append), then the totals (MERGE). Killed
    after a batch's first commit and before its second, then run again: both tables exact, the batch
    in each once (Delta skips the updates' replayed commit; the totals get theirs)."""
    from examples.words import word_count
    from transforms.engine import plan_queries

    with Lander(settings) as lander:
        for line in (DATA / "word_count" / "count_this.txt").read_bytes().splitlines(keepends=True):
            if line.strip():
                lander.append("text", line, "words")
                lander.flush()
    (plan,) = plan_queries(word_count, settings)
    updates, totals = settings.table_path("word_count_updates"), settings.table_path("word_totals")
    env = {**os.environ, "EVENTIDE_HOME": str(settings.home), "EVENTIDE_MAX_FILES_PER_TRIGGER": "1"}
    seen = {}

    def between_commits() -> bool:
        done = [lake.committed_batch(p, plan.app_id(p.name)) if lake.exists(p) else None for p in (updates, totals)]
        if done[0] is not None and done[0] >= 2 and (done[1] is None or done[1] < done[0]):
            seen["state"] = done
            return True
        return False

    proc = subprocess.Popen([sys.executable, "-c", WORDS], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    deadline = time.time() + 240
    try:
        while proc.poll() is None and time.time() < deadline and not between_commits():
            time.sleep(0.005)
        killed = proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, as in a crash
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed and seen, "the run ended before it could be killed between two commits"
    state = [lake.committed_batch(p, plan.app_id(p.name)) for p in (updates, totals)]
    assert state[1] is None or state[1] < state[0], state  # killed in between: the totals lack a batch

    out = subprocess.run([sys.executable, "-c", WORDS], cwd=REPO, env=without_batch_bound(env), capture_output=True, text=True, timeout=240)
    assert "COMPLETE" in out.stdout, out.stderr[-2000:]
    expected = json.loads((DATA / "word_count" / "_expected.json").read_text())
    ups = lake.read(updates).to_pandas()
    assert len(ups) == 482 and not ups.duplicated(["seq", "part"]).any()
    assert {r["word"]: r["count"] for r in lake.read(totals).to_pylist()} == expected
    assert lake.committed_batch(updates, plan.app_id("word_count_updates")) == lake.committed_batch(
        totals, plan.app_id("word_totals"))
