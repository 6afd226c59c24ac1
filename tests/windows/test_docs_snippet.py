"""The "Windows" example of docs/windows.md, run as written: SNIPPET is that page's first Python block, word for word."""

import types
from pathlib import Path

import pytest

SNIPPET = '''\
from transforms.api import Application, DeltaSink, decoder, source
from transforms.windowing import event_time_windows
from windows import Aggregator, WindowResult

@decoder
def reading(payload: bytes) -> dict:  # b"sensor-1,1700000000000,21.5"
    sensor, ms, celsius = payload.decode().split(",")
    return {"sensor": sensor, "ms": int(ms), "celsius": float(celsius)}

mean = Aggregator(create=lambda: (0, 0.0), add=lambda acc, r: (acc[0] + 1, acc[1] + r["celsius"]))

def minute_row(w: WindowResult) -> dict:
    n, total = w.value
    return {"sensor": w.key, "minute_ms": w.start_ms, "readings": n, "mean": total / n}

app = Application(
    "temps",
    source("temps", decoder=reading)
    .key_by("sensor")  # one set of windows per sensor
    .to(event_time_windows(60_000, event_time="ms", allowed_lateness_ms=5_000).over(mean).emit(minute_row))
    .to_sink(DeltaSink("temp_minutes")),
)
'''


def load_snippet():
    """Run the snippet as a module of its own (Spark's workers get its functions by value)."""
    module = types.ModuleType("readme_windows_snippet")
    exec(compile(SNIPPET, "docs/windows.md:Windows", "exec"), module.__dict__)
    return module


def test_the_snippet_is_the_pages_example_and_short():
    page = (Path(__file__).resolve().parents[2] / "docs" / "windows.md").read_text()
    assert page.split("```python\n", 1)[1].split("```", 1)[0] == SNIPPET
    assert 15 <= len(SNIPPET.strip().splitlines()) <= 25


@pytest.mark.spark
def test_the_readme_windows_example_runs(spark, settings):
    from tests.conftest import land
    from transforms import lake
    from transforms.engine import run_application
    from transforms.registry import registry_of
    from transforms.settings import Settings

    app = load_snippet().app
    settings = Settings(home=settings.home, app_registry=registry_of([app]))
    t0 = 1_700_000_040_000  # a minute boundary
    readings = [("s1", 1, 20.0), ("s2", 2, 10.0), ("s1", 30, 22.0), ("s1", 62, 25.0),
                ("s1", 58, 21.0),  # late, but within the 5 s allowed: still in the first minute
                ("s1", 66, 30.0), ("s1", 40, 99.0)]  # 40 s is late beyond that: dropped
    land(settings, "temps", [f"{s},{t0 + sec * 1000},{c}".encode() for s, sec, c in readings])
    run_application(spark, app, settings)
    rows = lake.read(settings.table_path("temp_minutes")).to_pylist()
    # s1's watermark (66 s - 5 s) passed the end of its first minute; s2 got no later reading.
    assert rows == [{"sensor": "s1", "minute_ms": t0, "readings": 3, "mean": 21.0}]
