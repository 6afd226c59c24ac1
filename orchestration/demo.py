"""`eventide demo`: the bundled sample data through the whole system, then the results.

Starts the gateway on free loopback ports, sends the four log days with END_OF_DAY markers, the
Bill of Rights, the 350 initial market quotes and generated orders over TCP, runs everything
through Dagster, and prints the daily summary with its checks, word count, and market spread.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from orchestration.console import console
from orchestration.runner import run_all
from orchestration.show import show_table
from transforms import lake
from transforms.ingestion import open_log
from transforms.ingestion.gateway import GatewayThread
from transforms.ingestion.sender import send_files
from transforms.ports import LOOPBACK
from transforms.settings import Settings

DATA = Path(__file__).resolve().parents[1] / "data" / "wallaroo"


def _say(text: str = "") -> None:
    print(text, flush=True)


def run_demo(settings: Settings) -> int:
    started = time.time()
    home = settings.home / "demo"
    if home.exists():
        shutil.rmtree(home)  # the demo starts from nothing each time, so it always prints the same results
    settings = dataclasses.replace(settings, home=home, ports={s: 0 for s in settings.registry.streams})
    _say(f"Eventide demo (home: {home})")
    _say("1. gateway: listening on free loopback ports, sending the sample data over TCP")
    with GatewayThread(settings) as gw, tempfile.TemporaryDirectory() as tmp:
        ports = gw.bound_ports

        def send(stream: str, files: list[Path], end_of_day: bool = False) -> int:
            n = send_files(stream, files, LOOPBACK, ports[stream], end_of_day=end_of_day, marker=settings.marker)
            _say(f"   {stream:<12} {n:>5} messages  ({', '.join(f.name for f in files)})")
            return n

        from examples.market_generate import generate

        orders = Path(tmp) / "orders.msg"
        generate("orders", orders, count=1000, seed=7, unknown_share=0.02)
        sent = send("logs", [DATA / "log_windowing" / f"day_{d}.log" for d in range(1, 5)], end_of_day=True)
        sent += send("text", [DATA / "word_count" / "count_this.txt"])
        sent += send("market_data", [DATA / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"])
        sent += send("orders", [orders])
        gw.wait_for_messages(sent, timeout=60)
    _say(f"   landed {sent} messages in {open_log(settings).describe()}")

    _say("2. eventide run: every pipeline, then the daily summaries and their checks, through Dagster")
    with console() as say:
        summary = run_all(settings, progress=lambda line: say(f"   {line}"))
    if not summary.ok:
        for f in summary.failures:
            _say(f"   error: {f}")
        _say("The demo failed; the error above says which step. Fix it and run `make demo` again.")
        return 1

    _say("\n3. daily_return_code_summary")
    _say(show_table(settings, "daily_return_code_summary").rstrip())
    passed = sum(c[2] for c in summary.checks)
    _say(f"\n   checks: {passed} passed, {len(summary.checks) - passed} failed")
    by_check: dict[tuple[str, str], list[bool]] = {}
    for asset, check, ok, _partition in summary.checks:
        by_check.setdefault((asset, check), []).append(ok)
    for (asset, check), results in sorted(by_check.items()):
        runs = f" ({sum(results)}/{len(results)} partitions)" if len(results) > 1 else ""
        _say(f"   {'PASS' if all(results) else 'FAIL'} {asset}: {check}{runs}")

    _say("\n4. word count: the ten most frequent words")
    totals = lake.query("select word, count from t order by count desc, word limit 10", t=settings.table_path("word_totals"))
    for r in totals.to_pylist():
        _say(f"   {r['word']:<10} {r['count']}")

    _say("\n5. market spread")
    rejecting = lake.query("select symbol from t where reject order by symbol", t=settings.table_path("market_state"))
    symbols = [r["symbol"] for r in rejecting.to_pylist()]
    _say(f"   symbols in reject state ({len(symbols)}): {' '.join(symbols)}")
    _say(f"   order rejections: {lake.count(settings.table_path('order_rejections'))} of 1000 orders")

    q = lake.count(settings.table_path("quarantine"))
    _say(f"\n   quarantine: {q} message(s)")
    _say(f"\nDone in {time.time() - started:.0f} s. Explore the runs and lineage: EVENTIDE_HOME={home} make ui")
    failed = len(summary.checks) - passed
    return 0 if not failed else 1
