"""Sinks without Spark: TCP sink addresses resolved before any Spark work, and the batch writer
handing a micro-batch to the sink writers (quarantine first)."""

import pickle
import socket
import threading

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
from transforms.engine.staging import InProcessBatch
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


def _Batch(table):
    """What foreachBatch hands the writer, already computed, staged here in two "tasks" (the real
    engine's staging runs in tests/transforms/test_write_paths.py)."""
    return InProcessBatch(table, tasks=2)


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


@pytest.mark.parametrize("write_path", ["executor", "driver"])
def test_batch_writer_quarantines_first_then_writes_each_sink_once(tmp_path, write_path):
    server, thread, got = _listener()
    app = _app(DeltaSink("t"), TCPSink("lines", as_line), TCPSink("x", as_line, optional=True))
    settings = Settings(home=tmp_path, app_registry=registry_of([app]), write_path=write_path)
    (plan,) = plan_queries(app, settings)
    batch = _Batch(_envelopes([
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


@pytest.mark.parametrize("write_path", ["executor", "driver"])
def test_a_failing_sink_never_loses_the_quarantined_messages(tmp_path, write_path):
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nobody listens there
    app = _app(TCPSink("lines", as_line))
    settings = Settings(home=tmp_path, app_registry=registry_of([app]), write_path=write_path)
    (plan,) = plan_queries(app, settings)
    writer = BatchWriter(plan, settings, RunReport(plan.name), {"lines": f"127.0.0.1:{port}"})
    batch = _Batch(_envelopes([
        {"kind": "quarantine", "seq": 1, "step": "s", "reason": "bad", "payload": b"x"},
        {"kind": "out", "seq": 2, "msg": pickle.dumps({"text": "b"})},
    ]))
    with pytest.raises(RuntimeError, match="TCP sink 'lines' could not write"):
        writer(batch, 0)
    writer.close()
    assert [r["seq"] for r in lake.read(settings.table_path(QUARANTINE_TABLE)).to_pylist()] == [1]
