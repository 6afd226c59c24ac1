"""The one settings object. Every field can be set by an environment variable `EVENTIDE_<FIELD>`.

`Settings()` reads the environment; keyword arguments override it (`Settings(home=Path("x"))`).
Embedded defaults need no configuration: everything lives under `EVENTIDE_HOME` (default
`./.eventide`), Spark runs as `local[*]`, the gateway listens on loopback, and the registered apps
(`EVENTIDE_APPS`) are the bundled examples.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

from transforms.errors import ConfigError
from transforms.ports import LOOPBACK

__all__ = ["ConfigError", "Settings", "get_settings", "reset_settings"]


CONNECT_REFUSED = (
    "EVENTIDE_SPARK_REMOTE={url}: Eventide cannot run over Spark Connect with PySpark 4.1. Spark writes the "
    "Delta tables itself (delta-spark), which would work over Connect, but Spark Connect runs a streaming "
    "query's foreachBatch function in a Python process on the server, not in this process, and Eventide's "
    "batch writer does more than write Delta there: it sends the TCP sinks' outputs through sender "
    "processes of its own, and reports every batch to `eventide run`, Dagster and `eventide serve` (over "
    "Connect those reports never come back, and the server's foreachBatch worker cannot import app "
    "modules sent as artifacts). Run on a cluster through its master instead: unset "
    "EVENTIDE_SPARK_REMOTE and set EVENTIDE_SPARK_MASTER=spark://HOST:PORT."
)


DEFAULT_APPS = "examples.logs:app,examples.market:app,examples.words:app"
# Fields that are not read from the environment.
_NOT_FROM_ENV = ("app_registry",)


@dataclass(frozen=True, init=False)
class Settings:
    home: Path = Path(".eventide")
    # The registered applications: comma-separated `module:attribute` entries.
    apps: str = DEFAULT_APPS
    # Spark: `local[*]` embedded, or a `spark://host:port` master. A Spark Connect URL is refused (see
    # CONNECT_REFUSED): kept as a setting so that it says why instead of being ignored.
    spark_master: str = "local[*]"
    spark_remote: str = ""
    spark_shuffle_partitions: int = 2
    spark_ui: bool = False
    spark_driver_memory: str = "4g"  # local[*]: the driver's JVM also runs the executors' tasks
    # Attempts per task on an embedded master (`local[N]` becomes `local[N,attempts]`), as a cluster
    # retries a failed task (spark.task.maxFailures, 4 there); embedded Spark gives up on the first
    # failure, and a Python worker's connection to its task's state server has timed out once under
    # load. A master that names its own (`local[2,3]`) keeps them.
    spark_task_attempts: int = 2
    # Python workers reach their executor's JVM (a stateful step's state server among them) over Unix
    # domain sockets, not loopback TCP. A state server's TCP port takes the first connection, with a
    # backlog of 1 and no authentication: once a worker's connect to one timed out, and once a server's
    # thread died on a request that was not its protocol and the task hung (where those bytes came from
    # was not found). A socket file is the worker's alone.
    spark_unix_sockets: bool = True
    # An embedded session's Python workers start without Spark's zips and jar on their path
    # (transforms/python_daemon.py): re-reading them cost every Python task 0.10 s.
    spark_lean_worker_path: bool = True
    # With the lean path, the driver-side Python that each keyed query's first batch starts is forked from a
    # warm zygote (transforms/python_zygote.py) instead of started cold: its imports were most of its ~1 s.
    spark_python_zygote: bool = True
    # The driver JVM maps the classes an earlier start recorded (transforms/jvm_cache.py, ~/.cache/eventide).
    jvm_class_cache: bool = True
    # The driver JVM compiles with C2 only what is hot (transforms/spark.py, JIT_HOT_ONLY): a short-lived run's
    # C2 threads spent a quarter of its CPU on code that ran too little to pay it back, and `serve`'s spent half
    # of its JVM's CPU catching up on a backlog.
    jvm_c2_hot_only: bool = True
    # Extra options for the driver's JVM (EVENTIDE_SPARK_JAVA_OPTIONS), e.g. the tests' -XX:TieredStopAtLevel=1:
    # short-lived JVMs spend less CPU compiling (measured: 12% less CPU for tests/transforms/test_lake.py).
    spark_java_options: str = ""
    # Spark options of your own, applied after Eventide's (EVENTIDE_SPARK_CONF="key=value;key=value", split on
    # ";" since values may hold commas), e.g. spark.executor.memory for a cluster. The tests turn off
    # Spark's code generation with it (tests/conftest.py).
    spark_conf: dict[str, str] = field(default_factory=dict, metadata={"separator": ";"})
    # Lake upkeep (transforms/lake/upkeep.py): VACUUM keeps the files of versions younger than this;
    # `serve` compacts and vacuums every upkeep_minutes (0 = never): at 1k msgs/s a query's table gains
    # a file per micro-batch (tens a minute), so a few minutes keep it well under a few hundred.
    vacuum_hours: float = 168.0
    upkeep_minutes: float = 2.0
    # Upkeep keeps each table's Delta log (its history, time travel) this long, and Delta up to a day more:
    # its 30 days at a commit a second under `serve` would be 2.6M files in the log folder, which every
    # commit lists (bench.delta_log: a one-row append 0.69 s, 2.27 s with 100,000 more files there).
    log_retention_hours: float = 2.0
    # How a new checkpoint keeps keyed state (an existing one keeps its own, see keyed_state.py):
    # "bucket" (keys hashed into buckets, one Spark group per bucket per batch) or "key" (one group
    # per key: the reference form, kept for the equality tests and the benchmark). Timers use "key".
    state_layout: str = "bucket"
    # A TCP sink's batch "in doubt": its sender process (transforms/tcp_relay.py) stopped while sending
    # it, so the receiver may hold none, part or all of it. "resend" (no output lost; some may arrive twice) or "skip" (none twice;
    # some may be lost). Either way the batch is recorded next to the checkpoint and reported.
    tcp_in_doubt: str = "resend"
    # The log the gateway and `ingest` write and every query reads (transforms/ingestion/log.py): unset or
    # `landing` = the landing folder under the home; `kafka://HOST:PORT` = a Kafka topic per sequence group.
    log: str = ""
    # Gateway
    bind_host: str = LOOPBACK
    # Ports by stream, over what the apps' sources declare (`temps=7201,logs=7101`); 0 = a free port.
    ports: dict[str, int] = field(default_factory=dict)
    header_length: int = 4
    length_fmt: str = ">I"
    max_frame_bytes: int = 1 << 20
    segment_max_bytes: int = 8 << 20
    # A segment closes (becomes visible to the queries) this long after its first message at most.
    segment_max_seconds: float = 0.25
    # ... and sooner once its stream has been quiet this long (a burst is visible at once), if no other
    # segment of its log closed in the last segment_max_seconds: at most one segment per log per
    # segment_max_seconds either way. 0 = close by age only.
    segment_quiet_seconds: float = 0.05
    # Pipelines
    marker: str = "END_OF_DAY"
    fail_fast: bool = False
    # A window step that allows it (trigger windows whose aggregator can merge, no count limit) gets its
    # key's runs of messages folded where they are decoded, on every core, instead of one by one in the
    # key's single task (windows.TriggerWindows.prefold). Off: the reference form, for comparison.
    prefold: bool = True
    # Landing bytes per micro-batch (Spark's maxBytesPerTrigger; a batch takes at least one segment):
    # bounds the driver's memory on a large backlog (4M log lines in one batch exhausted a 1 GB driver)
    # without bounding the number of small segments a batch may take (under serve a segment closes
    # every 0.25 s: a count would let a query on a slower trigger fall behind). 0 = no bound.
    max_bytes_per_trigger: int = 64 << 20
    # Closed segments per micro-batch instead, if set (tests use it to cut a run into batches).
    max_files_per_trigger: int = 0
    # Landed messages per micro-batch of a query whose messages travel as Python objects (envelope
    # mode). Segments are compressed Parquet, so 64 MB can be millions of messages (repetitive text: 6
    # bytes a line), each of them Python objects, more if a step fans out (word count: 24 words a
    # line): a 2M-line word count in one batch grew Python workers past 10 GB, and 500k lines (12M
    # words, 24M sink rows) overran the driver's 4 GB heap reading a cached block back. Turned into a
    # bound in bytes from the log's own bytes per message. 0 = no bound.
    max_messages_per_trigger: int = 200_000
    # `eventide serve`: seconds between the micro-batches of each running query (a query with timers
    # runs a batch every trigger even when idle, so it uses at least 1 s).
    trigger_interval: float = 0.25
    # `eventide serve`: the bronze queries' interval (off the answer path: bigger, cheaper batches).
    bronze_trigger_interval: float = 10.0
    # `eventide serve`: a query whose checkpoint's list of the files it read grew this many MB since it
    # started is restarted (after its batch in flight commits), so it forgets the archived segments in it
    # (archive.forget_archived); about 25,000 segments, under two hours of one log at its busiest (Eventide
    # reads every query's list every 10 s to archive: about 0.1 s at that size). 0 = never.
    file_list_restart_mb: float = 4.0
    # `eventide serve`: once a log's archive holds this many segments, runs of them are merged into
    # segments of at most a query's batch (ingestion/archive.py, compact_archive): a day of one busy log
    # would be 345,600 small files for a new query, a replay or a recovery to list. 0 = never.
    archive_compact_files: int = 1000
    # `eventide serve`: at most one Dagster event per table in this many seconds.
    report_interval: float = 5.0
    # `eventide run --close-windows`: at the end of each run, close every key's open windows (reason
    # end_of_input; see transforms/engine/close_windows.py). Never by default: more data may land.
    close_windows: bool = False
    # Daily summaries
    partitions_start: str = "2004-03-01"
    day_grace_hours: float = 6.0
    # Freshness (Dagster's policy on each bronze and app table, judged by the UI and `eventide status`):
    # a table is stale once it has received nothing for this many minutes; 0 = no policy. At least 1
    # (Dagster's floor for a freshness window).
    freshness_minutes: float = 60.0
    # Dagster's sensors (the pipelines' new-segments sensor, each app's summary automation) are ticked at
    # most this often by the daemon under `eventide ui`; `run` and `serve` ask them when they need to.
    sensor_interval_seconds: int = 30
    # A registry given as an object (the testing helper) instead of loaded from `apps`.
    app_registry: object = field(default=None, compare=False, repr=False)

    def __init__(self, **values):
        """Defaults, then `EVENTIDE_*` from the environment, then `values`; ConfigError on a bad value."""
        merged = {**_read_env(os.environ), **values}
        names = {f.name for f in dataclasses.fields(self)}
        unknown = set(merged) - names
        if unknown:
            raise TypeError(f"Settings has no field(s) {sorted(unknown)}")
        for f in dataclasses.fields(self):
            if f.name in merged:
                value = merged[f.name]
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, f.name, value)
        self.validate()

    # -- derived paths -------------------------------------------------------------------------
    @property
    def landing(self) -> Path:
        return self.home / "landing"

    @property
    def landing_archive(self) -> Path:
        return self.home / "landing-archive"

    @property
    def lake(self) -> Path:
        return self.home / "lake"

    @property
    def checkpoints(self) -> Path:
        return self.home / "checkpoints"

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    def table_path(self, name: str) -> Path:
        return self.lake / name

    # -- the registered apps and what follows from them ------------------------------------------
    @property
    def registry(self):
        """The registered apps (transforms.registry.Registry), loaded once per process."""
        if self.app_registry is not None:
            return self.app_registry
        from transforms.registry import load_registry, parse_entries

        return load_registry(parse_entries(self.apps))

    def group_of(self, stream: str) -> str:
        """The landing log a stream lands in (shared by streams merged into one keyed state)."""
        return self.registry.stream(stream).log

    def port_of(self, stream: str) -> int:
        """The gateway port of a stream: EVENTIDE_PORTS, else the source's, else 0 (a free port)."""
        if stream in self.ports:
            return self.ports[stream]
        return self.registry.stream(stream).port or 0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Settings from `env` (default: the environment) alone."""
        if env is None:
            return cls()
        values = _read_env(env)
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: values.get(n, cls._default(n)) for n in names})

    @classmethod
    def _default(cls, name: str):
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default

    def validate(self) -> None:
        if self.header_length not in (1, 2, 4, 8):
            raise ConfigError(f"EVENTIDE_HEADER_LENGTH={self.header_length}: must be 1, 2, 4 or 8")
        import struct

        try:
            size = struct.calcsize(self.length_fmt)
        except struct.error:
            raise ConfigError(f"EVENTIDE_LENGTH_FMT={self.length_fmt!r}: not a struct format like '>I'") from None
        if size != self.header_length:
            raise ConfigError(
                f"EVENTIDE_LENGTH_FMT={self.length_fmt!r} is {size} bytes but EVENTIDE_HEADER_LENGTH is "
                f"{self.header_length}"
            )
        if self.max_bytes_per_trigger < 0 or self.max_files_per_trigger < 0 or self.max_messages_per_trigger < 0:
            raise ConfigError("EVENTIDE_MAX_BYTES_PER_TRIGGER, EVENTIDE_MAX_FILES_PER_TRIGGER and "
                              "EVENTIDE_MAX_MESSAGES_PER_TRIGGER must be 0 (no bound) or positive")
        if self.max_frame_bytes <= 0:
            raise ConfigError("EVENTIDE_MAX_FRAME_BYTES must be positive")
        if self.spark_shuffle_partitions <= 0:
            raise ConfigError("EVENTIDE_SPARK_SHUFFLE_PARTITIONS must be positive")
        if self.spark_task_attempts < 1:
            raise ConfigError(f"EVENTIDE_SPARK_TASK_ATTEMPTS={self.spark_task_attempts}: must be at least 1 "
                              "(1 = a failed task fails its job at once)")
        if self.freshness_minutes and not self.freshness_minutes >= 1:
            raise ConfigError(f"EVENTIDE_FRESHNESS_MINUTES={self.freshness_minutes}: must be 0 (no freshness policy) "
                              "or at least 1 (Dagster's shortest freshness window)")
        if self.sensor_interval_seconds < 1:
            raise ConfigError(f"EVENTIDE_SENSOR_INTERVAL_SECONDS={self.sensor_interval_seconds}: must be at least 1")
        if self.spark_remote:
            raise ConfigError(CONNECT_REFUSED.format(url=self.spark_remote))
        if self.archive_compact_files < 0 or self.archive_compact_files == 1:
            raise ConfigError(f"EVENTIDE_ARCHIVE_COMPACT_FILES={self.archive_compact_files}: must be 0 (never compact "
                              "the landing archive) or at least 2 (segments merged into one)")
        if self.vacuum_hours < 0 or self.upkeep_minutes < 0:
            raise ConfigError("EVENTIDE_VACUUM_HOURS and EVENTIDE_UPKEEP_MINUTES must be 0 or positive")
        if self.tcp_in_doubt not in ("resend", "skip"):
            raise ConfigError(f"EVENTIDE_TCP_IN_DOUBT={self.tcp_in_doubt!r}: must be 'resend' or 'skip'")
        log_kind(self.log)
        if self.state_layout not in ("bucket", "key"):
            raise ConfigError(f"EVENTIDE_STATE_LAYOUT={self.state_layout!r}: must be 'bucket' or 'key'")
        bad_keys = sorted(k for k in self.spark_conf if not k.startswith("spark."))
        if bad_keys:
            raise ConfigError(f"EVENTIDE_SPARK_CONF: {bad_keys} are not Spark options (they start with 'spark.'); "
                              "write it as key=value;key=value")
        bad_ports = {s: p for s, p in self.ports.items() if not 0 <= p < 65536}
        if bad_ports:
            raise ConfigError(f"EVENTIDE_PORTS: ports must be 0..65535 (0 = a free port), got {bad_ports}")
        try:
            dt.date.fromisoformat(self.partitions_start)
        except ValueError:
            raise ConfigError(
                f"EVENTIDE_PARTITIONS_START={self.partitions_start!r}: expected a date like 2004-03-01"
            ) from None


def _read_env(env) -> dict[str, object]:
    """`EVENTIDE_<FIELD>` values from `env`, parsed; ConfigError names a bad variable."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(Settings):
        var = f"EVENTIDE_{f.name.upper()}"
        if f.name in _NOT_FROM_ENV or var not in env:
            continue
        raw = env[var]
        try:
            values[f.name] = _parse(f.name, raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{var}={raw!r}: {e}") from None
    return values


def _parse(name: str, raw: str) -> object:
    spec = {f.name: f for f in dataclasses.fields(Settings)}[name]
    kind = spec.type
    if kind == "Path":
        return Path(raw).expanduser()
    if kind == "bool":
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ValueError("expected true or false")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind.startswith("dict"):
        # `name=value,name=value`, e.g. EVENTIDE_PORTS="logs=7101,text=7104"; a field may name another separator
        separator = spec.metadata.get("separator", ",")
        out: dict[str, object] = {}
        for item in filter(None, (p.strip() for p in raw.split(separator))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"expected name=value pairs separated by {separator!r}, got {item!r}")
            out[key.strip()] = int(value) if kind == "dict[str, int]" else value.strip()
        return out
    return raw


_cached: Settings | None = None


def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    global _cached
    if _cached is None:
        _cached = Settings.from_env()
    return _cached


def reset_settings() -> None:
    global _cached
    _cached = None


# -- EVENTIDE_LOG: the landing folder or Kafka (transforms/ingestion/log.py) -----------------------------
KAFKA_SCHEME = "kafka://"


def log_kind(value: str) -> str:
    """`landing` or `kafka`, from EVENTIDE_LOG; ConfigError for anything else."""
    if value in ("", "landing"):
        return "landing"
    if value.startswith(KAFKA_SCHEME):
        kafka_servers(value)
        return "kafka"
    raise ConfigError(f"EVENTIDE_LOG={value!r}: expected `landing` (the default) or kafka://HOST:PORT")


def kafka_servers(value: str) -> str:
    """`HOST:PORT[,HOST:PORT...]` of a `kafka://` EVENTIDE_LOG."""
    servers = value[len(KAFKA_SCHEME):].partition("/")[0]
    parts = [s.strip() for s in servers.split(",")]
    for part in parts:
        host, sep, port = part.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"EVENTIDE_LOG={value!r}: expected kafka://HOST:PORT, e.g. kafka://127.0.0.1:9092")
    return ",".join(parts)


def kafka_prefix(value: str) -> str:
    """What a `kafka://HOST:PORT/PREFIX` EVENTIDE_LOG puts before every topic name ('' without one): for
    several homes on one Kafka cluster."""
    return value[len(KAFKA_SCHEME):].partition("/")[2]
