"""One writer per query checkpoint: the lock file under the home, across processes."""

import subprocess
import sys
import textwrap

import pytest

from transforms.engine.locks import QueryBusy, QueryLock, holder_of


def _hold_in_child(settings, query: str):
    """A child process that takes the lock, says so, and holds it until its stdin closes."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from transforms.engine.locks import QueryLock
        from transforms.settings import Settings
        lock = QueryLock(Settings(home=Path({str(settings.home)!r})), {query!r}, command="eventide serve")
        assert lock.try_acquire()
        print("held", flush=True)
        sys.stdin.read()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_process_cannot_take_a_held_lock_and_learns_who_holds_it(settings):
    child = _hold_in_child(settings, "market_spread")
    try:
        assert holder_of(settings, "market_spread")["pid"] == child.pid
        lock = QueryLock(settings, "market_spread")
        assert not lock.try_acquire()
        with pytest.raises(QueryBusy, match=rf"eventide serve \(pid {child.pid}"):
            lock.acquire(wait_seconds=0.3)
        assert QueryLock(settings, "bronze_orders").try_acquire()  # other queries are free
    finally:
        child.stdin.close()
        child.wait(10)
    # The holder is gone (here: exited; after kill -9 the kernel lets go of the lock just the same).
    assert holder_of(settings, "market_spread") is None
    lock = QueryLock(settings, "market_spread")
    assert lock.try_acquire()
    lock.release()


def test_a_killed_holder_releases_the_lock(settings):
    child = _hold_in_child(settings, "words")
    child.kill()
    child.wait(10)
    assert holder_of(settings, "words") is None
    assert QueryLock(settings, "words").try_acquire()


@pytest.mark.spark
def test_a_run_skips_a_query_another_process_holds_and_says_who(spark, settings):
    from tests.conftest import land
    from transforms import lake
    from transforms.engine import run_application
    from transforms.streams import bronze_application

    app = bronze_application(settings.registry.stream("text"))
    land(settings, "text", [b"a b", b"c"])
    child = _hold_in_child(settings, app.name)
    said = []
    try:
        (report,) = run_application(spark, app, settings, progress=said.append)
    finally:
        child.stdin.close()
        child.wait(10)
    assert report.held_by and f"pid {child.pid}" in report.held_by and report.batches == 0
    assert any("skipped" in line and "eventide serve" in line for line in said)
    assert not lake.exists(settings.table_path(settings.registry.stream("text").bronze_table))
    (report,) = run_application(spark, app, settings)  # free again: runs
    assert report.held_by is None and report.input_rows == 2
