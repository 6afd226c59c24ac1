"""What a keyed query's start costs each run, with and without the zygote (transforms/python_zygote.py).

The workload is the shape of most small runs (the suite's, `serve`'s restarts): an app of one count-window
pipeline, two messages landed before each of `--runs` `run_application` calls on one warm session. Each
side runs in a fresh process of its own, alternating (on, off, off, on, ...), so a drift of the machine
falls on both. Recorded per process: each run's wall seconds (the first two pay the session's warm-up;
the steady figure is the median of the rest) and the lifetimes of the driver-side Python processes that
`transformWithStateInPandas` starts on each run's first batch (/proc, every 10 ms). Outputs agree: every
process ends with one window per run in its table.

    python -m bench.keyed_starts --processes 4 --runs 10 --out bench/results/NAME.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import report
from bench.processes import REPO, child_env

DRIVER_WORKER = b"transform_with_state_driver_worker"


def _one_process(runs: int) -> dict:
    """In a child: `runs` runs of the one-pipeline app on one session (settings from the environment)."""
    import pyarrow as pa

    from transforms.api import Application, DeltaSink, decoder, source
    from transforms.engine import run_application
    from transforms.ingestion.landing import Lander
    from transforms.registry import registry_of
    from transforms.settings import Settings
    from transforms.spark import get_spark, stop_spark
    from transforms.windowing import count_windows
    from windows import counting

    @decoder(schema=pa.schema([("sensor", pa.string())]))
    def reading(payload: bytes) -> dict:
        return {"sensor": payload.decode()}

    app = Application("keyed_starts", source("readings", decoder=reading).key_by("sensor")
                      .to(count_windows(2).over(counting()).emit(lambda w: {"sensor": w.key, "n": w.value}))
                      .named("counts").to_sink(DeltaSink("counts", schema=pa.schema([("sensor", pa.string()),
                                                                                        ("n", pa.int64())]))))
    settings = Settings(app_registry=registry_of([app]))
    spark = get_spark(settings)
    seen: dict[str, list[float]] = {}
    done = threading.Event()

    def watch():  # the driver-side processes: children of this session's JVM, seen by their command line
        while not done.is_set():
            now = time.monotonic()
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if DRIVER_WORKER in f.read():
                            seen.setdefault(pid, [now, now])[1] = now
                except OSError:
                    pass
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()
    walls = []
    for i in range(runs):
        with Lander(settings) as lander:
            lander.append("readings", f"s{i}".encode(), "bench")
            lander.append("readings", f"s{i}".encode(), "bench")
        started = time.perf_counter()
        run_application(spark, app, settings)
        walls.append(round(time.perf_counter() - started, 3))
    done.set()
    rows = spark.read.format("delta").load(str(settings.table_path("counts"))).count()
    stop_spark()
    return {"run_wall_s": walls, "windows": rows,
            "driver_worker_life_s": sorted(round(b - a, 3) for a, b in seen.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4, help="processes in all, half with the zygote")
    parser.add_argument("--runs", type=int, default=10, help="runs of the app per process")
    parser.add_argument("--out", type=Path, help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one_process(args.runs)))
        return
    sides: dict[str, list[dict]] = {"zygote": [], "cold": []}
    for i in range(args.processes):
        order = ("zygote", "cold") if (i // 2) % 2 == 0 else ("cold", "zygote")
        side = order[i % 2]
        with tempfile.TemporaryDirectory(prefix="eventide-bench-keyed-") as home:
            env = child_env(EVENTIDE_HOME=home, EVENTIDE_SPARK_PYTHON_ZYGOTE=str(side == "zygote").lower())
            out = subprocess.run([sys.executable, "-m", "bench.keyed_starts", "--child", "--runs", str(args.runs)],
                                 env=env, cwd=REPO, capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if result["windows"] != args.runs:
            raise SystemExit(f"bench.keyed_starts: {side} process {i} wrote {result['windows']} windows, not {args.runs}")
        sides[side].append(result)
        steady = statistics.median(result["run_wall_s"][2:])
        print(f"[bench.keyed_starts] process {i + 1}/{args.processes} {side}: steady run {steady:.2f} s, "
              f"driver-side process {statistics.median(result['driver_worker_life_s']):.2f} s", file=sys.stderr)
    summary = {side: {"steady_run_s": round(statistics.median(r for p in ps for r in p["run_wall_s"][2:]), 3),
                      "driver_worker_life_s": round(statistics.median(x for p in ps for x in p["driver_worker_life_s"]), 3),
                      "processes": ps}
               for side, ps in sides.items()}
    result = {"benchmark": "keyed_starts", "runs_per_process": args.runs, **summary,
              "steady_run_saved_s": round(summary["cold"]["steady_run_s"] - summary["zygote"]["steady_run_s"], 3)}
    report(result, args.out)


if __name__ == "__main__":
    main()
