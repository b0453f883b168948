"""bench/shortlist_sizes.py runs end to end on the committed model and writes its section (a
benchmark: its numbers are not checked, only that every size and cell was measured)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_size_is_measured_and_written_between_the_markers(
    fr_en_bundle: Path, tmp_path: Path, multi30k: Path
) -> None:
    out = tmp_path / "performance.md"
    section = "<!-- shortlist-sizes:start -->\nold\n<!-- shortlist-sizes:end -->"
    out.write_text(f"# Before\n\n{section}\n\n# After\n")
    command = [sys.executable, "-m", "bench.shortlist_sizes", "--bundle", str(fr_en_bundle)]
    command += ["--sentences", "4", "--sizes", "5:50", "20:200", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=600, capture_output=True)
    text = out.read_text()
    assert text.startswith("# Before") and text.rstrip().endswith("# After")
    assert "old" not in text
    rows = re.findall(r"^\| (full vocabulary|[0-9]+:[0-9]+) \| (.+) \|$", text, re.M)
    assert [row[0] for row in rows] == ["full vocabulary", "5:50", "20:200"]
    for _, rest in rows:
        cells = rest.split(" | ")
        assert len(cells) == 1 + 8 + 1  # candidates, 8 translations, speed
        for cell in cells[1:-1]:
            same, bleu = re.fullmatch(r"([0-9.]+)% / ([0-9.]+)", cell).groups()
            assert 0 <= float(same) <= 100 and float(bleu) >= 0
        assert re.fullmatch(r"[0-9.]+x", cells[-1])
    small, larger = (int(rows[i][1].split(" / ")[0]) for i in (1, 2))
    assert small < larger  # more candidates per source word, more candidates a sentence
