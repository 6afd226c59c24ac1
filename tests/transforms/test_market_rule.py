"""Market spread without Spark: the rule in IEEE doubles, the OrderResult format, the generator."""

from __future__ import annotations

import datetime as dt
import math
import random
import struct
from decimal import Decimal
from pathlib import Path

import pytest

from examples.market import (
    REASON_MID_ZERO,
    REASON_NEVER_SEEN,
    REASON_NON_FINITE,
    REASON_SPREAD,
    REASON_SPREAD_OF_MID,
    OrderRejection,
    encode_rejection,
    run_loop,
    spread_decision,
    spread_reject_array,
)
from examples.market_decoder import (
    ORDER_RESULT_SIZE,
    MarketData,
    Order,
    OrderResult,
    encode_market_data,
    encode_order,
    encode_order_result,
    format_fix_time,
    parse_fix_time,
    parse_market_data,
    parse_order,
    parse_order_result,
    timestamp_10us,
)
from examples.market_generate import (
    DEFAULT_SYMBOLS_FILE,
    generate,
    mixed_messages,
    read_symbols,
    synthetic_symbols,
    unknown_symbols,
)
from orchestration.cli import main as eventide
from transforms.ingestion.framing import iter_file_messages

DATA = Path(__file__).resolve().parents[2] / "data" / "wallaroo" / "market_spread"
NBBO = DATA / "350-symbols_initial-nbbo-fixish.msg"
EXPECTED_REJECTED = "GOOG GPS INSM IVR MDRX MYGN NFX NI NYCB PPHM SIAL SLH TGT TMO TTPH".split()
T0 = dt.datetime(2016, 9, 2, 15, 47, 52, 123000, tzinfo=dt.timezone.utc)


def test_initial_quotes_reject_exactly_the_fifteen_in_both_implementations():
    quotes = [parse_market_data(p) for p in iter_file_messages(NBBO)]
    assert len(quotes) == 350 and len({q.symbol for q in quotes}) == 350
    rejected = sorted(q.symbol for q in quotes if spread_decision(q.bid, q.offer)[0])
    assert rejected == EXPECTED_REJECTED
    flags = spread_reject_array([q.bid for q in quotes], [q.offer for q in quotes])
    assert sorted(q.symbol for q, f in zip(quotes, flags) if f) == EXPECTED_REJECTED
    # The bundled instrument lists say the same.
    csv = (DATA / "rejected_instruments.csv").read_text().splitlines()[1:]
    assert sorted(line.rsplit(",", 1)[1] for line in csv) == EXPECTED_REJECTED


@pytest.mark.parametrize(
    ("bid", "offer", "reject", "reason"),
    [
        (10.00, 10.05, True, REASON_SPREAD),  # 10.05 - 10.0 = 0.05000000000000071
        (100.00, 100.05, False, None),  # 0.04999999999999716: decimal (and offer >= bid + 0.05) would reject
        (1.10, 1.15, False, None),  # 0.04999999999999982, 4.4 % of the mid
        (0.10, 0.15, True, REASON_SPREAD_OF_MID),  # 0.04999999999999999, but 40 % of the mid
        (19.6505, 19.7136, True, REASON_SPREAD),
        (50.0, 50.01, False, None),
        (0.0, 0.0, True, REASON_MID_ZERO),  # Wallaroo divided by zero here
        (-0.01, 0.01, True, REASON_MID_ZERO),
        (math.nan, 10.0, True, REASON_NON_FINITE),
        (10.0, math.inf, True, REASON_NON_FINITE),
        (-math.inf, 10.0, True, REASON_NON_FINITE),
    ],
)
def test_rule_in_ieee_doubles(bid, offer, reject, reason):
    assert spread_decision(bid, offer) == (reject, reason)
    assert bool(spread_reject_array([bid], [offer])[0]) is reject


def test_five_cent_spreads_follow_ieee_not_decimal():
    """Generated quotes have many spreads of exactly 5 cents; both sides of 0.05 must occur and match IEEE."""
    quotes = [parse_market_data(p) for p in (m for s, m in mixed_messages(5000, read_symbols(), seed=3)
                                               if s == "market_data")]
    five = [q for q in quotes if Decimal(repr(q.offer)) - Decimal(repr(q.bid)) == Decimal("0.05")]
    assert len(five) > 100
    ieee = [q.offer - q.bid >= 0.05 for q in five]
    assert any(ieee) and not all(ieee)
    for q in five:
        spread = q.offer - q.bid
        expected = spread >= 0.05 or spread / ((q.bid + q.offer) / 2) >= 0.05
        assert spread_decision(q.bid, q.offer)[0] is expected
    flags = spread_reject_array([q.bid for q in quotes], [q.offer for q in quotes])
    assert [bool(f) for f in flags] == [spread_decision(q.bid, q.offer)[0] for q in quotes]


def _strptime(raw: bytes) -> dt.datetime:
    return dt.datetime.strptime(raw.decode(), "%Y%m%d-%H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)


def test_transact_time_fast_path_agrees_with_strptime():
    rng = random.Random(4)
    times = [T0 + dt.timedelta(milliseconds=rng.randrange(10**12)) for _ in range(2000)]
    raws = [format_fix_time(t) for t in times] + [p[5:26] for p in iter_file_messages(NBBO)]
    assert [parse_fix_time(r) for r in raws] == [_strptime(r) for r in raws]
    assert parse_fix_time(b"20160902-15:47:52.5") == _strptime(b"20160902-15:47:52.5")  # irregular: strptime decides
    for bad in (b"20160230-15:47:52.000", b"20161302-15:47:52.000", b"20160902-24:00:00.000", b"20160902 15:47:52.000",
                b"2016090X-15:47:52.000", b"20160902-15:47:60.000", b""):
        with pytest.raises(ValueError, match=r"expected a transact time YYYYMMDD-HH:MM:SS\.mmm \(21 ASCII bytes\), got"):
            parse_fix_time(bad)


def test_order_result_is_wallaroos_55_byte_format():
    r = OrderResult(2, 4_000_000_000, "AB12CD", "GE", 300.0, 31.5, 31.49, 31.56, 147_283_067_212_345)
    payload = encode_order_result(r)
    assert len(payload) == ORDER_RESULT_SIZE == 55
    assert payload == struct.pack(">BI6s4sddddQ", 2, 4_000_000_000, b"AB12CD", b"  GE", 300.0, 31.5, 31.49, 31.56,
                                  147_283_067_212_345)
    assert parse_order_result(payload) == r
    assert timestamp_10us(dt.datetime(1970, 1, 1, 0, 0, 1, 20, tzinfo=dt.timezone.utc)) == 100_002
    rej = OrderRejection(1, 7, "X00001", "TGT", 100.0, 70.0, T0, 69.9, 70.1, REASON_SPREAD, T0)
    assert parse_order_result(encode_rejection(rej)) == OrderResult(1, 7, "X00001", "TGT", 100.0, 70.0, 69.9, 70.1,
                                                                    timestamp_10us(T0))


def test_loop_decides_in_arrival_order_with_shared_state():
    def quote(sym, bid, offer):
        return "market_data", encode_market_data(MarketData(sym, T0, bid, offer))

    def order(oid, sym):
        return "orders", encode_order(Order(1, 9, oid, sym, 100.0, 10.0, T0))

    msgs = [order("o1", "AA"), quote("AA", 10.0, 10.01), order("o2", "AA"), quote("AA", 10.0, 10.5),
            order("o3", "AA"), quote("AA", 10.0, 10.02), order("o4", "AA"), order("o5", "ZZ")]
    quotes, rejections = run_loop(msgs, now=T0)
    assert [(r.order_id.strip(), r.last_bid, r.last_offer, r.reason) for r in rejections] == [
        ("o1", 0.0, 0.0, REASON_NEVER_SEEN),
        ("o3", 10.0, 10.5, REASON_SPREAD),
        ("o5", 0.0, 0.0, REASON_NEVER_SEEN),
    ]
    assert set(quotes) == {"AA"} and not quotes["AA"].reject and quotes["AA"].offer == 10.02


def test_generate_writes_framed_files_deterministically(tmp_path):
    symbols = read_symbols()
    assert DEFAULT_SYMBOLS_FILE.is_file() and len(symbols) == 350
    unknown = set(unknown_symbols(symbols))
    assert not unknown & set(symbols)

    a, b, c = tmp_path / "a.msg", tmp_path / "b.msg", tmp_path / "c.msg"
    assert generate("orders", a, count=2000, seed=7, unknown_share=0.25) == 2000
    assert generate("orders", b, count=2000, seed=7, unknown_share=0.25) == 2000
    assert a.read_bytes() == b.read_bytes()
    orders = [parse_order(p) for p in iter_file_messages(a)]
    assert len(orders) == 2000 and len({o.order_id for o in orders}) == 2000
    share = sum(o.symbol in unknown for o in orders) / len(orders)
    assert 0.2 < share < 0.3
    assert {o.symbol for o in orders} - unknown <= set(symbols)

    own = tmp_path / "symbols.txt"
    own.write_text("AAA\nBBB\n\n")
    assert eventide(["generate", "market", "--out", str(c), "--symbols", str(own), "--count", "50", "--seed", "2"]) == 0
    quotes = [parse_market_data(p) for p in iter_file_messages(c)]
    assert len(quotes) == 50 and {q.symbol for q in quotes} == {"AAA", "BBB"}
    assert all(0 < q.bid < q.offer for q in quotes)
    with pytest.raises(ValueError, match="kind"):
        generate("trades", c)
    own.write_text("TOOLONG\n")
    with pytest.raises(ValueError, match="1-4 ASCII"):
        generate("market", c, symbols_file=own)
    assert len(set(synthetic_symbols(2000, exclude=symbols))) == 2000
