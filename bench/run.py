"""`make bench`: every benchmark, one results file.

Each benchmark measures Eventide next to a baseline in the same run and records the ratio.
Results: bench/results/latest.json and bench/results/latest.md (a copy per run, dated).

    python -m bench.run                       # all, default sizes
    python -m bench.run --only gateway,words  # a subset
    python -m bench.run --quick               # small sizes, a smoke run
    python -m bench.run --only peers          # Bytewax 0.21, a loop and Eventide (needs the bench extra)
    python -m bench.run --only kafka          # Kafka as the log against the landing folder (--quick: 50k lines)
    python -m bench.run --only sessions       # session windows against Bytewax's (--quick: 100k events, 10k keys)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
import traceback
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _benchmarks(quick: bool) -> dict:
    from bench.engine import bench_bronze, bench_words
    from bench.gateway import bench_gateway

    def gateway(r):
        bench_gateway(r, messages_per_sender=50_000 if quick else 250_000)

    def bronze(r):
        bench_bronze(r, lines=50_000 if quick else 500_000)

    def words(r):
        bench_words(r, lines=5_000 if quick else 50_000)

    def market(r):
        from bench.market import bench_market

        # Best of 3: steady state, as a long-running service sees it (Wallaroo's figure is steady state too);
        # the first run also pays the JVM's warm-up.
        bench_market(r, messages=50_000 if quick else 500_000, repeats=1 if quick else 3)

    def logs(r):
        from bench.logs import bench_logs

        if quick:
            bench_logs(r, sizes=(100_000,), histories=(2, 8), lines_per_day=2_000)
        else:
            bench_logs(r, sizes=(1_000_000, 4_000_000))

    def latency(r):
        from bench.latency import bench_latency

        # `eventide serve` (a subprocess) and the plain loop at fixed rates; full: about 5 minutes.
        if quick:
            bench_latency(r, rates=(1000,), seconds=10, warmup_seconds=2, breakdown_seconds=5, bursts=3)
        else:
            bench_latency(r, rates=(1000, 10_000), seconds=60, loop_seconds=30, breakdown_seconds=15)

    def scale(r):
        from bench.scale import bench_scale

        # Executor-side against driver-side writes, and driver memory with a 1 GB driver; full: about 12 minutes.
        if quick:
            bench_scale(r, log_sizes=(50_000,), market_messages=50_000, bronze_lines=50_000, repeats=1,
                        driver_path_sizes=(50_000,))
        else:
            bench_scale(r)

    def peers(r):
        from bench.peers import FULL, QUICK, WORKLOADS, bench_peers

        # Bytewax 0.21, a plain loop and `eventide run`, each a cold process, on logs, market and words.
        # Full: about 35 minutes; words' Eventide steady state is left out (it would add ~8 minutes).
        if quick:
            bench_peers(r, sizes=QUICK, repeats=1, steady=WORKLOADS)
        else:
            bench_peers(r, sizes=FULL, repeats=3)

    def fixed(r):
        from bench.fixed import bench_fixed

        # Fixed costs and small runs (imports, JVM, query start, nothing new, 10k messages, Dagster
        # against the CLI, the demo), whole processes; full: about 10 minutes.
        if quick:
            bench_fixed(r, repeats=1, apps=("market",))
        else:
            bench_fixed(r, repeats=3)

    def kafka(r):
        from bench.kafka import QUICK, bench_kafka

        # Kafka as the log against the landing folder, same data: `serve` throughput (1M log lines until
        # every query has lag 0), `ingest`, and latency at 1k msgs/s; a broker of its own. Full: about 12
        # minutes on 2 cores; it also writes bench/results/kafka-<date>.json.
        if quick:
            bench_kafka(r, **QUICK)
        else:
            bench_kafka(r, save=RESULTS / f"kafka-{dt.date.today().isoformat()}.json")

    def sessions(r):
        from bench.sessions import EVENTS, KEYS, QUICK, bench_sessions

        # Session windows over 1M events and 100k keys: `eventide ingest` + `eventide run --close-windows`
        # against Bytewax's SessionWindower, whole processes, then steady state; the reference is the oracle.
        # Full: about 15 minutes on 2 cores (load 10-14); it also writes bench/results/sessions-<date>.json.
        if quick:
            bench_sessions(r, **QUICK, steady=True)
        else:
            bench_sessions(r, EVENTS, KEYS, steady=True,
                           save=RESULTS / f"sessions-{dt.date.today().isoformat()}.json")

    def serve_logs(r):
        from bench.serve_logs import bench_serve_logs

        # 1M log lines over TCP into `eventide serve` until lag 0, against Bytewax's whole process on
        # the same file (issue L's serve figure); full: about 3 minutes.
        bench_serve_logs(r, lines=100_000 if quick else 1_000_000)

    return {"gateway": gateway, "bronze": bronze, "words": words, "market": market, "logs": logs,
            "latency": latency, "scale": scale, "peers": peers, "fixed": fixed, "kafka": kafka,
            "sessions": sessions, "serve_logs": serve_logs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--only", help="comma-separated: gateway,bronze,words,market,logs,latency,scale,peers,fixed,kafka,sessions,serve_logs")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    benches = _benchmarks(args.quick)
    chosen = args.only.split(",") if args.only else list(benches)
    results: dict = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, Python {platform.python_version()}",
        "quick": args.quick,
    }
    previous = RESULTS / "latest.json"
    if args.only and previous.exists():  # a subset keeps the other benchmarks' last results
        try:
            kept = json.loads(previous.read_text())
        except ValueError:
            kept = {}
        results.update({k: v for k, v in kept.items() if isinstance(v, dict) and k not in chosen})
    failed = []
    for name in chosen:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        started = time.time()
        part: dict = {}
        try:
            benches[name](part)
        except Exception:
            failed.append(name)
            part["error"] = traceback.format_exc(limit=3)
            print(part["error"], file=sys.stderr)
        part["seconds"] = round(time.time() - started, 1)
        part["when"] = results["when"]
        results[name] = part
        print(f"[bench] {name}: {json.dumps(part)}", file=sys.stderr, flush=True)
    RESULTS.mkdir(exist_ok=True)
    text = json.dumps(results, indent=2, default=str)
    (RESULTS / "latest.json").write_text(text)
    (RESULTS / "latest.md").write_text(_markdown(results))
    print(text)
    return 1 if failed else 0


def _markdown(results: dict) -> str:
    lines = [f"# Benchmark results ({results['when']}, {results['machine']})", ""]
    for name, part in results.items():
        if not isinstance(part, dict):
            continue
        lines += [f"## {name}", "", "| measure | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in part.items() if k != "error"]
        if "error" in part:
            lines += ["", "```", part["error"].strip(), "```"]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
