"""How fast this CPU multiplies at the bundle's matmul shapes: int8 against fp32, G multiply-adds/s.

    python -m bench.gemm_rate --bundle build/models/fr-en

At 32 sentences a translation is mostly matmuls (int8 matmuls are 82% of the encoder in ONNX
Runtime's profiler on an AMD EPYC with AVX2, 76% on an Intel Xeon with AMX), so how far one
engine can get ahead of another that runs the same class of kernels is bounded by the
kernels' rate. This measures it alone, away from the rest of a translation: for every
distinct [K, N] weight of the bundle's int8 graphs (read from their MatMulInteger nodes) and
for row counts a translation meets (1: a greedy step at batch 1; 4: a beam-4 step; 17: one
sentence through the encoder; 128: a beam-4 step at batch 32; 640: the encoder at 32
sentences), one-node graphs of
* fp32: MatMul, the weights as fp32;
* int8: DynamicQuantizeMatMul (activations quantized to u8 per call, s8 weights): what ONNX
  Runtime fuses the bundle's DynamicQuantizeLinear + MatMulInteger into,
taking turns on one thread, median of the rounds. Writes the "gemm-rate" section of
docs/performance.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.report import cpu_model, replace_section, reproduce

ROOT = Path(__file__).resolve().parent.parent
ROWS = (1, 4, 17, 128, 640)
INT8_GRAPHS = ("encoder.int8.onnx", "decoder.int8.onnx")
# The IR version ONNX Runtime 1.31 reads (the onnx package writes a newer one by default)
IR_VERSION = 9


def weight_shapes(bundle: Path) -> list[tuple[int, int]]:
    """The distinct [K, N] of the int8 weights of the bundle's MatMulInteger nodes, sorted."""
    shapes = set()
    for name in INT8_GRAPHS:
        model = onnx.load(str(bundle / name))
        weights = {t.name: tuple(t.dims) for t in model.graph.initializer if len(t.dims) == 2}
        for node in model.graph.node:
            if node.op_type == "MatMulInteger" and node.input[1] in weights:
                shapes.add(weights[node.input[1]])
    return sorted(shapes)


def matmul_session(kind: str, weight: np.ndarray, scale: float) -> ort.InferenceSession:
    """A one-node graph y [M, N] = x [M, K] @ weight: fp32 MatMul over the dequantized weight
    (`kind` "fp32"), or DynamicQuantizeMatMul over the s8 weight and its scale ("int8")."""
    rows, columns = weight.shape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", rows])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", columns])
    if kind == "fp32":
        initializers = [numpy_helper.from_array(weight.astype(np.float32) * scale, "w")]
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    else:
        initializers = [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.array(scale, dtype=np.float32), "scale"),
            numpy_helper.from_array(np.array(0, dtype=np.int8), "zero"),
        ]
        node = helper.make_node(
            "DynamicQuantizeMatMul", ["x", "w", "scale", "zero"], ["y"], domain="com.microsoft"
        )
    graph = helper.make_graph([node], kind, [x], [y], initializers)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def measure(shape: tuple[int, int], rows: int, rounds: int, seconds: float) -> dict[str, float]:
    """Seconds a product [rows, K] x [K, N] takes, fp32 and int8 (median of `rounds` rounds
    of about `seconds` each, the two taking turns)."""
    generator = np.random.default_rng(0)
    weight = generator.integers(-127, 128, size=shape, dtype=np.int8)
    sessions = {kind: matmul_session(kind, weight, 0.01) for kind in ("fp32", "int8")}
    x = {"x": generator.standard_normal((rows, shape[0])).astype(np.float32)}
    for session in sessions.values():  # warm: weights packed, buffers allocated
        session.run(None, x)
    calls = max(1, int(seconds / _one_call(sessions["int8"], x)))
    times: dict[str, list[float]] = {kind: [] for kind in sessions}
    for turn in range(rounds):
        for kind in sessions if turn % 2 == 0 else list(sessions)[::-1]:
            started = time.perf_counter()
            for _ in range(calls):
                sessions[kind].run(None, x)
            times[kind].append((time.perf_counter() - started) / calls)
    return {kind: statistics.median(values) for kind, values in times.items()}


def _one_call(session: ort.InferenceSession, x: dict[str, np.ndarray]) -> float:
    started = time.perf_counter()
    session.run(None, x)
    return max(time.perf_counter() - started, 1e-6)


def table(results: dict[tuple[tuple[int, int], int], dict[str, float]]) -> str:
    lines = [
        "| weight [K, N] | rows | fp32 µs | int8 µs | fp32 G multiply-adds/s | "
        "int8 G multiply-adds/s | int8 speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (shape, rows), seconds in results.items():
        work = rows * shape[0] * shape[1]
        fp32, int8 = seconds["fp32"], seconds["int8"]
        lines.append(
            f"| {shape[0]} x {shape[1]} | {rows} | {fp32 * 1e6:.1f} | {int8 * 1e6:.1f} | "
            f"{work / fp32 / 1e9:.1f} | {work / int8 / 1e9:.1f} | {fp32 / int8:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundle", type=Path, default=ROOT / "build/models/fr-en")
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.05, help="per round and kind")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/performance.md")
    args = parser.parse_args()

    results = {}
    for shape in weight_shapes(args.bundle):
        for rows in args.rows:
            results[(shape, rows)] = measure(shape, rows, args.rounds, args.seconds)
            print(f"{shape} x {rows} rows: done", flush=True)
    report = "\n".join(
        [
            f"Reproduce: `{reproduce('bench.gemm_rate')}` ({cpu_model()}; one thread; the "
            f"bundle's int8 weight shapes; median of {args.rounds} rounds, fp32 and int8 "
            "taking turns)",
            "",
            table(results),
        ]
    )
    print(report)
    replace_section("gemm-rate", report, args.out)


if __name__ == "__main__":
    main()
