"""Latency of `eventide serve` on market spread, next to its limit: a plain Python loop on sockets.

Eventide: `eventide serve` (a subprocess, fresh EVENTIDE_HOME, only `examples.market:app`), its
OrderResult TCP sink pointed at a listener in this process. The 350 sample quotes prime it; then a
steady mixed stream (80 % quotes, 20 % orders) goes over TCP in 10 ms chunks at a fixed rate, one
phase per rate (after an unmeasured warm-up). Per rejected order:

    latency = arrival of its OrderResult at the listener - the gateway's receipt (`bronze_orders.receive_time`)

and, comparable with the loop, arrival - send time. Per phase: p50/p95/p99/max, messages sent, the
answers per second while sending, the backlog when sending stopped and the time to drain it.

Count check: the rule, computed here in Python over the stream as sent, says which orders reject;
every one of them must arrive exactly once on the socket and be in `order_rejections` exactly once,
nothing else may arrive, and replaying the bronze tables in the gateway's order must give the same
set. The workload keeps each symbol's class fixed (tight quotes for symbols the sample leaves
accepting, wide ones for the 15 it leaves rejecting; a quarter of the orders name unknown symbols),
so the decision cannot depend on how the two streams' connections interleave at the gateway.

Loop (the limit): one Python process, selectors over the same two TCP streams, decode each frame
(`parse_market_data` / `parse_order`), apply the rule with per-symbol state, answer each rejected order
on a socket right after the chunk it came in (TCP_NODELAY). Same rates and bytes (each phase's first
`loop_seconds`: its percentiles settle fast); its rejected order ids must equal Eventide's.

Where the time goes: a second, shorter run with the gateway and `orchestration.service.Service` in
one process (a subprocess of this one), reading each query's `recentProgress` (mean durationMs per
batch that had input) while a phase runs, and timing its foreachBatch call and sink writers (wrapped
in that process only; nothing is added to the engine).

Full: about 5-6 minutes on 2 cores (serve: 60 s at each rate after a 5 s warm-up; loop: 30 s each;
breakdown: 15 s at the first rate); longer when the service falls behind (it waits for the backlog).

    python -m bench.latency [--rates 1000,10000] [--seconds 60] [--loop-seconds 30] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import json
import os
import queue
import random
import selectors
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.processes import load_average
from examples.market_decoder import (
    MarketData,
    Order,
    OrderResult,
    encode_market_data,
    encode_order,
    encode_order_result,
    parse_market_data,
    parse_order,
    timestamp_10us,
)
from examples.market_generate import read_symbols, unknown_symbols
from transforms.ingestion.framing import DEFAULT_FRAMING
from transforms.ports import free_port

REPO = Path(__file__).resolve().parents[1]
PRIME_FILE = REPO / "data" / "wallaroo" / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"
TICK_S = 0.01  # the sender's chunk: one per 10 ms
ORDER_SHARE = 0.2
UNKNOWN_SHARE = 0.25  # of the orders: symbols never quoted (always rejected)
REJECT_STATE_SHARE = 0.25  # of the orders: symbols in reject state (always rejected)
BURSTS, BURST_GAP_S = 10, 2.0  # the acceptance's shape on an idle service (see idle_bursts)
PROBE_SYMBOL = "GOOG"  # in reject state after the sample quotes, and kept there
MARKER_BID, MARKER_OFFER = 1.0, 2.0  # a wide quote for PROBE_SYMBOL: an answer carrying it proves the prime was processed
SPARK_ENV = {"JAVA_HOME": "/usr/lib/jvm/java-17-openjdk-amd64", "SPARK_LOCAL_IP": "127.0.0.1"}
T0 = dt.datetime(2016, 9, 2, 15, 47, 52, tzinfo=dt.timezone.utc)


# -- the rule (README: IEEE doubles, this order of operations) ---------------------------------------
def rejects(bid: float, offer: float) -> bool:
    spread = offer - bid
    mid = (bid + offer) / 2
    return spread >= 0.05 or mid == 0 or spread / mid >= 0.05


def prime_frames() -> list[bytes]:
    return DEFAULT_FRAMING.split(PRIME_FILE.read_bytes())


def primed_state() -> dict[str, bool]:
    """Each symbol's reject state after the sample quotes."""
    state = {}
    for p in prime_frames():
        m = parse_market_data(p)
        state[m.symbol] = rejects(m.bid, m.offer)
    return state


def replay(messages) -> set[str]:
    """The order ids the rule rejects over (kind, symbol, bid, offer, order_id) in arrival order."""
    state: dict[str, bool] = {}
    out = set()
    for kind, sym, bid, offer, oid in messages:
        if kind == "q":
            state[sym] = rejects(bid, offer)
        elif state.get(sym, True):
            out.add(oid)
    return out


def _order_id(n: int) -> str:
    chars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    s = ""
    for _ in range(6):
        n, r = divmod(n, 36)
        s = chars[r] + s
    return s


def _framed_order(oid: str, sym: str, rng: random.Random) -> bytes:
    return DEFAULT_FRAMING.encode(encode_order(Order(rng.choice((1, 2)), rng.randrange(1, 2**32), oid, sym,
                                                     float(rng.randrange(1, 100) * 100),
                                                     round(rng.uniform(5, 300), 2), T0)))


# -- the workload ----------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    rate: int  # messages per second, both streams together
    seconds: float
    measured: bool = True
    ticks: list[tuple[bytes, bytes, list[str], int]] = field(default_factory=list)  # (quotes, orders, order ids, n quotes)
    messages: list[tuple] = field(default_factory=list)  # (kind, symbol, bid, offer, order_id) as sent
    expected: set[str] = field(default_factory=set)  # order ids the rule rejects
    orders: int = 0
    quotes: int = 0


class Workload:
    """Every phase's bytes, made before anything is timed; deterministic for a seed."""

    def __init__(self, seed: int = 7):
        self.rng = random.Random(f"latency:{seed}")
        self.state = primed_state()
        self.known = read_symbols()
        self.reject_syms = sorted(s for s in self.known if self.state.get(s, True))
        self.accept_syms = sorted(s for s in self.known if not self.state.get(s, True))
        self.unknown = unknown_symbols(self.known)
        assert PROBE_SYMBOL in self.reject_syms and len(self.reject_syms) == 15, self.reject_syms
        # A pool of framed quotes per symbol, each keeping the symbol's class.
        self.pool: dict[str, list[tuple[bytes, float, float]]] = {}
        for s in self.known:
            base = round(self.rng.uniform(5.0, 300.0), 2)
            quotes = []
            for i in range(8):
                bid = round(base * self.rng.uniform(0.99, 1.01), 2)
                spread = self.rng.choice((0.01, 0.02, 0.03)) if s in self.accept_syms else round(self.rng.uniform(0.1, 1.5), 2)
                offer = round(bid + spread, 2)
                assert rejects(bid, offer) == (s in self.reject_syms)
                frame = DEFAULT_FRAMING.encode(encode_market_data(MarketData(s, T0 + dt.timedelta(milliseconds=i), bid, offer)))
                quotes.append((frame, bid, offer))
            self.pool[s] = quotes
        self.next_id = 0
        self.probes = 0

    def phase(self, name: str, rate: int, seconds: float, measured: bool = True) -> Phase:
        rng, ph = self.rng, Phase(name, rate, seconds, measured)
        per_tick = max(1, round(rate * TICK_S))
        for _ in range(round(seconds / TICK_S)):
            qs, os_, ids = [], [], []
            for _ in range(per_tick):
                if rng.random() < ORDER_SHARE:
                    u = rng.random()
                    sym = (rng.choice(self.unknown) if u < UNKNOWN_SHARE else
                           rng.choice(self.reject_syms) if u < UNKNOWN_SHARE + REJECT_STATE_SHARE else
                           rng.choice(self.accept_syms))
                    oid = _order_id(self.next_id)
                    self.next_id += 1
                    os_.append(_framed_order(oid, sym, rng))
                    ids.append(oid)
                    ph.messages.append(("o", sym, 0.0, 0.0, oid))
                else:
                    sym = rng.choice(self.known)
                    frame, bid, offer = rng.choice(self.pool[sym])
                    qs.append(frame)
                    ph.messages.append(("q", sym, bid, offer, None))
            ph.ticks.append((b"".join(qs), b"".join(os_), ids, len(qs)))
            ph.orders += len(ids)
            ph.quotes += len(qs)
        return ph

    def probe(self) -> tuple[str, bytes]:
        """An order for PROBE_SYMBOL (always rejected), its id outside the phases' ids (they start with 0)."""
        self.probes += 1
        oid = f"P{self.probes:05d}"
        return oid, _framed_order(oid, PROBE_SYMBOL, self.rng)


def expected_for(workload: Workload, phases: list[Phase]) -> set[str]:
    """The rule over everything sent, in send order, from the primed state; each phase's share too."""
    msgs = [("q", m.symbol, m.bid, m.offer, None) for m in map(parse_market_data, prime_frames())]
    msgs.append(("q", PROBE_SYMBOL, MARKER_BID, MARKER_OFFER, None))
    everything = replay(msgs + [m for ph in phases for m in ph.messages])
    for ph in phases:
        ph.expected = {m[4] for m in ph.messages if m[0] == "o"} & everything
    return everything


# -- the answers' listener --------------------------------------------------------------------------
class Listener:
    """Collects OrderResult frames from any number of connections: (arrival time, order id, bid)."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.answers: list[tuple[float, str, float]] = []
        self.connections = 0
        self.bad_frames = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        dec = DEFAULT_FRAMING.decoder()
        with conn:
            while data := conn.recv(1 << 16):
                now = time.time()
                for p in dec.feed(data):
                    if len(p) != 55:
                        self.bad_frames += 1
                        continue
                    # OrderResult `>BI6s4sddddQ`: the order id at 5, the last bid at 31
                    self.answers.append((now, p[5:11].decode("ascii"), _BID.unpack_from(p, 31)[0]))

    def close(self):
        self.server.close()


_BID = struct.Struct(">d")


# -- the sender and the phases --------------------------------------------------------------------
def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


@dataclass
class Run:
    """One system driven through the phases: what was sent when, what came back when."""

    listener: Listener
    sent_at: dict[str, float] = field(default_factory=dict)  # order id -> time.time() at send
    probes: set[str] = field(default_factory=set)  # probe order ids sent (all rejected)
    burst_ids: set[str] = field(default_factory=set)  # idle bursts' order ids (all rejected)
    phase_stats: dict[str, dict] = field(default_factory=dict)
    primed_bursts: dict | None = None  # idle_bursts on the just-primed service, before the phases

    def first_answers(self) -> dict[str, float]:
        """order id -> arrival of its first answer."""
        out: dict[str, float] = {}
        for at, oid, _ in self.listener.answers:
            out.setdefault(oid, at)
        return out


def prime(workload: Workload, m_sock: socket.socket, o_sock: socket.socket, listener: Listener, timeout: float,
          run: Run) -> float:
    """Send the sample quotes and the marker quote; probe until an answer carries the marker (the whole
    prime is processed, and the system answers end to end). Returns the seconds it took."""
    start = time.time()
    m_sock.sendall(b"".join(DEFAULT_FRAMING.encode(p) for p in prime_frames()))
    m_sock.sendall(DEFAULT_FRAMING.encode(encode_market_data(MarketData(PROBE_SYMBOL, T0, MARKER_BID, MARKER_OFFER))))
    probes: set[str] = set()
    while time.time() - start < timeout:
        oid, frame = workload.probe()
        run.sent_at[oid] = time.time()
        run.probes.add(oid)
        o_sock.sendall(frame)
        probes.add(oid)
        deadline = time.time() + 0.5
        while time.time() < deadline:
            if any(a[1] in probes and a[2] == MARKER_BID for a in listener.answers):
                return time.time() - start
            time.sleep(0.02)
    raise TimeoutError(f"no answer to a probe order within {timeout} s")


def send_phase(ph: Phase, m_sock: socket.socket, o_sock: socket.socket, run: Run) -> dict:
    """Send the phase's chunks on schedule (one per TICK_S); returns the sender's timing."""
    start = time.perf_counter() + 0.01
    wall0 = time.time()
    max_lag = 0.0
    for k, (qs, os_, ids, _) in enumerate(ph.ticks):
        target = start + k * TICK_S
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            max_lag = max(max_lag, -delay)
        if qs:
            m_sock.sendall(qs)
        if os_:
            now = time.time()
            o_sock.sendall(os_)
            for oid in ids:
                run.sent_at[oid] = now
    elapsed = time.time() - wall0
    return {"send_started": wall0, "send_ended": time.time(), "send_s": elapsed,
            "send_rate": (ph.quotes + ph.orders) / elapsed, "max_sender_lag_s": max_lag}


def wait_for(need: set[str], listener: Listener, timeout: float) -> bool:
    """Wait until an answer for every id in `need` arrived (or `timeout`); True if they all did."""
    missing, i = set(need), 0
    deadline = time.time() + timeout
    while True:
        n = len(listener.answers)
        missing.difference_update(a[1] for a in listener.answers[i:n])
        i = n
        if not missing or time.time() >= deadline:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # a straggling duplicate, if any, is counted
    return not missing


def idle_bursts(workload: Workload, orders_port: int, listener: Listener, run: Run, n: int, say,
                prefix: str = "B", when: str = "after the rate phases") -> dict:
    """The issue's acceptance, measured rather than asserted: on the primed service, idle, 20 orders in
    one send (one for each of the 15 symbols the sample leaves rejecting, 5 for unknown symbols), and
    the time from the send until the last of their 20 OrderResults arrives; `n` bursts, BURST_GAP_S apart.
    `prefix` starts the bursts' order ids: one letter, each call's own, not the probes' P nor a digit (phases)."""
    latest = []
    with _connect(orders_port) as sock:
        for b in range(n):
            time.sleep(BURST_GAP_S)
            symbols = workload.reject_syms + workload.unknown[:5]
            ids = [f"{prefix}{b:02d}{i:03d}" for i in range(len(symbols))]
            frames = b"".join(_framed_order(oid, sym, workload.rng) for oid, sym in zip(ids, symbols))
            sent = time.time()
            sock.sendall(frames)
            run.burst_ids.update(ids)
            if not wait_for(set(ids), listener, 30):
                raise TimeoutError(f"idle burst {b}: not every OrderResult arrived within 30 s")
            first = run.first_answers()
            latest.append(round(max(first[oid] for oid in ids) - sent, 3))
    say(f"idle bursts of 20 orders {when}: last OrderResult after {statistics.median(latest):.2f} s (median), "
        f"{max(latest):.2f} s (max) over {n}")
    return {"bursts": n, "orders_per_burst": 20, "last_result_s": latest, "median_s": statistics.median(latest),
            "max_s": max(latest), "within_2_s": sum(x <= 2.0 for x in latest)}


def drive(workload: Workload, phases: list[Phase], ports: tuple[int, int], listener: Listener,
          prime_timeout: float, drain_timeout: float, say, final_timeout: float | None = None,
          primed_bursts: int = 0) -> Run:
    """Prime, then (`primed_bursts`) the acceptance's idle bursts on the just-primed service, then each
    phase in turn: send it, then wait (up to `drain_timeout`) for its answers; after the last, wait up
    to `final_timeout` for every answer still owed."""
    run = Run(listener)
    with _connect(ports[0]) as m_sock, _connect(ports[1]) as o_sock:
        warm = prime(workload, m_sock, o_sock, listener, prime_timeout, run)
        say(f"primed, first answer after {warm:.1f} s")
        if primed_bursts:
            run.primed_bursts = idle_bursts(workload, ports[1], listener, run, primed_bursts, say, prefix="I",
                                            when="on the just-primed service")
        for k, ph in enumerate(phases):
            i0 = len(listener.answers)
            timing = send_phase(ph, m_sock, o_sock, run)
            end = timing["send_ended"]
            answered = sum(1 for a in listener.answers[i0:] if a[1] in ph.expected and a[0] <= end)
            if k == len(phases) - 1:
                owed = {i for p in phases for i in p.expected} | run.probes
                drained = wait_for(owed, listener, final_timeout or drain_timeout)
            else:
                drained = wait_for(ph.expected, listener, drain_timeout)
            timing.update(answered_by_end=answered, backlog_at_end=len(ph.expected) - answered, drained=drained)
            run.phase_stats[ph.name] = timing
            say(f"{ph.name}: sent {ph.quotes + ph.orders} at {timing['send_rate']:.0f}/s, backlog at end "
                f"{timing['backlog_at_end']}/{len(ph.expected)}, drained in {time.time() - end:.1f} s: {drained}")
    return run


# -- statistics ------------------------------------------------------------------------------------
def pcts(values: list[float]) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds (nearest rank)."""
    if not values:
        return {}
    v = sorted(values)

    def rank(p):
        return v[min(len(v) - 1, max(0, int(-(-p * len(v) // 100)) - 1))]

    return {"p50": round(rank(50) * 1e3, 1), "p95": round(rank(95) * 1e3, 1), "p99": round(rank(99) * 1e3, 1),
            "max": round(v[-1] * 1e3, 1)}


def phase_report(ph: Phase, run: Run, receive_at: dict[str, float] | None) -> dict:
    t = run.phase_stats[ph.name]
    first = {o: at for o, at in run.first_answers().items() if o in ph.expected}
    send_lat = [first[o] - run.sent_at[o] for o in first]
    out = {"messages_sent": ph.quotes + ph.orders, "orders_sent": ph.orders, "expected_rejections": len(ph.expected),
           "send_rate_msgs_per_s": round(t["send_rate"]), "max_sender_lag_ms": round(t["max_sender_lag_s"] * 1e3, 1)}
    if receive_at is not None:
        lat = [first[o] - receive_at[o] for o in first if o in receive_at]
        out["latency_from_gateway_receipt_ms"] = pcts(lat)
        out["gateway_receipt_minus_send_ms"] = pcts([receive_at[o] - run.sent_at[o] for o in first if o in receive_at])
    out["latency_from_send_ms"] = pcts(send_lat)
    # the rate sustained: answers arriving while sending (after the first quarter, at most 5 s), and
    # over the whole phase, from its first send to its last answer
    t0, t1 = t["send_started"] + min(5.0, t["send_s"] / 4), t["send_ended"]
    steady = sum(1 for at in first.values() if t0 <= at <= t1)
    out["expected_answers_per_s"] = round(len(ph.expected) / ph.seconds, 1)
    out["answers_per_s_while_sending"] = round(steady / (t1 - t0), 1) if t1 > t0 else None
    if first:
        span = max(first.values()) - t["send_started"]
        out["answers_per_s_send_to_last_answer"] = round(len(first) / span, 1)
        out["msgs_per_s_send_to_last_answer"] = round((ph.quotes + ph.orders) / max(span, t["send_s"]))
    # kept up? the backlog at the end, in seconds of input, and the latency trend over the phase
    per_s = max(len(ph.expected) / ph.seconds, 1e-9)
    out["backlog_at_end_orders"] = t["backlog_at_end"]
    out["backlog_at_end_s_of_input"] = round(t["backlog_at_end"] / per_s, 2)
    out["drain_s"] = (round(max(0.0, max(first.values()) - t["send_ended"]), 2)
                      if first and len(first) == len(ph.expected) else None)
    head = [first[o] - run.sent_at[o] for o in first if run.sent_at[o] < t["send_started"] + 10]
    tail = [first[o] - run.sent_at[o] for o in first if run.sent_at[o] > t["send_ended"] - 10]
    if head and tail:
        h, tl = statistics.median(head), statistics.median(tail)
        out["p50_first_10s_ms"], out["p50_last_10s_ms"] = round(h * 1e3, 1), round(tl * 1e3, 1)
        out["kept_up"] = out["backlog_at_end_s_of_input"] <= 3.0 and tl <= 1.5 * h + 0.5
    out["answers_arrived"] = len(first)
    return out


def count_check(expected: set[str], answers: list[tuple[float, str, float]], table_ids: list[str] | None = None) -> dict:
    seen = collections.Counter(a[1] for a in answers)
    out = {"expected": len(expected), "received": sum(seen.values()),
           "missing": len(expected - seen.keys()), "duplicates": sum(n - 1 for n in seen.values() if n > 1),
           "unexpected": len(seen.keys() - expected)}
    ok = out["missing"] == out["duplicates"] == out["unexpected"] == 0
    if table_ids is not None:
        rows = collections.Counter(table_ids)
        out["table_rows"] = sum(rows.values())
        out["table_missing"] = len(expected - rows.keys())
        out["table_duplicates"] = sum(n - 1 for n in rows.values() if n > 1)
        out["table_unexpected"] = len(rows.keys() - expected)
        ok = ok and out["table_missing"] == out["table_duplicates"] == out["table_unexpected"] == 0
    out["ok"] = ok
    return out


# -- Eventide: `eventide serve` in a subprocess -------------------------------------------------------
class ServeProcess:
    """`eventide serve` with default signal dispositions; its output lines collected by a thread."""

    def __init__(self, env: dict[str, str]):
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestration.cli", "serve"], env=env, cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: (signal.signal(signal.SIGTERM, signal.SIG_DFL), signal.signal(signal.SIGINT, signal.SIG_DFL)),
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.output.append(line)
            self.lines.put(line)

    def wait_for_line(self, start: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith(start):
                return line
        raise RuntimeError(f"eventide serve: no line starting {start!r} (exit code {self.proc.poll()}); "
                           f"output: {self.output[-20:]}")

    def stop(self, timeout: float = 90) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(30)


def read_bronze(home: Path):
    """(order id -> receive time, the gateway-order replay's rejections, order_rejections' ids)."""
    from transforms import lake
    from transforms.settings import Settings

    s = Settings(home=home, apps="examples.market:app")
    orders = lake.read(s.table_path("bronze_orders"), columns=["seq", "receive_time", "order_id", "symbol"])
    quotes = lake.read(s.table_path("bronze_market_data"), columns=["seq", "symbol", "bid", "offer"])
    rt = [t / 1e6 for t in orders.column("receive_time").cast("int64").to_pylist()]
    ids = orders.column("order_id").to_pylist()
    receive_at = dict(zip(ids, rt))
    msgs = [(seq, "o", sym, 0.0, 0.0, oid) for seq, sym, oid in
            zip(orders.column("seq").to_pylist(), orders.column("symbol").to_pylist(), ids)]
    msgs += [(seq, "q", sym, bid, offer, None) for seq, sym, bid, offer in
             zip(*(quotes.column(c).to_pylist() for c in ("seq", "symbol", "bid", "offer")))]
    msgs.sort(key=lambda m: m[0])
    by_gateway_order = replay(m[1:] for m in msgs)
    table = s.table_path("order_rejections")
    rejected = lake.read(table, columns=["order_id"]).column("order_id").to_pylist() if lake.exists(table) else []
    return receive_at, by_gateway_order, rejected, len(ids), quotes.num_rows


def wait_caught_up(settings, timeout: float) -> float | None:
    """Seconds until `eventide status` shows every query of the home with nothing left to process
    (bronze runs on a longer trigger than the app: the tables are read after this); None on timeout."""
    from orchestration.status import compute_status

    start = time.time()
    while time.time() - start < timeout:
        st = compute_status(settings)
        # a log that could not be read (Kafka away) shows no lag: that is not caught up
        if st.queries and all(q.lag_messages == 0 for q in st.queries) and all(
                lg.open == 0 and not lg.error for lg in st.logs):
            return round(time.time() - start, 1)
        time.sleep(0.5)
    print("[latency] not caught up:", [(q.query, q.lag_messages) for q in st.queries], [(lg.log, lg.open) for lg in st.logs],
          file=sys.stderr)
    return None


def run_serve(workload: Workload, phases: list[Phase], say, drain_timeout: float = 30, final_timeout: float = 90,
              bursts: int = BURSTS, env_extra: dict[str, str] | None = None) -> dict:
    """`eventide serve` in a fresh home driven through the phases; `env_extra` adds to its environment
    (bench/kafka.py: EVENTIDE_LOG)."""
    tmp = Path(tempfile.mkdtemp(prefix="eventide-bench-latency-"))
    listener = Listener()
    pm, po = free_port(), free_port()
    env = {**SPARK_ENV, **os.environ, "EVENTIDE_HOME": str(tmp / "home"), "EVENTIDE_APPS": "examples.market:app",
           "EVENTIDE_PORTS": f"market_data={pm},orders={po}", "EVENTIDE_SINK_ORDER_RESULTS": listener.address,
           **(env_extra or {})}
    from transforms.settings import Settings

    settings = Settings.from_env(env)
    out: dict = {"trigger_interval_s": settings.trigger_interval, "segment_max_seconds": settings.segment_max_seconds,
                 "spark_master": settings.spark_master}
    started = time.time()
    serve = ServeProcess(env)
    try:
        line = serve.wait_for_line("all ", timeout=240)
        out["startup_s"] = round(time.time() - started, 1)
        say(f"serve: {line}")
        run = drive(workload, phases, (pm, po), listener, prime_timeout=180, drain_timeout=drain_timeout, say=say,
                    final_timeout=final_timeout, primed_bursts=bursts)
        if run.primed_bursts:
            out["primed_idle_bursts"] = run.primed_bursts
        out["caught_up_s"] = wait_caught_up(settings, timeout=final_timeout)
        say(f"serve: every query caught up {out['caught_up_s']} s after the answers")
        if bursts:
            out["idle_bursts"] = idle_bursts(workload, po, listener, run, bursts, say)
            wait_caught_up(settings, timeout=final_timeout)
    finally:
        rc = serve.stop()
        listener.close()
    out["exit_code"] = rc
    out["last_lines"] = [x for x in serve.output if x.startswith(("eventide serve", "gateway stopped"))]
    receive_at, by_gateway_order, table_ids, bronze_orders, bronze_quotes = read_bronze(tmp / "home")
    out["bronze_orders_rows"], out["bronze_market_data_rows"] = bronze_orders, bronze_quotes
    for ph in phases:
        if ph.measured:
            out[ph.name] = phase_report(ph, run, receive_at)
    expected = {i for ph in phases for i in ph.expected} | run.probes | run.burst_ids
    out["count_check"] = count_check(expected, listener.answers, table_ids)
    out["count_check"]["drained_before_stop"] = run.phase_stats[phases[-1].name]["drained"]
    out["count_check"]["gateway_order_replay_equal"] = by_gateway_order == expected
    out["answered_ids"] = {a[1] for a in listener.answers} - run.probes
    shutil.rmtree(tmp, ignore_errors=True)
    return out


# -- the limit: a plain Python loop on sockets --------------------------------------------------------
def loop_server(sink: str) -> None:
    """Reads both streams, decides, answers each rejected order on the sink socket. Runs until killed."""
    sel = selectors.DefaultSelector()
    for stream in ("market_data", "orders"):
        srv = socket.create_server(("127.0.0.1", 0))
        sel.register(srv, selectors.EVENT_READ, ("listen", stream, None))
    host, _, port = sink.rpartition(":")
    out_sock = socket.create_connection((host, int(port)))
    out_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ports = [k.fileobj.getsockname()[1] for k in sel.get_map().values()]
    print("ports", *ports, flush=True)
    state: dict[str, tuple[float, float, bool]] = {}
    frame = DEFAULT_FRAMING.encode
    while True:
        for key, _ in sel.select():
            kind, stream, dec = key.data
            if kind == "listen":
                conn, _ = key.fileobj.accept()
                sel.register(conn, selectors.EVENT_READ, ("conn", stream, DEFAULT_FRAMING.decoder()))
                continue
            data = key.fileobj.recv(1 << 16)
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                continue
            answers = []
            if stream == "market_data":
                for p in dec.feed(data):
                    m = parse_market_data(p)
                    state[m.symbol] = (m.bid, m.offer, rejects(m.bid, m.offer))
            else:
                for p in dec.feed(data):
                    o = parse_order(p)
                    bid, offer, reject = state.get(o.symbol, (0.0, 0.0, True))
                    if reject:
                        now = timestamp_10us(dt.datetime.now(dt.timezone.utc))
                        answers.append(frame(encode_order_result(OrderResult(
                            o.side, o.account, o.order_id, o.symbol, o.qty, o.price, bid, offer, now))))
            if answers:
                out_sock.sendall(b"".join(answers))


def run_loop_baseline(workload: Workload, phases: list[Phase], say) -> dict:
    listener = Listener()
    proc = subprocess.Popen([sys.executable, "-m", "bench.latency", "--loop-server", listener.address], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        ports = tuple(int(p) for p in proc.stdout.readline().split()[1:])
        run = drive(workload, phases, ports, listener, prime_timeout=30, drain_timeout=30, say=say)
    finally:
        proc.terminate()
        proc.wait(30)
        listener.close()
    out: dict = {}
    for ph in phases:
        if ph.measured:
            out[ph.name] = phase_report(ph, run, None)
    out["count_check"] = count_check({i for ph in phases for i in ph.expected} | run.probes, listener.answers)
    out["answered_ids"] = {a[1] for a in listener.answers} - run.probes
    return out


# -- where the time goes: gateway + Service in one process ------------------------------------------
DURATION_KEYS = ("latestOffset", "walCommit", "queryPlanning", "getBatch", "addBatch", "commitOffsets", "triggerExecution")


class _WriteTimer:
    """Times, in this process only, each query's foreachBatch call and its sink writers' `write` (wrapped
    on the classes; the engine's code is unchanged): what of addBatch is the Spark job and what the sinks."""

    def __init__(self):
        from transforms.engine import sinks

        self.records: list[tuple[float, str, str, float]] = []  # (start, query, part, seconds)
        self._wrap(sinks.BatchWriter, "__call__", lambda w: w.plan.name, lambda w: "foreachBatch")
        for cls, method in ((sinks.DeltaSinkWriter, "write"), (sinks.DeltaSinkWriter, "write_direct"),
                            (sinks.TCPSinkWriter, "send")):
            self._wrap(cls, method, lambda w: w.ctx.plan.name, lambda w: f"{type(w.sink).__name__}:{_sink_name(w.sink)}")
        self._wrap(sinks.QuarantineWriter, "write", lambda w: w.ctx.plan.name, lambda w: "quarantine")

    def _wrap(self, cls, method, query_of, part_of):
        original, records = getattr(cls, method), self.records

        def timed(w, *args, **kwargs):
            t0 = time.time()
            try:
                return original(w, *args, **kwargs)
            finally:
                records.append((t0, query_of(w), part_of(w), time.time() - t0))

        setattr(cls, method, timed)

    def means_ms(self, lo: float, hi: float) -> dict[str, dict[str, float]]:
        """Mean ms per call, by query and part, over the calls that started in [lo, hi]."""
        parts: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
        for t0, q, part, sec in self.records:
            if lo <= t0 <= hi:
                parts[q][part].append(sec)
        return {q: {p: round(statistics.mean(v) * 1e3) for p, v in d.items()} for q, d in parts.items()}


def _sink_name(sink) -> str:
    return getattr(sink, "table", None) or getattr(sink, "name", "?")


def breakdown(rate: int, seconds: float) -> dict:
    """Runs in its own process: the gateway and the queries in-process, one phase at `rate`; each query's
    mean durationMs over the batches with input during the phase, and the mean time of its foreachBatch
    call and of each sink writer in it. The sender shares this process (and its GIL) with the queries'
    Python side: the latency it sees is a little worse than under `eventide serve`."""
    tmp = Path(tempfile.mkdtemp(prefix="eventide-bench-latency-prof-"))
    listener = Listener()
    for k, v in SPARK_ENV.items():
        os.environ.setdefault(k, v)
    os.environ.update({"EVENTIDE_HOME": str(tmp / "home"), "EVENTIDE_APPS": "examples.market:app",
                       "EVENTIDE_SINK_ORDER_RESULTS": listener.address})
    from orchestration.service import Service
    from transforms.ingestion.gateway import GatewayThread
    from transforms.settings import Settings

    settings = Settings(home=tmp / "home", apps="examples.market:app", ports={"market_data": 0, "orders": 0})
    workload = Workload(seed=11)
    warm = workload.phase("warmup", rate, 3, measured=False)
    ph = workload.phase("profiled", rate, seconds)
    expected_for(workload, [warm, ph])
    timer = _WriteTimer()
    gw = GatewayThread(settings).start()
    svc = Service(settings, say=lambda line: None).start()
    try:
        if not svc.all_running.wait(240):
            raise RuntimeError(f"the queries did not start: {svc.error}")
        ports = gw.bound_ports
        run = drive(workload, [warm, ph], (ports["market_data"], ports["orders"]), listener, 180, 60, lambda s: None)
        t = run.phase_stats["profiled"]
        lo, hi = t["send_started"], t["send_ended"]
        queries = {}
        for q in svc.queries:
            batches = [p for p in q.query.recentProgress if p["numInputRows"] > 0
                       and lo <= dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() <= hi]
            if not batches:
                continue
            starts = [dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() for p in batches]
            queries[q.name] = {
                "batches": len(batches),
                "rows_per_batch": round(statistics.mean(p["numInputRows"] for p in batches), 1),
                "batch_every_s": round((starts[-1] - starts[0]) / (len(starts) - 1), 2) if len(starts) > 1 else None,
                **{f"{k}_ms": round(statistics.mean(p["durationMs"].get(k, 0) for p in batches))
                   for k in DURATION_KEYS},
            }
    finally:
        svc.stop()
        gw.stop()
        listener.close()
    receive_at = read_bronze(tmp / "home")[0]
    rep = phase_report(ph, run, receive_at)
    shutil.rmtree(tmp, ignore_errors=True)
    for q, parts in timer.means_ms(lo, hi).items():
        queries.setdefault(q, {}).update({f"python_{p}_ms": v for p, v in parts.items()})
    return {"rate": rate, "seconds": seconds, "latency_from_gateway_receipt_ms": rep["latency_from_gateway_receipt_ms"],
            "trigger_interval_s": settings.trigger_interval, "segment_max_seconds": settings.segment_max_seconds,
            "queries": queries}


def run_breakdown(rate: int, seconds: float) -> dict:
    env = {**SPARK_ENV, **os.environ}
    proc = subprocess.run([sys.executable, "-m", "bench.latency", "--breakdown", str(rate), str(seconds)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"breakdown failed (exit {proc.returncode}): {proc.stderr[-2000:]}")


# -- the benchmark -------------------------------------------------------------------------------------
def _flat(prefix: str, d: dict, out: dict) -> None:
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("latency_from_gateway_receipt_ms", "latency_from_send_ms",
                                             "gateway_receipt_minus_send_ms", "count_check"):
            _flat(f"{prefix}{k}_", v, out)
        else:
            out[f"{prefix}{k}"] = v


def bench_latency(results: dict, rates=(1000, 10_000), seconds: float = 60, loop_seconds: float | None = None,
                  warmup_seconds: float = 5, breakdown_seconds: float = 15, seed: int = 7, say=None,
                  bursts: int = BURSTS) -> dict:
    """Fills `results` (flat keys, as the other benchmarks) and returns the nested form."""
    def log(msg):
        (say or (lambda m: print(f"[latency] {m}", file=sys.stderr, flush=True)))(msg)

    loop_seconds = seconds if loop_seconds is None else loop_seconds
    load_start = os.getloadavg()
    workload = Workload(seed)
    phases = [workload.phase("warmup", rates[0], warmup_seconds, measured=False)]
    phases += [workload.phase(f"rate_{r}", r, seconds) for r in rates]
    expected = expected_for(workload, phases)
    # The loop gets the same bytes, cut to its own duration (each symbol's class is fixed: the
    # decisions of a prefix do not depend on what follows).
    loop_phases = []
    for ph in phases:
        keep = ph.ticks if not ph.measured else ph.ticks[: round(loop_seconds / TICK_S)]
        cut = Phase(ph.name, ph.rate, len(keep) * TICK_S, ph.measured, keep)
        ids = {i for t in keep for i in t[2]}
        cut.expected, cut.orders, cut.quotes = ph.expected & ids, len(ids), sum(t[3] for t in keep)
        loop_phases.append(cut)
    log(f"workload: {sum(p.quotes + p.orders for p in phases)} messages, {len(expected)} expected rejections")

    t = time.time()
    serve = run_serve(workload, phases, log, drain_timeout=20, final_timeout=90, bursts=bursts)
    serve["wall_s"] = round(time.time() - t, 1)
    log(f"serve done in {serve['wall_s']} s")
    t = time.time()
    loop = run_loop_baseline(workload, loop_phases, log)
    loop["wall_s"] = round(time.time() - t, 1)
    log(f"loop done in {loop['wall_s']} s")
    # Same decisions: over the orders both were sent, the same ids rejected.
    sent_to_loop = {i for ph in loop_phases for t in ph.ticks for i in t[2]}
    serve_ids, loop_ids = serve.pop("answered_ids"), loop.pop("answered_ids")
    same = (serve_ids & sent_to_loop) == loop_ids
    log(f"same rejections as the loop: {same} ({len(serve_ids & sent_to_loop)} and {len(loop_ids)} order ids)")
    bd = None
    if breakdown_seconds:
        t = time.time()
        try:
            bd = run_breakdown(rates[0], breakdown_seconds)
        except Exception as e:  # noqa: BLE001 - the main numbers stand without it
            bd = {"error": str(e)[-500:]}
        bd["wall_s"] = round(time.time() - t, 1)
    nested = {"rates": list(rates), "phase_seconds": seconds, "loop_phase_seconds": loop_seconds, "order_share": ORDER_SHARE,
              "tick_ms": TICK_S * 1e3, "serve": serve, "loop": loop, "same_rejections_as_loop": same,
              "breakdown": bd, "load_average_at_start": [round(x, 2) for x in load_start],
              "load_average_at_end": load_average()}
    flat: dict = {}
    _flat("", {k: v for k, v in nested.items() if k not in ("serve", "loop", "breakdown")}, flat)
    _flat("serve_", serve, flat)
    _flat("loop_", loop, flat)
    if bd:
        _flat("breakdown_", bd, flat)
    results.update(flat)
    ok = serve["count_check"]["ok"] and serve["count_check"]["gateway_order_replay_equal"] and loop["count_check"]["ok"] and same
    results["verified"] = ok
    if not ok:
        raise AssertionError(f"latency: counts or answers disagree: serve {serve['count_check']}, "
                             f"loop {loop['count_check']}, same rejections as the loop: {same}")
    return nested


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1000,10000")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--loop-seconds", type=float, default=30)
    p.add_argument("--breakdown-seconds", type=float, default=15)
    p.add_argument("--quick", action="store_true", help="10 s at 1,000 msgs/s only")
    p.add_argument("--loop-server", metavar="SINK", help=argparse.SUPPRESS)
    p.add_argument("--breakdown", nargs=2, metavar=("RATE", "SECONDS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.loop_server:
        with contextlib.suppress(KeyboardInterrupt):
            loop_server(args.loop_server)
        return 0
    if args.breakdown:
        print(json.dumps(breakdown(int(args.breakdown[0]), float(args.breakdown[1]))), flush=True)
        return 0
    results: dict = {}
    if args.quick:
        bench_latency(results, rates=(1000,), seconds=10, warmup_seconds=2, breakdown_seconds=5, bursts=3)
    else:
        bench_latency(results, rates=tuple(int(r) for r in args.rates.split(",")), seconds=args.seconds,
                      loop_seconds=args.loop_seconds, breakdown_seconds=args.breakdown_seconds)
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
