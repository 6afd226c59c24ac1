"""Word count end to end over real TCP: sender -> gateway -> landing -> Spark -> Delta + TCP sink."""

import dataclasses
import json

import pytest

from examples.words import word_count
from tests.conftest import DATA
from tests.tcp import Receiver
from transforms import lake
from transforms.engine import run_application
from transforms.ingestion.gateway import GatewayThread
from transforms.ingestion.sender import send_files

pytestmark = pytest.mark.spark


def test_word_count_over_tcp_in_and_out(spark, settings):
    settings = dataclasses.replace(settings, ports={s: 0 for s in settings.registry.streams})
    with GatewayThread(settings) as gw:
        port = gw.bound_ports["text"]
        sent = send_files("text", [DATA / "word_count" / "count_this.txt"], "127.0.0.1", port)
        gw.wait_for_messages(sent, timeout=30)
    receiver = Receiver()
    run_application(spark, word_count, settings, tcp_addresses={"word_count_tcp": f"127.0.0.1:{receiver.port}"})
    lines = receiver.all_bytes().decode().splitlines()
    receiver.close()

    expected = json.loads((DATA / "word_count" / "_expected.json").read_text())
    assert len(lines) == 482
    final = {}
    for line in lines:
        word, count = line.split(" => ")
        final[word] = int(count)
    assert final == expected
    updates = lake.read(settings.table_path("word_count_updates")).to_pandas().sort_values(["seq", "part"])
    assert lines == [f"{w} => {c}" for w, c in zip(updates.word, updates["count"])]
