"""Spark's Python daemon (pyspark.daemon), started with a path without Spark's zips and jar.

Spark puts pyspark.zip, py4j's zip and the spark-core jar (15,000 entries, no Python) first on every
Python worker's `sys.path`, and each task calls `importlib.invalidate_caches()`. On Python 3.11 that
reads a zip's whole directory again for every zip importer: one per package imported from it, dozens
for pyspark. Measured 0.10 s a task, on every Python task of every micro-batch. The workers are forked
from this daemon and inherit its path. The zips leave only when the same pyspark (the one they came
with, pip-installed) and py4j import from the rest of the path. Embedded sessions only
(transforms/spark.py): a cluster's executors start their daemon before Eventide's code reaches them.
"""

import os
import sys
from importlib.machinery import PathFinder

# The workers' young-generation threshold for Python's cyclic collector (CPython's default: 700). A
# worker makes a million objects in a batch of a million outputs (unpickled messages, their records,
# the envelopes' lists) and holds them until the batch is done, and at 700 the collector rescanned its
# young generations every few hundred of them. Measured, the sinks' pass over 1.2M word counts
# (transforms/engine/sink_rows.py): 5.2-5.6 CPU-s at 700, 3.5-3.6 at 50,000.
WORKER_GC_THRESHOLDS = (50_000, 20, 10)


def lean_path(path: list[str]) -> list[str]:
    """`path` without jars, and without the zips under the importable pyspark's own python/lib."""
    path = [p for p in path if not p.endswith(".jar")]
    rest = [p for p in path if not p.endswith(".zip")]
    pyspark, py4j = PathFinder.find_spec("pyspark", rest), PathFinder.find_spec("py4j", rest)
    if pyspark is None or py4j is None or not pyspark.submodule_search_locations:
        return path
    lib = os.path.join(next(iter(pyspark.submodule_search_locations)), "python", "lib") + os.sep
    return [p for p in path if not p.startswith(lib)]


def use_lean_path(path: list[str]) -> None:
    """Make `lean_path(path)` this process's path, and forget the importers of the entries left out
    (made while finding the module that calls this)."""
    sys.path[:] = lean_path(path)
    for entry in [e for e in sys.path_importer_cache if e not in sys.path]:
        del sys.path_importer_cache[entry]


if __name__ == "__main__":  # python -m transforms.python_daemon pyspark.worker (spark.python.daemon.module)
    import gc

    use_lean_path(sys.path)
    gc.set_threshold(*WORKER_GC_THRESHOLDS)  # the workers it forks inherit it
    from pyspark import daemon  # after the path is trimmed: the workers it forks inherit it

    daemon.manager()
