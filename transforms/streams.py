"""Bronze: each registered stream decoded into its Delta table, by the stream's own decoder.

The streams themselves come from the registered apps (transforms.registry); this module only makes
the bronze application of one (undecodable input goes to quarantine).
"""

from __future__ import annotations

import pyarrow as pa

from transforms.api import Application, DeltaSink, source
from transforms.registry import StreamSpec

# Columns every bronze row keeps from landing, ahead of the decoded fields.
BRONZE_METADATA = ("stream", "seq", "receive_time", "connection")
_METADATA_FIELDS = [
    pa.field("stream", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("receive_time", pa.timestamp("us", tz="UTC")),
    pa.field("connection", pa.string()),
]


def bronze_schema(spec: StreamSpec) -> pa.Schema | None:
    """Landing metadata, then the decoder's columns; None (inferred from the messages) if it declares none."""
    if spec.decoder.schema is None:
        return None
    return pa.schema(_METADATA_FIELDS + list(spec.decoder.schema))


def bronze_stats_columns(spec: StreamSpec) -> list[str] | None:
    """The bronze columns Delta keeps file statistics for: the landing metadata and the decoded fields
    that are not text. Statistics on text (paths, hosts, payload fields) were half the cost of writing
    bronze and skip nothing a day, a time, a number or a sequence range does not (1M log lines: the
    Delta write 5.4-6.1 s with every column's statistics, 2.3-2.9 s with these)."""
    if spec.decoder.schema is None:
        return None
    text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    return ["stream", "seq", "receive_time",
            *(f.name for f in spec.decoder.schema if not any(is_text(f.type) for is_text in text))]


def bronze_application(spec: StreamSpec | str) -> Application:
    """Decode a landed stream into its bronze table; undecodable input goes to quarantine.
    A stream name is looked up among the apps registered in the environment's settings."""
    if isinstance(spec, str):
        from transforms.settings import Settings

        spec = Settings().registry.stream(spec)
    return Application(
        f"bronze_{spec.name}",
        source(spec.name, spec.decoder).to_sink(
            DeltaSink(spec.bronze_table, schema=bronze_schema(spec), metadata=BRONZE_METADATA,
                      stats_columns=bronze_stats_columns(spec))
        ),
        quarantine_landing_errors=True,
        description=f"`{spec.name}` decoded by {spec.decoder.name}",
    )


def service_applications(settings) -> tuple[list[Application], list[Application]]:
    """What a home runs: each registered stream's bronze application, and the registered apps."""
    registry = settings.registry
    return [bronze_application(s) for s in registry.streams.values()], list(registry.apps)
