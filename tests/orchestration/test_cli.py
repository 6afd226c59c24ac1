"""The eventide CLI: show formats, clear errors, generators. Runs the real console script."""

import json
import os
import subprocess
import sys

import pyarrow as pa

from tests.conftest import REPO
from transforms import lake

EVENTIDE = os.path.join(os.path.dirname(sys.executable), "eventide")


def _run(settings, *args, env=None):
    env = {**os.environ, "EVENTIDE_HOME": str(settings.home), **(env or {})}
    return subprocess.run([EVENTIDE, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_show_prints_a_table_as_table_csv_and_json_lines(settings):
    lake.append_once(settings.table_path("t"), pa.table({"day": ["2004-03-07", "2004-03-08"], "status": [200, 404],
                                                         "payload": [b"a\xff", b"b"]}), "x", 0)
    table = _run(settings, "show", "t")
    assert table.returncode == 0 and "2004-03-07" in table.stdout and "404" in table.stdout
    csv = _run(settings, "show", "t", "--format", "csv").stdout.splitlines()
    assert csv[0] == "day,status,payload" and len(csv) == 3
    rows = [json.loads(line) for line in _run(settings, "show", "t", "--format", "json").stdout.splitlines()]
    assert rows == [{"day": "2004-03-07", "status": 200, "payload": "a\\xff"}, {"day": "2004-03-08", "status": 404, "payload": "b"}]
    where = _run(settings, "show", "t", "--format", "json", "--where", "status = 404").stdout
    assert len(where.splitlines()) == 1


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
