"""The Kafka sink's contract across a kill -9 of `eventide serve` (issue K, item 3): with
EVENTIDE_SINK_WORD_COUNT_TCP=kafka://.../TOPIC, serve is killed while records flow (a transaction may be
open), started again, and a read_committed consumer finds every expected `word => count` record exactly
once. A real broker (`eventide kafka`), real processes; no mocks."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import DATA
from tests.services import Service, clean_env
from transforms.ingestion.sender import send_files
from transforms.ports import free_port
from transforms.testing import committed_records

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

EVENTIDE = str(Path(sys.executable).parent / "eventide")
WORDS = DATA / "word_count" / "count_this.txt"
COPIES = 6


def expected_records(copies: int) -> Counter:
    """Each word's `word => n` for n = 1 .. its count over `copies` passes of the file: each once."""
    totals = json.loads((DATA / "word_count" / "_expected.json").read_text())
    return Counter(f"{w} => {n}\n".encode() for w, c in totals.items() for n in range(1, copies * c + 1))


def test_a_kill_9_of_serve_while_records_flow_leaves_every_record_once(broker, tmp_path):
    home, port, topic = tmp_path / "home", free_port(), "word_lines"
    env = clean_env()
    env.update(EVENTIDE_HOME=str(home), EVENTIDE_APPS="examples.words:app", EVENTIDE_PORTS=f"text={port}",
               EVENTIDE_SINK_WORD_COUNT_TCP=f"kafka://{broker.bootstrap_servers}/{topic}",
               EVENTIDE_UPKEEP_MINUTES="0")
    expected = expected_records(COPIES)

    def records() -> list[bytes]:
        try:
            return [v for _, v in committed_records(broker.bootstrap_servers, topic)]
        except KeyError:  # the topic is not there yet
            return []

    def wait_for(done, timeout: float) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while not done(got := records()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return got

    service = Service(env, tmp_path, argv=[EVENTIDE, "serve"])
    try:
        service.wait_for_line("all 2 queries running", timeout=240)
        assert send_files("text", [WORDS], "127.0.0.1", port) > 0
        assert wait_for(lambda got: len(got) > 0, 120)  # records flow
        assert send_files("text", [WORDS] * (COPIES - 1), "127.0.0.1", port) > 0  # landed: confirmed
        flowing = len(records())
        assert service.stop(signal.SIGKILL) == -signal.SIGKILL  # kill -9 while the rest is on its way
        first = service
        service = Service(env, tmp_path, argv=[EVENTIDE, "serve"])
        service.wait_for_line("all 2 queries running", timeout=240)
        got = wait_for(lambda got: len(got) >= sum(expected.values()), 180)
        time.sleep(3)  # a batch more: nothing else arrives
        assert service.stop(signal.SIGTERM) == 0
    finally:
        if service.proc.poll() is None:
            service.stop(signal.SIGKILL)
    print(f"records before the kill: {flowing} of {sum(expected.values())}")  # -s shows it
    assert 0 < flowing < sum(expected.values())  # the kill came while records flowed
    got = records()
    assert Counter(got) == expected, (first.output, service.output)  # every record, none twice
    assert max(Counter(got).values()) == 1
