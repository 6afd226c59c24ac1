"""`kill -9` of `eventide serve` while senders send, three times, then a clean stop: every message the
gateway acknowledged is landed, every landed message is in every table exactly once, and no TCP
output is sent twice. Real processes, real sockets, real Spark, every bundled app at once.

What was landed is the truth the tables are checked against (a batch a sender could not finish may
be partly landed; it must then be processed like any other message)."""

from __future__ import annotations

import collections
import datetime as dt
import random
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from examples.market import MARKET_STATE_TABLE, ORDER_REJECTIONS_TABLE, run_loop
from examples.market_decoder import MarketData, Order, encode_market_data, encode_order, parse_order_result
from examples.words import split_words
from orchestration.status import compute_status, format_status
from tests.orchestration.test_serve import _env
from tests.services import Service
from tests.tcp import Receiver
from tests.transforms.test_logs_app import expected_summary, log_messages, summary_rows
from transforms import lake
from transforms.ingestion.framing import DEFAULT_FRAMING, LANDED_ACK
from transforms.ingestion.landing import list_segments, read_landed
from transforms.ports import free_port
from transforms.processes import local_processes
from transforms.settings import Settings

EVENTIDE = str(Path(sys.executable).parent / "eventide")
T0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)
SYMBOLS = [f"S{i:03d}" for i in range(30)]


class Sender(threading.Thread):
    """Sends `make(i)` messages to one port in batches of 40, each a connection: half-close, then wait
    for the gateway to close its side (the acknowledgement). A failed batch is recorded, not retried."""

    def __init__(self, port: int, make):
        super().__init__(daemon=True)
        self.port, self.make = port, make
        self.acked: list[bytes] = []
        self.failed_batches = 0
        self.stop = threading.Event()

    def run(self):
        i = 0
        while not self.stop.is_set():
            batch = [self.make(i + k) for k in range(40)]
            i += 40
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                    s.sendall(b"".join(DEFAULT_FRAMING.encode(m) for m in batch))
                    s.shutdown(socket.SHUT_WR)
                    reply = b""
                    while chunk := s.recv(16):
                        reply += chunk
                    if reply != LANDED_ACK:  # closed unconfirmed: the service died (or stopped) first
                        raise OSError("not confirmed")
                self.acked.extend(batch)
            except OSError:
                self.failed_batches += 1
                time.sleep(0.2)  # the service is down: try again shortly
            # At most ~400 messages a second a sender: the gateway accepts while serve's Spark starts (a
            # minute on a crowded machine), and an unbounded sender left a backlog no catch-up deadline fits.
            time.sleep(0.1)


def word_line(i: int) -> bytes:
    return f"alpha w{i % 13} beta{i % 5} line{i}".encode()


def quote(i: int) -> bytes:
    rnd = random.Random(i)
    when = T0 + dt.timedelta(milliseconds=i)  # every quote unique, so the landing can be matched to what was sent
    return encode_market_data(MarketData(rnd.choice(SYMBOLS), when, 10.0, rnd.choice([10.01, 10.02, 10.10, 10.60])))


def order(i: int) -> bytes:
    rnd = random.Random(-i)
    return encode_order(Order(1, 7, f"O{i:05d}", rnd.choice([*SYMBOLS, "ZZ01"]), 100.0, 42.5, T0))


def _table(home: Path, name: str) -> list[dict]:
    path = Settings(home=home).table_path(name)
    return lake.read(path).to_pylist() if lake.exists(path) else []


def _sender_processes(home: Path) -> list[str]:
    return [str(p.pid) for p in local_processes()
            if b"transforms.tcp_relay" in (args := p.cmdline()) and any(str(home).encode() in a for a in args)]


def _start(env, tmp_path) -> Service:
    service = Service(env, tmp_path, [EVENTIDE, "serve"])
    service.wait_for_line("all ", timeout=240)
    return service


@pytest.mark.spark
def test_kill_9_while_sending_then_restart_leaves_every_table_exact(tmp_path):
    home = tmp_path / "home"
    orders_out, words_out = Receiver(), Receiver()
    ports = {s: free_port() for s in ("logs", "market_data", "orders", "text")}
    env = _env(home, EVENTIDE_PORTS=",".join(f"{k}={v}" for k, v in ports.items()),
               EVENTIDE_SINK_ORDER_RESULTS=orders_out.address, EVENTIDE_SINK_WORD_COUNT_TCP=words_out.address)
    service = _start(env, tmp_path)
    # The log days go first, in one acknowledged connection, so their summaries can be checked exactly.
    with socket.create_connection(("127.0.0.1", ports["logs"])) as s:
        s.sendall(b"".join(DEFAULT_FRAMING.encode(m) for m in log_messages()))
        s.shutdown(socket.SHUT_WR)
        assert s.recv(1) == LANDED_ACK
    senders = [Sender(ports["text"], word_line), Sender(ports["market_data"], quote), Sender(ports["orders"], order)]
    for s in senders:
        s.start()
    rnd = random.Random(7)
    try:
        for _ in range(3):
            time.sleep(rnd.uniform(2.0, 6.0))
            service.proc.kill()  # kill -9
            service.proc.wait(30)
            service = _start(env, tmp_path)
        time.sleep(2.0)
    finally:
        for s in senders:
            s.stop.set()
        for s in senders:
            s.join(30)
    settings = Settings(home=home)

    def caught_up():  # every query has processed everything landed (eventide status, from files)
        status = compute_status(settings)
        return not any(log.open for log in status.logs) and all(q.lag_messages == 0 for q in status.queries)

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not caught_up():
        time.sleep(1)
    assert caught_up(), format_status(compute_status(settings), "table")
    summary = settings.table_path("daily_return_code_summary")  # the follow-up runs in serve made it
    while time.monotonic() < deadline and not (lake.exists(summary) and summary_rows([lake.read(summary)]) == expected_summary()):
        time.sleep(1)

    def archived():  # serve archives what every query committed, every 10 s
        return [p for log in settings.registry.logs for p in list_segments(settings, log)
                if settings.landing_archive in p.parents]

    while time.monotonic() < deadline and not archived():
        time.sleep(1)
    assert service.stop(signal.SIGTERM) == 0, service.output

    # The landing was archived as the queries committed it (the folder Spark lists stays small) and
    # the log is still whole: what follows reads live and archived segments alike.
    assert archived(), "serve archived no landing segment"
    landed = {log: read_landed(settings, log).to_pylist() for log in settings.registry.logs}
    by_stream = collections.defaultdict(list)
    for rows in landed.values():
        for r in rows:
            by_stream[r["stream"]].append(r)
    for rows in by_stream.values():
        rows.sort(key=lambda r: r["seq"])

    # Acknowledged => landed, once.
    for sender, stream in zip(senders, ("text", "market_data", "orders")):
        payloads = collections.Counter(r["payload"] for r in by_stream[stream])
        wrong = collections.Counter(payloads[p] for p in sender.acked if payloads[p] != 1)
        assert sender.acked and not wrong, (stream, len(sender.acked), wrong, sender.failed_batches)


    # Every bronze table: exactly the landed sequence numbers.
    for stream, rows in by_stream.items():
        bronze = _table(home, settings.registry.stream(stream).bronze_table)
        assert sorted(r["seq"] for r in bronze) == [r["seq"] for r in rows], stream

    # Words: running counts and totals as a plain loop over the landed lines computes them.
    words = [w for r in by_stream["text"] for w in split_words(r["payload"].decode())]
    totals = collections.Counter(words)
    assert {r["word"]: r["count"] for r in _table(home, "word_totals")} == dict(totals)
    updates = _table(home, "word_count_updates")
    assert len(updates) == len(words) and len({(r["seq"], r["part"]) for r in updates}) == len(words)
    sent = collections.Counter(words_out.whole_lines())
    assert max(sent.values()) == 1, [line for line, n in sent.items() if n > 1][:5]  # no TCP output twice

    # Market: state and rejections as the reference loop decides them over the landed messages, in order.
    market = sorted(by_stream["market_data"] + by_stream["orders"], key=lambda r: r["seq"])
    quotes, rejections = run_loop([(r["stream"], r["payload"]) for r in market], now=T0)
    assert {r["symbol"]: (r["bid"], r["offer"]) for r in _table(home, MARKET_STATE_TABLE)} == {
        s: (q.bid, q.offer) for s, q in quotes.items()}
    got = [r["order_id"] for r in _table(home, ORDER_REJECTIONS_TABLE)]
    assert sorted(got) == sorted(r.order_id for r in rejections) and len(set(got)) == len(got)
    results = [parse_order_result(f).order_id for f in orders_out.whole_frames()]
    assert len(results) == len(set(results)), "an OrderResult was sent twice"
    assert sorted(results) == sorted(got)  # and none missing
    # A kill of serve never cuts a TCP batch (each sink's sender process finishes it), so none is in
    # doubt, and every sender process has exited with its serve.
    assert not [q.tcp_in_doubt for q in compute_status(settings).queries if q.tcp_in_doubt]
    assert not _sender_processes(home), "a TCP sink's sender process outlived serve"

    # Logs: the exact daily summaries.
    assert summary_rows([lake.read(summary)]) == expected_summary()
    orders_out.close()
    words_out.close()
