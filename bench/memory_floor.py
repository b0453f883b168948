"""The memory-bound floor of a batch-1 greedy token, against the measured step.

    python -m bench.memory_floor --bundle build/models/fr-en

At batch 1 a decoder step multiplies one row by every weight matrix once: each weight byte
is read once and used for one multiply-add, so the step cannot be faster than the time to
read the weights. This script
* sums the bytes of the weights a step reads, from the decoder graph itself (the matrices
  of the matmuls, biases and norms; of the embedding tables only the one row it gathers);
* measures single-thread read bandwidth (a BLAS dot product), for a working set the size of
  the weights (they stay in the last-level cache between steps when nothing else runs) and
  for one far larger than any cache (main memory);
* times a batch-1 greedy decoder step of the engine (one thread, a 10-token past, a
  12-token source), median over turns;
and writes the floor (bytes / bandwidth) and the step's ratio to it into docs/performance.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from bench.report import replace_section

GATHERED = {"Gather"}  # tables a step reads one row of, not whole


def weight_bytes(graph_path: Path) -> dict[str, int]:
    """Bytes of the initializers a batch-1 step reads: whole, except gathered tables."""
    model = onnx.load(str(graph_path))
    initializers = {t.name: t for t in model.graph.initializer}
    gathered = {
        node.input[0] for node in model.graph.node if node.op_type in GATHERED
    } & initializers.keys()
    whole, rows = 0, 0
    for name, tensor in initializers.items():
        array = numpy_helper.to_array(tensor)
        if name in gathered:
            rows += array[0].nbytes if array.ndim else array.nbytes
        else:
            whole += array.nbytes
    return {"whole": whole, "gathered_rows": rows, "total": whole + rows}


def read_bandwidth(size_bytes: int, seconds: float = 1.0) -> float:
    """Single-thread read bandwidth (bytes/s): the dot product of the two halves of a float32
    array of about size_bytes (BLAS reads each byte once, vectorized; numpy's sum and max
    are slower than the memory they read), median over repeated passes for about `seconds`."""
    array = np.ones(max(size_bytes // 8, 512) * 2, dtype=np.float32)  # an even length
    first, second = array[: len(array) // 2], array[len(array) // 2 :]
    first.dot(second)  # touch every page
    passes, deadline = [], time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(passes) < 5:
        begin = time.perf_counter()
        first.dot(second)
        passes.append(time.perf_counter() - begin)
    return array.nbytes / statistics.median(passes)


def step_seconds(bundle: Path, int8: bool, turns: int = 2000) -> float:
    """Median batch-1 decoder step of the engine (one thread)."""
    from service.runtime.bundle import load_bundle
    from service.runtime.engine import Engine
    from service.runtime.sessions import EngineOptions

    engine = Engine(load_bundle(bundle), EngineOptions(int8=int8, intra_op_threads=1))
    rng = np.random.default_rng(0)
    source = np.array([[*rng.integers(3, engine.vocab_size, 11), engine.eos_id]])
    state = engine.start(source, source != engine.pad_id)
    tokens = np.zeros(1, dtype=np.int64)
    for _ in range(10):  # a 10-token past
        engine.step(state, tokens, top_k=1)
    positions = state.positions  # each step writes position 10 again: the same work
    times = []
    for _ in range(turns):
        state.positions = positions
        begin = time.perf_counter()
        engine.step(state, tokens, top_k=1)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def report(bundle: Path) -> str:
    rows = []
    for int8 in (True, False):
        graph = bundle / ("decoder.int8.onnx" if int8 else "decoder.onnx")
        sizes = weight_bytes(graph)
        cache_bw = read_bandwidth(sizes["total"])
        memory_bw = read_bandwidth(1 << 30)
        step = step_seconds(bundle, int8)
        rows.append((int8, sizes, cache_bw, memory_bw, step))
    lines = [
        "## The memory-bound floor of a batch-1 token",
        "",
        "Reproduce: `python -m bench.memory_floor --bundle build/models/fr-en` "
        f"({platform.processor() or platform.machine()}, one thread).",
        "",
        "At batch 1 a step reads every weight once for one multiply-add: it cannot take less "
        "than weight bytes / read bandwidth. Bandwidth is a single-thread BLAS dot product over "
        "an array the size of the weights (cache: between two steps nothing else evicts them) "
        "and over 1 GiB (main memory). The step is the engine's, median of 2,000 (batch 1, "
        "greedy, 10-token past, 12-token source, Python call included).",
        "",
        "| graph | weight bytes read | cache bandwidth | floor (cache) | memory bandwidth "
        "| floor (memory) | step | step / floor (memory) | step / floor (cache) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for int8, sizes, cache_bw, memory_bw, step in rows:
        floor_cache, floor_memory = sizes["total"] / cache_bw, sizes["total"] / memory_bw
        lines.append(
            f"| {'int8' if int8 else 'fp32'} | {sizes['total'] / 1e6:.2f} MB | "
            f"{cache_bw / 1e9:.1f} GB/s | {floor_cache * 1e3:.3f} ms | "
            f"{memory_bw / 1e9:.1f} GB/s | {floor_memory * 1e3:.3f} ms | {step * 1e3:.3f} ms | "
            f"{step / floor_memory:.2f}x | {step / floor_cache:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_floor", description=__doc__)
    parser.add_argument("--bundle", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--out", type=Path, default=Path("docs/performance.md"))
    args = parser.parse_args(argv)
    markdown = report(args.bundle)
    replace_section("memory-floor", markdown, args.out)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
