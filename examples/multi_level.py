"""Windows into windows: Wallaroo's correctness app `multi_aggregation` as one Eventide pipeline. Per
key, 50 ms event-time sums of the events' data, then 1 s sums of those sums. Not registered by default:
`--app examples.multi_level:app`.

    eventide ingest events data/wallaroo/multi_aggregation/_events1.msg --lines --app examples.multi_level:app
    eventide run --app examples.multi_level:app
    EVENTIDE_APPS=examples.multi_level:app eventide show event_totals

An event is 12 ASCII bytes `TTTTDDDDKKKK` (Wallaroo's EventDecoder): its time in ms, its data, its key.
The pipeline keys by the event's key, and the second window step keeps that key (a state computation
right after another starts the next level under the same key; `.key_by(...)` between them would key
again). Each 50 ms window's result (a `WindowResult`) is a message of the 1 s windows, whose event time
is the last millisecond the 50 ms window covers (`last_ms`, Wallaroo's window end). A key quiet for
`idle_close_ms` of wall clock has its open windows closed, level by level (Wallaroo closes them when its
source times out): under `eventide serve` within about a second, under `eventide run` in the first
run after they are due (a 50 ms window closed so reaches its 1 s window, which closes in a later run).

Each 1 s window is a row of `event_totals`: its bounds, the sum of the data (`data`), how many 50 ms
windows (`windows`) and events (`events`) it holds, and `t`, its last millisecond, as Wallaroo prints it;
with `EVENTIDE_SINK_EVENT_TOTALS_TCP=HOST:PORT` the same results also go out as Wallaroo's sink sent them
(`t=...,data=...,key=...`, framed). Wallaroo's windows start where its first watermark fell, Eventide's
are aligned to the epoch: for Wallaroo's test inputs the sums agree (10, then 24), `t` does not (5999
and 6999 here, 6049 and 7099 there). See tests/windows/test_levels.py.
"""

from __future__ import annotations

import pyarrow as pa

from transforms.api import Application, DeltaSink, Reject, TCPSink, decoder, encoder, source
from transforms.windowing import event_time_windows
from windows import Aggregator, WindowResult

EVENT_SCHEMA = pa.schema([("ms", pa.int64()), ("data", pa.int64()), ("key", pa.string())])
TOTALS_SCHEMA = pa.schema([("key", pa.string()), ("start_ms", pa.int64()), ("end_ms", pa.int64()),
                           ("t", pa.int64()), ("data", pa.int64()), ("windows", pa.int64()),
                           ("events", pa.int64()), ("close_reason", pa.string())])
IDLE_CLOSE_MS = 5_000


@decoder(schema=EVENT_SCHEMA)
def decode_event(payload: bytes):
    text = payload.decode("ascii", errors="replace").strip()
    if len(text) != 12 or not text[:8].isdigit():
        return Reject(f"expected 12 bytes TTTTDDDDKKKK (4 digits of ms, 4 of data, a 4-byte key), got {text!r}")
    return {"ms": int(text[:4]), "data": int(text[4:8]), "key": text[8:]}


# 50 ms: the sum of the events' data. 1 s: the sum of those sums and how many events they hold.
data_sum = Aggregator(create=int, add=lambda acc, event: acc + event["data"])
sum_of_sums = Aggregator(create=lambda: (0, 0), add=lambda acc, w: (acc[0] + w.value, acc[1] + w.size))


def last_ms(w: WindowResult) -> int:
    """A 50 ms window's event time in the 1 s windows: its last millisecond (Wallaroo's window end)."""
    return w.end_ms - 1


def total_row(w: WindowResult) -> dict:
    data, events = w.value
    return {"key": w.key, "start_ms": w.start_ms, "end_ms": w.end_ms, "t": w.end_ms - 1, "data": data,
            "windows": w.size, "events": events, "close_reason": str(w.close_reason)}


@encoder
def wallaroo_line(row: dict) -> bytes:
    """Wallaroo's EventEncoder: `t=<ms>,data=<sum>,key=<key>` and a newline (the sink frames it)."""
    return f"t={row['t']},data={row['data']},key={row['key']}\n".encode()


def multi_aggregation(idle_close_ms: int = IDLE_CLOSE_MS) -> Application:
    return Application(
        "multi_aggregation",
        source("events", decoder=decode_event)
        .key_by("key")
        .to(event_time_windows(50, event_time="ms", idle_close_ms=idle_close_ms).over(data_sum))
        .to(event_time_windows(1_000, event_time=last_ms, idle_close_ms=idle_close_ms).over(sum_of_sums)
            .emit(total_row))
        .to_sink(DeltaSink("event_totals", schema=TOTALS_SCHEMA),
                 TCPSink("event_totals_tcp", wallaroo_line, framed=True, optional=True)),
        description="windows into windows: per key 50 ms event-time sums, then 1 s sums of those",
    )


app = multi_aggregation()
