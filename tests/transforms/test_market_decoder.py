"""The market decoders: the domain checked where data enters, the column forms equal to the one-payload
forms (reasons included), and agreement with the blocking checks on the market tables: a message the
decoders accept cannot make a check fail on its own."""

from __future__ import annotations

import datetime as dt
import math
import struct
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets.gx import validate
from examples.market import (
    PRICES_VALID,
    SymbolState,
    _bad_prices,
    apply_order,
    apply_quote,
    reject_matches_rule,
)
from examples.market_decoder import (
    MarketData,
    Order,
    decode_market_data,
    decode_market_data_columns,
    decode_order,
    decode_order_columns,
    encode_market_data,
    encode_order,
    format_fix_time,
)
from transforms.api import Reject

T0 = dt.datetime(2016, 9, 2, 15, 47, 52, 123000, tzinfo=dt.timezone.utc)
MAX = sys.float_info.max
EDGE_FLOATS = [0.0, -0.0, 5e-324, -5e-324, 1.0, -1.0, MAX, -MAX, 1e308, -1e308, math.inf, -math.inf, math.nan]
floats = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(), st.floats(0, 1000))
symbols = st.one_of(st.sampled_from([b"  AA", b"GOOG", b"   X", b"A B ", b"    ", b"AA\x00\x00", b"\xffAAA", b"\tAAA"]),
                    st.binary(min_size=4, max_size=4))

# Digits in every place, dates and times in or just out of range (Arrow's strptime rolls 02-30 over to March).
digit_times = st.builds(lambda y, mo, d, h, mi, s, ms: f"{y:04d}{mo:02d}{d:02d}-{h:02d}:{mi:02d}:{s:02d}.{ms:03d}".encode(),
                        st.sampled_from([1970, 2015, 2016, 9999]), st.integers(1, 12), st.one_of(st.integers(1, 31), st.integers(28, 31)),
                        st.integers(0, 23), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
odd_times = st.sampled_from([b"20160902-24:00:00.000", b"20160902-15:60:00.000", b"20160902-15:47:60.000",
                             b"20161302-15:47:52.000", b"20160002-15:47:52.000", b"20160900-15:47:52.000"])
times = st.one_of(st.just(format_fix_time(T0)), digit_times, odd_times, st.binary(min_size=21, max_size=21),
                  st.sampled_from([b"20160902-15:47:52.5  ", b"20160902-15:47:52.00\x00"]))
good_quotes = st.builds(lambda sym, time, bid, offer: struct.pack(">B4s21sdd", 2, sym, time, bid, offer),
                        st.sampled_from([b"  AA", b"  BB", b"GOOG", b"   X"]),
                        st.one_of(st.just(format_fix_time(T0)), digit_times), floats, floats)
any_quotes = st.one_of(good_quotes, st.builds(lambda t, sym, time, bid, offer: struct.pack(">B4s21sdd", t, sym, time, bid, offer),
                                              st.sampled_from([2, 2, 2, 1, 255]), symbols, times, floats, floats),
                       st.binary(max_size=50))
good_orders = st.builds(lambda side, oid, qty, price: struct.pack(">BBI6s4sdd21s", 1, side, 7, oid, b"  AA", qty, price,
                                                                  format_fix_time(T0)),
                        st.sampled_from([1, 2]), st.sampled_from([b"AB12  ", b"000001"]), floats, floats)
any_orders = st.one_of(good_orders, st.builds(
    lambda t, side, oid, sym, qty, price, time: struct.pack(">BBI6s4sdd21s", t, side, 7, oid, sym, qty, price, time),
    st.sampled_from([1, 1, 1, 2]), st.sampled_from([1, 2, 0, 3]), st.one_of(st.just(b"AB12  "), st.binary(min_size=6, max_size=6)),
    symbols, floats, floats, times), st.binary(max_size=60))


def _same_in_both_forms(decode, column_form, payloads: list[bytes]) -> list:
    """Each payload's one-payload result; asserts the column form gives the same values or the same reason."""
    table = column_form(pa.array(payloads, pa.binary()))
    results = [decode(p) for p in payloads]
    for payload, row, out in zip(payloads, table.to_pylist(), results):
        error = row.pop("_error")
        if isinstance(out, Reject):
            assert error == out.reason and set(row.values()) == {None}, payload
        else:
            assert error is None, (payload, error)
            assert row == out.__dict__, payload
    return results


def _market_state(quotes: list[MarketData]) -> pd.DataFrame:
    """The `market_state` rows these quotes leave (upserted by symbol)."""
    states: dict[str, SymbolState] = {}
    rows = {}
    for q in quotes:
        rows[q.symbol] = apply_quote(q, states.setdefault(q.symbol, SymbolState())).__dict__
    return pd.DataFrame(list(rows.values()), columns=["symbol", "bid", "offer", "reject", "reason", "transact_time"])


def _passes_market_state_checks(df: pd.DataFrame) -> bool:
    return validate(df, "prices", list(PRICES_VALID.expectations)).passed and reject_matches_rule.fn(df)[0]


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.lists(good_quotes, max_size=20), st.lists(any_quotes, max_size=20)))
def test_market_data_column_form_equals_one_payload_form_and_what_it_accepts_passes_the_checks(payloads):
    results = _same_in_both_forms(decode_market_data, decode_market_data_columns, payloads)
    accepted = [q for q in results if not isinstance(q, Reject)]
    assert _passes_market_state_checks(_market_state(accepted))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(good_quotes, good_orders), max_size=20), st.one_of(st.lists(good_orders, max_size=20),
                                                                             st.lists(any_orders, max_size=20)))
def test_order_column_form_equals_one_payload_form_and_its_rejections_have_valid_prices(quotes, payloads):
    results = _same_in_both_forms(decode_order, decode_order_columns, payloads)
    accepted = [o for o in results if not isinstance(o, Reject)]
    state = SymbolState()  # AA's state after any accepted quotes (or never seen)
    for q in (decode_market_data(p) for p in quotes):
        if isinstance(q, MarketData) and q.symbol == "AA":
            apply_quote(q, state)
    rejections = pd.DataFrame([r.__dict__ for r in (apply_order(o, state, T0) for o in accepted) if r is not None],
                              columns=["price", "last_bid", "last_offer", "reason"])
    # order_rejections_accounted's conditions on each row: valid prices, a reason.
    assert not _bad_prices(rejections, "price", "last_bid", "last_offer").any()
    assert rejections["reason"].notna().all()


@pytest.mark.parametrize("x", EDGE_FLOATS, ids=repr)
def test_the_decoder_refuses_a_price_exactly_when_the_check_would_fail(x):
    """Both ways, at the edges: the decoder's rule is the check's condition."""
    decoded = decode_market_data(encode_market_data(MarketData("AA", T0, x, x)))
    check_passes = validate(pd.DataFrame({"bid": [x], "offer": [x]}), "edge", list(PRICES_VALID.expectations)).passed
    assert (not isinstance(decoded, Reject)) is check_passes
    order = decode_order(encode_order(Order(1, 7, "AB12", "AA", 100.0, x, T0)))
    rejection = pd.DataFrame({"price": [x], "last_bid": [0.0], "last_offer": [0.0]})
    assert (not isinstance(order, Reject)) is (not _bad_prices(rejection, "price", "last_bid", "last_offer").any())


def test_the_absurd_quote_of_the_report_is_refused_with_a_price_reason():
    payload = encode_market_data(MarketData("AA", T0, -1e308, 1e308))
    assert decode_market_data(payload) == Reject("market data: expected a finite bid >= 0, got -1e+308")
    assert _same_in_both_forms(decode_market_data, decode_market_data_columns, [payload]) == [decode_market_data(payload)]


@pytest.mark.parametrize(("decode", "payload", "reason"), [
    (decode_market_data, b"", "market data: expected 42 bytes with type 0x02, got an empty payload (0 bytes)"),
    (decode_market_data, b"\xff" * 12, "market data: expected 42 bytes with type 0x02, got 12 bytes with type 0xff"),
    (decode_market_data, encode_order(Order(1, 7, "AB12", "AA", 100.0, 1.0, T0)),
     "market data: expected 42 bytes with type 0x02, got 53 bytes with type 0x01"),
    (decode_market_data, struct.pack(">B4s21sdd", 2, b"    ", format_fix_time(T0), 1.0, 1.0),
     "market data: expected a symbol of 1-4 printable ASCII characters, right-justified in 4 bytes, "
     "got only spaces (0x20202020)"),
    (decode_market_data, struct.pack(">B4s21sdd", 2, b"AA\x00\x00", format_fix_time(T0), 1.0, 1.0),
     "market data: expected a symbol of 1-4 printable ASCII characters, right-justified in 4 bytes, got bytes 0x41410000"),
    (decode_market_data, struct.pack(">B4s21sdd", 2, b"  AA", b"20160230-15:47:52.000", 1.0, 1.0),
     "market data: expected a transact time YYYYMMDD-HH:MM:SS.mmm (21 ASCII bytes), got '20160230-15:47:52.000'"),
    (decode_market_data, encode_market_data(MarketData("AA", T0, 1.0, math.inf)),
     "market data: expected a finite offer >= 0, got inf"),
    (decode_order, b"\x02", "order: expected 53 bytes with type 0x01, got 1 bytes with type 0x02"),
    (decode_order, struct.pack(">BBI6s4sdd21s", 1, 3, 7, b"AB12  ", b"  AA", 1.0, 1.0, format_fix_time(T0)),
     "order: expected side 0x01 (buy) or 0x02 (sell), got 0x03"),
    (decode_order, encode_order(Order(1, 7, "AB12", "AA", 0.0, 1.0, T0)), "order: expected a finite qty > 0, got 0.0"),
    (decode_order, encode_order(Order(2, 7, "AB12", "AA", 100.0, -0.01, T0)),
     "order: expected a finite price >= 0, got -0.01"),
])
def test_reasons_say_what_was_expected_and_what_came(decode, payload, reason):
    assert decode(payload) == Reject(reason)
    column_form = decode_market_data_columns if decode is decode_market_data else decode_order_columns
    _same_in_both_forms(decode, column_form, [payload])


def test_crossed_and_zero_quotes_are_input_for_the_rule_not_refused():
    for bid, offer in ((10.0, 9.0), (0.0, 0.0), (0.0, 10.0), (1.0, MAX)):
        q = decode_market_data(encode_market_data(MarketData("AA", T0, bid, offer)))
        assert isinstance(q, MarketData)
        assert _passes_market_state_checks(_market_state([q]))


def test_a_batch_with_refused_prices_keeps_the_good_rows_on_the_fast_path():
    good = [encode_market_data(MarketData(s, T0, 1.0, 1.01)) for s in ("AA", "BB")]
    bad = encode_market_data(MarketData("CC", T0, math.nan, 1.0))
    table = decode_market_data_columns(pa.array([good[0], bad, good[1]], pa.binary()))
    assert table.column("symbol").to_pylist() == ["AA", None, "BB"]
    assert table.column("_error").to_pylist() == [None, "market data: expected a finite bid >= 0, got nan", None]
    assert np.array_equal(table.column("bid").to_numpy(zero_copy_only=False)[[0, 2]], [1.0, 1.0])
