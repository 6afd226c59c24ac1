"""The one settings object. Every field can be set by an environment variable `EVENTIDE_<FIELD>`.

Embedded defaults need no configuration: everything lives under `EVENTIDE_HOME` (default
`./.eventide`), Spark runs as `local[*]`, the gateway listens on loopback.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A setting has a value Eventide cannot use. The message names the variable and what is expected."""


# Streams that share keyed state share one sequence group: one landing folder, one ordered log.
DEFAULT_STREAM_GROUPS = {"logs": "logs", "market_data": "market", "orders": "market", "text": "text"}
DEFAULT_PORTS = {"logs": 7101, "market_data": 7102, "orders": 7103, "text": 7104}


@dataclass(frozen=True)
class Settings:
    home: Path = Path(".eventide")
    # Spark: `local[*]` embedded, a `spark://host:port` master, or a Spark Connect URL (`sc://host:15002`).
    spark_master: str = "local[*]"
    spark_remote: str = ""
    spark_shuffle_partitions: int = 2
    spark_ui: bool = False
    spark_driver_memory: str = "4g"  # each micro-batch's outputs are collected on the driver
    # Gateway
    bind_host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    stream_groups: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_STREAM_GROUPS))
    header_length: int = 4
    length_fmt: str = ">I"
    max_frame_bytes: int = 1 << 20
    segment_max_bytes: int = 8 << 20
    segment_max_seconds: float = 0.5
    # Pipelines
    marker: str = "END_OF_DAY"
    fail_fast: bool = False
    # Closed segments per micro-batch (each at most segment_max_bytes): bounds the driver's memory on a
    # large backlog (4M log lines in one batch exhausted a 1 GB driver). 0 = everything in one batch.
    max_files_per_trigger: int = 8
    # Daily summaries
    partitions_start: str = "2004-03-01"
    day_grace_hours: float = 6.0

    # -- derived paths -------------------------------------------------------------------------
    @property
    def landing(self) -> Path:
        return self.home / "landing"

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

    def group_of(self, stream: str) -> str:
        try:
            return self.stream_groups[stream]
        except KeyError:
            known = ", ".join(sorted(self.stream_groups))
            raise ConfigError(f"unknown stream {stream!r}; known streams: {known}") from None

    def streams_in(self, group: str) -> list[str]:
        return [s for s, g in self.stream_groups.items() if g == group]

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Read `EVENTIDE_*` variables; a bad value raises ConfigError naming the variable."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            var = f"EVENTIDE_{f.name.upper()}"
            if var not in env:
                continue
            raw = env[var]
            try:
                values[f.name] = _parse(f.name, raw)
            except (ValueError, TypeError) as e:
                raise ConfigError(f"{var}={raw!r}: {e}") from None
        settings = cls(**values)
        settings.validate()
        return settings

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
        if self.max_frame_bytes <= 0:
            raise ConfigError("EVENTIDE_MAX_FRAME_BYTES must be positive")
        if self.spark_shuffle_partitions <= 0:
            raise ConfigError("EVENTIDE_SPARK_SHUFFLE_PARTITIONS must be positive")
        missing = set(self.ports) - set(self.stream_groups)
        if missing:
            raise ConfigError(f"EVENTIDE_PORTS names streams without a group: {sorted(missing)}")
        try:
            dt.date.fromisoformat(self.partitions_start)
        except ValueError:
            raise ConfigError(
                f"EVENTIDE_PARTITIONS_START={self.partitions_start!r}: expected a date like 2004-03-01"
            ) from None


def _parse(name: str, raw: str) -> object:
    kind = {f.name: f.type for f in dataclasses.fields(Settings)}[name]
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
        # `name=value,name=value`, e.g. EVENTIDE_PORTS="logs=7101,text=7104"
        out: dict[str, object] = {}
        for item in filter(None, (p.strip() for p in raw.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"expected name=value pairs separated by commas, got {item!r}")
            out[key.strip()] = int(value) if kind == "dict[str, int]" else value.strip()
        defaults = DEFAULT_PORTS if kind == "dict[str, int]" else DEFAULT_STREAM_GROUPS
        return {**defaults, **out}
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
