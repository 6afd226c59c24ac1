"""What a Spark session needs to read and write the lake: delta-spark's jars and settings, and the
home's tables registered in its catalog.

The jars come from `make setup` (jvm/pom.xml, `mvn dependency:copy-dependencies`) into `<venv>/jars`:
no Maven repository is reached at run time. `delta_spark_conf()` is all a user's own PySpark session
needs (docs/operations.md: "Reading the tables from your own Spark session").
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

# delta-spark on PyPI and its jar go together (pyproject.toml pins the one, jvm/pom.xml the other).
DELTA_VERSION = "4.4.0"
JARS_ENV = "EVENTIDE_JARS"
_VERSIONED_JAR = re.compile(r"-[0-9][0-9.]*[^/]*\.jar$")


class MissingJarsError(RuntimeError):
    """The Delta jars are not installed where Eventide looks for them."""


def jars_dir() -> Path:
    """Where `make setup` put the JVM libraries: EVENTIDE_JARS, else `<sys.prefix>/jars` (the venv's)."""
    return Path(os.environ.get(JARS_ENV) or Path(sys.prefix) / "jars")


def jar_paths() -> list[str]:
    """The jars to put on Spark's class path (those pyspark ships itself left out). MissingJarsError
    says what to run when delta-spark's jar is not there."""
    folder = jars_dir()
    jars = sorted(str(p) for p in folder.glob("*.jar")) if folder.is_dir() else []
    if not any(Path(j).name.startswith("delta-spark_") for j in jars):
        raise MissingJarsError(
            f"delta-spark's jar is not in {folder}: run `make setup` in the Eventide checkout (it resolves the jars "
            f"of jvm/pom.xml from Maven Central once), or point {JARS_ENV} at a folder holding "
            f"io.delta:delta-spark_4.1_2.13:{DELTA_VERSION} and its dependencies"
        )
    return jars


# Artifacts whose classes pyspark ships under another artifact's name (jcl-over-slf4j is Spark's
# commons-logging): on the driver's class path ahead of Spark's jars they would replace Spark's.
_SHIPPED_AS_ANOTHER = {"commons-logging"}


def pyspark_jar_names() -> set[str]:
    """The artifact names of the jars pyspark ships (to leave duplicates out of the jars folder)."""
    import pyspark

    shipped = {_VERSIONED_JAR.sub("", p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return shipped | _SHIPPED_AS_ANOTHER


def prune_jars(folder: Path) -> list[str]:
    """Delete from `folder` the jars whose artifact pyspark already ships (Spark's own class path wins
    anyway); returns what was deleted. Run by `make setup` after Maven copied the dependencies."""
    shipped = pyspark_jar_names()
    gone = []
    for jar in sorted(folder.glob("*.jar")):
        if _VERSIONED_JAR.sub("", jar.name) in shipped:
            jar.unlink()
            gone.append(jar.name)
    return gone


FILE_LISTING_TASKS = 8

# jvm/localfs, compiled by `make setup` into the jars folder: Hadoop's local file system with permissions and
# links through java.nio. Hadoop's own starts a `chmod` or `readlink` process for every file Spark and Delta
# write or rename on local disk without Hadoop's native library, which pyspark does not ship.
LOCAL_FS_JAR = "eventide-localfs.jar"
LOCAL_FS_CONF = {
    "spark.hadoop.fs.file.impl": "eventide.hadoop.NioLocalFileSystem",  # FileSystem: data files
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "eventide.hadoop.NioLocalFs",  # FileContext: checkpoints, commits
}


def delta_spark_conf(executors_apart: bool = True) -> dict[str, str]:
    """The Spark settings under which a session reads and writes Eventide's Delta tables.
    `executors_apart=False` for an embedded (`local`) master, whose tasks run in the driver's JVM."""
    jars = jar_paths()
    local_fs = LOCAL_FS_CONF if any(Path(j).name == LOCAL_FS_JAR for j in jars) else {}
    # A cluster's executors fetch spark.jars. An embedded master's tasks find the jars on the driver's class
    # path, and a copy of them for its executor would be 23 MB written to a temporary folder each JVM start.
    fetched = {"spark.jars": ",".join(jars)} if executors_apart else {}
    return {
        **local_fs,
        **fetched,
        # The driver loads them with Spark's own (on its class path: the JVM's class-data archive,
        # transforms/jvm_cache.py, then holds Delta's classes too).
        "spark.driver.extraClassPath": os.pathsep.join(jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Small tables, small machines: the log's state is read in a few tasks, not Delta's default 50.
        "spark.databricks.delta.snapshotPartitions": "2",
        # Upkeep of the many small files micro-batches write is OPTIMIZE on a cadence (upkeep.py), not
        # Delta's auto compaction: that compacts a new table right after its first write (measured: a
        # second commit and ~1 s on every table's creation). The log checkpoints every 10 commits.
        "spark.databricks.delta.autoCompact.enabled": "false",
        "spark.databricks.delta.properties.defaults.checkpointInterval": "10",
        # No version checksum file per commit (measured: 0.51 -> 0.42 s a small append).
        "spark.databricks.delta.writeChecksumFile.enabled": "false",
        # The lake's tables stay readable by delta-rs (status, show): no deletion vectors.
        "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
        # Vacuum may go below Delta's 168 h floor when EVENTIDE_VACUUM_HOURS says so.
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        # VACUUM lists a table's files in a Spark job of this many tasks (Spark's default: 10,000, one
        # job of 10,001 tasks for any table): 24-31 s a small table on 2 cores, 2.6-3.8 s with 8.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(FILE_LISTING_TASKS),
    }


def configure(builder, executors_apart: bool = True):
    """`builder` (a `SparkSession.builder`) with what reading and writing the lake needs:

        spark = configure(SparkSession.builder.master("local[*]")).getOrCreate()
    """
    for key, value in delta_spark_conf(executors_apart).items():
        builder = builder.config(key, value)
    return builder


def register_tables(spark, lake: Path) -> list[str]:
    """Name every Delta table under `lake` in the session's catalog (as `eventide show` names it: its
    folder's name), so `spark.sql("select ... from bronze_log_lines")` works; returns the names. A name
    the session already gives another location is pointed here (an external table: dropping its name
    leaves its files alone)."""
    from transforms.lake.reads import exists

    names = []
    for folder in sorted(lake.iterdir()) if lake.is_dir() else []:
        if not exists(folder):
            continue
        location = str(folder.absolute())
        if spark.catalog.tableExists(folder.name):
            known = spark.sql(f"DESCRIBE DETAIL `{folder.name}`").collect()[0]["location"]
            if known.removeprefix("file:").rstrip("/") == location.rstrip("/"):
                names.append(folder.name)
                continue
            spark.sql(f"DROP TABLE `{folder.name}`")
        quoted = location.replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"CREATE TABLE `{folder.name}` USING delta LOCATION '{quoted}'")
        names.append(folder.name)
    return names
