"""The landed streams: each one's decoder and bronze table.

A stream's decoder is declared once, here; the bronze query and every application reading the
stream use it (an application may pass its own decoder to `source()`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from transforms.api import Application, Decoder, DeltaSink, source
from transforms.apps.logs_decoder import decode_log_line
from transforms.apps.market_decoder import decode_market_data, decode_order
from transforms.apps.words import decode_text


@dataclass(frozen=True)
class Stream:
    name: str
    decoder: Decoder
    bronze_table: str


STREAMS: dict[str, Stream] = {
    s.name: s
    for s in (
        Stream("logs", decode_log_line, "bronze_log_lines"),
        Stream("market_data", decode_market_data, "bronze_market_data"),
        Stream("orders", decode_order, "bronze_orders"),
        Stream("text", decode_text, "bronze_text"),
    )
}

# Columns every bronze row keeps from landing, ahead of the decoded fields.
BRONZE_METADATA = ("stream", "seq", "receive_time", "connection")
_METADATA_FIELDS = [
    pa.field("stream", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("receive_time", pa.timestamp("us", tz="UTC")),
    pa.field("connection", pa.string()),
]


def stream_decoder(stream: str) -> Decoder:
    try:
        return STREAMS[stream].decoder
    except KeyError:
        raise ValueError(f"unknown stream {stream!r}; known: {', '.join(STREAMS)}") from None


def bronze_schema(stream: str) -> pa.Schema:
    return pa.schema(_METADATA_FIELDS + list(STREAMS[stream].decoder.schema))


def bronze_application(stream: str) -> Application:
    """Decode a landed stream into its bronze table; undecodable input goes to quarantine."""
    s = STREAMS[stream]
    return Application(
        f"bronze_{stream}",
        source(stream).to_sink(DeltaSink(s.bronze_table, schema=bronze_schema(stream), metadata=BRONZE_METADATA)),
        quarantine_landing_errors=True,
        description=f"`{stream}` decoded by {s.decoder.name}",
    )
