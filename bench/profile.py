"""Where the seconds of an `eventide run` over the logs workload go (issue L's profile).

Generates and lands N log lines over D days (as bench.peers does, not timed), then in this process: starts
Spark (timed), runs `run_all` (what `eventide run` does) over a fresh copy of the landed home, and reads
back from the Dagster instance how long each run and each of its steps took (bronze, the logs app, the
daily summaries, each check), with each query's Spark durations (addBatch, queryPlanning, ...). With
`--warm`, a second run over another fresh copy on the same, now warm, session: cold minus warm is what
a first run pays (Python workers' imports, JIT, first Delta reads, great-expectations' import).

    python -m bench.profile --lines 1000000 --days 7 [--warm] > profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.peers import _ints, prepare_logs, progress
from bench.processes import eventide_env, fresh_home, load_average


def dagster_steps(settings) -> list[dict]:
    """Each run of the home's Dagster instance, oldest first, with its steps' seconds."""
    from orchestration.runner import dagster_instance

    instance = dagster_instance(settings)
    runs = []
    for run in reversed(instance.get_runs()):
        stats = instance.get_run_stats(run.run_id)
        runs.append({
            "job": run.job_name,
            "partitions": "..".join(p for p in (run.tags.get("dagster/partition_range_start"),
                                                run.tags.get("dagster/partition_range_end")) if p),
            "seconds": round((stats.end_time or 0) - (stats.start_time or 0), 2),
            "steps": {s.step_key: round((s.end_time or 0) - (s.start_time or 0), 2)
                      for s in instance.get_run_step_stats(run.run_id)},
        })
    return runs


def profile_run(landed: Path, home: Path, spark_progress) -> dict:
    from bench.logs import timed_run_all

    fresh_home(landed, home)
    with eventide_env(home, "examples.logs:app") as settings:
        run = timed_run_all(settings, spark_progress)
        run["dagster_runs"] = dagster_steps(settings)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=_ints, default=1_000_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--warm", action="store_true", help="a second run on the warm session")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="eventide-bench-profile-"))
    progress(f"generating and landing {args.lines:,} lines over {args.days} days (not timed) ...")
    w = prepare_logs(tmp, args.lines, args.days)
    out: dict = {"lines": args.lines, "days": args.days, "load_average_at_start": load_average()}
    from bench.logs import SparkProgress
    from transforms.settings import Settings
    from transforms.spark import get_spark

    started = time.perf_counter()
    spark = get_spark(Settings(home=tmp / "spark-home"))
    out["spark_start_s"] = round(time.perf_counter() - started, 2)
    spark_progress = SparkProgress()
    spark_progress.attach(spark)
    out["cold"] = profile_run(w.home, tmp / "cold-home", spark_progress)
    progress(f"cold run: {out['cold']['total_s']} s")
    if args.warm:
        out["warm"] = profile_run(w.home, tmp / "warm-home", spark_progress)
        progress(f"warm run: {out['warm']['total_s']} s")
    out["load_average_at_end"] = load_average()
    print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
