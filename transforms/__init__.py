"""Eventide's engine and application API. Pure Python + Spark + delta-rs; never imports Dagster."""
