"""bench/quality.py: README's quality table is the one docs/quality.md's commands measured
(both written by `python -m bench.quality`), and rewriting it keeps the rest of the README."""

from __future__ import annotations

import re
from pathlib import Path

from bench.quality import SPLITS, readme_table
from bench.report import replace_section
from tests.conftest import ROOT


def measured() -> dict[tuple[str, int], dict]:
    """docs/quality.md's rows: (split, beam) -> BLEU and chrF."""
    rows = re.findall(
        r"^\| (\S+) \| (greedy|beam 4) \| ([\d.]+) \| ([\d.]+) \|",
        (ROOT / "docs" / "quality.md").read_text(),
        flags=re.MULTILINE,
    )
    return {
        (split, 1 if search == "greedy" else 4): {"bleu": float(bleu), "chrf": float(chrf)}
        for split, search, bleu, chrf in rows
    }


def test_the_readme_table_is_docs_quality_md_s_numbers() -> None:
    results = measured()
    assert {split for split, _ in results} == set(SPLITS)
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- quality-table:start -->\n", 1)[1].split(
        "<!-- quality-table:end -->"
    )[0]
    assert table.strip() == readme_table(results)


def test_rewriting_the_table_keeps_the_rest_of_the_readme(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    original = (ROOT / "README.md").read_text()
    readme.write_text(original)
    results = {key: {"bleu": 99.0, "chrf": 98.0} for key in measured()}
    replace_section("quality-table", readme_table(results), readme)
    text = readme.read_text()
    assert "| test_2017_flickr | 99.00 | 99.00 | 98.00 | 98.00 |" in text
    before, after = (
        original.split("<!-- quality-table:start -->")[0],
        original.split("<!-- quality-table:end -->")[1],
    )
    assert text.startswith(before) and text.endswith(after)
