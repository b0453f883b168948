"""bench/train_precision.py: float32 and bf16 training steps timed in turns (a benchmark:
its times are not checked, only that each thread count gets a row)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="training needs the export extra (torch)")

from bench.train_precision import main


def test_each_thread_count_gets_a_row_in_its_section(tmp_path: Path) -> None:
    out = tmp_path / "training.md"
    out.write_text("# Training\n\nkept\n")
    shape = ["--encoder-layers", "1", "--decoder-layers", "1", "--d-model", "64"]
    sizes = ["--vocab-size", "300", "--max-tokens", "170", "--turns", "1"]
    main([*shape, *sizes, "--threads", "1", "2", "--out", str(out)])
    text = out.read_text()
    assert text.startswith("# Training\n\nkept\n")
    section = text.split("<!-- train-precision:start -->")[1].split("<!-- train-precision:end -->")[
        0
    ]
    rows = re.findall(r"^\| (\d) \| (\d+) \| (\d+) \| ([\d.]+)x \|$", section, re.MULTILINE)
    assert [row[0] for row in rows] == ["1", "2"]
    assert all(float(row[3]) > 0 for row in rows)
