"""Bad input over every registered stream, through the real gateway and `eventide run`: malformed
frames, undecodable payloads and decodable-but-absurd values among good messages. Every input the
gateway landed ends in exactly one place: its stream's bronze table, or quarantine (one row per input
and step), never both, never neither."""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
import struct

import pytest

from examples.market_decoder import MarketData, Order, encode_market_data, encode_order
from transforms import lake
from transforms.ingestion.gateway import GatewayThread
from transforms.ingestion.landing import read_landed

pytestmark = pytest.mark.spark

T = dt.datetime(2016, 9, 2, 15, 47, 52, tzinfo=dt.timezone.utc)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


GOOD = {
    "logs": [b'127.0.0.1 - - [07/Mar/2004:16:05:49 -0800] "GET /index.html HTTP/1.1" 200 2326\n'] * 3,
    "market_data": [encode_market_data(MarketData("AA", T, 10.0, 10.01)),
                    encode_market_data(MarketData("BB", T, 5.0, 5.5))],
    "orders": [encode_order(Order(1, 7, "o-1", "AA", 100.0, 10.0, T))],
    "text": [b"hello world\n", b"hello again\n"],
}
BAD = {
    "logs": [b"not a log line\n"],
    "market_data": [b"\x00\x01", encode_market_data(MarketData("CC", T, -1e308, 1e308))],
    "orders": [b"xyz", encode_order(Order(1, 7, "o-2", "AA", float("nan"), 10.0, T))],
    "text": [b"\xff\xfe\n"],
}


def _send(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the gateway closes when it has landed everything


def test_every_input_is_in_exactly_one_place(spark, settings):
    from orchestration.runner import run_all

    settings = dataclasses.replace(settings, ports={s: 0 for s in settings.registry.streams}, max_frame_bytes=4096)
    with GatewayThread(settings) as gw:
        ports = gw.bound_ports
        for stream in GOOD:
            _send(ports[stream], b"".join(_frame(p) for p in GOOD[stream] + BAD[stream]))
        _send(ports["logs"], struct.pack(">I", 10) + b"abc")  # a frame cut short
        _send(ports["text"], struct.pack(">I", 1 << 20) + b"x" * 10)  # a header over the frame limit
        gw.wait_for_messages(sum(len(GOOD[s]) + len(BAD[s]) for s in GOOD) + 2, timeout=30)
    run_all(settings, progress=lambda _: None)

    quarantine = lake.read(settings.table_path("quarantine")).to_pylist()
    steps = [(r["stream"], r["seq"], r["step"]) for r in quarantine]
    assert len(steps) == len(set(steps)), "an input is in quarantine twice for one step"
    dead = {(r["stream"], r["seq"]) for r in quarantine}
    for spec in settings.registry.streams.values():
        landed = read_landed(settings, spec.log).to_pylist()
        landed = [r for r in landed if r["stream"] == spec.name]
        path = settings.table_path(spec.bronze_table)
        in_bronze = set(lake.read(path, columns=["seq"]).column("seq").to_pylist()) if lake.exists(path) else set()
        assert len(landed) >= len(GOOD[spec.name]) + len(BAD[spec.name])
        for r in landed:
            places = (r["seq"] in in_bronze) + ((spec.name, r["seq"]) in dead)
            assert places == 1, (spec.name, r["seq"], r["payload"], r["landing_error"], places)
        good_payloads = {r["payload"] for r in landed if r["seq"] in in_bronze}
        assert good_payloads == set(GOOD[spec.name]), spec.name
