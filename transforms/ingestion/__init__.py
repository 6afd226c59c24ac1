"""Ingestion: how messages get into the log every query reads. No Dagster, no Spark at import.

    framing.py   Wallaroo's wire protocol (length-prefixed frames), used by the gateway, the sender,
                 `ingest` and the decoders
    gateway.py   the TCP gateway of `eventide serve`: one port per stream, frames in, log records out
    sender.py    `eventide send` (files over TCP to a gateway) and `eventide ingest` (no network)
    log.py       the log interface; `open_log` (here) opens the one EVENTIDE_LOG names: the landing
                 folder or Kafka
    landing.py   the embedded landing log: one folder of immutable segments per sequence group
    segments.py  a landing segment's file name: the sequence range it holds
    archive.py   under serve, the landing segments every query committed move out of Spark's way
    kafka_log.py Kafka as the log: a topic of one partition per sequence group
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transforms.settings import Settings, log_kind

if TYPE_CHECKING:
    from transforms.ingestion.log import Log


def open_log(settings: Settings) -> Log:
    """The log `settings.log` names."""
    if log_kind(settings.log) == "kafka":
        from transforms.ingestion.kafka_log import KafkaLog

        return KafkaLog(settings)
    from transforms.ingestion.landing import LandingLog

    return LandingLog(settings)
