"""great-expectations called directly: its import defers what Eventide's checks do not use."""

import subprocess
import sys
import textwrap


def _python(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_check_runs_without_importing_what_only_other_expectations_use():
    out = _python("""
        import sys
        import pandas as pd
        from assets.gx import validate
        df = pd.DataFrame({"status": [200, 404], "count": [1, 2]})
        result = validate(df, "t", [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "status"}},
                                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "count", "min_value": 0}}])
        print(result.passed, *(type(sys.modules[m]).__name__ for m in ("scipy.stats", "altair")))
    """)
    assert out == ["True", "_Deferred", "_Deferred"]


def test_a_deferred_module_is_the_real_one_once_used():
    out = _python("""
        import sys
        from assets.gx import defer_imports
        defer_imports(["scipy.stats"])
        import scipy.stats
        from scipy import stats
        assert type(sys.modules["scipy.stats"]).__name__ == "_Deferred"
        print(round(stats.entropy([0.5, 0.5]), 4), round(scipy.stats.norm.cdf(0), 2))
        print(type(sys.modules["scipy.stats"]).__name__, sys.modules["scipy.stats"].entropy is stats.entropy)
    """)
    assert out == ["0.6931", "0.5", "module", "True"]


def test_an_expectation_that_needs_a_deferred_module_gets_it():
    # The KL divergence imports scipy.stats at its module's import and uses it when it runs.
    out = _python("""
        import pandas as pd
        from assets.gx import validate
        df = pd.DataFrame({"x": [1, 1, 2, 2]})
        kl = {"type": "expect_column_kl_divergence_to_be_less_than",
              "kwargs": {"column": "x", "partition_object": {"values": [1, 2], "weights": [0.5, 0.5]}, "threshold": 0.1}}
        print(validate(df, "kl", [kl]).passed, validate(df.assign(x=[1, 1, 1, 2]), "kl", [kl]).passed)
    """)
    assert out == ["True", "False"]
