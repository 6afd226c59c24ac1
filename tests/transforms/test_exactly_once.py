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
from transforms import lake
from transforms.framing import iter_file_messages
from transforms.landing import Lander

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


def _run(env, kill_when=None, timeout=240):
    proc = subprocess.Popen([sys.executable, "-c", RUN], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    deadline = time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            if kill_when and kill_when():
                time.sleep(random.uniform(0, 0.8))
                os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM die together, as in a crash
                proc.wait()
                return "killed"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = proc.stdout.read()
    return "complete" if "COMPLETE" in out else f"exit {proc.returncode}"


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
        _run(env, committed(bronze, 3)),  # mid bronze
        _run(env, committed(updates, 2)),  # mid word count
        _run(env),  # to the end
    ]
    assert outcomes[:2] == ["killed", "killed"] and outcomes[2] == "complete", outcomes

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
