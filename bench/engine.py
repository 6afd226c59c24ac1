"""Engine benchmarks: bronze ingestion and word count through Spark, each next to a pure-Python,
single-process loop over the same landed segments (Wallaroo's model: one message at a time)."""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from examples.logs_decoder import parse_log_line
from examples.words import split_words
from transforms.engine import run_application
from transforms.ingestion.framing import iter_file_messages
from transforms.ingestion.landing import Lander, list_segments
from transforms.settings import Settings
from transforms.spark import get_spark
from transforms.streams import bronze_application

DATA = Path(__file__).resolve().parents[1] / "data" / "wallaroo"


def _land(settings: Settings, stream: str, payloads, total: int) -> int:
    n = 0
    with Lander(settings) as lander:
        while n < total:
            for p in payloads:
                lander.append(stream, p, "bench")
                n += 1
                if n >= total:
                    break
    return n


def _segments_payloads(settings: Settings, group: str):
    for seg in list_segments(settings, group):
        yield from pq.read_table(seg, columns=["payload"]).column("payload").to_pylist()


def _engine_run(settings: Settings, app) -> tuple[float, int]:
    spark = get_spark(settings)
    started = time.perf_counter()
    reports = run_application(spark, app, settings)
    return time.perf_counter() - started, sum(r.input_rows for r in reports)


def bench_bronze(results: dict, lines: int = 200_000) -> None:
    payloads = [m for d in range(1, 5) for m in iter_file_messages(DATA / "log_windowing" / f"day_{d}.log")]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp))
        _land(settings, "logs", payloads, lines)
        secs, n = _engine_run(settings, bronze_application("logs"))
        started = time.perf_counter()
        rows = [parse_log_line(p.decode()) for p in _segments_payloads(settings, "logs")]
        loop = time.perf_counter() - started
    assert n == len(rows) == lines
    results["bronze_lines"] = lines
    results["bronze_engine_rows_per_s"] = round(lines / secs)
    results["bronze_python_loop_rows_per_s"] = round(lines / loop)
    results["bronze_engine_vs_loop_ratio"] = round(loop / secs, 3)


def bench_words(results: dict, lines: int = 50_000) -> None:
    text = [ln for ln in iter_file_messages(DATA / "word_count" / "count_this.txt") if ln.strip()]
    from examples.words import word_count

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp))
        _land(settings, "text", text, lines)
        secs, n = _engine_run(settings, word_count)
        started = time.perf_counter()
        counts: Counter = Counter()
        updates = []
        for p in _segments_payloads(settings, "text"):
            for w in split_words(p.decode()):
                counts[w] += 1
                updates.append((w, counts[w]))
        loop = time.perf_counter() - started
    results["words_lines"] = lines
    results["words_updates"] = len(updates)
    results["words_engine_msgs_per_s"] = round(lines / secs)
    results["words_python_loop_msgs_per_s"] = round(lines / loop)
    results["words_engine_vs_loop_ratio"] = round(loop / secs, 3)


if __name__ == "__main__":
    out: dict = {}
    bench_bronze(out)
    bench_words(out)
    print(json.dumps(out, indent=2))
