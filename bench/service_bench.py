"""Service throughput and latency under closed and open loops, against the engine alone.

    .venv/bin/python -m bench.service_bench --model-dir build/models
    .venv/bin/python -m bench.service_bench --baseline-tree /tmp/before   (before and after)

Starts `nmt serve` on a free loopback port, serving the same bundle (the committed
checkpoint, exported to a temporary folder, unless --model-dir is given), and with
`--baseline-tree` (another checkout: `git worktree add /tmp/before HEAD`) or `--baseline`
(other settings) a second one beside it, the baseline; both get the same engine threads and
take turns, so that a change is measured side by side in one run.

* Closed loop: 1, 8, 32 and 64 clients, greedy, each sending its next one-sentence request when
  the previous one is answered. With a baseline the work alternates between the servers in
  rounds (halves, or more where the level is quick: at least 8 requests per client a round),
  in mirrored order (A, B, B, A, ...), so that a change in background load hits both alike.
  Throughput is the steady state's, without the start (all clients at once) and the end
  (fewer and fewer).
* Open loop: Poisson arrivals at 50%, 70% and 90% of the measured capacity (the closed-loop
  throughput at 64 clients on the same mix, the lower of the servers'), the same arrival
  times and requests for every server: sentences of every length, half greedy and half
  beam 4. The arrivals are played in chunks of a few seconds, alternating between the servers
  in mirrored order: near capacity, a machine that slows by a fifth for a minute (as this one
  does) would otherwise overload whichever server ran then, and decide the p99. Each chunk
  starts from an empty server and ends with its last answer, so the p99 ratio to the
  baseline gets a 95% bootstrap interval over the chunks. `--clients ''` plays the open loop
  only.
* The engine alone, on the same sentences at batch 1 and 32 with the same threads: the
  ceiling that batching in the service can reach. It runs in a process of its own at the
  servers' priority, before every closed-loop level and after the last; a level is compared
  with the mean of the runs just before and after it.
* Where the CPU goes, per request: the server's engine thread (decoding), the rest of the
  server (its event loop: HTTP, validation, tokenization), and the load generator, which shares
  the cores. Read from /proc on Linux, so that a gap to the engine alone can be told apart from
  a load generator that cannot keep up.

Servers come from bench.harness, the clients and loops from bench.load. Writes the "service"
section of docs/benchmarks.md. A benchmark, not a test: it reports what it measured and
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.harness import ROOT, described, running_server, temporary_bundles
from bench.load import (
    MIX,
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
    rounds,
    settings,
)
from bench.report import opening, replace_section

REPORT = ROOT / "docs" / "benchmarks.md"
THIS, BASELINE = "this", "baseline"  # this checkout's server; the one it is compared with


class EngineAlone:
    """The engine alone in a process of its own (`--engine-worker`), started before the load
    generator lowers its priority, so that it decodes at the servers' priority; `measure()`
    asks it for one run."""

    def __init__(self, model_dir: Path, sentences: list[str], threads: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.service_bench", "--engine-worker"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        job = {"model_dir": str(model_dir), "sentences": sentences, "threads": threads}
        self._ask(json.dumps(job))
        self.runs: list[dict[int, float]] = []

    def _ask(self, line: str) -> str:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise SystemExit("the engine-alone worker died")
        return answer

    def measure(self) -> dict[int, float]:
        speeds = {int(batch): value for batch, value in json.loads(self._ask("run")).items()}
        self.runs.append(speeds)
        print(
            f"engine alone: {speeds[1]:.1f} sentences/s at batch 1, {speeds[32]:.1f} at 32",
            file=sys.stderr,
        )
        return speeds

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(60)


def engine_worker() -> None:
    """`--engine-worker`: a job (JSON) on the first line of stdin, then one run per line."""
    job = json.loads(sys.stdin.readline())
    ceiling = engine_ceiling(Path(job["model_dir"]), job["sentences"], job["threads"])
    print("{}", flush=True)
    for _ in sys.stdin:
        print(json.dumps(ceiling()), flush=True)


def engine_ceiling(
    model_dir: Path, sentences: list[str], threads: int
) -> Callable[[], dict[int, float]]:
    """A function giving greedy sentences per second of the engine alone at batch 1 and 32,
    with `threads` (batch 32: the median of three passes)."""
    from service.runtime.bundle import load_bundle
    from service.runtime.search import SearchOptions
    from service.runtime.sessions import EngineOptions
    from service.runtime.translator import Translator
    from service.serving.registry import find_bundles

    options = EngineOptions(intra_op_threads=threads, spinning=False)
    translator = Translator(load_bundle(find_bundles(model_dir)[0]), options)
    sources = translator.tokenizer.encode(sentences[:128])
    greedy = SearchOptions()
    translator.translate_ids(sources[:32], greedy, 32)  # warm-up

    def speed(batch: int) -> float:
        started = time.perf_counter()
        translator.translate_ids(sources, greedy, batch)
        return len(sources) / (time.perf_counter() - started)

    def run() -> dict[int, float]:
        return {1: speed(1), 32: statistics.median(speed(32) for _ in range(3))}

    return run


def _default(name: str) -> object:
    from service.serving.settings import Settings

    return Settings.model_fields[name].default


def _row(run: Run, extra: str = "") -> str:
    errors = f" ({run.errors} errors)" if run.errors else ""
    parts = ("engine", "server", "client")
    cpu = " / ".join(f"{run.cpu_ms_per_request(part):.1f}" for part in parts)
    return (
        f"| {run.label} | {run.server} | {run.requests}{errors} | {run.throughput:.1f} | "
        f"{run.percentile(0.5) * 1000:.0f} | {run.percentile(0.95) * 1000:.0f} | "
        f"{run.percentile(0.99) * 1000:.0f} | {run.occupancy:.1f} | {cpu} |{extra}"
    )


def paired_rounds(closed: list[Run]) -> list[str]:
    """A line per closed-loop level played in 4 rounds or more on both servers: this server's
    requests/s over the baseline's, round by round (each round's requests on both servers in
    turn), median and range. Drift of the machine between rounds falls out of each ratio."""
    runs = {(run.label, run.server): run for run in closed}
    lines = []
    for label in dict.fromkeys(run.label for run in closed):
        if (label, BASELINE) not in runs:
            continue
        baseline, this = runs[label, BASELINE], runs[label, THIS]
        if len(baseline.rounds) < 4 or len(baseline.rounds) != len(this.rounds):
            continue
        ratios = [t / b for t, b in zip(this.rounds, baseline.rounds, strict=True)]
        median = statistics.median(ratios)
        lines.append(
            f"{label}, round by round ({len(ratios)} rounds, each played by both servers in "
            f"turn): this / baseline requests/s, median {median:.2f}x, "
            f"from {min(ratios):.2f}x to {max(ratios):.2f}x."
        )
    return lines


def p99_ratio_interval(
    baseline: Run, this: Run, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A 95% bootstrap interval of this server's p99 over the baseline's, resampling the open
    loop's chunks (bench.load.paired_ratio_interval). None with fewer than 10 chunks."""

    def p99(latencies: list[float]) -> float:
        return percentile(latencies, 0.99)

    return paired_ratio_interval(this.parts, baseline.parts, p99, resamples, seed)


def _closed_loop_section(
    closed: list[Run], engine: list[dict[int, float]], head: str, rule: str
) -> list[str]:
    lines = [
        "",
        "### Closed loop, greedy",
        "",
        "Each client sends its next request when the previous one is answered. req/s is "
        "the steady state's: answers from the moment the first `clients` requests are "
        "answered (the start, all clients at once, has passed) to the moment the first "
        "client finds no work left (fewer are busy from then on); latency and CPU count "
        "every request.",
        "",
        head + " vs engine alone at batch 32 |",
        rule + "---:|",
    ]
    for run in closed:
        lines.append(_row(run, f" {run.throughput / run.ceiling:.0%} |"))
    batch_1, batch_32 = ([f"{r[batch]:.1f}" for r in engine] for batch in (1, 32))
    lines += ["", *paired_rounds(closed)]
    lines += [
        "",
        "The engine alone (its own process, no HTTP), greedy, in sentences/s, before each level "
        f"and after the last: {', '.join(batch_1)} at batch 1; {', '.join(batch_32)} at batch "
        "32. Each level is compared with the mean of the runs just before and after it.",
    ]
    return lines


def _open_loop_section(
    opened: list[Run], capacity: dict[str, float], setup: dict[str, str], head: str, rule: str
) -> list[str]:
    compared = BASELINE in capacity
    if setup["capacity"]:
        told = f"Capacity: {setup['capacity']} requests/s, given (`--capacity`, an earlier run's)."
    else:
        measured = ", ".join(f"{value:.1f} {name}" for name, value in capacity.items())
        lower = f"; the loads below are shares of the lower, {min(capacity.values()):.1f}"
        told = (
            f"Capacity: closed-loop requests/s at 64 clients on the same mix, {measured}"
            f"{lower if compared else ''}."
        )
    lines = [
        "",
        "### Open loop, half greedy and half beam 4",
        "",
        "Poisson arrivals at a share of the capacity"
        + (
            f", the same arrival times and requests for both servers, played in chunks of "
            f"{setup['chunk']} s that alternate between them (mirrored). "
            if compared
            else f", played in chunks of {setup['chunk']} s, each from an empty server. "
        )
        + told,
        "",
        head + (" p99 vs baseline (95% interval) |" if compared else ""),
        rule + ("---:|" if compared else ""),
    ]
    by_label = {(run.label, run.server): run for run in opened}
    for run in opened:
        if not compared:
            lines.append(_row(run))
        elif run.server == BASELINE:
            lines.append(_row(run, " |"))
        else:
            base = by_label[run.label, BASELINE]
            ratio = run.percentile(0.99) / base.percentile(0.99)
            interval = p99_ratio_interval(base, run)
            within = f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else ""
            lines.append(_row(run, f" {ratio:.2f}x{within} |"))
    if compared:
        lines += [
            "",
            "The interval: 2,000 bootstrap resamples of the chunks (each played by both "
            "servers, from an empty server to its last answer), the p99 ratio of each "
            "resample; none under 10 chunks.",
        ]
    return lines


def report(
    closed: list[Run],
    opened: list[Run],
    engine: list[dict[int, float]],
    capacity: dict[str, float],
    setup: dict[str, str],
) -> str:
    head = (
        "| load | server | requests | req/s | p50 ms | p95 ms | p99 ms | mean occupancy "
        "| CPU ms/request: engine / server / client |"
    )
    rule = "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    lines = opening(
        "Service: throughput and latency" + (", against a baseline" if setup["servers"] else ""),
        "bench.service_bench",
        f", load average before the run {setup['load']}",
    )
    lines += [
        f"- model: {setup['model']}; engine threads: {setup['threads']} in the server(s) and "
        f"in the engine alone; NMT_MAX_BATCH_SIZE={_default('max_batch_size')}, other "
        "settings at their defaults, translation cache off"
        + (f"; servers: {setup['servers']}" if setup["servers"] else ""),
        f"- the load generator shares the machine's cores with the servers, at niceness "
        f"+{setup['niceness']} (it yields to them, as on a machine of its own)",
        f"- requests: one sentence each, {setup['sentences']}; latency measured by the client; "
        "mean occupancy: sentences per decoder step, from the server's counters "
        "((output tokens + sentences) / decoder steps)",
        "- CPU ms/request: CPU time per answered request of the server's engine threads "
        "(decoding, and encoding ahead), of its event loop (HTTP, validation, tokenization) and "
        "of the load generator (aiohttp clients), from /proc",
    ]
    if closed:
        lines += _closed_loop_section(closed, engine, head, rule)
    lines += _open_loop_section(opened, capacity, setup, head, rule)
    lines += [
        "",
        "What the numbers say: [service.md, Performance](service.md#performance).",
    ]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--sentences", type=Path, default=MULTI30K_TEST)
    parser.add_argument(
        "--clients", default="1,8,32,64", help="closed loop client counts ('': open loop only)"
    )
    parser.add_argument("--requests-per-client", type=int, default=12)
    parser.add_argument("--min-requests", type=int, default=48)
    parser.add_argument("--loads", default="0.5,0.7,0.9", help="open loop shares of capacity")
    parser.add_argument("--open-seconds", type=float, default=60.0)
    parser.add_argument(
        "--capacity",
        type=float,
        default=0.0,
        help="open loop: requests/s the loads are shares of, instead of measuring it "
        "(to play an earlier run's arrival rate)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="engine threads (0: the server's default)"
    )
    parser.add_argument(
        "--client-niceness",
        type=int,
        default=10,
        help="niceness added to the load generator once the servers run (0: same priority)",
    )
    parser.add_argument(
        "--chunk-seconds",
        type=float,
        default=5.0,
        help="open loop: the arrivals are played in chunks this long, alternating servers",
    )
    parser.add_argument(
        "--settings", nargs="*", default=[], help="NAME=VALUE settings of this checkout's server"
    )
    parser.add_argument(
        "--baseline",
        nargs="*",
        default=None,
        help="NAME=VALUE settings of a baseline server beside it (given alone: the defaults)",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="checkout the baseline server runs from (e.g. `git worktree add /tmp/before "
        "HEAD`; its `python -m nmt_cli` imports that tree's packages, the same virtual "
        "environment's dependencies)",
    )
    parser.add_argument(
        "--baseline-model-dir",
        type=Path,
        help="bundles folder of the baseline server, when its tree reads another bundle format "
        "(exported by that tree's `nmt export`)",
    )
    parser.add_argument(
        "--requests-log",
        type=Path,
        help="open loop: write every request as played on every server (JSON lines: server, "
        "load, chunk, arrival, beam, words, latency), to compare servers request by request",
    )
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--engine-worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.engine_worker:
        engine_worker()
        return

    sentences, source = load_sentences(args.sentences)
    threads = args.threads or max(1, (os.cpu_count() or 1) - 1)
    compared = args.baseline is not None or args.baseline_tree is not None
    configs = {THIS: (settings(args.settings), ROOT)}
    if compared:
        configs = {BASELINE: (settings(args.baseline or []), args.baseline_tree or ROOT), **configs}
    names = tuple(configs)
    setup = {
        "load": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "threads": str(threads),
        "sentences": source,
        "niceness": str(args.client_niceness),
        "chunk": f"{args.chunk_seconds:g}",
        "capacity": f"{args.capacity:g}" if args.capacity else "",
        "servers": (
            f"{THIS} ({described(args.settings, None)}), "
            f"{BASELINE} ({described(args.baseline or [], args.baseline_tree)})"
            if compared
            else ""
        ),
    }
    rng = random.Random(30)
    closed: list[Run] = []
    opened: list[Run] = []
    with ExitStack() as stack:
        model_dir = args.model_dir or temporary_bundles(stack)
        engine = EngineAlone(model_dir, sentences, threads)
        stack.callback(engine.close)
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-bench-logs-")))
        # A baseline tree of another bundle format serves its own export (--baseline-model-dir)
        dirs = {name: model_dir for name in configs}
        if args.baseline_model_dir is not None and compared:
            dirs[BASELINE] = args.baseline_model_dir
        served = {
            name: stack.enter_context(
                running_server(dirs[name], log_dir, tree, **(SERVED | {"threads": threads} | told))
            )
            for name, (told, tree) in configs.items()
        }
        setup["model"] = ", ".join(
            f"{m['name']} ({m['precision']})"
            for m in httpx.get(f"{served[THIS].url}/v1/models").json()["models"]
        )
        # The load generator yields to the servers (started at our priority, and measured
        # against the engine alone at that priority), as it would on a machine of its own.
        os.nice(args.client_niceness)
        engine.measure()
        for clients in (int(c) for c in args.clients.split(",") if c.strip()):
            count = max(args.min_requests, args.requests_per_client * clients)
            work = [(rng.choice(sentences), 1) for _ in range(count)]
            level = {name: Run(name, f"{clients} clients") for name in names}
            for server in served.values():  # warm the connections and the shapes
                asyncio.run(closed_loop(server.url, work[: min(clients, 8)], clients))
            for number, part in enumerate(rounds(work, clients)):
                for name in names if number % 2 == 0 else names[::-1]:
                    load = closed_loop(served[name].url, part, clients)
                    measure(level[name], served[name], load)
            before, after = engine.runs[-1][32], engine.measure()[32]
            for run in level.values():
                run.ceiling = (before + after) / 2
                closed.append(run)
                print(
                    f"{run.label}, {run.server}: {run.throughput:.1f} req/s, p99 "
                    f"{run.percentile(0.99) * 1000:.0f} ms",
                    file=sys.stderr,
                )

        mix = [(rng.choice(sentences), rng.choice(MIX)) for _ in range(768)]
        if args.capacity:  # given: the same arrival rate as an earlier run's
            capacity = dict.fromkeys(names, args.capacity)
        else:
            probes = {name: Run(name, "capacity") for name in names}
            for half, name in enumerate([*names, *reversed(names)]):  # halves, mirrored
                part = mix[: len(mix) // 2] if half < len(names) else mix[len(mix) // 2 :]
                measure(probes[name], served[name], closed_loop(served[name].url, part, 64))
            capacity = {name: probe.throughput for name, probe in probes.items()}
        print(f"capacity on the mix: {capacity}", file=sys.stderr)
        for index, share in enumerate(float(x) for x in args.loads.split(",")):
            rate = share * min(capacity.values())
            work, arrivals = open_loop_work(rng, sentences, rate, args.open_seconds)
            level = {name: Run(name, f"{share:.0%} load") for name in names}
            play_in_chunks(served, level, work, arrivals, args.chunk_seconds, first=index)
            for run in level.values():
                opened.append(run)
                print(
                    f"{run.label}, {run.server}: p99 {run.percentile(0.99) * 1000:.0f} ms",
                    file=sys.stderr,
                )
    opened.sort(key=lambda run: (run.label, names.index(run.server)))
    if args.requests_log:
        with args.requests_log.open("w") as log:
            for run in opened:
                for record in run.played:
                    log.write(json.dumps({"server": run.server, "load": run.label, **record}))
                    log.write("\n")
    text = report(closed, opened, engine.runs, capacity, setup)
    replace_section("service", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
