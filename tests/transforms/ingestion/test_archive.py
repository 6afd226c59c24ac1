"""Archiving the landing: segments every query has committed leave the folder Spark lists, and the log
stays whole for everything else (a new query, recovery, readers). Real Spark, real files."""

import contextlib
import os
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import land
from transforms import lake
from transforms.api import Application, DeltaSink, source
from transforms.engine import plan_queries, run_application
from transforms.ingestion import open_log
from transforms.ingestion.archive import (
    ROWS_FILE,
    archive_committed,
    archive_segments,
    archived_names,
    archived_rows,
    compact_archive,
    lists_archive,
    note_listing,
)
from transforms.ingestion.landing import Lander, list_segments, payloads_for, read_landed, read_segment
from transforms.ingestion.segments import segment_name
from transforms.streams import bronze_application

COMPACT_INTERVAL = "spark.sql.streaming.fileSource.log.compactInterval"


def _apps(settings):
    from examples.words import word_count

    return [bronze_application(settings.registry.stream("text")), word_count]


def _echo_app() -> Application:
    """An app added later: it copies the log's lines to a table, reading the log from the beginning."""
    from examples.words import decode_text

    return Application("echo", source("text", decoder=decode_text)
                       .to_sink(DeltaSink("echo_lines", schema=pa.schema([("text", pa.string())]))))


def _plans(settings, apps):
    return [p for app in apps for p in plan_queries(app, settings)]


@pytest.mark.spark
def test_committed_segments_are_archived_and_the_log_stays_whole(spark, settings):
    apps = _apps(settings)
    for text in (b"a b", b"b c", b"c d"):
        land(settings, "text", [text])  # a segment each
    assert archive_committed(settings, _plans(settings, apps)) == {}  # nothing has run: nothing moves
    run_application(spark, apps[0], settings)
    assert archive_committed(settings, _plans(settings, apps)) == {}  # word_count has not committed yet
    run_application(spark, apps[1], settings)
    assert archive_committed(settings, _plans(settings, apps)) == {"text": 3}
    assert list_segments(settings, "text", archived=False) == [] and len(list_segments(settings, "text")) == 3
    archive = settings.landing_archive / "text"
    assert archived_rows(archive) == {p.name: 1 for p in list_segments(settings, "text")}
    # `eventide status` counts the archive's messages from those counts, and reads a footer for one it lacks.
    first, second, third = (p.name for p in list_segments(settings, "text"))
    (archive / ROWS_FILE).write_text(f"{first} 7\n{second} 1\n")
    (text,) = [g for g in open_log(settings).status(_plans(settings, apps), 0.0)[0] if g.log == "text"]
    assert text.messages == 7 + 1 + 1
    assert [r["payload"] for r in read_landed(settings, "text").to_pylist()] == [b"a b", b"b c", b"c d"]

    land(settings, "text", [b"d e"])
    for app in apps:  # the live folder holds only the new segment: each query reads it once
        run_application(spark, app, settings)
    totals = {r["word"]: r["count"] for r in lake.read(settings.table_path("word_totals")).to_pylist()}
    assert totals == {"a": 1, "b": 2, "c": 2, "d": 2, "e": 1}
    assert lake.count(settings.table_path(settings.registry.stream("text").bronze_table)) == 4

    # A query that has committed nothing reads the archive too: it starts from the beginning.
    echo = _echo_app()
    run_application(spark, echo, settings)
    assert sorted(r["text"] for r in lake.read(settings.table_path("echo_lines")).to_pylist()) == [
        "a b", "b c", "c d", "d e"]
    run_application(spark, echo, settings)  # and, committed, it does not read them again
    assert lake.count(settings.table_path("echo_lines")) == 4

    # Sequence numbers continue after the archived segments.
    with Lander(settings) as lander:
        assert lander.append("text", b"f") == 5


@pytest.mark.spark
def test_a_new_query_stopped_partway_through_the_archive_reads_the_rest_when_started_again(spark, settings):
    import dataclasses

    from transforms.engine.checkpoints import has_commits
    from transforms.engine.live import LiveQuery

    apps = _apps(settings)
    lines = [f"line {i}".encode() for i in range(6)]
    for line in lines:
        land(settings, "text", [line])  # a segment each
    for app in apps:
        run_application(spark, app, settings)
    assert archive_committed(settings, _plans(settings, apps)) == {"text": 6}

    # A query added later starts from the archive, one segment a batch, and is stopped after its first commit.
    echo = _echo_app()
    bounded = dataclasses.replace(settings, max_files_per_trigger=1)
    (plan,) = plan_queries(echo, bounded)
    live = LiveQuery(spark, plan, bounded, {}, trigger_seconds=60)  # one batch, then a minute's wait
    try:
        import time

        deadline = time.monotonic() + 120
        while not has_commits(plan.checkpoint(bounded)) and time.monotonic() < deadline:
            live.poll()
            time.sleep(0.05)
    finally:
        live.stop()
    assert 1 <= lake.count(settings.table_path("echo_lines")) < 6

    run_application(spark, echo, settings)  # started again: it reads the rest of the archive, once
    assert sorted(r["text"] for r in lake.read(settings.table_path("echo_lines")).to_pylist()) == [
        f"line {i}" for i in range(6)]


@pytest.mark.spark
def test_a_query_forgets_the_archived_segments_it_read_and_reads_nothing_twice(spark, settings):
    import dataclasses

    from transforms.engine.checkpoints import processed_segments

    settings = dataclasses.replace(settings, max_files_per_trigger=1)  # a batch a segment
    apps = _apps(settings)[:1]  # bronze: a query that reads the log
    plans = _plans(settings, apps)
    spark.conf.set(COMPACT_INTERVAL, "3")  # Spark compacts its list of files at batches 2, 5, 8, ...
    try:
        for i in range(6):
            land(settings, "text", [f"w{i} common".encode()])
        for app in apps:
            run_application(spark, app, settings)
        assert archive_committed(settings, plans) == {"text": 6}
        compacted = [p.checkpoint(settings) / "sources" / "0" / "5.compact" for p in plans]
        assert all(len(c.read_text().splitlines()) == 1 + 6 for c in compacted)  # batches 0-5

        for i in range(6, 8):
            land(settings, "text", [f"w{i} common".encode()])
        for app in apps:  # the query's start forgets the archived segments of batches 0-3 (not the last two)
            run_application(spark, app, settings)
        for plan, c in zip(plans, compacted):
            assert c.read_text().splitlines()[0] == "v1" and len(c.read_text().splitlines()) == 1 + 2
            assert not (c.parent / ".5.compact.crc").exists()  # Hadoop's checksum of the old list went with it
            last, names = processed_segments(plan.checkpoint(settings))
            assert last == 7 and len(names) == 4  # batches 4-7
        assert lake.count(settings.table_path(settings.registry.stream("text").bronze_table)) == 8  # none twice

        # What reads the checkpoints still counts the forgotten segments as read.
        _, progress = open_log(settings).status(plans, 0.0)
        assert all(p.lag_messages == 0 and p.processed_segments == 8 and p.processed_last_seq == 8
                   for p in progress.values())
        assert all(open_log(settings).caught_up(p) for p in plans)
        every = {s.name for s in list_segments(settings, "text")}
        assert all(open_log(settings).reached(p, every) for p in plans)
        archive_committed(settings, plans)
        land(settings, "text", [b"w8 common"])  # and Spark goes on from the rewritten list
        for app in apps:
            run_application(spark, app, settings)
        assert lake.count(settings.table_path(settings.registry.stream("text").bronze_table)) == 9
    finally:
        spark.conf.unset(COMPACT_INTERVAL)


# -- compaction ------------------------------------------------------------------------------------------
def _archived_log(settings, n: int) -> list[dict]:
    """`n` one-message segments of log `text`, all moved to the archive; the log's rows as read."""
    for i in range(n):
        land(settings, "text", [f"m{i} x".encode()])
    archive_segments(settings, "text", {p.name for p in list_segments(settings, "text")})
    return read_landed(settings, "text").to_pylist()


def test_a_compacted_archive_holds_every_message_once(settings):
    rows = _archived_log(settings, 12)
    before = [p.name for p in list_segments(settings, "text")]
    archive = settings.landing_archive / "text"
    assert compact_archive(settings, "text", min_files=13) == 0  # fewer segments than that: left as they are
    assert compact_archive(settings, "text", min_files=12) == 12
    (merged,) = list_segments(settings, "text")
    assert merged.name == segment_name(rows[0]["seq"], rows[-1]["seq"]) and merged.parent == archive
    assert sorted(n for n in os.listdir(archive) if not n.startswith(".")) == [merged.name]
    assert read_landed(settings, "text").to_pylist() == rows
    assert archived_rows(archive) == {merged.name: 12}
    # A reader holding a name it listed before still gets that segment's rows, and only those.
    gone = settings.landing / "text" / before[3]
    assert read_segment(settings, gone, columns=["payload"]).to_pylist() == [{"payload": b"m3 x"}]
    assert payloads_for(settings, "text", [rows[5]["seq"], rows[7]["seq"]]) == {
        rows[5]["seq"]: b"m5 x", rows[7]["seq"]: b"m7 x"}
    assert all(archived_names(archive)(name) for name in before)
    with Lander(settings) as lander:  # sequence numbers go on after the merged segment's
        assert lander.append("text", b"next") == rows[-1]["seq"] + 1


def test_status_reads_a_log_merged_while_it_reads(settings, monkeypatch):
    """`eventide status` lists a log's segments, then reads their footers and columns: serve may merge the
    archive in between. Status then counts each message as it would have, read from the merged segment."""
    from transforms.ingestion import landing

    for i in range(6):  # the two streams of one log: lag counts and oldest times read the `stream` column
        land(settings, "orders" if i % 3 else "market_data", [f"m{i}".encode()])
    log = settings.group_of("orders")
    archive_segments(settings, log, {p.name for p in list_segments(settings, log)})
    listed = landing.list_segments

    def listed_then_merged(settings_, group, *args, **kwargs):
        segments = listed(settings_, group, *args, **kwargs)
        if group == log:
            compact_archive(settings, log, min_files=2)
        return segments

    plans = _plans(settings, [bronze_application(settings.registry.stream(s)) for s in ("market_data", "orders")])
    expected = open_log(settings).status(plans, 0.0)
    monkeypatch.setattr(landing, "list_segments", listed_then_merged)
    raced = open_log(settings).status(plans, 0.0)
    assert [p.name for p in listed(settings, log)] == [segment_name(1, 6)]  # it did merge in between
    assert raced == expected
    assert [raced[1][p.name].lag_messages for p in plans] == [2, 4]


def test_a_long_archive_is_merged_a_bounded_run_at_a_time(settings, monkeypatch):
    """serve's main loop archives every 10 s: one round merges runs of COMPACT_RUN_FILES at most, and starts
    no other once COMPACT_ROUND_SECONDS have gone; the next rounds go on, and merged runs merge again."""
    from transforms.ingestion import archive as archive_module

    rows = _archived_log(settings, 7)
    monkeypatch.setattr(archive_module, "COMPACT_RUN_FILES", 3)
    monkeypatch.setattr(archive_module, "COMPACT_ROUND_SECONDS", 0.0)
    spans = []
    for _ in range(4):
        compact_archive(settings, "text", min_files=2)
        spans.append([len(read_segment(settings, p)) for p in list_segments(settings, "text")])
        assert read_landed(settings, "text").to_pylist() == rows
    assert spans == [[3, 1, 1, 1, 1], [5, 1, 1], [7], [7]]  # runs of three files, one a round


def test_a_merged_segment_holds_no_more_than_a_querys_batch_may(settings):
    """Spark's file source cannot split a file between batches: a merged segment stays within the batch
    bounds (EVENTIDE_MAX_MESSAGES_PER_TRIGGER here), so a query reading the archive keeps them."""
    import dataclasses

    rows = _archived_log(settings, 12)
    bounded = dataclasses.replace(settings, max_messages_per_trigger=5)
    assert compact_archive(bounded, "text", min_files=2) == 12
    assert [len(read_segment(settings, p)) for p in list_segments(settings, "text")] == [5, 5, 2]
    assert compact_archive(bounded, "text", min_files=2) == 0  # full runs are not merged again
    assert read_landed(settings, "text").to_pylist() == rows


class _Cut(BaseException):
    """A compaction stopped dead at one of its file operations (as by kill -9 there)."""


@pytest.mark.parametrize("cut_at", range(1, 8))
def test_a_compaction_cut_short_anywhere_leaves_every_message_once(settings, monkeypatch, cut_at):
    """Five segments merged: the merged file's rename, then the five deletes; cut before each of them and
    after the last. Readers see each message once at once, and the next compaction finishes the job."""
    rows = _archived_log(settings, 5)
    archive = settings.landing_archive / "text"
    calls = []
    real_rename, real_unlink = os.rename, Path.unlink

    def counted(real):
        def op(*args, **kwargs):
            calls.append(args[0])
            if len(calls) == cut_at:
                raise _Cut
            return real(*args, **kwargs)
        return op

    monkeypatch.setattr(os, "rename", counted(real_rename))
    monkeypatch.setattr(Path, "unlink", counted(real_unlink))
    with pytest.raises(_Cut) if cut_at <= 6 else contextlib.nullcontext():
        compact_archive(settings, "text", min_files=2)
    monkeypatch.undo()
    assert read_landed(settings, "text").to_pylist() == rows
    names = os.listdir(archive)
    assert any(n.startswith(".compacting-") for n in names) == (cut_at == 1)  # the write, not yet renamed
    # Settled: merged again if cut before the merged file was in place; else only its leftovers deleted.
    assert compact_archive(settings, "text", min_files=2) == (5 if cut_at == 1 else 0)
    assert sorted(n for n in os.listdir(archive) if not n.startswith(".")) == [
        segment_name(rows[0]["seq"], rows[-1]["seq"])]
    assert read_landed(settings, "text").to_pylist() == rows


def test_compaction_waits_while_a_query_lists_the_archive(settings):
    from transforms.engine.locks import QueryLock

    rows = _archived_log(settings, 4)
    (plan,) = plan_queries(bronze_application(settings.registry.stream("text")), settings)
    lock = QueryLock(settings, plan.name)
    lock.acquire()
    try:
        note_listing(settings, plan, True)  # what the query's source says as it starts
        assert lists_archive(settings, plan)
        assert compact_archive(settings, "text", min_files=2) == 0
    finally:
        lock.release()
    # Its process let the lock go (stopped or died): the marker no longer holds anything back.
    assert compact_archive(settings, "text", min_files=2) == 4
    assert not lists_archive(settings, plan)
    assert read_landed(settings, "text").to_pylist() == rows


@pytest.mark.spark
def test_queries_read_a_compacted_archive_once(spark, settings):
    apps = _apps(settings)
    for i in range(6):
        land(settings, "text", [f"w{i} common".encode()])
    for app in apps:
        run_application(spark, app, settings)
    assert archive_committed(settings, _plans(settings, apps)) == {"text": 6}
    assert compact_archive(settings, "text", min_files=2) == 6

    # A query added later reads the merged segment from the beginning; then only what is new.
    echo = _echo_app()
    run_application(spark, echo, settings)
    assert lake.count(settings.table_path("echo_lines")) == 6
    land(settings, "text", [b"w6 common"])
    for app in [*apps, echo]:
        run_application(spark, app, settings)
    assert archive_committed(settings, _plans(settings, [*apps, echo])) == {"text": 1}
    assert compact_archive(settings, "text", min_files=2) == 2  # the merged segment and the new one, again

    land(settings, "text", [b"w7 common"])
    for app in [*apps, echo]:  # each query read the merged segments' messages already: none twice
        run_application(spark, app, settings)
    assert sorted(r["text"] for r in lake.read(settings.table_path("echo_lines")).to_pylist()) == [
        f"w{i} common" for i in range(8)]
    assert lake.count(settings.table_path(settings.registry.stream("text").bronze_table)) == 8
    totals = {r["word"]: r["count"] for r in lake.read(settings.table_path("word_totals")).to_pylist()}
    assert totals == {"common": 8, **{f"w{i}": 1 for i in range(8)}}
    plans = _plans(settings, [*apps, echo])
    _, progress = open_log(settings).status(plans, 0.0)
    assert all(p.lag_messages == 0 for p in progress.values())
    every = {s.name for s in list_segments(settings, "text")}
    assert all(open_log(settings).caught_up(p) and open_log(settings).reached(p, every) for p in plans)


@pytest.mark.spark
def test_a_query_partway_through_the_archive_holds_compaction_back_until_it_has_read_it(spark, settings, caplog):
    import dataclasses
    import logging
    import time

    from transforms.engine.checkpoints import has_commits
    from transforms.engine.live import LiveQuery

    apps = _apps(settings)[:1]
    for i in range(4):
        land(settings, "text", [f"line {i}".encode()])
    run_application(spark, apps[0], settings)
    assert archive_committed(settings, _plans(settings, apps)) == {"text": 4}

    echo = _echo_app()
    bounded = dataclasses.replace(settings, max_files_per_trigger=1)  # a segment a batch
    (plan,) = plan_queries(echo, bounded)
    deadline = time.monotonic() + 120
    live = LiveQuery(spark, plan, bounded, {}, trigger_seconds=60, say=lambda _: None)  # a batch, then a wait
    try:
        while not has_commits(plan.checkpoint(bounded)) and time.monotonic() < deadline:
            live.poll()
            time.sleep(0.05)
        assert compact_archive(settings, "text", min_files=2) == 0  # it lists the archive, as it was
    finally:
        live.stop()
    with caplog.at_level(logging.WARNING, logger="eventide.landing.archive"):
        assert compact_archive(settings, "text", min_files=2) == 0  # stopped partway: it would list it again
    assert "echo" in caplog.text and "stopped partway through it" in caplog.text and "run it again" in caplog.text

    live = LiveQuery(spark, plan, bounded, {}, trigger_seconds=0.5, say=lambda _: None)
    try:
        while not open_log(bounded).caught_up(plan) and time.monotonic() < deadline:
            live.poll()
            time.sleep(0.05)
        assert compact_archive(settings, "text", min_files=2) == 0  # read, but still listed by its source
        assert live.restart_if_source_outgrown()  # as `serve` does every archive round
        assert not lists_archive(bounded, plan) and not live.restart_if_source_outgrown()
        assert compact_archive(settings, "text", min_files=2) == 4
        land(settings, "text", [b"line 4"])
        while lake.count(settings.table_path("echo_lines")) < 5 and time.monotonic() < deadline:
            live.poll()
            time.sleep(0.05)
    finally:
        live.stop()
    assert sorted(r["text"] for r in lake.read(settings.table_path("echo_lines")).to_pylist()) == [
        f"line {i}" for i in range(5)]


def test_a_compaction_threshold_of_one_segment_is_refused_with_the_variable_named():
    from transforms.settings import ConfigError, Settings

    with pytest.raises(ConfigError, match="EVENTIDE_ARCHIVE_COMPACT_FILES=1: must be 0"):
        Settings.from_env({"EVENTIDE_ARCHIVE_COMPACT_FILES": "1"})
    assert Settings.from_env({"EVENTIDE_ARCHIVE_COMPACT_FILES": "0"}).archive_compact_files == 0
