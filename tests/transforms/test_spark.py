"""The session (transforms/spark.py): an embedded master retries a failed task, as a cluster does; Python
workers reach the JVM over Unix domain sockets and start with a lean path."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from transforms import lake
from transforms.python_daemon import lean_path
from transforms.settings import ConfigError, Settings
from transforms.spark import JIT_HOT_ONLY, _driver_java_options, with_task_attempts


@pytest.mark.parametrize(("master", "attempts", "expected"), [
    ("local[*]", 2, "local[*,2]"),
    ("local[2]", 3, "local[2,3]"),
    (" local[ 4 ] ", 2, "local[4,2]"),
    ("local[*]", 1, "local[*]"),  # one attempt: Spark's own local default
    ("local[2,5]", 2, "local[2,5]"),  # names its own
    ("local", 2, "local"),
    ("spark://127.0.0.1:7077", 2, "spark://127.0.0.1:7077"),  # a cluster: spark.task.maxFailures
])
def test_an_embedded_master_gets_the_task_attempts(master, attempts, expected):
    assert with_task_attempts(master, attempts) == expected


def test_fewer_than_one_attempt_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="EVENTIDE_SPARK_TASK_ATTEMPTS=0"):
        Settings(home=tmp_path, spark_task_attempts=0)


def _fails_on_first_attempt(batches):
    from pyspark import TaskContext

    if TaskContext.get().attemptNumber() == 0:
        raise ConnectionError("a transient failure, as a Python worker's timed-out connection")
    yield from batches


@pytest.mark.spark
def test_a_task_that_fails_once_is_retried_and_counts_once(spark):
    assert spark.sparkContext.master == "local[2,2]"
    df = spark.range(0, 1000, numPartitions=2).mapInArrow(_fails_on_first_attempt, "id long")
    assert sorted(r.id for r in df.collect()) == list(range(1000))


@pytest.mark.spark
def test_python_workers_reach_the_jvm_over_unix_sockets(spark):
    """settings.spark_unix_sockets: no loopback TCP port for a worker's state server or results. The
    workers themselves are told so (pyspark's daemon reads PYTHON_UNIX_DOMAIN_ENABLED)."""
    assert spark.conf.get("spark.python.unix.domain.socket.enabled") == "true"
    assert _ask_a_worker(spark).unix.lower() == "true"  # as pyspark.daemon reads it


@pytest.mark.spark
def test_python_workers_start_without_spark_zips_on_their_path(spark):
    """settings.spark_lean_worker_path: Spark puts pyspark.zip, py4j's zip and spark-core's jar on the
    workers' path, and each task's importlib.invalidate_caches() re-read their directories (0.10 s a task
    on Python 3.11). The workers import the same pip-installed pyspark without them."""
    assert spark.conf.get("spark.python.daemon.module") == "transforms.python_daemon"
    row = _ask_a_worker(spark)
    path = row.path.split("\n")
    assert not [p for p in path if p.endswith((".zip", ".jar")) and "pyspark" in p], path
    assert row.zips == "", row.zips  # no zip importer left for invalidate_caches to re-read
    assert row.pyspark.startswith(str(Path(pyspark.__file__).parent)), row.pyspark  # the driver's pyspark


@pytest.mark.spark
def test_the_python_spark_starts_is_the_lean_launcher(spark):
    """Spark starts its daemon and, at every keyed query's start, transformWithState's driver-side
    Python through `eventide-spark-python`: this interpreter, the zips off its path (1.27 -> 0.65 s of
    imports each time)."""
    launcher = Path(sys.executable).with_name("eventide-spark-python")
    assert spark.sparkContext.pythonExec == str(launcher)


PROBE = """import json, sys, zipimport
import pyspark
print(json.dumps({"name": __name__, "argv": sys.argv, "path": sys.path, "pyspark": pyspark.__file__,
                  "zips": [k for k, v in sys.path_importer_cache.items() if isinstance(v, zipimport.zipimporter)]}))
"""


def test_the_launcher_runs_a_module_as_python_m_does_without_spark_zips(tmp_path):
    """`eventide-spark-python -m MODULE ARGS` as Spark calls it: the working folder first on the path,
    the module as __main__ with its arguments, pyspark from site-packages though Spark's zips come first
    in PYTHONPATH."""
    (tmp_path / "probe.py").write_text(PROBE)
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = sorted(str(z) for z in lib.glob("*.zip"))
    assert zips, lib  # what Spark puts first on its Python processes' path
    out = subprocess.run([str(Path(sys.executable).with_name("eventide-spark-python")), "-m", "probe", "a", "b"],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(zips)},
                         capture_output=True, text=True, timeout=60, check=True)
    facts = json.loads(out.stdout)
    assert facts["name"] == "__main__" and facts["argv"] == [str(tmp_path / "probe.py"), "a", "b"]
    assert facts["path"][0] == str(tmp_path) and not set(zips) & set(facts["path"]), facts["path"]
    assert facts["pyspark"] == pyspark.__file__ and facts["zips"] == []


def _ask_a_worker(spark):
    """What a real Python worker sees: its socket setting, path, zip importers, and pyspark's file."""
    (row,) = spark.range(1, numPartitions=1).mapInArrow(
        _worker_facts, "unix string, path string, zips string, pyspark string").collect()
    return row


def _worker_facts(batches):
    import os
    import sys
    import zipimport

    import pyarrow as pa
    import pyspark

    zips = [k for k, v in sys.path_importer_cache.items() if isinstance(v, zipimport.zipimporter)]
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"unix": [os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "unset")],
                                          "path": ["\n".join(sys.path)], "zips": ["\n".join(zips)],
                                          "pyspark": [pyspark.__file__]})


def test_lean_path_drops_the_zips_only_when_the_same_pyspark_imports_without_them(tmp_path):
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    jar = str(site / "pyspark" / "jars" / "spark-core_2.13-4.1.4.jar")
    other = str(tmp_path / "user.zip")  # a user's own zip stays
    path = [*zips, jar, other, str(site)]
    assert lean_path(path) == [*zips, other, str(site)]  # no py4j outside the zips: they stay
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")
    assert lean_path(path) == [other, str(site)]


def test_the_session_starts_on_its_thread_without_importing_anything(tmp_path):
    """What the great-expectations warm-up relies on (orchestration/runner.py), with a real JVM in a process
    of its own: the thread start_in_background starts loads no module (PySpark's own lazy imports, done
    once the JVM is up, were made ahead on the caller's thread), so the caller may import anything while
    the JVM starts. A module lookup that finds nothing (PySpark probes for `pyspark_connect`) loads none."""
    import os
    import subprocess
    import sys

    code = """
import sys, threading
class Recorder:
    seen = []
    def find_spec(self, name, path=None, target=None):
        if threading.current_thread() is not threading.main_thread():
            self.seen.append(name)
        return None
sys.meta_path.insert(0, Recorder())
from transforms.settings import Settings
from transforms.spark import start_in_background
from pyspark import SparkContext
starting = start_in_background(Settings())
starting.join()
loaded = [m for m in Recorder.seen if m in sys.modules]
print("RESULT", SparkContext._active_spark_context is not None, loaded)
"""
    env = {**os.environ, "EVENTIDE_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180,
                         cwd=Path(__file__).resolve().parents[2])
    assert "RESULT True []" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_spark_options_of_ones_own_are_read_split_on_semicolons(tmp_path):
    env = {"EVENTIDE_HOME": str(tmp_path),
           "EVENTIDE_SPARK_CONF": " spark.jars.packages=a:b:1,c:d:2 ; spark.driver.extraJavaOptions=-Da=b -Dc=d;"}
    assert Settings.from_env(env).spark_conf == {"spark.jars.packages": "a:b:1,c:d:2",
                                                 "spark.driver.extraJavaOptions": "-Da=b -Dc=d"}


@pytest.mark.parametrize(("raw", "message"), [
    ("spark.sql.codegen.wholeStage", "expected name=value pairs separated by ';'"),
    ("sql.codegen.wholeStage=false", r"\['sql.codegen.wholeStage'\] are not Spark options"),
])
def test_a_malformed_spark_option_is_refused_with_its_variable(tmp_path, raw, message):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({"EVENTIDE_HOME": str(tmp_path), "EVENTIDE_SPARK_CONF": raw})


@pytest.mark.spark
def test_the_session_gets_the_options_of_ones_own_last(spark):
    """The tests' own (tests/conftest.py) reach the session: Spark's code generation off."""
    assert Settings().spark_conf["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
    assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"


def test_only_executors_apart_from_the_driver_fetch_the_jars():
    """A cluster's executors fetch spark.jars; an embedded master's tasks run in the driver's JVM, which has
    them on its class path."""
    jars = lake.jar_paths()
    assert lake.delta_spark_conf()["spark.jars"].split(",") == jars
    embedded = lake.delta_spark_conf(executors_apart=False)
    assert "spark.jars" not in embedded and embedded["spark.driver.extraClassPath"].split(os.pathsep) == jars


@pytest.mark.spark
def test_an_embedded_sessions_executor_copies_no_jars_and_finds_delta(spark, tmp_path):
    """Nothing is added for the executor to fetch (before, 23 MB of jars copied into a temporary folder each
    JVM start), and a task still finds Delta's classes: through the driver's class path."""
    assert spark.sparkContext._jsc.sc().listJars().isEmpty()
    path = str(tmp_path / "table")
    spark.range(3).write.format("delta").save(path)  # the Parquet files and their statistics: in tasks
    assert spark.read.format("delta").load(path).count() == 3


def _flag(name: str, options: list[str]) -> str | None:
    """The value Java takes for `-XX:name=...`: the last one given."""
    values = [o.split("=", 1)[1] for o in options if o.startswith(f"-XX:{name}=")]
    return values[-1] if values else None


def test_c2_compiles_only_hot_code_unless_turned_off_or_overridden(tmp_path, monkeypatch):
    """settings.jvm_c2_hot_only: the driver JVM gets C2 thresholds 20 times Java's; the user's own
    options come after them, so a threshold of one's own wins."""
    # Settings() reads the environment: the default is what is asserted, whatever the shell running the tests set.
    monkeypatch.delenv("EVENTIDE_JVM_C2_HOT_ONLY", raising=False)
    on = _driver_java_options(Settings(home=tmp_path, jvm_class_cache=False))
    assert _flag("Tier4InvocationThreshold", on) == "100000"
    assert _flag("Tier4BackEdgeThreshold", on) == "800000"
    off = _driver_java_options(Settings(home=tmp_path, jvm_class_cache=False, jvm_c2_hot_only=False))
    assert not [o for o in off if o.startswith("-XX:Tier4")]
    own = _driver_java_options(Settings(home=tmp_path, jvm_class_cache=False,
                                        spark_java_options="-XX:Tier4InvocationThreshold=5000"))
    assert _flag("Tier4InvocationThreshold", own) == "5000"
    assert Settings.from_env({"EVENTIDE_HOME": str(tmp_path), "EVENTIDE_JVM_C2_HOT_ONLY": "0"}).jvm_c2_hot_only is False


def test_this_java_takes_the_c2_thresholds():
    """A flag this Java does not know (or a typo) would stop every JVM from starting."""
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
    out = subprocess.run([str(java), *JIT_HOT_ONLY, "-XX:+PrintFlagsFinal", "-version"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    final = {line.split()[1]: line.split()[3] for line in out.stdout.splitlines() if "Tier4" in line}
    assert {k: final[k] for k in ("Tier4InvocationThreshold", "Tier4MinInvocationThreshold",
                                  "Tier4CompileThreshold", "Tier4BackEdgeThreshold")} == \
        {"Tier4InvocationThreshold": "100000", "Tier4MinInvocationThreshold": "12000",
         "Tier4CompileThreshold": "300000", "Tier4BackEdgeThreshold": "800000"}


@pytest.mark.spark
def test_the_sessions_jvm_runs_with_the_c2_thresholds(spark):
    arguments = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert set(JIT_HOT_ONLY) <= set(arguments), arguments
