"""Session windows: Eventide against Bytewax 0.21 on the same events, same run (issue 25, item 9).

Input (generated once per run, seed 1, not timed): N events "key,event_ms,value" over K keys
(default 1,000,000 events, 100,000 keys, about 17 hours of event time, 60 ms apart). Half the events go
to a key drawn uniformly, half to the key of one of the 64 events before (bursts, so sessions hold more
than one event); 5 % are 1 ms to 20 minutes older than their place in the file (out of order: some
late, some bridging two sessions). Sessions: gap 30 minutes, allowed lateness 5 minutes, a count and
a sum per session; late events routed, not dropped, so they can be compared too.

Three implementations on that file:

- eventide: `eventide ingest events <file> --lines` then `eventide run`, each a whole process timed from
  spawn to exit, over a fresh EVENTIDE_HOME, with `--app bench.sessions:app` (below:
  `session_windows(...).over(count and sum)` into the Delta tables bench_sessions and
  bench_sessions_late). Steady state (`--steady`): `run` again in this process on a warm Spark session
  (orchestration.runner.run_all, what `eventide run` does) over a fresh copy of the landed home, after a
  small warm-up, as bench/peers.py does.
- bytewax: `python -m bytewax.run bench/sessions_bytewax.py:sessions_flow(...)` as a whole process (one
  worker, no recovery; `fold_window` over `SessionWindower` and `EventClock`, see that file for how it is
  made to decide as Eventide does); steady state: `bytewax.testing.run_main` in a process of its own
  (`--bytewax-steady`), timed after a warm-up run there (in the harness's process, next to its Spark JVM
  and the reference's sessions, Bytewax ran far slower).
- reference: windows.session.reference_sessions per key over the whole file, in this process: the
  oracle (a batch over the whole input; its time is recorded, not compared).

What closes at the end of input: Bytewax closes every session at the end of its input. Eventide closes
a session when the key's watermark (its latest event time minus the lateness) passes the session's end,
and by default nothing at the end of input; the benchmark runs `eventide run --close-windows`, which
closes every open session at the end (reason `end_of_input`), so all three must give every session.
With `--watermark-only` it runs plain `eventide run` (a key's last sessions stay open in its state) and
Eventide's sessions are compared with the reference's closed ones only. Exactly, as sorted lists:

- Bytewax's sessions (key, start_ms, end_ms, count, sum) = the reference's closed and still-open
  sessions (Bytewax's bounds are its first and last event: end_ms = last + gap);
- Eventide's = the same (`--close-windows`), or the reference's closed ones (`--watermark-only`);
- the late events (key, event_ms) are the same multiset in all three.

Any difference raises. Results: flat keys in bench/results/latest.json via `python -m bench.run --only
sessions` and the nested form in bench/results/sessions-<date>.json (size, timings, load averages).

    python -m bench.sessions [--events 1000000] [--keys 100000] [--repeats 1] [--steady] [--watermark-only] [--quick]

Needs the bench extra (`pip install -e '.[bench]'`, `make bench` does it). Progress on stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa

from bench.processes import (
    REPO,
    child_env,
    eventide_cmd,
    eventide_env,
    fresh_home,
    load_average,
    spread,
    timed_process,
)
from transforms.api import Application, DeltaSink, decoder, source
from transforms.windowing import session_windows
from windows import Aggregator, LateEvent, WindowResult, late_event_schema

RESULTS = Path(__file__).resolve().parent / "results"
FLOW_FILE = Path(__file__).resolve().with_name("sessions_bytewax.py")
APP = "bench.sessions:app"
STREAM = "events"
SESSIONS_TABLE = "bench_sessions"
LATE_TABLE = "bench_sessions_late"
GAP_MS = 30 * 60_000
LATENESS_MS = 5 * 60_000
STEP_MS = 60
T0_MS = 1_700_000_000_000
SEED = 1
EVENTS, KEYS = 1_000_000, 100_000
QUICK = {"events": 100_000, "keys": 10_000}
WARMUP_EVENTS = 2_000

_t0 = time.perf_counter()


def progress(msg: str) -> None:
    print(f"[bench.sessions {time.perf_counter() - _t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _commit() -> str:
    """The code measured: HEAD, and whether the tree differs from it (a shared tree often does); a copy
    made with `git archive` (no .git) says which commit in EVENTIDE_BENCH_COMMIT."""
    if os.environ.get("EVENTIDE_BENCH_COMMIT"):
        return os.environ["EVENTIDE_BENCH_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                              text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


# -- the Eventide app --------------------------------------------------------------------------------------
EVENT_SCHEMA = pa.schema([("key", pa.string()), ("ms", pa.int64()), ("value", pa.int64())])
SESSION_SCHEMA = pa.schema([("key", pa.string()), ("start_ms", pa.int64()), ("end_ms", pa.int64()),
                            ("count", pa.int64()), ("sum", pa.int64()), ("close_reason", pa.string())])


@decoder(schema=EVENT_SCHEMA)
def decode_event(payload: bytes):
    key, ms, value = payload.decode().split(",")
    return {"key": key, "ms": int(ms), "value": int(value)}


count_and_sum = Aggregator(create=lambda: (0, 0), add=lambda acc, e: (acc[0] + 1, acc[1] + e["value"]),
                           merge=lambda a, b: (a[0] + b[0], a[1] + b[1]))


def session_row(w: WindowResult) -> dict:
    return {"key": w.key, "start_ms": w.start_ms, "end_ms": w.end_ms, "count": w.value[0], "sum": w.value[1],
            "close_reason": str(w.close_reason)}


app = Application(
    "bench_sessions",
    source(STREAM, decoder=decode_event)
    .key_by("key")
    .to(session_windows(GAP_MS, event_time="ms", allowed_lateness_ms=LATENESS_MS, late="route")
        .over(count_and_sum).emit(session_row))
    .to_sink(DeltaSink(SESSIONS_TABLE, schema=SESSION_SCHEMA, accepts=dict),
             DeltaSink(LATE_TABLE, schema=late_event_schema(), accepts=LateEvent)),
    description="bench: session windows (30 min gap) per key, a count and a sum each",
)


# -- input ------------------------------------------------------------------------------------------------
def generate(path: Path, events: int, keys: int, seed: int = SEED) -> dict:
    """Write `events` lines "key,event_ms,value" to `path` (see the module docstring); deterministic."""
    rng = random.Random(seed)
    recent: list[int] = []
    used = set()
    out_of_order = 0
    with open(path, "w", encoding="ascii", buffering=1 << 20) as f:
        for i in range(events):
            k = recent[rng.randrange(len(recent))] if recent and rng.random() < 0.5 else rng.randrange(keys)
            t = T0_MS + i * STEP_MS
            if rng.random() < 0.05:
                t -= rng.randrange(1, 20 * 60_000)
                out_of_order += 1
            f.write(f"k{k:06d},{t},{rng.randrange(1, 1000)}\n")
            used.add(k)
            if len(recent) < 64:
                recent.append(k)
            else:
                recent[i % 64] = k
    return {"events": events, "keys": keys, "keys_used": len(used), "out_of_order_events": out_of_order,
            "event_time_span_h": round(events * STEP_MS / 3.6e6, 1), "input_bytes": path.stat().st_size}


# -- the oracle --------------------------------------------------------------------------------------------
def reference(path: Path) -> tuple[list, list, Counter]:
    """windows.session.reference_sessions per key: (closed sessions, still-open sessions, late events),
    sessions as sorted (key, start_ms, end_ms, count, sum), late as a Counter of (key, event_ms)."""
    from windows.session import reference_sessions

    per_key: dict[str, list] = defaultdict(list)
    with open(path, encoding="ascii") as f:
        for seq, line in enumerate(f):
            key, ms, value = line.split(",")
            per_key[key].append((seq, int(ms), {"value": int(value)}))
    closed, still_open, late = [], [], Counter()
    for key, events in per_key.items():
        c, o, lt = reference_sessions(count_and_sum, GAP_MS, LATENESS_MS, key, events)
        closed += [(w.key, w.start_ms, w.end_ms, *w.value) for w in c]
        still_open += [(w.key, w.start_ms, w.end_ms, *w.value) for w in o]
        late.update((key, t) for _seq, t in lt)
    return sorted(closed), sorted(still_open), late


# -- outputs -----------------------------------------------------------------------------------------------
def read_bytewax(out: Path) -> tuple[list, Counter]:
    """The flow's files: sessions joined with their bounds by (key, window id); late events."""
    bounds = {}
    for line in (out / "meta.txt").read_text().splitlines():
        key, wid, open_ms, close_ms = line.split("\t")
        bounds[(key, wid)] = (int(open_ms), int(close_ms) + GAP_MS)  # close_ms is the last event's time
    sessions = []
    for line in (out / "sessions.txt").read_text().splitlines():
        key, wid, count, total = line.split("\t")
        start, end = bounds.pop((key, wid))
        sessions.append((key, start, end, int(count), int(total)))
    if bounds:
        raise AssertionError(f"bytewax: {len(bounds)} windows have bounds but no value, e.g. {next(iter(bounds))}")
    late = Counter()
    for line in (out / "late.txt").read_text().splitlines():
        key, ms = line.split("\t")
        late[(key, int(ms))] += 1
    return sorted(sessions), late


def read_eventide(home: Path) -> tuple[list, Counter, Counter]:
    """The Delta tables: (sessions, late events, close reasons)."""
    from transforms import lake
    from transforms.settings import Settings

    settings = Settings(home=home)
    path = settings.table_path(SESSIONS_TABLE)
    sessions, reasons = [], Counter()
    if lake.exists(path):  # else no session closed (a small input): the table was never written
        t = lake.read(path, columns=["key", "start_ms", "end_ms", "count", "sum", "close_reason"])
        sessions = sorted(zip(*(t.column(c).to_pylist() for c in ("key", "start_ms", "end_ms", "count", "sum"))))
        reasons.update(t.column("close_reason").to_pylist())
    late_path = settings.table_path(LATE_TABLE)
    late = Counter()
    if lake.exists(late_path):
        lt = lake.read(late_path, columns=["key", "event_ms"])
        late.update(zip(lt.column("key").to_pylist(), lt.column("event_ms").to_pylist()))
    return sessions, late, reasons


def _diff(who: str, got: list, want: list, what: str) -> str:
    g, w = set(got), set(want)
    return (f"sessions: {who} has {len(got):,} sessions, {what} {len(want):,}; {len(g - w):,} not in {what}, "
            f"e.g. {sorted(g - w)[:3]}; {len(w - g):,} missing, e.g. {sorted(w - g)[:3]}")


def check(who: str, sessions: list, late: Counter, want_sessions: list, want_late: Counter, what: str) -> None:
    if sessions != want_sessions:
        raise AssertionError(_diff(who, sessions, want_sessions, what))
    if late != want_late:
        raise AssertionError(f"sessions: {who} has {sum(late.values()):,} late events, the reference "
                             f"{sum(want_late.values()):,}; they differ on {len(set(late) ^ set(want_late)):,}")


# -- running ----------------------------------------------------------------------------------------------
def run_bytewax_process(inp: Path, out: Path, log: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    spec = f"{FLOW_FILE}:sessions_flow({str(inp)!r}, {str(out)!r}, {GAP_MS}, {LATENESS_MS})"
    return timed_process([sys.executable, "-m", "bytewax.run", spec], child_env(), log)


def run_bytewax_in_process(inp: Path, out: Path) -> float:
    """One `run_main` of the flow in this process (the `--bytewax-steady` child calls it)."""
    from bytewax.testing import run_main

    from bench.sessions_bytewax import sessions_flow

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    run_main(sessions_flow(str(inp), str(out), GAP_MS, LATENESS_MS))
    return time.perf_counter() - started


def run_bytewax_steady(inp: Path, warm_inp: Path, out: Path, log: Path) -> float:
    """Bytewax's steady state: a process of its own runs the flow on `warm_inp`, then times it on `inp`.
    Not in the harness's process: there, next to a Spark JVM and the harness's own objects (the
    reference's sessions), the same run_main took 186 s instead of 101-103 s at 1M events, 100k keys."""
    with open(log, "wb") as f:
        proc = subprocess.run([sys.executable, "-m", "bench.sessions", "--bytewax-steady", str(inp), str(warm_inp),
                               str(out)], stdout=subprocess.PIPE, stderr=f, env=child_env(), cwd=REPO)
    if proc.returncode:
        raise RuntimeError(f"bench.sessions --bytewax-steady exited with {proc.returncode}:\n"
                           f"{log.read_text(errors='replace')[-3000:]}")
    return float(json.loads(proc.stdout)["seconds"])


def run_eventide_processes(inp: Path, home: Path, work: Path, close_windows: bool) -> dict:
    """`eventide ingest` then `eventide run [--close-windows]` over a fresh `home`, each timed spawn to exit."""
    shutil.rmtree(home, ignore_errors=True)
    env = child_env(EVENTIDE_HOME=str(home))
    ingest_s = timed_process([*eventide_cmd(), "ingest", STREAM, str(inp), "--lines", "--app", APP], env,
                             work / "eventide-ingest.log")
    run_s = timed_process([*eventide_cmd(), "run", "--app", APP, *(["--close-windows"] if close_windows else [])],
                          env, work / "eventide-run.log")
    return {"ingest_s": ingest_s, "run_s": run_s, "total_s": ingest_s + run_s}


def _eventide_in_process(landed: Path, home: Path, close_windows: bool) -> tuple[float, float]:
    """`run_all` over a fresh copy of `landed` on this process's Spark: (seconds, the app query's seconds)."""
    from bench.logs import timed_run_all

    fresh_home(landed, home)
    # What `run --close-windows` does: the setting in the environment (the assets read their settings there).
    with eventide_env(home, APP, EVENTIDE_CLOSE_WINDOWS="1" if close_windows else "0") as settings:
        run = timed_run_all(settings, summaries=False)
    app_s = sum(q["seconds"] for q in run["queries"] if not q["query"].startswith("bronze_"))
    return run["total_s"], app_s


def bench_sessions(results: dict, events: int = EVENTS, keys: int = KEYS, repeats: int = 1, steady: bool = True,
                   close_windows: bool = True, save: Path | None = None) -> dict:
    """Fill `results` (flat keys), write the nested form to `save` if given, return it. Raises
    AssertionError when an implementation's sessions or late events differ from the reference."""
    from importlib.metadata import version

    nested: dict = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "machine": f"{os.cpu_count()} cores", "commit": _commit(), "bytewax_version": version("bytewax"),
                    "gap_ms": GAP_MS, "allowed_lateness_ms": LATENESS_MS, "repeats": repeats,
                    "load_average_at_start": load_average(),
                    "close_windows": close_windows,
                    "closing": ("Eventide: by the key's watermark, and every open session at the end "
                                "(eventide run --close-windows)" if close_windows else
                                "Eventide: by the key's watermark only (plain eventide run)")
                    + "; Bytewax: every session at end of input; compared as bench/sessions.py's docstring says"}
    work = Path(tempfile.mkdtemp(prefix="eventide-bench-sessions-"))
    started = time.time()
    try:
        inp = work / "events.csv"
        nested["input"] = generate(inp, events, keys)
        nested["size"] = f"{events:,} events over {keys:,} keys"
        progress(f"generated {nested['input']}")
        t = time.perf_counter()
        closed, still_open, late = reference(inp)
        nested["reference"] = {"seconds_in_process": round(time.perf_counter() - t, 2), "closed_sessions": len(closed),
                               "open_sessions_at_end": len(still_open), "late_events": sum(late.values()),
                               "events_in_closed_sessions": sum(s[3] for s in closed)}
        progress(f"reference: {nested['reference']}")
        everything = sorted(closed + still_open)
        eventide_want = everything if close_windows else closed
        eventide_what = "the reference's closed and open" if close_windows else "the reference's closed"

        cold: dict[str, list] = {"bytewax": [], "eventide_ingest": [], "eventide_run": [], "eventide_total": []}
        loads = []
        for r in range(repeats):
            loads.append(load_average())
            s = run_bytewax_process(inp, work / "bytewax-out", work / "bytewax.log")
            sessions, blate = read_bytewax(work / "bytewax-out")
            check(f"bytewax (cold #{r + 1})", sessions, blate, everything, late, "the reference's closed and open")
            cold["bytewax"].append(s)
            progress(f"bytewax cold #{r + 1}: {s:.1f} s ({events / s:,.0f} events/s), {len(sessions):,} sessions, agrees")
            e = run_eventide_processes(inp, work / "eventide-home", work, close_windows)
            sessions, elate, reasons = read_eventide(work / "eventide-home")
            check(f"eventide (cold #{r + 1})", sessions, elate, eventide_want, late, eventide_what)
            nested["eventide_close_reasons"] = dict(reasons)
            for k in ("ingest", "run", "total"):
                cold[f"eventide_{k}"].append(e[f"{k}_s"])
            progress(f"eventide cold #{r + 1}: ingest {e['ingest_s']:.1f} s + run {e['run_s']:.1f} s "
                     f"({events / e['total_s']:,.0f} events/s), {len(sessions):,} sessions, agrees")
        nested["cold"] = {impl: {**spread(ts), "events_per_s": round(events / statistics.median(ts))}
                          for impl, ts in cold.items()}
        nested["cold"]["load_averages_before_each_repeat"] = loads
        b, e = statistics.median(cold["bytewax"]), statistics.median(cold["eventide_total"])
        nested["cold"]["eventide_vs_bytewax_ratio"] = round(b / e, 4)
        nested["cold"]["eventide_run_only_vs_bytewax_ratio"] = round(b / statistics.median(cold["eventide_run"]), 4)

        if steady:
            nested["steady"] = _steady(work, inp, events, repeats, everything, late, close_windows, eventide_want,
                                       eventide_what)
        nested["agree"] = True
    finally:
        shutil.rmtree(work, ignore_errors=True)
    nested["wall_s"] = round(time.time() - started, 1)
    nested["load_average_at_end"] = load_average()
    nested["note"] = ("cold: whole processes, spawn to exit, on the same generated file (Eventide: ingest + run, "
                      "each its own process); steady: after a warm-up, Eventide in this process on a warm Spark "
                      "session, Bytewax in a process of its own (run_main). Ratios are "
                      "rate ratios: > 1 means Eventide is faster. The machine is shared: see the load averages.")
    flat = {"size": nested["size"], "agree": True, "load_average_at_start": nested["load_average_at_start"],
            "load_average_at_end": nested["load_average_at_end"], **{f"input_{k}": v for k, v in nested["input"].items()},
            **{f"reference_{k}": v for k, v in nested["reference"].items()}}
    for mode in ("cold", "steady"):
        for impl, v in nested.get(mode, {}).items():
            if isinstance(v, dict):
                flat.update({f"{mode}_{impl}_{k}": x for k, x in v.items()})
            else:
                flat[f"{mode}_{impl}"] = v
    results.update(flat)
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        save.write_text(json.dumps(nested, indent=2, default=str) + "\n")
        progress(f"wrote {save}")
    return nested


def _steady(work: Path, inp: Path, events: int, repeats: int, everything: list, late: Counter, close_windows: bool,
            eventide_want: list, eventide_what: str) -> dict:
    from transforms import spark as spark_module
    from transforms.settings import Settings

    # The landed homes are made by `eventide ingest` (bulk path), once: each run copies the landing folder.
    landed, warm_landed = work / "landed", work / "warm-landed"
    warm_inp = work / "warm.csv"
    generate(warm_inp, WARMUP_EVENTS, 100, seed=SEED + 1)
    for src, home in ((inp, landed), (warm_inp, warm_landed)):
        timed_process([*eventide_cmd(), "ingest", STREAM, str(src), "--lines", "--app", APP],
                      child_env(EVENTIDE_HOME=str(home)), work / "ingest-steady.log")
    owned = spark_module._session is None
    started = time.perf_counter()
    spark_module.get_spark(Settings(home=work / "spark-home"))
    out: dict = {"spark_start_s": round(time.perf_counter() - started, 1), "load_average_before": load_average()}
    try:
        warm_s, _ = _eventide_in_process(warm_landed, work / "warm-home", close_windows)
        progress(f"steady: warm-ups done (Eventide {warm_s:.1f} s)")
        times: dict[str, list] = {"bytewax": [], "eventide_run": [], "eventide_app_query": []}
        for r in range(repeats):
            s = run_bytewax_steady(inp, warm_inp, work / "bytewax-steady", work / "bytewax-steady.log")
            sessions, blate = read_bytewax(work / "bytewax-steady")
            check(f"bytewax (steady #{r + 1})", sessions, blate, everything, late, "the reference's closed and open")
            times["bytewax"].append(s)
            home = work / "eventide-steady-home"
            total_s, app_s = _eventide_in_process(landed, home, close_windows)
            sessions, elate, _ = read_eventide(home)
            check(f"eventide (steady #{r + 1})", sessions, elate, eventide_want, late, eventide_what)
            shutil.rmtree(home, ignore_errors=True)
            times["eventide_run"].append(total_s)
            times["eventide_app_query"].append(app_s)
            progress(f"steady #{r + 1}: bytewax {s:.1f} s, eventide run {total_s:.1f} s (app query {app_s:.1f} s), agree")
        out.update({impl: {**spread(ts), "events_per_s": round(events / statistics.median(ts))}
                    for impl, ts in times.items()})
        out["eventide_vs_bytewax_ratio"] = round(statistics.median(times["bytewax"])
                                                 / statistics.median(times["eventide_run"]), 4)
        out["load_average_after"] = load_average()
    finally:
        if owned:
            spark_module.stop_spark()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=EVENTS)
    p.add_argument("--keys", type=int, default=KEYS)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--steady", action="store_true", help="also steady state, in this process")
    p.add_argument("--watermark-only", action="store_true",
                   help="plain `eventide run` (no --close-windows): compare Eventide with the reference's closed sessions")
    p.add_argument("--quick", action="store_true", help="100,000 events over 10,000 keys; no results file")
    p.add_argument("--out", type=Path, help="the results file (default bench/results/sessions-<date>[-<events>].json)")
    p.add_argument("--bytewax-steady", nargs=3, metavar=("INPUT", "WARM_INPUT", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.bytewax_steady:  # Bytewax's steady state, as a process of its own: warm-up, then the timed run
        inp, warm_inp, out = (Path(a) for a in args.bytewax_steady)
        run_bytewax_in_process(warm_inp, out)
        print(json.dumps({"seconds": run_bytewax_in_process(inp, out)}))
        return 0
    size = QUICK if args.quick else {"events": args.events, "keys": args.keys}
    save = None
    if not args.quick:
        suffix = "" if size["events"] == EVENTS else f"-{size['events']}"
        save = args.out or RESULTS / f"sessions-{dt.date.today().isoformat()}{suffix}.json"
    nested = bench_sessions({}, **size, repeats=args.repeats, steady=args.steady,
                            close_windows=not args.watermark_only, save=save)
    print(json.dumps(nested, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
