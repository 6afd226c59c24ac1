"""transforms/processes.py: a live process is alive; a zombie and a reaped one are not."""

import os
import subprocess
import time

from transforms.processes import alive


def test_alive_a_zombie_and_a_reaped_process():
    assert alive(os.getpid())
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while alive(child.pid) and time.monotonic() < deadline:  # exited, not yet reaped: a zombie
        time.sleep(0.05)
    assert not alive(child.pid)
    child.wait()
    assert not alive(child.pid)
