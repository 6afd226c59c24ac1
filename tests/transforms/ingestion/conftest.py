"""A real Kafka broker (`eventide kafka`) for the test modules that ask for `broker`, and settings that make
it the log under a topic prefix of the test's own."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from transforms.kafka_broker import start_broker
from transforms.settings import Settings


# One broker per pytest worker, not per module: every test names topics (and transactional ids) of its own,
# and a broker's start is a JVM's (seven modules ask for it).
@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    with start_broker(tmp_path_factory.mktemp("kafka") / "broker") as b:
        yield b


def kafka_settings(settings: Settings, broker, monkeypatch) -> Settings:
    """`settings` with Kafka as the log (the environment too), under a topic prefix of the test's own."""
    value = f"kafka://{broker.bootstrap_servers}/t{uuid.uuid4().hex[:8]}."
    monkeypatch.setenv("EVENTIDE_LOG", value)
    return dataclasses.replace(settings, log=value)
