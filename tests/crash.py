"""Run Python code in a process of its own (a session: the driver and its JVM) and SIGKILL it when a
condition holds, as a crash would: what the exactly-once tests do between runs."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from tests.conftest import REPO


def run_python(code: str, env: dict, kill_when: Callable[[], bool] | None = None, timeout: float = 240,
               jitter: float = 0.0, poll: float = 0.05) -> str:
    """"killed" (kill_when held, then up to `jitter` s more: the kill lands anywhere in what follows),
    "complete" (the code printed COMPLETE) or "exit N: <the end of its stderr>"."""
    errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty run never blocks on a full pipe
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=errors, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    deadline = time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            if kill_when and kill_when():
                time.sleep(random.uniform(0, jitter))
                os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM die together, as in a crash
                proc.wait()
                return "killed"
            time.sleep(poll)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if "COMPLETE" in proc.stdout.read():
        return "complete"
    errors.seek(0)
    return f"exit {proc.returncode}: {errors.read().decode(errors='replace')[-3000:]}"


def without_batch_bound(env: dict) -> dict:
    """The environment with Spark's default batch sizes: small batches give a kill somewhere to land; the
    run after it replays the killed batch as planned, then takes the rest at once."""
    return {k: v for k, v in env.items() if k != "EVENTIDE_MAX_FILES_PER_TRIGGER"}
