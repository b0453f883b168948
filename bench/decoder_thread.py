"""Where a server's decoding time goes under an open loop: ONNX Runtime, copies, Python.

    .venv/bin/python -m bench.decoder_thread --model-dir build/models --load 0.7 --capacity 94.2

Starts two servers as bench.service_bench does (request-level and continuous batching, the
same bundle and engine threads), each with timers wrapped around the parts of decoding:
the worker's turns (a whole batch for request-level batching, one step and its joins for
continuous), every ONNX Runtime call of the encoder and of the decoder step (by thread: the
worker, or continuous batching's encode-ahead thread), joins, the stacking of caches (a join;
rows of several beam sizes stepped together) and the moving of rows (beams reordered, leavers'
places filled). Then it plays Poisson arrivals at `--load` of `--capacity` requests/s, half
greedy and half beam 4, in chunks alternating between the servers (bench.service_bench's open
loop), and prints a markdown table per server: seconds in each part, share of the wall time
the load ran, calls, and milliseconds a call.

What it answers: how busy the worker thread is at a given load, and how much of that is the
decoder graph itself against what the scheduler adds around it (what a scheduling change can
win at most). The timers cost about a microsecond a call. A benchmark, not a test: it asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from bench.service_bench import (
    MULTI30K_TEST,
    SERVERS,
    chunks,
    ensure_bundles,
    load_sentences,
    open_loop,
    open_loop_work,
    percentile,
    server,
)

TIMERS_FILE = "NMT_BENCH_TIMERS"  # the environment variable naming a server's timers file
SERVE_WITH_TIMERS = [sys.executable, "-m", "bench.decoder_thread", "--serve-with-timers"]
WORKER = "worker"  # the scheduler's batch thread; the other threads are named by role
STEP_ROWS = "decoder graph, rows "  # + rows_bucket(rows): a step's time by its rows
PADDING = "padding share: "  # + what: summed over decoder steps

# (module, class, method, label): what is timed (the report lists the longest first).
TIMED = [
    ("service.serving.continuous", "ContinuousScheduler", "work_once", "worker turns"),
    ("service.serving.scheduler", "BatchScheduler", "_run", "worker turns"),
    ("service.serving.continuous", "ContinuousScheduler", "_join", "joins"),
    ("service.runtime.engine", "DecoderState", "extend", "stacking: a join"),
    ("service.runtime.engine", "DecoderState", "rows_together", "stacking: beam sizes together"),
    ("service.runtime.engine", "DecoderState", "select_rows", "moving rows"),
    ("service.runtime.engine", "DecoderState", "select_sources", "moving sources"),
    # The in-place layout's own (its select_sources is DecoderState's)
    ("service.runtime.engine", "InPlaceState", "extend", "stacking: a join"),
    ("service.runtime.engine", "InPlaceState", "rows_together", "stacking: beam sizes together"),
    ("service.runtime.engine", "InPlaceState", "select_rows", "moving rows"),
    ("service.runtime.engine", "InPlaceState", "reserve", "growing cache buffers"),
]


class Timers:
    """Seconds and calls per label, summed over the process's threads (without a lock: the
    worker and the encode-ahead thread seldom add to the same label at once, and a lost
    addition now and then is far below the run-to-run spread)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def add(self, name: str, value: float) -> None:
        self.seconds[name] += value
        self.calls[name] += 1

    def wrap(self, function: Callable, label: Callable[..., str] | str) -> Callable:
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                name = label if isinstance(label, str) else label(*args, **kwargs)
                self.add(name, time.perf_counter() - started)

        return timed

    def save(self, path: Path) -> None:
        totals = {name: [self.seconds[name], self.calls[name]] for name in list(self.seconds)}
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(totals))
        temporary.replace(path)


def rows_bucket(rows: int) -> str:
    """1, 2, 3-4, 5-8, 9-16, ...: the rows of a step, in powers of two."""
    if rows <= 2:
        return str(rows)
    top = 1 << (rows - 1).bit_length()
    return f"{top // 2 + 1}-{top}"


def _thread_role() -> str:
    name = threading.current_thread().name  # nmt-batch-<model>, nmt-encode-<model>, ...
    if name.startswith("nmt-batch-"):
        return WORKER
    return name.split("-")[1] if name.startswith("nmt-") else name


def serve_with_timers() -> int:
    """`nmt serve` with the timers in; they are saved every second to $NMT_BENCH_TIMERS."""
    import importlib

    import onnxruntime as ort

    import nmt_cli

    timers = Timers()
    for module, owner, method, label in TIMED:
        cls = getattr(importlib.import_module(module), owner)
        setattr(cls, method, timers.wrap(getattr(cls, method), label))

    def onnx_label(session, output_names, *args, **kwargs) -> str:
        graph = "decoder" if "top_ids" in output_names else "encoder"
        return f"ONNX Runtime: {graph} ({_thread_role()} thread)"

    run = timers.wrap(ort.InferenceSession.run, onnx_label)

    def run_and_look(session, output_names, feeds, *args, **kwargs):
        """A decoder step's time by its rows, and how much of what it attends to is padding."""
        if "past_mask" not in feeds:
            return run(session, output_names, feeds, *args, **kwargs)
        past_mask, source_mask = feeds["past_mask"], feeds["source_mask"]
        if past_mask.size:
            timers.add(f"{PADDING}cached positions", 1.0 - float(past_mask.mean()))
        timers.add(f"{PADDING}source positions", 1.0 - float(source_mask.mean()))
        started = time.perf_counter()
        try:
            return run(session, output_names, feeds, *args, **kwargs)
        finally:
            timers.add(STEP_ROWS + rows_bucket(len(past_mask)), time.perf_counter() - started)

    ort.InferenceSession.run = run_and_look

    # The in-place decoder runs through IO binding: its step's rows and source padding are
    # read from the state by the engine's method that binds it, on the same thread.
    from service.runtime.engine import Engine

    stepping = threading.local()
    run_in_place = Engine._run_in_place

    def run_in_place_and_look(engine, state, *args, **kwargs):
        stepping.rows = state.rows
        timers.add(f"{PADDING}source positions", 1.0 - float(state.source_mask.mean()))
        return run_in_place(engine, state, *args, **kwargs)

    bound_run = timers.wrap(
        ort.InferenceSession.run_with_iobinding,
        lambda *args, **kwargs: f"ONNX Runtime: decoder ({_thread_role()} thread)",
    )

    def bound_run_and_look(session, binding, *args, **kwargs):
        started = time.perf_counter()
        try:
            return bound_run(session, binding, *args, **kwargs)
        finally:
            timers.add(STEP_ROWS + rows_bucket(stepping.rows), time.perf_counter() - started)

    Engine._run_in_place = run_in_place_and_look
    ort.InferenceSession.run_with_iobinding = bound_run_and_look
    path = Path(os.environ[TIMERS_FILE])

    def save_often() -> None:
        while True:
            time.sleep(1.0)
            timers.save(path)

    threading.Thread(target=save_often, daemon=True).start()
    return nmt_cli.main(["serve"])


def table(totals: dict[str, list[float]], wall: float) -> str:
    """Markdown: every part, longest first, and the worker's turns less ONNX Runtime's calls
    on the worker thread (the scheduler's and the search's Python, and the copies listed);
    then the decoder steps by rows, and the padding they attend to."""
    lines = [
        "| part | seconds | share of the wall time | calls | ms a call |",
        "|---|---:|---:|---:|---:|",
    ]
    parts = {n: v for n, v in totals.items() if not n.startswith((STEP_ROWS, PADDING))}
    for name, (seconds, calls) in sorted(parts.items(), key=lambda item: -item[1][0]):
        lines.append(
            f"| {name} | {seconds:.1f} | {seconds / wall:.0%} | {calls} | "
            f"{1000 * seconds / max(calls, 1):.2f} |"
        )
    graphs = sum(s for name, (s, _) in totals.items() if name.endswith(f"({WORKER} thread)"))
    around = totals.get("worker turns", [0.0, 0])[0] - graphs
    lines.append(
        f"| worker turns less ONNX Runtime on the worker thread | {around:.1f} | "
        f"{around / wall:.0%} | | |"
    )
    steps = {n.removeprefix(STEP_ROWS): v for n, v in totals.items() if n.startswith(STEP_ROWS)}
    if steps:
        lines += ["", "| decoder step rows | steps | ms a step |", "|---|---:|---:|"]
        for rows, (seconds, calls) in sorted(steps.items(), key=lambda i: int(i[0].split("-")[0])):
            lines.append(f"| {rows} | {calls} | {1000 * seconds / calls:.2f} |")
    shares = [
        f"{name.removeprefix(PADDING)} {share / calls:.0%}"
        for name, (share, calls) in totals.items()
        if name.startswith(PADDING)
    ]
    if shares:
        lines += ["", "Padding, mean over the decoder steps: " + ", ".join(shares) + "."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--load", type=float, default=0.7, help="share of --capacity")
    parser.add_argument(
        "--capacity", type=float, default=0.0, help="requests/s (a bench.service_bench run's)"
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=0, help="engine threads (0: default)")
    parser.add_argument("--serve-with-timers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_with_timers:
        sys.exit(serve_with_timers())
    if args.capacity <= 0:
        parser.error("--capacity is needed: the requests/s the load is a share of")

    sentences, source = load_sentences(MULTI30K_TEST)
    threads = args.threads or max(1, (os.cpu_count() or 1) - 1)
    rng = random.Random(30)
    work, arrivals = open_loop_work(rng, sentences, args.load * args.capacity, args.seconds)
    with ExitStack() as stack:
        model_dir = ensure_bundles(args.model_dir, stack)
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-timers-")))
        served, files = {}, {}
        for name in SERVERS:
            files[name] = folder / f"{name}.json"
            os.environ[TIMERS_FILE] = str(files[name])
            settings = {"batching": name, "threads": threads}
            served[name] = stack.enter_context(
                server(model_dir, folder, settings, command=SERVE_WITH_TIMERS)
            )
        os.nice(10)  # the load generator yields to the servers, as in bench.service_bench
        wall = dict.fromkeys(SERVERS, 0.0)
        latencies: dict[str, list[float]] = {name: [] for name in SERVERS}
        for chunk, (chunk_work, chunk_arrivals) in enumerate(chunks(work, arrivals, 5.0)):
            for name in SERVERS if chunk % 2 == 0 else tuple(reversed(SERVERS)):
                answered, _, seconds, _ = asyncio.run(
                    open_loop(served[name].url, chunk_work, chunk_arrivals)
                )
                latencies[name] += answered
                wall[name] += seconds
        time.sleep(2.5)  # the servers save their timers every second
        totals = {name: json.loads(files[name].read_text()) for name in SERVERS}
    print(
        f"{args.load:.0%} of {args.capacity:g} requests/s for {args.seconds:g} s, {threads} "
        f"engine thread(s), sentences: {source}\n"
    )
    for name in SERVERS:
        p50, p99 = (percentile(latencies[name], q) for q in (0.5, 0.99))
        print(
            f"### {name}: {len(latencies[name])} requests in {wall[name]:.1f} s, p50 "
            f"{1000 * p50:.0f} ms, p99 {1000 * p99:.0f} ms\n\n{table(totals[name], wall[name])}\n"
        )


if __name__ == "__main__":
    main()
