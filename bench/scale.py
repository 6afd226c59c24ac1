"""Scale-out benchmark: where a micro-batch's rows are written, and what that costs the driver.

- Bronze ingestion (the same landed log lines) through Spark's Delta writer (delta-spark): rows per
  second, table counted.
- Driver peak memory against input size: a backlog (generated logs at two sizes, and the market
  stream) processed by a child process with the driver's JVM limited (`EVENTIDE_SPARK_DRIVER_MEMORY`,
  1g), sampling the resident memory of the driver's Python process and of its JVM (which in
  `local[*]` also runs the executors' tasks; the Python workers are reported apart).

    python -m bench.scale [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transforms import lake
from transforms.settings import Settings

PAGE = os.sysconf("SC_PAGE_SIZE")


def progress(msg: str) -> None:
    print(f"[bench.scale] {msg}", file=sys.stderr, flush=True)


# -- the child: one backlog, one process -------------------------------------------------------------------
def child(home: str, apps: str) -> None:
    """Run the bronze query of each stream, then the apps, over everything landed in `home`."""
    from transforms.engine import run_application
    from transforms.spark import get_spark
    from transforms.streams import service_applications

    settings = Settings(home=Path(home), apps=apps)
    spark = get_spark(settings)
    bronzes, registered = service_applications(settings)
    rows = 0
    for app in [*bronzes, *registered]:
        for r in run_application(spark, app, settings):
            rows += r.input_rows
    tables = {p.name: lake.count(p) for p in sorted(settings.lake.iterdir()) if lake.exists(p)}
    print(json.dumps({"input_rows": rows, "tables": tables}), flush=True)


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")  # a child is listed under the thread that forked it
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return out


def _rss_and_kind(pid: int) -> tuple[int, str]:
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ")
    except OSError:
        return 0, "gone"
    if cmd.startswith(b"/") and b"java" in cmd.split(b" ")[0]:
        return rss, "jvm"
    if b"pyspark" in cmd and (b"daemon" in cmd or b"worker" in cmd):
        return rss, "workers"
    return rss, "other"


def run_backlog(home: Path, apps: str, driver_memory: str) -> dict:
    """The child over `home`'s landing, sampled every 0.2 s: seconds, peak RSS per kind, its result."""
    gc_logs = home / "gc"
    gc_logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EVENTIDE_SPARK_DRIVER_MEMORY": driver_memory,
           "EVENTIDE_HOME": str(home), "EVENTIDE_APPS": apps,
           # The JVM's heap before each collection: the driver's real peak, which its RSS only bounds.
           "JAVA_TOOL_OPTIONS": f"-Xlog:gc:file={gc_logs}/gc-%p.log"}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bench.scale", "--child", str(home), apps], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"driver_python": 0, "jvm": 0, "workers": 0}
    while proc.poll() is None:
        now = {"driver_python": 0, "jvm": 0, "workers": 0}
        for p in _tree(proc.pid):
            rss, kind = _rss_and_kind(p)
            key = "driver_python" if p == proc.pid else kind
            if key in now:
                now[key] += rss
        peak = {k: max(v, now[k]) for k, v in peak.items()}
        time.sleep(0.2)
    out, err = proc.communicate()
    seconds = time.perf_counter() - started
    result: dict = {"seconds": round(seconds, 1), "ok": proc.returncode == 0,
                    **{f"peak_{k}_mb": round(v / 2**20) for k, v in peak.items()}}
    result["peak_driver_mb"] = result["peak_driver_python_mb"] + result["peak_jvm_mb"]
    result["peak_jvm_heap_used_mb"], result["jvm_heap_max_mb"] = peak_heap(gc_logs)
    if proc.returncode == 0:
        result.update(json.loads(out.strip().splitlines()[-1]))
    else:
        tail = [ln for ln in err.strip().splitlines() if ln.strip()][-3:]
        result["error"] = " | ".join(tail)[-400:]
    return result


GC_LINE = re.compile(r"(\d+)M->(\d+)M\((\d+)M\)")


def peak_heap(gc_logs: Path) -> tuple[int | None, int | None]:
    """The driver JVM's peak heap in use (before a collection) and its largest heap, from its GC log
    (the JVM with the most collections: the others are spark-submit's short launcher)."""
    best: list[tuple[int, int, int]] = []
    for log in gc_logs.glob("gc-*.log"):
        found = [tuple(map(int, m.groups())) for m in GC_LINE.finditer(log.read_text(errors="replace"))]
        if len(found) > len(best):
            best = found
    if not best:
        return None, None
    return max(b for b, _, _ in best), max(c for _, _, c in best)


# -- landing ------------------------------------------------------------------------------------------
def land_logs(home: Path, lines: int) -> None:
    from bench.logs import land_logs as land

    land(Settings(home=home), lines, days=30)


def land_market(home: Path, messages: int) -> None:
    from bench.market import land
    from examples.market_generate import mixed_messages, synthetic_symbols

    land(Settings(home=home), mixed_messages(messages, synthetic_symbols(3000), seed=1, order_share=0.2,
                                             unknown_share=0.0))


# -- bronze through delta-spark ------------------------------------------------------------------------------
def bench_bronze_paths(out: dict, lines: int, repeats: int) -> None:
    from bench.engine import DATA, _land
    from transforms.engine import run_application
    from transforms.ingestion.framing import iter_file_messages
    from transforms.spark import get_spark
    from transforms.streams import bronze_application

    payloads = [m for d in range(1, 5) for m in iter_file_messages(DATA / "log_windowing" / f"day_{d}.log")]
    tmp = Path(tempfile.mkdtemp(prefix="eventide-bench-scale-"))
    try:
        base = Settings(home=tmp / "landed")
        _land(base, "logs", payloads, lines)
        spark = get_spark(base)
        seconds: dict[str, list[float]] = {"delta_spark": []}
        counts = {}
        for i in range(repeats + 1):  # the first round warms the Python workers up, untimed
            for path in seconds:
                settings = dataclasses.replace(base, home=tmp / f"{path}-{i}")
                shutil.copytree(base.landing, settings.landing)
                started = time.perf_counter()
                run_application(spark, bronze_application("logs"), settings)
                if i:
                    seconds[path].append(time.perf_counter() - started)
                counts[path] = lake.count(settings.table_path("bronze_log_lines"))
                shutil.rmtree(settings.home)
        assert counts["delta_spark"] == lines, counts
        for path, s in seconds.items():
            s.sort()
            out[f"bronze_{path}_rows_per_s"] = round(lines / s[len(s) // 2])
            out[f"bronze_{path}_seconds_median_min_max"] = [round(s[len(s) // 2], 2), round(s[0], 2), round(s[-1], 2)]
        out["bronze_lines"] = lines
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_scale(out: dict, log_sizes=(1_000_000, 4_000_000), market_messages: int = 1_000_000,
                bronze_lines: int = 500_000, repeats: int = 3, driver_memory: str = "1g") -> dict:
    progress(f"bronze, {bronze_lines:,} lines, {repeats} repeats ...")
    bench_bronze_paths(out, bronze_lines, repeats)
    out["driver_memory_limit"] = driver_memory
    runs = [("logs", n, "delta_spark") for n in log_sizes] + [("market", market_messages, "delta_spark")]
    for workload, size, path in runs:
        tmp = Path(tempfile.mkdtemp(prefix=f"eventide-bench-scale-{workload}-"))
        try:
            progress(f"{workload}, {size:,} messages: landing ...")
            if workload == "logs":
                land_logs(tmp, size)
                apps = "examples.logs:app"
            else:
                land_market(tmp, size)
                apps = "examples.market:app"
            progress(f"{workload}, {size:,} messages, driver limited to {driver_memory} ...")
            result = run_backlog(tmp, apps, driver_memory)
            progress(f"  {json.dumps(result)}")
            out[f"{workload}_{size}_{path}"] = result
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--child", nargs=2, metavar=("HOME", "APPS"), help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    out: dict = {}
    if args.quick:
        bench_scale(out, log_sizes=(50_000,), market_messages=50_000, bronze_lines=50_000, repeats=1)
    else:
        bench_scale(out)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
