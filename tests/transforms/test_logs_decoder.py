"""The log decoder: full Common Log Format, and its column form equal to the one-line form."""

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.logs_decoder import decode_log_column, decode_log_payload, parse_log_line
from tests.conftest import DATA
from transforms.api import Reject
from transforms.ingestion.framing import iter_file_messages

SAMPLE = [m for d in range(1, 5) for m in iter_file_messages(DATA / "log_windowing" / f"day_{d}.log")]
EDGES = [
    b"END_OF_DAY", b"END_OF_DAY\r\n", b"END_OF_DAY\n", b"", b"garbage\n", b"END_OF_DAYX\n",
    b'1.2.3.4 - - [07/Foo/2004:16:05:49 -0800] "GET / HTTP/1.0" 200 5\n',
    b'1.2.3.4 - - [07/Mar/2004:16:05:49 -0800] "GET /" 200 5\r\n',
    b'1.2.3.4 a b [07/Mar/2004:16:05:49 +0130] "A B C D" 200 5\n',
    b'1.2.3.4 - - [07/Mar/2004:16:05:49 -0800] "-" 408 -\n',
    b'1.2.3.4 - - [07/Mar/2004:16:05:49] "GET / HTTP/1.0" 200 5\n',
    b'1.2.3.4 - - [07/Mar/2004:16:05:49 -0800] "GET / HTTP/1.0" 2000 5\n',
    # Dates and times `datetime` refuses, which a rolling parser would move to the next day or minute.
    *(f'1.2.3.4 - - [{t} -0800] "GET / HTTP/1.0" 200 5\n'.encode() for t in (
        "31/Apr/2004:16:05:49", "29/Feb/2003:16:05:49", "29/Feb/1900:00:00:00", "00/Mar/2004:16:05:49",
        "07/Mar/0000:16:05:49", "07/Mar/2004:24:00:00", "07/Mar/2004:23:60:00", "07/Mar/2004:23:59:60",
        "29/Feb/2004:23:59:59", "29/Feb/2000:00:00:00", "07/Mar/0001:00:00:00", "31/Dec/9999:13:59:59")),
    # Local times whose UTC time is outside `datetime`'s years 1-9999: refused by both forms, in words.
    b'1.2.3.4 - - [31/Dec/9999:23:59:59 -0800] "GET / HTTP/1.0" 200 5\n',
    b'1.2.3.4 - - [01/Jan/0001:00:00:00 +0130] "GET / HTTP/1.0" 200 5\n',
]


def _one_line(payload: bytes):
    out = decode_log_payload(payload, "END_OF_DAY")
    return None if isinstance(out, Reject) else out.__dict__


def _assert_same(payloads):
    table = decode_log_column(pa.array(payloads, pa.binary()), "END_OF_DAY")
    for payload, row in zip(payloads, table.to_pylist()):
        out = decode_log_payload(payload, "END_OF_DAY")
        if isinstance(out, Reject):
            assert row["_error"] == out.reason and row["kind"] is None, payload  # the very same words
        else:
            expected = out.__dict__
            assert row["_error"] is None, (payload, row["_error"])
            assert {k: row[k] for k in expected} == expected, payload


def test_full_clf_parse_of_any_method_and_the_dash_request():
    rec = parse_log_line('h - - [09/Mar/2004:13:49:05 -0800] "-" 408 -\r\n')
    assert (rec.method, rec.path, rec.protocol, rec.status, rec.bytes) == (None, None, None, 408, None)
    rec = parse_log_line('h - - [07/Mar/2004:22:29:41 -0800] "POST /mailman/options/cnc_notice HTTP/1.1" 200 3533\n')
    assert (rec.method, rec.day, rec.timestamp) == ("POST", dt.date(2004, 3, 7), dt.datetime(2004, 3, 8, 6, 29, 41, tzinfo=dt.timezone.utc))
    assert parse_log_line("END_OF_DAY\r\n").is_marker
    with pytest.raises(ValueError, match="expected a Common Log Format line"):
        parse_log_line("garbage")


@pytest.mark.parametrize(("payload", "reason"), [
    (b"", "log line: expected a Common Log Format line or the marker 'END_OF_DAY', got an empty payload (0 bytes)"),
    (b"garbage\n", "log line: expected a Common Log Format line "
                   "(host ident user [dd/Mon/yyyy:HH:MM:SS +zzzz] \"request\" status bytes) or the marker 'END_OF_DAY', "
                   "got 'garbage'"),
    (b"ok\xff\n", "log line: expected UTF-8 text, got byte 0xff at offset 2"),
    (b'1.2.3.4 - - [07/Foo/2004:16:05:49 -0800] "GET / HTTP/1.0" 200 5\n',
     "log line: expected a timestamp [dd/Mon/yyyy:HH:MM:SS +zzzz], got [07/Foo/2004:16:05:49 -0800]"),
    (b'1.2.3.4 a b [07/Mar/2004:16:05:49 +0130] "A B C D" 200 5\n',
     'log line: expected a request "METHOD PATH [PROTOCOL]" or "-", got "A B C D"'),
    (b'1.2.3.4 - - [07/Mar/2004:16:05:49 -0800] "GET / HTTP/1.0" 200 99999999999999999999\n',
     "log line: expected a byte count up to 9223372036854775807, got 99999999999999999999"),
])
def test_reasons_say_what_was_expected_and_what_came_in_both_forms(payload, reason):
    assert decode_log_payload(payload, "END_OF_DAY") == Reject(reason)
    _assert_same([SAMPLE[0], payload, b"END_OF_DAY"])


def test_column_form_equals_one_line_form_on_the_sample_days_and_edge_cases():
    _assert_same(SAMPLE + EDGES)


def test_invalid_utf8_falls_back_row_by_row():
    _assert_same([SAMPLE[0], b"\xff\xfe bad\n", b"END_OF_DAY"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(SAMPLE[:200] + EDGES), st.integers(0, 120), st.binary(max_size=3)), max_size=30))
def test_column_form_equals_one_line_form_on_mutated_lines(cases):
    # Mutate real lines: overwrite a few bytes at a position, so some stay valid and most break.
    payloads = [line[:pos] + junk + line[pos + len(junk):] for line, pos, junk in cases]
    _assert_same(payloads)


def test_whitespace_inside_the_timestamp_is_rejected_by_both_forms():
    # Found by the property test: int("4\t") is 4 in Python, so the one-line form once accepted it.
    line = SAMPLE[0].replace(b":49 -0800", b":4\t -0800")
    assert _one_line(line) is None
    _assert_same([line, SAMPLE[0].replace(b"07/Mar", b" 7/Mar")])


# Pieces with the characters the column form splits on or that end a field (space, tab, quote, brackets).
_PIECE = st.text(alphabet=' \t"[]-/:+09aZé', max_size=6)
_TIME = st.sampled_from(["07/Mar/2004:16:05:49 -0800", "31/Dec/1999:23:59:59 +1430", "07/Mar/2004:16:05:49  -0800",
                         "31/Apr/2004:16:05:49 -0800", "29/Feb/2003:16:05:49 +0000", "07/Mar/2004:23:59:60 +0000"]) | _PIECE
_NUMBER = st.text(alphabet="0123456789- ", max_size=21)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_PIECE | st.just("h"), _PIECE | st.just("-"), _PIECE | st.just("-"), _TIME,
                          _PIECE | st.sampled_from(["GET / HTTP/1.0", "-", "GET /"]), _NUMBER, _NUMBER), max_size=20))
def test_column_form_equals_one_line_form_on_lines_assembled_from_tricky_pieces(parts):
    # The column form splits well-formed lines at spaces and by the timestamp's width: a field holding a
    # space, a quote or a bracket must be refused or parsed exactly as the one-line form does.
    _assert_same([f'{h} {i} {u} [{t}] "{r}" {s} {b}\n'.encode() for h, i, u, t, r, s, b in parts])
