"""The session (transforms/spark.py): an embedded master retries a failed task, as a cluster does; Python
workers reach the JVM over Unix domain sockets."""

import pytest

from transforms.settings import ConfigError, Settings
from transforms.spark import with_task_attempts


@pytest.mark.parametrize(("master", "attempts", "expected"), [
    ("local[*]", 2, "local[*,2]"),
    ("local[2]", 3, "local[2,3]"),
    (" local[ 4 ] ", 2, "local[4,2]"),
    ("local[*]", 1, "local[*]"),  # one attempt: Spark's own local default
    ("local[2,5]", 2, "local[2,5]"),  # names its own
    ("local", 2, "local"),
    ("spark://127.0.0.1:7077", 2, "spark://127.0.0.1:7077"),  # a cluster: spark.task.maxFailures
])
def test_an_embedded_master_gets_the_task_attempts(master, attempts, expected):
    assert with_task_attempts(master, attempts) == expected


def test_fewer_than_one_attempt_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="EVENTIDE_SPARK_TASK_ATTEMPTS=0"):
        Settings(home=tmp_path, spark_task_attempts=0)


def _fails_on_first_attempt(batches):
    from pyspark import TaskContext

    if TaskContext.get().attemptNumber() == 0:
        raise ConnectionError("a transient failure, as a Python worker's timed-out connection")
    yield from batches


@pytest.mark.spark
def test_a_task_that_fails_once_is_retried_and_counts_once(spark):
    assert spark.sparkContext.master == "local[2,2]"
    df = spark.range(0, 1000, numPartitions=2).mapInArrow(_fails_on_first_attempt, "id long")
    assert sorted(r.id for r in df.collect()) == list(range(1000))


@pytest.mark.spark
def test_python_workers_reach_the_jvm_over_unix_sockets(spark):
    """settings.spark_unix_sockets: no loopback TCP port for a worker's state server or results. The
    workers themselves are told so (pyspark's daemon reads PYTHON_UNIX_DOMAIN_ENABLED)."""
    assert spark.conf.get("spark.python.unix.domain.socket.enabled") == "true"
    (row,) = spark.range(1, numPartitions=1).mapInArrow(_worker_unix_sockets, "unix string").collect()
    assert row.unix.lower() == "true"  # as pyspark.daemon reads it


def _worker_unix_sockets(batches):
    import os

    import pyarrow as pa

    for _ in batches:
        yield pa.RecordBatch.from_pydict({"unix": [os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "unset")]})
