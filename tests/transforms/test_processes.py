"""transforms/processes.py: a live process is alive; a zombie and a reaped one are not; /proc's processes
with their parent, state, command line and environment."""

import os
import subprocess
import sys
import time

from transforms.processes import alive, live_children, local_processes


def test_alive_a_zombie_and_a_reaped_process():
    assert alive(os.getpid())
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while alive(child.pid) and time.monotonic() < deadline:  # exited, not yet reaped: a zombie
        time.sleep(0.05)
    assert not alive(child.pid)
    child.wait()
    assert not alive(child.pid)


def test_local_processes_see_a_child_with_its_parent_command_line_and_environment():
    marker = f"EVENTIDE_TEST_PROCESSES={os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "marker-arg"],
                             env={**os.environ, "EVENTIDE_TEST_PROCESSES": str(os.getpid())})
    try:
        mine = [p for p in local_processes() if p.pid == child.pid]
        assert len(mine) == 1 and mine[0].ppid == os.getpid() and not mine[0].zombie
        assert mine[0].cmdline()[-1] == b"marker-arg"
        assert marker.encode() in mine[0].environ()
        assert child.pid in live_children(os.getpid())
    finally:
        child.kill()
        deadline = time.monotonic() + 10
        while alive(child.pid) and time.monotonic() < deadline:  # killed, not yet reaped: a zombie
            time.sleep(0.05)
        assert child.pid not in live_children(os.getpid())  # a zombie is no live child
        zombie = [p for p in local_processes() if p.pid == child.pid]
        assert zombie and zombie[0].zombie and zombie[0].cmdline() == []
        child.wait()
    assert not [p for p in local_processes() if p.pid == child.pid]
