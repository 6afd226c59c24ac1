"""The logs workload in the shape Eventide's design requires, hand-written the plain way (issue L).

The hand-written PySpark peer (bench/peers_pyspark.py) reads a text file and counts it in one batch job.
Eventide's design asks for more: Structured Streaming over the landing log with checkpoints, keyed state
in `transformWithStateInPandas`, every table written by delta-spark, the summary counted by Spark
reading bronze as Delta. This job is that shape with nothing of Eventide's, as a Spark user would
write it: bronze decoded in Spark SQL (one split a line, no Python decoder, no quarantine), the app's
windows (a count per day and status until each END_OF_DAY marker, one JSON state value per stream)
beside it, then the summary as one `replaceWhere`; no Dagster, no great-expectations, no exactly-once
bookkeeping beyond Spark's checkpoints. It answers what the shape costs when written plainly: not a
lower bound (measured, its plain forms cost more than Eventide's tuned ones, bench/README.md).

    python -m bench.peers_required_shape LANDED_HOME WORK OUT   # OUT/summary.txt, as the PySpark peer writes it
        [--tuned]          # with the Delta settings Eventide runs with
        [--without-app]    # bronze and the summary only: no keyed state (a part, for where the time goes)

Imports only pyspark, pandas and the standard library (the jars come from $EVENTIDE_JARS or .venv/jars);
`--tuned` takes Eventide's Delta settings from `transforms.lake.session.delta_spark_conf`.
"""

from __future__ import annotations

import time

START = time.time()

import json  # noqa: E402 - the clock starts first: the phases count from the process's start
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

MARKER = "END_OF_DAY"


def _session(scratch: Path, tuned: bool):
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers: this interpreter
    jars_dir = Path(os.environ.get("EVENTIDE_JARS") or Path(__file__).resolve().parents[1] / ".venv" / "jars")
    jars = sorted(str(p) for p in jars_dir.glob("*.jar"))
    builder = (
        SparkSession.builder.master(f"local[{os.cpu_count() or 2}]").appName("required-shape-logs")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.shuffle.partitions", str(os.cpu_count() or 2))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.extraClassPath", os.pathsep.join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if tuned:  # Eventide's Delta settings (the log's state in 2 tasks, not 50; no checksum a commit; ...)
        from transforms.lake.session import delta_spark_conf

        for key, value in delta_spark_conf().items():
            builder = builder.config(key, value)
    return builder.getOrCreate()


def _decoded(spark, landing: str):
    from pyspark.sql import functions as F

    raw = (spark.readStream.schema("stream string, seq bigint, receive_time timestamp, connection string, "
                                   "payload binary, landing_error string")
           .parquet(landing))
    text = F.rtrim(F.col("payload").cast("string"))
    # One split a line, fields by position (the request's from its quotes, status and bytes from the end):
    # the cheapest decode Spark SQL offers; lines it cannot read get nulls (no quarantine here).
    parts = F.split(text, " ")
    stamp_text = F.concat_ws(" ", F.substring(F.get(parts, 3), 2, 20), F.substring(F.get(parts, 4), 1, 5))
    request = F.split(F.substring_index(F.substring_index(text, '"', 2), '"', -1), " ")
    return raw.select(
        "stream", "seq", "receive_time", "connection",
        F.when(text == MARKER, "marker").otherwise("line").alias("kind"),
        F.get(parts, 0).alias("host"), F.get(parts, 1).alias("ident"), F.get(parts, 2).alias("user"),
        F.try_to_timestamp(stamp_text, F.lit("dd/MMM/yyyy:HH:mm:ss Z")).alias("timestamp"),
        F.try_to_timestamp(F.substring(F.get(parts, 3), 2, 11), F.lit("dd/MMM/yyyy")).cast("date").alias("day"),
        F.get(request, 0).alias("method"), F.get(request, 1).alias("path"), F.get(request, 2).alias("protocol"),
        F.try_element_at(parts, F.lit(-2)).try_cast("int").alias("status"), F.try_element_at(parts, F.lit(-1)).try_cast("long").alias("bytes"),
    )


def _windows_processor():
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class DailyWindows(StatefulProcessor):
        """Counts (day, status) per stream until a marker, then emits the window: the log app's shape."""

        def init(self, handle) -> None:
            self.open = handle.getValueState("open", "counts string")

        def handleInputRows(self, key, rows, timerValues):
            state = json.loads(self.open.get()[0]) if self.open.exists() else {"counts": {}, "first": None}
            counts, first = state["counts"], state["first"]
            out = []
            frame = pd.concat(list(rows), ignore_index=True).sort_values("seq", ignore_index=True)
            start = 0
            for end in [*(frame.index[frame["kind"] == "marker"]), None]:
                lines = frame.iloc[start:end]
                lines = lines[lines["kind"] == "line"]
                if len(lines):
                    first = int(lines["seq"].iloc[0]) if first is None else first
                    for (day, status), n in lines.groupby(["day", "status"]).size().items():
                        k = f"{day}|{status}"
                        counts[k] = counts.get(k, 0) + int(n)
                if end is None:
                    break
                last = int(frame["seq"].iloc[end])
                for k, n in sorted(counts.items()):
                    day, status = k.split("|")
                    out.append((key[0], day, int(float(status)), n, first if first is not None else last, last))
                counts, first, start = {}, None, end + 1
            self.open.update((json.dumps({"counts": counts, "first": first}),))
            if out:
                yield pd.DataFrame(out, columns=["source", "day", "status", "count", "first_seq", "last_seq"])

        def close(self) -> None:
            pass

    return DailyWindows()


def run(landed: Path, scratch: Path, out: Path, with_app: bool = True, tuned: bool = False) -> dict[str, float]:
    """Bronze and (`with_app`) the app's windows side by side, then the summary; the seconds of each
    phase since the process started."""
    phases = {"imported": time.time() - START}
    spark = _session(scratch, tuned)
    phases["session"] = time.time() - START
    landing = str(landed / "landing" / "logs")
    lake, checkpoints = scratch / "lake", scratch / "checkpoints"
    bronze = (_decoded(spark, landing).writeStream.format("delta").trigger(availableNow=True)
              .option("checkpointLocation", str(checkpoints / "bronze")).start(str(lake / "bronze_log_lines")))
    queries = [bronze] + ([_windows_query(spark, landing, lake, checkpoints)] if with_app else [])
    waits = [threading.Thread(target=q.awaitTermination) for q in queries]
    for t in waits:
        t.start()
    for t in waits:
        t.join()
    for q in queries:
        if q.exception() is not None:
            raise RuntimeError(f"query {q.id} failed: {q.exception()}")
    phases["queries"] = time.time() - START
    counts = (spark.read.format("delta").load(str(lake / "bronze_log_lines"))
              .where("kind = 'line'").groupBy("day", "status").count().toArrow())
    days = sorted(set(counts.column("day").to_pylist()))
    (spark.createDataFrame(counts).write.format("delta").mode("overwrite").partitionBy("day")
     .option("replaceWhere", f"day >= '{days[0]}' and day <= '{days[-1]}'")
     .save(str(lake / "daily_return_code_summary")))
    rows = sorted((r["day"], r["status"], r["count"]) for r in
                  spark.read.format("delta").load(str(lake / "daily_return_code_summary")).collect())
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text("".join(f"{d} {s} {n}\n" for d, s, n in rows))
    phases["summary"] = time.time() - START
    return phases


def _windows_query(spark, landing: str, lake: Path, checkpoints: Path):
    from pyspark.sql import functions as F

    return (
        _decoded(spark, landing).select("stream", "seq", "kind", F.col("day").cast("string").alias("day"), "status")
        .groupBy("stream")
        .transformWithStateInPandas(statefulProcessor=_windows_processor(),
                                    outputStructType="source string, day string, status int, count long, "
                                                     "first_seq long, last_seq long",
                                    outputMode="Append", timeMode="None")
        .writeStream.format("delta").trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoints / "windows")).start(str(lake / "log_windows")))


def main(argv: list[str]) -> int:
    flags = {a for a in argv if a.startswith("--")}
    landed, scratch, out = (Path(a) for a in argv if a not in flags)
    phases = run(landed, scratch, out, with_app="--without-app" not in flags, tuned="--tuned" in flags)
    print(json.dumps({k: round(v, 2) for k, v in phases.items()}))
    sys.stdout.flush()
    os._exit(0)  # as `eventide run` does: everything is written, no interpreter teardown


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
