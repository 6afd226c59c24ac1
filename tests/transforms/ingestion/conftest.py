"""A real Kafka broker (`eventide kafka`) per test module that asks for `broker`, and settings that make it
the log under a topic prefix of the test's own."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from transforms.kafka_broker import start_broker
from transforms.settings import Settings


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with start_broker(tmp_path_factory.mktemp("kafka") / "broker") as b:
        yield b


def kafka_settings(settings: Settings, broker, monkeypatch) -> Settings:
    """`settings` with Kafka as the log (the environment too), under a topic prefix of the test's own."""
    value = f"kafka://{broker.bootstrap_servers}/t{uuid.uuid4().hex[:8]}."
    monkeypatch.setenv("EVENTIDE_LOG", value)
    return dataclasses.replace(settings, log=value)
