"""Wallaroo market-spread wire formats (big-endian), exactly as in the data README."""

from __future__ import annotations

import datetime as dt
import struct
import sys
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from transforms.api import Reject, decoder

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


# -- what a message may hold ------------------------------------------------------------------------
# The layouts give prices and quantities as raw doubles; the decoders refuse what no market holds, so
# that nothing past them can fail the tables' checks on its own (examples/market.py declares the checks
# with these bounds). A price is finite and not negative (-0.0 included: it equals 0); a quantity is
# finite and above zero. A crossed quote (bid > offer) or a very wide one is kept: Wallaroo's rule
# decides it (a wide spread rejects the symbol's orders; a crossed one, a negative spread, does not),
# and real consolidated quotes do cross for moments. A zero bid or offer (no quote on that side) is kept
# too: the rule rejects the symbol (zero mid, or a spread of half the mid or more).
PRICE_MIN = 0.0
PRICE_MAX = sys.float_info.max  # the largest finite double: infinity is above it, NaN fails both bounds


def price_ok(x: float) -> bool:
    return PRICE_MIN <= x <= PRICE_MAX


def prices_ok(x: np.ndarray) -> np.ndarray:
    """`price_ok` over a column."""
    x = np.asarray(x, dtype=np.float64)
    return (x >= PRICE_MIN) & (x <= PRICE_MAX)


def qty_ok(x: float) -> bool:
    return 0.0 < x <= PRICE_MAX


def qtys_ok(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return (x > 0.0) & (x <= PRICE_MAX)


# -- reasons: "<message kind>: expected <what>, got <what came>"; raw bytes and type bytes in hex ------
_TIME_FORM = "a transact time YYYYMMDD-HH:MM:SS.mmm (21 ASCII bytes)"


def _hex(raw: bytes) -> str:
    return "0x" + raw.hex() if raw else "no bytes"


def _layout_reason(kind: str, payload: bytes, size: int, type_code: int) -> str | None:
    if len(payload) == size and payload[0] == type_code:
        return None
    got = "an empty payload (0 bytes)" if not payload else f"{len(payload)} bytes with type 0x{payload[0]:02x}"
    return f"{kind}: expected {size} bytes with type 0x{type_code:02x}, got {got}"


def parse_fix_time(raw: bytes) -> dt.datetime:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"expected {_TIME_FORM}, got bytes {_hex(raw)}") from None
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
        raise ValueError(f"expected {_TIME_FORM}, got {text!r}") from None


def format_fix_time(t: dt.datetime) -> bytes:
    return t.strftime("%Y%m%d-%H:%M:%S.").encode() + f"{t.microsecond // 1000:03d}".encode()


_PRINTABLE = frozenset(range(0x20, 0x7F))


def _text(what: str, raw: bytes) -> str:
    """An ASCII field: printable characters only (a control byte or NUL in a symbol or id means nothing)."""
    if not _PRINTABLE.issuperset(raw):
        raise ValueError(f"expected {what}, got bytes {_hex(raw)}")
    return raw.decode("ascii")


def _symbol(raw: bytes) -> str:
    what = "a symbol of 1-4 printable ASCII characters, right-justified in 4 bytes"
    sym = _text(what, raw).strip(" ")
    if not sym:
        raise ValueError(f"expected {what}, got only spaces ({_hex(raw)})")
    return sym


def _price(name: str, x: float) -> float:
    if not price_ok(x):
        raise ValueError(f"expected a finite {name} >= 0, got {x!r}")
    return x


def _qty(x: float) -> float:
    if not qty_ok(x):
        raise ValueError(f"expected a finite qty > 0, got {x!r}")
    return x


def parse_market_data(payload: bytes) -> MarketData:
    """The message, or ValueError with the reason (the decoder turns it into a Reject)."""
    bad = _layout_reason("market data", payload, _MARKET.size, MARKET_DATA_TYPE)
    if bad:
        raise ValueError(bad)
    _, sym, t, bid, offer = _MARKET.unpack(payload)
    try:
        return MarketData(_symbol(sym), parse_fix_time(t), _price("bid", bid), _price("offer", offer))
    except ValueError as e:
        raise ValueError(f"market data: {e}") from None


def parse_order(payload: bytes) -> Order:
    """The order, or ValueError with the reason (the decoder turns it into a Reject)."""
    bad = _layout_reason("order", payload, _ORDER.size, ORDER_TYPE)
    if bad:
        raise ValueError(bad)
    _, side, account, oid, sym, qty, price, t = _ORDER.unpack(payload)
    try:
        if side not in (1, 2):
            raise ValueError(f"expected side 0x01 (buy) or 0x02 (sell), got 0x{side:02x}")
        return Order(side, account, _text("an order id of 6 printable ASCII bytes", oid), _symbol(sym), _qty(qty),
                     _price("price", price), parse_fix_time(t))
    except ValueError as e:
        raise ValueError(f"order: {e}") from None


def encode_market_data(m: MarketData) -> bytes:
    return _MARKET.pack(MARKET_DATA_TYPE, m.symbol.rjust(4).encode(), format_fix_time(m.transact_time), m.bid, m.offer)


def encode_order(o: Order) -> bytes:
    return _ORDER.pack(ORDER_TYPE, o.side, o.account, o.order_id.encode().ljust(6)[:6], o.symbol.rjust(4).encode(),
                       o.qty, o.price, format_fix_time(o.transact_time))


# A payload they refuse is a Reject with the reason alone (no traceback): the same words as the
# column forms' `_error`, so both forms quarantine alike.
@decoder(header_length=4, length_fmt=">I", schema=MARKET_DATA_SCHEMA)
def decode_market_data(payload: bytes) -> MarketData | Reject:
    try:
        return parse_market_data(payload)
    except ValueError as e:
        return Reject(str(e))


@decoder(header_length=4, length_fmt=">I", schema=ORDER_SCHEMA)
def decode_order(payload: bytes) -> Order | Reject:
    try:
        return parse_order(payload)
    except ValueError as e:
        return Reject(str(e))


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
    # Arrow's strptime rolls a day past the month's end over (20160230 -> March 1st); the one-payload
    # form refuses it: a time that does not print back as written goes the row-by-row way.
    digits = np.ascontiguousarray(raw).view(np.uint8).reshape(len(raw), -1).astype(np.int64) - ord("0")
    for field, at in ((pc.month, 4), (pc.day, 6), (pc.hour, 9), (pc.minute, 12), (pc.second, 15)):
        if not np.array_equal(field(base).to_numpy(), digits[:, at] * 10 + digits[:, at + 1]):
            return None
    micros = pc.add(pc.cast(base, pa.int64()), pc.multiply(pc.cast(millis, pa.int64()), 1000))
    return micros.cast(pa.timestamp("us", tz="UTC"))


def _printable(raw: np.ndarray) -> bool:
    """Every byte of a fixed-width field is printable ASCII (numpy's `S` type drops trailing NULs: check the bytes)."""
    b = np.ascontiguousarray(raw).view(np.uint8)
    return bool(np.all((b >= 0x20) & (b < 0x7F)))


def _symbols(raw: np.ndarray) -> pa.Array | None:
    if not _printable(raw):
        return None
    syms = np.char.strip(np.char.decode(raw, "ascii"), " ")
    return None if np.any(syms == "") else pa.array(syms.astype(object), pa.string())


def _rows_fallback(payloads: pa.Array, parse, schema: pa.Schema) -> pa.Table:
    """The exact row-by-row way, with each refused payload's reason (the one-payload decoder's words)."""
    rows = []
    for p in payloads.to_pylist():
        try:
            rows.append({**parse(p).__dict__, "_error": None})
        except ValueError as e:
            rows.append({"_error": str(e)})
    return pa.Table.from_pylist(rows, schema=schema.append(pa.field("_error", pa.string())))


def _redo_rows(table: pa.Table, payloads: pa.Array, bad: np.ndarray, parse, schema: pa.Schema) -> pa.Table:
    """`table` with the rows where `bad` holds decoded again row by row: well-formed records whose values
    the domain refuses (a negative price, say) get their reason without slowing the rest of the batch."""
    redo = np.nonzero(bad)[0]
    if not len(redo):
        return table
    keep = np.nonzero(~bad)[0]
    again = _rows_fallback(payloads.take(pa.array(redo)), parse, schema)
    parts = pa.concat_tables([table.take(pa.array(keep)).cast(again.schema), again])
    return parts.take(pa.array(np.argsort(np.concatenate([keep, redo]), kind="stable")))


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
    bid, offer = rec["bid"].astype(np.float64), rec["offer"].astype(np.float64)
    table = pa.table({"symbol": symbols, "transact_time": times, "bid": bid, "offer": offer,
                      "_error": pa.nulls(len(rec), pa.string())})
    return _redo_rows(table, payloads, ~(prices_ok(bid) & prices_ok(offer)), parse_market_data, MARKET_DATA_SCHEMA)


@decode_order.column_form
def decode_order_columns(payloads: pa.Array) -> pa.Table:
    try:
        rec = _fixed_records(payloads, _ORDER_DTYPE, ORDER_TYPE)
        ok = rec is not None and bool(np.all((rec["side"] == 1) | (rec["side"] == 2))) and _printable(rec["order_id"])
        times = _fix_times(rec["time"]) if ok else None
        symbols = _symbols(rec["symbol"]) if times is not None else None
        order_ids = pa.array(np.char.decode(rec["order_id"], "ascii").astype(object)) if symbols is not None else None
    except UnicodeDecodeError:
        symbols = None
    if symbols is None:
        return _rows_fallback(payloads, parse_order, ORDER_SCHEMA)
    qty, price = rec["qty"].astype(np.float64), rec["price"].astype(np.float64)
    table = pa.table({"side": rec["side"].astype(np.int8), "account": rec["account"].astype(np.int64),
                      "order_id": order_ids, "symbol": symbols, "qty": qty, "price": price, "transact_time": times,
                      "_error": pa.nulls(len(rec), pa.string())})
    return _redo_rows(table, payloads, ~(qtys_ok(qty) & prices_ok(price)), parse_order, ORDER_SCHEMA)
