"""bench/gemm_rate.py: its one-node graphs compute the products it claims to time (against
numpy), it finds the bundle's int8 weight shapes, and it writes its section (a benchmark: the
rates are not checked, only that every cell was timed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.gemm_rate import matmul_session, weight_shapes

ROOT = Path(__file__).resolve().parents[2]


def test_both_graphs_compute_x_times_the_weights() -> None:
    generator = np.random.default_rng(1)
    # Seven-bit weights: on a CPU with AVX2 and no VNNI, MLAS adds pairs of u8 x s8 products
    # into 16 bits, which saturates for full-range weights (docs/performance.md, int8).
    weight = generator.integers(-63, 64, size=(64, 48), dtype=np.int8)
    x = generator.standard_normal((5, 64)).astype(np.float32)
    expected = x.astype(np.float64) @ (weight.astype(np.float64) * 0.01)
    fp32 = matmul_session("fp32", weight, 0.01).run(None, {"x": x})[0]
    int8 = matmul_session("int8", weight, 0.01).run(None, {"x": x})[0]
    assert fp32.shape == int8.shape == (5, 48)
    np.testing.assert_allclose(fp32, expected, rtol=1e-4, atol=1e-4)
    # u8 activations (256 levels over x's range) cost about 1% of the products' spread
    assert np.abs(int8 - expected).max() < 0.05 * np.abs(expected).max()


def test_the_bundles_weight_shapes_are_its_matmuls(fr_en_bundle: Path) -> None:
    shapes = weight_shapes(fr_en_bundle)
    dims = json.loads((fr_en_bundle / "bundle.json").read_text())["model"]
    d_model, vocabulary = dims["d_model"], dims["vocab_size"]
    assert (d_model, d_model) in shapes  # attention's output projection
    assert (d_model, vocabulary) in shapes  # the output projection [D, V]
    assert all(d_model in shape for shape in shapes)


def test_every_cell_is_timed_and_written_between_the_markers(
    fr_en_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "performance.md"
    out.write_text("# Before\n\n<!-- gemm-rate:start -->\nold\n<!-- gemm-rate:end -->\n")
    command = [sys.executable, "-m", "bench.gemm_rate", "--bundle", str(fr_en_bundle)]
    command += ["--rows", "1", "17", "--rounds", "2", "--seconds", "0.002", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=300, capture_output=True)
    text = out.read_text()
    assert text.startswith("# Before") and "old" not in text
    rows = re.findall(r"^\| (\d+) x (\d+) \| (\d+) \|((?: [0-9.]+x? \|)+)$", text, re.M)
    assert len(rows) == 2 * len(weight_shapes(fr_en_bundle))
    assert {int(row[2]) for row in rows} == {1, 17}
    values = [value.strip().rstrip("x") for row in rows for value in row[3].split("|")[:-1]]
    assert len(values) == 5 * len(rows) and all(float(value) > 0 for value in values)
