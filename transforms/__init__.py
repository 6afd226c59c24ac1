"""Eventide's engine and application API. Pure Python + Spark + Delta Lake (delta-spark writes; delta-rs
for JVM-free reads); never imports Dagster."""
