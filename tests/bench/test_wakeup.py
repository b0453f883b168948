"""bench/wakeup.py runs end to end and writes its section (a benchmark: its numbers are not
checked, only that each hand-over was timed and reported)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to hand work between")
def test_every_hand_over_is_timed_and_written_between_the_markers(tmp_path: Path) -> None:
    out = tmp_path / "performance.md"
    out.write_text("# Before\n\n<!-- wakeup:start -->\nold\n<!-- wakeup:end -->\n\n# After\n")
    command = [sys.executable, "-m", "bench.wakeup", "--round-trips", "50", "--report"]
    subprocess.run([*command, "--out", str(out)], cwd=ROOT, check=True, timeout=120)
    text = out.read_text()
    assert text.startswith("# Before") and text.rstrip().endswith("# After")
    assert "old" not in text
    rows = re.findall(
        r"^\| (sleeping|spinning)[^|]*\| ([0-9.]+) µs \| ([0-9.]+) µs \|$", text, re.M
    )
    assert [kind for kind, _, _ in rows] == ["sleeping", "sleeping", "spinning"]
    assert all(0 < float(median) <= float(p90) for _, median, p90 in rows)
