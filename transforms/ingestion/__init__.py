"""Ingestion: how messages get into the log every query reads. No Dagster, no Spark at import.

    framing.py   Wallaroo's wire protocol (length-prefixed frames), used by the gateway, the sender,
                 `ingest` and the decoders
    gateway.py   the TCP gateway of `eventide serve`: one port per stream, frames in, log records out
    sender.py    `eventide send` (files over TCP to a gateway) and `eventide ingest` (no network)
    log.py       the log interface and `open_log` (EVENTIDE_LOG: the landing folder or Kafka)
    landing.py   the embedded landing log: one folder of immutable segments per sequence group
    archive.py   under serve, the landing segments every query committed move out of Spark's way
    kafka_log.py Kafka as the log: a topic of one partition per sequence group
"""
