"""What compacting the landing archive gives a reader of the archive, and what it costs.

Under `eventide serve` a busy log closes up to four segments a second, and the archive keeps them all: a
new app reads them from the beginning, a replay or a recovery lists them. This lands `--segments`
segments of `--messages` lines each into log `text`, archives them (as serve does once every query
committed them), copies the home, and merges the copy's archive (`compact_archive`, called as serve's
archive rounds would until it has nothing left to merge, each call timed). Then, on each
home, one process and one warm Spark session (`local[2]`, a small run first to warm it):

- the archive listed (`list_segments`) and every message read (`read_landed`, what a replay reads);
- a new app's query reading the log from the beginning (`run_application`, one query, the echo app of
  tests/transforms/ingestion/test_archive.py), its rows out checked: every message once.

    python -m bench.archive_compaction [--segments 5000] [--messages 20] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench import report


def _echo_app():
    import pyarrow as pa

    from examples.words import decode_text
    from transforms.api import Application, DeltaSink, source

    return Application("echo", source("text", decoder=decode_text)
                       .to_sink(DeltaSink("echo_lines", schema=pa.schema([("text", pa.string())]))))


def _land(settings, segments: int, messages: int) -> None:
    from transforms.ingestion.archive import archive_segments
    from transforms.ingestion.landing import Lander, list_segments

    with Lander(settings) as lander:
        for s in range(segments):
            lander.append_many("text", [f"w{(s * messages + i) % 97} line{s * messages + i}".encode()
                                        for i in range(messages)])
    archive_segments(settings, "text", {p.name for p in list_segments(settings, "text")})


def _read_side(settings) -> dict:
    from transforms.ingestion.landing import list_segments, read_landed

    start = time.perf_counter()
    files = len(list_segments(settings, "text"))
    listed = time.perf_counter() - start
    start = time.perf_counter()
    rows = read_landed(settings, "text").num_rows
    return {"files": files, "list_s": round(listed, 4), "read_all_s": round(time.perf_counter() - start, 3), "rows": rows}


def _new_query(spark, settings) -> dict:
    from transforms import lake
    from transforms.engine import run_application

    start = time.perf_counter()
    run_application(spark, _echo_app(), settings)
    seconds = time.perf_counter() - start
    out = lake.read(settings.table_path("echo_lines")).column("text").to_pylist()
    return {"new_query_s": round(seconds, 2), "rows_out": len(out), "distinct_out": len(set(out))}


def measure(segments: int, messages: int, root: Path) -> dict:
    from transforms.ingestion.archive import compact_archive
    from transforms.settings import Settings
    from transforms.spark import get_spark

    def settings_at(home: Path) -> Settings:
        return Settings(home=home, apps="examples.words:word_count", spark_master="local[2]")

    small, plain, merged = (settings_at(root / n) for n in ("warm", "plain", "merged"))
    _land(small, 50, messages)
    start = time.perf_counter()
    _land(plain, segments, messages)
    landed_s = time.perf_counter() - start
    shutil.copytree(plain.home, merged.home, symlinks=True)
    rounds = []  # serve's archive rounds, one after another: each merges a bounded run or more
    while True:
        start = time.perf_counter()
        merged_now = compact_archive(merged, "text", min_files=2)
        if not merged_now:
            break
        rounds.append({"segments_merged": merged_now, "seconds": round(time.perf_counter() - start, 3)})
    result = {"segments": segments, "messages_per_segment": messages, "landed_and_archived_s": round(landed_s, 2),
              "compaction_rounds": rounds}
    spark = get_spark(small)
    _new_query(spark, small)  # the JVM's first query, on neither home
    for name, settings in (("plain", plain), ("merged", merged)):
        result[name] = _read_side(settings) | _new_query(spark, settings)
        assert result[name]["rows_out"] == result[name]["distinct_out"] == segments * messages, result
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--segments", type=int, default=5000)
    p.add_argument("--messages", type=int, default=20)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="eventide-archive-bench-") as tmp:
        result = measure(args.segments, args.messages, Path(tmp))
    report(result, args.out)


if __name__ == "__main__":
    main()
