"""ONNX Runtime's profiler on our engine: where the decoding time goes, by operator type.

The engine profiles when asked (`EngineOptions.profile_prefix`, the product's own switch);
this module reads what the profiler wrote and reports it."""

from __future__ import annotations

import json
from pathlib import Path


def collect_profile(engine, wall_seconds: float) -> dict:
    """End the engine's profiling and summarize it against the wall time it covered."""
    files = [engine.encoder.end_profiling(), engine.decoder.end_profiling()]
    return summarize_profile(files, wall_seconds)


def summarize_profile(files: list[str], wall_seconds: float) -> dict:
    """ONNX Runtime profile events -> time inside session runs, and per operator type."""
    inside_us, by_op = 0.0, {}
    for file in files:
        for event in json.loads(Path(file).read_text()):
            if event.get("cat") == "Session" and event.get("name") == "model_run":
                inside_us += event["dur"]
            elif event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
                op = event.get("args", {}).get("op_name", "?")
                by_op[op] = by_op.get(op, 0.0) + event["dur"]
    ops = sorted(by_op.items(), key=lambda item: -item[1])
    return {"wall_s": wall_seconds, "inside_run_s": inside_us / 1e6, "ops_us": ops}


def profile_markdown(profile: dict) -> str:
    wall, inside = profile["wall_s"], profile["inside_run_s"]
    lines = [
        "### Where the time goes: ours int8, beam 4, batch 32 (ONNX Runtime profiler)",
        "",
        f"Decoding took {wall:.2f} s (warm-up and one profiled run), of which {inside:.2f} s "
        f"({inside / wall:.0%}) inside ONNX Runtime session runs; the rest is Python and "
        "numpy around them (beam bookkeeping, cache reordering, feeding inputs). Inside the "
        "runs, by operator type:",
        "",
        "| operator | seconds | share of session time |",
        "|---|---|---|",
    ]
    for op, microseconds in profile["ops_us"][:12]:
        seconds = microseconds / 1e6
        lines.append(f"| {op} | {seconds:.3f} | {seconds / inside:.0%} |")
    return "\n".join(lines)
