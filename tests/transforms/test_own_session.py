"""A user's own PySpark session reads Eventide's tables, as docs/operations.md shows: `configure` gives the
session delta-spark's jars and settings, `register_tables` names the tables."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

USER_SCRIPT = """
import sys
from pathlib import Path
from pyspark.sql import SparkSession
from transforms.lake import configure, register_tables

spark = configure(SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")).getOrCreate()
lake = Path(sys.argv[1])
print("rows", spark.read.format("delta").load(str(lake / "t")).count())
print("tables", register_tables(spark, lake))
print("sql", spark.sql("SELECT sum(x) AS s FROM t").collect()[0].s)
"""


def test_a_users_own_session_reads_the_tables_by_path_and_by_name(spark, tmp_path):
    import pyarrow as pa

    from transforms import lake

    lake.append_once(spark.createDataFrame(pa.table({"x": [1, 2, 3]})), tmp_path / "lake" / "t", "q", 0)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    out = subprocess.run([sys.executable, "-c", USER_SCRIPT, str(tmp_path / "lake")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-3:] == ["rows 3", "tables ['t']", "sql 6"]
