"""`eventide serve`, `send` and `apps` with an app written outside the repo (a new stream `temps`),
registered with EVENTIDE_APPS or --app: its port (free, recorded for `send`; or EVENTIDE_PORTS), and
what `eventide apps` says about it. Real processes, real sockets; no JVM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.services import Service, clean_env
from transforms.ingestion.gateway import record_ports, running_gateway, state_path
from transforms.ingestion.landing import read_landed
from transforms.ports import free_port
from transforms.settings import Settings

EVENTIDE = str(Path(sys.executable).parent / "eventide")

TEMPS_APP = '''
import pyarrow as pa
from transforms.api import Application, DeltaSink, TCPSink, decoder, encoder, source

@decoder(schema=pa.schema([("line", pa.string())]))
def decode_line(payload: bytes) -> dict:
    return {"line": payload.decode().strip()}

@encoder
def encode_line(row) -> bytes:
    return row["line"].encode()

app = Application("temps", source("temps", decoder=decode_line)
                  .to_sink(DeltaSink("temps_lines"), TCPSink("temps_alerts", encode_line)))
'''
LINES = [b"kitchen,21.5\n", b"garage,4.0\n"]


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "temps_app.py").write_text(textwrap.dedent(TEMPS_APP))
    (tmp_path / "temps.txt").write_bytes(b"".join(LINES))
    return tmp_path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = clean_env()
    return {**env, "EVENTIDE_HOME": str(tmp_path / "home"), **extra}


def _eventide(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([EVENTIDE, *args], cwd=tmp_path, env=_env(tmp_path, **extra), capture_output=True,
                          text=True, timeout=120)


def _landed(tmp_path: Path) -> list[bytes]:
    return [r["payload"] for r in read_landed(Settings(home=tmp_path / "home"), "temps").to_pylist()]


def test_serve_records_a_free_port_that_send_finds(tmp_path):
    folder = _folder(tmp_path)
    home = tmp_path / "home"
    service = Service(_env(folder, EVENTIDE_APPS="temps_app:app"), folder, [EVENTIDE, "serve", "--gateway-only"])
    try:
        line = service.wait_for_line("listening for temps on 127.0.0.1:")
        port = int(line.rpartition(":")[2])
        assert port != 0
        service.wait_for_line("ports recorded in")
        record = json.loads((home / "gateway.json").read_text())
        assert record["pid"] == service.proc.pid and record["ports"] == {"temps": port}
        assert record["host"] == "127.0.0.1" and record["started_at"]

        sent = _eventide(folder, "send", "temps", "temps.txt", EVENTIDE_APPS="temps_app:app")  # no --to
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.strip() == f"sent 2 messages to temps at 127.0.0.1:{port}"
    finally:
        assert service.stop(signal.SIGTERM) == 0
    assert not (home / "gateway.json").exists()  # removed on a clean stop
    assert _landed(folder) == LINES  # the Lander accepted the new stream

    # Nothing running, no port anywhere: a clear error instead of a connection to port 0.
    orphan = _eventide(folder, "send", "temps", "temps.txt", "--app", "temps_app:app")
    assert orphan.returncode == 2
    assert "no port known for stream 'temps'" in orphan.stderr
    assert "Start `eventide serve`" in orphan.stderr and "--to HOST:PORT" in orphan.stderr


def test_eventide_ports_sets_the_port_of_a_new_stream(tmp_path):
    # Before: `EVENTIDE_PORTS=temps=7201 eventide serve` failed: "names streams without a group".
    folder = _folder(tmp_path)
    port = free_port()
    env = _env(folder, EVENTIDE_PORTS=f"temps={port}")
    service = Service(env, folder, [EVENTIDE, "serve", "--gateway-only", "--app", "temps_app:app"])
    try:
        assert service.wait_for_line("listening for temps") == f"listening for temps on 127.0.0.1:{port}"
        service.wait_for_line("ports recorded in")
        assert "listening for logs" not in "\n".join(service.output)  # --app replaced the bundled apps
        # Without the record (as if it were lost), send falls back to EVENTIDE_PORTS.
        (tmp_path / "home" / "gateway.json").unlink()
        sent = _eventide(folder, "send", "temps", "temps.txt", "--app", "temps_app:app", EVENTIDE_PORTS=f"temps={port}")
        assert sent.returncode == 0, sent.stderr
        assert f"at 127.0.0.1:{port}" in sent.stdout
    finally:
        assert service.stop(signal.SIGTERM) == 0
    assert _landed(folder) == LINES

    # A port for a stream no registered app declares is refused, naming what is registered.
    typo = _eventide(folder, "serve", "--app", "temps_app:app", EVENTIDE_PORTS="temp=7201")
    assert typo.returncode == 2
    assert "EVENTIDE_PORTS sets a port for 'temp', which no registered app declares" in typo.stderr
    assert "temps_app:app" in typo.stderr and "streams: temps" in typo.stderr


def test_a_stale_record_is_ignored(tmp_path):
    settings = Settings(home=tmp_path)
    record_ports(settings, {"temps": 7201})
    assert running_gateway(settings)["ports"] == {"temps": 7201}  # this process is alive
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = json.loads(state_path(settings).read_text())
    state_path(settings).write_text(json.dumps({**record, "pid": int(dead.stdout)}))
    assert running_gateway(settings) is None  # killed without a clean stop: not trusted
    state_path(settings).write_text("{not json")
    assert running_gateway(settings) is None


def test_apps_lists_streams_tables_and_tcp_sinks(tmp_path):
    folder = _folder(tmp_path)
    table = _eventide(folder, "apps", "--app", "temps_app:app", "--app", "examples.words:app")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "temps  (temps_app:app)"
    assert "  streams:    temps  port free  decoder decode_line" in lines
    assert "  tables:     temps_lines  (append)" in lines
    assert "  tcp sinks:  temps_alerts -> EVENTIDE_SINK_TEMPS_ALERTS (required, not set: `eventide run` stops)" in lines
    assert "  tables:     word_count_updates  (append)" in lines and "              word_totals  (upsert by word)" in lines
    assert "  tcp sinks:  word_count_tcp -> EVENTIDE_SINK_WORD_COUNT_TCP (optional, off)" in lines

    js = _eventide(folder, "apps", "--format", "json", EVENTIDE_APPS="temps_app:app,examples.market:app",
                   EVENTIDE_PORTS="temps=7201", EVENTIDE_SINK_TEMPS_ALERTS="127.0.0.1:9999")
    assert js.returncode == 0, js.stderr
    apps = [json.loads(line) for line in js.stdout.splitlines()]
    assert [a["name"] for a in apps] == ["temps", "market_spread"]
    temps, market = apps
    assert temps["entry"] == "temps_app:app"
    assert temps["streams"] == [{"name": "temps", "port": 7201, "decoder": "decode_line", "bronze_table": "bronze_temps",
                                 "log": "temps"}]
    assert [(t["name"], t["mode"]) for t in temps["tables"]] == [("temps_lines", "append")]
    assert temps["tcp_sinks"][0]["address"] == "127.0.0.1:9999"
    assert temps["tcp_sinks"][0]["target"] == "127.0.0.1:9999 (EVENTIDE_SINK_TEMPS_ALERTS)"
    assert [(s["name"], s["port"]) for s in market["streams"]] == [("market_data", 7102), ("orders", 7103)]
    assert {s["log"] for s in market["streams"]} == {"market_data+orders"}
    assert [(t["name"], t["mode"], t["keys"]) for t in market["tables"]] == [
        ("market_state", "upsert", ["symbol"]), ("order_rejections", "append", [])]
    assert [(t["name"], t["target"]) for t in market["tcp_sinks"]] == [
        ("order_results", "EVENTIDE_SINK_ORDER_RESULTS (optional, off)")]


def test_an_app_that_cannot_load_is_a_clear_error(tmp_path):
    for args in (["apps", "--app", "missing_app:app"], ["serve", "--app", "missing_app:app"],
                 ["ingest", "temps", "x.txt", "--app", "missing_app:app"]):
        out = _eventide(tmp_path, *args)
        assert out.returncode == 2, out
        assert out.stderr.startswith(f"eventide {args[0]}: error: app 'missing_app:app': no module 'missing_app'")
