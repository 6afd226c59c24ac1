"""Market spread (Wallaroo's market_spread example), written with the public API.

Two streams share one state per symbol: `market_data` quotes set the symbol's last bid and offer
and whether its spread is too wide; `orders` are checked against that state as of their arrival
(the gateway's global sequence orders both streams). An order for a symbol in reject state yields
one rejection carrying the symbol's last bid and offer.

The rule, in IEEE doubles and in exactly this order of operations (many real quotes sit at a
spread of exactly 5 cents, where `offer - bid` lands on either side of 0.05):

    spread = offer - bid;  mid = (bid + offer) / 2
    reject = spread >= 0.05 or spread / mid >= 0.05

A zero mid (Wallaroo divided by zero) or a non-finite price rejects, with the reason recorded (the
decoders already refuse non-finite and negative prices, into quarantine: the rule stays total anyway).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from examples.market_decoder import (
    ORDER_SCHEMA,
    PRICE_MAX,
    PRICE_MIN,
    MarketData,
    Order,
    OrderResult,
    decode_market_data,
    decode_order,
    encode_order_result,
    parse_market_data,
    parse_order,
    prices_ok,
    timestamp_10us,
)
from transforms import lake
from transforms.api import (
    Application,
    DeltaSink,
    Emit,
    TCPSink,
    check,
    encoder,
    expect,
    merge,
    source,
    state_computation,
)

SPREAD_LIMIT = 0.05  # both the absolute spread (dollars) and the spread relative to the mid

REASON_NEVER_SEEN = "never seen"
REASON_NON_FINITE = "non-finite price"
REASON_MID_ZERO = "mid is zero"
REASON_SPREAD = "spread >= 0.05"
REASON_SPREAD_OF_MID = "spread / mid >= 0.05"


# -- the rule (pure) --------------------------------------------------------------------------------
def spread_decision(bid: float, offer: float) -> tuple[bool, str | None]:
    """(reject, reason) for a quote; reason is None when the symbol accepts orders."""
    if not (math.isfinite(bid) and math.isfinite(offer)):
        return True, REASON_NON_FINITE
    spread = offer - bid
    if spread >= SPREAD_LIMIT:
        return True, REASON_SPREAD
    mid = (bid + offer) / 2
    if mid == 0:
        return True, REASON_MID_ZERO
    if spread / mid >= SPREAD_LIMIT:
        return True, REASON_SPREAD_OF_MID
    return False, None


def should_reject(bid: float, offer: float) -> bool:
    return spread_decision(bid, offer)[0]


def spread_reject_array(bid, offer) -> np.ndarray:
    """The rule over whole columns (numpy float64: the same IEEE operations in the same order)."""
    return spread_decisions(bid, offer)[0]


# -- state and outputs ------------------------------------------------------------------------------
class SymbolState:
    """One per symbol, shared by both streams. Never seen on market data: bid 0, offer 0, reject."""

    def __init__(self) -> None:
        self.bid = 0.0
        self.offer = 0.0
        self.reject = True
        self.reason: str | None = REASON_NEVER_SEEN


@dataclass
class SymbolQuote:
    """A symbol's state after a market-data message (a row of `market_state`)."""

    symbol: str
    bid: float
    offer: float
    reject: bool
    reason: str | None
    transact_time: dt.datetime


@dataclass
class OrderRejection:
    """A rejected order with the symbol's last bid and offer (a row of `order_rejections`)."""

    side: int
    account: int
    order_id: str
    symbol: str
    qty: float
    price: float
    transact_time: dt.datetime
    last_bid: float
    last_offer: float
    reason: str | None
    decision_time: dt.datetime


def apply_quote(msg: MarketData, state: SymbolState) -> SymbolQuote:
    state.bid, state.offer = msg.bid, msg.offer
    state.reject, state.reason = spread_decision(msg.bid, msg.offer)
    return SymbolQuote(msg.symbol, msg.bid, msg.offer, state.reject, state.reason, msg.transact_time)


def apply_order(order: Order, state: SymbolState, now: dt.datetime | None = None) -> OrderRejection | None:
    if not state.reject:
        return None
    return OrderRejection(order.side, order.account, order.order_id, order.symbol, order.qty, order.price,
                          order.transact_time, state.bid, state.offer, state.reason,
                          now or dt.datetime.now(dt.timezone.utc))


@state_computation("update quote", state=SymbolState)
def update_quote(msg: MarketData, state: SymbolState) -> SymbolQuote:
    return apply_quote(msg, state)


@state_computation("check order", state=SymbolState)
def check_order(order: Order, state: SymbolState) -> OrderRejection | None:
    return apply_order(order, state)


def spread_decisions(bid: np.ndarray, offer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`spread_decision` over whole columns: (reject, reason), the same IEEE operations in the same order."""
    bid = np.asarray(bid, dtype=np.float64)
    offer = np.asarray(offer, dtype=np.float64)
    with np.errstate(all="ignore"):
        finite = np.isfinite(bid) & np.isfinite(offer)
        spread = offer - bid
        mid = (bid + offer) / 2
        of_mid = spread / np.where(mid == 0, 1.0, mid)
    n = len(bid)
    reason = np.select(
        [~finite, spread >= SPREAD_LIMIT, mid == 0, of_mid >= SPREAD_LIMIT],
        [np.full(n, r, dtype=object) for r in (REASON_NON_FINITE, REASON_SPREAD, REASON_MID_ZERO, REASON_SPREAD_OF_MID)],
        default=None,
    )
    return reason != None, reason  # noqa: E711 (elementwise on an object array)


@state_computation("market spread", state=SymbolState, batch=True)
def market_spread(frame: pd.DataFrame, state: SymbolState) -> list:
    """One symbol's quotes and orders of a micro-batch, in arrival order, at once.

    Equal to `update_quote` + `check_order` applied one message at a time: every order sees the state
    left by the last quote before it (a forward fill over the frame). Only the symbol's last quote of
    the batch is emitted: `market_state` is an upsert and would keep only that one anyway.
    """
    n = len(frame)
    is_quote = (frame["_stream"] == "market_data").to_numpy()
    rows = np.arange(n)
    last_quote = np.maximum.accumulate(np.where(is_quote, rows, -1))  # latest quote at or before each row
    bid = frame["bid"].to_numpy(dtype=np.float64)
    offer = frame["offer"].to_numpy(dtype=np.float64)
    reject = np.zeros(n, dtype=bool)
    reason = np.full(n, None, dtype=object)
    reject[is_quote], reason[is_quote] = spread_decisions(bid[is_quote], offer[is_quote])
    seen = last_quote >= 0
    at = np.where(seen, last_quote, 0)
    order_reject = np.where(seen, reject[at], state.reject)
    order_reason = np.where(seen, reason[at], state.reason)
    order_bid = np.where(seen, bid[at], state.bid)
    order_offer = np.where(seen, offer[at], state.offer)

    out: list = []
    now = dt.datetime.now(dt.timezone.utc)
    rejected = np.nonzero(~is_quote & order_reject)[0]
    if len(rejected):
        sub = frame.iloc[rejected]
        times = [t.to_pydatetime() for t in sub["transact_time"]]
        for k, side, account, oid, qty, price, t in zip(rejected, sub["side"], sub["account"], sub["order_id"],
                                                        sub["qty"], sub["price"], times):
            out.append(Emit(int(frame["_seq"].iat[k]), OrderRejection(
                int(side), int(account), oid, frame["symbol"].iat[k], float(qty), float(price), t,
                float(order_bid[k]), float(order_offer[k]), order_reason[k], now)))
    if is_quote.any():
        k = int(np.nonzero(is_quote)[0][-1])
        state.bid, state.offer = float(bid[k]), float(offer[k])
        state.reject, state.reason = bool(reject[k]), reason[k]
        t = frame["transact_time"].iloc[k].to_pydatetime()
        out.append(Emit(int(frame["_seq"].iat[k]),
                        SymbolQuote(frame["symbol"].iat[k], state.bid, state.offer, state.reject, state.reason, t)))
    return out


def symbol_of(msg: MarketData | Order) -> str:
    return msg.symbol


def order_result(r: OrderRejection) -> OrderResult:
    return OrderResult(r.side, r.account, r.order_id, r.symbol, r.qty, r.price, r.last_bid, r.last_offer,
                       timestamp_10us(r.decision_time))


@encoder
def encode_rejection(r: OrderRejection) -> bytes:
    """Wallaroo's OrderResult payload (`>BI6s4sddddQ`, 55 bytes); the TCP sink frames it."""
    return encode_order_result(order_result(r))


# -- the application --------------------------------------------------------------------------------
_TS = pa.timestamp("us", tz="UTC")
MARKET_STATE_SCHEMA = pa.schema(
    [
        ("symbol", pa.string()),
        ("bid", pa.float64()),
        ("offer", pa.float64()),
        ("reject", pa.bool_()),
        ("reason", pa.string()),
        ("transact_time", _TS),  # the last quote's own time
        ("seq", pa.int64()),  # gateway sequence of the last quote
        ("receive_time", _TS),  # when the gateway received it
    ]
)
ORDER_REJECTIONS_SCHEMA = pa.schema(
    list(ORDER_SCHEMA)  # every order field, then the decision
    + [
        pa.field("last_bid", pa.float64()),
        pa.field("last_offer", pa.float64()),
        pa.field("reason", pa.string()),
        pa.field("decision_time", _TS),
        pa.field("seq", pa.int64()),  # gateway sequence of the order
        pa.field("receive_time", _TS),
    ]
)

MARKET_STATE_TABLE = "market_state"
ORDER_REJECTIONS_TABLE = "order_rejections"
ORDER_RESULTS_SINK = "order_results"  # TCP: EVENTIDE_SINK_ORDER_RESULTS=HOST:PORT


# -- checks on the tables (blocking: a failure stops what reads them) -------------------------------
# A price is valid between PRICE_MIN and PRICE_MAX, the very bounds the decoders enforce on every price
# that enters (examples/market_decoder.py): a message the decoders accept cannot fail these checks on
# its own; what could is refused at the door, into quarantine, with its reason.
def _finite_non_negative(*columns: str) -> list[dict]:
    """great-expectations expectations, in their configuration form: declaring them needs no import
    of great-expectations (seconds, in every Spark worker that loads this module). NaN counts as null
    for GX; infinity is above the largest double."""
    out = []
    for c in columns:
        out.append({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": c}})
        out.append({"type": "expect_column_values_to_be_between",
                    "kwargs": {"column": c, "min_value": PRICE_MIN, "max_value": PRICE_MAX}})
    return out


def _bad_prices(df: pd.DataFrame, *columns: str) -> pd.Series:
    bad = pd.Series(False, index=df.index)
    for c in columns:
        bad |= ~prices_ok(df[c].to_numpy(dtype=np.float64))
    return bad


PRICES_VALID = expect("market_state_prices_valid", *_finite_non_negative("bid", "offer"),
                      description="bid and offer are finite and not negative")


@check("market_state_reject_matches_rule",
       description="each symbol's reject flag and reason agree with the spread rule for its last quote")
def reject_matches_rule(df: pd.DataFrame) -> tuple[bool, dict]:
    rule_reject, rule_reason = spread_decisions(df["bid"].to_numpy(), df["offer"].to_numpy())
    reason = df["reason"].to_numpy(dtype=object)
    same_reason = (reason == rule_reason) | (pd.isna(reason) & pd.isna(rule_reason))
    reject = df["reject"]
    same_reject = reject.notna().to_numpy() & (reject.fillna(False).to_numpy(dtype=bool) == rule_reject.astype(bool))
    wrong = df["symbol"][~(same_reason & same_reject)]
    repeated = df["symbol"][df["symbol"].duplicated()]
    return wrong.empty and repeated.empty, {"disagreeing": len(wrong), "sample": sorted(wrong)[:10],
                                            "repeated_symbols": sorted(set(repeated))[:10]}


@check("order_rejections_accounted",
       description="each rejection's symbol is known to market_state or recorded as never seen; prices valid")
def rejections_accounted(df: pd.DataFrame, settings) -> tuple[bool, dict]:
    state = settings.table_path(MARKET_STATE_TABLE)
    known = set(lake.read(state, columns=["symbol"]).column("symbol").to_pylist()) if lake.exists(state) else set()
    unaccounted = df["symbol"][~(df["symbol"].isin(known) | (df["reason"] == REASON_NEVER_SEEN))]
    no_reason = int(df["reason"].isna().sum())
    bad_prices = int(_bad_prices(df, "price", "last_bid", "last_offer").sum())
    return unaccounted.empty and not no_reason and not bad_prices, {
        "unaccounted": len(unaccounted), "sample": sorted(set(unaccounted))[:10],
        "without_reason": no_reason, "invalid_prices": bad_prices}


def _market_app(name: str, pipelines, **extra) -> Application:
    return Application(name, pipelines.to_sink(*MARKET_SINKS), description=MARKET_DESCRIPTION, **extra)


MARKET_DESCRIPTION = "Market spread: last quote per symbol and the orders rejected for a too-wide spread."
MARKET_SINKS = (
    DeltaSink(MARKET_STATE_TABLE, mode="upsert", keys=("symbol",), schema=MARKET_STATE_SCHEMA,
              accepts=SymbolQuote, metadata=("seq", "receive_time"), checks=(PRICES_VALID, reject_matches_rule)),
    # Rejections are rare by design: a quiet table is healthy (no freshness policy; bronze_orders has one).
    DeltaSink(ORDER_REJECTIONS_TABLE, schema=ORDER_REJECTIONS_SCHEMA, accepts=OrderRejection,
              metadata=("seq", "receive_time"), checks=(rejections_accounted,), freshness_minutes=0),
    TCPSink(ORDER_RESULTS_SINK, encode_rejection, framed=True, accepts=OrderRejection, optional=True),
)

# Wallaroo's shape: each stream its own state computation on the shared per-symbol state, one
# message at a time. The reference that the batch form below must equal.
market_app_per_message = _market_app(
    "market_spread_per_message",
    merge(
        source("market_data", decoder=decode_market_data).key_by(symbol_of).to(update_quote),
        source("orders", decoder=decode_order).key_by(symbol_of).to(check_order),
    ),
)

# What runs: both streams merged on the symbol, one batch state computation over a symbol's messages
# in arrival order (decoded as columns: no Python object per message).
market_app = _market_app(
    "market_spread",
    merge(source("market_data", decoder=decode_market_data, port=7102).key_by("symbol"),
          source("orders", decoder=decode_order, port=7103).key_by("symbol")).to(market_spread),
    # Its check that needs the Dagster instance (rejections of the latest run): examples/market_assets.py.
    dagster_defs="examples.market_assets:defs",
)
app = market_app  # the entry registered by default: examples.market:app

# -- Wallaroo's model: one process, one loop ---------------------------------------------------------
def run_loop(messages: Iterable[tuple[str, bytes]], now: dt.datetime | None = None
             ) -> tuple[dict[str, SymbolQuote], list[OrderRejection]]:
    """The same decisions in a plain single-process loop over (stream, payload) in arrival order.

    Returns the last quote per symbol and the rejections. The baseline of the benchmark, and the
    tests' reference. Undecodable messages raise.
    """
    states: dict[str, SymbolState] = {}
    quotes: dict[str, SymbolQuote] = {}
    rejections: list[OrderRejection] = []
    for stream, payload in messages:
        if stream == "market_data":
            m = parse_market_data(payload)
            st = states.get(m.symbol)
            if st is None:
                st = states[m.symbol] = SymbolState()
            quotes[m.symbol] = apply_quote(m, st)
        elif stream == "orders":
            o = parse_order(payload)
            st = states.get(o.symbol)
            if st is None:
                st = states[o.symbol] = SymbolState()
            r = apply_order(o, st, now)
            if r is not None:
                rejections.append(r)
        else:
            raise ValueError(f"market spread: unexpected stream {stream!r}")
    return quotes, rejections
