"""Kafka as the log against the landing folder: throughput and latency in one run, on the same data.

One broker (`eventide kafka`, transforms.kafka_broker.start_broker) runs for the whole benchmark; each
measurement is a whole process (`eventide serve` or `eventide ingest`) over a fresh EVENTIDE_HOME, once
with the landing folder (the default log) and once with `EVENTIDE_LOG=kafka://127.0.0.1:PORT/PREFIX` (a
PREFIX per measurement, so every Kafka run starts from empty topics, as every landing run does from an
empty folder). The landing runs go first each time (`--kafka-first`: the other way round); the broker is
up (and idle) during them too.

- **Throughput through `serve`**: N generated Apache log lines over `days` days (examples/log_generate.py,
  END_OF_DAY after each day) sent over one TCP connection to serve's gateway (transforms.ingestion.sender,
  what `eventide send` runs), timed from the first byte to the moment every query of the stream (bronze
  and the log app's) has lag 0 in `eventide status` (orchestration.status.compute_status, what
  `status --format json` prints, polled in this process). Also the time until the gateway's 0x06 (every
  message landed, or acknowledged by Kafka) and serve's start-up.
- **`eventide ingest`** of the same file into each log, timed from spawn to exit (interpreter start
  included); `status` must then show the messages in the log.
- **Latency through `serve`**: the market app at a fixed rate (1,000 msgs/s, 80 % quotes) with
  bench/latency.py's machinery (Workload, run_serve: prime, warm up, one measured phase); receipt (the
  gateway's receive time in `bronze_orders`) to the OrderResult's arrival at a TCP listener, p50/p95/p99.
  Each kind gets a Workload of the same seed: the same bytes.
- **Agreement**: every run's outputs must be exact, and equal across the two kinds: bronze rows, the log
  app's window counts summed per (day, status) against the generator's, the daily summary once serve's
  sensor has written it, and for the market app every expected rejection answered once and in
  `order_rejections` once (bench/latency.count_check), the same order ids for both.

    python -m bench.kafka [--lines 1000000] [--days 7] [--latency-seconds 30] [--quick]

Prints JSON; a run that is not --quick also writes bench/results/kafka-<date>.json. Progress on stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.latency import (
    SPARK_ENV,
    ServeProcess,
    Workload,
    _flat,
    expected_for,
    run_serve,
)
from bench.processes import child_env, eventide_cmd, load_average, timed_process
from transforms.ports import free_port

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("landing", "kafka")
LOG_APP = "examples.logs:app"
LATENCY_RATE = 1000
SEED = 1

_t0 = time.perf_counter()


def progress(msg: str) -> None:
    print(f"[bench.kafka {time.perf_counter() - _t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def log_setting(kind: str, servers: str, prefix: str) -> str:
    """EVENTIDE_LOG for one measurement: the landing folder, or Kafka with topics of their own."""
    return "landing" if kind == "landing" else f"kafka://{servers}/{prefix}-"


# -- what the log app left in the tables ------------------------------------------------------------------
def log_outputs(settings) -> dict:
    """Bronze rows, the windows' counts summed per (day, status), the daily summary's counts."""
    from bench.logs import stored_summary_counts
    from examples.logs import BRONZE_TABLE, WINDOWS_TABLE
    from transforms import lake

    bronze, windows = settings.table_path(BRONZE_TABLE), settings.table_path(WINDOWS_TABLE)
    window_counts = {}
    if lake.exists(windows):
        rows = lake.query("select day, status, sum(count) as n from w group by day, status", w=windows).to_pylist()
        window_counts = {(r["day"], r["status"]): r["n"] for r in rows}
    return {"bronze_rows": lake.count(bronze) if lake.exists(bronze) else 0,
            "bronze_lines": lake.count(bronze, "kind = 'line'") if lake.exists(bronze) else 0,
            "window_counts": window_counts, "summary_counts": stored_summary_counts(settings)}


def wait_for_summary(settings, expected: dict, timeout: float) -> float | None:
    """Seconds until the daily summary (written by serve's sensor after the windows close) equals
    `expected`; None on timeout."""
    from bench.logs import stored_summary_counts

    start = time.time()
    while time.time() - start < timeout:
        if stored_summary_counts(settings) == expected:
            return round(time.time() - start, 1)
        time.sleep(1.0)
    return None


# -- throughput: the log file through `eventide serve` --------------------------------------------------
def each_caught_up(settings, t0: float, timeout: float) -> dict[str, float]:
    """Per query, the seconds from `t0` (perf_counter) until `status` first showed it with lag 0 and the
    log fully readable (no open journal, no error), polled until every query is there; TimeoutError
    after `timeout` seconds naming the queries still behind."""
    from orchestration.status import compute_status

    done: dict[str, float] = {}
    while True:
        st = compute_status(settings)
        now = round(time.perf_counter() - t0, 1)
        readable = all(lg.open == 0 and not lg.error for lg in st.logs)
        for q in st.queries:
            if readable and q.lag_messages == 0:
                done.setdefault(q.query, now)
        if st.queries and len(done) == len(st.queries):
            return done
        if now > timeout:
            behind = {q.query: q.lag_messages for q in st.queries if q.query not in done}
            raise TimeoutError(f"not caught up {timeout} s after the first byte: lag {behind}, "
                               f"logs {[(lg.log, lg.open, lg.error) for lg in st.logs]}")
        time.sleep(0.5)


def serve_throughput(kind: str, log: str, data: Path, messages: int, expected: dict, work: Path,
                     catch_up_timeout: float, summary_timeout: float) -> dict:
    from transforms.ingestion.sender import send_files
    from transforms.settings import Settings

    home = work / f"home-throughput-{kind}"
    port = free_port()
    env = child_env(**SPARK_ENV, EVENTIDE_HOME=str(home), EVENTIDE_APPS=LOG_APP, EVENTIDE_PORTS=f"logs={port}",
                    EVENTIDE_LOG=log)
    settings = Settings.from_env(env)
    out: dict = {"log": log, "load_average_before": load_average()}
    started = time.time()
    serve = ServeProcess(env)
    try:
        line = serve.wait_for_line("all ", timeout=240)
        out["startup_s"] = round(time.time() - started, 1)
        progress(f"throughput, {kind}: serve up in {out['startup_s']} s ({line})")
        t0 = time.perf_counter()
        sent = send_files("logs", [data], "127.0.0.1", port, framed=False, timeout=600)
        out["confirmed_s"] = round(time.perf_counter() - t0, 2)
        if sent != messages:
            raise AssertionError(f"throughput, {kind}: sent {sent} messages, expected {messages}")
        out["query_caught_up_s"] = each_caught_up(settings, t0, catch_up_timeout)
        out["caught_up_s"] = max(out["query_caught_up_s"].values())
        out["gateway_msgs_per_s"] = round(messages / out["confirmed_s"])
        out["msgs_per_s"] = round(messages / out["caught_up_s"])
        progress(f"throughput, {kind}: {messages:,} messages confirmed after {out['confirmed_s']} s, every query "
                 f"caught up after {out['caught_up_s']} s ({out['msgs_per_s']:,} msgs/s)")
        out["summary_after_caught_up_s"] = wait_for_summary(settings, expected, summary_timeout)
        out["load_average_after"] = load_average()
    finally:
        out["exit_code"] = serve.stop()
    found = log_outputs(settings)
    out["outputs"] = found
    out["exact"] = (found["window_counts"] == expected and found["summary_counts"] == expected
                    and found["bronze_lines"] == sum(expected.values()) and found["bronze_rows"] == messages)
    shutil.rmtree(home, ignore_errors=True)
    return out


# -- `eventide ingest` into each log ----------------------------------------------------------------------
def ingest(kind: str, log: str, data: Path, messages: int, work: Path) -> dict:
    from orchestration.status import compute_status
    from transforms.settings import Settings

    home = work / f"home-ingest-{kind}"
    env = child_env(EVENTIDE_HOME=str(home), EVENTIDE_APPS=LOG_APP, EVENTIDE_LOG=log)
    load = load_average()
    seconds = timed_process([*eventide_cmd(), "ingest", "logs", str(data), "--lines"], env, work / f"ingest-{kind}.out")
    logs = {lg.log: lg for lg in compute_status(Settings.from_env(env)).logs}
    held = logs["logs"].messages + logs["logs"].open
    shutil.rmtree(home, ignore_errors=True)
    progress(f"ingest, {kind}: {messages:,} messages in {seconds:.1f} s; the log holds {held:,}")
    if held != messages:
        raise AssertionError(f"ingest, {kind}: the log holds {held} messages after ingesting {messages}")
    return {"log": log, "seconds": round(seconds, 2), "msgs_per_s": round(messages / seconds),
            "messages_in_log": held, "load_average_before": load}


# -- latency: the market app at a fixed rate through `eventide serve` ------------------------------------
def serve_latency(kind: str, log: str, seconds: float, warmup_seconds: float, seed: int) -> dict:
    workload = Workload(seed)
    phases = [workload.phase("warmup", LATENCY_RATE, warmup_seconds, measured=False),
              workload.phase(f"rate_{LATENCY_RATE}", LATENCY_RATE, seconds)]
    expected = expected_for(workload, phases)
    load = load_average()
    out = run_serve(workload, phases, lambda m: progress(f"latency, {kind}: {m}"), drain_timeout=20,
                    final_timeout=90, bursts=0, env_extra={"EVENTIDE_LOG": log})
    out["log"] = log
    out["load_average_before"] = load
    out["expected_rejections"] = len(expected)
    # priming sends probe orders until one is answered: how many depends on how long that took
    out["probe_orders"] = out["count_check"]["expected"] - len(expected)
    measured = out[phases[-1].name]
    lat = measured.get("latency_from_gateway_receipt_ms", {})
    progress(f"latency, {kind}: receipt to answer p50 {lat.get('p50')} ms, p95 {lat.get('p95')} ms, "
             f"p99 {lat.get('p99')} ms; count check {out['count_check']['ok']}")
    return out


# -- the benchmark ------------------------------------------------------------------------------------------
def bench_kafka(results: dict, lines: int = 1_000_000, days: int = 7, latency_seconds: float = 30,
                warmup_seconds: float = 5, catch_up_timeout: float = 900, summary_timeout: float = 120,
                save: Path | None = None, order: tuple[str, ...] = KINDS) -> dict:
    """Fills `results` (flat keys, as the other benchmarks), writes the nested form to `save` if given,
    and returns it. Raises AssertionError when an output is not exact or the two logs disagree."""
    from examples.log_generate import generate_logs
    from transforms.kafka_broker import start_broker

    for k, v in SPARK_ENV.items():
        os.environ.setdefault(k, v)  # the broker's JVM and the children's
    work = Path(tempfile.mkdtemp(prefix="eventide-bench-kafka-"))
    nested: dict = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "machine": f"{os.cpu_count()} cores", "lines": lines, "days": days,
                    "latency_rate_msgs_per_s": LATENCY_RATE, "latency_seconds": latency_seconds,
                    "order": list(order), "load_average_at_start": load_average(),
                    "size": f"{lines:,} log lines over {days} days; {latency_seconds:g} s at {LATENCY_RATE:,} msgs/s"}
    started = time.time()
    try:
        data = work / "logs.log"
        info = generate_logs(data, lines=lines, days=days, seed=SEED)
        messages = info["lines"] + info["markers"]
        expected = info["expected"]
        nested.update(messages=messages, data_bytes=info["bytes"])
        progress(f"generated {info['lines']:,} lines over {days} days ({info['bytes'] / 1e6:.0f} MB), "
                 f"{messages:,} messages with the markers")
        with start_broker(work / "kafka") as broker:
            servers = broker.bootstrap_servers
            progress(f"broker up at {servers}")
            nested["throughput"] = {kind: serve_throughput(kind, log_setting(kind, servers, "throughput"), data,
                                                           messages, expected, work, catch_up_timeout,
                                                           summary_timeout) for kind in order}
            nested["ingest"] = {kind: ingest(kind, log_setting(kind, servers, "ingest"), data, messages, work)
                                for kind in order}
            nested["latency"] = {kind: serve_latency(kind, log_setting(kind, servers, "latency"), latency_seconds,
                                                     warmup_seconds, SEED) for kind in order}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    nested["wall_s"] = round(time.time() - started, 1)
    nested["load_average_at_end"] = load_average()
    nested["agreement"] = agreement(nested)
    flat: dict = {}
    _flat("", {k: v for k, v in nested.items() if k not in ("throughput", "latency", "agreement")}, flat)
    for kind in KINDS:
        t = nested["throughput"][kind]
        _flat(f"throughput_{kind}_", {k: v for k, v in t.items() if k != "outputs"}, flat)
        _flat(f"ingest_{kind}_", nested["ingest"][kind], flat)
        lat = nested["latency"][kind]
        _flat(f"latency_{kind}_", {k: v for k, v in lat.items() if k not in ("answered_ids", "last_lines")}, flat)
    _flat("agreement_", nested["agreement"], flat)
    results.update(flat)
    for kind in KINDS:  # the JSON keeps counts, not the sets and tables it compared
        nested["latency"][kind].pop("answered_ids", None)
        outputs = nested["throughput"][kind].pop("outputs")
        nested["throughput"][kind].update(bronze_rows=outputs["bronze_rows"], bronze_lines=outputs["bronze_lines"],
                                          window_count_cells=len(outputs["window_counts"]),
                                          summary_rows=len(outputs["summary_counts"]))
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        save.write_text(json.dumps(nested, indent=2, default=str) + "\n")
        progress(f"wrote {save}")
    ok = all(nested["agreement"].values())
    results["verified"] = ok
    if not ok:
        raise AssertionError(f"kafka: outputs not exact or the two logs disagree: {nested['agreement']}")
    return nested


def agreement(nested: dict) -> dict[str, bool]:
    """Every output exact, and the two logs' outputs equal."""
    thr, lat = nested["throughput"], nested["latency"]
    land, kafka = thr["landing"]["outputs"], thr["kafka"]["outputs"]
    return {
        "throughput_exact_landing": thr["landing"]["exact"],
        "throughput_exact_kafka": thr["kafka"]["exact"],
        "throughput_same_outputs": land == kafka,
        "latency_answers_exact_landing": lat["landing"]["count_check"]["ok"]
        and lat["landing"]["count_check"]["gateway_order_replay_equal"],
        "latency_answers_exact_kafka": lat["kafka"]["count_check"]["ok"]
        and lat["kafka"]["count_check"]["gateway_order_replay_equal"],
        "latency_same_rejections": lat["landing"]["answered_ids"] == lat["kafka"]["answered_ids"],
        "latency_same_bronze_rows": all(
            (lat[k]["bronze_orders_rows"] - lat[k]["probe_orders"], lat[k]["bronze_market_data_rows"])
            == (lat["landing"]["bronze_orders_rows"] - lat["landing"]["probe_orders"],
                lat["landing"]["bronze_market_data_rows"]) for k in KINDS),
    }


QUICK = {"lines": 50_000, "days": 3, "latency_seconds": 10, "warmup_seconds": 2}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=1_000_000, help="log lines for throughput and ingest")
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--latency-seconds", type=float, default=30, help="the measured phase at 1,000 msgs/s")
    p.add_argument("--quick", action="store_true", help="50,000 lines, 10 s of latency; writes no results file")
    p.add_argument("--kafka-first", action="store_true", help="each measurement with Kafka first (the machine's "
                   "load drifts: a second run in the other order shows how much the order matters)")
    p.add_argument("--out", type=Path, help="the results file (default bench/results/kafka-<date>.json)")
    args = p.parse_args(argv)
    results: dict = {}
    order = tuple(reversed(KINDS)) if args.kafka_first else KINDS
    if args.quick:
        nested = bench_kafka(results, **QUICK, order=order)
    else:
        save = args.out or RESULTS / f"kafka-{dt.date.today().isoformat()}.json"
        nested = bench_kafka(results, lines=args.lines, days=args.days, latency_seconds=args.latency_seconds,
                             save=save, order=order)
    print(json.dumps(nested, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
