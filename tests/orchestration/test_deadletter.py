"""The dead-letter queue (issue 12, point 3): one quarantine row per bad message and step, `eventide
quarantine` (counts, rows), and `eventide quarantine replay` after a fix, exactly once.

The scenario: a user's app whose decoder refuses "+7" (v1). Its payloads are quarantined once each,
though two queries (bronze and the app) read the stream. Then the decoder is fixed (v2 accepts "+7";
"broken" still fails, with v2's reason) and `eventide quarantine replay` runs in a new process with
the fixed module: "+7" lands in bronze and the app's table once and leaves the view; "broken" stays,
under its new seq with its new reason; a second replay does nothing.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, land
from transforms import lake
from transforms.deadletter import REPLAYS_TABLE, counts, dead_letters, reason_group, replay_blocker
from transforms.settings import Settings, reset_settings

GAUGES = '''
import pyarrow as pa

from transforms.api import Application, DeltaSink, Reject, decoder, source


@decoder(schema=pa.schema([("name", pa.string()), ("value", pa.int64())]))
def decode_gauge(payload: bytes):
    name, _, value = payload.decode().strip().partition(",")
    {check}
    return {{"name": name, "value": int(value)}}


app = Application("dl_gauges", source("dl_gauges", decoder=decode_gauge).to_sink(DeltaSink("dl_gauge_values")))
'''
V1 = 'if not value.isdigit():\n        return Reject(f"gauge v1: expected digits, got {value!r}")'
V2 = ('if not value.lstrip("+-").isdigit():\n'
      '        return Reject(f"gauge v2: expected an integer, got {value!r}")')


def test_reason_groups_drop_the_per_message_detail():
    assert reason_group("market data: expected a finite bid >= 0, got -1e+308") == \
        "market data: expected a finite bid >= 0, got ..."
    assert reason_group("ZeroDivisionError: division by zero\nmore") == "ZeroDivisionError: division by zero"
    assert replay_blocker("decoder decode_gauge") is None
    assert "not one message" in replay_blocker("gateway")
    assert "count it twice" in replay_blocker("computation to fahrenheit")


def _eventide(tmp_path, env, *args, check=True):
    eventide = os.path.join(os.path.dirname(sys.executable), "eventide")
    proc = subprocess.run([eventide, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, f"{args}: {proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return proc


def _rows(settings, table):
    path = settings.table_path(table)
    return sorted(lake.read(path).to_pylist(), key=lambda r: r.get("seq") or 0) if lake.exists(path) else []


@pytest.mark.spark
def test_quarantine_once_then_replay_after_a_fix(tmp_path, monkeypatch):
    module = tmp_path / "dl_gauges.py"
    module.write_text(textwrap.dedent(GAUGES.format(check=V1)))
    home, apps = tmp_path / "home", "dl_gauges:app"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EVENTIDE_HOME", str(home))
    monkeypatch.setenv("EVENTIDE_APPS", apps)
    reset_settings()
    settings = Settings(home=home, apps=apps)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}

    land(settings, "dl_gauges", [b"a,1", b"b,+7", b"c,broken", b"d,4"])  # seq 1..4
    _eventide(tmp_path, env, "run")

    # One row per bad message and step, though bronze and the app both rejected each.
    q = _rows(settings, "quarantine")
    assert [(r["seq"], r["step"], r["payload"]) for r in q] == [
        (2, "decoder decode_gauge", b"b,+7"), (3, "decoder decode_gauge", b"c,broken")]
    assert {r["query"] for r in q} <= {"bronze_dl_gauges", "dl_gauges"}  # the first writer's
    assert counts(dead_letters(settings)) == [
        {"stream": "dl_gauges", "step": "decoder decode_gauge", "reason": "gauge v1: expected digits, got ...",
         "messages": 2, "replayable": True}]

    # The CLI: counts, then the rows of a selection with the exact payloads in base64.
    overview = _eventide(tmp_path, env, "quarantine").stdout
    assert "gauge v1: expected digits, got ..." in overview and "2 message(s) waiting" in overview
    shown = [json.loads(line) for line in
             _eventide(tmp_path, env, "quarantine", "--reason", "'+7'", "--format", "json").stdout.splitlines()]
    assert shown == [{"seq": 2, "stream": "dl_gauges", "step": "decoder decode_gauge",
                      "reason": "gauge v1: expected digits, got '+7'",
                      "payload_base64": base64.b64encode(b"b,+7").decode()}]

    # The fix, then the replay in a new process (it imports the fixed module).
    module.write_text(textwrap.dedent(GAUGES.format(check=V2)))
    out = _eventide(tmp_path, env, "quarantine", "replay").stdout
    assert "replayed 2: 1 went through, 1 failed again" in out, out

    bronze = [(r["name"], r["value"]) for r in _rows(settings, "bronze_dl_gauges")]
    values = [(r["name"], r["value"]) for r in _rows(settings, "dl_gauge_values")]
    assert sorted(bronze) == sorted(values) == [("a", 1), ("b", 7), ("d", 4)]
    replays = {(r["stream"], r["original_seq"]): r["new_seq"] for r in _rows(settings, REPLAYS_TABLE)}
    assert set(replays) == {("dl_gauges", 2), ("dl_gauges", 3)} and min(replays.values()) > 4
    view = dead_letters(settings).to_pylist()
    assert [(r["seq"], r["reason"], r["payload"], r["connection"]) for r in view] == [
        (replays[("dl_gauges", 3)], "gauge v2: expected an integer, got 'broken'", b"c,broken", "replay:3")]

    # Again: nothing is selected twice, nothing lands twice.
    again = _eventide(tmp_path, env, "quarantine", "replay", "--reason", "+7").stdout
    assert "selected 0 dead letter(s)" in again and "nothing to replay" in again
    assert len(_rows(settings, "bronze_dl_gauges")) == 3 and len(_rows(settings, REPLAYS_TABLE)) == 2


def test_a_replay_interrupted_before_recording_never_lands_twice(tmp_path, monkeypatch):
    """No Spark: a quarantine row as a run leaves it, replayed; then `quarantine_replays` is lost (a crash
    between landing and recording) and the replay runs again: it lands nothing, and records the first."""
    import shutil

    import pyarrow as pa

    from transforms.deadletter import landed_replays, replay
    from transforms.engine.sinks import QUARANTINE_SCHEMA
    from transforms.ingestion.landing import read_landed

    (tmp_path / "dl_gauges.py").write_text(textwrap.dedent(GAUGES.format(check=V1)))
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = Settings(home=tmp_path / "home", apps="dl_gauges:app")
    land(settings, "dl_gauges", [b"b,+7"])
    row = {"query": "dl_gauges", "stream": "dl_gauges", "seq": 1, "receive_time": None, "connection": "test",
           "step": "decoder decode_gauge", "reason": "gauge v1: expected digits, got '+7'", "payload": b"b,+7",
           "batch_id": 0}
    from transforms.spark import get_spark

    lake.append_once(get_spark(settings).createDataFrame(pa.Table.from_pylist([row], schema=QUARANTINE_SCHEMA)),
                     settings.table_path("quarantine"), "t", 0)

    first = replay(settings)
    assert (first.landed, first.recorded) == ({("dl_gauges", 1): 2}, 1)
    assert dead_letters(settings).num_rows == 0
    shutil.rmtree(settings.table_path(REPLAYS_TABLE))
    assert dead_letters(settings).num_rows == 1

    second = replay(settings)
    assert (second.landed, second.already_landed, second.recorded) == ({}, 1, 1)
    assert landed_replays(settings).to_pylist()[0]["new_seq"] == 2
    assert read_landed(settings, "dl_gauges").column("connection").to_pylist() == ["test", "replay:1"]
    assert dead_letters(settings).num_rows == 0
    assert replay(settings).selected == 0
