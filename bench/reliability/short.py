"""The short forms, for CI (`all --short` and tests/bench/test_reliability.py): the same
measurements, bounded to a few minutes in all on two cores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.reliability import fuzz, hostile, overload, sigterm, soak
from bench.reliability.report import lost_cell

SHORT: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    "schemathesis": lambda m, w: fuzz.run_schemathesis(m, w, max_examples=40),
    "hostile": lambda m, w: hostile.run_hostile(m, w, examples=150),
    "overload": lambda m, w: overload.run_overload(m, w, seconds=15, capacity_seconds=5),
    # The harder of the two runs: the timeout runs out with big requests still decoding.
    "sigterm": lambda m, w: sigterm.run_sigterm(m, w, runs=["past the shutdown timeout"]),
    "soak": lambda m, w: soak.run_soak(m, w, seconds=30, warmup=10, window=10),
}


def _row(name: str, result: dict[str, Any]) -> str:
    if name == "sigterm":
        run = result["runs"][0]
        fives = f"{run['5xx']} ({run['unexpected_5xx']} not 503)"
        return (
            f"| sigterm, {run['run']} | exit {run['exit_code']}, {run['admitted']} admitted "
            f"| {fives} | {lost_cell(run['nothing_lost'])} |"
        )
    measure = {
        "schemathesis": lambda r: (
            f"{r['requests']} requests, {r['failed_conformance_checks']} failed conformance checks"
        ),
        "hostile": lambda r: (
            f"{r['requests']} requests, {r['over_5s']} over 5 s, /healthz p99 "
            f"{r['healthz']['p99_ms']} ms"
        ),
        "overload": lambda r: (
            f"{r['offered_rps']} req/s offered ({r['capacity_rps']} capacity), "
            f"429 p99 {r['rejected_429']['p99_ms']} ms, /healthz p99 {r['healthz']['p99_ms']} ms"
        ),
        "soak": lambda r: (
            f"{r['requests']} requests, RSS {r['rss_growth_percent']}% after "
            f"warm-up, fds {r['fds_after_warmup']} → {r['fds_end']}"
        ),
    }[name](result)
    fives = result.get("server_errors", result.get("5xx"))
    return f"| {name} | {measure} | {fives} | {lost_cell(result['nothing_lost'])} |"


def markdown_short(results: dict[str, dict[str, Any]]) -> str:
    rows = "\n".join(_row(name, result) for name, result in results.items())
    return f"""## The short form (CI)

```sh
.venv/bin/python -m bench.reliability all --short
```

What `make test-slow` runs (`tests/bench/test_reliability.py`, which asserts 0 5xx that are faults,
nothing lost and exit 0): about 300 schemathesis cases, 150 hostile examples in both dialects,
15 s of overload, one SIGTERM run past the shutdown timeout, 30 s of soak.

| test | measured | 5xx | nothing lost |
|---|---|---|---|
{rows}
"""
