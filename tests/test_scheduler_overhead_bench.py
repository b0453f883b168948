"""bench/scheduler_overhead.py runs end to end on the committed model and writes its section
(a benchmark: its numbers are not checked, only that every measure was taken and reported)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_both_searches_are_measured_and_written_between_the_markers(
    fr_en_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "benchmarks.md"
    out.write_text("# Before\n\n<!-- scheduler-overhead:start -->\nold\n")
    out.write_text(out.read_text() + "<!-- scheduler-overhead:end -->\n\n# After\n")
    command = [sys.executable, "-m", "bench.scheduler_overhead", "--count", "6"]
    command += ["--model-dir", str(fr_en_bundle.parent), "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=300, capture_output=True)
    text = out.read_text()
    assert text.startswith("# Before") and text.rstrip().endswith("# After")
    assert "old" not in text
    number = r"([0-9.]+)"
    rows = re.findall(
        rf"^\| (greedy|beam 4) \| {number} / {number} \| {number} / {number} "
        rf"\| {number} \| {number} \| {number}x \| {number}x - {number}x \|$",
        text,
        re.M,
    )
    assert [row[0] for row in rows] == ["greedy", "beam 4"]
    for _, *values in rows:
        assert all(float(value) > 0 for value in values)
