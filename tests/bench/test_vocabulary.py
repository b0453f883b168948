"""bench/vocabulary.py: a smaller vocabulary's tokens per sentence and decoder step, reported."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the export extra (torch)")

from export.train_config import multi30k_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (multi30k_dir() / "train.fr").is_file(), reason=f"no Multi30k at {multi30k_dir()}"
    ),
]


def test_a_smaller_vocabulary_cuts_more_tokens_and_a_cheaper_step(tmp_path: Path) -> None:
    from bench.vocabulary import main

    out = tmp_path / "training.md"
    out.write_text("# Training\n\n<!-- vocabulary:start -->\nold\n<!-- vocabulary:end -->\n")
    assert main(["--sizes", "8000", "1000", "--rows", "1", "--turns", "3",
                 "--work", str(tmp_path / "work"), "--out", str(out)]) == 0  # fmt: skip
    text = out.read_text()
    assert "old" not in text and "Reproduce: `.venv/bin/python -m bench.vocabulary" in text
    rows = {
        cells[0]: cells
        for line in text.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
        and cells[0].isdigit()
    }  # fmt: skip
    committed, small = rows["8000"], rows["1000"]
    assert float(small[2]) > float(committed[2])  # more target tokens a sentence
    assert committed[3].endswith("(1.00x)")
    # Timed, so no bound on it (a busy machine): a step time and its ratio, both positive.
    assert float(small[3].split(" ms")[0]) > 0 and float(small[3].split("(")[1].rstrip("x)")) > 0
