"""Eventide's engine and application API. Pure Python + Spark + Delta Lake (delta-spark); never imports Dagster."""
