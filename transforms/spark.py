"""The Spark session: embedded `local[*]` by default, a master URL or a Spark Connect URL from settings."""

from __future__ import annotations

import os
import sys
import threading

from transforms.settings import Settings

_lock = threading.Lock()
_session = None

JAVA_17 = "/usr/lib/jvm/java-17-openjdk-amd64"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _prepare_environment() -> None:
    if not os.environ.get("JAVA_HOME") and os.path.isdir(JAVA_17):
        os.environ["JAVA_HOME"] = JAVA_17
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run the interpreter that has Eventide installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_spark(settings: Settings):
    """The process's Spark session, created on first use (about 5 s)."""
    global _session
    with _lock:
        if _session is not None:
            return _session
        _prepare_environment()
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName("eventide")
        if settings.spark_remote:
            builder = builder.remote(settings.spark_remote)
        else:
            builder = (
                builder.master(settings.spark_master)
                .config("spark.ui.enabled", str(settings.spark_ui).lower())
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.sql.warehouse.dir", str((settings.home / "spark-warehouse").absolute()))
                .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={(settings.home / 'derby').absolute()}")
            )
        builder = (
            builder.config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
            .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        )
        _session = builder.getOrCreate()
        if not settings.spark_remote:
            _session.sparkContext.setLogLevel("ERROR")
        return _session


def stop_spark() -> None:
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
