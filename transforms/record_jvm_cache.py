"""Record the driver JVM's class cache now (`python -m transforms.record_jvm_cache`, run by `make setup`):
a short run of a small keyed app on real Spark and Delta in a process of its own, then the archive is put
in place once its JVM is gone. Left to itself, the first JVM to start records it (jvm_cache.py), and a
long-lived one (the tests' shared session, a `serve`) keeps it from everyone until it exits."""

from __future__ import annotations

import os
import time
from pathlib import Path

from transforms.jvm_cache import archive_path, is_complete, tidy


def _recording_workload() -> None:
    """Run in the recording process: what a run's JVM loads (a session, Arrow to Python and back, a
    keyed state step in RocksDB, Delta's streaming and batch writes and reads); prints its JVM's pid."""
    from pyspark.sql import SparkSession

    from transforms.api import Application, DeltaSink, decoder, source, state_computation
    from transforms.spark import stop_spark
    from transforms.testing import run_app

    @decoder
    def decode(payload: bytes) -> dict:
        key, value = payload.decode().split(",")
        return {"key": key, "value": int(value)}

    class Total:
        def __init__(self):
            self.value = 0

    @state_computation("total", state=Total)
    def total(message: dict, state: Total):
        state.value += message["value"]
        return {"key": message["key"], "total": state.value}

    app = Application("jvm_cache_recording", source("numbers", decoder=decode).key_by("key").to(total)
                      .to_sink(DeltaSink("totals", mode="upsert", keys=("key",))))
    result = run_app(app, {"numbers": [f"k{i % 3},{i}" for i in range(30)] + ["not a number"]})
    assert len(result.outputs("totals")) == 3, result.outputs("totals")
    spark = SparkSession.getActiveSession()  # the one run_app started
    print("JVM_PID", spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid(), flush=True)
    stop_spark()


def record_now(java_home: str, wait_seconds: float = 120.0, say=print) -> Path | None:
    """The archive, recorded now by a short run in a process of its own if there is none; None if
    another JVM holds the claim (it will be in place after that JVM exits). RuntimeError if the run
    failed: Spark or Delta does not work here."""
    import subprocess
    import sys

    from transforms.processes import alive

    archive = archive_path(java_home)
    tidy(archive, time.time())
    if archive.exists():
        return archive
    say(f"recording the JVM's class cache {archive} (once per Java and jar set, about 30 s)")
    env = {**os.environ, "JAVA_HOME": java_home, "EVENTIDE_JVM_CLASS_CACHE": "true"}
    done = subprocess.run([sys.executable, "-c", "from transforms.record_jvm_cache import _recording_workload as w; w()"],
                          env=env, capture_output=True, text=True, timeout=600)
    pids = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("JVM_PID ")]
    if done.returncode != 0 or not pids:
        raise RuntimeError(f"the run that records the JVM's class cache failed, so Spark or Delta does not work "
                           f"here; its output ends:\n{(done.stderr or done.stdout)[-3000:]}")
    deadline = time.monotonic() + wait_seconds
    while alive(pids[0]) and time.monotonic() < deadline:  # the JVM writes the archive as it exits
        time.sleep(0.2)
    mine = [r for r in archive.parent.glob(f"{archive.stem}.*.recording") if is_complete(r)]
    if alive(pids[0]) or not mine:
        say("the class cache was not recorded (another JVM holds the claim, or the JVM is still writing it); "
            "runs start without it until it is in place")
        return None
    os.replace(mine[0], archive)
    archive.with_suffix(".claim").unlink(missing_ok=True)
    return archive


if __name__ == "__main__":
    import sys

    try:
        where = record_now(os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64"))
    except RuntimeError as e:
        sys.exit(f"{e}\nFix that first (`make setup` resolves the jars); EVENTIDE_JVM_CLASS_CACHE=0 runs without the cache.")
    if where is not None:
        print(f"JVM class cache in place: {where}")
