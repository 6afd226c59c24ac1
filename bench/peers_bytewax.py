"""The Bytewax 0.21 flows of the `peers` benchmark (bench/peers.py), one per reference workload.

Each flow reads the plain input file the harness wrote (one worker, no recovery), decodes with the
project's own decoders inside the flow, keeps keyed state with `op.stateful_map` /
`op.stateful_flat_map`, and writes its outputs to files in `out` that the harness reads back:

- logs:   `summary.txt`, "YYYY-MM-DD status count" per (day, status), a day's lines when its
          END_OF_DAY marker arrives (one window at a time per source, as examples/logs.py);
- market: `rejections.txt`, "seq order_id" per rejected order; `state.txt`, "symbol bid offer reject"
          per symbol (the last quote: an upsert sink);
- words:  `updates.txt`, "word<TAB>count" per occurrence; `totals.txt`, the last count per word.

Run one like the harness does (the factory arguments are literals):

    python -m bytewax.run "bench/peers_bytewax.py:logs_flow('/tmp/in.log', '/tmp/out')"

The sinks (a buffered line writer, an upsert sink) are bench/bytewax_sinks.py's.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import bytewax.operators as op
from bytewax.connectors.files import FileSource
from bytewax.dataflow import Dataflow

from bench.bytewax_sinks import BATCH, LatestSink, LinesSink
from examples.logs_decoder import parse_log_line
from examples.market import SymbolState, apply_order, apply_quote
from examples.market_decoder import parse_market_data, parse_order
from examples.words import split_words

MARKER = "END_OF_DAY"


def _out(out: str | Path) -> Path:
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- logs: daily status counts, emitted at END_OF_DAY -----------------------------------------------------
def _day_window(counts: Counter | None, rec) -> tuple[Counter | None, list[str]]:
    if rec.is_marker:  # the window closes: its counts out, its state dropped
        rows = [f"{day.isoformat()} {status} {n}" for (day, status), n in sorted((counts or {}).items())]
        return None, rows
    if counts is None:
        counts = Counter()
    counts[(rec.day, rec.status)] += 1
    return counts, []


def logs_flow(inp: str, out: str, marker: str = MARKER) -> Dataflow:
    out_dir = _out(out)
    flow = Dataflow("peers_logs")
    lines = op.input("read", flow, FileSource(inp, batch_size=BATCH))
    records = op.map("decode", lines, lambda line: parse_log_line(line, marker))
    keyed = op.key_on("by_source", records, lambda _rec: "logs")  # one window at a time per source
    summary = op.stateful_flat_map("day_counts", keyed, _day_window)
    op.output("summary", op.key_rm("unkey", summary), LinesSink(out_dir / "summary.txt"))
    return flow


# -- market spread: state per symbol, rejections ---------------------------------------------------------
def decode_market_line(line: str):
    """"seq m|o hex" -> (seq, is_quote, MarketData | Order): the Wallaroo binary formats, decoded here."""
    seq, kind, payload = line.split(" ", 2)
    raw = bytes.fromhex(payload)
    if kind == "m":
        return int(seq), True, parse_market_data(raw)
    if kind == "o":
        return int(seq), False, parse_order(raw)
    raise ValueError(f"market input: expected kind m or o, got {kind!r}")


def _spread(state: SymbolState | None, msg) -> tuple[SymbolState, list]:
    seq, is_quote, m = msg
    if state is None:
        state = SymbolState()
    if is_quote:
        q = apply_quote(m, state)
        return state, [(False, f"{q.symbol} {q.bid!r} {q.offer!r} {int(q.reject)}")]
    r = apply_order(m, state)
    return state, ([(True, f"{seq} {r.order_id}")] if r is not None else [])


def market_flow(inp: str, out: str) -> Dataflow:
    out_dir = _out(out)
    flow = Dataflow("peers_market")
    lines = op.input("read", flow, FileSource(inp, batch_size=BATCH))
    msgs = op.map("decode", lines, decode_market_line)
    keyed = op.key_on("by_symbol", msgs, lambda m: m[2].symbol)
    decided = op.stateful_flat_map("market_spread", keyed, _spread)  # (symbol, (is_rejection, line))
    split = op.branch("rejections_or_quotes", decided, lambda kv: kv[1][0])
    op.output("rejections", op.map("rejection_line", split.trues, lambda kv: kv[1][1]),
              LinesSink(out_dir / "rejections.txt"))
    op.output("state", op.map("state_line", split.falses, lambda kv: (kv[0], kv[1][1])),
              LatestSink(out_dir / "state.txt"))
    return flow


# -- word count: a running count per word ---------------------------------------------------------------
def _count(n: int | None, _word: str) -> tuple[int, int]:
    n = (n or 0) + 1
    return n, n


def words_flow(inp: str, out: str) -> Dataflow:
    out_dir = _out(out)
    flow = Dataflow("peers_words")
    lines = op.input("read", flow, FileSource(inp, batch_size=BATCH))
    words = op.flat_map("split", lines, split_words)
    keyed = op.key_on("by_word", words, lambda w: w)
    counts = op.stateful_map("count", keyed, _count)  # (word, count so far)
    op.output("updates", op.map("update_line", counts, lambda kv: f"{kv[0]}\t{kv[1]}"),
              LinesSink(out_dir / "updates.txt"))
    op.output("totals", op.map("total_line", counts, lambda kv: (kv[0], f"{kv[0]}\t{kv[1]}")),
              LatestSink(out_dir / "totals.txt"))
    return flow


FLOWS = {"logs": logs_flow, "market": market_flow, "words": words_flow}
