"""The Spark session: embedded `local[*]` by default, a master URL or a Spark Connect URL from settings."""

from __future__ import annotations

import os
import re
import shlex
import sys
import threading
from pathlib import Path

from transforms.lake.session import configure
from transforms.ports import LOOPBACK
from transforms.python_zygote import ZYGOTE_ENV, Zygote, new_address
from transforms.settings import Settings

_lock = threading.Lock()
_session = None
_zygote: Zygote | None = None

JAVA_17 = "/usr/lib/jvm/java-17-openjdk-amd64"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _prepare_environment() -> None:
    if not os.environ.get("JAVA_HOME") and os.path.isdir(JAVA_17):
        os.environ["JAVA_HOME"] = JAVA_17
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    # Python workers must run the interpreter that has Eventide installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # A user's app module sits in the folder `eventide` runs from (like `python -m`): Spark's Python
    # workers must import it too, to run its functions.
    cwd = os.getcwd()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cwd not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, cwd])


def get_spark(settings: Settings):
    """The process's Spark session, created on first use (about 5 s)."""
    global _session, _zygote
    with _lock:
        if _session is not None:
            return _session
        _prepare_environment()
        from pyspark.sql import SparkSession

        local = settings.spark_master.startswith("local")
        lean = local and _spark_python_is_ours(settings)
        builder = (
            SparkSession.builder.appName("eventide")
            .master(with_task_attempts(settings.spark_master, settings.spark_task_attempts))
            .config("spark.ui.enabled", str(settings.spark_ui).lower())
            .config("spark.driver.memory", settings.spark_driver_memory)
            .config("spark.driver.maxResultSize", "0")  # the driver collects per batch only what is bounded
            .config("spark.sql.warehouse.dir", str((settings.home / "spark-warehouse").absolute()))
            .config("spark.driver.extraJavaOptions", " ".join(_driver_java_options(settings)))
            .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
            .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
            # Commit the state's changes, not a snapshot, each micro-batch (measured: 210 -> 127 ms a batch).
            .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            # The JVM waits this long for Python to connect to a result socket (collect, toPandas); the
            # default 15 s failed a batch on a machine loaded 5x over its cores.
            .config("spark.python.authenticate.socketTimeout", "120s")
            .config("spark.python.unix.domain.socket.enabled", str(settings.spark_unix_sockets).lower())
            # Each query's jobs in a pool of its own (sinks.BatchWriter): a big bronze batch shares the
            # cores with an app's small one instead of holding them until it is done (FIFO).
            .config("spark.scheduler.mode", "FAIR")
        )
        builder = configure(builder, executors_apart=not local)  # Delta Lake (delta-spark): the lake's reads and writes
        for key, value in settings.spark_conf.items():  # the user's own (EVENTIDE_SPARK_CONF), last
            builder = builder.config(key, value)
        if local:  # embedded: loopback only; a cluster's executors must reach the driver (SPARK_LOCAL_IP)
            builder = builder.config("spark.driver.bindAddress", LOOPBACK).config("spark.driver.host", LOOPBACK)
            if lean:
                builder = builder.config("spark.python.daemon.module", "transforms.python_daemon")
        launcher = _lean_launcher() if lean else None
        # The JVM, and so the launcher it starts, inherits the zygote's address (transforms/python_zygote.py).
        address = new_address() if launcher and settings.spark_python_zygote else None
        if address:
            os.environ[ZYGOTE_ENV] = address
        else:
            os.environ.pop(ZYGOTE_ENV, None)  # not another process's
        _session = _start_with_log(builder, settings)
        _session.sparkContext.setLogLevel("ERROR")
        if launcher:
            # Read when a query wraps its functions: the Python processes Spark starts for them.
            _session.sparkContext.pythonExec = launcher
        if address:  # started after the JVM: its imports overlap the session's first work, not its start
            _zygote = Zygote(address, str(settings.home / "logs" / "spark.log"))
        if not local:
            ship_user_code(_session, settings)
        return _session


def _spark_python_is_ours(settings: Settings) -> bool:
    """The lean path is on and Spark's Python is this interpreter (another one may not have Eventide
    installed to start its daemon and launcher)."""
    return settings.spark_lean_worker_path and os.environ.get("PYSPARK_PYTHON") == sys.executable


def _lean_launcher() -> str | None:
    """This venv's `eventide-spark-python` (transforms/python_launcher.py), if installed next to it."""
    launcher = Path(sys.executable).with_name("eventide-spark-python")
    return str(launcher) if launcher.is_file() else None


_LOCAL_N = re.compile(r"local\[\s*([0-9]+|\*)\s*\]")


def with_task_attempts(master: str, attempts: int) -> str:
    """An embedded master with `attempts` tries per task (Spark's `local[N,F]`); other masters as given:
    plain `local` (one thread, for debugging), `local[N,F]` and cluster URLs (their own maxFailures)."""
    m = _LOCAL_N.fullmatch(master.strip())
    return f"local[{m.group(1)},{attempts}]" if m and attempts > 1 else master


# HotSpot's C2 (tier 4) thresholds, 20 times Java 17's defaults. A JVM of `eventide run` lives for seconds to
# minutes and runs a great deal of Spark's and Delta's code a few thousand times: by default C2 compiled all of
# it: 27 of the 95 busy CPU-s of a cold 1M-line run on 2 cores, more than the run's own tasks. The per-row
# loops still reach C2 within seconds (10M lines: 252 CPU-s and 140.6 s with these against 271 and 145.5).
# bench/README.md, issue L's seventh sitting.
JIT_HOT_ONLY = ("-XX:Tier4InvocationThreshold=100000", "-XX:Tier4MinInvocationThreshold=12000",
                "-XX:Tier4CompileThreshold=300000", "-XX:Tier4BackEdgeThreshold=800000")


def _driver_java_options(settings: Settings) -> list[str]:
    """Eventide's options for the driver's JVM, then the user's (EVENTIDE_SPARK_JAVA_OPTIONS): of a flag
    given twice, Java takes the last."""
    options = [f"-Dderby.system.home={(settings.home / 'derby').absolute()}"]
    if settings.jvm_class_cache:
        from transforms.jvm_cache import java_options

        options += java_options(os.environ.get("JAVA_HOME"))
    if settings.jvm_c2_hot_only:
        options += JIT_HOT_ONLY
    return options + shlex.split(settings.spark_java_options)


def start_in_background(settings: Settings) -> threading.Thread:
    """Start the session on a thread, so the JVM starts (2-4 s) while the caller does other work; the
    first `get_spark` then waits for it. While the JVM starts, this process's stdout and stderr go to
    the Spark log (see _start_with_log): callers start it before work that prints nothing.

    What the start imports is imported first, here, so the thread imports nothing and the caller may
    import anything meanwhile (two threads importing one package at once can meet it half initialized)."""
    _import_what_the_start_imports()
    thread = threading.Thread(target=get_spark, args=(settings,), name="eventide-spark-start", daemon=True)
    thread.start()
    return thread


def _import_what_the_start_imports() -> None:
    # PySpark imports some of these only once the JVM is up: py4j's argument converters import
    # pyspark.testing.utils, which brings pandas, pyarrow and protobuf. Cheap when already imported.
    import pyspark.sql  # noqa: F401
    import pyspark.testing.utils  # noqa: F401

    import transforms.jvm_cache  # noqa: F401


# -- user code on the executors ------------------------------------------------------------------------
def user_code_roots(settings: Settings) -> list[Path]:
    """What the registered apps' modules need on a cluster's executors: each app module's top-level
    package folder, or for a module file, the file with its sibling modules and packages (what it can
    import from its folder). Modules installed in site-packages are left out (the workers' Python must
    have them installed too, like pyspark itself)."""
    import importlib.util
    import sysconfig

    from transforms.registry import parse_entries

    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    settings.registry  # noqa: B018 - imports the apps (and puts the current folder on sys.path)
    roots: dict[Path, None] = {}
    for entry in parse_entries(settings.apps):
        top = entry.partition(":")[0].split(".")[0]
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            continue
        origin = Path(spec.origin).resolve()
        if any(origin.is_relative_to(i) for i in installed):
            continue
        if spec.submodule_search_locations:  # a package
            roots[origin.parent] = None
            continue
        roots[origin] = None
        for sibling in origin.parent.iterdir():
            if sibling.suffix == ".py" or (sibling / "__init__.py").is_file():
                roots[sibling] = None
    return list(roots)


def user_code_archive(settings: Settings) -> Path | None:
    """A zip of `user_code_roots` under the home (importable from the zip's root), or None if empty."""
    import zipfile

    roots = user_code_roots(settings)
    if not roots:
        return None
    archive = settings.home / "spark-files" / "eventide_user_code.zip"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for root in roots:
            files = [root] if root.is_file() else sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
            for f in files:
                z.write(f, f.relative_to(root.parent).as_posix())
    return archive


def ship_user_code(spark, settings: Settings) -> None:
    """Send the registered apps' modules to a cluster's executors (its workers do not share the
    driver's folder or PYTHONPATH)."""
    archive = user_code_archive(settings)
    if archive is None:
        return
    spark.sparkContext.addPyFile(str(archive))


_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def explain_task_error(error: BaseException | str) -> str | None:
    """What to do when a Spark task failed because it could not import a module, else None."""
    found = _MISSING_MODULE.search(str(error))
    if not found:
        return None
    name = found.group(1)
    return (
        f"a Spark task could not import module {name!r}: the executors' Python does not have it. Eventide "
        "ships the registered apps' own modules (EVENTIDE_APPS: their package, or a module file with its "
        f"folder's modules); if {name!r} is a library, install it into the Python that every worker runs "
        f"(PYSPARK_PYTHON, here {sys.executable}); if it is your code outside the app's folder, move it "
        "next to the app module or install it as a package"
    )


def _start_with_log(builder, settings: Settings):
    """Start the JVM with its stdout/stderr going to `<home>/logs/spark.log`.

    Spark's JVM and its Python workers print freely (PySpark's transformWithState worker prints
    unconditionally); Eventide's own output stays readable, and failures still reach Python as
    exceptions. The file descriptors are swapped only while the JVM starts, so it inherits them.
    """
    log_dir = settings.home / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(log_dir / "spark.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        return builder.getOrCreate()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)


def stop_spark() -> None:
    global _session, _zygote
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
        if _zygote is not None:
            _zygote.stop()
            _zygote = None
            os.environ.pop(ZYGOTE_ENV, None)


def python_zygote() -> Zygote | None:
    """The session's zygote of driver-side Python processes, if it started one."""
    return _zygote
