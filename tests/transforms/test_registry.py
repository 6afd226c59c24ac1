"""The app registry: loading `module:attribute` entries, deriving streams, and the errors at start."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from transforms.api import Application, DeltaSink, decoder, merge, source
from transforms.registry import DEFAULT_APPS, AppLoadError, load_app, load_registry, registry_of
from transforms.settings import DEFAULT_APPS as SETTINGS_DEFAULT_APPS
from transforms.settings import ConfigError, Settings

REPO = Path(__file__).resolve().parents[2]


@decoder(schema=pa.schema([("text", pa.string())]))
def decode_a(payload: bytes):
    return {"text": payload.decode()}


@decoder(schema=pa.schema([("text", pa.string())]))
def decode_b(payload: bytes):
    return {"text": payload.decode().upper()}


def _app(name, *pipelines):
    return Application(name, *pipelines)


def test_default_apps_are_the_examples_loaded_like_any_app():
    assert SETTINGS_DEFAULT_APPS.split(",") == list(DEFAULT_APPS)
    reg = load_registry(DEFAULT_APPS)
    assert [a.name for a in reg.apps] == ["logs", "market_spread", "word_count"]
    assert {s: (spec.log, spec.bronze_table, spec.port) for s, spec in reg.streams.items()} == {
        "logs": ("logs", "bronze_log_lines", 7101),
        "market_data": ("market_data+orders", "bronze_market_data", 7102),
        "orders": ("market_data+orders", "bronze_orders", 7103),
        "text": ("text", "bronze_text", 7104),
    }
    assert reg.logs == {"logs": ["logs"], "market_data+orders": ["market_data", "orders"], "text": ["text"]}


def test_a_new_stream_is_declared_by_its_source():
    app = _app("temps", source("temps", decoder=decode_a, port=7201).to_sink(DeltaSink("temps_out")))
    reg = registry_of([app])
    spec = reg.stream("temps")
    assert (spec.decoder, spec.bronze_table, spec.log, spec.port, spec.apps) == (
        decode_a, "bronze_temps", "temps", 7201, ("temps",))
    settings = Settings(app_registry=reg)
    assert settings.group_of("temps") == "temps" and settings.port_of("temps") == 7201
    assert Settings(app_registry=reg, ports={"temps": 7300}).port_of("temps") == 7300


def test_two_apps_share_a_stream_and_its_landing():
    a = _app("a", source("shared", decoder=decode_a).to_sink(DeltaSink("a_out")))
    b = _app("b", source("shared").to_sink(DeltaSink("b_out")))  # no decoder: the one `a` declares
    reg = registry_of([a, b])
    assert reg.stream("shared").decoder is decode_a and reg.stream("shared").apps == ("a", "b")


def test_merged_pipelines_share_a_landing_log_without_the_user_saying_so():
    app = _app("m", merge(source("x", decoder=decode_a).key_by("text"), source("y", decoder=decode_a).key_by("text"))
               .to_sink(DeltaSink("m_out")))
    reg = registry_of([app])
    assert reg.stream("x").log == reg.stream("y").log == "x+y"


@pytest.mark.parametrize(
    "apps, message",
    [
        ([_app("a", source("s", decoder=decode_a).to_sink(DeltaSink("t1"))),
          _app("b", source("s", decoder=decode_b).to_sink(DeltaSink("t2")))],
         "stream 's' is declared with two decoders: decode_a by app 'a'"),
        ([_app("a", source("s", decoder=decode_a).to_sink(DeltaSink("t"))),
          _app("b", source("s").to_sink(DeltaSink("t")))],
         "table 't' is written by app 'b'"),
        ([_app("a", source("s").to_sink(DeltaSink("t")))], "stream 's' (read by a) has no decoder"),
        ([_app("a", source("s", decoder=decode_a).to_sink(DeltaSink("bronze_s")))], "table 'bronze_s'"),
        ([_app("a", source("s", decoder=decode_a).to_sink(DeltaSink("t"))),
          _app("a", source("s").to_sink(DeltaSink("u")))], "app 'a' is registered twice"),
        ([_app("a", source("s", decoder=decode_a, port=7300).to_sink(DeltaSink("t"))),
          _app("b", source("r", decoder=decode_a, port=7300).to_sink(DeltaSink("u")))], "both declare port 7300"),
    ],
)
def test_conflicts_stop_at_load_with_the_app_named(apps, message):
    with pytest.raises(AppLoadError) as e:
        registry_of(apps)
    assert message in str(e.value)


def test_load_errors_name_the_entry_and_the_module(tmp_path, monkeypatch):
    (tmp_path / "broken_app.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "not_an_app.py").write_text("app = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "nocolon": "expected module:attribute",
        "no_such_module_abc:app": "no module 'no_such_module_abc'",
        "broken_app:app": "importing module 'broken_app' failed",
        "not_an_app:app": "is a int, expected an Application",
        "not_an_app:missing": "has no attribute 'missing'",
    }
    for entry, message in cases.items():
        with pytest.raises(AppLoadError) as e:
            load_app(entry)
        assert message in str(e.value) and entry in str(e.value)
    sys.modules.pop("not_an_app", None)


def test_unknown_stream_says_how_to_declare_one():
    with pytest.raises(ConfigError) as e:
        Settings().registry.stream("temps")
    assert "unknown stream 'temps'" in str(e.value) and "source(name, decoder=...)" in str(e.value)


def test_settings_read_the_environment_and_arguments_win(tmp_path, monkeypatch):
    # Settings() used to ignore EVENTIDE_HOME (only Settings.from_env() read it).
    monkeypatch.setenv("EVENTIDE_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("EVENTIDE_MARKER", "EOD")
    assert Settings().home == tmp_path / "h" and Settings().marker == "EOD"
    assert Settings(home=tmp_path / "other").home == tmp_path / "other"
    monkeypatch.setenv("EVENTIDE_MAX_FRAME_BYTES", "lots")
    with pytest.raises(ConfigError, match="EVENTIDE_MAX_FRAME_BYTES"):
        Settings()


def test_registered_app_from_a_folder_outside_the_repo(tmp_path, monkeypatch):
    (tmp_path / "temps_app.py").write_text(textwrap.dedent('''
        import pyarrow as pa
        from transforms.api import Application, DeltaSink, decoder, source

        @decoder(schema=pa.schema([("celsius", pa.float64())]))
        def decode_temp(payload):
            return {"celsius": float(payload)}

        app = Application("temps", source("temps", decoder=decode_temp).to_sink(DeltaSink("temps_out")))
    '''))
    monkeypatch.chdir(tmp_path)  # an app in the current folder is found, like `python -m`
    monkeypatch.setenv("EVENTIDE_APPS", "temps_app:app,examples.words:app")
    settings = Settings()
    assert [a.name for a in settings.registry.apps] == ["temps", "word_count"]
    assert settings.group_of("temps") == "temps"
    sys.modules.pop("temps_app", None)


FRAMEWORK = ("transforms", "windows", "assets", "orchestration")
# Commands about the bundled sample data by definition: the demo and the sample generators.
ALLOWED = {"orchestration/demo.py", "orchestration/cli.py"}


def test_nothing_in_the_framework_imports_a_bundled_app():
    offenders = []
    for package in FRAMEWORK:
        for path in (REPO / package).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel in ALLOWED:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{rel}: {n}" for n in names if n == "examples" or n.startswith("examples.")]
    assert offenders == []


def test_a_pipeline_eventide_cannot_run_fails_when_the_app_is_built(tmp_path, monkeypatch):
    # Before: accepted, then every message went to quarantine at run time and the run exited 0.
    (tmp_path / "two_states.py").write_text(textwrap.dedent('''
        import pyarrow as pa
        from transforms.api import Application, DeltaSink, computation, decoder, source, state_computation

        class Count:
            n = 0

        @decoder(schema=pa.schema([("text", pa.string())]))
        def decode(payload):
            return {"text": payload.decode()}

        @state_computation("first", state=Count)
        def first(msg, state):
            return msg

        @computation("second")
        def second(msg):
            return msg

        app = Application("two", source("two", decoder=decode).key_by("text").to(second).to(first)
                          .to_sink(DeltaSink("two_out")))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppLoadError) as e:
        load_app("two_states:app")
    assert "two_states:app" in str(e.value) and "state computation 'first' comes after step 'second'" in str(e.value)


def test_bundled_apps_use_only_the_public_api():
    # The log app used to reach into the engine (`current_context()`) for its key.
    offenders = []
    for path in (REPO / "examples").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transforms.engine"):
                offenders.append(f"{path.name}: {node.module}")
    assert offenders == []
