"""The eventide CLI: show formats, clear errors, generators. Runs the real console script."""

import ast
import base64
import io
import json
import os
import subprocess
import sys
from csv import DictReader
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import REPO
from transforms import lake

EVENTIDE = os.path.join(os.path.dirname(sys.executable), "eventide")


def _run(settings, *args, env=None):
    env = {**os.environ, "EVENTIDE_HOME": str(settings.home), **(env or {})}
    return subprocess.run([EVENTIDE, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_show_prints_a_table_as_table_csv_and_json_lines(spark, settings):
    lake.append_once(spark.createDataFrame(pa.table({"day": ["2004-03-07", "2004-03-08"], "status": [200, 404],
                                                     "payload": [b"a\xff", b"b"]})), settings.table_path("t"), "x", 0)
    table = _run(settings, "show", "t")
    assert table.returncode == 0 and "2004-03-07" in table.stdout and "404" in table.stdout
    csv = _run(settings, "show", "t", "--format", "csv").stdout.splitlines()
    assert csv[0] == "day,status,payload_base64" and len(csv) == 3
    rows = [json.loads(line) for line in _run(settings, "show", "t", "--format", "json").stdout.splitlines()]
    assert rows == [{"day": "2004-03-07", "status": 200, "payload_base64": "Yf8="},
                    {"day": "2004-03-08", "status": 404, "payload_base64": "Yg=="}]
    where = _run(settings, "show", "t", "--format", "json", "--where", "status = 404").stdout
    assert len(where.splitlines()) == 1


def test_show_prints_payloads_exactly_one_byte_0xff_is_not_the_four_characters_backslash_x_f_f(spark, settings):
    payloads = [b"\xff", b"\\xff", b"line\r\n", None]
    lake.append_once(spark.createDataFrame(pa.table({
        "seq": [1, 2, 3, 4], "reason": ["r"] * 4, "payload": pa.array(payloads, pa.binary())})),
        settings.table_path("quarantine"), "x", 0)
    rows = [json.loads(line) for line in _run(settings, "show", "quarantine", "--format", "json").stdout.splitlines()]
    assert [r["payload_base64"] for r in rows] == ["/w==", "XHhmZg==", "bGluZQ0K", None]
    assert [None if r["payload_base64"] is None else base64.b64decode(r["payload_base64"]) for r in rows] == payloads
    csv = list(DictReader(io.StringIO(_run(settings, "show", "quarantine", "--format", "csv").stdout)))
    assert [base64.b64decode(r["payload_base64"]) for r in csv[:3]] == payloads[:3] and csv[3]["payload_base64"] == ""
    table = _run(settings, "show", "quarantine").stdout.splitlines()
    literals = [line.split(" r ", 1)[1].strip() for line in table[1:]]
    assert literals == ["b'\\xff'", "b'\\\\xff'", "b'line\\r\\n'", "None"]  # Python bytes literals: exact
    assert [ast.literal_eval(v) for v in literals[:3]] == payloads[:3]


def test_errors_say_what_and_where(settings):
    missing = _run(settings, "show", "nope")
    assert missing.returncode == 2 and "no table 'nope'" in missing.stderr
    bad = _run(settings, "show", "t", env={"EVENTIDE_MAX_FRAME_BYTES": "lots"})
    assert bad.returncode == 2 and "EVENTIDE_MAX_FRAME_BYTES='lots'" in bad.stderr
    no_file = _run(settings, "ingest", "logs", "/nonexistent.log")
    assert no_file.returncode == 2 and "/nonexistent.log: no such file" in no_file.stderr
    refused = _run(settings, "send", "logs", str(REPO / "README.md"), "--to", "127.0.0.1:9")
    assert refused.returncode == 2 and "127.0.0.1:9" in refused.stderr


def test_generate_logs_and_orders(settings, tmp_path):
    out = _run(settings, "generate", "logs", "--out", str(tmp_path / "g.log"), "--count", "500", "--days", "2")
    assert out.returncode == 0 and "500 log lines over 2 days" in out.stdout
    lines = (tmp_path / "g.log").read_text().splitlines()
    assert lines.count("END_OF_DAY") == 2 and len(lines) == 502
    orders = _run(settings, "generate", "orders", "--out", str(tmp_path / "o.msg"), "--count", "10")
    assert orders.returncode == 0 and (tmp_path / "o.msg").stat().st_size == 10 * (4 + 53)


def test_send_and_ingest_say_which_flag_a_mismatched_file_needs(settings, tmp_path):
    text = tmp_path / "lines.msg"
    text.write_text("kitchen,21.5\ngarage,4.0\n")
    guessed = _run(settings, "ingest", "text", str(text))
    assert guessed.returncode == 2
    assert guessed.stderr == (f"eventide ingest: error: {text} does not look framed (it starts with text b'kitc', not a "
                              "length header): it looks like text lines; pass --lines\n")
    said = _run(settings, "ingest", "text", str(text), "--lines")
    assert said.returncode == 0 and said.stdout.startswith("landed 2 messages in text")

    frames = tmp_path / "frames.txt"
    frames.write_bytes(b"\x00\x00\x00\x02ab\x00\x00\x00\x01c")
    refused = _run(settings, "send", "text", str(frames), "--to", "127.0.0.1:9")  # checked before connecting
    assert refused.returncode == 2 and "frames.txt looks like length-prefixed frames" in refused.stderr
    assert refused.stderr.rstrip().endswith("pass --framed (or --lines to send it as text anyway)")
    both = _run(settings, "send", "text", str(frames), "--framed", "--lines")
    assert both.returncode == 2 and "--lines: not allowed with argument --framed" in both.stderr


def test_help_names_the_new_commands_and_flags(settings):
    top = _run(settings, "--help").stdout
    assert "{serve,send,ingest,run,show,apps,new," in top.replace(" ", "")
    assert "--gateway-only" in _run(settings, "serve", "--help").stdout
    for command in ("serve", "send", "ingest", "run", "apps"):
        assert "--app MODULE:ATTR" in _run(settings, command, "--help").stdout, command


def test_ui_serves_the_same_home_and_apps_with_the_users_folder_importable(tmp_path):
    from orchestration.cli import ui_command
    from transforms.settings import Settings

    settings = Settings(home=tmp_path / "home", apps="thermo_app:app")
    argv, env = ui_command(settings, 3111, cwd=tmp_path)
    assert argv[1:3] == ["dev", "-w"] and Path(argv[3]).name == "workspace.yaml" and Path(argv[3]).is_file()
    assert argv[-4:] == ["-h", "127.0.0.1", "-p", "3111"] and Path(argv[0]).is_file()
    assert env["EVENTIDE_HOME"] == str((tmp_path / "home").absolute())
    assert env["DAGSTER_HOME"] == str((tmp_path / "home" / "dagster").absolute())
    assert env["EVENTIDE_APPS"] == "thermo_app:app"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


def test_run_and_serve_compile_only_hot_code_unless_told(monkeypatch, tmp_path):
    """settings.jvm_c2_hot_only: on for `run` and for `serve` alike (serve's backlog caught up 25 s against
    33 s, its answers no slower: bench/README.md), off when EVENTIDE_JVM_C2_HOT_ONLY says so."""
    from orchestration import cli
    from transforms.settings import reset_settings

    monkeypatch.setenv("EVENTIDE_HOME", str(tmp_path))
    monkeypatch.setenv("EVENTIDE_JVM_C2_HOT_ONLY", "")  # recorded first: whatever a command sets is undone too
    for argv, env, expected in [(["run"], None, True), (["serve"], None, True), (["serve"], "0", False),
                                (["run"], "0", False)]:
        monkeypatch.delenv("EVENTIDE_JVM_C2_HOT_ONLY", raising=False)
        if env is not None:
            monkeypatch.setenv("EVENTIDE_JVM_C2_HOT_ONLY", env)
        reset_settings()
        assert cli._settings(cli.build_parser().parse_args(argv)).jvm_c2_hot_only is expected, argv
    reset_settings()


def test_the_collector_is_off_while_run_starts_then_back_with_the_start_frozen():
    """`eventide run`'s start (Dagster, great-expectations, the definitions) is made without Python's
    cyclic collector scanning it; the collector is back once the start is done, or the start failed."""
    import gc

    from orchestration.cli import collector_held_off

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with collector_held_off() as start_done:
            assert not gc.isenabled()
            made = [[] for _ in range(1000)]  # what a start makes
            start_done()
            assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(made)
            gc.disable()
            start_done()  # once only: a second call changes nothing
            assert not gc.isenabled()
            gc.enable()
        assert gc.isenabled()
        with pytest.raises(RuntimeError), collector_held_off():
            raise RuntimeError("the start failed")
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
