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
# The lines the one-line form accepts (_CLF, _CLF_TIME on its timestamp, _REQUEST on its request), as one
# pattern with no groups: the column form only tests it (RE2's match-only automaton; extracting groups took
# 5x longer) and splits the line, since that timestamp's fixed width and the tokens without spaces say
# where each field is. Inside the quotes a token cannot hold a quote, so _REQUEST's tokens lose it here.
_REQUEST_TOKEN = r'[^\t\n\f\r "]+'
_REQUEST_FORM = rf"(?:-|{_REQUEST_TOKEN} {_REQUEST_TOKEN}(?: {_REQUEST_TOKEN})?)"
_CLF_WELL_FORMED = rf'^{_TOKEN} {_TOKEN} {_TOKEN} \[{_TIME_FORM}\] "{_REQUEST_FORM}" [0-9]{{3}} (?:[0-9]+|-)$'
_WELL_FORMED_STAND_IN = '- - - [01/Jan/2000:00:00:00 +0000] "- - -" 200 -'
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


# The instants `datetime` holds (years 1-9999), in microseconds since 1970.
_FIRST_UTC_US, _LAST_UTC_US = -62_135_596_800_000_000, 253_402_300_799_999_999
_DAYS_IN_MONTH = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])
# A month's three letters as one number, sorted, and the month each stands for (0-11).
_MONTH_CODES = np.array([int.from_bytes(m.encode(), "big") for m in _MONTHS])
_MONTH_ORDER = np.argsort(_MONTH_CODES)
_SORTED_MONTH_CODES = _MONTH_CODES[_MONTH_ORDER]
_STAMP_WIDTH = 26  # dd/Mon/yyyy:HH:MM:SS +zzzz


def _stamp_bytes(stamps: pa.Array) -> np.ndarray:
    """The bytes of stamps that are each _STAMP_WIDTH bytes long, one row each (a view, no copy)."""
    n = len(stamps)
    if n == 0:
        return np.zeros((0, _STAMP_WIDTH), np.uint8)
    offsets = np.frombuffer(stamps.buffers()[1], np.int32, n + 1, stamps.offset * 4)
    if np.any(np.diff(offsets) != _STAMP_WIDTH):
        raise ValueError("stamps of another width than 26 bytes")  # the caller passes well-formed ones only
    return np.frombuffer(stamps.buffers()[2], np.uint8, n * _STAMP_WIDTH, offsets[0]).reshape(n, _STAMP_WIDTH)


def _stamp_times(stamps: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(UTC, local time, valid) of `dd/Mon/yyyy:HH:MM:SS +zzzz` stamps (digits where the line pattern says),
    the times in microseconds since 1970; not valid where `datetime` refuses the local time as
    `parse_clf_time` does (an unknown month, 31/Apr, 29/Feb of a common year, year 0, hour 24, second
    60). Integer arithmetic on the stamps' bytes: Arrow's strptime took 3x longer than field arithmetic
    and accepted all of those, rolling them over into the next day or minute; slicing each field out
    as a string column took 2.5x longer than reading the bytes in place."""
    raw = _stamp_bytes(stamps)
    digits = raw.astype(np.int64) - ord("0")

    def number(start: int, stop: int) -> np.ndarray:
        value = digits[:, start]
        for i in range(start + 1, stop):
            value = value * 10 + digits[:, i]
        return value

    day, year, hour, minute, second = number(0, 2), number(7, 11), number(12, 14), number(15, 17), number(18, 20)
    letters = raw[:, 3:6].astype(np.int64)
    code = (letters[:, 0] << 16) | (letters[:, 1] << 8) | letters[:, 2]
    at = np.minimum(np.searchsorted(_SORTED_MONTH_CODES, code), len(_MONTHS) - 1)
    known = _SORTED_MONTH_CODES[at] == code
    month = np.where(known, _MONTH_ORDER[at], 0) + 1
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    last_day = _DAYS_IN_MONTH[month - 1] + ((month == 2) & leap)
    valid = known & (year >= 1) & (day >= 1) & (day <= last_day) & (hour <= 23) & (minute <= 59) & (second <= 59)
    # Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    y = year - (month <= 2)
    era = y // 400
    of_era = y - era * 400
    of_year = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    days = era * 146097 + of_era * 365 + of_era // 4 - of_era // 100 + of_year - 719468
    local = (days * 86_400 + hour * 3_600 + minute * 60 + second) * 1_000_000
    zone_minutes = np.where(raw[:, 21] == ord("-"), -1, 1) * (number(22, 24) * 60 + number(24, 26))
    return local - zone_minutes * 60_000_000, local, valid


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
    dash_request = pc.equal(request, "-")
    # METHOD PATH [PROTOCOL] (the pattern checked the form), with a space added so that a request without a
    # protocol still has a third part: empty.
    with_space = pc.binary_join_element_wise(pc.if_else(dash_request, "- -", request), "", " ")
    method, path, protocol = (pc.list_element(pc.split_pattern(with_space, " ", max_splits=2), i) for i in range(3))
    utc, local, valid = _stamp_times(ts)
    # Up to 18 digits always fit int64; a longer byte count goes to the one-line form, which decides.
    size_fits = pc.less_equal(pc.utf8_length(size), 18)
    in_years = valid & (utc >= _FIRST_UTC_US) & (utc <= _LAST_UTC_US)
    ok_line = pc.and_(pc.and_(well_formed, pa.array(in_years)), size_fits)  # never null
    is_line = pc.and_(pc.invert(is_marker), ok_line)

    def on_lines(arr: pa.Array) -> pa.Array:
        return pc.if_else(is_line, arr, pa.scalar(None, arr.type))

    nothing = pa.scalar(None, pa.string())
    method, path = (pc.if_else(dash_request, nothing, part) for part in (method, path))
    protocol = pc.if_else(dash_request, nothing, _null_if(pc.utf8_rtrim(protocol, " "), ""))
    invalid = ~valid
    columns = {
        "kind": pc.if_else(is_marker, "marker", pc.if_else(is_line, "line", pa.scalar(None, pa.string()))),
        "host": on_lines(host),
        "ident": on_lines(_null_if(ident, "-")),
        "user": on_lines(_null_if(user, "-")),
        "timestamp": on_lines(pa.array(utc, pa.timestamp("us", tz="UTC"), mask=invalid)),
        "day": on_lines(pc.cast(pa.array(local, pa.timestamp("us"), mask=invalid), pa.date32())),
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
