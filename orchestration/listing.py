"""`eventide apps`: what each registered app reads and writes, as a table for people or JSON lines."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from transforms.api import DeltaSink, KafkaSink, TCPSink
from transforms.settings import Settings


def describe_apps(settings: Settings, environ: Mapping[str, str] = os.environ) -> list[dict]:
    """One dict per registered app: name, entry, description, streams, tables, tcp_sinks, kafka_sinks. A
    stream read from a Kafka topic (kafka_source) has `kafka` (topic, bootstrap, starting_offsets) and no
    port, bronze table or log."""
    registry = settings.registry
    out = []
    for r in registry.registered:
        app = r.app
        streams = []
        for name in app.streams():
            topic = registry.kafka_sources.get(name)
            if topic is not None:
                decoder = next(s.decoder for s in app.sources() if s.stream == name)
                streams.append({"name": name, "port": None, "decoder": decoder.name, "bronze_table": None, "log": None,
                                "kafka": {"topic": topic.topic, "bootstrap": topic.bootstrap,
                                          "starting_offsets": topic.starting_offsets}})
                continue
            spec = registry.stream(name)
            streams.append({"name": name, "port": settings.port_of(name), "decoder": spec.decoder.name,
                            "bronze_table": spec.bronze_table, "log": spec.log})
        tables = {}
        for sink in app.sinks():
            if isinstance(sink, DeltaSink):
                tables.setdefault(sink.table, {"name": sink.table, "mode": sink.mode, "keys": list(sink.keys),
                                               "checks": [c.name for c in sink.checks]})
        tcp = {}
        for sink in app.sinks():
            if isinstance(sink, TCPSink) and sink.name not in tcp:
                tcp[sink.name] = _tcp_sink(sink, environ)
        kafka = {s.name: _kafka_sink(s, environ) for s in app.sinks() if isinstance(s, KafkaSink)}
        out.append({"name": app.name, "entry": r.entry, "description": app.description, "streams": streams,
                    "tables": list(tables.values()), "tcp_sinks": list(tcp.values()),
                    "kafka_sinks": list(kafka.values())})
    return out


def _tcp_sink(sink: TCPSink, environ: Mapping[str, str]) -> dict:
    """Where a TCP sink sends, resolved in the engine's order (variable `off`, `address=`, the variable)."""
    var = f"EVENTIDE_SINK_{sink.name.upper()}"
    env = environ.get(var, "").strip()
    if env.lower() == "off":
        address, target = None, f"off ({var}=off)"
    elif sink.address:
        address, target = sink.address, sink.address
    elif env:
        address, target = env, f"{env} ({var})"
    elif sink.optional:
        address, target = None, f"{var} (optional, off)"
    else:
        address, target = None, f"{var} (required, not set: `eventide run` stops)"
    return {"name": sink.name, "address": address, "variable": var, "optional": sink.optional,
            "framed": sink.framed, "target": target}


def _kafka_sink(sink: KafkaSink, environ: Mapping[str, str]) -> dict:
    """Where a Kafka sink produces, in the engine's order (variable `off`, the variable, its own topic)."""
    var = f"EVENTIDE_SINK_{sink.name.upper()}"
    env = environ.get(var, "").strip()
    own = f"kafka://{sink.bootstrap}/{sink.topic}" if sink.bootstrap and sink.topic else None
    if env.lower() == "off":
        address, target = None, f"off ({var}=off)"
    elif env:
        address, target = env, f"{env} ({var})"
    elif own:
        address, target = own, own
    elif sink.optional:
        address, target = None, f"{var} (optional, off)"
    else:
        address, target = None, f"{var} (required, not set: `eventide run` stops)"
    return {"name": sink.name, "address": address, "variable": var, "optional": sink.optional, "target": target}


def format_apps(apps: list[dict], fmt: str = "table") -> str:
    if fmt == "json":
        return "".join(json.dumps(a) + "\n" for a in apps)
    if not apps:
        return "no apps registered (set EVENTIDE_APPS=module:attribute or pass --app)\n"
    lines = []
    for a in apps:
        lines.append(f"{a['name']}  ({a['entry']})" + (f"  {a['description']}" if a["description"] else ""))
        rows = [("streams", f"{s['name']}  Kafka topic {s['kafka']['topic']} at {s['kafka']['bootstrap']}  decoder "
                            f"{s['decoder']}" if s.get("kafka") else
                 f"{s['name']}  port {s['port'] or 'free'}  decoder {s['decoder']}") for s in a["streams"]]
        rows += [("tables", f"{t['name']}  ({t['mode']}{' by ' + ', '.join(t['keys']) if t['keys'] else ''})")
                 for t in a["tables"]]
        rows += [("tcp sinks", f"{t['name']} -> {t['target']}") for t in a["tcp_sinks"]]
        rows += [("kafka sinks", f"{t['name']} -> {t['target']}") for t in a.get("kafka_sinks", ())]
        last = None
        for label, text in rows:
            lines.append(f"  {label + ':' if label != last else '':<11} {text}")
            last = label
        lines.append("")
    return "\n".join(lines)
