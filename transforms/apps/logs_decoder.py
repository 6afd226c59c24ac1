"""Decoding Apache Common Log Format lines (any method, also the request "-"), LF or CRLF.

A payload equal to the marker (`END_OF_DAY` by default, trailing CR/LF ignored) decodes to a marker
record, not a log line. Anything else that does not parse raises, and the engine quarantines it.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

import pyarrow as pa

from transforms.api import decoder
from transforms.settings import get_settings

_CLF = re.compile(
    r'^(?P<host>\S+) (?P<ident>\S+) (?P<user>\S+) \[(?P<ts>[^\]]+)\] "(?P<request>[^"]*)" (?P<status>\d{3}) (?P<bytes>\d+|-)$'
)
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}


@dataclass
class LogRecord:
    kind: str  # "line" or "marker"
    host: str | None = None
    ident: str | None = None
    user: str | None = None
    timestamp: dt.datetime | None = None  # UTC
    day: dt.date | None = None  # the calendar day as written in the line (its own time zone)
    method: str | None = None
    path: str | None = None
    protocol: str | None = None
    status: int | None = None
    bytes: int | None = None

    @property
    def is_marker(self) -> bool:
        return self.kind == "marker"


LOG_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("host", pa.string()),
        ("ident", pa.string()),
        ("user", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
        ("method", pa.string()),
        ("path", pa.string()),
        ("protocol", pa.string()),
        ("status", pa.int32()),
        ("bytes", pa.int64()),
    ]
)


def parse_clf_time(text: str) -> tuple[dt.datetime, dt.date]:
    """`07/Mar/2004:16:05:49 -0800` -> (UTC instant, the local calendar day as written)."""
    try:
        day_s, mon_s, rest = text.split("/", 2)
        year_s, hh, mm, ss_zone = rest.split(":", 3)
        ss, zone = ss_zone.split(" ")
        local = dt.datetime(int(year_s), _MONTHS[mon_s], int(day_s), int(hh), int(mm), int(ss))
        sign = -1 if zone[0] == "-" else 1
        offset = dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[3:5])) * sign
    except (ValueError, KeyError, IndexError):
        raise ValueError(f"bad timestamp [{text}]") from None
    utc = (local - offset).replace(tzinfo=dt.timezone.utc)
    return utc, local.date()


def parse_log_line(line: str, marker: str = "END_OF_DAY") -> LogRecord:
    line = line.rstrip("\r\n")
    if line == marker:
        return LogRecord("marker")
    m = _CLF.match(line)
    if not m:
        raise ValueError(f"not a Common Log Format line: {line[:200]!r}")
    ts, day = parse_clf_time(m["ts"])
    request = m["request"]
    method = path = protocol = None
    if request != "-":
        parts = request.split(" ")
        if len(parts) == 3:
            method, path, protocol = parts
        elif len(parts) == 2:  # HTTP/0.9 style: "GET /"
            method, path = parts
        else:
            raise ValueError(f"bad request field {request!r} in {line[:200]!r}")
    return LogRecord(
        "line",
        host=m["host"],
        ident=None if m["ident"] == "-" else m["ident"],
        user=None if m["user"] == "-" else m["user"],
        timestamp=ts,
        day=day,
        method=method,
        path=path,
        protocol=protocol,
        status=int(m["status"]),
        bytes=None if m["bytes"] == "-" else int(m["bytes"]),
    )


@decoder(header_length=4, length_fmt=">I", schema=LOG_SCHEMA)
def decode_log_line(payload: bytes) -> LogRecord:
    return parse_log_line(payload.decode("utf-8"), get_settings().marker)
