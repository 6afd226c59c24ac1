"""The Python that an embedded session's Spark starts (`sc.pythonExec`, transforms/spark.py): this
interpreter, with Spark's zips and jar taken off the path before the module Spark asks for runs.

Spark starts Python as `PYTHON -m MODULE`: its daemon, which forks the workers (their path is trimmed by
transforms/python_daemon.py), and, without the daemon, a fresh process at every start of a keyed query:
transformWithState's driver-side schema step (pyspark.sql.streaming.transform_with_state_driver_worker).
Through the zips that process's imports (pyspark, pandas, the engine, the apps) took 1.27 s; from the
lean path 0.65 s (measured here, 2 cores), on every keyed query's first batch. Where the session started a
zygote (transforms/python_zygote.py), that process is a fork of it instead, with those imports done.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m":  # anything but `-m MODULE ...`: the plain interpreter
        os.execv(sys.executable, [sys.executable, *args])
    from transforms.python_daemon import use_lean_path

    # As `python -m` has it: the working folder first (this script's folder is there instead), then
    # the rest without the zips.
    use_lean_path([os.getcwd(), *sys.path[1:]])
    from transforms.python_zygote import FORKED_MODULES, ZYGOTE_ENV, ask

    if args[1] in FORKED_MODULES and (address := os.environ.get(ZYGOTE_ENV)):
        code = ask(address, args[1:], sys.path)
        if code is not None:
            return code
    sys.argv = [args[1], *args[2:]]  # run_module puts the module's file in argv[0], as -m does
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    return 0
