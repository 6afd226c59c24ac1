"""`eventide status`: landed, processed and lag per log and query, read from the home's files only."""

import ast
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestration.cli import main
from orchestration.status import compute_status, query_plans
from tests.conftest import REPO, land
from transforms.engine.checkpoints import processed_segments
from transforms.ingestion.landing import Lander
from transforms.ingestion.segments import segment_name

T0 = 1_700_000_000.0  # a fixed receive time: lags in seconds are exact


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="milliseconds")


def _land_at(settings, at: float, messages) -> None:
    """Land (stream, payload) pairs received at `at`, and close the segment."""
    with Lander(settings, clock=lambda: at) as lander:
        for stream, payload in messages:
            lander.append(stream, payload, "test")


def _by_name(status):
    return {g.log: g for g in status.logs}, {q.query: q for q in status.queries}


def _fake_checkpoint(checkpoint: Path, segments: list[str]) -> None:
    """A checkpoint whose batch 0 committed, having read `segments` (the layout Spark writes)."""
    for sub in ("commits", "offsets", "sources/0"):
        (checkpoint / sub).mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    (checkpoint / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0,"conf":{}}\n{"logOffset":0}')
    entries = [json.dumps({"path": f"file:///elsewhere/{s}", "timestamp": 1, "batchId": 0}) for s in segments]
    (checkpoint / "sources" / "0" / "0").write_text("\n".join(["v1", *entries]))


ROUNDING = 0.001


@pytest.mark.spark
def test_status_follows_landing_and_a_real_bronze_run(spark, settings):
    from transforms.engine import run_application
    from transforms.streams import bronze_application

    before = time.time()
    land(settings, "text", [b"the cat", b"the dog", b"a cat", b"a dog"])  # seq 1..4
    after = time.time()
    logs, queries = _by_name(compute_status(settings, now=after + 30))
    text = logs["text"]
    assert (text.segments, text.messages, text.last_seq, text.open, text.open_last_seq) == (1, 4, 4, 0, None)
    assert (logs["logs"].messages, logs["market_data+orders"].messages) == (0, 0)
    for name in ("bronze_text", "word_count"):
        q = queries[name]
        progress = (q.last_committed_batch, q.processed_segments, q.processed_last_seq, q.lag_messages)
        assert progress == (None, 0, None, 4)
        assert 30 <= q.lag_seconds <= after + 30 - before + ROUNDING  # status rounds to the millisecond
    assert queries["bronze_logs"].lag_messages == 0 and queries["bronze_logs"].lag_seconds == 0.0

    (report,) = run_application(spark, bronze_application(settings.registry.stream("text")), settings)
    assert report.input_rows == 4
    logs, queries = _by_name(compute_status(settings, now=after + 60))
    bronze, words = queries["bronze_text"], queries["word_count"]
    assert (bronze.last_committed_batch, bronze.processed_segments, bronze.processed_last_seq) == (0, 1, 4)
    assert (bronze.lag_messages, bronze.lag_seconds, bronze.oldest_unprocessed) == (0, 0.0, None)
    assert (words.processed_last_seq, words.lag_messages) == (None, 4)
    assert 60 <= words.lag_seconds <= after + 60 - before + ROUNDING

    # More: two in a closed segment, one still in an open journal (landed, not visible to queries).
    land(settings, "text", [b"a bird", b"the end"])  # seq 5, 6
    with Lander(settings, clock=lambda: T0) as lander:
        lander.append("text", b"still open", "test")  # seq 7
        lander.sync()
        logs, queries = _by_name(compute_status(settings, now=after + 90))
    text = logs["text"]
    assert (text.segments, text.messages, text.last_seq, text.open, text.open_last_seq) == (2, 6, 6, 1, 7)
    bronze, words = queries["bronze_text"], queries["word_count"]
    assert (bronze.processed_last_seq, bronze.lag_messages) == (4, 3)
    assert (words.processed_last_seq, words.lag_messages) == (None, 7)


def test_lag_counts_the_querys_own_streams_open_journals_and_exact_seconds(settings):
    # One log, two streams (merged by market_spread); the payloads are not decoded by status.
    _land_at(settings, T0, [("market_data", b"q1"), ("orders", b"o1"), ("orders", b"o2"),
                            ("market_data", b"q2"), ("orders", b"o3")])  # seq 1..5, one segment
    segment = segment_name(1, 5)
    with Lander(settings, clock=lambda: T0 + 10) as lander:
        lander.append("orders", b"o4", "test")  # seq 6, open
        lander.sync()
        logs, queries = _by_name(compute_status(settings, now=T0 + 60))
        log = logs["market_data+orders"]
        assert (log.streams, log.segments, log.messages, log.last_seq, log.open, log.open_last_seq) == (
            ["market_data", "orders"], 1, 5, 5, 1, 6)
        lags = {n: (queries[n].lag_messages, queries[n].lag_seconds, queries[n].oldest_unprocessed)
                for n in ("bronze_market_data", "bronze_orders", "market_spread")}
        assert lags == {"bronze_market_data": (2, 60.0, _iso(T0)), "bronze_orders": (4, 60.0, _iso(T0)),
                        "market_spread": (6, 60.0, _iso(T0))}

        # The segment processed: what is left is the open record, received 10 s after T0.
        plans = {p.name: p for p in query_plans(settings)}
        for name in ("bronze_orders", "market_spread"):
            _fake_checkpoint(plans[name].checkpoint(settings), [segment])
        _, queries = _by_name(compute_status(settings, now=T0 + 60))
    got = {n: (q.processed_last_seq, q.lag_messages, q.lag_seconds, q.oldest_unprocessed)
           for n, q in queries.items() if n in lags}
    assert got == {"bronze_market_data": (None, 2, 60.0, _iso(T0)),
                   "bronze_orders": (5, 1, 50.0, _iso(T0 + 10)),
                   "market_spread": (5, 1, 50.0, _iso(T0 + 10))}


def test_checkpoint_reading_follows_compaction_and_the_file_source_offset(tmp_path):
    """The layout of a real checkpoint of a query with timers (seen from Spark 4.1): the file source's
    log counts its own batches (behind the query's batch ids: clock-only batches add no entry) and is
    compacted every 10 entries; a planned batch that has not committed is not processed."""
    ckpt = tmp_path / "ckpt"
    assert processed_segments(ckpt) == (None, set())  # never run
    src = ckpt / "sources" / "0"
    for sub in ("commits", "offsets", "sources/0"):
        (ckpt / sub).mkdir(parents=True)
    names = [segment_name(i * 10 + 1, i * 10 + 10) for i in range(13)]

    def entry(batch):
        path = f"file:///home/x/landing/text/{names[batch]}"
        return json.dumps({"path": path, "timestamp": 1, "batchId": batch})

    (ckpt / "offsets" / "21").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":12}\n'
                                         '{"offset":22,"timestamp":1}')
    (src / "12").write_text("v1\n" + entry(12))
    assert processed_segments(ckpt) == (None, set())  # planned, nothing committed
    (src / "9.compact").write_text("\n".join(["v1", *(entry(b) for b in range(10))]))
    (src / ".9.compact.crc").write_text("junk")
    (src / "10").write_text("v1\n" + entry(10))
    (src / "11").write_text("v1\n" + entry(11))
    (src / "5").write_text("v1\n" + entry(5))  # an old batch file next to its compaction: counted once
    for batch, log_offset in ((19, 10), (20, 11)):
        offsets = ["v1", '{"batchWatermarkMs":0}', json.dumps({"logOffset": log_offset}),
                   '{"offset":1,"timestamp":1}']
        (ckpt / "offsets" / str(batch)).write_text("\n".join(offsets))
        (ckpt / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (ckpt / "commits" / ".20.crc").write_text("junk")
    assert processed_segments(ckpt) == (20, set(names[:12]))  # not names[12]: batch 21 has not committed
    (ckpt / "commits" / "21").write_text('v1\n{"nextBatchWatermarkMs":0}')
    assert processed_segments(ckpt) == (21, set(names))


def test_cli_json_shape_a_running_serve_and_lock_holders(settings, monkeypatch, capsys):
    from transforms.engine.locks import QueryLock
    from transforms.ingestion.gateway import record_ports

    monkeypatch.setenv("EVENTIDE_APPS", settings.apps)  # `--app` sets it: restored after the test
    land(settings, "text", [b"one", b"two"])
    record_ports(settings, {"text": 1234}, queries=True)  # as `eventide serve` does; this process is alive
    lock = QueryLock(settings, "word_count", command="eventide serve")
    # word_count's state store as Spark lays it out (state/<operator>/<partition>/...): its bytes, summed
    words_state = {p.name: p for p in query_plans(settings)}["word_count"].checkpoint(settings) / "state" / "0"
    for name, size in (("0/1.changelog", 1000), ("0/2.zip", 2500), ("7/1.changelog", 300), ("_metadata/v2", 46)):
        (words_state / name).parent.mkdir(parents=True, exist_ok=True)
        (words_state / name).write_bytes(b"x" * size)
    lock.acquire()
    try:
        assert main(["status", "--format", "json", "--app", "examples.words:app"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert main(["status", "--app", "examples.words:app"]) == 0
        table = capsys.readouterr().out
    finally:
        lock.release()
    assert list(doc) == ["version", "home", "generated_at", "serve", "logs", "queries", "tables"]
    assert doc["tables"] == []  # nothing processed yet: no table
    assert doc["version"] == 1 and doc["home"] == str(settings.home.absolute())
    started_at = doc["serve"]["started_at"]
    assert doc["serve"] == {"running": True, "pid": os.getpid(), "host": settings.bind_host,
                            "ports": {"text": 1234}, "queries": True, "started_at": started_at}
    assert isinstance(doc["serve"]["started_at"], str)
    assert doc["logs"] == [{"log": "text", "streams": ["text"], "kind": "landing", "segments": 1, "messages": 2,
                            "last_seq": 2, "open": 0, "open_last_seq": None, "topic": None, "end_offset": None,
                            "error": None}]
    assert [q["query"] for q in doc["queries"]] == ["bronze_text", "word_count"]
    bronze, words = doc["queries"]
    assert list(bronze) == ["query", "app", "log", "streams", "checkpoint", "last_committed_batch",
                            "processed_segments", "processed_last_seq", "processed_offset", "lag_messages", "lag_seconds",
                            "oldest_unprocessed", "held_by", "tcp_in_doubt", "processed_offsets", "state_bytes"]
    assert bronze["tcp_in_doubt"] == {}
    assert (bronze["state_bytes"], words["state_bytes"]) == (None, 3846)  # bronze keeps no state
    assert bronze["checkpoint"] == str((settings.checkpoints / "bronze_text" / "v1").absolute())
    progress = [bronze[k] for k in ("log", "last_committed_batch", "processed_last_seq", "lag_messages")]
    assert progress == ["text", None, None, 2]
    assert bronze["held_by"] is None
    held = {k: words["held_by"][k] for k in ("pid", "command")}
    assert held == {"pid": os.getpid(), "command": "eventide serve"}
    assert f"eventide serve: running, pid {os.getpid()}, gateway and queries; ports text=1234" in table
    assert f"eventide serve (pid {os.getpid()})" in table
    (words_row,) = [line for line in table.splitlines() if line.startswith("word_count ")]
    assert " 3.8 KB " in words_row


def test_status_starts_no_spark(settings):
    """Status reads files: no Spark import in its module, no JVM started (none could be: no Java)."""
    source = (REPO / "orchestration" / "status.py").read_text()
    nodes = list(ast.walk(ast.parse(source)))
    imported = {n.name for node in nodes if isinstance(node, ast.Import) for n in node.names}
    imported |= {node.module for node in nodes if isinstance(node, ast.ImportFrom)}
    assert not [m for m in imported if m and m.split(".")[0] == "pyspark"]
    land(settings, "text", [b"one", b"two", b"three"])
    probe = """
import json, os, sys
from orchestration.cli import main

assert main(["status", "--format", "json"]) == 0
ctx = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
jvm = bool(ctx and (ctx.SparkContext._gateway or ctx.SparkContext._active_spark_context))
kids = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid()):
            kids.append(pid)
    except OSError:
        pass  # gone meanwhile
print(json.dumps({"jvm": jvm, "children": kids}))
"""
    env = {**os.environ, "EVENTIDE_HOME": str(settings.home), "JAVA_HOME": "/nonexistent",
           "PYTHONPATH": str(REPO)}
    started = time.time()
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert time.time() - started < 20
    doc, probe_result = json.loads("\n".join(out[:-1])), json.loads(out[-1])
    assert probe_result == {"jvm": False, "children": []}
    assert [(q["query"], q["lag_messages"]) for q in doc["queries"] if q["log"] == "text"] == [
        ("bronze_text", 3), ("word_count", 3)]


def test_a_segment_archived_by_serve_while_status_reads_is_found_in_the_archive(settings, monkeypatch):
    import orchestration.status as status_module
    import transforms.ingestion.landing as landing_module
    from tests.conftest import land
    from transforms.ingestion.archive import archive_segments

    land(settings, "text", [b"a"])
    land(settings, "text", [b"b c"])
    listed = landing_module.list_segments

    def list_then_archive(s, log, *args, **kwargs):  # serve archives right after status listed
        out = listed(s, log, *args, **kwargs)
        if log == "text":
            archive_segments(s, "text", {p.name for p in out})
        return out

    monkeypatch.setattr(landing_module, "list_segments", list_then_archive)
    (text,) = [log for log in status_module.compute_status(settings).logs if log.log == "text"]
    assert (text.segments, text.messages) == (2, 2)
