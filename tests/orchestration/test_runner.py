"""`eventide run`'s own parts, without Spark: which requested runs it (and `serve`) merge into one run over a
range, and the console its progress is said to."""

import warnings

import dagster as dg

from orchestration.runner import DueRun, merge_ranges, runs_as_one

DAILY = dg.DailyPartitionsDefinition(start_date="2004-03-01")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)

    @dg.asset(partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run())
    def ranged():
        return None

    @dg.asset(partitions_def=DAILY)
    def per_day():
        return None


DEFS = dg.Definitions(assets=[ranged, per_day], jobs=[dg.define_asset_job("ranged_job", [ranged]),
                                                       dg.define_asset_job("per_day_job", [per_day])])


def _due(job: str, day: str, who: str = "sensor", **tags) -> DueRun:
    return DueRun(job, day, who, dg.RunRequest(partition_key=day, tags=tags))


def test_adjacent_days_of_a_job_that_runs_as_one_merge_into_a_range():
    assert runs_as_one(DEFS.resolve_job_def("ranged_job")) and not runs_as_one(DEFS.resolve_job_def("per_day_job"))
    due = [_due("ranged_job", d) for d in ("2004-03-07", "2004-03-08", "2004-03-09", "2004-03-11")]
    merged = merge_ranges(DEFS, due)
    assert [r.partitions for r in merged] == ["2004-03-07..2004-03-09", "2004-03-11"]
    assert merged[0].label == "ranged_job[2004-03-07..2004-03-09]" and merged[1].label == "ranged_job[2004-03-11]"


def test_what_does_not_merge():
    days = ("2004-03-07", "2004-03-08")
    assert len(merge_ranges(DEFS, [_due("per_day_job", d) for d in days])) == 2  # no single-run policy
    assert len(merge_ranges(DEFS, [_due("ranged_job", days[0], "sensor"), _due("ranged_job", days[1], "schedule")])) == 2
    assert len(merge_ranges(DEFS, [_due("ranged_job", days[0], why="a"), _due("ranged_job", days[1], why="b")])) == 2
    assert len(merge_ranges(DEFS, [_due("ranged_job", days[0]), _due("per_day_job", days[1])])) == 2


def test_processes_starting_together_create_one_instance_they_can_all_open(tmp_path):
    """serve and `eventide ui` started together once stamped the new instance's storage twice
    ("alembic_version has more than one head") and neither could open it: creation is serialized."""
    import subprocess
    import sys

    from tests.conftest import REPO

    # Each child imports first, then waits for the go file: the creations start together, not spread
    # over the seconds the imports take.
    go = tmp_path / "go"
    code = ("import sys, time; from pathlib import Path; from transforms.settings import Settings; "
            "from orchestration.runner import dagster_instance; print('READY', flush=True)\n"
            "while not Path(sys.argv[2]).exists(): time.sleep(0.001)\n"
            "i = dagster_instance(Settings(home=Path(sys.argv[1]))); i.get_runs(limit=1); i.get_instigator_state('x', 'y')\n"
            "print('OPENED')")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "home"), str(go)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(6)]
    assert all(p.stdout.readline().strip() == "READY" for p in procs)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all("OPENED" in out for out, _ in outs), [err[-500:] for out, err in outs if "OPENED" not in out]


CAPTURED_STEP = r"""
import os, sys, tempfile
from orchestration.console import console

captured = tempfile.NamedTemporaryFile(delete=False)
with console() as say:
    say("before the step")
    # What Dagster does to a step's output: standard output's descriptor onto a file (then `tail -F` of it).
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(captured.fileno(), 1)
    print("printed in the step", flush=True)
    say("said in the step")
    os.dup2(saved, 1)
    say("after the step")
print("captured:", open(captured.name).read().strip())
"""


def test_console_lines_said_in_a_captured_step_reach_the_console_at_once_and_in_order():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", CAPTURED_STEP], cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["before the step", "said in the step", "after the step",
                                        "captured: printed in the step"]
