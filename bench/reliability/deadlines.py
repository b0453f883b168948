"""Goodput under a short deadline (issue 31, failure 1): Poisson arrivals above capacity, with
`NMT_REQUEST_TIMEOUT_SECONDS` of 1 s or 5 s and the queue at its default length, against the
servers of two checkouts side by side (`--tree`: the code before a change, and this one).

A queue bounded by length alone admits work it cannot finish in time: what it admitted then
timed out halfway (504) and goodput fell far below capacity. Each cell is one fresh server:
its capacity measured first (closed loop), then arrivals at a multiple of it
(bench/reliability/overload.py does both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness import ROOT
from bench.reliability.overload import run_overload
from bench.reliability.report import table_head

# (deadline s, sentences per request, load as a multiple of capacity)
CELLS = [(1.0, 1, 1.5), (1.0, 1, 2.0), (5.0, 4, 1.5), (5.0, 4, 2.0)]
DEFAULT_QUEUE_SENTENCES = 1024  # the setting's default: the queue the tester ran into


def run_deadlines(
    model_dir: Path,
    work_dir: Path,
    before_tree: Path,
    seconds: float = 30.0,
    capacity_seconds: float = 12.0,
) -> dict[str, Any]:
    """Every cell against the code of `before_tree`, then against this checkout's."""
    trees = {"before": before_tree, "after": ROOT}
    results: list[dict[str, Any]] = []
    for deadline, sentences, factor in CELLS:
        for name, tree in trees.items():
            run = run_overload(
                model_dir,
                work_dir / f"{name}-{deadline:g}s-{sentences}x-{factor:g}",
                seconds=seconds,
                capacity_seconds=capacity_seconds,
                factor=factor,
                queue_sentences=DEFAULT_QUEUE_SENTENCES,
                deadline=deadline,
                sentences_per_request=sentences,
                tree=tree,
            )
            statuses = run["statuses"]
            results.append(
                {
                    "code": name,
                    "deadline_s": deadline,
                    "sentences": sentences,
                    "factor": factor,
                    "capacity_rps": run["capacity_rps"],
                    "offered_rps": run["offered_rps"],
                    "goodput_rps": run["goodput_rps"],
                    "goodput_share": round(run["goodput_rps"] / run["capacity_rps"], 2),
                    "statuses": statuses,
                    "ok_p99_ms": run["admitted_200"].get("p99_ms"),
                    "refused_p99_ms": run["rejected_429"].get("p99_ms"),
                    "unexpected_5xx": run["unexpected_5xx"],
                    "lost": run["nothing_lost"]["lost"],
                    "healthz_p99_ms": run["healthz"].get("p99_ms"),
                }
            )
    return {"seconds": seconds, "before_tree": str(before_tree), "cells": results}


COLUMNS = [
    "deadline",
    "sentences a request",
    "load",
    "code",
    "capacity, requests/s",
    "goodput, requests/s",
    "goodput ÷ capacity",
    "200",
    "429",
    "504",
    "200 p99",
    "429 p99",
    "faults / lost",
]


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value} ms"


def markdown(result: dict[str, Any]) -> str:
    command = (
        ".venv/bin/python -m bench.reliability deadlines --before-tree "
        f"{result['before_tree']} --seconds {result['seconds']:g}"
    )
    rows = []
    for cell in result["cells"]:
        statuses = cell["statuses"]
        rows.append(
            f"| {cell['deadline_s']:g} s | {cell['sentences']} | {cell['factor']:g}x "
            f"| {cell['code']} | {cell['capacity_rps']} | {cell['goodput_rps']} "
            f"| **{cell['goodput_share']:.2f}** | {statuses.get('200', 0)} "
            f"| {statuses.get('429', 0)} | {statuses.get('504', 0)} | {_ms(cell['ok_p99_ms'])} "
            f"| {_ms(cell['refused_p99_ms'])} | {cell['unexpected_5xx']} / {cell['lost']} |"
        )
    return f"""## Goodput under short deadlines (before and after deadline-aware admission)

```sh
{command}
```

Each row is a fresh server with `NMT_REQUEST_TIMEOUT_SECONDS` as shown, `NMT_CACHE_ENTRIES=0`,
the queue at its default (`NMT_MAX_QUEUE_SENTENCES=1024`), other settings default (beam 4).
Capacity: 8 closed-loop clients; then Poisson arrivals at the multiple shown, for
{result["seconds"]:g} s, from a separate process. Goodput: requests answered 200 per second,
as a share of the capacity measured just before. Goodput can pass that capacity: 8 clients
do not fill the running batch, an overload does.

Before, the queue was bounded by its length only: what it admitted waited past its deadline
and was answered 504, often after its decoding had begun, so goodput fell as the load grew
(at 2x with a 1 s deadline, to a tenth of capacity). After, a request the backlog would keep
past its deadline gets 429 at once (service/serving/admission.py; docs/service.md,
"Deadline-aware admission"), and what is admitted finishes in time.

{table_head(COLUMNS)}
{chr(10).join(rows)}
"""
