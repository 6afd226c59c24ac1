"""Decoding Apache Common Log Format lines (any method, also the request "-"), LF or CRLF.

A payload equal to the marker (`END_OF_DAY` by default, trailing CR/LF ignored) decodes to a marker
record, not a log line. Anything else that does not parse is refused (a `Reject` with the reason: what
was expected, what came), and the engine quarantines it.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from transforms.api import Reject, decoder
from transforms.settings import get_settings

# One set of patterns for both forms, in explicit ASCII classes: Python's \S and \d are Unicode-aware,
# RE2's (pyarrow compute) are not, and Python's int() accepts " 5" or "5\t".
_TOKEN = r"[^\t\n\f\r ]+"
_CLF = re.compile(
    rf'^(?P<host>{_TOKEN}) (?P<ident>{_TOKEN}) (?P<user>{_TOKEN}) \[(?P<ts>[^\]]+)\] "(?P<request>[^"]*)" '
    r"(?P<status>[0-9]{3}) (?P<bytes>[0-9]+|-)$"
)
_TIME_FORM = r"[0-9]{2}/[A-Z][a-z]{2}/[0-9]{4}:[0-9]{2}:[0-9]{2}:[0-9]{2} [+-][0-9]{4}"
_CLF_TIME = re.compile(rf"^{_TIME_FORM}$")
# The lines _CLF and _CLF_TIME (on its timestamp) accept together, as one pattern with no groups: the column
# form only tests it (RE2's match-only automaton; extracting groups took 5x longer) and splits the line,
# since that timestamp's fixed width and the tokens without spaces say where each field is.
_CLF_WELL_FORMED = rf'^{_TOKEN} {_TOKEN} {_TOKEN} \[{_TIME_FORM}\] "[^"]*" [0-9]{{3}} (?:[0-9]+|-)$'
_WELL_FORMED_STAND_IN = '- - - [01/Jan/2000:00:00:00 +0000] "-" 200 -'
_REQUEST = rf"^(?P<method>{_TOKEN}) (?P<path>{_TOKEN})(?: (?P<protocol>{_TOKEN}))?$"
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
_WITH_ERROR = LOG_SCHEMA.append(pa.field("_error", pa.string()))
_MAX_BYTES = 2**63 - 1  # the bytes column is int64


# Reasons say what was expected and what came: "log line: expected <what>, got <what came>".
_CLF_FORM = 'host ident user [dd/Mon/yyyy:HH:MM:SS +zzzz] "request" status bytes'


def parse_clf_time(text: str) -> tuple[dt.datetime, dt.date]:
    """`07/Mar/2004:16:05:49 -0800` -> (UTC instant, the local calendar day as written)."""
    bad = f"expected a timestamp [dd/Mon/yyyy:HH:MM:SS +zzzz], got [{text}]"
    if not _CLF_TIME.match(text):
        raise ValueError(bad)
    try:
        day_s, mon_s, rest = text.split("/", 2)
        year_s, hh, mm, ss_zone = rest.split(":", 3)
        ss, zone = ss_zone.split(" ")
        local = dt.datetime(int(year_s), _MONTHS[mon_s], int(day_s), int(hh), int(mm), int(ss))
        sign = -1 if zone[0] == "-" else 1
        offset = dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[3:5])) * sign
    except (ValueError, KeyError, IndexError):
        raise ValueError(bad) from None
    try:
        utc = (local - offset).replace(tzinfo=dt.timezone.utc)
    except OverflowError:  # 31/Dec/9999 23:59 -0800 is in year 10000 in UTC
        raise ValueError(f"expected a timestamp whose UTC time is within the years 1-9999, got [{text}]") from None
    return utc, local.date()


def parse_log_line(line: str, marker: str = "END_OF_DAY") -> LogRecord:
    """The record, or ValueError saying what was expected and what came."""
    if not line:
        raise ValueError(f"expected a Common Log Format line or the marker {marker!r}, got an empty payload (0 bytes)")
    line = line.rstrip("\r\n")
    if line == marker:
        return LogRecord("marker")
    m = _CLF.match(line)
    if not m:
        raise ValueError(f"expected a Common Log Format line ({_CLF_FORM}) or the marker {marker!r}, "
                         f"got {line[:200]!r}")
    ts, day = parse_clf_time(m["ts"])
    request = m["request"]
    method = path = protocol = None
    if request != "-":
        r = re.match(_REQUEST, request)  # "GET / HTTP/1.0", or HTTP/0.9's "GET /"
        if not r:
            raise ValueError(f'expected a request "METHOD PATH [PROTOCOL]" or "-", got "{request[:200]}"')
        method, path, protocol = r["method"], r["path"], r["protocol"]
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
        bytes=None if m["bytes"] == "-" else _byte_count(m["bytes"]),
    )


def _byte_count(text: str) -> int:
    n = int(text)
    if n > _MAX_BYTES:
        raise ValueError(f"expected a byte count up to {_MAX_BYTES}, got {text[:40]}")
    return n


def decode_log_payload(payload: bytes, marker: str) -> LogRecord | Reject:
    """One payload: its record, or a Reject with the reason (no traceback: the column form's words too)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        return Reject(f"log line: expected UTF-8 text, got byte 0x{payload[e.start]:02x} at offset {e.start}")
    try:
        return parse_log_line(text, marker)
    except ValueError as e:
        return Reject(f"log line: {e}")


@decoder(header_length=4, length_fmt=">I", schema=LOG_SCHEMA)
def decode_log_line(payload: bytes) -> LogRecord | Reject:
    return decode_log_payload(payload, get_settings().marker)


# -- the same decoder over a whole column, with pyarrow compute (C++), for speed -------------------------


def _null_if(arr: pa.Array, value: str) -> pa.Array:
    import pyarrow.compute as pc

    return pc.if_else(pc.equal(arr, value), pa.scalar(None, arr.type), arr)


_MONTH_NAMES = pa.array(list(_MONTHS))
# The instants `datetime` holds (years 1-9999), in microseconds since 1970.
_FIRST_UTC_US, _LAST_UTC_US = -62_135_596_800_000_000, 253_402_300_799_999_999
_DAYS_IN_MONTH = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])


def _local_time(ts: pa.Array) -> pa.Array:
    """The local time of `dd/Mon/yyyy:HH:MM:SS ...` stamps (digits where the line pattern says) as
    timestamp[us], null where `datetime` refuses it as `parse_clf_time` does (an unknown month, 31/Apr,
    29/Feb of a common year, year 0, hour 24, second 60). Integer arithmetic on the fields: Arrow's
    strptime took 3x longer and accepted all of those, rolling them over into the next day or minute."""
    import pyarrow.compute as pc

    def number(start: int, stop: int) -> np.ndarray:
        return pc.cast(pc.utf8_slice_codeunits(ts, start, stop), pa.int64()).to_numpy(zero_copy_only=False)

    day, year, hour, minute, second = number(0, 2), number(7, 11), number(12, 14), number(15, 17), number(18, 20)
    month_index = pc.index_in(pc.utf8_slice_codeunits(ts, 3, 6), value_set=_MONTH_NAMES)
    known = month_index.is_valid().to_numpy(zero_copy_only=False)
    month = pc.fill_null(month_index, 0).to_numpy(zero_copy_only=False).astype(np.int64) + 1
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    last_day = _DAYS_IN_MONTH[month - 1] + ((month == 2) & leap)
    valid = known & (year >= 1) & (day >= 1) & (day <= last_day) & (hour <= 23) & (minute <= 59) & (second <= 59)
    # Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    y = year - (month <= 2)
    era = y // 400
    of_era = y - era * 400
    of_year = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    days = era * 146097 + of_era * 365 + of_era // 4 - of_era // 100 + of_year - 719468
    micros = (days * 86_400 + hour * 3_600 + minute * 60 + second) * 1_000_000
    return pa.array(micros, pa.timestamp("us"), mask=~valid)


def decode_log_column(payloads: pa.Array, marker: str) -> pa.Table:
    """`decode_log_payload` for a column of payloads: LOG_SCHEMA columns plus `_error` (None when decoded).

    Equal to the one-line form row for row, reasons included (tests hold them together): rows it cannot
    handle vectorized (invalid UTF-8) and the rows it refuses go through the one-line form.
    """
    import pyarrow.compute as pc

    try:
        text = payloads.cast(pa.string())
    except pa.ArrowInvalid:  # some payload is not UTF-8: decode row by row, the slow and exact way
        return _decode_rows(payloads, marker)
    line = pc.utf8_rtrim(text, "\r\n")
    is_marker = pc.equal(line, marker)
    well_formed = pc.fill_null(pc.match_substring_regex(line, _CLF_WELL_FORMED), False)
    # Split well-formed lines only (a stand-in for the others, whose fields are masked out below):
    # host ident user, then from the right: bytes, status and "[timestamp] \"request\"".
    split = pc.split_pattern(pc.if_else(well_formed, line, _WELL_FORMED_STAND_IN), " ", max_splits=3)
    host, ident, user, rest = (pc.list_element(split, i) for i in range(4))
    split = pc.split_pattern(rest, " ", max_splits=2, reverse=True)
    stamped, status, size = (pc.list_element(split, i) for i in range(3))
    ts = pc.utf8_slice_codeunits(stamped, 1, 27)  # [dd/Mon/yyyy:HH:MM:SS +zzzz]: 26 characters
    request = pc.utf8_slice_codeunits(stamped, 30, -1)  # after '] "', up to the closing quote
    req = pc.extract_regex(request, _REQUEST)
    local = _local_time(ts)
    zone = pc.utf8_slice_codeunits(ts, 21, 26)
    sign = pc.if_else(pc.equal(pc.utf8_slice_codeunits(zone, 0, 1), "-"), -1, 1)
    minutes = pc.add(
        pc.multiply(pc.cast(pc.utf8_slice_codeunits(zone, 1, 3), pa.int64()), 60),
        pc.cast(pc.utf8_slice_codeunits(zone, 3, 5), pa.int64()),
    )
    utc = pc.subtract(pc.cast(local, pa.int64()), pc.multiply(pc.multiply(sign, minutes), 60_000_000))
    dash_request = pc.equal(request, "-")
    request_ok = pc.or_(dash_request, req.is_valid())
    # Up to 18 digits always fit int64; a longer byte count goes to the one-line form, which decides.
    size_fits = pc.less_equal(pc.utf8_length(size), 18)
    in_years = pc.fill_null(pc.and_(pc.greater_equal(utc, _FIRST_UTC_US), pc.less_equal(utc, _LAST_UTC_US)), False)
    ok_line = pc.and_(pc.and_(pc.and_(well_formed, request_ok), in_years), size_fits)  # never null
    is_line = pc.and_(pc.invert(is_marker), ok_line)

    def on_lines(arr: pa.Array) -> pa.Array:
        return pc.if_else(is_line, arr, pa.scalar(None, arr.type))

    method = pc.if_else(dash_request, pa.scalar(None, pa.string()), req.field("method"))
    path = pc.if_else(dash_request, pa.scalar(None, pa.string()), req.field("path"))
    protocol = pc.if_else(dash_request, pa.scalar(None, pa.string()), _null_if(req.field("protocol"), ""))
    columns = {
        "kind": pc.if_else(is_marker, "marker", pc.if_else(is_line, "line", pa.scalar(None, pa.string()))),
        "host": on_lines(host),
        "ident": on_lines(_null_if(ident, "-")),
        "user": on_lines(_null_if(user, "-")),
        "timestamp": on_lines(pc.cast(utc, pa.timestamp("us", tz="UTC"))),
        "day": on_lines(pc.cast(local, pa.date32())),
        "method": on_lines(method),
        "path": on_lines(path),
        "protocol": on_lines(protocol),
        "status": pc.cast(on_lines(status), pa.int32()),
        "bytes": pc.cast(_null_if(on_lines(size), "-"), pa.int64()),
        "_error": pa.nulls(len(payloads), pa.string()),
    }
    table = pa.table(columns, schema=_WITH_ERROR)
    refused = pc.invert(pc.fill_null(pc.or_(is_marker, ok_line), True)).to_numpy(zero_copy_only=False)
    if not refused.any():
        return table
    # Refused lines are rare: the one-line form says why, in its own words.
    redo, keep = np.nonzero(refused)[0], np.nonzero(~refused)[0]
    parts = pa.concat_tables([table.take(pa.array(keep)), _decode_rows(payloads.take(pa.array(redo)), marker)])
    return parts.take(pa.array(np.argsort(np.concatenate([keep, redo]), kind="stable")))


def _decode_rows(payloads: pa.Array, marker: str) -> pa.Table:
    rows = []
    for p in payloads.to_pylist():
        out = decode_log_payload(p, marker)
        rows.append({"kind": None, "_error": out.reason} if isinstance(out, Reject) else {**out.__dict__, "_error": None})
    return pa.Table.from_pylist(rows, schema=_WITH_ERROR)


@decode_log_line.column_form
def decode_log_lines(payloads: pa.Array) -> pa.Table:
    return decode_log_column(payloads, get_settings().marker)
