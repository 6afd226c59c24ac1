"""Two settings of one `eventide run`, side by side: whole cold processes over fresh copies of one landed
home, alternating A B, B A, ... so a drift of the machine falls on both. What the sittings of issue L used to
keep or drop a JVM option or an EVENTIDE_* setting (bench/README.md).

    python -m bench.peers --only logs --logs-lines 1000000 --logs-days 7 --repeats 1 --steady none \
        --without bytewax,required_shape,pyspark --keep          # lands the home; prints where it kept it
    python -m bench.pairs --home /tmp/eventide-bench-peers-XXXX/logs-home --pairs 3 \
        --a '' --b 'EVENTIDE_SPARK_JAVA_OPTIONS=-Xms2g' --out bench/results/NAME.json

A side is `NAME=VALUE` settings separated by `;` (empty: the defaults). Wall seconds, spawn to exit."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench import report
from bench.processes import child_env, eventide_cmd, fresh_home, timed_process


def parse_side(side: str) -> dict[str, str]:
    """`A=1;B=x y` -> {"A": "1", "B": "x y"}; raises on an entry without `=`."""
    env = {}
    for entry in filter(None, (e.strip() for e in side.split(";"))):
        name, sep, value = entry.partition("=")
        if not sep or not name:
            raise SystemExit(f"bench.pairs: {entry!r} is not NAME=VALUE (separate settings with ';')")
        env[name] = value
    return env


def run_pairs(landed: Path, app: str, pairs: int, a: str, b: str) -> dict:
    sides = {"a": parse_side(a), "b": parse_side(b)}
    walls: dict[str, list[float]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory(prefix="eventide-bench-pairs-") as tmp:
        scratch = Path(tmp)
        for i in range(pairs):
            for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
                home = fresh_home(landed, scratch / "home")
                seconds = timed_process([*eventide_cmd(), "run", "--app", app],
                                        child_env(EVENTIDE_HOME=str(home), **sides[side]), scratch / f"{side}{i}.log")
                walls[side].append(round(seconds, 2))
                print(f"[bench.pairs] pair {i + 1}/{pairs} {side}: {seconds:.2f} s", file=sys.stderr, flush=True)
    diffs = [bw - aw for aw, bw in zip(walls["a"], walls["b"])]
    return {"home": str(landed), "app": app, "a": a, "b": b, "a_wall_s": walls["a"], "b_wall_s": walls["b"],
            "median_b_minus_a_s": round(statistics.median(diffs), 2),
            "b_faster_in_pairs": sum(d < 0 for d in diffs), "pairs": pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a home holding landing/ (bench.peers --keep)")
    parser.add_argument("--app", default="examples.logs:app")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--a", default="", help="settings of side a, NAME=VALUE;... (empty: defaults)")
    parser.add_argument("--b", default="", help="settings of side b")
    parser.add_argument("--out", type=Path, help="also write the results here")
    args = parser.parse_args()
    if not (args.home / "landing").is_dir():
        raise SystemExit(f"bench.pairs: {args.home} has no landing/; land one with `bench.peers ... --keep`")
    results = run_pairs(args.home, args.app, args.pairs, args.a, args.b)
    report(results, args.out)


if __name__ == "__main__":
    main()
