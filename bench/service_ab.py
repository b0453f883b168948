"""Two settings of one server, side by side: closed-loop throughput and CPU per request.

    .venv/bin/python -m bench.service_ab --a NMT_ENCODE_AHEAD=true --b NMT_ENCODE_AHEAD=false

Starts two `nmt serve` processes on the same bundle that differ only in the given settings
(one engine thread unless told otherwise), or in the code they
run (`--a-tree`: server A runs from another checkout, e.g. `git worktree add /tmp/before
HEAD~1`; its `python -m nmt_cli` imports that tree's packages, the same virtual environment's
dependencies), then sends the same
closed-loop greedy load to each in turn (A, B, B, A, ...: a machine that drifts hits both
alike). Prints, per server: requests/s, p50, mean occupancy, and CPU per request of each part
(the engine threads, the event loop, the load generator), with the medians over the rounds.

With --open-rate, an open loop instead: Poisson arrivals at that rate (half greedy, half
beam 4, sentences of every length, as `bench.service_bench` plays them), cut into 5-second
chunks that each server plays in turn (A B, B A, ...), each from an empty server. Prints the
latencies' mean, p50, p95 and p99 per server and A over B for the mean and the p99, each with
a 95% bootstrap interval over the chunks. Read the mean: the p99 of a few minutes is decided
by a few bursts. The same settings on both, 66 requests/s for 60 s: mean 1.013x (0.905-1.136),
p99 0.849x (0.776-1.184); for 150 s, in a scratch run: mean 0.995x, p99 0.77x.
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

from bench.harness import ROOT, Server, described, running_server, temporary_bundles
from bench.load import (
    MULTI30K_TEST,
    SERVED,
    Run,
    closed_loop,
    load_sentences,
    measure,
    open_loop_work,
    paired_ratio_interval,
    percentile,
    play_in_chunks,
    settings,
)

CHUNK_SECONDS = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", nargs="*", default=[], help="NAME=VALUE settings of server A")
    parser.add_argument("--b", nargs="*", default=[], help="NAME=VALUE settings of server B")
    parser.add_argument("--a-tree", type=Path, help="checkout server A runs from (default: this)")
    parser.add_argument("--b-tree", type=Path, help="checkout server B runs from (default: this)")
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=1000, help="per server and round")
    parser.add_argument("--rounds", type=int, default=2, help="each server, in mirrored order")
    parser.add_argument("--client-niceness", type=int, default=10)
    parser.add_argument("--open-rate", type=float, help="open loop at this many requests/s")
    parser.add_argument("--open-seconds", type=float, default=150, help="open loop's length")
    args = parser.parse_args()

    sentences, _ = load_sentences(MULTI30K_TEST)
    rng = random.Random(7)
    base = {**SERVED, "threads": "1"}
    configs = {"A": {**base, **settings(args.a)}, "B": {**base, **settings(args.b)}}
    with ExitStack() as stack:
        model_dir = args.model_dir or temporary_bundles(stack)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-ab-")))
        trees = {"A": args.a_tree or ROOT, "B": args.b_tree or ROOT}
        served = {
            name: stack.enter_context(running_server(model_dir.resolve(), logs, trees[name], **c))
            for name, c in configs.items()
        }
        os.nice(args.client_niceness)
        warm = [(rng.choice(sentences), 1) for _ in range(2 * args.clients)]
        for one in served.values():
            asyncio.run(closed_loop(one.url, warm, args.clients))
        if args.open_rate:
            return open_loop_ab(served, sentences, rng, args)
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
        told = servers_told(args)[name]
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


def servers_told(args: argparse.Namespace) -> dict[str, str]:
    """Each server's settings as told, and the checkout it ran from."""
    return {"A": described(args.a, args.a_tree), "B": described(args.b, args.b_tree)}


def open_loop_ab(
    served: dict[str, Server], sentences: list[str], rng: random.Random, args: argparse.Namespace
) -> None:
    """The same Poisson arrivals to both servers, chunk by chunk in mirrored order."""
    work, arrivals = open_loop_work(rng, sentences, args.open_rate, args.open_seconds)
    runs = {"A": Run("A", "open loop"), "B": Run("B", "open loop")}
    play_in_chunks(served, runs, work, arrivals, CHUNK_SECONDS)
    print(
        f"open loop: {len(work)} requests at {args.open_rate:g}/s, {CHUNK_SECONDS:g}-second "
        "chunks, half greedy and half beam 4"
    )
    print("| server | settings | answered | errors | mean ms | p50 | p95 | p99 | occupancy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, run in runs.items():
        told = servers_told(args)[name]
        latencies = [1000 * latency for latency in run.latencies]
        print(
            f"| {name} | {told} | {run.requests} | {run.errors} | {statistics.mean(latencies):.1f} "
            f"| {percentile(latencies, 0.5):.0f} | {percentile(latencies, 0.95):.0f} "
            f"| {percentile(latencies, 0.99):.0f} | {run.occupancy:.1f} |"
        )
    for label, statistic in (
        ("mean", statistics.mean),
        ("p99", lambda latencies: percentile(latencies, 0.99)),
    ):
        whole = statistic(runs["A"].latencies) / statistic(runs["B"].latencies)
        interval = paired_ratio_interval(runs["A"].parts, runs["B"].parts, statistic)
        shown = f" (95% interval {interval[0]:.3f}-{interval[1]:.3f})" if interval else ""
        print(f"A / B {label}: {whole:.3f}{shown}")
    lower = sum(
        statistics.mean(a) < statistics.mean(b)
        for a, b in zip(runs["A"].parts, runs["B"].parts, strict=True)
    )
    print(f"A's mean lower in {lower} of {len(runs['A'].parts)} chunks")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
