"""`eventide new NAME`: a small working app to start from: the app, a sample input file, and its test.

The app reads text lines `sensor,value` on its own stream NAME, keys them by sensor, keeps a running
count and total per sensor (keyed state) and upserts them into the Delta table `NAME_totals`, which
has a check. The test runs it with `transforms.testing.run_app`.
"""

from __future__ import annotations

import importlib.util
import keyword
import sys
from pathlib import Path
from string import Template

from transforms.settings import ConfigError

APP = Template('''\
"""$name: an Eventide app, scaffolded by `eventide new $name`. Make it yours.

Each message of the stream `$name` is one text line `sensor,value` (e.g. `kitchen,21.5`). The app
keys the readings by sensor, keeps a running count and total per sensor, and upserts them into the
Delta table `${name}_totals`. README, section "Write and serve your own app", explains each piece.

Run it, from this folder (so that `$name` imports):

    export EVENTIDE_APPS=$name:app        # or pass --app $name:app to each command
    eventide ingest $name ${name}_sample.txt    # or: eventide serve, then eventide send $name FILE
    eventide run
    eventide show ${name}_totals

Test it: pytest test_$name.py
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from transforms.api import Application, DeltaSink, check, decoder, source, state_computation


@dataclass
class Reading:
    sensor: str
    value: float


# A decoder turns one payload (here a line, with its newline) into a message. The schema types the
# stream's bronze table. Raising quarantines the message (table `quarantine`): nothing is lost.
@decoder(schema=pa.schema([("sensor", pa.string()), ("value", pa.float64())]))
def decode_reading(payload: bytes) -> Reading:
    sensor, sep, value = payload.decode("utf-8").strip().partition(",")
    if not sep or not sensor.strip():
        raise ValueError(f"expected a line 'sensor,value', got {payload!r}")
    return Reading(sensor.strip(), float(value))


class Totals:
    """The state of one key (sensor); Spark keeps it, in RocksDB, between messages and runs."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0


@dataclass
class SensorTotal:
    sensor: str
    count: int
    total: float


# A keyed state computation: called once per message, in order, with that key's state.
@state_computation("running totals", state=Totals)
def running_totals(reading: Reading, totals: Totals) -> SensorTotal:
    totals.count += 1
    totals.total += reading.value
    return SensorTotal(reading.sensor, totals.count, totals.total)


# A check on the table, run after each run as a blocking Dagster asset check.
@check("counts_positive")
def counts_positive(df) -> bool:
    """Every sensor in the table has at least one reading."""
    return bool((df["count"] > 0).all())


app = Application(
    "$name",
    # The stream and its decoder. port=7300 would fix its gateway port (else EVENTIDE_PORTS, else a
    # free port that `eventide serve` prints and records for `eventide send`).
    source("$name", decoder=decode_reading)
    .key_by("sensor")
    .to(running_totals)
    # upsert: one row per sensor, the last output wins (mode="append" keeps every output).
    .to_sink(DeltaSink("${name}_totals", mode="upsert", keys=("sensor",), checks=[counts_positive])),
    description="Running count and total per sensor of the stream $name.",
)
''')

SAMPLE = """\
kitchen,21.5
garage,4.0
kitchen,22.5
attic,30.0
garage,6.0
kitchen,23.0
"""

TEST = Template('''\
"""Tests of the $name app: it runs on real Spark with `transforms.testing.run_app`, as in production."""

from $name import app
from transforms.testing import run_app


def test_running_count_and_total_per_sensor():
    result = run_app(app, {"$name": [b"kitchen,21.5\\n", b"garage,4.0\\n", b"kitchen,22.5\\n"]})
    rows = result.outputs("${name}_totals")  # upsert table: one row per sensor, sorted by key
    assert [(r["sensor"], r["count"], r["total"]) for r in rows] == [("garage", 1, 4.0), ("kitchen", 2, 44.0)]


def test_a_bad_line_is_quarantined_not_lost():
    result = run_app(app, {"$name": [b"kitchen,21.5\\n", b"not a reading\\n"]})
    assert [r["sensor"] for r in result.outputs("${name}_totals")] == ["kitchen"]
    assert [r["payload"] for r in result.quarantine] == [b"not a reading\\n"]
    assert "sensor,value" in result.quarantine[0]["reason"]
''')


def files_for(name: str) -> dict[str, str]:
    """File name -> content of the scaffold for app `name`."""
    return {f"{name}.py": APP.substitute(name=name), f"{name}_sample.txt": SAMPLE,
            f"test_{name}.py": TEST.substitute(name=name)}


def check_name(name: str) -> None:
    """The name becomes a module, an app, a stream and table names: an identifier no other module has."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ConfigError(f"app name {name!r}: use a Python identifier (letters, digits, underscores), e.g. temps")
    if name in sys.stdlib_module_names or importlib.util.find_spec(name) is not None:
        # An app module must import as itself; a name taken by another module would shadow or be shadowed.
        raise ConfigError(f"app name {name!r}: a module of that name already exists; choose another name")


def scaffold(name: str, folder: Path) -> list[Path]:
    """Write the scaffold into `folder`; refuses (ConfigError) if any of its files exists."""
    check_name(name)
    files = files_for(name)
    paths = [folder / f for f in files]
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise ConfigError(f"not overwriting existing file(s): {', '.join(existing)}; choose another name or --dir")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in zip(paths, files.values()):
        with open(path, "x", encoding="utf-8") as f:  # "x": never overwrite, even in a race
            f.write(text)
    return paths
