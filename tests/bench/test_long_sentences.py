"""bench/long_sentences.py: its run-on paragraphs, and its section written from a few of them
with the committed model (a benchmark: its numbers are reported, not held to a target)."""

from __future__ import annotations

import re
from pathlib import Path

from bench.long_sentences import SETTINGS, main, run_on


def test_captions_run_on_as_one_sentence() -> None:
    captions = ["Un chien court.", "Deux enfants jouent. ", "Une femme lit"]
    assert run_on(captions) == "Un chien court, deux enfants jouent, une femme lit."


def test_the_script_writes_its_section(fr_en_bundle: Path, tmp_path: Path, multi30k: Path) -> None:
    out = tmp_path / "benchmarks.md"
    out.write_text(
        "# Before\n\n<!-- long-sentences:start -->\nstale\n<!-- long-sentences:end -->\n"
    )
    main(
        [
            "--bundle",
            str(fr_en_bundle),
            "--data",
            str(multi30k),
            "--paragraphs",
            "1",
            "--out",
            str(out),
        ]
    )
    text = out.read_text()
    assert text.startswith("# Before") and "stale" not in text
    cell = r"(\d+\.\d), (\d+\.\d), (\d\.\d\d)"
    rows = re.findall(rf"^\| (.+?) \| {cell} \| {cell} \|$", text, re.M)
    assert len(rows) == 2 + len(SETTINGS)
    names = [row[0] for row in rows]
    assert names[:2] == ["whole", "each caption alone"] and any("product" in n for n in names)
    assert all(0 < float(row[2]) <= 100 for row in rows)
