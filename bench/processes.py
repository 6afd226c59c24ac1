"""What the benchmarks share (bench/peers.py, bench/fixed.py, bench/sessions.py, ...): the environment of a
child, timing one from spawn to exit, a fresh home over landed messages, settings for an in-process run,
the load average, and median/min/max."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict:
    """This process's environment without a home or apps of its own, Java found, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("EVENTIDE_HOME", "EVENTIDE_APPS")}
    env.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYTHONUTF8"] = "1"  # Bytewax's FileSource opens text in the locale's encoding
    env.update(extra)
    return env


def timed_process(cmd: list[str], env: dict, log: Path) -> float:
    """Wall seconds from spawn to exit, its output in `log`; raises with the end of it if it fails."""
    with open(log, "wb") as out:
        started = time.perf_counter()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
        seconds = time.perf_counter() - started
    if rc:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}:\n{tail}")
    return seconds


def eventide_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("eventide")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestration.cli"]


def land(home: Path, stream_payloads: Iterable[tuple[str, bytes]]) -> int:
    """Land (stream, payload) pairs under `home` as the gateway would; returns how many."""
    from transforms.ingestion.landing import Lander
    from transforms.settings import Settings

    n = 0
    with Lander(Settings(home=home)) as lander:
        for stream, payload in stream_payloads:
            lander.append(stream, payload, "bench")
            n += 1
    return n


def fresh_home(landed: Path, home: Path) -> Path:
    """A new home holding a copy of the landed messages only (no checkpoints, tables or Dagster runs)."""
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    shutil.copytree(landed / "landing", home / "landing")
    return home


def spread(times: list[float], suffix: str = "_s", digits: int = 3) -> dict:
    """Median, min and max of repeated timings."""
    return {f"median{suffix}": round(statistics.median(times), digits), f"min{suffix}": round(min(times), digits),
            f"max{suffix}": round(max(times), digits)}


@contextmanager
def eventide_env(home: Path, app: str, **extra: str) -> Iterator:
    """Settings for an in-process `run_all` over `home` with only `app` registered, and `extra`
    EVENTIDE_* variables set (the environment agrees: Dagster resources read it); all restored after."""
    from transforms.settings import Settings, reset_settings

    values = {"EVENTIDE_HOME": str(home), "EVENTIDE_APPS": app, **extra}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    reset_settings()
    try:
        yield Settings(home=home, apps=app)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_settings()


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, rounded: every results file records them (a shared machine)."""
    return [round(x, 2) for x in os.getloadavg()]
