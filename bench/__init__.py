"""Eventide's benchmarks (bench/README.md): each measures Eventide next to a baseline, whole processes."""

import json
from pathlib import Path


def report(result, out: Path | None) -> None:
    """Print a benchmark's result as JSON and, given `out`, write it there too."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")
