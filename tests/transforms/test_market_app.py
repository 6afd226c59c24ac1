"""Market spread on real Spark, real Delta and a real TCP receiver.

Scenario: the 350 initial quotes (one segment), then one segment mixing orders for all 350 symbols,
orders for never-seen symbols, and quotes that flip symbols between orders of the same batch.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest

from examples.market import (
    MARKET_STATE_TABLE,
    ORDER_REJECTIONS_TABLE,
    ORDER_RESULTS_SINK,
    REASON_NEVER_SEEN,
    REASON_SPREAD,
    REASON_SPREAD_OF_MID,
    market_app,
    order_result,
    run_loop,
)
from examples.market_decoder import (
    MarketData,
    Order,
    OrderResult,
    encode_market_data,
    encode_order,
    encode_order_result,
    parse_order_result,
    timestamp_10us,
)
from examples.market_generate import read_symbols
from tests.tcp import Receiver
from transforms import lake
from transforms.engine import QUARANTINE_TABLE, plan_queries, run_application
from transforms.ingestion.framing import iter_file_messages
from transforms.ingestion.landing import Lander, read_landed

pytestmark = pytest.mark.spark

DATA = Path(__file__).resolve().parents[2] / "data" / "wallaroo" / "market_spread"
NBBO = DATA / "350-symbols_initial-nbbo-fixish.msg"
FIFTEEN = "GOOG GPS INSM IVR MDRX MYGN NFX NI NYCB PPHM SIAL SLH TGT TMO TTPH".split()
UNKNOWN = ["Z001", "Z002", "Z003"]
T0 = dt.datetime(2016, 9, 2, 16, 0, 0, tzinfo=dt.timezone.utc)


# -- a real TCP receiver ------------------------------------------------------------------------------
@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def closed_port_address() -> str:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


# -- the scenario ---------------------------------------------------------------------------------
def quote(sym: str, bid: float, offer: float) -> tuple[str, bytes]:
    return "market_data", encode_market_data(MarketData(sym, T0, bid, offer))


def order(oid: str, sym: str, side: int = 1) -> tuple[str, bytes]:
    return "orders", encode_order(Order(side, 1000 + len(oid), oid, sym, 100.0, 42.5, T0))


def second_segment() -> list[tuple[str, bytes]]:
    msgs = [order(f"A{i:05d}", sym, 1 + i % 2) for i, sym in enumerate(read_symbols())]  # every known symbol
    msgs += [order(f"U{i:05d}", sym) for i, sym in enumerate(UNKNOWN)]  # never seen
    msgs += [
        # AA accepts, then a wide quote, then a tight one: only F00002 is rejected, with the wide quote.
        order("F00001", "AA"), quote("AA", 9.50, 9.60), order("F00002", "AA"),
        quote("AA", 9.50, 9.51), order("F00003", "AA"),
        # TGT starts rejected; a tight quote in the middle of the batch lets the second order through.
        order("F00004", "TGT"), quote("TGT", 70.00, 70.01), order("F00005", "TGT"),
        # NEW1 is unknown until its first quote arrives between two orders.
        order("F00006", "NEW1"), quote("NEW1", 5.00, 5.01), order("F00007", "NEW1"),
        # Exactly five cents, twice: IEEE says 100.05 - 100.0 < 0.05 (accept), 10.05 - 10.0 >= 0.05 (reject).
        quote("AAPL", 100.00, 100.05), order("F00008", "AAPL"),
        quote("AAPL", 10.00, 10.05), order("F00009", "AAPL"),
    ]
    return msgs


def land_messages(settings, msgs) -> None:
    with Lander(settings) as lander:
        for stream, payload in msgs:
            lander.append(stream, payload, "test")


def land_scenario(settings) -> None:
    land_messages(settings, [("market_data", p) for p in iter_file_messages(NBBO)])
    land_messages(settings, second_segment())


def expected(settings):
    """The reference: Wallaroo's single loop over the same landed messages, in sequence order."""
    rows = read_landed(settings, settings.group_of("orders")).to_pylist()
    return run_loop((r["stream"], r["payload"]) for r in rows), {r["payload"]: r["seq"] for r in rows}


def market_state(settings) -> list[dict]:
    return sorted(lake.read(settings.table_path(MARKET_STATE_TABLE)).to_pylist(), key=lambda r: r["symbol"])


def rejections(settings) -> list[dict]:
    return sorted(lake.read(settings.table_path(ORDER_REJECTIONS_TABLE)).to_pylist(), key=lambda r: r["seq"])


def without(rows: list[dict], *cols: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in cols} for r in rows]


def table_result(row: dict) -> OrderResult:
    return OrderResult(row["side"], row["account"], row["order_id"], row["symbol"], row["qty"], row["price"],
                       row["last_bid"], row["last_offer"], timestamp_10us(row["decision_time"]))


def run(spark, settings, **tcp) -> None:
    run_application(spark, market_app, settings, tcp_addresses=tcp)


@contextmanager
def shuffle_partitions(spark, n: int):
    """Spark fixes a stateful query's shuffle partitions when its checkpoint is created."""
    key = "spark.sql.shuffle.partitions"
    old = spark.conf.get(key)
    spark.conf.set(key, str(n))
    try:
        yield
    finally:
        spark.conf.set(key, old)


def state_partitions(settings) -> int:
    (plan,) = plan_queries(market_app, settings)
    return len([p for p in (plan.checkpoint(settings) / "state" / "0").iterdir() if p.name.isdigit()])


# -- tests ----------------------------------------------------------------------------------------
def test_quotes_then_orders_reject_by_the_spread_rule_in_arrival_order(spark, settings, receiver):
    land_messages(settings, [("market_data", p) for p in iter_file_messages(NBBO)])
    run(spark, settings, **{ORDER_RESULTS_SINK: receiver.address})

    # (1) 350 symbols, exactly the fifteen in reject state.
    state = market_state(settings)
    assert len(state) == 350
    assert sorted(r["symbol"] for r in state if r["reject"]) == FIFTEEN
    assert {r["reason"] for r in state if r["reject"]} <= {REASON_SPREAD, REASON_SPREAD_OF_MID}
    assert all(r["reason"] is None for r in state if not r["reject"])
    assert sorted(r["seq"] for r in state) == list(range(1, 351))
    assert lake.count(settings.table_path(ORDER_REJECTIONS_TABLE)) == 0

    # (2) + (3) Orders for every symbol and for never-seen ones, with quotes flipping symbols in between.
    land_messages(settings, second_segment())
    run(spark, settings, **{ORDER_RESULTS_SINK: receiver.address})

    got = rejections(settings)
    (quotes, want), seq_of = expected(settings)
    first = {r["symbol"]: r for r in got if r["order_id"].startswith("A")}
    assert sorted(first) == FIFTEEN
    by_symbol = {r["symbol"]: r for r in state}
    for sym, r in first.items():
        assert (r["last_bid"], r["last_offer"]) == (by_symbol[sym]["bid"], by_symbol[sym]["offer"])
        assert r["reason"] == by_symbol[sym]["reason"]
    never = [r for r in got if r["order_id"].startswith("U")]
    assert [(r["symbol"], r["last_bid"], r["last_offer"], r["reason"]) for r in never] == [
        (s, 0.0, 0.0, REASON_NEVER_SEEN) for s in UNKNOWN]
    flips = {r["order_id"]: (r["last_bid"], r["last_offer"], r["reason"]) for r in got if r["order_id"].startswith("F")}
    assert flips == {
        "F00002": (9.50, 9.60, REASON_SPREAD),
        "F00004": (by_symbol["TGT"]["bid"], by_symbol["TGT"]["offer"], by_symbol["TGT"]["reason"]),  # the initial quote
        "F00006": (0.0, 0.0, REASON_NEVER_SEEN),
        "F00009": (10.00, 10.05, REASON_SPREAD),
    }
    # Every field against the single-loop reference (decision time aside), and the metadata.
    assert len(got) == len(want) == 15 + 3 + 4
    fields = ["side", "account", "order_id", "symbol", "qty", "price", "transact_time", "last_bid", "last_offer", "reason"]
    assert [{f: r[f] for f in fields} for r in got] == [{f: getattr(w, f) for f in fields} for w in want]
    landed = {r["seq"]: r for r in read_landed(settings, settings.group_of("orders")).to_pylist()}
    assert all(landed[r["seq"]]["stream"] == "orders" and landed[r["seq"]]["receive_time"] == r["receive_time"] for r in got)
    assert all(r["decision_time"] >= r["receive_time"] for r in got)

    # The state after the flips: AA, TGT, AAPL updated, NEW1 added, never-seen symbols absent.
    state = {r["symbol"]: r for r in market_state(settings)}
    assert len(state) == 351 and not set(UNKNOWN) & set(state)
    assert {s: (r["bid"], r["offer"], r["reject"]) for s, r in state.items() if s in ("AA", "TGT", "NEW1", "AAPL")} == {
        "AA": (9.50, 9.51, False), "TGT": (70.00, 70.01, False), "NEW1": (5.00, 5.01, False), "AAPL": (10.00, 10.05, True)}
    assert {s: (q.bid, q.offer, q.reject, q.reason) for s, q in quotes.items()} == {
        s: (r["bid"], r["offer"], r["reject"], r["reason"]) for s, r in state.items()}
    assert state["AAPL"]["seq"] == seq_of[quote("AAPL", 10.00, 10.05)[1]]

    # The TCP sink: Wallaroo's framed OrderResult, byte for byte, in decision order, one connection per run.
    sent = receiver.payloads()
    assert receiver.connections == 1  # the first run had no rejections: no connection at all
    assert all(len(p) == 55 for p in sent)
    results = [parse_order_result(p) for p in sent]
    assert [dataclasses.replace(r, timestamp=0) for r in results] == [
        dataclasses.replace(order_result(w), timestamp=0) for w in want]
    assert sent == [encode_order_result(table_result(r)) for r in got]  # and the table's decision time
    assert not lake.exists(settings.table_path(QUARANTINE_TABLE)) or lake.count(settings.table_path(QUARANTINE_TABLE)) == 0


def test_same_results_with_1_and_4_partitions_and_after_a_crash(spark, settings, receiver):
    land_scenario(settings)
    one = dataclasses.replace(settings, home=settings.home.parent / "one")
    four = dataclasses.replace(settings, home=settings.home.parent / "four", max_files_per_trigger=1)
    for s in (one, four):
        shutil.copytree(settings.landing, s.landing)  # the very same landed messages (seq, receive time)

    # One shuffle partition, the whole log in one micro-batch.
    with shuffle_partitions(spark, 1):
        run(spark, one, **{ORDER_RESULTS_SINK: receiver.address})
    assert state_partitions(one) == 1
    sent_one = receiver.payloads()

    # Four partitions, one segment per micro-batch. The TCP receiver is down: batch 1 fails on the TCP
    # sink, which is written first (answers never wait for the lake), so Spark never commits it and no
    # table has it. (A kill between two tables' commits: tests/transforms/test_exactly_once.py.)
    with shuffle_partitions(spark, 4):
        with pytest.raises(Exception, match=ORDER_RESULTS_SINK):
            run(spark, four, **{ORDER_RESULTS_SINK: closed_port_address()})
    assert state_partitions(four) == 4
    (plan,) = plan_queries(market_app, four)
    assert sorted(p.name for p in (plan.checkpoint(four) / "commits").iterdir() if p.name.isdigit()) == ["0"]
    for table in (ORDER_REJECTIONS_TABLE, MARKET_STATE_TABLE):
        assert lake.committed_batch(four.table_path(table), plan.app_id(table)) in (None, 0), table

    # Rerun (the checkpoint still says 4 partitions, whatever the session says): batch 1 is replayed,
    # and every table and the TCP sink get it once.
    late = Receiver()
    try:
        run(spark, four, **{ORDER_RESULTS_SINK: late.address})
        sent_four = late.payloads()
    finally:
        late.close()
    assert state_partitions(four) == 4

    (quotes, want), _ = expected(settings)
    for s in (one, four):
        got = rejections(s)
        assert len(got) == len(want) == len({r["order_id"] for r in got}) == 22
        assert [r["order_id"] for r in got] == [w.order_id for w in want]
    assert without(rejections(one), "decision_time") == without(rejections(four), "decision_time")
    assert market_state(one) == market_state(four)
    assert len(market_state(one)) == len(quotes) == 351
    strip = [p[:-8] for p in sent_one]  # the timestamp is the last 8 bytes
    assert strip == [p[:-8] for p in sent_four] == [encode_order_result(order_result(w))[:-8] for w in want]
