"""Peers: Bytewax 0.21, a plain-Python loop and Eventide side by side on the three reference workloads.

Workloads (inputs generated once per run with a fixed seed, by the project's generators):

- logs:   Apache log lines over N days with an END_OF_DAY marker after each day -> the daily summary,
          a count per (day, HTTP status). Default 4M lines over 30 days.
- market: Wallaroo's market spread, 80 % quotes and 20 % orders (binary formats) over S symbols ->
          last bid/offer/reject per symbol and the rejected orders in arrival order. Default 1M msgs,
          3000 symbols.
- words:  the non-empty lines of data/wallaroo/word_count/count_this.txt repeated -> a running count
          per word occurrence (word, count so far) and the final total per word. Default 200k lines.

Each input is written once as a plain file (log lines; market as "seq m|o <hex payload>" lines, the
binary payloads decoded inside each implementation by examples/market_decoder.py; text lines) and
landed once into an Eventide home with `transforms.landing.Lander`. Neither is timed. Then, on that
same input, each implementation runs as a whole process, cold, timed from spawn to exit:

- bytewax:  `python -m bytewax.run bench/peers_bytewax.py:<workload>_flow(in, out)`: one worker, no
            recovery, FileSource -> map/flat_map (the project's decoders) -> key_on + stateful_map /
            stateful_flat_map -> file sinks (see bench/peers_bytewax.py);
- pyspark:  logs only, `python -m bench.peers_pyspark in out`: the hand-written PySpark job (read.text,
            regexp_extract, groupBy; session start included) that issue L measures Eventide's run against;
- required_shape: logs only, `python -m bench.peers_required_shape landed-home work out`: what Eventide
            must do by design (Structured Streaming over the landing with checkpoints, keyed state in
            transformWithStateInPandas, Delta tables through delta-spark, the summary counted by Spark
            reading bronze as Delta), hand-written the plain way, with delta-spark's defaults;
- loop:     `python -m bench.peers --loop <workload> in out`: one process reads the same file and makes
            the same decisions with the project's loop functions (parse_log_line, market.run_loop,
            split_words), writing the same output files;
- eventide: `eventide run --app examples.<workload>:app` with EVENTIDE_HOME on a fresh copy of the
            landed home (fresh checkpoints and tables): Dagster's pipelines job (bronze, the app, its
            checks) and, for logs, the daily summaries the sensor asks for, all in that one command.

Steady state (per workload, `--steady`): the same work in this process after an untimed warm-up:
Bytewax with `bytewax.testing.run_main`, the loop function called directly, and Eventide's
`orchestration.runner.run_all` (what `eventide run` does, so cold minus steady is start-up: JVM,
imports, Dagster) on a warm Spark session (`transforms.spark.get_spark`), after a small warm-up run in
another home, over a fresh copy of the landed home. The Spark query time of the app alone is recorded
too (`<w>_eventide_steady_app_query_median_s`). Eventide's word count runs ~3k lines/s, so its
steady state at 200k lines adds ~3 x 60 s: the full default leaves it out (`--steady logs,market`);
`--steady all` puts it back.

Outputs must agree, or the benchmark raises: logs, the same {(day, status): count} as the generator;
market, the same rejected order ids in the same order and the same final (bid, offer, reject) per symbol
as the loop; words, the same sorted multiset of (word, count) updates and the same totals as the loop.
Every repeat of every implementation is checked.

Results (flat keys, per workload w, implementation i in bytewax/loop/pyspark/required_shape/eventide, mode
cold/steady): w_i_mode_median_s / _min_s / _max_s, w_i_mode_<unit>_per_s (on the median), and the rate
ratios w_eventide_vs_<i>_mode_ratio (> 1: Eventide faster), w_agree, agree.

    python -m bench.peers --quick                    # logs 100k/5 days, market 50k/300, words 5k, 1 repeat
    python -m bench.peers --only logs,market --repeats 3
    python -m bench.peers --only logs --logs-lines 10000000 --without required_shape,pyspark
    python -m bench.peers --logs-lines 1000000 --market-messages 200000 --words-lines 20000 --steady none
    python -m bench.run --only peers [--quick]       # the same inside `make bench`

Needs the bench extra (`pip install -e '.[bench]'`, `make bench` does it). Prints JSON on stdout;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.processes import (
    REPO,
    child_env,
    eventide_cmd,
    eventide_env,
    fresh_home,
    land,
    load_average,
    spread,
    timed_process,
)

FLOWS_FILE = Path(__file__).resolve().with_name("peers_bytewax.py")
WORDS_FILE = REPO / "data" / "wallaroo" / "word_count" / "count_this.txt"
WORKLOADS = ("logs", "market", "words")
IMPLS = ("bytewax", "loop", "pyspark", "required_shape", "eventide")
# The loop first: it is the reference.
COLD_IMPLS = {"logs": ("loop", "bytewax", "pyspark", "required_shape", "eventide")}
STEADY_IMPLS = ("loop", "bytewax", "eventide")
APPS = {"logs": "examples.logs:app", "market": "examples.market:app", "words": "examples.words:app"}
UNITS = {"logs": "lines", "market": "msgs", "words": "lines"}
FULL = {"logs_lines": 4_000_000, "logs_days": 30, "market_messages": 1_000_000, "market_symbols": 3000,
        "words_lines": 200_000}
QUICK = {"logs_lines": 100_000, "logs_days": 5, "market_messages": 50_000, "market_symbols": 300,
         "words_lines": 5_000}
DEFAULT_STEADY = ("logs", "market")  # words' Eventide steady state is ~3 x 140 s at 200k lines
REPEATS = 3
SEED = 1
MARKER = "END_OF_DAY"
WARMUP_MESSAGES = 2_000

_t0 = time.perf_counter()


def progress(msg: str) -> None:
    print(f"[bench.peers {time.perf_counter() - _t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# -- the loops (also the `--loop` subprocess): same file in, same files out as the Bytewax flows ----------------
def _write_lines(path: Path, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as f:
        f.writelines(f"{line}\n" for line in lines)


def loop_logs(inp: Path, out: Path) -> None:
    """bench.logs.python_loop_counts over the file: every line parsed, (day, status) counted."""
    from examples.logs_decoder import parse_log_line

    counts: Counter = Counter()
    with open(inp, encoding="utf-8") as f:
        for line in f:
            rec = parse_log_line(line, MARKER)
            if not rec.is_marker:
                counts[(rec.day, rec.status)] += 1
    out.mkdir(parents=True, exist_ok=True)
    _write_lines(out / "summary.txt", (f"{d.isoformat()} {s} {n}" for (d, s), n in sorted(counts.items())))


def _market_messages(inp: Path) -> Iterator[tuple[str, bytes]]:
    with open(inp, encoding="ascii") as f:
        for line in f:
            _seq, kind, payload = line.split(" ", 2)
            yield ("market_data" if kind == "m" else "orders"), bytes.fromhex(payload)


def loop_market(inp: Path, out: Path) -> None:
    """examples.market.run_loop over the file (decoding the binary payloads as it goes)."""
    from examples.market import run_loop

    quotes, rejections = run_loop(_market_messages(inp))
    out.mkdir(parents=True, exist_ok=True)
    _write_lines(out / "rejections.txt", (f"{i} {r.order_id}" for i, r in enumerate(rejections)))
    _write_lines(out / "state.txt", (f"{q.symbol} {q.bid!r} {q.offer!r} {int(q.reject)}" for q in quotes.values()))


def loop_words(inp: Path, out: Path) -> None:
    """bench.engine.bench_words' loop over the file: split, count, an update per occurrence."""
    from examples.words import split_words

    counts: Counter = Counter()
    out.mkdir(parents=True, exist_ok=True)
    with open(inp, encoding="utf-8") as f, open(out / "updates.txt", "w", encoding="utf-8", buffering=1 << 20) as u:
        for line in f:
            for w in split_words(line):
                counts[w] += 1
                u.write(f"{w}\t{counts[w]}\n")
    _write_lines(out / "totals.txt", (f"{w}\t{n}" for w, n in counts.items()))


LOOPS: dict[str, Callable[[Path, Path], None]] = {"logs": loop_logs, "market": loop_market, "words": loop_words}


# -- inputs: generated once, written as a plain file and landed into a home (not timed) ---------------------
@dataclass
class Workload:
    name: str
    units: int  # lines or messages: the rate's numerator
    input: Path
    home: Path  # the landed Eventide home (its landing folder is copied for each run)
    warm_home: Path  # a small landed home for the steady-state warm-up
    warm_input: Path
    expected: object = None  # logs: the generator's counts
    info: dict = field(default_factory=dict)


def _log_payloads(path: Path) -> Iterator[tuple[str, bytes]]:
    marker = MARKER.encode()
    with open(path, "rb") as f:
        for line in f:
            yield "logs", (marker if line.rstrip(b"\r\n") == marker else line)


def prepare_logs(tmp: Path, lines: int, days: int) -> Workload:
    from examples.log_generate import generate_logs

    w = Workload("logs", lines, tmp / "logs-input.log", tmp / "logs-home", tmp / "logs-warm-home",
                 tmp / "logs-warm-input.log")
    raw = generate_logs(w.input, lines, days, seed=SEED)
    w.expected = raw["expected"]
    w.info = {"lines": raw["lines"], "days": len(raw["days"]), "input_bytes": raw["bytes"], "markers": raw["markers"]}
    land(w.home, _log_payloads(w.input))
    generate_logs(w.warm_input, WARMUP_MESSAGES, 2, seed=SEED + 1)
    land(w.warm_home, _log_payloads(w.warm_input))
    return w


def prepare_market(tmp: Path, messages: int, symbols: int) -> Workload:
    from examples.market_generate import mixed_messages, synthetic_symbols

    w = Workload("market", messages, tmp / "market-input.txt", tmp / "market-home", tmp / "market-warm-home",
                 tmp / "market-warm-input.txt")
    stream = mixed_messages(messages, synthetic_symbols(symbols), seed=SEED, order_share=0.2, unknown_share=0.0)
    lines = (f"{i} {'m' if s == 'market_data' else 'o'} {p.hex()}" for i, (s, p) in enumerate(stream))
    _write_lines(w.input, lines)
    _write_lines(w.warm_input, (f"{i} {'m' if s == 'market_data' else 'o'} {p.hex()}"
                                for i, (s, p) in enumerate(stream[:WARMUP_MESSAGES])))
    land(w.home, stream)
    land(w.warm_home, stream[:WARMUP_MESSAGES])
    w.info = {"msgs": messages, "symbols": symbols, "orders": sum(s == "orders" for s, _ in stream),
              "input_bytes": w.input.stat().st_size}
    return w


def prepare_words(tmp: Path, lines: int) -> Workload:
    from transforms.ingestion.framing import iter_file_messages

    w = Workload("words", lines, tmp / "words-input.txt", tmp / "words-home", tmp / "words-warm-home",
                 tmp / "words-warm-input.txt")
    text = [ln for ln in iter_file_messages(WORDS_FILE) if ln.strip()]
    payloads = [text[i % len(text)] for i in range(lines)]
    with open(w.input, "wb") as f:
        f.writelines(p.rstrip(b"\r\n") + b"\n" for p in payloads)
    with open(w.warm_input, "wb") as f:
        f.writelines(p.rstrip(b"\r\n") + b"\n" for p in payloads[:WARMUP_MESSAGES])
    land(w.home, (("text", p) for p in payloads))
    land(w.warm_home, (("text", p) for p in payloads[:WARMUP_MESSAGES]))
    w.info = {"lines": lines, "distinct_lines": len(text), "input_bytes": w.input.stat().st_size}
    return w


# -- outputs, normalized for comparison --------------------------------------------------------------------
def _words_table(table):
    """(word, count) rows in a canonical order: the multiset of updates, comparable with `equals`."""
    import pyarrow as pa

    t = table.select(["word", "count"]).cast(pa.schema([("word", pa.string()), ("count", pa.int64())]))
    return t.sort_by([("word", "ascending"), ("count", "ascending")]).combine_chunks()


def _read_tsv(path: Path):
    import pyarrow as pa
    import pyarrow.csv as csv

    return csv.read_csv(
        path, read_options=csv.ReadOptions(column_names=["word", "count"]),
        parse_options=csv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False, newlines_in_values=False),
        convert_options=csv.ConvertOptions(column_types={"word": pa.string(), "count": pa.int64()},
                                           strings_can_be_null=False, quoted_strings_can_be_null=False))


def read_file_outputs(workload: str, out: Path):
    """The outputs the Bytewax flow or the loop wrote, in the comparison's shape."""
    import datetime as dt

    if workload == "logs":
        counts: dict = {}
        for line in (out / "summary.txt").read_text().splitlines():
            day, status, n = line.split(" ")
            key = (dt.date.fromisoformat(day), int(status))
            if key in counts:  # one window per day here: a second one means a day's counts were split
                raise AssertionError(f"logs: (day, status) {key} output twice in {out}")
            counts[key] = int(n)
        return counts
    if workload == "market":
        rej = [line.split(" ") for line in (out / "rejections.txt").read_text().splitlines()]
        rejected = [oid for _seq, oid in sorted(rej, key=lambda r: int(r[0]))]
        state = {}
        for line in (out / "state.txt").read_text().splitlines():
            sym, bid, offer, reject = line.split(" ")
            state[sym] = (float(bid), float(offer), bool(int(reject)))
        return rejected, state
    updates = _read_tsv(out / "updates.txt")
    totals = _read_tsv(out / "totals.txt")
    return (_words_table(updates), dict(zip(totals.column("word").to_pylist(), totals.column("count").to_pylist())))


def read_eventide_outputs(workload: str, home: Path):
    from transforms import lake
    from transforms.settings import Settings

    settings = Settings(home=home)
    if workload == "logs":
        from bench.logs import stored_summary_counts

        return stored_summary_counts(settings)
    if workload == "market":
        from examples.market import MARKET_STATE_TABLE, ORDER_REJECTIONS_TABLE

        state = lake.read(settings.table_path(MARKET_STATE_TABLE), columns=["symbol", "bid", "offer", "reject"])
        rej = lake.read(settings.table_path(ORDER_REJECTIONS_TABLE), columns=["order_id", "seq"]).sort_by("seq")
        return (rej.column("order_id").to_pylist(),
                {r["symbol"]: (r["bid"], r["offer"], bool(r["reject"])) for r in state.to_pylist()})
    updates = lake.read(settings.table_path("word_count_updates"), columns=["word", "count"])
    totals = lake.read(settings.table_path("word_totals"), columns=["word", "count"])
    return (_words_table(updates), dict(zip(totals.column("word").to_pylist(), totals.column("count").to_pylist())))


def _dict_diff(got: dict, want: dict, limit: int = 5) -> str:
    wrong = [k for k in set(got) | set(want) if got.get(k) != want.get(k)]
    sample = [(str(k), got.get(k), want.get(k)) for k in sorted(wrong, key=str)[:limit]]
    return f"{len(wrong)} keys differ, e.g. (key, got, want) {sample}"


def check_agrees(workload: str, who: str, got, want) -> None:
    """Raise AssertionError unless `got` equals the reference `want` (see the module docstring)."""
    if workload == "logs":
        if got != want:
            raise AssertionError(f"logs: {who} disagrees with the generator's daily counts: {_dict_diff(got, want)}")
        return
    if workload == "market":
        (rej, state), (want_rej, want_state) = got, want
        if rej != want_rej:
            first = next((i for i, (a, b) in enumerate(zip(rej, want_rej)) if a != b), min(len(rej), len(want_rej)))
            raise AssertionError(f"market: {who} rejected {len(rej)} orders, the loop {len(want_rej)}; "
                                 f"first difference at position {first}")
        if state != want_state:
            raise AssertionError(f"market: {who} disagrees on the final state per symbol: {_dict_diff(state, want_state)}")
        return
    (updates, totals), (want_updates, want_totals) = got, want
    if updates.num_rows != want_updates.num_rows:
        raise AssertionError(f"words: {who} made {updates.num_rows:,} updates, the loop {want_updates.num_rows:,}")
    if not updates.equals(want_updates):
        raise AssertionError(f"words: {who}'s (word, count) updates differ from the loop's (same number)")
    if totals != want_totals:
        raise AssertionError(f"words: {who} disagrees on the totals per word: {_dict_diff(totals, want_totals)}")


def _reference(w: Workload, loop_out):
    if w.name == "logs":
        return w.expected
    if w.name == "words":  # the loop's own consistency: totals are its last counts
        updates, totals = loop_out
        if sum(totals.values()) != updates.num_rows:
            raise AssertionError("words: the loop's totals do not sum to its number of updates")
    return loop_out


# -- running: cold processes ---------------------------------------------------------------------------------
def run_cold(w: Workload, impl: str, scratch: Path) -> tuple[float, object]:
    """One cold run of `impl` over the workload: (seconds, outputs as compared)."""
    scratch.mkdir(parents=True, exist_ok=True)
    log = scratch / f"{w.name}-{impl}.log"
    if impl != "eventide":  # a process writing output files: the same input in, the same files out
        out = scratch / f"{w.name}-{impl}-out"
        shutil.rmtree(out, ignore_errors=True)
        inp, dst = str(w.input), str(out)
        work = scratch / f"{w.name}-{impl}-work"
        shutil.rmtree(work, ignore_errors=True)
        cmd = {"bytewax": ["-m", "bytewax.run", f"{FLOWS_FILE}:{w.name}_flow({inp!r}, {dst!r})"],
               "pyspark": ["-m", "bench.peers_pyspark", inp, dst],
               "required_shape": ["-m", "bench.peers_required_shape", str(w.home), str(work), dst],
               "loop": ["-m", "bench.peers", "--loop", w.name, inp, dst]}[impl]
        seconds = timed_process([sys.executable, *cmd], child_env(), log)
        return seconds, read_file_outputs(w.name, out)
    home = fresh_home(w.home, scratch / f"{w.name}-eventide-home")
    seconds = timed_process([*eventide_cmd(), "run", "--app", APPS[w.name]], child_env(EVENTIDE_HOME=str(home)), log)
    try:
        return seconds, read_eventide_outputs(w.name, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- running: steady state, in this process ------------------------------------------------------------------
def _bytewax_in_process(w: Workload, inp: Path, out: Path) -> float:
    from bytewax.testing import run_main

    from bench.peers_bytewax import FLOWS

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    run_main(FLOWS[w.name](str(inp), str(out)))
    return time.perf_counter() - started


def _loop_in_process(w: Workload, inp: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    LOOPS[w.name](inp, out)
    return time.perf_counter() - started


def _eventide_in_process(w: Workload, landed: Path, home: Path) -> tuple[float, dict, object]:
    """`run_all` over a fresh copy of `landed`: (seconds, the app's queries {seconds, batches}, outputs)."""
    from bench.logs import timed_run_all

    fresh_home(landed, home)
    try:
        with eventide_env(home, APPS[w.name]) as settings:
            run = timed_run_all(settings)
        app = [q for q in run["queries"] if not q["query"].startswith("bronze_")]
        app_query = {"seconds": sum(q["seconds"] for q in app), "batches": sum(q["batches"] for q in app)}
        return run["total_s"], app_query, read_eventide_outputs(w.name, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- the benchmark -------------------------------------------------------------------------------------------
def _record(out: dict, w: Workload, mode: str, times: dict[str, list[float]]) -> None:
    unit = UNITS[w.name]
    medians = {}
    for impl, ts in times.items():
        if not ts:
            continue
        for k, v in spread(ts).items():
            out[f"{w.name}_{impl}_{mode}_{k}"] = v
        medians[impl] = statistics.median(ts)
        out[f"{w.name}_{impl}_{mode}_{unit}_per_s"] = round(w.units / medians[impl])
    if "eventide" in medians:
        for other in ("bytewax", "loop", "pyspark", "required_shape"):
            if other in medians:  # rate ratio: > 1 means Eventide is faster
                out[f"{w.name}_eventide_vs_{other}_{mode}_ratio"] = round(medians[other] / medians["eventide"], 4)


def bench_peers(results: dict, only: Iterable[str] = WORKLOADS, repeats: int = REPEATS, sizes: dict | None = None,
                steady: Iterable[str] = DEFAULT_STEADY, keep: bool = False, without: Iterable[str] = ()) -> dict:
    """Fill `results` (flat keys) for each workload of `only`, leaving out the cold implementations of
    `without` (never eventide, nor the loop: the reference); raises if any implementation disagrees."""
    from importlib.metadata import version

    without = set(without) - {"eventide", "loop"}
    sizes = {**FULL, **(sizes or {})}
    only = [w for w in WORKLOADS if w in set(only)]
    steady = [w for w in only if w in set(steady)]
    results.update({"bytewax_version": version("bytewax"), "repeats": repeats, "workloads": ",".join(only),
                    "steady_state_workloads": ",".join(steady), "cpus": os.cpu_count(),
                    "load_average_at_start": load_average()})
    tmp = Path(tempfile.mkdtemp(prefix="eventide-bench-peers-"))
    try:
        workloads: dict[str, Workload] = {}
        for name in only:
            progress(f"{name}: generating the input, writing it and landing it (not timed) ...")
            if name == "logs":
                w = prepare_logs(tmp, sizes["logs_lines"], sizes["logs_days"])
            elif name == "market":
                w = prepare_market(tmp, sizes["market_messages"], sizes["market_symbols"])
            else:
                w = prepare_words(tmp, sizes["words_lines"])
            workloads[name] = w
            results.update({f"{name}_{k}": v for k, v in w.info.items()})
            progress(f"  {name}: {w.units:,} {UNITS[name]}, {w.info['input_bytes']:,} bytes of input")

        # Cold: every implementation as its own process, interleaved per repeat.
        for name, w in workloads.items():
            times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
            want = None
            for r in range(repeats):
                for impl in (i for i in COLD_IMPLS.get(name, STEADY_IMPLS) if i not in without):
                    seconds, got = run_cold(w, impl, tmp / "scratch")
                    if want is None:
                        want = _reference(w, got)
                    check_agrees(name, f"{impl} (cold, repeat {r + 1})", got, want)
                    times[impl].append(seconds)
                    rate = w.units / seconds
                    progress(f"  {name} cold {impl} #{r + 1}: {seconds:.2f} s ({rate:,.0f} {UNITS[name]}/s), agrees")
                    del got
            _record(results, w, "cold", times)
            if name == "market":
                results["market_rejections"] = len(want[0])
            elif name == "words":
                results["words_updates"] = want[0].num_rows
                results["words_distinct_words"] = len(want[1])
            results[f"{name}_agree"] = True
            w.expected = want

        if steady:
            _steady_state(results, [workloads[n] for n in steady], repeats, tmp)
        results["agree"] = all(results.get(f"{n}_agree") for n in only)
        results["load_average_at_end"] = load_average()
        results["note"] = ("cold: each implementation a whole process, spawn to exit, on the same generated input; "
                           "steady: the same work in the benchmark's process after a warm-up (Eventide: run_all on a "
                           "warm Spark session). Ratios are rate ratios: > 1 means Eventide is faster.")
        return results
    finally:
        if keep:
            progress(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _steady_state(results: dict, workloads: list[Workload], repeats: int, tmp: Path) -> None:
    from transforms import spark as spark_module
    from transforms.settings import Settings

    owned = spark_module._session is None
    progress("steady state: starting Spark in this process (not timed) ...")
    started = time.perf_counter()
    spark_module.get_spark(Settings(home=tmp / "spark-home"))
    results["steady_spark_start_s"] = round(time.perf_counter() - started, 1)
    scratch = tmp / "steady"
    scratch.mkdir(exist_ok=True)
    try:
        for w in workloads:
            want = w.expected
            # Warm-ups, untimed: imports, bytewax's runtime, Spark's Python workers, Dagster, first Delta tables.
            _bytewax_in_process(w, w.warm_input, scratch / "warm-bytewax")
            _loop_in_process(w, w.warm_input, scratch / "warm-loop")
            warm_s, _, _ = _eventide_in_process(w, w.warm_home, scratch / "warm-eventide")
            progress(f"{w.name} steady state: warm-up done (Eventide warm-up run {warm_s:.1f} s)")
            times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
            app_query: list[float] = []
            for r in range(repeats):
                for impl in STEADY_IMPLS:
                    if impl == "eventide":
                        seconds, query, got = _eventide_in_process(w, w.home, scratch / "eventide-home")
                        app_query.append(query["seconds"])
                        results[f"{w.name}_eventide_steady_app_batches"] = query["batches"]
                    else:
                        out = scratch / f"{impl}-out"
                        run = _bytewax_in_process if impl == "bytewax" else _loop_in_process
                        seconds = run(w, w.input, out)
                        got = read_file_outputs(w.name, out)
                    check_agrees(w.name, f"{impl} (steady, repeat {r + 1})", got, want)
                    times[impl].append(seconds)
                    progress(f"  {w.name} steady {impl} #{r + 1}: {seconds:.2f} s "
                             f"({w.units / seconds:,.0f} {UNITS[w.name]}/s), agrees")
                    del got
            _record(results, w, "steady", times)
            results[f"{w.name}_eventide_steady_app_query_median_s"] = round(statistics.median(app_query), 3)
    finally:
        if owned:
            with contextlib.suppress(Exception):
                spark_module.stop_spark()


def _ints(text: str) -> int:
    return int(text.replace("_", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat, steady state for all")
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated: logs,market,words")
    parser.add_argument("--repeats", type=int, default=None, help=f"runs per figure (default {REPEATS}; quick 1)")
    parser.add_argument("--steady", default=None,
                        help="workloads with a steady-state figure: comma-separated, 'all' or 'none' "
                        f"(default {','.join(DEFAULT_STEADY)}; quick: all)")
    for key in FULL:
        parser.add_argument(f"--{key.replace('_', '-')}", type=_ints, default=None)
    parser.add_argument("--without", default="", help="cold implementations to leave out, comma-separated "
                        "(e.g. required_shape, the slowest at 10M lines)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (inputs, homes, logs)")
    parser.add_argument("--loop", nargs=3, metavar=("WORKLOAD", "INPUT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop:  # the loop implementation, as a process of its own
        workload, inp, out = args.loop
        LOOPS[workload](Path(inp), Path(out))
        return 0
    sizes = dict(QUICK if args.quick else FULL)
    sizes.update({k: getattr(args, k) for k in FULL if getattr(args, k) is not None})
    repeats = args.repeats or (1 if args.quick else REPEATS)
    steady_arg = args.steady or ("all" if args.quick else ",".join(DEFAULT_STEADY))
    steady = WORKLOADS if steady_arg == "all" else () if steady_arg == "none" else tuple(steady_arg.split(","))
    results: dict = {}
    bench_peers(results, args.only.split(","), repeats, sizes, steady, keep=args.keep,
                without=[i for i in args.without.split(",") if i])
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
