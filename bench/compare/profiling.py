"""ONNX Runtime's profiler on our engine: where the decoding time goes, by operator type, and
per decoder step: the matrix products, the other kernels, ONNX Runtime's own work around them,
and the Python and numpy outside the session runs.

The engine profiles when asked (`EngineOptions.profile_prefix`, the product's own switch);
this module reads what the profiler wrote and reports it. The profiler records an event per
node, which adds a little to every node: at batch 1, where a step is many small nodes, the
shares are closer to the truth than the absolute times."""

from __future__ import annotations

import json
from pathlib import Path


def is_matmul(op: str) -> bool:
    """Matrix-product kernels (MatMul, MatMulInteger, DynamicQuantizeMatMul, MatMulNBits,
    QLinearMatMul, FusedMatMul, Gemm): the arithmetic a step cannot do without."""
    return "MatMul" in op or op == "Gemm"


def collect_profile(engine, wall_seconds: float) -> dict:
    """End the engine's profiling and summarize it against the wall time it covered."""
    return summarize_profile(
        {"encoder": engine.encoder.end_profiling(), "decoder": engine.decoder.end_profiling()},
        wall_seconds,
    )


def summarize_profile(files: dict[str, str], wall_seconds: float) -> dict:
    """ONNX Runtime profile events (a file per graph) -> time inside session runs and runs per
    graph, and kernel time per operator type, in all and in the decoder alone."""
    runs: dict[str, int] = {}
    inside_us: dict[str, float] = {}
    by_op: dict[str, float] = {}
    decoder_by_op: dict[str, float] = {}
    for graph, file in files.items():
        for event in json.loads(Path(file).read_text()):
            if event.get("cat") == "Session" and event.get("name") == "model_run":
                inside_us[graph] = inside_us.get(graph, 0.0) + event["dur"]
                runs[graph] = runs.get(graph, 0) + 1
            elif event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
                op = event.get("args", {}).get("op_name", "?")
                by_op[op] = by_op.get(op, 0.0) + event["dur"]
                if graph == "decoder":
                    decoder_by_op[op] = decoder_by_op.get(op, 0.0) + event["dur"]
    return {
        "wall_s": wall_seconds,
        "inside_run_s": sum(inside_us.values()) / 1e6,
        "ops_us": sorted(by_op.items(), key=lambda item: -item[1]),
        "runs": runs,
        "inside_run_us": inside_us,
        "decoder_ops_us": decoder_by_op,
    }


def per_step(profile: dict) -> dict[str, float] | None:
    """Microseconds per decoder step: all in (the wall time less the encoder's runs), inside
    the decoder's session run, in its matmul kernels, in its other kernels, ONNX Runtime's
    own (the run less its kernels), and outside ONNX Runtime (Python, numpy, binding)."""
    steps = profile.get("runs", {}).get("decoder", 0)
    if not steps:
        return None
    inside = profile["inside_run_us"]
    ops = profile["decoder_ops_us"]
    matmul = sum(us for op, us in ops.items() if is_matmul(op))
    kernels = sum(ops.values())
    all_in = profile["wall_s"] * 1e6 - inside.get("encoder", 0.0)
    return {
        "steps": steps,
        "all_in": all_in / steps,
        "run": inside["decoder"] / steps,
        "matmul": matmul / steps,
        "other_kernels": (kernels - matmul) / steps,
        "runtime_own": (inside["decoder"] - kernels) / steps,
        "outside": (all_in - inside["decoder"]) / steps,
    }


def profile_markdown(
    profile: dict, beam: int = 4, batch: int = 32, slowdown: float | None = None
) -> str:
    """The report of one profiled cell; `slowdown`: its profiled pass's time over the same
    pass unprofiled (the timed runs), what the profiler itself added."""
    wall, inside = profile["wall_s"], profile["inside_run_s"]
    search = "greedy" if beam == 1 else f"beam {beam}"
    lines = [
        f"### Where the time goes: ours int8, {search}, batch {batch} (ONNX Runtime profiler)",
        "",
        f"Decoding took {wall:.2f} s (warm-up and one profiled run), of which {inside:.2f} s "
        f"({inside / wall:.0%}) inside ONNX Runtime session runs; the rest is Python and "
        "numpy around them (search bookkeeping, cache moves, feeding inputs).",
    ]
    step = per_step(profile)
    if step is not None:
        total = step["all_in"]
        lines += [
            "",
            f"Per decoder step ({step['steps']:,} steps), µs:",
            "",
            "| all in | matmul kernels | other kernels | ONNX Runtime's own | outside ONNX "
            "Runtime | outside the matmuls |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {total:.0f} | {step['matmul']:.0f} | {step['other_kernels']:.0f} | "
            f"{step['runtime_own']:.0f} | {step['outside']:.0f} | "
            f"{(total - step['matmul']) / total:.0%} |",
        ]
        if slowdown:
            lines += [
                "",
                f"Profiled, the pass took {slowdown:.2f}x its time in the timed runs: the "
                "profiler's own events (one a node) are the difference, mostly in the "
                "kernels' and ONNX Runtime's columns. Read those as shares; the column outside "
                "ONNX Runtime is as it is unprofiled.",
            ]
    lines += [
        "",
        "Inside the runs, by operator type:",
        "",
        "| operator | seconds | share of session time |",
        "|---|---|---|",
    ]
    for op, microseconds in profile["ops_us"][:12]:
        seconds = microseconds / 1e6
        lines.append(f"| {op} | {seconds:.3f} | {seconds / inside:.0%} |")
    return "\n".join(lines)
