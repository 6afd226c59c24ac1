"""What a long Delta log costs a commit on a local file system.

Delta lists the table's whole `_delta_log` folder at every commit on a local file system (Hadoop's
listing stats every file), and `eventide serve` commits about once a second to a busy table; Delta keeps
the log 30 days by default, which upkeep shortens (`EVENTIDE_LOG_RETENTION_HOURS`, transforms/lake/upkeep.py).
This times a one-row append (median of 10) on a table whose log folder also holds N files that sort
before its commits, as expired commits do, for each N. One process, one warm session.

    python -m bench.delta_log [--files 0,100000,300000] [--out FILE.json]
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


def measure(counts: list[int], root: Path) -> list[dict]:
    from transforms import lake
    from transforms.settings import Settings
    from transforms.spark import get_spark

    spark = get_spark(Settings(home=root / "home", spark_master="local[2]"))
    path = root / "t"
    row = spark.createDataFrame([(1, "x")], "id long, s string")
    version = 0

    def append() -> float:
        nonlocal version
        start = time.perf_counter()
        lake.append_once(row, path, "bench", version)
        version += 1
        return time.perf_counter() - start

    for _ in range(12):  # a checkpoint, as a table has
        append()
    log, made, out = path / "_delta_log", 0, []
    for count in sorted(counts):
        while made < count:
            (log / f"{0:020d}.expired{made:09d}.json").touch()
            made += 1
        times = [append() for _ in range(10)]
        out.append({"extra_files": count, "files_in_log": len(os.listdir(log)),
                    "median_append_s": round(statistics.median(times), 3)})
        print(json.dumps(out[-1]), flush=True)
    assert lake.count(path) == version, "an append went missing"
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="0,100000,300000")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = Path(tempfile.mkdtemp(prefix="eventide-delta-log-"))
    try:
        result = measure([int(n) for n in args.files.split(",")], root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(result, args.out)


if __name__ == "__main__":
    main()
