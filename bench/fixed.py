"""Fixed costs and small runs, each a whole process timed from spawn to exit (median of `repeats`):

- interpreter and imports: `python -c "import orchestration.definitions"`;
- JVM start: `get_spark` in a process that has imported everything (its own clock);
- query start per app: one app over a handful of messages in a warm session (its own clock);
- `eventide run` with nothing new (a home where everything is processed, summaries included);
- `eventide run` over 10k messages of one app (fresh copies of one landed home per repeat);
- the same 10k through `dagster asset materialize` (the app's and its streams' bronze assets) next
  to `eventide run --pipelines-only` on the same landing, and the ratio (Dagster overhead);
- `eventide demo` on a warm venv.

The tables of the Dagster run and the CLI run must agree (row counts of every table), or it fails.

    python -m bench.fixed [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.processes import REPO, child_env, eventide_cmd, fresh_home, spread, timed_process
from bench.processes import land as land_pairs
from orchestration.runner import write_instance_config
from transforms import lake
from transforms.settings import Settings

VENV_BIN = Path(sys.executable).parent
DATA = REPO / "data" / "wallaroo"
SMALL_RUN = 10_000

_t0 = time.perf_counter()


def progress(msg: str) -> None:
    print(f"[bench.fixed {time.perf_counter() - _t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _env(home: Path) -> dict:
    return child_env(EVENTIDE_HOME=str(home), DAGSTER_HOME=str(home / "dagster"))


def timed(cmd: list[str], home: Path) -> float:
    """`cmd` over `home`, spawn to exit; its output in `<home>.log` next to it."""
    home.parent.mkdir(parents=True, exist_ok=True)
    return timed_process(cmd, _env(home), home.parent / f"{home.name}.log")


def _seconds(times: list[float]) -> dict:
    return spread(times, suffix="", digits=2)


def land(home: Path, app: str, messages: int) -> None:
    """`messages` messages of one bundled app landed under `home` (as the gateway would)."""
    from examples.market_generate import mixed_messages, synthetic_symbols
    from transforms.ingestion.framing import iter_file_messages

    if app == "market":
        stream = mixed_messages(messages, synthetic_symbols(300), seed=1, order_share=0.2, unknown_share=0.0)
    elif app == "words":
        text = [ln for ln in iter_file_messages(DATA / "word_count" / "count_this.txt") if ln.strip()]
        stream = [("text", p) for p in itertools.islice(itertools.cycle(text), messages)]
    else:
        days = [m for d in range(1, 5) for m in iter_file_messages(DATA / "log_windowing" / f"day_{d}.log")]
        stream = [("logs", p) for p in itertools.islice(itertools.cycle(days), messages)]
    land_pairs(home, stream)


# The assets one app's run materializes: its streams' bronze tables and its own tables.
APP_ASSETS = {
    "market": "bronze_market_data,bronze_orders,market_state,order_rejections",
    "words": "bronze_text,word_count_updates,word_totals",
    "logs": "bronze_log_lines,log_windows",
}


def table_counts(home: Path) -> dict[str, int]:
    lake_dir = Settings(home=home).lake
    return {p.name: lake.count(p) for p in sorted(lake_dir.iterdir()) if lake.exists(p)} if lake_dir.is_dir() else {}


_IN_PROCESS = """
import json, sys, time
t0 = time.perf_counter()
import orchestration.definitions  # noqa: F401  everything `eventide run` imports
from transforms.engine import run_application
from transforms.settings import Settings
from transforms.spark import get_spark
imported = time.perf_counter()
settings = Settings.from_env()
spark = get_spark(settings)
started = time.perf_counter()
per_app = {}
for app in settings.registry.apps:
    t = time.perf_counter()
    run_application(spark, app, settings)
    per_app[app.name] = round(time.perf_counter() - t, 2)
print(json.dumps({"imports": imported - t0, "jvm_start": started - imported, "query_start": per_app}))
"""


def in_process_costs(tmp: Path) -> dict:
    """JVM start and, in that warm session, one run per app over 10 messages of each (query start)."""
    home = tmp / "tiny"
    for app in ("market", "words", "logs"):
        land(home, app, 10)
    done = subprocess.run([sys.executable, "-c", _IN_PROCESS], env=_env(home), cwd=REPO, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_fixed(results: dict, repeats: int = 3, apps: tuple[str, ...] = ("market", "words", "logs"),
                messages: int = SMALL_RUN) -> dict:
    eventide = eventide_cmd()
    dagster = str(VENV_BIN / "dagster")
    tmp = Path(tempfile.mkdtemp(prefix="eventide-bench-fixed-"))
    try:
        progress("interpreter and imports")
        imports = [timed([sys.executable, "-c", "import orchestration.definitions"], tmp) for _ in range(repeats)]
        results["imports_seconds"] = _seconds(imports)
        progress("JVM start and query start per app (in one process)")
        inner = [in_process_costs(tmp / f"in-{i}") for i in range(repeats)]
        results["jvm_start_seconds"] = _seconds([r["jvm_start"] for r in inner])
        for app in inner[0]["query_start"]:
            results[f"query_start_{app}_seconds"] = _seconds([r["query_start"][app] for r in inner])

        for app in apps:
            landed = tmp / f"landed-{app}"
            land(landed, app, messages)
            progress(f"{app}: eventide run over {messages:,} messages")
            runs, counts = [], None
            for i in range(repeats):
                home = fresh_home(landed, tmp / f"run-{app}-{i}")
                runs.append(timed([*eventide, "run"], home))
                counts = table_counts(home)
            results[f"run_{app}_{messages}_seconds"] = _seconds(runs)
            if app == apps[0]:
                progress("eventide run with nothing new")
                results["run_nothing_new_seconds"] = _seconds([timed([*eventide, "run"], home) for _ in range(repeats)])

            progress(f"{app}: dagster asset materialize next to eventide run --pipelines-only")
            wanted = set(APP_ASSETS[app].split(","))
            cli, dag = [], []
            for i in range(repeats):
                home = fresh_home(landed, tmp / f"cli-{app}-{i}")
                cli.append(timed([*eventide, "run", "--pipelines-only"], home))
                cli_counts = table_counts(home)
                home = fresh_home(landed, tmp / f"dag-{app}-{i}")
                write_instance_config(home / "dagster")
                dag.append(timed([dagster, "asset", "materialize", "-m", "orchestration.definitions",
                                  "--select", APP_ASSETS[app]], home))
                dag_counts = table_counts(home)
                mine = [{t: n for t, n in c.items() if t in wanted} for c in (counts, cli_counts, dag_counts)]
                if not mine[0] == mine[1] == mine[2] or set(mine[0]) != wanted:
                    raise AssertionError(f"{app}: the runs disagree (run, --pipelines-only, dagster): {mine}")
            results[f"cli_pipelines_{app}_seconds"] = _seconds(cli)
            results[f"dagster_materialize_{app}_seconds"] = _seconds(dag)
            results[f"dagster_vs_cli_{app}_ratio"] = round(statistics.median(dag) / statistics.median(cli), 2)

        progress("eventide demo (warm venv)")
        demo = [timed([*eventide, "demo"], tmp / f"demo-{i}") for i in range(repeats)]
        results["demo_seconds"] = _seconds(demo)
        results["goals"] = "run with nothing new <= 5 s; 10k messages of one app <= 10 s; demo <= 30 s; Dagster <= 2x CLI"
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one repeat, the market app only")
    args = p.parse_args(argv)
    out: dict = {}
    if args.quick:
        bench_fixed(out, repeats=1, apps=("market",))
    else:
        bench_fixed(out, repeats=args.repeats)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
