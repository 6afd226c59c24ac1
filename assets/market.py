"""Market spread's tables as assets (filled in by the market-spread work)."""

import dagster as dg

defs = dg.Definitions()
