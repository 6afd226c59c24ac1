"""PySpark's two Python forms of `transformWithState`, side by side (issue L names the row-based one as a
direction worth measuring): `transformWithStateInPandas` (Eventide's stateful step) against the row-based
`transformWithState` of PySpark 4.1, doing the same work. N rows in 8 groups from a Parquet folder, one
output row per input row and a counter per group in a value state (the shape of a keyed step that emits
for every message, as word count does), trigger availableNow, parquet out. Both run in one warm session,
one warm-up each, then alternating; each query's wall time, and its output checked (N rows, each group's
counter at N / 8).

    python -m bench.state_api [--rows 1000000] [--repeats 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import report

GROUPS = 8


def _processors():
    import pandas as pd
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    state = StructType([StructField("n", LongType())])

    class Counting(StatefulProcessor):
        """A counter per group in a value state; the two forms differ only in how rows come and go."""

        def init(self, handle):
            self.count = handle.getValueState("n", state)

        def close(self):
            pass

    class PandasForm(Counting):
        def handleInputRows(self, key, rows, timerValues):
            n = self.count.get()[0] if self.count.exists() else 0
            for frame in rows:
                k = len(frame)
                yield pd.DataFrame({"bucket": frame["bucket"], "n": range(n + 1, n + k + 1), "payload": frame["payload"]})
                n += k
            self.count.update((n,))

    class RowForm(Counting):
        def handleInputRows(self, key, rows, timerValues):
            n = self.count.get()[0] if self.count.exists() else 0
            for row in rows:
                n += 1
                yield Row(bucket=row.bucket, n=n, payload=row.payload)
            self.count.update((n,))

    return {"pandas": PandasForm, "row": RowForm}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import pyarrow as pa
    import pyarrow.parquet as pq
    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

    from transforms.spark import ROCKSDB

    root = Path(tempfile.mkdtemp(prefix="eventide-state-api-"))
    try:
        (root / "in").mkdir()
        pq.write_table(pa.table({
            "bucket": pa.array([i % GROUPS for i in range(args.rows)], pa.int32()),
            "payload": pa.array([b"x" * 40 + str(i).encode() for i in range(args.rows)], pa.binary()),
        }), root / "in" / "part-0.parquet")
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)  # as Eventide's sessions
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        schema = StructType([StructField("bucket", IntegerType()), StructField("n", LongType()),
                             StructField("payload", BinaryType())])
        processors = _processors()

        def run(form: str, name: str) -> float:
            grouped = spark.readStream.schema("bucket int, payload binary").parquet(str(root / "in")).groupBy("bucket")
            stateful = (grouped.transformWithStateInPandas(processors[form](), schema, "Append", "None") if form == "pandas"
                        else grouped.transformWithState(processors[form](), schema, "Append", "None"))
            start = time.perf_counter()
            query = (stateful.writeStream.format("parquet").option("checkpointLocation", str(root / f"ck-{name}"))
                     .option("path", str(root / f"out-{name}")).trigger(availableNow=True).start())
            query.awaitTermination()
            seconds = time.perf_counter() - start
            out = spark.read.parquet(str(root / f"out-{name}"))
            rows, top = out.count(), out.agg({"n": "max"}).collect()[0][0]
            if rows != args.rows or top != args.rows // GROUPS:
                raise SystemExit(f"{form}: {rows} rows out, counter {top}; expected {args.rows} and {args.rows // GROUPS}")
            return seconds

        for form in processors:
            print(f"warm-up {form}: {run(form, f'{form}-0'):.2f} s", flush=True)
        times: dict[str, list[float]] = {form: [] for form in processors}
        for i in range(1, args.repeats + 1):
            for form in processors:
                times[form].append(round(run(form, f"{form}-{i}"), 2))
                print(f"{form} {i}: {times[form][-1]:.2f} s", flush=True)
        result = {"pyspark": pyspark.__version__, "rows": args.rows, "groups": GROUPS, "seconds": times,
                  "row_over_pandas": round(statistics.median(times["row"]) / statistics.median(times["pandas"]), 2)}
        report(result, args.out)
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
