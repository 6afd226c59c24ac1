"""Dagster resources, used by the assets and the orchestration. Both read the `EVENTIDE_*` environment;
fields set in code override it."""


import dataclasses
from pathlib import Path

import dagster as dg

from transforms.settings import Settings
from transforms.spark import get_spark


class EventideSettings(dg.ConfigurableResource):
    """Eventide's settings (see transforms/settings.py). Embedded defaults need no configuration."""

    home: str | None = None

    def get(self) -> Settings:
        settings = Settings.from_env()
        if self.home:
            settings = dataclasses.replace(settings, home=Path(self.home))
        return settings


class SparkResource(dg.ConfigurableResource):
    """The Spark session: `local[*]` by default, or EVENTIDE_SPARK_MASTER (Spark Connect is refused: see
    transforms.settings.CONNECT_REFUSED)."""

    master: str | None = None

    def session(self, settings: Settings):
        if self.master:
            settings = dataclasses.replace(settings, spark_master=self.master)
        return get_spark(settings)
