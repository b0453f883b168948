"""bench/openvino.py: where the OpenVINO provider offers no device, the report says why; the
measuring path (placement from ONNX Runtime's profile, outputs compared, sessions in turns)
runs on a small graph with the CPU provider on both sides (a benchmark: its times are not
checked)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.openvino import Case, main, measure, openvino_cpu_devices


def small_graph(path: Path) -> Path:
    """y = Relu(x @ W), W [4, 3]: two nodes."""
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) - 6, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 3])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # (one every ONNX Runtime we run reads)
    onnx.save(model, str(path))
    return path


def test_a_graph_is_placed_compared_and_timed(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((5, 4), dtype=np.float32)
    case = Case("small, 5", small_graph(tmp_path / "small.onnx"), {"x": x}, None)
    found = measure(case, devices=[], threads=1, turns=2)
    # ONNX Runtime may fuse MatMul and Relu; every node it runs is the CPU provider's.
    assert set(found["placed"]) == {"CPUExecutionProvider"}
    assert 1 <= found["placed"]["CPUExecutionProvider"] <= 2
    assert found["difference"] == 0.0
    assert found["cpu"] > 0 and found["openvino"] > 0


def test_without_an_openvino_device_the_report_says_why(tmp_path: Path) -> None:
    devices, why_not = openvino_cpu_devices()
    if devices:
        pytest.skip("OpenVINO offers a CPU device here: the report would hold measurements")
    out = tmp_path / "performance.md"
    out.write_text("# Before\n\n<!-- openvino:start -->\nold\n<!-- openvino:end -->\n")
    assert main(["--bundle", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "old" not in text and text.startswith("# Before")
    assert f"Not measured on this machine: {why_not}." in text
