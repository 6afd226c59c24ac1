"""Count windows: the mean price of every 100 trades per symbol, and a moving mean over the last 100
trades every 10 trades. Not registered by default: `--app examples.count_windows:app`.

    eventide ingest trades trades.txt --app examples.count_windows:app     # lines "SYMBOL,PRICE"
    eventide run --app examples.count_windows:app
    EVENTIDE_APPS=examples.count_windows:app eventide show trade_means
"""

from __future__ import annotations

import pyarrow as pa

from transforms.api import Application, DeltaSink, Reject, decoder, source
from transforms.windowing import count_windows
from windows import Aggregator, WindowResult

TRADE_SCHEMA = pa.schema([("symbol", pa.string()), ("price", pa.float64())])
MEANS_SCHEMA = pa.schema([("symbol", pa.string()), ("kind", pa.string()), ("first_seq", pa.int64()),
                          ("last_seq", pa.int64()), ("trades", pa.int64()), ("mean_price", pa.float64())])


@decoder(schema=TRADE_SCHEMA)
def decode_trade(payload: bytes):
    symbol, price = payload.decode().strip().split(",")
    price = float(price)
    if not price > 0:
        return Reject(f"expected a price above 0, got {price}")
    return {"symbol": symbol, "price": price}


# (trades, sum of prices); add_frame lets the step fold a micro-batch's trades of a symbol at once.
mean_price = Aggregator(create=lambda: (0, 0.0), add=lambda acc, t: (acc[0] + 1, acc[1] + t["price"]),
                        add_frame=lambda acc, f: (acc[0] + len(f), acc[1] + float(f["price"].sum())))


def mean_row(kind: str):
    def row(w: WindowResult) -> dict:
        n, total = w.value
        return {"symbol": w.key, "kind": kind, "first_seq": w.first_seq, "last_seq": w.last_seq, "trades": n,
                "mean_price": total / n}
    return row


trades = source("trades", decoder=decode_trade).key_by("symbol")
app = Application(
    "trade_means",
    trades.to(count_windows(100).over(mean_price).emit(mean_row("every 100"))).named("tumbling")
    .to_sink(DeltaSink("trade_means", schema=MEANS_SCHEMA)),
    trades.to(count_windows(100, slide=10).over(mean_price).emit(mean_row("last 100, every 10")))
    .named("sliding").to_sink(DeltaSink("trade_moving_means", schema=MEANS_SCHEMA)),
    description="count windows: means of every 100 trades, and of the last 100 every 10 trades",
)
