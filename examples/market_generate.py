"""Generated market-spread input: framed `.msg` files of orders or market data (tests, benchmarks).

Deterministic for a given seed. Quotes are mostly tight, some exactly 5 cents wide (the edge of the
rule) and some wide; a share of messages can use symbols that are in no symbols file ("never seen").
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence
from pathlib import Path

import examples
from examples.market_decoder import MarketData, Order, encode_market_data, encode_order
from transforms.ingestion.framing import DEFAULT_FRAMING

REPO = Path(examples.__file__).resolve().parents[1]
DEFAULT_SYMBOLS_FILE = REPO / "data" / "wallaroo" / "market_spread" / "symbols.txt"
START = dt.datetime(2016, 9, 2, 15, 47, 52, tzinfo=dt.timezone.utc)
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ID_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def read_symbols(path: str | Path | None = None) -> list[str]:
    """Symbols of a file, one per line (1 to 4 ASCII characters), in file order, without duplicates."""
    path = Path(path) if path is not None else DEFAULT_SYMBOLS_FILE
    out: list[str] = []
    for n, line in enumerate(path.read_text(encoding="ascii").splitlines(), 1):
        sym = line.strip()
        if not sym:
            continue
        if len(sym) > 4 or not sym.isascii() or " " in sym:
            raise ValueError(f"{path}:{n}: symbol {sym!r} is not 1-4 ASCII characters")
        if sym not in out:
            out.append(sym)
    if not out:
        raise ValueError(f"{path}: no symbols")
    return out


def synthetic_symbols(n: int, exclude: Sequence[str] = ()) -> list[str]:
    """`n` distinct four-letter symbols (AAAA, AAAB, ...) that are not in `exclude`."""
    skip = set(exclude)
    out = []
    i = 0
    while len(out) < n:
        if i >= 26**4:
            raise ValueError(f"cannot make {n} four-letter symbols")
        k, s = i, ""
        for _ in range(4):
            k, r = divmod(k, 26)
            s = _ALPHABET[r] + s
        if s not in skip:
            out.append(s)
        i += 1
    return out


def unknown_symbols(known: Sequence[str], n: int = 50) -> list[str]:
    """Symbols in no symbols file: a digit in them keeps them apart from real tickers."""
    skip = set(known)
    return [s for s in (f"Z{i:03d}" for i in range(1000)) if s not in skip][:n]


class _Market:
    """Each symbol's base price (stable for a seed) and quote shapes."""

    def __init__(self, symbols: Sequence[str], rng: random.Random):
        self.rng = rng
        self.base = {s: round(rng.uniform(2.0, 300.0), 2) for s in symbols}

    def price(self, symbol: str) -> float:
        p = self.base.get(symbol)
        if p is None:
            p = self.base[symbol] = round(self.rng.uniform(2.0, 300.0), 2)
        return p

    def quote(self, symbol: str) -> tuple[float, float]:
        rng = self.rng
        bid = round(self.price(symbol) * rng.uniform(0.98, 1.02), 2)
        shape = rng.random()
        if shape < 0.80:
            spread = rng.choice((0.01, 0.02, 0.03, 0.04))  # tight: accept
        elif shape < 0.90:
            spread = 0.05  # exactly 5 cents: IEEE decides
        else:
            spread = round(rng.uniform(0.06, 1.5), 2)  # wide: reject
        return bid, round(bid + spread, 2)


def _order_id(n: int) -> str:
    s = ""
    for _ in range(6):
        n, r = divmod(n, 36)
        s = _ID_CHARS[r] + s
    return s


def _pick(rng: random.Random, symbols: Sequence[str], unknown: Sequence[str], unknown_share: float) -> str:
    if unknown and unknown_share > 0 and rng.random() < unknown_share:
        return rng.choice(unknown)
    return rng.choice(symbols)


def market_payloads(symbols: Sequence[str], count: int, seed: int = 1, unknown_share: float = 0.0) -> list[bytes]:
    """`count` market-data payloads (unframed) over `symbols`, deterministic for `seed`."""
    rng = random.Random(f"market:{seed}")
    market = _Market(symbols, random.Random(f"prices:{seed}"))
    unknown = unknown_symbols(symbols)
    out = []
    for i in range(count):
        sym = _pick(rng, symbols, unknown, unknown_share)
        bid, offer = market.quote(sym)
        out.append(encode_market_data(MarketData(sym, START + dt.timedelta(milliseconds=i), bid, offer)))
    return out


def order_payloads(symbols: Sequence[str], count: int, seed: int = 1, unknown_share: float = 0.0) -> list[bytes]:
    """`count` order payloads (unframed): unique 6-character order ids within one call."""
    if count > 36**6:
        raise ValueError(f"at most {36**6} orders per file (6-character order ids)")
    rng = random.Random(f"orders:{seed}")
    market = _Market(symbols, random.Random(f"prices:{seed}"))
    unknown = unknown_symbols(symbols)
    first_id = (seed * 104_729) % 36**6
    out = []
    for i in range(count):
        sym = _pick(rng, symbols, unknown, unknown_share)
        order = Order(
            side=rng.choice((1, 2)),
            account=rng.randrange(1, 2**32),
            order_id=_order_id((first_id + i) % 36**6),
            symbol=sym,
            qty=float(rng.randrange(1, 100) * 100),
            price=round(market.price(sym) * rng.uniform(0.97, 1.03), 2),
            transact_time=START + dt.timedelta(milliseconds=i),
        )
        out.append(encode_order(order))
    return out


def mixed_messages(count: int, symbols: Sequence[str], seed: int = 1, order_share: float = 0.2,
                   unknown_share: float = 0.0) -> list[tuple[str, bytes]]:
    """A mixed stream in arrival order: (stream, payload), `order_share` of them orders."""
    n_orders = round(count * order_share)
    quotes = market_payloads(symbols, count - n_orders, seed, 0.0)
    orders = order_payloads(symbols, n_orders, seed, unknown_share)
    rng = random.Random(f"mix:{seed}")
    kinds = ["orders"] * n_orders + ["market_data"] * (count - n_orders)
    rng.shuffle(kinds)
    q, o = iter(quotes), iter(orders)
    return [(k, next(o) if k == "orders" else next(q)) for k in kinds]


def generate(kind: str, out: str | Path, symbols_file: str | Path | None = None, count: int = 1000, seed: int = 1,
             unknown_share: float = 0.0) -> int:
    """Write `count` framed messages of `kind` ("orders" or "market") to `out`; returns the count."""
    if kind not in ("orders", "market"):
        raise ValueError(f"kind must be 'orders' or 'market', got {kind!r}")
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    if not 0.0 <= unknown_share <= 1.0:
        raise ValueError(f"unknown share must be between 0 and 1, got {unknown_share}")
    symbols = read_symbols(symbols_file)
    make = order_payloads if kind == "orders" else market_payloads
    payloads = make(symbols, count, seed, unknown_share)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(DEFAULT_FRAMING.encode_many(payloads))
    tmp.replace(out)
    return len(payloads)
