"""Sinks without Spark: TCP sink addresses resolved before any Spark work, and the batch writer
handing a micro-batch to the sink writers (quarantine first)."""

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from transforms import lake
from transforms.api import Application, DeltaSink, Sink, TCPSink, decoder, encoder, source
from transforms.engine import (
    ENVELOPE,
    QUARANTINE_TABLE,
    BatchWriter,
    RunReport,
    plan_queries,
    run_application,
)
from transforms.engine.sinks import WRITERS, resolve_tcp_sinks
from transforms.registry import registry_of
from transforms.settings import ConfigError, Settings


@encoder
def as_line(out):
    return f"{out['text']}\n"


def _app(*sinks, name="y"):
    text = decoder(lambda p: {"text": p.decode()}, name="text")
    return Application(name, source("s", text).to_sink(*sinks))


@pytest.fixture(autouse=True)
def no_sink_env(monkeypatch):
    for var in ("EVENTIDE_SINK_X", "EVENTIDE_SINK_LINES"):
        monkeypatch.delenv(var, raising=False)


def test_a_tcp_sink_without_address_stops_the_app_before_spark(tmp_path):
    app = _app(DeltaSink("t"), TCPSink("x", as_line))
    with pytest.raises(ConfigError) as e:
        run_application(None, app, Settings(home=tmp_path, app_registry=registry_of([app])))
    assert str(e.value) == (
        "TCP sink 'x' of app 'y' has no address: set EVENTIDE_SINK_X=HOST:PORT (or pass address=...), "
        "or declare it TCPSink(..., optional=True) to send only when that variable is set"
    )


def test_where_a_tcp_sink_address_comes_from(monkeypatch):
    sink = TCPSink("x", as_line)
    assert resolve_tcp_sinks("y", [sink], {"x": "h:1"}) == {"x": "h:1"}
    assert resolve_tcp_sinks("y", [TCPSink("x", as_line, address="h:2")]) == {"x": "h:2"}
    assert resolve_tcp_sinks("y", [TCPSink("x", as_line, optional=True)]) == {"x": None}  # declared: off
    monkeypatch.setenv("EVENTIDE_SINK_X", "h:3")
    assert resolve_tcp_sinks("y", [sink]) == {"x": "h:3"}
    assert resolve_tcp_sinks("y", [sink], {"x": "h:1"}) == {"x": "h:1"}
    assert resolve_tcp_sinks("y", [TCPSink("x", as_line, address="h:2")]) == {"x": "h:2"}
    monkeypatch.setenv("EVENTIDE_SINK_X", "off")  # switches off any sink, even one with an address
    assert resolve_tcp_sinks("y", [sink, TCPSink("x", as_line, address="h:2")]) == {"x": None}
    monkeypatch.setenv("EVENTIDE_SINK_X", "nowhere")
    with pytest.raises(ConfigError, match="EVENTIDE_SINK_X='nowhere' is not HOST:PORT"):
        resolve_tcp_sinks("y", [sink])
    assert resolve_tcp_sinks("y", [DeltaSink("t")]) == {}


def test_every_kind_of_sink_has_a_writer():
    assert set(WRITERS) == set(Sink.__args__)


def _Batch(spark, table):
    """What foreachBatch hands the writer: a Spark DataFrame of envelopes, in two partitions."""
    return spark.createDataFrame(table).repartition(2)


def _envelopes(rows):
    base = {f.name: None for f in ENVELOPE}
    return pa.Table.from_pylist([{**base, "part": 0, "branch": 0, "stream": "s", **r} for r in rows], schema=ENVELOPE)


def _listener():
    server = socket.create_server(("127.0.0.1", 0))
    got = []

    def serve():
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(65536):
                got.append(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread, got


@pytest.mark.spark
def test_batch_writer_quarantines_first_then_writes_each_sink_once(spark, tmp_path):
    server, thread, got = _listener()
    app = _app(DeltaSink("t"), TCPSink("lines", as_line), TCPSink("x", as_line, optional=True))
    settings = Settings(home=tmp_path, app_registry=registry_of([app]))
    (plan,) = plan_queries(app, settings)
    batch = _Batch(spark, _envelopes([
        {"kind": "out", "seq": 2, "msg": pickle.dumps({"text": "b"})},
        {"kind": "quarantine", "seq": 3, "step": "decoder text", "reason": "bad", "payload": b"\xff"},
        {"kind": "out", "seq": 1, "msg": pickle.dumps({"text": "a"})},
    ]))
    report = RunReport(plan.name)
    writer = BatchWriter(plan, settings, report, resolve_tcp_sinks(app.name, plan.sinks, {"lines": f"127.0.0.1:{server.getsockname()[1]}"}))
    writer(batch, 0)
    writer(batch, 0)  # a replay: nothing twice
    writer.close()
    thread.join(5)
    server.close()
    assert sorted(r["text"] for r in lake.read(settings.table_path("t")).to_pylist()) == ["a", "b"]
    q = lake.read(settings.table_path(QUARANTINE_TABLE)).to_pylist()
    assert [(r["seq"], r["step"], r["payload"], r["query"]) for r in q] == [(3, "decoder text", b"\xff", "y")]
    assert b"".join(got) == b"a\nb\n"
    assert report.rows_written == {"t": 2, "tcp:lines": 4} and report.quarantined == 2
    assert report.batches == 2 and report.skipped_batches == 1


@pytest.mark.spark
def test_a_failing_sink_never_loses_the_quarantined_messages(spark, tmp_path):
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nobody listens there
    app = _app(TCPSink("lines", as_line))
    settings = Settings(home=tmp_path, app_registry=registry_of([app]))
    (plan,) = plan_queries(app, settings)
    writer = BatchWriter(plan, settings, RunReport(plan.name), {"lines": f"127.0.0.1:{port}"})
    batch = _Batch(spark, _envelopes([
        {"kind": "quarantine", "seq": 1, "step": "s", "reason": "bad", "payload": b"x"},
        {"kind": "out", "seq": 2, "msg": pickle.dumps({"text": "b"})},
    ]))
    with pytest.raises(RuntimeError, match="TCP sink 'lines' could not write"):
        writer(batch, 0)
    writer.close()
    assert [r["seq"] for r in lake.read(settings.table_path(QUARANTINE_TABLE)).to_pylist()] == [1]


def _tcp_settings(tmp_path, **settings) -> Settings:
    return Settings(home=tmp_path / "home", app_registry=registry_of([_app(TCPSink("lines", as_line))]), **settings)


def _tcp_writer(tmp_path, address: str, **settings):
    from transforms.engine.sinks import TCPSinkWriter, WriteContext

    s = _tcp_settings(tmp_path, **settings)
    (plan,) = plan_queries(s.registry.app("y"), s)
    (sink,) = plan.sinks
    report = RunReport(plan.name)
    return TCPSinkWriter(sink, WriteContext(plan, s, report, {"lines": address}), 0), report


# Far more than loopback's socket buffers hold: with the receiver not reading, the send blocks half way.
BIG_BATCH = b"".join(b"line%07d\n" % i for i in range(2_000_000))


def _wait_for_marker(marker, text: str) -> None:
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text() == text):
        assert time.monotonic() < deadline, f"the marker never said {text!r}"
        time.sleep(0.02)


SEND_IN_A_CHILD = """
import sys
from pathlib import Path
from tests.transforms.engine.test_sinks import BIG_BATCH, _tcp_writer
writer, _ = _tcp_writer(Path(sys.argv[1]), sys.argv[2])
writer._send_once(lambda: BIG_BATCH, 0)
"""


def test_a_kill_of_the_process_running_the_query_mid_send_never_cuts_a_tcp_batch(tmp_path):
    """`kill -9` of the query's whole process group while a batch is half sent: the sink's sender
    process finishes it, so the restarted writer finds it sent, and the receiver holds it once."""
    from tests.tcp import Receiver

    receiver = Receiver()
    receiver.reading.clear()
    root = Path(__file__).resolve().parents[3]
    child = subprocess.Popen([sys.executable, "-c", SEND_IN_A_CHILD, str(tmp_path), receiver.address], cwd=root,
                             start_new_session=True)  # its own group, so killpg below reaches only it and its children
    writer, report = _tcp_writer(tmp_path, receiver.address)
    try:
        _wait_for_marker(writer.marker, "-1 sending 0")
        time.sleep(0.3)  # the sender is blocked in the middle of the batch
        os.killpg(child.pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        receiver.reading.set()
    assert writer._send_once(lambda: BIG_BATCH, 0) is False  # the replay: already sent, not again
    writer.close()
    assert receiver.all_bytes() == BIG_BATCH
    assert writer.marker.read_text() == "0" and report.tcp_in_doubt == [] and not writer.in_doubt_log.exists()


@pytest.mark.parametrize("policy", ["resend", "skip"])
def test_a_tcp_batch_cut_by_a_kill_of_its_sender_is_in_doubt_resent_or_skipped_and_recorded(tmp_path, capsys, policy):
    from orchestration.status import compute_status, format_status
    from tests.tcp import Receiver

    receiver = Receiver()
    writer, _ = _tcp_writer(tmp_path, receiver.address, tcp_in_doubt=policy)
    assert writer._send_once(lambda: b"a\n", 0) and not writer._send_once(lambda: b"a\n", 0)  # a replay: not again

    receiver.reading.clear()
    failed = []
    sending = threading.Thread(target=lambda: failed.append(pytest.raises(RuntimeError, writer._send_once, lambda: BIG_BATCH, 1)))
    sending.start()
    _wait_for_marker(writer.marker, "0 sending 1")
    time.sleep(0.3)
    os.kill(writer.sender.proc.pid, signal.SIGKILL)  # the sender itself dies half way through the batch
    receiver.reading.set()
    sending.join(30)
    assert "its sender process stopped" in str(failed[0].value)

    again, report = _tcp_writer(tmp_path, receiver.address, tcp_in_doubt=policy)  # the restarted query
    assert again._send_once(lambda: BIG_BATCH, 1) is (policy == "resend")
    assert again._send_once(lambda: b"c\n", 2) and not again._send_once(lambda: BIG_BATCH, 1)
    again.close()
    writer.close()
    # The killed sender's connection may still be read while the restarted one sends: by connection.
    received = receiver.all_bytes(connections=2)
    tail = (BIG_BATCH if policy == "resend" else b"") + b"c\n"
    assert received.startswith(b"a\n") and received.endswith(tail)
    part = received[2:len(received) - len(tail)]
    assert 0 < len(part) < len(BIG_BATCH) and BIG_BATCH.startswith(part)  # a part of batch 1 got there before
    assert report.tcp_in_doubt == [1]
    err = capsys.readouterr().err
    assert f"batch 1 ({len(BIG_BATCH)} bytes) was being sent when its sender process stopped" in err
    assert "EVENTIDE_TCP_IN_DOUBT" in err
    (record,) = [json.loads(line) for line in again.in_doubt_log.read_text().splitlines()]
    assert record["batch"] == 1 and record["action"] == policy and record["bytes"] == len(BIG_BATCH)
    status = compute_status(_tcp_settings(tmp_path))
    assert [q.tcp_in_doubt for q in status.queries if q.tcp_in_doubt] == [{"lines": 1}]
    assert "y, TCP sink lines: 1 batch(es), listed in" in format_status(status)


def test_a_tcp_receiver_that_is_not_listening_leaves_nothing_in_doubt(tmp_path):
    from tests.tcp import Receiver
    from transforms.ports import free_port

    port = free_port()  # nothing listens there, and no port-0 bind elsewhere takes it meanwhile
    writer, report = _tcp_writer(tmp_path, f"127.0.0.1:{port}")
    with pytest.raises(RuntimeError, match="Is the receiver listening"):
        writer._send_once(lambda: b"a\n", 0)
    receiver = Receiver(port)
    assert writer._send_once(lambda: b"a\n", 0)
    writer.close()
    assert receiver.all_bytes() == b"a\n" and report.tcp_in_doubt == [] and not writer.in_doubt_log.exists()


def test_a_tcp_sender_waits_for_the_previous_one_and_gives_up_when_its_query_goes(tmp_path, capsys):
    """The sink's lock is held (by a previous sender still finishing a batch): a new sender says whom
    it waits for and starts once the lock is free; one whose query went away meanwhile just exits."""
    import fcntl

    from tests.tcp import Receiver
    from transforms.tcp_relay import lock_path

    receiver = Receiver()
    writer, _ = _tcp_writer(tmp_path, receiver.address)
    writer.marker.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path(writer.marker), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242")
        held.flush()
        orphan = subprocess.Popen([sys.executable, "-m", "transforms.tcp_relay", str(writer.marker), receiver.address],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[3])
        assert orphan.stdout.readline() == b"waiting 4242\n"
        orphan.stdin.close()  # its query is gone: it stops waiting
        assert orphan.wait(5) == 0 and orphan.stdout.read() == b""

        threading.Timer(0.5, lambda: fcntl.flock(held, fcntl.LOCK_UN)).start()
        assert writer._send_once(lambda: b"a\n", 0)  # waits, then sends
    writer.close()
    assert receiver.all_bytes() == b"a\n"
    assert "waiting for the previous sender (pid 4242) to finish its batch" in capsys.readouterr().err


@pytest.mark.spark
def test_an_upserts_last_row_per_key_is_the_one_of_the_highest_order(spark):
    """`last_per_key` (a hash aggregate) against its definition: per key, the row of the highest
    (seq, part); keys of two columns, a null key, a column name that needs quoting."""
    import random

    from transforms.engine.sink_rows import ORDER
    from transforms.engine.sinks import last_per_key

    rnd = random.Random(7)
    rows = []
    for seq in rnd.sample(range(100_000), 600):
        for part in range(rnd.randint(1, 3)):
            rows.append({"word": rnd.choice(["a", "b", "c", None]), "n`x": rnd.randint(0, 3),
                         "count": rnd.randint(0, 10**9), ORDER[0]: seq, ORDER[1]: part})
    want: dict = {}
    for r in sorted(rows, key=lambda r: (r[ORDER[0]], r[ORDER[1]])):
        want[(r["word"], r["n`x"])] = {k: v for k, v in r.items() if k not in ORDER}
    got = last_per_key(spark.createDataFrame([tuple(r.values()) for r in rows], list(rows[0])), ["word", "n`x"])
    assert got.columns == ["word", "n`x", "count"]
    assert sorted(map(tuple, (r.asDict().values() for r in got.collect())), key=repr) == \
        sorted((tuple(r.values()) for r in want.values()), key=repr)
