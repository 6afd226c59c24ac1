"""The suite's own hygiene: what one test leaves in the environment, the next does not see (the two tests
run in this order, in one process: pytest keeps a file's order, and `--dist loadfile` keeps a file on one
worker)."""

import os


def test_a_command_in_process_sets_eventides_variables():
    from orchestration.cli import _settings, build_parser

    os.environ.pop("EVENTIDE_CLOSE_WINDOWS", None)
    _settings(build_parser().parse_args(["run", "--close-windows"]))
    os.environ["DAGSTER_HOME"] = "/nowhere/left/by/a/test"
    assert os.environ["EVENTIDE_CLOSE_WINDOWS"] == "1"


def test_the_next_test_finds_them_as_they_were():
    assert "EVENTIDE_CLOSE_WINDOWS" not in os.environ
    assert os.environ.get("DAGSTER_HOME") != "/nowhere/left/by/a/test"
