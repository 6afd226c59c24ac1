"""Word count's tables as assets."""

import dagster as dg

from assets.apps import application_assets
from assets.ingest import landing_key
from transforms.apps.words import word_count

word_count_assets = application_assets(word_count, [landing_key("text"), "bronze_text"], "words")

defs = dg.Definitions(assets=[word_count_assets])
