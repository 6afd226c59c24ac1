"""The landing log: exact bytes, one global sequence, visibility only when closed, crash recovery."""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from transforms.ingestion.landing import LANDING_SCHEMA, Lander, LandingBusy, list_segments, read_landed
from transforms.settings import Settings

MARKET = Settings().group_of("orders")  # the landing log market_data and orders share


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home")


def rows(settings: Settings, group: str) -> list[dict]:
    return read_landed(settings, group).to_pylist()


def journals(settings: Settings, group: str) -> list[Path]:
    return sorted((settings.landing / group).glob(".journal-*"))


def test_flush_writes_exact_payloads_in_sequence_order(settings):
    clock = FakeClock()
    payloads = [b"", b"\x00\xff binary \r\n", b"line\n", bytes(range(256)) * 10]
    with Lander(settings, clock=clock) as lander:
        seqs = []
        for i, p in enumerate(payloads):
            clock.now += 0.25
            seqs.append(lander.append("logs", p, connection=f"c{i}"))
        assert list_segments(settings) == []  # nothing is visible before its segment closes
        lander.flush()
        assert len(list_segments(settings, "logs")) == 1
    assert seqs == [1, 2, 3, 4]
    got = rows(settings, "logs")
    assert [r["payload"] for r in got] == payloads
    assert [r["seq"] for r in got] == seqs
    assert [r["connection"] for r in got] == ["c0", "c1", "c2", "c3"]
    assert {r["stream"] for r in got} == {"logs"}
    assert all(r["landing_error"] is None for r in got)
    start = dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc)
    assert [r["receive_time"] for r in got] == [
        start + dt.timedelta(seconds=0.25 * (i + 1)) for i in range(4)
    ]
    assert pq.read_schema(list_segments(settings, "logs")[0]).equals(LANDING_SCHEMA)


def test_segment_name_covers_its_sequence_range(settings):
    with Lander(settings) as lander:
        for i in range(5):
            lander.append("text", str(i).encode())
    (segment,) = list_segments(settings, "text")
    assert segment.name == f"seg-{1:020d}-{5:020d}.parquet"
    assert journals(settings, "text") == []


def test_sequence_continues_across_restarts(settings):
    with Lander(settings) as lander:
        lander.append("logs", b"a")
        lander.append("text", b"b")
    with Lander(settings) as lander:
        assert lander.next_seq == 3
        assert lander.append("logs", b"c") == 3
    assert [r["seq"] for r in rows(settings, "logs")] == [1, 3]
    assert [r["payload"] for r in rows(settings, "logs")] == [b"a", b"c"]


def test_rotation_by_size_keeps_sequence_contiguous(tmp_path):
    settings = Settings(home=tmp_path, segment_max_bytes=1000)
    with Lander(settings) as lander:
        for i in range(100):
            lander.append("logs", b"%04d" % i + b"x" * 60)
        assert lander.segments_closed >= 5
    segments = list_segments(settings, "logs")
    assert len(segments) >= 6
    got = rows(settings, "logs")
    assert [r["seq"] for r in got] == list(range(1, 101))
    assert [r["payload"][:4] for r in got] == [b"%04d" % i for i in range(100)]


def test_rotation_by_time(tmp_path):
    settings = Settings(home=tmp_path, segment_max_seconds=0.5, segment_quiet_seconds=0)
    clock = FakeClock()
    with Lander(settings, clock=clock) as lander:
        lander.append("logs", b"a")
        clock.now += 0.4
        assert lander.rotate_due() == 0
        clock.now += 0.1
        assert lander.rotate_due() == 1
        assert [r["payload"] for r in rows(settings, "logs")] == [b"a"]
        assert lander.rotate_due() == 0  # no open segment until the next append


def test_a_quiet_stream_closes_its_segment_early_but_at_most_one_per_max_seconds(tmp_path):
    settings = Settings(home=tmp_path, segment_max_seconds=0.5, segment_quiet_seconds=0.05)
    clock = FakeClock()
    with Lander(settings, clock=clock) as lander:
        lander.append("logs", b"a")  # a burst, then quiet
        clock.now += 0.04
        lander.append("logs", b"b")
        clock.now += 0.04
        assert lander.rotate_due() == 0  # quiet for 0.04 s only
        clock.now += 0.02
        assert lander.rotate_due() == 1  # quiet for 0.06 s: visible 0.1 s after the first message
        assert [r["payload"] for r in rows(settings, "logs")] == [b"a", b"b"]
        lander.append("logs", b"c")  # the next burst, 0.1 s after that close
        clock.now += 0.3
        assert lander.rotate_due() == 0  # quiet, but the log's last segment closed only 0.3 s ago
        clock.now += 0.2
        assert lander.rotate_due() == 1
        for i in range(20):  # a steady stream, never quiet: closed by age, as before
            lander.append("logs", b"s%d" % i)
            clock.now += 0.03
            lander.rotate_due()
        assert lander.segments_closed == 3
    assert [r["payload"] for r in rows(settings, "logs")] == [b"a", b"b", b"c", *(b"s%d" % i for i in range(20))]


def test_stream_groups_share_one_folder_and_one_sequence(settings):
    with Lander(settings) as lander:
        lander.append("market_data", b"md1")
        lander.append("orders", b"o1")
        lander.append("logs", b"log1")
        lander.append("market_data", b"md2")
        lander.append("orders", b"o2")
    assert sorted(p.name for p in settings.landing.iterdir() if p.is_dir()) == ["logs", MARKET]
    market = rows(settings, MARKET)
    assert [(r["stream"], r["payload"], r["seq"]) for r in market] == [
        ("market_data", b"md1", 1),
        ("orders", b"o1", 2),
        ("market_data", b"md2", 4),
        ("orders", b"o2", 5),
    ]
    assert [r["seq"] for r in rows(settings, "logs")] == [3]


def test_unknown_stream_is_refused(settings):
    with Lander(settings) as lander, pytest.raises(ValueError, match="unknown stream 'nope'"):
        lander.append("nope", b"x")


def test_second_lander_on_the_same_landing_is_busy(settings):
    with Lander(settings):
        with pytest.raises(LandingBusy, match="in use by process"):
            Lander(settings)
    with Lander(settings):  # released on close
        pass


def test_process_crash_with_open_journal_is_recovered(settings):
    """A real crash: another process syncs its journal and exits without closing anything."""
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from transforms.ingestion.landing import Lander
        from transforms.settings import Settings
        lander = Lander(Settings(home=Path({str(settings.home)!r})))
        lander.append("market_data", b"m1", "crash")
        lander.append("orders", b"o1", "crash")
        lander.append("logs", b"l1", "crash")
        lander.sync()
        lander.append("logs", b"never synced", "crash")
        os._exit(9)  # no close, no buffer flush, no lock release: like SIGKILL
        """
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert done.returncode == 9, done.stderr.decode()
    assert journals(settings, MARKET) and journals(settings, "logs")
    assert list_segments(settings) == []
    with Lander(settings) as lander:
        assert journals(settings, MARKET) == journals(settings, "logs") == []
        assert lander.next_seq == 4
        assert lander.append("logs", b"l2") == 4
    assert [(r["payload"], r["seq"]) for r in rows(settings, MARKET)] == [(b"m1", 1), (b"o1", 2)]
    assert [(r["payload"], r["seq"]) for r in rows(settings, "logs")] == [(b"l1", 3), (b"l2", 4)]
    assert all(r["landing_error"] is None for r in rows(settings, MARKET) + rows(settings, "logs"))


def crash_copy(settings: Settings, lander: Lander, to: Path) -> Settings:
    """The landing area as a crash would leave it right now (journals synced, nothing closed)."""
    lander.sync()
    shutil.copytree(settings.home, to)
    return Settings(home=to)


def test_torn_tail_record_is_quarantined_not_dropped(settings, tmp_path):
    with Lander(settings) as lander:
        for i in range(3):
            lander.append("logs", b"whole %d" % i, "c")
        crashed = crash_copy(settings, lander, tmp_path / "crashed")
    (journal,) = journals(crashed, "logs")
    whole = journal.read_bytes()
    lander_two = Lander(Settings(home=tmp_path / "scratch"))
    lander_two.append("logs", b"the record being written", "c")
    lander_two.sync()
    next_record = journals(lander_two.settings, "logs")[0].read_bytes()
    lander_two.close()
    torn = next_record[:-5]  # the crash hit in the middle of the fourth record
    journal.write_bytes(whole + torn)

    with Lander(crashed) as recovered:
        assert recovered.next_seq == 5
    got = rows(crashed, "logs")
    assert [r["payload"] for r in got[:3]] == [b"whole 0", b"whole 1", b"whole 2"]
    assert [r["landing_error"] for r in got[:3]] == [None, None, None]
    assert len(got) == 4
    quarantined = got[3]
    assert quarantined["payload"] == torn
    assert quarantined["seq"] == 4
    assert quarantined["stream"] == "logs"
    assert quarantined["connection"] == "recovery"
    assert "torn journal record" in quarantined["landing_error"]
    assert f"{len(torn)} bytes" in quarantined["landing_error"]


def test_corrupt_record_and_everything_after_it_is_quarantined(settings, tmp_path):
    with Lander(settings) as lander:
        for i in range(3):
            lander.append("text", b"record %d" % i)
        crashed = crash_copy(settings, lander, tmp_path / "crashed")
    (journal,) = journals(crashed, "text")
    data = bytearray(journal.read_bytes())
    second_payload_at = data.index(b"record 1")
    data[second_payload_at] ^= 0xFF  # a flipped bit fails the CRC
    journal.write_bytes(bytes(data))
    Lander(crashed).close()
    got = rows(crashed, "text")
    assert [r["payload"] for r in got[:1]] == [b"record 0"]
    assert len(got) == 2
    assert got[1]["landing_error"] and b"record 2" in got[1]["payload"]


def test_journal_left_after_its_segment_closed_is_not_landed_twice(settings, tmp_path):
    """Crash between renaming the segment into place and deleting the journal."""
    with Lander(settings) as lander:
        lander.append("logs", b"a")
        lander.append("logs", b"b")
        lander.sync()
        (journal,) = journals(settings, "logs")
        saved = journal.read_bytes()
        lander.flush()
    journal.write_bytes(saved)
    (settings.landing / "logs" / ".seg-left-over.parquet.tmp").write_bytes(b"half written")
    with Lander(settings) as lander:
        assert lander.next_seq == 3
    assert [r["payload"] for r in rows(settings, "logs")] == [b"a", b"b"]
    assert journals(settings, "logs") == []
    assert not list((settings.landing / "logs").glob(".seg-*"))


def test_torn_record_sequence_is_unique_across_groups(settings, tmp_path):
    with Lander(settings) as lander:
        lander.append("logs", b"one")
        lander.append("market_data", b"two")
        crashed = crash_copy(settings, lander, tmp_path / "crashed")
    (journal,) = journals(crashed, "logs")
    journal.write_bytes(journal.read_bytes() + b"\x00\x00\x00\x30torn")
    with Lander(crashed) as lander:
        assert lander.next_seq == 4
    seqs = [r["seq"] for group in ("logs", MARKET) for r in rows(crashed, group)]
    assert sorted(seqs) == [1, 2, 3]


def test_read_landed_of_an_empty_group(settings):
    table = read_landed(settings, "logs")
    assert table.num_rows == 0 and table.schema.equals(LANDING_SCHEMA)


# Calls to a Lander: (the bulk path or not, a stream, its payloads); the bulk path is each test's own.
LANDER_CALLS = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["market_data", "orders", "logs"]),
              st.lists(st.binary(max_size=40), max_size=30)),
    max_size=6)


def land_calls(lander: Lander, calls, bulk, connection: str) -> None:
    """Each of LANDER_CALLS through `bulk` (the path under test) when it says so and `bulk` is given, else
    one `append` per payload (the reference)."""
    for use_bulk, stream, payloads in calls:
        if use_bulk and bulk is not None:
            bulk(stream, payloads, connection)
        else:
            for p in payloads:
                lander.append(stream, p, connection)


@given(
    calls=LANDER_CALLS,
    limit=st.integers(1, 200),
)
@hypothesis_settings(max_examples=20, deadline=None)
def test_append_many_lands_what_appending_one_by_one_lands(tmp_path_factory, calls, limit):
    """The bulk path (files) equals the one-message path (the gateway): same streams, sequence numbers,
    connections and payloads in the same order, segments of at most about `limit` bytes."""
    def land_all(bulk_allowed: bool) -> dict[str, list[tuple]]:
        s = Settings(home=tmp_path_factory.mktemp("home"), segment_max_bytes=limit)
        with Lander(s, clock=FakeClock()) as lander:
            land_calls(lander, calls, lander.append_many if bulk_allowed else None, "file:x")
        return {g: [(r["stream"], r["seq"], r["connection"], r["payload"], r["landing_error"]) for r in rows(s, g)]
                for g in ("logs", MARKET)}

    assert land_all(True) == land_all(False)


@given(
    calls=LANDER_CALLS,
    limit=st.integers(1, 300),
)
@hypothesis_settings(max_examples=30, deadline=None)
def test_append_received_journals_and_lands_what_appending_one_by_one_does(tmp_path_factory, calls, limit):
    """The gateway's path (the messages of one read at once) equals one `append` per message: the same
    journals byte for byte, the same closed segments, and after the flush the same rows."""
    def land_all(at_once_allowed: bool):
        s = Settings(home=tmp_path_factory.mktemp("home"), segment_max_bytes=limit)
        with Lander(s, clock=FakeClock()) as lander:
            land_calls(lander, calls, lander.append_received if at_once_allowed else None, "tcp:127.0.0.1:1#1")
            lander.sync()  # as the gateway does after each read: the journals' bytes reach the files
            files = {f.relative_to(s.landing).as_posix(): f.read_bytes() if f.name.startswith(".journal-")
                     else pq.read_table(f).to_pylist()
                     for f in s.landing.rglob("*") if f.is_file() and f.name != ".lock"}
            landed = (lander.next_seq, lander.messages_landed)
        return files, landed, {g: rows(s, g) for g in ("logs", MARKET)}

    assert land_all(True) == land_all(False)


def test_ingest_lands_a_file_in_whole_segments_without_journals(settings, tmp_path):
    from transforms.ingestion.sender import ingest_files

    lines = [b"line %d\n" % i for i in range(5000)]
    path = tmp_path / "day.log"
    path.write_bytes(b"".join(lines))
    small = Settings(home=settings.home, segment_max_bytes=10_000)
    assert ingest_files(small, "logs", [path], end_of_day=True) == 5001
    landed = rows(small, "logs")
    assert [r["payload"] for r in landed] == [*lines, b"END_OF_DAY"]
    assert [r["seq"] for r in landed] == list(range(1, 5002))
    assert len(list_segments(small, "logs")) == 5 and not journals(small, "logs")  # ~48 kB in 10 kB segments


def test_a_query_of_python_objects_is_bounded_by_messages_in_the_logs_own_bytes(tmp_path):
    from transforms.ingestion.landing import bytes_per_trigger

    # Repetitive text compresses to a few bytes a message: 64 MB of such segments would be millions.
    settings = Settings(home=tmp_path / "home", segment_max_bytes=1 << 20, max_messages_per_trigger=10_000)
    with Lander(settings) as lander:
        lander.append_many("text", [b"the same words, again and again"] * 100_000, "c")
    segments = list_segments(settings, "text")
    size = sum(p.stat().st_size for p in segments)
    assert size / 100_000 < 5  # the premise: bytes say little about messages here

    bound = bytes_per_trigger(settings, "text", messages_as_objects=True)
    assert bound == int(10_000 * size / 100_000)
    # Columns (direct, columnar plans) stay bounded by bytes alone; 0 turns the messages' bound off.
    assert bytes_per_trigger(settings, "text", messages_as_objects=False) == settings.max_bytes_per_trigger
    off = Settings(home=settings.home, max_messages_per_trigger=0)
    assert bytes_per_trigger(off, "text", messages_as_objects=True) == settings.max_bytes_per_trigger
    # Nothing landed: no measure, the bytes' bound.
    assert bytes_per_trigger(settings, "logs", messages_as_objects=True) == settings.max_bytes_per_trigger


@pytest.mark.spark
def test_word_count_bounded_by_messages_runs_in_several_batches_with_the_same_tables(spark):
    from examples.words import word_count
    from tests.transforms.test_write_paths import DATA, _canonical
    from transforms.testing import run_app

    lines = (DATA / "word_count" / "count_this.txt").read_text().splitlines() * 3  # 87 lines
    small_segments = dict(segment_max_bytes=2_000, segment_max_seconds=3600.0, segment_quiet_seconds=0.0)
    bounded, whole = (run_app(word_count, {"text": lines}, spark=spark,
                              settings=Settings(max_messages_per_trigger=bound, **small_segments))
                      for bound in (20, 0))
    batches = {r.query: r.batches for r in bounded.reports}
    assert batches["word_count"] >= 3, batches  # 87 lines, at most ~20 a batch
    assert {r.query: r.batches for r in whole.reports}["word_count"] == 1
    assert bounded.tables["word_totals"].num_rows > 100
    for name in whole.tables:
        assert _canonical(bounded.tables[name]) == _canonical(whole.tables[name]), name
    assert len(whole.tcp["word_count_tcp"]) > 500  # every update, in the input's order, batches or not
    assert bounded.tcp == whole.tcp


def test_a_bad_bound_is_refused_naming_the_variable():
    from transforms.settings import ConfigError

    with pytest.raises(ConfigError, match="EVENTIDE_MAX_MESSAGES_PER_TRIGGER"):
        Settings(max_messages_per_trigger=-1)
    with pytest.raises(ConfigError, match="EVENTIDE_MAX_MESSAGES_PER_TRIGGER='many'"):
        Settings.from_env({"EVENTIDE_MAX_MESSAGES_PER_TRIGGER": "many"})


def test_each_segment_of_a_log_is_a_later_millisecond_than_the_one_before(settings):
    """Spark's file source takes a log's segments in modification-time order (milliseconds): a segment
    closed in the same millisecond as the one before, or while the one before has a later time, still
    comes after it."""
    with Lander(settings) as lander:
        lander.append_many("logs", [b"a"], "c")
    (first,) = list_segments(settings, "logs")
    ahead = first.stat().st_mtime_ns + 3600 * 10**9  # as if its clock ran an hour ahead
    os.utime(first, ns=(ahead, ahead))
    with Lander(settings) as lander:
        for i in range(5):
            lander.append_many("logs", [b"b%d" % i], "c")
    times = [p.stat().st_mtime_ns // 1_000_000 for p in list_segments(settings, "logs")]
    assert len(times) == 6 and all(a < b for a, b in zip(times, times[1:])), times


def _stamp(paths, seconds_ago):
    now = time.time()
    for p, ago in zip(paths, seconds_ago):
        os.utime(p, (now - ago, now - ago))


@pytest.mark.spark
def test_a_copied_home_whose_segments_lost_their_order_is_read_in_sequence_order(spark, tmp_path, caplog):
    """A home copied without its files' times (`cp -r`): the log app, bounded to one segment a batch,
    still closes each day's window at its marker (its segments are given times in sequence order)."""
    from examples.logs import log_app
    from tests.conftest import land
    from tests.transforms.test_logs_app import closed_windows, log_messages
    from transforms.engine import run_application
    from transforms.streams import bronze_application

    settings = Settings(home=tmp_path / "home", max_files_per_trigger=1)
    messages = log_messages()
    for i in range(0, len(messages), 400):
        land(settings, "logs", messages[i:i + 400])
    segments = list_segments(settings, "logs")
    assert len(segments) >= 4
    _stamp(segments, range(len(segments)))  # the newest first, as a copy may leave them
    with caplog.at_level(logging.WARNING, logger="eventide.queries.landing"):
        for app in (bronze_application("logs"), log_app):
            run_application(spark, app, settings)
    # Said once, by the first query to start (bronze): the app then finds them in order.
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"bronze_logs: {len(segments)} landing segment(s) of log 'logs' had modification times"), said
    assert closed_windows(settings) == [(f"2004-03-{d:02d}", "marker") for d in range(7, 11)]
    times = [p.stat().st_mtime_ns // 1_000_000 for p in list_segments(settings, "logs")]
    assert all(a < b for a, b in zip(times, times[1:]))


@pytest.mark.spark
def test_a_keyed_query_that_read_its_log_out_of_order_stops_saying_what_to_do(spark, tmp_path):
    from examples.logs import log_app
    from tests.conftest import land
    from tests.transforms.test_logs_app import log_messages
    from transforms.engine import run_application

    settings = Settings(home=tmp_path / "home")
    messages = log_messages()
    land(settings, "logs", messages[:500])
    land(settings, "logs", messages[500:1000])
    earlier, later = list_segments(settings, "logs")
    aside = tmp_path / earlier.name
    earlier.rename(aside)  # the app reads the later segment first
    run_application(spark, log_app, settings)
    aside.rename(earlier)
    with pytest.raises(RuntimeError, match=r"read the log out of order.*generation=2") as failed:
        run_application(spark, log_app, settings)
    assert earlier.name in str(failed.value)


@pytest.mark.spark
def test_a_segment_read_long_ago_is_not_read_again_when_its_time_changes(spark, tmp_path):
    """By default Spark's file source forgets a file it read once the newest it read is 7 days newer,
    and reads a forgotten file again if its time changes (a copy, a restore, a `touch`, or the times a
    query gives its unread segments back in order). The landing's queries forget no file."""
    from examples.logs import log_app
    from tests.conftest import land
    from tests.transforms.test_logs_app import log_messages
    from transforms import lake
    from transforms.engine import run_application
    from transforms.streams import bronze_application

    settings = Settings(home=tmp_path / "home")
    messages = log_messages()
    land(settings, "logs", messages[:500])
    land(settings, "logs", messages[500:1000])
    old, new = list_segments(settings, "logs")
    week = 8 * 24 * 3600
    _stamp([old, new], [week, 1])
    run_application(spark, bronze_application("logs"), settings)
    _stamp([old, new], [0, week])  # out of order for the app, which has read neither: it sets them again
    run_application(spark, log_app, settings)
    land(settings, "logs", messages[1000:1100])  # bronze has work again, and lists both old segments
    run_application(spark, bronze_application("logs"), settings)
    assert lake.count(settings.table_path("bronze_log_lines")) == 1100
