"""`eventide serve` catching up on log lines sent over TCP, next to Bytewax's whole process on the same file.

Issue L's serve figure. The same generated file (bench.peers' logs workload: N lines over D days, a
marker ending each day) goes to both, in one run:
- Bytewax: bench.peers' flow, a whole process, cold, spawn to exit; its counts checked.
- `eventide serve` with the landing log: bench.kafka's serve_throughput (the file over one TCP
  connection, timed from the first byte until every query of the stream has lag 0 in `eventide
  status`; the windows, the daily summary and bronze then checked exact against the generator).

    python -m bench.serve_logs [--lines 1000000] [--days 7]

The ratio is a rate ratio (> 1: Eventide faster); serve's start-up is reported, not counted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from bench.kafka import serve_throughput
from bench.peers import check_agrees, prepare_logs, progress, run_cold
from bench.processes import load_average


def bench_serve_logs(results: dict, lines: int = 1_000_000, days: int = 7, catch_up_timeout: float = 900,
                     summary_timeout: float = 120) -> dict:
    """Fill `results` (flat keys); AssertionError if an output is not exact."""
    tmp = Path(tempfile.mkdtemp(prefix="eventide-bench-serve-logs-"))
    try:
        results["load_average_at_start"] = load_average()
        progress(f"logs: generating {lines:,} lines over {days} days (not timed) ...")
        w = prepare_logs(tmp, lines, days)
        messages = w.info["lines"] + w.info["markers"]
        results.update(lines=w.info["lines"], days=days, messages=messages, input_bytes=w.info["input_bytes"])
        seconds, got = run_cold(w, "bytewax", tmp / "scratch")
        check_agrees("logs", "bytewax", got, w.expected)
        results["bytewax_cold_s"] = round(seconds, 2)
        progress(f"bytewax, whole process: {seconds:.2f} s, agrees")
        serve = serve_throughput("landing", "landing", w.input, messages, w.expected, tmp, catch_up_timeout, summary_timeout)
        if not serve["exact"]:
            raise AssertionError(f"eventide serve's outputs are not exact: {serve['outputs']}")
        results.update({f"serve_{k}": v for k, v in serve.items() if k not in ("outputs", "log")})
        results["serve_vs_bytewax_ratio"] = round(seconds / serve["caught_up_s"], 3)
        progress(f"serve: {results['serve_vs_bytewax_ratio']}x Bytewax's rate; outputs exact")
        results["load_average_at_end"] = load_average()
        results["note"] = ("serve: seconds from the first byte sent over TCP until every query has lag 0 (start-up "
                           "not included: serve_startup_s); bytewax: its whole process, cold, on the same file. "
                           "Ratio: rate ratio, > 1 means Eventide is faster.")
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=7)
    args = parser.parse_args(argv)
    results: dict = {}
    bench_serve_logs(results, args.lines, args.days)
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
