"""The driver JVM's class-data cache (Java's dynamic AppCDS archive).

Starting Spark loads and verifies thousands of classes, and the first streaming query loads
thousands more (state store, codegen, Arrow). A JVM started with `-XX:SharedArchiveFile` maps the
classes a previous run recorded instead (measured: `eventide run` over 10k messages 17.3 -> 14.3 s).

The first JVM of a given Java and pyspark claims the recording (an exclusive file) and records its
classes at exit (`-XX:ArchiveClassesAtExit`): that run takes about 5 s longer, and its JVM writes the
archive for about 10 s after the process. A later start that finds the recording finished renames it
into place once it is complete (see DYNAMIC_ARCHIVE_MAGIC: a recording cut short is thrown away and
recorded again); starts in between run without an archive and do not record.
The archive belongs to one Java binary and one jar set, so its name carries a hash of both.

Left to itself, the first JVM records, and when that JVM lives long (the tests' shared session, a
`serve`) nobody has the archive until it exits or its claim expires (15 min). `python -m
transforms.jvm_cache` (run by `make test`) records it at once instead: a short run of a small keyed app
on real Spark and Delta in a process of its own, then the archive is put in place when its JVM is gone.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

FINISHED_AFTER_SECONDS = 30.0  # a recording not written to for this long is complete
CLAIM_EXPIRES_SECONDS = 900.0  # a claim this old without a recording: that JVM died; record again


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eventide"


def archive_key(java_home: str, jars: Path, extra: list[str] = ()) -> str:
    """Names the Java binary and the jar set (pyspark's and the extra class path) an archive is valid for."""
    import pyspark

    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    # The archive records the jars' paths: another install (venv) of the same pyspark needs its own.
    text = "|".join([os.path.realpath(java_home), os.path.realpath(jars), pyspark.__version__, *names,
                     *(os.path.realpath(j) for j in extra)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _age(path: Path, now: float) -> float | None:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return None


# A dynamic archive's first bytes (CDS_DYNAMIC_ARCHIVE_MAGIC 0xf00baba8, little-endian). The JVM
# writes the header last (measured: zeros until the last moment of the dump), so a dump cut short has
# none, and a JVM given such a file starts without it; a file cut after its header was written would
# crash the JVM that maps it (SIGBUS, measured), which is why only a finished recording is put in place.
DYNAMIC_ARCHIVE_MAGIC = bytes.fromhex("a8ab0bf0")


def _complete(recording: Path) -> bool:
    try:
        with open(recording, "rb") as f:
            return f.read(4) == DYNAMIC_ARCHIVE_MAGIC
    except OSError:
        return False


def archive_path(java_home: str) -> Path:
    """Where this Java's and jar set's archive lives (it may not exist yet)."""
    import pyspark

    from transforms.lake.session import jar_paths

    key = archive_key(java_home, Path(pyspark.__file__).parent / "jars", jar_paths())
    return cache_dir() / f"jvm-classes-{key}.jsa"


def _tidy(archive: Path, now: float) -> None:
    """Put a finished recording in place; throw away one cut short (and its claim: record again) and
    any left once the archive is there."""
    claim = archive.with_suffix(".claim")
    # Each recorder writes its own file (a claim can expire while a long-lived JVM still records).
    for recording in sorted(archive.parent.glob(f"{archive.stem}.*.recording")):
        age = _age(recording, now)
        if age is None or age < FINISHED_AFTER_SECONDS:
            continue  # maybe still being written
        if not archive.exists() and _complete(recording):
            try:
                os.replace(recording, archive)
                continue
            except OSError:
                pass  # another start moved it
        if not archive.exists():
            claim.unlink(missing_ok=True)  # cut short (its JVM killed while writing): record again
        recording.unlink(missing_ok=True)


def java_options(java_home: str | None, now: float | None = None) -> list[str]:
    """The JVM options that use this Java's and pyspark's archive, or record one if nobody is."""
    if not java_home:
        return []
    archive = archive_path(java_home)
    folder = archive.parent
    claim = archive.with_suffix(".claim")
    now = time.time() if now is None else now
    _tidy(archive, now)
    if archive.exists():
        claim.unlink(missing_ok=True)
        return [f"-XX:SharedArchiveFile={archive}"]
    claim_age = _age(claim, now)
    if claim_age is not None and claim_age < CLAIM_EXPIRES_SECONDS:
        return []  # another JVM is recording: start without
    try:
        folder.mkdir(parents=True, exist_ok=True)
        claim.unlink(missing_ok=True)  # expired
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except OSError:
        return []  # another start claimed it first (or the cache folder is not writable)
    return [f"-XX:ArchiveClassesAtExit={folder / f'{archive.stem}.{os.getpid()}.recording'}"]


# -- recording the archive now (`python -m transforms.jvm_cache`) ---------------------------------------
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
    _tidy(archive, time.time())
    if archive.exists():
        return archive
    say(f"recording the JVM's class cache {archive} (once per Java and jar set, about 30 s)")
    env = {**os.environ, "JAVA_HOME": java_home, "EVENTIDE_JVM_CLASS_CACHE": "true"}
    done = subprocess.run([sys.executable, "-c", "from transforms.jvm_cache import _recording_workload as w; w()"],
                          env=env, capture_output=True, text=True, timeout=600)
    pids = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("JVM_PID ")]
    if done.returncode != 0 or not pids:
        raise RuntimeError(f"the run that records the JVM's class cache failed, so Spark or Delta does not work "
                           f"here; its output ends:\n{(done.stderr or done.stdout)[-3000:]}")
    deadline = time.monotonic() + wait_seconds
    while alive(pids[0]) and time.monotonic() < deadline:  # the JVM writes the archive as it exits
        time.sleep(0.2)
    mine = [r for r in archive.parent.glob(f"{archive.stem}.*.recording") if _complete(r)]
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
