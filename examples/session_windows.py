"""Session windows: each user's visits (page views less than 30 minutes apart) with their pages and
length. Not registered by default: `--app examples.session_windows:app`.

    eventide ingest clicks clicks.txt --app examples.session_windows:app   # lines "USER,EPOCH_MS,PAGE"
    eventide run --app examples.session_windows:app
    EVENTIDE_APPS=examples.session_windows:app eventide show visits

Event time with 5 minutes of allowed lateness: a late click within that bridges two visits into one;
a later one goes to the `late_clicks` table. Under `eventide serve` a user quiet for 10 minutes of wall
clock has their visit closed (reason `idle`) without waiting for their next click.
"""

from __future__ import annotations

import pyarrow as pa

from transforms.api import Application, DeltaSink, Reject, decoder, source
from transforms.windowing import session_windows
from windows import Aggregator, LateEvent, WindowResult, late_event_schema

GAP_MS = 30 * 60_000
CLICK_SCHEMA = pa.schema([("user", pa.string()), ("ms", pa.int64()), ("page", pa.string())])
VISITS_SCHEMA = pa.schema([("user", pa.string()), ("start_ms", pa.int64()), ("end_ms", pa.int64()),
                           ("clicks", pa.int64()), ("pages", pa.int64()), ("close_reason", pa.string())])


@decoder(schema=CLICK_SCHEMA)
def decode_click(payload: bytes):
    user, ms, page = payload.decode().strip().split(",", 2)
    if not user:
        return Reject("expected a user before the first comma, got an empty one")
    return {"user": user, "ms": int(ms), "page": page}


# The set of pages seen: merging two visits is the union, so the order clicks arrive in does not matter.
pages = Aggregator(create=lambda: (0, frozenset()), add=lambda acc, c: (acc[0] + 1, acc[1] | {c["page"]}),
                   merge=lambda a, b: (a[0] + b[0], a[1] | b[1]))


def visit_row(w: WindowResult) -> dict:
    clicks, seen = w.value
    return {"user": w.key, "start_ms": w.start_ms, "end_ms": w.end_ms, "clicks": clicks, "pages": len(seen),
            "close_reason": str(w.close_reason)}


app = Application(
    "visits",
    source("clicks", decoder=decode_click)
    .key_by("user")
    .to(session_windows(GAP_MS, event_time="ms", allowed_lateness_ms=5 * 60_000, late="route",
                        idle_close_ms=10 * 60_000).over(pages).emit(visit_row))
    .to_sink(DeltaSink("visits", schema=VISITS_SCHEMA, accepts=dict),
             DeltaSink("late_clicks", schema=late_event_schema(), accepts=LateEvent)),
    description="session windows: each user's visits, clicks less than 30 minutes apart",
)
