"""Decoder step graphs side by side: median step time of each, taking turns in one process.

    python -m bench.step_ab build/models/fr-en/decoder.int8.onnx other/decoder.int8.onnx \
        --rows 128 --rows-per-source 4

Every graph is loaded (one thread, the engine's session settings), then they run in turns,
20 steps each, 40 turns, on the same random inputs: a slow spell of the machine falls on all
of them. Prints a markdown table with each graph's median and its ratio to the first. Graphs
with the shortlist inputs get `--candidates` random candidate words. This is how the step
timings of docs/performance.md were measured.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from nmt_contract import layer_names
from service.runtime.sessions import DISABLED_OPTIMIZERS, EngineOptions, session_options


def step_inputs(args: argparse.Namespace, layers: int, heads: int, head_dim: int) -> dict:
    rng = np.random.default_rng(0)
    rows, sources = args.rows, args.rows // args.rows_per_source
    feeds = {
        "target_ids": rng.integers(3, 1000, (rows, 1)),
        "source_mask": np.ones((sources, args.source), dtype=bool),
        "top_k": np.array(args.rows_per_source + 1 if args.rows_per_source > 1 else 1),
        "positions": np.full(rows, args.past, dtype=np.int64),
        "forced_ids": np.zeros((rows, 1), dtype=np.int64),  # (no terms: one word, unread)
    }
    # Buffers with room for the position the step writes (the engine binds them as both past
    # and present; here ONNX Runtime returns present as an array of its own).
    for name in layer_names("past", layers):
        shape = (rows, heads, args.past + 1, head_dim)
        feeds[name] = rng.standard_normal(shape, dtype=np.float32)
    for name in layer_names("cross", layers):
        shape = (sources, heads, args.source, head_dim)
        feeds[name] = rng.standard_normal(shape, dtype=np.float32)
    return feeds


def step_session(
    path: Path, threads: int, shape: argparse.Namespace, spinning: bool = True
) -> tuple[ort.InferenceSession, dict, list[str]]:
    """A decoder step graph loaded as the engine loads it, with random inputs of `shape`
    (rows, rows_per_source, past, source, candidates) and the outputs a step asks for."""
    options = EngineOptions(intra_op_threads=threads, spinning=spinning)
    session = ort.InferenceSession(
        str(path),
        session_options(options),
        providers=["CPUExecutionProvider"],
        disabled_optimizers=DISABLED_OPTIMIZERS,
    )
    inputs = {i.name: i for i in session.get_inputs()}
    layers = sum(name.startswith("past_keys_") for name in inputs)
    _, heads, _, head_dim = inputs["past_keys_0"].shape
    feeds = step_inputs(shape, layers, heads, head_dim)
    if "vocabulary" in inputs:
        width = inputs["output_projection"].shape[0]
        rng = np.random.default_rng(1)
        feeds["vocabulary"] = np.sort(rng.choice(8000, shape.candidates, replace=False))
        projection = rng.standard_normal((width, shape.candidates), dtype=np.float32)
        if "output_projection_scale" in inputs:  # the int8 step's: int8 columns, their scales
            feeds["output_projection"] = rng.integers(-127, 128, projection.shape, np.int8)
            feeds["output_projection_scale"] = np.full(shape.candidates, 0.01, np.float32)
        else:
            feeds["output_projection"] = projection
    outputs = [o.name for o in session.get_outputs() if o.name.startswith("present")]
    return session, {k: v for k, v in feeds.items() if k in inputs}, outputs


def stepper(session: ort.InferenceSession, feeds: dict, outputs: list[str]) -> Callable:
    """One decoder step of a `step_session`, to time."""
    return lambda: session.run(["top_log_probs", "top_ids", *outputs], feeds)


def in_turns(runs: list[Callable[[], object]], turns: int, per_turn: int = 20) -> list[list[float]]:
    """Each run's call times (seconds), the runs taking turns `per_turn` calls at a time, so
    that a slow spell of the machine falls on all of them."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(turns):
        for timed, run in zip(times, runs, strict=True):
            for _ in range(per_turn):
                begin = time.perf_counter()
                run()
                timed.append(time.perf_counter() - begin)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.step_ab", description=__doc__)
    parser.add_argument("graphs", nargs="+", type=Path)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rows-per-source", type=int, default=1, help="beams (K)")
    parser.add_argument("--past", type=int, default=10)
    parser.add_argument("--source", type=int, default=12)
    parser.add_argument("--candidates", type=int, default=1000, help="for shortlist graphs")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument(
        "--threads",
        default="1",
        help="ONNX Runtime intra-op threads, one value for all graphs or one per graph "
        "(comma-separated; a graph may be given twice to compare thread counts)",
    )
    parser.add_argument("--no-spinning", action="store_true", help="threads sleep between runs")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also each graph's time by operator type (ONNX Runtime's profiler, 200 steps; "
        "the profiler adds a few µs to every node, so small nodes look costlier than they are)",
    )
    args = parser.parse_args(argv)

    threads = [int(t) for t in args.threads.split(",")]
    threads = threads * len(args.graphs) if len(threads) == 1 else threads
    sessions = [
        step_session(path, count, args, spinning=not args.no_spinning)
        for path, count in zip(args.graphs, threads, strict=True)
    ]
    times = in_turns([stepper(*session) for session in sessions], args.turns)
    first = statistics.median(times[0])
    print(
        f"rows {args.rows}, {args.rows_per_source} per source, past {args.past}, "
        f"source {args.source}; median of {20 * args.turns} steps each\n"
    )
    print("| graph | threads | step | ratio to the first |\n|---|---|---|---|")
    for path, count, timed in zip(args.graphs, threads, times, strict=True):
        median = statistics.median(timed)
        print(f"| {path} | {count} | {median * 1e3:.3f} ms | {median / first:.2f}x |")
    if args.profile:
        for path, count, (_, feeds, outputs) in zip(args.graphs, threads, sessions, strict=True):
            print(f"\n{path}, by operator type (share of the time inside nodes):\n")
            print(_profile(path, count, feeds, outputs))
    return 0


# The int8 graphs' weight matmuls (attention's activation-by-activation products stay float
# MatMul / FusedMatMul nodes, or live inside MultiHeadAttention, and are not counted).
INT8_MATMULS = {"DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger"}


def _profile(path: Path, threads: int, feeds: dict, outputs: list[str]) -> str:
    """A markdown table of node time by operator type over 200 profiled steps."""
    import json
    import tempfile

    options = session_options(EngineOptions(intra_op_threads=threads))
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = str(Path(folder) / "step")
        session = ort.InferenceSession(
            str(path),
            options,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=DISABLED_OPTIMIZERS,
        )
        for _ in range(200):
            session.run(["top_log_probs", "top_ids", *outputs], feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = {}
    nodes = 0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            by_op[op] = by_op.get(op, 0.0) + event["dur"]
            nodes += 1
    total = sum(by_op.values())
    matmuls = sum(t for op, t in by_op.items() if op in INT8_MATMULS)
    lines = [
        f"{nodes // 200} nodes a step; int8 weight matmuls {matmuls / total:.0%} of node time, "
        f"everything else {1 - matmuls / total:.0%}",
        "",
        "| operator | share |",
        "|---|---|",
    ]
    for op, spent in sorted(by_op.items(), key=lambda item: -item[1])[:10]:
        lines.append(f"| {op} | {spent / total:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
