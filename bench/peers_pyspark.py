"""The hand-written PySpark peer of the logs workload (issue L): what a Spark user would write for the daily
return-code counts of a log file, as one batch job. `spark.read.text` -> `regexp_extract` of the day and
the status -> `groupBy().count()`, session start included. No Delta, no landing log, no exactly-once and
no quarantine: the floor an Eventide run on the same engine is measured against.

    python -m bench.peers_pyspark INPUT OUT        # writes OUT/summary.txt ("2004-03-07 200 147" lines)

Imports only pyspark (a cold process pays for nothing of the project's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MARKER = "END_OF_DAY"
# The day as written (dd/Mon/yyyy) and the status of a Common Log Format line.
_DAY = r"\[([0-9]{2}/[A-Za-z]{3}/[0-9]{4}):"
_STATUS = r'" ([0-9]{3}) (?:[0-9]+|-)$'


def summary(spark, path: str) -> list[tuple]:
    """[(day, status, count)] sorted, over the non-marker lines of `path`."""
    from pyspark.sql import functions as F

    lines = spark.read.text(path).where(F.col("value") != MARKER)
    counts = (
        lines.select(F.to_date(F.regexp_extract("value", _DAY, 1), "dd/MMM/yyyy").alias("day"),
                     F.regexp_extract("value", _STATUS, 1).cast("int").alias("status"))
        .groupBy("day", "status").count()
    )
    return sorted((r["day"], r["status"], r["count"]) for r in counts.collect())


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    inp, out = argv
    cores = os.cpu_count() or 2
    spark = (SparkSession.builder.master("local[*]").appName("bench-peers-pyspark")
             .config("spark.sql.shuffle.partitions", str(cores)).config("spark.ui.enabled", "false")
             .getOrCreate())
    try:
        rows = summary(spark, str(Path(inp).absolute()))
    finally:
        spark.stop()
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / "summary.txt", "w", encoding="utf-8") as f:
        f.writelines(f"{day.isoformat()} {status} {n}\n" for day, status, n in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
