"""Two settings of one server, side by side: closed-loop throughput and CPU per request.

    .venv/bin/python -m bench.service_ab --a NMT_ENCODE_AHEAD=true --b NMT_ENCODE_AHEAD=false

Starts two `nmt serve` processes on the same bundle that differ only in the given settings
(both continuous batching and one engine thread unless told otherwise), then sends the same
closed-loop greedy load to each in turn (A, B, B, A, ...: a machine that drifts hits both
alike). Prints, per server: requests/s, p50, mean occupancy, and CPU per request of each part
(the engine threads, the event loop, the load generator), with the medians over the rounds.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.service_bench import (
    MULTI30K_TEST,
    Run,
    closed_loop,
    ensure_bundles,
    load_sentences,
    measure,
    server,
    settings,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", nargs="*", default=[], help="NAME=VALUE settings of server A")
    parser.add_argument("--b", nargs="*", default=[], help="NAME=VALUE settings of server B")
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=1000, help="per server and round")
    parser.add_argument("--rounds", type=int, default=2, help="each server, in mirrored order")
    parser.add_argument("--client-niceness", type=int, default=10)
    args = parser.parse_args()

    sentences, _ = load_sentences(MULTI30K_TEST)
    rng = random.Random(7)
    base = {"batching": "continuous", "threads": "1"}
    configs = {"A": {**base, **settings(args.a)}, "B": {**base, **settings(args.b)}}
    with ExitStack() as stack:
        model_dir = ensure_bundles(args.model_dir, stack)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-ab-")))
        served = {
            name: stack.enter_context(server(model_dir, logs, c)) for name, c in configs.items()
        }
        os.nice(args.client_niceness)
        warm = [(rng.choice(sentences), 1) for _ in range(2 * args.clients)]
        for one in served.values():
            asyncio.run(closed_loop(one.url, warm, args.clients))
        runs: dict[str, list[Run]] = {"A": [], "B": []}
        for round_ in range(args.rounds):
            work = [(rng.choice(sentences), 1) for _ in range(args.requests)]
            for name in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
                run = Run(name, f"round {round_}")
                measure(run, served[name], closed_loop(served[name].url, work, args.clients))
                runs[name].append(run)
    print(f"{args.clients} closed-loop greedy clients, {args.requests} requests a round")
    print(
        "| server | settings | req/s per round | median req/s | p50 ms | occupancy "
        "| CPU ms/request: engine / server / client |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    for name, rounds in runs.items():
        told = " ".join(args.a if name == "A" else args.b) or "defaults"
        cpu = " / ".join(
            f"{statistics.median(r.cpu_ms_per_request(part) for r in rounds):.2f}"
            for part in ("engine", "server", "client")
        )
        print(
            f"| {name} | {told} | {', '.join(f'{r.throughput:.1f}' for r in rounds)} | "
            f"{statistics.median(r.throughput for r in rounds):.1f} | "
            f"{statistics.median(r.percentile(0.5) for r in rounds) * 1000:.0f} | "
            f"{statistics.median(r.occupancy for r in rounds):.1f} | {cpu} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
