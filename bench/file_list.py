"""What a long-lived query's list of files costs, and what forgetting the archived ones gives back.

Spark's file source remembers every file it read in its checkpoint (`sources/<i>/`, compacted every
tenth batch, keeping every entry) and loads the list at every start. Under `eventide serve` a log
closes up to four segments a second, so a query's list grows by about 345,000 entries a day. This
builds a real checkpoint of a file-source query (one Parquet file a batch, as a landing segment),
adds N entries of segment files read long ago to its first batch, then times, one process, one
session: a restart and its first batch, 30 batches (every tenth rewrites the list), Eventide's
reader of the list (`processed_segments`, which serve's archiving runs every 10 s for every query),
forgetting the old entries (`forget_source_files`, what a start does once they are archived), and
the restart and 30 batches after it. The rows out are checked: each file read once.

Then the archive's side (no Spark): `--segments` one-row segments archived (archive_segments, which notes
their row counts), and `eventide status`'s reading of the log (landing._LogFiles) with those counts and
without them (every footer opened).

    python -m bench.file_list [--entries 300000] [--segments 50000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench import report


def _query(spark, landing: Path, checkpoint: Path, out: Path):
    return (spark.readStream.schema("x long").option("maxFileAge", "36500d").option("maxFilesPerTrigger", 1)
            .parquet(str(landing)).writeStream.format("parquet")
            .option("checkpointLocation", str(checkpoint)).option("path", str(out)).start())


def measure(entries: int, root: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from transforms.engine.checkpoints import forget_source_files, processed_segments
    from transforms.ingestion.segments import segment_name

    landing, checkpoint, out = root / "landing", root / "checkpoint", root / "out"
    landing.mkdir(parents=True)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    written = []

    def land(seq: int) -> None:
        pq.write_table(pa.table({"x": [seq]}), landing / segment_name(seq, seq))
        written.append(seq)

    def batches(query, first: int, n: int = 30) -> list[float]:
        times = []
        for seq in range(first, first + n):
            start = time.perf_counter()
            land(seq)
            query.processAllAvailable()
            times.append(round(time.perf_counter() - start, 3))
        return times

    query = _query(spark, landing, checkpoint, out)
    land(1)
    query.processAllAvailable()
    land(2)
    query.processAllAvailable()
    query.stop()
    # Entries of segments read long ago (archived since), added to the first batch's list.
    first_batch = checkpoint / "sources" / "0" / "0"
    template = json.loads(first_batch.read_text().splitlines()[1])
    old = {segment_name(seq, seq) for seq in range(10**12, 10**12 + entries)}
    with first_batch.open("a") as f:
        for name in sorted(old):
            f.write("\n" + json.dumps({"path": f"file://{landing}/{name}", "timestamp": template["timestamp"] - 1000,
                                       "batchId": 0}))
    (first_batch.parent / ".0.crc").unlink(missing_ok=True)

    def phase(prefix: str, first_seq: int) -> None:
        """Restart the query, time its first batch and 30 more, then Eventide's reader of its list."""
        start = time.perf_counter()
        query = _query(spark, landing, checkpoint, out)
        land(first_seq)
        query.processAllAvailable()
        result[f"{prefix}restart_and_first_batch_s"] = round(time.perf_counter() - start, 3)
        result[f"{prefix}batches_s"] = batches(query, first_seq + 1)
        query.stop()
        start = time.perf_counter()
        result[f"{prefix}list_entries_read"] = len(processed_segments(checkpoint)[1])
        result[f"{prefix}reader_s"] = round(time.perf_counter() - start, 3)

    result: dict = {"entries": entries}
    phase("", 3)
    result["list_bytes"] = max(p.stat().st_size for p in (checkpoint / "sources" / "0").glob("*.compact"))
    start = time.perf_counter()
    result["forgotten"] = forget_source_files(checkpoint, old.__contains__)[1]
    result["forget_s"] = round(time.perf_counter() - start, 3)
    phase("after_", 200)

    rows = sorted(r.x for r in spark.read.parquet(str(out)).collect())
    assert rows == sorted(written), "a file was read twice or not at all"
    spark.stop()
    for key in ("batches_s", "after_batches_s"):
        times = result[key]
        result[key.replace("batches_s", "median_batch_s")] = statistics.median(times)
        result[key.replace("batches_s", "slowest_batches_s")] = sorted(times)[-3:]  # the list's rewrites
    return result


def measure_status(segments: int, root: Path) -> dict:
    import pyarrow.parquet as pq

    from transforms.ingestion.archive import ROWS_FILE, archive_segments
    from transforms.ingestion.landing import LANDING_SCHEMA, _LogFiles
    from transforms.ingestion.segments import segment_name
    from transforms.settings import Settings

    settings = Settings(home=root / "home")
    live = settings.landing / "text"
    live.mkdir(parents=True)
    row = LANDING_SCHEMA.empty_table().to_pylist()
    import pyarrow as pa

    one = pa.Table.from_pylist(row + [{"seq": 1, "stream": "text", "payload": b"x"}], schema=LANDING_SCHEMA)
    names = set()
    for seq in range(1, segments + 1):
        pq.write_table(one, live / segment_name(seq, seq))
        names.add(segment_name(seq, seq))
    start = time.perf_counter()
    archive_segments(settings, "text", names)
    result: dict = {"segments": segments, "archive_s": round(time.perf_counter() - start, 3)}
    for label in ("status_with_counts_s", "status_footers_s"):
        if label == "status_footers_s":
            (settings.landing_archive / "text" / ROWS_FILE).unlink()
        start = time.perf_counter()
        log = _LogFiles(settings, "text", ["text"])
        result[label] = round(time.perf_counter() - start, 3)
        assert log.status().messages == segments
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=300_000)
    parser.add_argument("--segments", type=int, default=50_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = Path(tempfile.mkdtemp(prefix="eventide-file-list-"))
    try:
        result = {"checkpoint": measure(args.entries, root / "checkpoint"),
                  "archive": measure_status(args.segments, root / "archive")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(result, args.out)


if __name__ == "__main__":
    main()
