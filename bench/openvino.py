"""ONNX Runtime's OpenVINO execution provider against its default CPU provider, on our graphs.

    pip install onnxruntime-ep-openvino==1.8.1     (a plugin for the onnxruntime installed)
    python -m bench.openvino --bundle build/models/fr-en

Issue 39 asked whether OpenVINO's CPU kernels (VNNI and AMX on Intel) pay for our int8
graphs, as an optional provider with the CPU provider as the fallback. This measures it
where it can be measured, and says where it cannot:

* The plugin registers with ONNX Runtime (`register_execution_provider_library`) and offers
  the devices it can run on (`get_ep_devices`). Where it offers no CPU device (it offers
  Intel's only), the report says so, with the CPU's vendor as ONNX Runtime saw it.
* Else each graph (encoder and decoder step, fp32 and int8) is loaded twice: as the engine
  loads it, and with the OpenVINO device first and the CPU provider for what OpenVINO does
  not take (our step's contrib operators, MultiHeadAttention and GroupQueryAttention, are
  ONNX Runtime's own). A profiled run says how many nodes each provider got; the two
  sessions then take turns (bench.step_ab.in_turns) on the same inputs, with the largest
  difference between their outputs.

The plugin is not in the project's extras (158 MB, for a benchmark): install it by hand.
Writes the "openvino" section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort

from bench.report import opening, replace_section
from bench.step_ab import in_turns, step_inputs
from service.runtime.sessions import DISABLED_OPTIMIZERS, EngineOptions, session_options

PLUGIN = "onnxruntime-ep-openvino==1.8.1"
PROVIDER = "OpenVINOExecutionProvider"
SOURCE_TOKENS = 12
_registered = False


def openvino_cpu_devices() -> tuple[list, str]:
    """The OpenVINO plugin's CPU devices, and why there are none when there are none."""
    try:
        import onnxruntime_ep_openvino as plugin
    except ImportError:
        return [], f"the plugin is not installed (`pip install {PLUGIN}`)"
    global _registered
    if not _registered:  # (once a process: ONNX Runtime refuses a second registration)
        ort.register_execution_provider_library(PROVIDER, plugin.get_library_path())
        _registered = True
    offered = ort.get_ep_devices()
    found = [
        device
        for device in offered
        if device.ep_name == PROVIDER and device.device.type == ort.OrtHardwareDeviceType.CPU
    ]
    if found:
        return found, ""
    seen = ", ".join(
        f"{device.ep_name} on a {device.device.type.name} of vendor {device.device.vendor} "
        f"(id {device.device.vendor_id:#06x})"
        for device in offered
    )
    return [], f"the plugin registered and offered no CPU device; ONNX Runtime offers: {seen}"


def open_graph(
    path: Path, threads: int, devices: list, profile_prefix: str = ""
) -> ort.InferenceSession:
    """A graph as the engine opens it (devices empty), or with the OpenVINO devices first."""
    settings = session_options(EngineOptions(intra_op_threads=threads))
    if profile_prefix:
        settings.enable_profiling = True
        settings.profile_file_prefix = profile_prefix
    if devices:
        settings.add_provider_for_devices(devices, {"num_of_threads": str(threads)})
        return ort.InferenceSession(str(path), settings, disabled_optimizers=DISABLED_OPTIMIZERS)
    return ort.InferenceSession(
        str(path), settings, providers=["CPUExecutionProvider"],
        disabled_optimizers=DISABLED_OPTIMIZERS,
    )  # fmt: skip


def nodes_by_provider(profile: Path) -> Counter[str]:
    """How many nodes of one run each provider ran, from ONNX Runtime's profile."""
    events = json.loads(profile.read_text())
    runs = sum(e.get("cat") == "Session" and e["name"] == "model_run" for e in events)
    placed = Counter(
        e["args"].get("provider", "?")
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
    )
    return Counter({provider: count // max(runs, 1) for provider, count in placed.items()})


@dataclass
class Case:
    name: str
    graph: Path
    feeds: dict[str, np.ndarray]
    outputs: list[str] | None  # None: all


def cases(bundle: Path, rows: list[int]) -> list[Case]:
    """The encoder on `rows` sentences and a decoder step of `rows` rows (greedy: one row a
    source), fp32 and int8, on random inputs of bench.step_ab's shapes."""
    found = []
    rng = np.random.default_rng(0)
    for suffix in ("", ".int8"):
        for count in rows:
            source = rng.integers(4, 7000, (count, SOURCE_TOKENS))
            feeds = {"source_ids": source, "source_mask": np.ones_like(source, dtype=bool)}
            encoder = bundle / f"encoder{suffix}.onnx"
            found.append(Case(f"encoder{suffix}, {count}", encoder, feeds, None))
        step = bundle / f"decoder{suffix}.onnx"
        inputs = {i.name: i for i in ort.InferenceSession(str(step)).get_inputs()}
        layers = sum(name.startswith("past_keys_") for name in inputs)
        _, heads, _, head_dim = inputs["past_keys_0"].shape
        for count in rows:
            shape = SimpleNamespace(rows=count, rows_per_source=1, past=10, source=SOURCE_TOKENS)
            feeds = step_inputs(shape, layers, heads, head_dim)
            found.append(
                Case(f"decoder step{suffix}, {count}", step, feeds, ["top_log_probs", "top_ids"])
            )
    return found


def measure(case: Case, devices: list, threads: int, turns: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        placed = {}
        for label, chosen in (("cpu", []), ("openvino", devices)):
            profiled = open_graph(case.graph, threads, chosen, str(Path(folder) / label))
            profiled.run(case.outputs, case.feeds)
            placed[label] = nodes_by_provider(Path(profiled.end_profiling()))
    sessions = [open_graph(case.graph, threads, chosen) for chosen in ([], devices)]
    results = [session.run(case.outputs, case.feeds) for session in sessions]
    difference = max(
        float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
        for a, b in zip(*results, strict=True)
    )
    times = in_turns([lambda s=s: s.run(case.outputs, case.feeds) for s in sessions], turns)
    cpu, openvino = (statistics.median(t) for t in times)
    return {
        "cpu": cpu,
        "openvino": openvino,
        "placed": placed["openvino"],
        "difference": difference,
    }


def report(found: dict[str, dict], why_not: str, threads: int, turns: int) -> str:
    lines = opening(
        "ONNX Runtime's OpenVINO provider against its CPU provider",
        "bench.openvino",
        f"; ONNX Runtime {ort.__version__}, {PLUGIN.replace('==', ' ')}; {threads} thread(s)",
    )
    if why_not:
        lines += ["", f"Not measured on this machine: {why_not}."]
        return "\n".join(lines) + "\n"
    lines += [
        f"- sources of {SOURCE_TOKENS} tokens; a step with a 10-token past, greedy (one row a "
        f"source); the sessions take turns, 20 runs at a time, {turns} turns; median",
        "",
        "| graph, rows | CPU provider, ms | OpenVINO first, ms | ratio | nodes OpenVINO / CPU "
        "provider | largest output difference |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, row in found.items():
        placed = row["placed"]
        on_openvino = sum(c for p, c in placed.items() if p.startswith("OpenVINO"))
        on_cpu = sum(c for p, c in placed.items() if not p.startswith("OpenVINO"))
        lines.append(
            f"| {name} | {row['cpu'] * 1e3:.3f} | {row['openvino'] * 1e3:.3f} | "
            f"{row['openvino'] / row['cpu']:.2f}x | {on_openvino} / {on_cpu} | "
            f"{row['difference']:.2g} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.openvino", description=__doc__)
    parser.add_argument("--bundle", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--rows", default="1,32", help="sentences (encoder) and rows (step)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("docs/performance.md"))
    args = parser.parse_args(argv)
    devices, why_not = openvino_cpu_devices()
    found = {}
    if devices:
        rows = [int(r) for r in args.rows.split(",")]
        for case in cases(args.bundle, rows):
            found[case.name] = measure(case, devices, args.threads, args.turns)
            print(f"  {case.name}: done", flush=True)
    text = report(found, why_not, args.threads, args.turns)
    replace_section("openvino", text, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
