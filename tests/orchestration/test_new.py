"""`eventide new NAME`: the scaffold is a working app. End to end in a folder outside the repo: new,
apps, ingest, run, show, and the scaffolded test file itself (it uses `transforms.testing.run_app`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.scaffold import files_for, scaffold
from tests.services import clean_env
from transforms.settings import ConfigError

EVENTIDE = str(Path(sys.executable).parent / "eventide")


def _eventide(folder: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = clean_env()
    env.update(EVENTIDE_HOME=str(folder / "home"), DAGSTER_HOME=str(folder / "home" / "dagster"), **extra)
    return subprocess.run([EVENTIDE, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.spark
def test_new_app_ingests_runs_and_shows(tmp_path):
    made = _eventide(tmp_path, "new", "sensors")
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sensors.py", "sensors_sample.txt", "test_sensors.py"]
    assert "export EVENTIDE_APPS=sensors:app" in made.stdout
    before = (tmp_path / "sensors.py").read_text()
    (tmp_path / "sensors.py").write_text(before + "\n# mine\n")
    again = _eventide(tmp_path, "new", "sensors")
    assert again.returncode == 2 and "not overwriting existing file(s)" in again.stderr
    assert (tmp_path / "sensors.py").read_text().endswith("# mine\n")  # untouched

    listed = _eventide(tmp_path, "apps", "--app", "sensors:app", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    (app,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert app["name"] == "sensors" and app["entry"] == "sensors:app"
    assert [(s["name"], s["decoder"]) for s in app["streams"]] == [("sensors", "decode_reading")]
    assert [(t["name"], t["mode"], t["checks"]) for t in app["tables"]] == [("sensors_totals", "upsert",
                                                                             ["counts_positive"])]

    ingested = _eventide(tmp_path, "ingest", "sensors", "sensors_sample.txt", EVENTIDE_APPS="sensors:app")
    assert ingested.returncode == 0, ingested.stderr
    assert ingested.stdout.startswith("landed 6 messages in sensors")

    run = _eventide(tmp_path, "run", EVENTIDE_APPS="sensors:app")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checks: 1 passed, 0 failed" in run.stdout
    # Each query says what it did as it ends, between the run's own lines (before: only Dagster's log had it).
    said = run.stdout.splitlines()

    def line_of(start: str) -> int:
        found = [i for i, line in enumerate(said) if line.startswith(start)]
        assert len(found) == 1, (start, run.stdout)
        return found[0]

    assert (line_of("running the pipelines (bronze, apps, quarantine) through Dagster ...")
            < line_of("  bronze_sensors: 6 messages in 1 batch, ") < line_of("  sensors: 6 messages in 1 batch, ")
            < line_of("  sensors_totals: +")), run.stdout
    shown = _eventide(tmp_path, "show", "sensors_totals", "--format", "json", EVENTIDE_APPS="sensors:app")
    assert shown.returncode == 0, shown.stderr
    rows = sorted((json.loads(line) for line in shown.stdout.splitlines()), key=lambda r: r["sensor"])
    assert [(r["sensor"], r["count"], r["total"]) for r in rows] == [
        ("attic", 1, 30.0), ("garage", 2, 10.0), ("kitchen", 3, 67.0)]

    # The scaffolded tests pass, run as a user would, from the folder (Spark's Python workers must
    # import the app module, so not in this process).
    tested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sensors.py"],
                            cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-2000:]
    assert "2 passed" in tested.stdout


def test_new_refuses_bad_names_and_existing_files(tmp_path):
    for bad, why in (("1x", "use a Python identifier"), ("class", "use a Python identifier"),
                     ("json", "a module of that name already exists"), ("transforms", "already exists")):
        with pytest.raises(ConfigError, match=why):
            scaffold(bad, tmp_path)
    (tmp_path / "test_temps.py").write_text("mine")
    with pytest.raises(ConfigError, match=r"not overwriting existing file\(s\): .*test_temps.py"):
        scaffold("temps", tmp_path)
    assert list(tmp_path.iterdir()) == [tmp_path / "test_temps.py"]  # nothing half-written
    assert set(files_for("temps")) == {"temps.py", "temps_sample.txt", "test_temps.py"}
    assert [p.name for p in scaffold("temps", tmp_path / "new" / "dir")] == ["temps.py", "temps_sample.txt",
                                                                             "test_temps.py"]
