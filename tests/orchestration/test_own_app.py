"""A user's own app, written in a folder outside the repo and registered with EVENTIDE_APPS, driven
through every entry point: `eventide serve` + `eventide send` over TCP, `eventide run` (with a TCP
sink), `dagster asset materialize -m orchestration.definitions` (its asset and check), `eventide show`.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.services import clean_env
from tests.tcp import Receiver

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

THERMO_APP = '''
"""Wallaroo's celsius example, grown up: binary readings, per-sensor windows of 2, a check, a TCP sink."""
import struct
from dataclasses import dataclass

import pyarrow as pa

from transforms.api import (Application, DeltaSink, TCPSink, check, computation, decoder, encoder, source)
from windows import Aggregator
from transforms.windowing import trigger_windows

READING = struct.Struct(">8sd")  # sensor id (8 bytes, space padded), degrees celsius


@dataclass
class Reading:
    sensor: str
    celsius: float


@decoder(schema=pa.schema([("sensor", pa.string()), ("celsius", pa.float64())]))
def decode_reading(payload: bytes) -> Reading:
    if len(payload) != READING.size:
        raise ValueError(f"expected {READING.size} bytes, got {len(payload)}")
    sensor, celsius = READING.unpack(payload)
    return Reading(sensor.decode().strip(), celsius)


@computation("to fahrenheit")
def to_fahrenheit(r: Reading) -> Reading:
    return Reading(r.sensor, r.celsius * 9 / 5 + 32)


@dataclass
class WindowMax:
    sensor: str
    first_seq: int
    readings: int
    max_f: float


def window_row(w) -> WindowMax:
    return WindowMax(w.key, w.first_seq, w.size, w.value)


@check("readings_positive")
def readings_positive(df) -> bool:
    return bool((df["readings"] > 0).all())


@encoder
def encode_alert(row: WindowMax) -> bytes:
    return f"{row.sensor} {row.max_f:.1f}\\n".encode()


app = Application(
    "thermo",
    source("thermo", decoder=decode_reading)
    .to(to_fahrenheit)
    .key_by("sensor")
    .to(trigger_windows(max_count=2).over(Aggregator(create=lambda: float("-inf"), add=lambda acc, r: max(acc, r.celsius)))
        .emit(window_row))
    .to_sink(
        DeltaSink("thermo_windows", checks=[readings_positive]),
        TCPSink("thermo_alerts", encode_alert),
    ),
)
'''

READINGS = [("kitchen", 20.0), ("garage", 5.0), ("kitchen", 25.0), ("garage", 10.0), ("kitchen", 30.0)]


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _env(tmp_path: Path, **extra) -> dict:
    env = clean_env()
    env.update(EVENTIDE_HOME=str(tmp_path / "home"), EVENTIDE_APPS="thermo_app:app", PYTHONPATH=str(tmp_path),
               DAGSTER_HOME=str(tmp_path / "home" / "dagster"), **extra)
    return env


def _eventide(tmp_path, *args, timeout=300, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "eventide"), *args], cwd=tmp_path, env=_env(tmp_path, **extra),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.spark
def test_own_app_through_serve_send_run_dagster_and_show(tmp_path):
    (tmp_path / "thermo_app.py").write_text(textwrap.dedent(THERMO_APP))
    readings = tmp_path / "readings.bin"  # framed binary, under a name that does not say so
    readings.write_bytes(b"".join(_frame(struct.pack(">8sd", s.ljust(8).encode(), c)) for s, c in READINGS))

    # 1. serve: a port for the app's own stream, assigned and recorded under the home.
    serve = subprocess.Popen([str(BIN / "eventide"), "serve", "--gateway-only"], cwd=tmp_path, env=_env(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             preexec_fn=lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL),
                                                 signal.signal(signal.SIGTERM, signal.SIG_DFL)))
    try:
        deadline = time.monotonic() + 60
        lines = []
        while not any("listening for thermo" in line for line in lines):
            assert time.monotonic() < deadline and serve.poll() is None, lines
            lines.append(serve.stdout.readline())
        sent = _eventide(tmp_path, "send", "thermo", str(readings), "--framed")
        assert sent.returncode == 0, sent.stderr
        assert "sent 5 messages" in sent.stdout
    finally:
        os.kill(serve.pid, signal.SIGTERM)
        serve.wait(timeout=30)

    # 2. run: the app's windows land in Delta, and its TCP sink gets exactly these bytes.
    listener = Receiver()
    run = _eventide(tmp_path, "run", EVENTIDE_SINK_THERMO_ALERTS=f"127.0.0.1:{listener.port}")
    assert run.returncode == 0, run.stdout + run.stderr
    deadline = time.monotonic() + 10
    want = b"garage 50.0\nkitchen 77.0\n"
    while sorted(listener.received().splitlines(keepends=True)) != sorted(want.splitlines(keepends=True)):
        assert time.monotonic() < deadline, listener.received()
        time.sleep(0.1)

    # 3. show: the exact rows.
    shown = _eventide(tmp_path, "show", "thermo_windows", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = sorted((json.loads(line) for line in shown.stdout.splitlines() if line.strip()), key=lambda r: r["sensor"])
    assert [(r["sensor"], r["readings"], r["max_f"]) for r in rows] == [("garage", 2, 50.0), ("kitchen", 2, 77.0)]

    # 4. Dagster: the app's asset and its check, materialized and passing, without editing Eventide.
    mat = subprocess.run(
        [str(BIN / "dagster"), "asset", "materialize", "-m", "orchestration.definitions", "--select", "thermo_windows"],
        cwd=REPO, env=_env(tmp_path, EVENTIDE_SINK_THERMO_ALERTS=f"127.0.0.1:{listener.port}"),
        capture_output=True, text=True, timeout=300,
    )
    out = mat.stdout + mat.stderr
    assert mat.returncode == 0, out[-3000:]
    assert "thermo_windows" in out and "readings_positive" in out
    assert "ASSET_CHECK_EVALUATION" in out and "passed" in out.lower()
