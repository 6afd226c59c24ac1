"""The Bytewax 0.21 flow of the `sessions` benchmark (bench/sessions.py): session windows per key.

Reads the "key,event_ms,value" lines the harness wrote (one worker, no recovery) and folds each key's
sessions with `fold_window` over `SessionWindower` and an `EventClock`, then writes three files in `out`:
`sessions.txt` ("key<TAB>window_id<TAB>count<TAB>sum" per closed session), `meta.txt`
("key<TAB>window_id<TAB>open_ms<TAB>close_ms", Bytewax's own bounds: first and last event) and
`late.txt` ("key<TAB>event_ms" per late event). The harness joins the first two by window id.

Made to decide exactly as Eventide's `session_windows(gap_ms, allowed_lateness_ms=L)`:

- Bytewax joins an event to a session when it is at most `gap` from it, Eventide when less than `gap_ms`
  (its session is `[first, last + gap_ms)`); on integer milliseconds that is `gap = gap_ms - 1 ms`.
- The clock's `now_getter` is frozen and it asks for no wake-ups (`to_system_utc` returns None), so the
  watermark is the key's latest event time minus `wait_for_system_duration = L`, as Eventide's: a replay
  of a file, deterministic (the system clock would move the watermark by however long the run took).
  Both then call an event late when it is older than the watermark before it arrived, and close a session
  once the watermark reaches its last event + `gap_ms`. At the end of input Bytewax closes every session.

    python -m bytewax.run "bench/sessions_bytewax.py:sessions_flow('/tmp/in.csv', '/tmp/out', 1800000, 300000)"

Only the standard library and bytewax are imported: the flow's process start is Bytewax's own.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import bytewax.operators as op
from bytewax.connectors.files import FileSource
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, SessionWindower, fold_window

from bench.bytewax_sinks import BATCH, LinesSink

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
FROZEN_NOW = datetime(2000, 1, 1, tzinfo=timezone.utc)
MS = timedelta(milliseconds=1)


def decode(line: str) -> tuple[str, int, int]:
    key, ms, value = line.split(",")
    return key, int(ms), int(value)


def event_time(event: tuple[str, int, int]) -> datetime:
    return EPOCH + event[1] * MS


def to_ms(t: datetime) -> int:
    return (t - EPOCH) // MS


def add(acc: tuple[int, int], event: tuple[str, int, int]) -> tuple[int, int]:
    return acc[0] + 1, acc[1] + event[2]


def merge(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] + b[0], a[1] + b[1]


def sessions_flow(inp: str, out: str, gap_ms: int, allowed_lateness_ms: int) -> Dataflow:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    flow = Dataflow("bench_sessions")
    events = op.map("decode", op.input("read", flow, FileSource(inp, batch_size=BATCH)), decode)
    keyed = op.key_on("by_key", events, lambda e: e[0])
    clock = EventClock(event_time, wait_for_system_duration=allowed_lateness_ms * MS,
                       now_getter=lambda: FROZEN_NOW, to_system_utc=lambda _t: None)
    windows = fold_window("sessions", keyed, clock, SessionWindower(gap=(gap_ms - 1) * MS),
                          lambda: (0, 0), add, merge)
    op.output("values", op.map("value_line", windows.down, lambda kv: f"{kv[0]}\t{kv[1][0]}\t{kv[1][1][0]}\t{kv[1][1][1]}"),
              LinesSink(out_dir / "sessions.txt"))
    op.output("meta", op.map("meta_line", windows.meta, lambda kv: f"{kv[0]}\t{kv[1][0]}\t{to_ms(kv[1][1].open_time)}"
                                                                   f"\t{to_ms(kv[1][1].close_time)}"),
              LinesSink(out_dir / "meta.txt"))
    op.output("late", op.map("late_line", windows.late, lambda kv: f"{kv[0]}\t{kv[1][1][1]}"),
              LinesSink(out_dir / "late.txt"))
    return flow
