"""Spark Connect (EVENTIDE_SPARK_REMOTE) is refused at start, with the reason, and nothing is written.

The reason is checked against a real Spark Connect server from the installed pyspark: it runs a
streaming query's foreachBatch function in a Python process of its own, not in the client, so
Eventide's batch writer (exactly-once commits, TCP sinks, the reports to Dagster and serve) could not
run where it must. If a later pyspark runs it in the client, the first test fails: then lift the
refusal."""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.spark_cluster import connect_server, leftover_pids, spark_env

pytestmark = pytest.mark.timeout(300)

EVENTIDE = Path(sys.executable).parent / "eventide"

CLIENT = r"""
import json, os, sys, tempfile
from pyspark.sql import SparkSession

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
seen_here = []
out = sys.argv[2]

def record(batch_df, batch_id):
    seen_here.append(batch_id)
    with open(out, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "rows": batch_df.count()}) + "\n")

query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
         .writeStream.foreachBatch(record).trigger(availableNow=True)
         .option("checkpointLocation", tempfile.mkdtemp()).start())
query.awaitTermination()
print(json.dumps({"client_pid": os.getpid(), "seen_in_client": seen_here}))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with connect_server(tmp_path_factory.mktemp("connect"), info=(info := {})) as url:
        yield url
    assert leftover_pids(info["marker"]) == []


def test_connect_runs_foreach_batch_functions_outside_the_client(server, tmp_path):
    calls = tmp_path / "calls.jsonl"
    done = subprocess.run([sys.executable, "-c", CLIENT, server, str(calls)], capture_output=True, text=True, timeout=180,
                          env=spark_env(tmp_path / "client", uuid.uuid4().hex))
    assert done.returncode == 0, done.stderr[-3000:]
    client = json.loads(done.stdout.strip().splitlines()[-1])
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert ran and all(r["pid"] != client["client_pid"] for r in ran)  # the function ran on the server's side
    assert client["seen_in_client"] == []  # and what it did never reached the client


def test_eventide_refuses_a_connect_url_at_start_and_writes_nothing(server, tmp_path):
    home = tmp_path / "home"
    sample = tmp_path / "lines.txt"
    sample.write_text("hello world\n")
    env = spark_env(tmp_path / "spark", uuid.uuid4().hex, {"EVENTIDE_HOME": str(home)})
    subprocess.run([str(EVENTIDE), "ingest", "text", str(sample)], env=env, check=True, capture_output=True, timeout=120)
    done = subprocess.run([str(EVENTIDE), "run"], env={**env, "EVENTIDE_SPARK_REMOTE": server}, capture_output=True,
                          text=True, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 2
    assert f"EVENTIDE_SPARK_REMOTE={server}: Eventide cannot run over Spark Connect" in said, said[-3000:]
    assert "foreachBatch function in a Python process on the server" in said
    assert "set EVENTIDE_SPARK_MASTER=spark://HOST:PORT" in said
    assert not (home / "lake").exists() and not (home / "checkpoints").exists()
