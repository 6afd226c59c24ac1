"""Soak: `eventide serve` under a steady stream for a long time; do the lake's files and the process's
memory stay bounded?

The market app's mixed stream (80 % quotes, 20 % orders, as bench/latency.py sends it) goes over TCP
at a fixed rate, in one-minute phases made ahead of each minute. Every 30 s it samples the resident
memory of serve's process tree (the Python driver, its JVM, the Python workers) and `eventide status`
(each table's files of the current version, and the lag). Upkeep runs every EVENTIDE_UPKEEP_MINUTES
(2 by default, so an hour sees it 30 times). At the end: every order answered once, the tables' file
counts, and the RSS over the run (the first 10 minutes are warm-up; "flat" = the slope after them).

    python -m bench.soak [--minutes 60] [--rate 1000] [--upkeep-minutes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from bench.latency import (
    SPARK_ENV,
    Listener,
    Run,
    ServeProcess,
    Workload,
    _connect,
    prime,
    send_phase,
    wait_caught_up,
)
from transforms.ports import free_port

RESULTS = Path(__file__).resolve().parent / "results"


def tree_rss(pid: int) -> dict[str, int]:
    """Resident bytes of `pid` and its descendants, by kind (driver Python, JVM, Python workers)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out = {"driver_python": 0, "jvm": 0, "workers": 0, "other": 0}
    todo = [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            rss = int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        kind = ("driver_python" if p == pid else "jvm" if b"java" in cmd.split(b"\0")[0] else
                "workers" if b"pyspark" in cmd else "other")
        out[kind] += rss
    return out


def slope_mb_per_hour(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, bytes), in MB per hour."""
    n = len(samples)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in samples) / n
    my = sum(b for _, b in samples) / n
    var = sum((t - mx) ** 2 for t, _ in samples)
    cov = sum((t - mx) * (b - my) for t, b in samples)
    return cov / var * 3600 / 1e6 if var else 0.0


def soak(minutes: float, rate: int, upkeep_minutes: float, say=print) -> dict:
    from orchestration.status import compute_status
    from transforms.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="eventide-bench-soak-"))
    listener = Listener()
    pm, po = free_port(), free_port()
    env = {**SPARK_ENV, **os.environ, "EVENTIDE_HOME": str(tmp / "home"), "EVENTIDE_APPS": "examples.market:app",
           "EVENTIDE_PORTS": f"market_data={pm},orders={po}", "EVENTIDE_SINK_ORDER_RESULTS": listener.address,
           "EVENTIDE_UPKEEP_MINUTES": str(upkeep_minutes)}
    settings = Settings.from_env(env)
    workload = Workload(seed=11)
    serve = ServeProcess(env)
    run = Run(listener)
    out: dict = {"minutes": minutes, "rate_msgs_per_s": rate, "upkeep_minutes": upkeep_minutes, "samples": []}
    try:
        serve.wait_for_line("all ", 300)
        m_sock, o_sock = _connect(pm), _connect(po)
        out["prime_s"] = round(prime(workload, m_sock, o_sock, listener, 120, run), 2)
        started = time.time()
        sent = orders = 0
        next_sample = started
        while time.time() - started < minutes * 60:
            phase = workload.phase(f"minute {int((time.time() - started) // 60)}", rate, 60)
            for k in range(0, len(phase.ticks), 300):  # 30 s of ticks, then a sample
                part = type(phase)(phase.name, rate, 30, ticks=phase.ticks[k:k + 300])
                send_phase(part, m_sock, o_sock, run)
                sent += sum(len(t[2]) + t[3] for t in part.ticks)
                orders += sum(len(t[2]) for t in part.ticks)
                now = time.time()
                if now >= next_sample:
                    next_sample = now + 30
                    status = compute_status(settings)
                    sample = {"t_s": round(now - started), "rss": tree_rss(serve.proc.pid), "sent": sent,
                              "answers": len(listener.answers),
                              "lag": max((q.lag_messages for q in status.queries), default=0),
                              "files": {t.table: t.files for t in status.tables}}
                    out["samples"].append(sample)
                    say(f"[soak] {sample['t_s']:>5} s: sent {sent:,}, rss "
                        f"{sum(sample['rss'].values()) / 1e6:.0f} MB, lag {sample['lag']}, files {sample['files']}")
                if time.time() - started >= minutes * 60:
                    break
        out["sent"] = sent
        out["orders_sent"] = orders
        out["caught_up_after_s"] = wait_caught_up(settings, 300)
        time.sleep(2)
        final = compute_status(settings)
        out["final_files"] = {t.table: t.files for t in final.tables}
        out["final_bytes"] = {t.table: t.bytes for t in final.tables}
        on_disk = {p.name: sum(1 for _ in p.rglob("*.parquet")) for p in settings.lake.iterdir() if p.is_dir()}
        out["parquet_files_on_disk"] = on_disk
        ids = [a[1] for a in listener.answers]
        out["answers"] = len(ids)
        out["duplicate_answers"] = len(ids) - len(set(ids))
        m_sock.close()
        o_sock.close()
    finally:
        out["serve_exit"] = serve.stop()
        listener.close()
    samples = out["samples"]
    total = [(s["t_s"], sum(s["rss"].values())) for s in samples]
    after_warmup = [(t, b) for t, b in total if t >= 600]
    if total:
        out["rss_mb_first"] = round(total[0][1] / 1e6)
        out["rss_mb_at_10_min"] = round(after_warmup[0][1] / 1e6) if after_warmup else None
        out["rss_mb_last"] = round(total[-1][1] / 1e6)
        out["rss_mb_max"] = round(max(b for _, b in total) / 1e6)
        out["rss_slope_after_10_min_mb_per_hour"] = round(slope_mb_per_hour(after_warmup), 1)
        out["max_files_any_table"] = max((max(s["files"].values(), default=0) for s in samples), default=0)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--rate", type=int, default=1000)
    p.add_argument("--upkeep-minutes", type=float, default=2)
    args = p.parse_args(argv)
    out = soak(args.minutes, args.rate, args.upkeep_minutes, say=lambda m: print(m, file=sys.stderr, flush=True))
    RESULTS.mkdir(exist_ok=True)
    name = RESULTS / f"soak-{time.strftime('%Y-%m-%d')}.json"
    name.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=2))
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    sys.exit(main())
