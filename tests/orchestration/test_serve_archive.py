"""The landing archive's compaction under `eventide serve`, with a kill -9 and an app added later: serve
merges the archived segments as it goes, the new app reads the merged archive from the beginning, serve
restarts its query once it has read the archive so the merging goes on, and every table holds every
landed message exactly once. Real processes, real sockets, real Spark."""

from __future__ import annotations

import collections
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from examples.words import split_words
from orchestration.status import compute_status, format_status
from tests.orchestration.test_serve import _env
from tests.services import Service
from transforms import lake
from transforms.ingestion.framing import DEFAULT_FRAMING, LANDED_ACK
from transforms.ingestion.landing import read_landed
from transforms.ingestion.segments import parse_segment_name
from transforms.ports import free_port
from transforms.settings import Settings

EVENTIDE = str(Path(sys.executable).parent / "eventide")
BATCH = 10  # lines a connection: a segment each, sent 0.3 s apart

ECHO_APP = '''
import pyarrow as pa

from examples.words import decode_text
from transforms.api import Application, DeltaSink, source

app = Application("echo", source("text", decoder=decode_text)
                  .to_sink(DeltaSink("echo_lines", schema=pa.schema([("text", pa.string())]))))
'''


def _send_batches(port: int, first: int, batches: int) -> list[bytes]:
    sent = []
    for b in range(batches):
        lines = [f"alpha w{i % 7} line{i}".encode() for i in range(first + b * BATCH, first + (b + 1) * BATCH)]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"".join(DEFAULT_FRAMING.encode(m) for m in lines))
            s.shutdown(socket.SHUT_WR)
            assert s.recv(1) == LANDED_ACK
        sent.extend(lines)
        time.sleep(0.3)
    return sent


def _archived_spans(settings: Settings) -> list[int]:
    """Messages each archived segment of `text` spans (a merged one spans more than one connection's)."""
    archive = settings.landing_archive / "text"
    names = [n for n in (archive.iterdir() if archive.is_dir() else ()) if parse_segment_name(n.name)]
    return [last - first + 1 for first, last in map(parse_segment_name, (n.name for n in names))]


def _wait(what, timeout: float, message) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not what():
        time.sleep(0.5)
    assert what(), message()


def _start(env, cwd: Path) -> Service:
    service = Service(env, cwd, [EVENTIDE, "serve"])
    service.wait_for_line("all ", timeout=240)
    return service


@pytest.mark.spark
def test_serve_compacts_the_archive_through_a_kill_and_an_app_added_later(tmp_path, monkeypatch):
    home, port = tmp_path / "home", free_port()
    (tmp_path / "echo_app.py").write_text(textwrap.dedent(ECHO_APP))
    monkeypatch.syspath_prepend(str(tmp_path))  # this process reads the new app's status and tables too
    env = _env(home, EVENTIDE_APPS="examples.words:word_count", EVENTIDE_PORTS=f"text={port}",
               EVENTIDE_SINK_WORD_COUNT_TCP="off", EVENTIDE_ARCHIVE_COMPACT_FILES="4", PYTHONPATH=str(tmp_path),
               EVENTIDE_BRONZE_TRIGGER_INTERVAL="1")  # bronze commits, so the archive rounds move segments, sooner
    settings = Settings(home=home)
    service = _start(env, tmp_path)
    sent = _send_batches(port, 0, 12)
    _wait(lambda: any(n > BATCH for n in _archived_spans(settings)), 120,
          lambda: f"serve merged no archived segments: {_archived_spans(settings)}; {service.output[-20:]}")
    service.proc.kill()  # kill -9, while the archive rounds go on
    service.proc.wait(30)

    # Started again with an app that reads the log from the beginning, through the merged archive.
    env["EVENTIDE_APPS"] = "examples.words:word_count,echo_app:app"
    service = _start(env, tmp_path)
    sent += _send_batches(port, len(sent), 8)
    settings = Settings(home=home, apps=env["EVENTIDE_APPS"])

    def caught_up():
        status = compute_status(settings)
        return not any(log.open for log in status.logs) and all(q.lag_messages == 0 for q in status.queries)

    _wait(caught_up, 240, lambda: format_status(compute_status(settings), "table"))
    restarted = "echo: restarting, so that it stops listing the landing archive it has read"
    _wait(lambda: _said(service, restarted), 120, lambda: f"serve did not restart the new app's query: {service.output[-20:]}")
    # With that query off the archive, the archive is merged again: the second phase's segments too.
    _wait(lambda: sum(_archived_spans(settings)) == len(sent) and len(_archived_spans(settings)) <= 3, 120,
          lambda: f"archive not merged after the restart: {_archived_spans(settings)}")
    assert service.stop(signal.SIGTERM) == 0, service.output

    landed = read_landed(settings, "text").to_pylist()
    seqs = [r["seq"] for r in landed]
    assert len(seqs) == len(set(seqs)) and collections.Counter(r["payload"] for r in landed) == collections.Counter(sent)
    bronze = lake.read(settings.table_path(settings.registry.stream("text").bronze_table)).to_pylist()
    assert sorted(r["seq"] for r in bronze) == sorted(seqs)
    echoed = lake.read(settings.table_path("echo_lines")).to_pylist()
    assert collections.Counter(r["text"] for r in echoed) == collections.Counter(p.decode() for p in sent)
    words = collections.Counter(w for p in sent for w in split_words(p.decode()))
    totals = {r["word"]: r["count"] for r in lake.read(settings.table_path("word_totals")).to_pylist()}
    assert totals == dict(words)


def _said(service: Service, start: str) -> bool:
    """Whether serve printed a line starting with `start` so far (its lines read into its output)."""
    try:
        service.wait_for_line(start, timeout=0.5)
    except AssertionError:
        pass
    return any(line.startswith(start) for line in service.output)
