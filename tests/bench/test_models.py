"""bench/models.py: two checkpoints exported, sized and timed side by side in their own
processes (a benchmark: its times are not checked, only that every cell has one)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bench.models import main, pass_speed, stretches

pytest.importorskip("torch", reason="exporting needs the export extra (torch)")


def test_two_checkpoints_get_a_row_each_in_every_table(
    committed_model: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    french = ["Un chat dort sur un canapé.", "Deux hommes travaillent sur un toit."] * 3
    (data / "test_2016_flickr.fr").write_text("\n".join(french) + "\n")
    student = shutil.copytree(tiny_checkpoint, tmp_path / "student")
    out = tmp_path / "benchmarks.md"
    options = ["--no-quality", "--data-dir", str(data), "--sentences", "4", "--repeat", "1"]
    main(
        [
            str(committed_model),
            str(student),
            *options,
            "--work-dir",
            str(tmp_path / "w"),
            "--out",
            str(out),
        ]
    )
    text = out.read_text()
    assert "<!-- models:start -->" in text
    # The committed model: 6 + 1 layers, 7.8 M parameters (the README's figure).
    committed = r"\| models/fr-en \| 6 \+ 1, d 256, vocab 8000, pre-norm \| ([\d.]+) M"
    sizes = re.search(committed, text)
    assert sizes is not None and sizes.group(1) == "7.84"
    assert re.search(r"\| student \| 3 \+ 3, d 64, vocab 400, post-norm \| 0\.\d+ M", text)
    speed = text.split("Speed:", 1)[1]
    rows = {line.split(" | ")[0][2:]: line for line in speed.splitlines() if line.startswith("| ")}
    assert rows["models/fr-en"].count("1.00x") == 4  # every ratio is against the first one
    assert len(re.findall(r"[\d.]+ \(\d+; [\d.]+x\)", rows["student"])) == 4
    assert (tmp_path / "w" / "models-fr-en" / "decoder.int8.onnx").is_file()


def test_a_pass_is_cut_into_bench_compare_s_turns() -> None:
    assert stretches(45, 1) == [(0, 20), (20, 40), (40, 45)]
    assert stretches(70, 32) == [(0, 32), (32, 64), (64, 70)]  # one batch a turn


def test_a_pass_takes_the_sum_of_each_stretch_s_median() -> None:
    # two stretches, three repeats: passes of 1 + 3, 2 + 1 and 9 + 5 s would give a median
    # pass of 4 s; each stretch's median, 2 + 3 = 5 s
    timed = [[(1.0, 10), (2.0, 10), (9.0, 10)], [(3.0, 30), (1.0, 30), (5.0, 30)]]
    sentences_per_second, tokens_per_second = pass_speed(8, timed)
    assert sentences_per_second == 8 / 5.0
    assert tokens_per_second == 40 / 5.0
