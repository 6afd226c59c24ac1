"""Wallaroo market-spread wire formats (big-endian), exactly as in the data README."""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass

import numpy as np
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
    # Fast path for the fixed 21-character form (strptime costs ~5 us, most of a message's decoding);
    # anything irregular goes to strptime, which has the last word.
    if (len(text) == 21 and text[8] == "-" and text[11] == ":" and text[14] == ":" and text[17] == "."
            and (text[:8] + text[9:11] + text[12:14] + text[15:17] + text[18:]).isdigit()):
        try:
            return dt.datetime(int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[9:11]), int(text[12:14]),
                               int(text[15:17]), int(text[18:21]) * 1000, tzinfo=dt.timezone.utc)
        except ValueError:
            pass
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


# -- OrderResult: the rejection Wallaroo's market spread sent to its TCP sink ----------------------
_ORDER_RESULT = struct.Struct(">BI6s4sddddQ")  # 55 bytes
ORDER_RESULT_SIZE = _ORDER_RESULT.size


@dataclass(frozen=True)
class OrderResult:
    side: int
    account: int
    order_id: str
    symbol: str
    qty: float
    price: float
    last_bid: float
    last_offer: float
    timestamp: int  # units of 10 microseconds since the epoch (Wallaroo: int(time.time() * 100000))


def timestamp_10us(t: dt.datetime) -> int:
    """A datetime in Wallaroo's OrderResult units (10 microseconds since the epoch), exactly."""
    delta = t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds) // 10


def encode_order_result(r: OrderResult) -> bytes:
    """The 55-byte OrderResult payload (unframed): side, account, order id, symbol, qty, price, bid, offer, ts."""
    return _ORDER_RESULT.pack(r.side, r.account, r.order_id.encode("ascii").ljust(6)[:6], r.symbol.rjust(4).encode("ascii"),
                              r.qty, r.price, r.last_bid, r.last_offer, r.timestamp)


def parse_order_result(payload: bytes) -> OrderResult:
    if len(payload) != _ORDER_RESULT.size:
        raise ValueError(f"not an OrderResult: {len(payload)} bytes (expected {_ORDER_RESULT.size})")
    side, account, oid, sym, qty, price, bid, offer, ts = _ORDER_RESULT.unpack(payload)
    return OrderResult(side, account, oid.decode("ascii"), sym.decode("ascii").strip(), qty, price, bid, offer, ts)


# -- column forms: fixed-size records, decoded with numpy over the whole column -----------------------
_MARKET_DTYPE = np.dtype([("type", "u1"), ("symbol", "S4"), ("time", "S21"), ("bid", ">f8"), ("offer", ">f8")])
_ORDER_DTYPE = np.dtype([("type", "u1"), ("side", "u1"), ("account", ">u4"), ("order_id", "S6"), ("symbol", "S4"),
                         ("qty", ">f8"), ("price", ">f8"), ("time", "S21")])


def _fixed_records(payloads: pa.Array, dtype: np.dtype, type_code: int) -> np.ndarray | None:
    """The payloads as a numpy record array, or None if any is not a well-formed record of this type."""
    n = len(payloads)
    if payloads.null_count or not pa.types.is_binary(payloads.type):
        return None
    offsets = np.frombuffer(payloads.buffers()[1], dtype=np.int32)[payloads.offset : payloads.offset + n + 1]
    if n == 0 or not np.all(np.diff(offsets) == dtype.itemsize):
        return None
    rec = np.frombuffer(payloads.buffers()[2], dtype=dtype, count=n, offset=int(offsets[0]))
    return rec if np.all(rec["type"] == type_code) else None


def _fix_times(raw: np.ndarray) -> pa.Array | None:
    import pyarrow.compute as pc

    text = pa.array(np.char.decode(raw, "ascii"))
    base = pc.strptime(pc.utf8_slice_codeunits(text, 0, 17), format="%Y%m%d-%H:%M:%S", unit="us", error_is_null=True)
    millis = pc.utf8_slice_codeunits(text, 18, 21)
    ok = pc.and_(pc.equal(pc.utf8_slice_codeunits(text, 17, 18), "."), pc.match_substring_regex(millis, r"^\d{3}$"))
    if base.null_count or not pc.all(ok).as_py():
        return None
    micros = pc.add(pc.cast(base, pa.int64()), pc.multiply(pc.cast(millis, pa.int64()), 1000))
    return micros.cast(pa.timestamp("us", tz="UTC"))


def _symbols(raw: np.ndarray) -> pa.Array | None:
    syms = np.char.strip(np.char.decode(raw, "ascii"))
    return None if np.any(syms == "") else pa.array(syms.astype(object), pa.string())


def _rows_fallback(payloads: pa.Array, parse, schema: pa.Schema) -> pa.Table:
    rows = []
    for p in payloads.to_pylist():
        try:
            rows.append({**parse(p).__dict__, "_error": None})
        except (ValueError, UnicodeDecodeError) as e:
            rows.append({"_error": f"{type(e).__name__}: {e}"})
    return pa.Table.from_pylist(rows, schema=schema.append(pa.field("_error", pa.string())))


@decode_market_data.column_form
def decode_market_data_columns(payloads: pa.Array) -> pa.Table:
    try:
        rec = _fixed_records(payloads, _MARKET_DTYPE, MARKET_DATA_TYPE)
        times = _fix_times(rec["time"]) if rec is not None else None
        symbols = _symbols(rec["symbol"]) if times is not None else None
    except UnicodeDecodeError:
        symbols = None
    if symbols is None:  # something irregular in this batch: the exact row-by-row way, with reasons
        return _rows_fallback(payloads, parse_market_data, MARKET_DATA_SCHEMA)
    return pa.table({"symbol": symbols, "transact_time": times, "bid": rec["bid"].astype(np.float64),
                     "offer": rec["offer"].astype(np.float64), "_error": pa.nulls(len(rec), pa.string())})


@decode_order.column_form
def decode_order_columns(payloads: pa.Array) -> pa.Table:
    try:
        rec = _fixed_records(payloads, _ORDER_DTYPE, ORDER_TYPE)
        ok = rec is not None and bool(np.all((rec["side"] == 1) | (rec["side"] == 2)))
        times = _fix_times(rec["time"]) if ok else None
        symbols = _symbols(rec["symbol"]) if times is not None else None
        order_ids = pa.array(np.char.decode(rec["order_id"], "ascii").astype(object)) if symbols is not None else None
    except UnicodeDecodeError:
        symbols = None
    if symbols is None:
        return _rows_fallback(payloads, parse_order, ORDER_SCHEMA)
    return pa.table({"side": rec["side"].astype(np.int8), "account": rec["account"].astype(np.int64), "order_id": order_ids,
                     "symbol": symbols, "qty": rec["qty"].astype(np.float64), "price": rec["price"].astype(np.float64),
                     "transact_time": times, "_error": pa.nulls(len(rec), pa.string())})
