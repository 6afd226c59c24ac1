"""The batch form of market spread equals Wallaroo's one-message form, whatever the batching."""

import dataclasses
import random
import shutil

import pytest

from examples.market import market_app, market_app_per_message
from tests.transforms.test_market_app import land_messages, order, quote
from transforms import lake
from transforms.engine import run_application

pytestmark = pytest.mark.spark

SYMBOLS = ["AA", "BB", "CC", "DD", "EE", "FF"]


def random_stream(seed: int, n: int = 600) -> list[tuple[str, bytes]]:
    """Quotes that flip symbols between accept and reject, orders in between, unknown symbols too."""
    rnd = random.Random(seed)
    msgs = []
    for i in range(n):
        sym = rnd.choice(SYMBOLS + ["ZZZ"])  # ZZZ: quoted rarely, often never before its orders
        if rnd.random() < 0.45 and (sym != "ZZZ" or rnd.random() < 0.1):
            bid = round(rnd.uniform(1, 50), 2)
            wide = rnd.random() < 0.4
            spread = rnd.choice([0.05, 0.06, 0.5]) if wide else rnd.choice([0.01, 0.02, 0.04])
            msgs.append(quote(sym, bid, round(bid + spread, 2)))
        else:
            msgs.append(order(f"o{i:05d}", sym, side=rnd.choice([1, 2])))
    return msgs


def _tables(settings):
    state = sorted(lake.read(settings.table_path("market_state")).to_pylist(), key=lambda r: r["symbol"])
    rejections = sorted(lake.read(settings.table_path("order_rejections")).to_pylist(), key=lambda r: r["seq"])
    for r in rejections:
        r.pop("decision_time")  # wall clock
    return state, rejections


def test_batch_form_equals_one_message_form(spark, settings, tmp_path):
    msgs = random_stream(11)
    results = []
    landed = dataclasses.replace(settings, home=tmp_path / "landed")
    for start in range(0, len(msgs), 100):  # six segments -> three micro-batches of two
        land_messages(landed, msgs[start : start + 100])
    for i, app in enumerate((market_app_per_message, market_app)):
        home = dataclasses.replace(settings, home=tmp_path / f"home{i}", max_files_per_trigger=2)
        shutil.copytree(landed.landing, home.landing)  # the very same messages, receive times included
        run_application(spark, app, home)
        results.append(_tables(home))
    (state_1, rej_1), (state_b, rej_b) = results
    assert len(rej_1) > 50 and any(r["reason"] == "never seen" for r in rej_1)
    assert state_b == state_1
    assert rej_b == rej_1
