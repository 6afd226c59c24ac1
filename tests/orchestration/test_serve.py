"""`eventide serve` runs the apps' queries continuously: results over TCP and in Delta without any
`eventide run`. Real processes, real sockets, real Spark."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from examples.market import MARKET_STATE_TABLE as STATE_TABLE
from examples.market import ORDER_REJECTIONS_TABLE
from examples.market_decoder import Order, encode_order, parse_order_result
from tests.services import TEST_SPEED_SETTINGS, Service, clean_env
from tests.tcp import Receiver
from transforms import lake
from transforms.ingestion.framing import DEFAULT_FRAMING
from transforms.ports import free_port
from transforms.settings import Settings
from transforms.spark import JIT_HOT_ONLY

EVENTIDE = str(Path(sys.executable).parent / "eventide")
DATA = Path(__file__).resolve().parents[2] / "data" / "wallaroo"
NBBO = DATA / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"
FIFTEEN = "GOOG GPS INSM IVR MDRX MYGN NFX NI NYCB PPHM SIAL SLH TGT TMO TTPH".split()
UNKNOWN = ["Z001", "Z002", "Z003", "Z004", "Z005"]
START_SECONDS = 240  # a cold JVM and every query's first batch, on a busy 2-core machine
ANSWER_SECONDS = 2.0  # issue 9's acceptance: orders in, their OrderResults out within 2 s
BURST_TRIES = 3


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = clean_env()
    return {**env, "EVENTIDE_HOME": str(home), **extra}


def _send(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the gateway closes its side once everything is landed


def _rows(home: Path, table: str) -> list[dict]:
    path = Settings(home=home).table_path(table)
    return lake.read(path).to_pylist() if lake.exists(path) else []


def _count(home: Path, table: str) -> int:
    return lake.count(Settings(home=home).table_path(table))  # 0 while the table does not exist


def _wait_for(what, timeout: float, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(poll)
    return what()


@pytest.mark.spark
@pytest.mark.serial  # a 2 s promise: measured alone, not next to another test's Spark
def test_serve_answers_orders_over_tcp_within_two_seconds_without_a_run(tmp_path):
    home, receiver = tmp_path / "home", Receiver()
    ports = {"market_data": free_port(), "orders": free_port()}
    env = _env(home, EVENTIDE_APPS="examples.market:app", EVENTIDE_SINK_ORDER_RESULTS=receiver.address,
               EVENTIDE_PORTS=",".join(f"{k}={v}" for k, v in ports.items()))
    # A promise to users is measured with their JVM settings, not the tests' cheaper ones.
    env = {k: v for k, v in env.items() if k not in TEST_SPEED_SETTINGS}
    service = Service(env, tmp_path, [EVENTIDE, "serve"])
    try:
        service.wait_for_line("all ", timeout=START_SECONDS)
        jvms = service.java_command_lines()  # C2 for hot code only, as for `run` (settings.jvm_c2_hot_only)
        assert jvms and all(all(flag in j for flag in JIT_HOT_ONLY) for j in jvms), jvms
        _send(ports["market_data"], NBBO.read_bytes())
        assert len(_wait_for(lambda: len(_rows(home, STATE_TABLE)) >= 350 and _rows(home, STATE_TABLE), 60)) == 350

        # The acceptance: the 20 OrderResults within 2 s of sending, on the idle primed service. A burst
        # slowed by the machine (another process, a GC pause) gets up to two more tries: one within 2 s
        # shows the service can. Each burst waits until the service is idle: the last burst in the lake
        # (the answers go out before the batch's Delta commits, about a second for the market app's
        # MERGE and append) and in bronze (its queries append every 10 s, 2-4 s of Delta work on the
        # same two cores; sending just after one starts the burst well before the next).
        sent: list[Order] = []
        took: list[float] = []
        for attempt in range(BURST_TRIES):
            _wait_for(lambda n=len(sent): _count(home, ORDER_REJECTIONS_TABLE) >= n and _count(home, "bronze_orders") >= n
                      and _count(home, "bronze_market_data") >= 350, 60)
            time.sleep(0.5)
            orders = [Order(1, 7, f"R{attempt}{i:04d}", sym, 100.0, 42.5, dt_now()) for i, sym in enumerate(FIFTEEN + UNKNOWN)]
            sent_at = time.time()
            _send(ports["orders"], b"".join(DEFAULT_FRAMING.encode(encode_order(o)) for o in orders))
            sent += orders
            frames = receiver.wait_for_frames(len(sent), timeout=30)
            assert len(frames) == len(sent), service.output
            results = [parse_order_result(f) for _, f in frames[-20:]]
            assert sorted(r.symbol.strip() for r in results) == sorted(FIFTEEN + UNKNOWN)
            assert sorted(r.order_id for r in results) == sorted(o.order_id for o in orders)
            took.append(max(t for t, _ in frames[-20:]) - sent_at)
            print(f"burst {attempt + 1}: 20 OrderResults {took[-1]:.2f} s after sending")  # -s shows it
            if took[-1] <= ANSWER_SECONDS:
                break
        assert min(took) <= ANSWER_SECONDS, f"the last OrderResult of each burst came {took} s after sending"
        rejected = _wait_for(lambda: len(_rows(home, ORDER_REJECTIONS_TABLE)) >= len(sent) and _rows(home, ORDER_REJECTIONS_TABLE), 30)
        assert sorted(r["order_id"] for r in rejected) == sorted(o.order_id for o in sent)
    finally:
        code = service.stop(signal.SIGTERM)
        receiver.close()
    assert code == 0, service.output
    out = "\n".join(service.output + list(_drain(service)))
    assert "stopping the queries" in out and "eventide serve stopped" in out


def dt_now():
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc)


def _drain(service) -> list[str]:
    out = []
    while not service.lines.empty():
        out.append(service.lines.get())
    return out
