"""The registry: which applications run, and everything that follows from them.

Applications are named by `module:attribute` entries: the setting `EVENTIDE_APPS` (comma-separated)
or `--app` on the command line. The bundled apps (`examples/`) are the default list and load the
same way; the framework never imports them by name.

From the registered apps the registry derives the streams (name, decoder, bronze table, gateway
port) and their landing logs: streams whose pipelines are merged into one keyed state land in one
ordered log (a shared sequence), so a query sees both in arrival order. Conflicts stop at load
with a message naming the app and its module.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transforms.api import Application, Decoder, DeltaSink, KafkaTopic, Merged
from transforms.errors import ConfigError

DEFAULT_APPS = ("examples.logs:app", "examples.market:app", "examples.words:app")
RESERVED_TABLES = ("quarantine",)


class AppLoadError(ConfigError):
    """An application cannot be loaded or conflicts with another; the message names app and module."""


@dataclass(frozen=True)
class StreamSpec:
    """A landed stream, as the registered apps declare it."""

    name: str
    decoder: Decoder
    bronze_table: str
    log: str  # the landing log (folder) it shares with the streams merged with it
    port: int | None  # declared by a source; EVENTIDE_PORTS overrides; None: a free port
    apps: tuple[str, ...]


@dataclass(frozen=True)
class RegisteredApp:
    entry: str  # module:attribute
    app: Application

    @property
    def module(self) -> str:
        return self.entry.partition(":")[0]


def parse_entries(text: str | Iterable[str]) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(dict.fromkeys(i.strip() for i in items if i and i.strip()))


def load_app(entry: str) -> Application:
    """Import `module:attribute` and return the Application it names."""
    module_name, sep, attr = entry.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"app entry {entry!r}: expected module:attribute, e.g. myapp:app")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))  # like `python -m`: an app in the current folder is found
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise AppLoadError(
                f"app {entry!r}: no module {module_name!r} on the Python path (cwd {Path.cwd()}). Run from the "
                "folder that holds it, or add that folder to PYTHONPATH."
            ) from None
        raise AppLoadError(f"app {entry!r}: importing module {module_name!r} failed: {e}") from e
    except Exception as e:
        raise AppLoadError(f"app {entry!r}: importing module {module_name!r} failed: {type(e).__name__}: {e}") from e
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise AppLoadError(f"app {entry!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Application):
        raise AppLoadError(f"app {entry!r}: {module_name}.{attr} is a {type(obj).__name__}, expected an Application")
    return obj


class Registry:
    """The registered apps and the streams, landing logs and tables derived from them."""

    def __init__(self, apps: Sequence[RegisteredApp]):
        self.registered = tuple(apps)
        self.streams: dict[str, StreamSpec] = {}
        self.kafka_sources: dict[str, KafkaTopic] = {}  # a kafka_source's stream -> the topic it reads
        self._derive()
        self._derive_kafka_sources()

    # -- derivation -----------------------------------------------------------------------------
    def _derive(self) -> None:
        names: dict[str, str] = {}
        for r in self.registered:
            if r.app.name in names:
                raise AppLoadError(f"app {r.app.name!r} is registered twice ({names[r.app.name]} and {r.entry}); "
                                   "app names must be unique")
            names[r.app.name] = r.entry

        decoders: dict[str, tuple[Decoder, str]] = {}
        ports: dict[str, tuple[int, str]] = {}
        bronze: dict[str, tuple[str, str]] = {}
        readers: dict[str, list[str]] = {}
        parent: dict[str, str] = {}  # union-find over streams merged into one keyed state

        def find(s: str) -> str:
            while parent[s] != s:
                parent[s] = parent[parent[s]]
                s = parent[s]
            return s

        for r in self.registered:
            where = f"app {r.app.name!r} (module {r.module})"
            for src in r.app.landed():  # a kafka_source reads its own topic: not a landed stream
                s = src.stream
                parent.setdefault(s, s)
                readers.setdefault(s, [])
                if r.app.name not in readers[s]:
                    readers[s].append(r.app.name)
                if src.decoder is not None:
                    seen = decoders.get(s)
                    if seen and not _same_decoder(seen[0], src.decoder):
                        raise AppLoadError(
                            f"stream {s!r} is declared with two decoders: {seen[0].name} by {seen[1]} and "
                            f"{src.decoder.name} by {where}. One stream has one decoder; read the stream with the "
                            "same decoder (or omit it in the second app), or declare a new stream."
                        )
                    decoders.setdefault(s, (src.decoder, where))
                for attr, store in (("port", ports), ("bronze_table", bronze)):
                    value = getattr(src, attr)
                    if value is None:
                        continue
                    seen = store.get(s)
                    if seen and seen[0] != value:
                        raise AppLoadError(f"stream {s!r}: {attr} {seen[0]!r} ({seen[1]}) differs from {value!r} ({where})")
                    store.setdefault(s, (value, where))
            for p in r.app.pipelines:
                landed = [b for b in p.branches if b.origin is None] if isinstance(p, Merged) else []
                if landed:
                    first = find(landed[0].stream)
                    for b in landed[1:]:
                        parent[find(b.stream)] = first

        for s in parent:
            if s not in decoders:
                raise AppLoadError(
                    f"stream {s!r} (read by {', '.join(readers[s])}) has no decoder: declare it in one app with "
                    f"source({s!r}, decoder=my_decoder)"
                )
        members: dict[str, list[str]] = {}
        for s in parent:
            members.setdefault(find(s), []).append(s)
        log_of = {s: (ms[0] if len(ms) == 1 else "+".join(sorted(ms))) for ms in members.values() for s in ms}

        taken_ports: dict[int, str] = {}
        for s, (port, _where) in ports.items():
            if port and port in taken_ports:
                raise AppLoadError(f"streams {taken_ports[port]!r} and {s!r} both declare port {port}")
            taken_ports[port] = s
        for s in parent:
            self.streams[s] = StreamSpec(
                name=s,
                decoder=decoders[s][0],
                bronze_table=bronze.get(s, (f"bronze_{s}",))[0],
                log=log_of[s],
                port=ports.get(s, (None,))[0],
                apps=tuple(readers[s]),
            )
        self._check_tables()

    def _derive_kafka_sources(self) -> None:
        """The streams read straight from a Kafka topic (kafka_source): not landed, so not in `streams`. A
        name is one stream: landed or read from one topic, not both."""
        where: dict[str, str] = {}
        for r in self.registered:
            for src in r.app.sources():
                if src.origin is None:
                    continue
                at = f"app {r.app.name!r} (module {r.module})"
                if src.stream in self.streams:
                    raise AppLoadError(
                        f"stream {src.stream!r} is read from Kafka topic {src.origin.topic!r} by {at} and landed by "
                        f"{', '.join(self.streams[src.stream].apps)} (source(...)): one name is one stream; rename "
                        "the kafka_source's stream"
                    )
                seen = self.kafka_sources.get(src.stream)
                if seen is not None and seen != src.origin:
                    raise AppLoadError(
                        f"stream {src.stream!r} reads {seen.topic!r} at {seen.bootstrap} ({where[src.stream]}) and "
                        f"{src.origin.topic!r} at {src.origin.bootstrap} ({at}): one name is one stream; rename one"
                    )
                self.kafka_sources.setdefault(src.stream, src.origin)
                where.setdefault(src.stream, at)

    def _check_tables(self) -> None:
        writers: dict[str, str] = {t: "Eventide itself" for t in RESERVED_TABLES}
        for spec in self.streams.values():
            if spec.bronze_table in writers:
                raise AppLoadError(f"bronze table {spec.bronze_table!r} of stream {spec.name!r} is also written by "
                                   f"{writers[spec.bronze_table]}")
            writers[spec.bronze_table] = f"the bronze query of stream {spec.name!r}"
        for r in self.registered:
            tables = {s.table for s in r.app.sinks() if isinstance(s, DeltaSink)}
            for t in sorted(tables):
                if t in writers:
                    raise AppLoadError(
                        f"table {t!r} is written by app {r.app.name!r} (module {r.module}) and by {writers[t]}; "
                        "a table has one writer: rename one of the sinks"
                    )
                writers[t] = f"app {r.app.name!r} (module {r.module})"

    # -- queries ----------------------------------------------------------------------------------
    @property
    def apps(self) -> list[Application]:
        return [r.app for r in self.registered]

    @property
    def entries(self) -> tuple[str, ...]:
        return tuple(r.entry for r in self.registered)

    def app(self, name: str) -> Application:
        for r in self.registered:
            if r.app.name == name:
                return r.app
        raise ConfigError(f"no registered app {name!r}; registered: {', '.join(a.name for a in self.apps) or 'none'}")

    def stream(self, name: str) -> StreamSpec:
        try:
            return self.streams[name]
        except KeyError:
            if name in self.kafka_sources:
                topic = self.kafka_sources[name]
                raise ConfigError(
                    f"stream {name!r} is read from Kafka topic {topic.topic!r} at {topic.bootstrap} (kafka_source): "
                    "it is not landed (no gateway port, no landing log, no bronze table); produce its records to "
                    "that topic instead"
                ) from None
            known = ", ".join(sorted(self.streams)) or "none"
            raise ConfigError(
                f"unknown stream {name!r}; the registered apps ({', '.join(self.entries) or 'none'}) declare: {known}. "
                "A stream exists once an app reads it: source(name, decoder=...); register the app with "
                "EVENTIDE_APPS=module:attribute or --app."
            ) from None

    @property
    def logs(self) -> dict[str, list[str]]:
        """Landing log -> its streams."""
        out: dict[str, list[str]] = {}
        for s in self.streams.values():
            out.setdefault(s.log, []).append(s.name)
        return out


def _same_decoder(a: Decoder, b: Decoder) -> bool:
    return a is b or (a.fn is b.fn and a.schema == b.schema)


@functools.lru_cache(maxsize=16)
def load_registry(entries: tuple[str, ...]) -> Registry:
    """The registry of these entries, loaded once per process."""
    registered = [RegisteredApp(e, load_app(e)) for e in entries]
    return Registry(registered)


def registry_of(apps: Sequence[Application]) -> Registry:
    """A registry of app objects (the testing helper, tests), not loaded from entries."""
    return Registry([RegisteredApp(f"<object>:{a.name}", a) for a in apps])
