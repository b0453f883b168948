"""bench/cache_refill.py writes its section (a benchmark: its numbers are not checked, only
that every sweep was timed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_sweep_is_timed_and_written_between_the_markers(tmp_path: Path) -> None:
    out = tmp_path / "performance.md"
    out.write_text("# Before\n\n<!-- cache-refill:start -->\nold\n<!-- cache-refill:end -->\n")
    command = [sys.executable, "-m", "bench.cache_refill", "--repeat", "5", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=120, capture_output=True)
    text = out.read_text()
    assert text.startswith("# Before") and "old" not in text
    rows = re.findall(r"^\| ([^|]+) \| ([0-9.]+) \| ([0-9.]+) \|$", text, re.M)
    names = [row[0] for row in rows]
    assert names[0] == "nothing" and names[-1].startswith("one float a page")
    assert names[1:-1] == ["0.5 MB", "1 MB", "2 MB", "4 MB", "16 MB"]
    assert all(float(one) > 0 and float(ten) > 0 for _, one, ten in rows)
