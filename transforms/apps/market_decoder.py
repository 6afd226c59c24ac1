"""Wallaroo market-spread wire formats (big-endian), exactly as in the data README."""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass

import pyarrow as pa

from transforms.api import decoder

MARKET_DATA_TYPE = 2
ORDER_TYPE = 1
_MARKET = struct.Struct(">B4s21sdd")  # 42 bytes
_ORDER = struct.Struct(">BBI6s4sdd21s")  # 53 bytes


@dataclass
class MarketData:
    symbol: str
    transact_time: dt.datetime
    bid: float
    offer: float


@dataclass
class Order:
    side: int  # 1 buy, 2 sell
    account: int
    order_id: str
    symbol: str
    qty: float
    price: float
    transact_time: dt.datetime


MARKET_DATA_SCHEMA = pa.schema(
    [("symbol", pa.string()), ("transact_time", pa.timestamp("us", tz="UTC")), ("bid", pa.float64()), ("offer", pa.float64())]
)
ORDER_SCHEMA = pa.schema(
    [
        ("side", pa.int8()),
        ("account", pa.int64()),
        ("order_id", pa.string()),
        ("symbol", pa.string()),
        ("qty", pa.float64()),
        ("price", pa.float64()),
        ("transact_time", pa.timestamp("us", tz="UTC")),
    ]
)


def parse_fix_time(raw: bytes) -> dt.datetime:
    text = raw.decode("ascii")
    try:
        return dt.datetime.strptime(text, "%Y%m%d-%H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise ValueError(f"bad transact time {text!r}, expected YYYYMMDD-HH:MM:SS.mmm") from None


def format_fix_time(t: dt.datetime) -> bytes:
    return t.strftime("%Y%m%d-%H:%M:%S.").encode() + f"{t.microsecond // 1000:03d}".encode()


def _symbol(raw: bytes) -> str:
    sym = raw.decode("ascii").strip()
    if not sym:
        raise ValueError("empty symbol")
    return sym


def parse_market_data(payload: bytes) -> MarketData:
    if len(payload) != _MARKET.size or payload[0] != MARKET_DATA_TYPE:
        raise ValueError(f"not a market-data message: {len(payload)} bytes, type {payload[:1].hex() or 'none'} "
                         f"(expected {_MARKET.size} bytes, type {MARKET_DATA_TYPE})")
    _, sym, t, bid, offer = _MARKET.unpack(payload)
    return MarketData(_symbol(sym), parse_fix_time(t), bid, offer)


def parse_order(payload: bytes) -> Order:
    if len(payload) != _ORDER.size or payload[0] != ORDER_TYPE:
        raise ValueError(f"not an order message: {len(payload)} bytes, type {payload[:1].hex() or 'none'} "
                         f"(expected {_ORDER.size} bytes, type {ORDER_TYPE})")
    _, side, account, oid, sym, qty, price, t = _ORDER.unpack(payload)
    if side not in (1, 2):
        raise ValueError(f"bad order side {side} (1 buy, 2 sell)")
    return Order(side, account, oid.decode("ascii"), _symbol(sym), qty, price, parse_fix_time(t))


def encode_market_data(m: MarketData) -> bytes:
    return _MARKET.pack(MARKET_DATA_TYPE, m.symbol.rjust(4).encode(), format_fix_time(m.transact_time), m.bid, m.offer)


def encode_order(o: Order) -> bytes:
    return _ORDER.pack(ORDER_TYPE, o.side, o.account, o.order_id.encode().ljust(6)[:6], o.symbol.rjust(4).encode(),
                       o.qty, o.price, format_fix_time(o.transact_time))


@decoder(header_length=4, length_fmt=">I", schema=MARKET_DATA_SCHEMA)
def decode_market_data(payload: bytes) -> MarketData:
    return parse_market_data(payload)


@decoder(header_length=4, length_fmt=">I", schema=ORDER_SCHEMA)
def decode_order(payload: bytes) -> Order:
    return parse_order(payload)
