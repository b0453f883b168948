"""ONNX Runtime sessions, opened the one way every graph of a bundle is opened.

What is measured about the settings here (with the commands) is in docs/performance.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort


@dataclass(frozen=True)
class EngineOptions:
    int8: bool = False
    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (one per core)
    # ONNX Runtime's intra-op threads spin while waiting for work between runs: a step alone
    # starts sooner, but the spinning threads take the cores that the encoder's session, the
    # next batch and a server's event loop need (measured at 2 threads, greedy batch 32: 2,936
    # tokens/s sleeping, 2,255 spinning, 2,573 with one thread). The encoder never spins.
    spinning: bool = False
    # Score only a batch's candidate words (the bundle's vocabulary shortlist): fewer
    # multiply-adds in the output projection; results change a little (export/shortlist.py,
    # docs/performance.md).
    shortlist: bool = False
    # ONNX Runtime's profiler (off: ""): every session this engine opens writes its events to
    # `<profile_prefix>-<graph>_<time>.json`, read back by end_profiling(). For benchmarks
    # asking where the time goes, by operator (bench/compare/profiling.py).
    profile_prefix: str = ""


def session_options(options: EngineOptions) -> ort.SessionOptions:
    settings = ort.SessionOptions()
    settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    settings.intra_op_num_threads = options.intra_op_threads
    settings.inter_op_num_threads = 1
    settings.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    settings.log_severity_level = 3
    settings.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if options.spinning else "0"
    )
    return settings


# ONNX Runtime's graph fusions we turn off: its SkipLayerNormalization (Add + LayerNorm in one
# node) was measured 3x slower on the CPU than the nodes it replaces at 128 rows (240 vs 73 us;
# 11.6 vs 14.3 us at one row), docs/performance.md.
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def open_session(path: Path, options: EngineOptions) -> ort.InferenceSession:
    settings = session_options(options)
    if options.profile_prefix:
        settings.enable_profiling = True
        settings.profile_file_prefix = f"{options.profile_prefix}-{Path(path).stem}"
    return ort.InferenceSession(
        str(path),
        settings,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=DISABLED_OPTIMIZERS,
    )
