"""`eventide demo`, as a user runs it: TCP in, Dagster run, and the printed results are right."""

import os
import re
import subprocess
import sys

from tests.conftest import REPO

README_TABLE = """
2004-03-07 200 147
2004-03-07 401 48
2004-03-07 404 1
2004-03-08 200 478
2004-03-08 304 12
2004-03-08 401 67
2004-03-08 404 2
2004-03-09 200 205
2004-03-09 302 3
2004-03-09 304 22
2004-03-09 401 2
2004-03-09 408 1
2004-03-10 200 205
2004-03-10 302 2
2004-03-10 304 79
""".split("\n")[1:-1]


def test_demo_sends_over_tcp_runs_everything_and_prints_the_expected_results(tmp_path):
    env = {**os.environ, "EVENTIDE_HOME": str(tmp_path / "home")}
    eventide = os.path.join(os.path.dirname(sys.executable), "eventide")
    proc = subprocess.run([eventide, "demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    summary = [" ".join(line.split()) for line in out.splitlines() if re.match(r"\s*2004-03-\d\d\s+\d{3}\s+\d+\s*$", line)]
    assert summary == README_TABLE
    assert re.search(r"checks: (\d+) passed, 0 failed", out)
    assert "FAIL" not in out
    assert re.search(r"^\s+the\s+40$", out, re.M)  # the most frequent word of the Bill of Rights
    assert "symbols in reject state (15): GOOG GPS INSM IVR MDRX MYGN NFX NI NYCB PPHM SIAL SLH TGT TMO TTPH" in out
    assert "quarantine: 0 message(s)" in out
    # Every table was written by Spark's Delta writer, and Spark SQL reads them by name.
    from transforms import lake

    home = tmp_path / "home" / "demo"  # the demo's own home under EVENTIDE_HOME
    tables = [p for p in sorted((home / "lake").iterdir()) if lake.exists(p)]
    assert {p.name for p in tables} >= {"bronze_log_lines", "log_windows", "daily_return_code_summary",
                                        "market_state", "order_rejections", "word_totals"}
    for p in tables:
        assert "Delta-Lake/" in (lake.engine_info(p) or ""), p.name
    sql = subprocess.run([eventide, "sql", "SELECT kind, count(*) AS n FROM bronze_log_lines GROUP BY kind ORDER BY kind",
                          "--format", "json"], cwd=REPO, env={**env, "EVENTIDE_HOME": str(home)}, capture_output=True, text=True,
                         timeout=300)
    assert sql.returncode == 0, sql.stderr[-2000:]
    assert sql.stdout.splitlines() == ['{"kind": "line", "n": 1274}', '{"kind": "marker", "n": 4}']
