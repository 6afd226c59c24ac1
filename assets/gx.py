"""great-expectations 1.x, called directly (dagster-ge supports only GX 0.x).

`validate(df, name, expectations)` runs a suite over a pandas DataFrame in an ephemeral context and
returns an AssetCheckResult whose metadata lists each expectation's outcome and sample failures.
An expectation is a GX object (`gx.expectations.ExpectColumnValuesToNotBeNull(column="x")`) or its
configuration dict (`{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "x"}}`):
the dict form lets an app declare checks without importing great-expectations (seconds) on import.
"""

import importlib
import importlib.util
import logging
import sys
import types
from functools import cache

import dagster as dg
import pandas as pd

logging.getLogger("great_expectations").setLevel(logging.ERROR)

# Imported by great-expectations' own import for expectations Eventide's checks do not use (a KL
# divergence's scipy.stats and its charts' altair): half of its import's CPU (1.5-1.8 of 3.1-4.1 s), which
# every `eventide run` with checks paid while its JVM started on the same two cores.
DEFERRED_BY_GX = ("scipy.stats", "altair")


class _Deferred(types.ModuleType):
    """A module imported when one of its attributes is first used. Its spec is there at once: Python's
    import looks at an imported module's `__spec__`, and importlib's LazyLoader loads the module on that
    look, so `from scipy import stats` loaded it anyway."""

    def __getattr__(self, attr):
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def defer_imports(names=DEFERRED_BY_GX) -> None:
    """Each of `names` not imported yet becomes a module imported on first use (the real module is
    then in sys.modules, and the deferred one forwards to it)."""
    for name in names:
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:
            continue
        if spec is not None:
            module = _Deferred(name)
            module.__spec__ = spec
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:  # `import scipy.stats; scipy.stats.x` finds it on its package, as an import leaves it
                setattr(sys.modules[parent], child, module)


@cache
def _context():
    defer_imports()
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    return ctx


def warm_up() -> None:
    """Import great-expectations and make its context (2-3 s) ahead of the first check: `eventide run`
    does it while the JVM starts, when its main thread would only wait (orchestration/runner.py)."""
    _context()


def expectation(e):
    """A GX expectation from an object or its configuration dict; TypeError says what is expected."""
    if isinstance(e, dict):
        _context()  # great-expectations imported the one way
        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

        try:
            return ExpectationConfiguration(type=e["type"], kwargs=e.get("kwargs", {})).to_domain_obj()
        except Exception as err:
            raise TypeError(f"expectation {e!r}: not a great-expectations configuration "
                            f"({{'type': 'expect_...', 'kwargs': {{...}}}}): {err}") from None
    return e


def validate(df: pd.DataFrame, name: str, expectations: list, asset_key=None, partition: str | None = None,
             severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR) -> dg.AssetCheckResult:
    ctx = _context()
    import great_expectations as gx

    source = ctx.data_sources.add_or_update_pandas("eventide")
    asset = source.add_dataframe_asset(f"{name}-{len(source.assets)}")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": df})
    suite = gx.ExpectationSuite(name=name)
    for e in expectations:
        suite.add_expectation(expectation(e))
    result = batch.validate(suite)
    outcomes = {}
    for r in result.results:
        cfg = r.expectation_config
        col = cfg.kwargs.get("column") or cfg.kwargs.get("column_list") or ""
        outcomes[f"{cfg.type}({col})"] = {
            "success": bool(r.success),
            "unexpected_count": r.result.get("unexpected_count"),
            "sample": [str(v) for v in (r.result.get("partial_unexpected_list") or [])[:5]],
            "observed": str(r.result.get("observed_value")) if r.result.get("observed_value") is not None else None,
        }
    meta = {"rows": len(df), "expectations": dg.MetadataValue.json(outcomes)}
    if partition:
        meta["partition"] = partition
    kwargs = {"asset_key": asset_key} if asset_key is not None else {}
    return dg.AssetCheckResult(passed=bool(result.success), metadata=meta, severity=severity, **kwargs)


def validate_partitions(frames: dict[str, pd.DataFrame], name: str, expectations: list) -> dict[str, dg.AssetCheckResult]:
    """Each partition's frame validated against the same expectations: first all of them at once, one
    validation for the run's range; only if that fails, each on its own, to say which failed.

    Exact for expectations that hold of the union exactly when they hold of every part: row-level
    ones, and uniqueness of columns that include the partition's (a frame's rows carry their partition
    in a column for that, so "the day is the partition" is a row-level pair equality)."""
    if len(frames) > 1:
        whole = validate(pd.concat(frames.values(), ignore_index=True), name, expectations)
        if whole.passed:
            return {key: dg.AssetCheckResult(passed=True, severity=whole.severity, metadata={
                **whole.metadata, "rows": len(frame), "partition": key,
                "validated_with": f"the run's {len(frames)} partitions at once"}) for key, frame in frames.items()}
    return {key: validate(frame, name, expectations, partition=key) for key, frame in frames.items()}
