"""Issue K's acceptance check, as the issue words it: with a real broker (`eventide kafka`),
EVENTIDE_LOG=kafka://127.0.0.1:PORT and EVENTIDE_SINK_ORDER_RESULTS=kafka://127.0.0.1:PORT/order_results,
`eventide ingest` of the four sample log days (--end-of-day), the 350 NBBO messages, 355 orders (one per
symbol plus 5 unknown) and the word-count text, then one `eventide run`: nothing under the home's landing
folder, topic `logs` holds 1278 records, the daily summary exact, 20 rejections in `order_rejections` and
20 records in topic `order_results` (read_committed), the word totals exact. The CLI in process, over the
session's Spark; real Delta, real Dagster."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from examples.market import ORDER_REJECTIONS_TABLE
from examples.market_decoder import Order, encode_order, parse_order_result
from examples.market_generate import read_symbols
from orchestration.cli import main
from tests.conftest import DATA
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, summary_rows
from tests.transforms.test_market_app import FIFTEEN, NBBO
from transforms import lake
from transforms.ingestion import open_log
from transforms.ingestion.framing import DEFAULT_FRAMING
from transforms.settings import reset_settings
from transforms.testing import committed_records

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

UNKNOWN = ["ZZ01", "ZZ02", "ZZ03", "ZZ04", "ZZ05"]
WORDS = DATA / "word_count" / "count_this.txt"


def test_issue_k_acceptance(spark, settings, broker, monkeypatch, tmp_path):
    servers = broker.bootstrap_servers
    monkeypatch.setenv("EVENTIDE_LOG", f"kafka://{servers}")
    monkeypatch.setenv("EVENTIDE_SINK_ORDER_RESULTS", f"kafka://{servers}/order_results")
    reset_settings()
    at = dt.datetime(2016, 9, 2, 16, 0, tzinfo=dt.timezone.utc)
    orders = [Order(1 + i % 2, 1000 + i, f"K{i:05d}", sym, 100.0, 42.5, at)
              for i, sym in enumerate(read_symbols() + UNKNOWN)]
    assert len(orders) == 355
    orders_file = tmp_path / "orders.msg"
    orders_file.write_bytes(b"".join(DEFAULT_FRAMING.encode(encode_order(o)) for o in orders))

    assert main(["ingest", "logs", *map(str, LOG_FILES), "--end-of-day"]) == 0
    assert main(["ingest", "market_data", str(NBBO)]) == 0
    assert main(["ingest", "orders", str(orders_file)]) == 0
    assert main(["ingest", "text", str(WORDS)]) == 0
    assert main(["run"]) == 0

    assert not settings.landing.exists()  # nothing under the home's landing folder
    log = open_log(settings.__class__.from_env())
    assert log.watermarks(log.topic("logs")) == (0, 1278)
    summary = lake.read(settings.table_path("daily_return_code_summary"))
    assert summary_rows([summary]) == expected_summary()
    rejected = lake.read(settings.table_path(ORDER_REJECTIONS_TABLE)).to_pylist()
    assert sorted(r["symbol"] for r in rejected) == sorted(FIFTEEN + UNKNOWN)
    results = committed_records(servers, "order_results")
    assert len(results) == 20
    answers = [parse_order_result(value) for _, value in results]
    assert sorted(a.order_id for a in answers) == sorted(r["order_id"] for r in rejected)  # each once
    totals = {r["word"]: r["count"] for r in lake.read(settings.table_path("word_totals")).to_pylist()}
    assert totals == json.loads((DATA / "word_count" / "_expected.json").read_text())
