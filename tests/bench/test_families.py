"""bench/families.py runs end to end on a tiny shape and writes its section (a benchmark: its
speeds are not checked, only that every engine, CTranslate2's and the shortlist's included,
was timed on the same work and reported)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, multi30k_path

pytest.importorskip("transformers", reason="needs the bench extra")


@pytest.mark.parametrize(
    ("shape", "title"),
    [
        ("m2m100-tiny", "M2M-100"),
        # The other families' builders (their tokenizers' files): 12 s more each.
        pytest.param("nllb-tiny", "NLLB-200", marks=pytest.mark.slow),
        pytest.param("mbart50-tiny", "mBART-50", marks=pytest.mark.slow),
    ],
)
def test_a_tiny_shape_is_built_timed_on_every_engine_and_written_between_the_markers(
    tmp_path: Path, shape: str, title: str
) -> None:
    if not (multi30k_path() / "test_2016_flickr.en").is_file():
        pytest.skip(f"Multi30k not found at {multi30k_path()} (set NMT_DATA_DIR to its folder)")
    out = tmp_path / "benchmarks.md"
    out.write_text("# Before\n\n<!-- families:start -->\nold\n<!-- families:end -->\n\n# After\n")
    command = [sys.executable, "-m", "bench.families", "--families", shape]
    command += ["--sentences", "2", "--sentences-batch-1", "1", "--batch", "2", "--repeat", "1"]
    command += ["--max-length", "12", "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=300, capture_output=True)
    text = out.read_text()
    assert text.startswith("# Before") and text.rstrip().endswith("# After")
    assert "old" not in text
    assert f"Reproduce: `.venv/bin/python -m bench.families --families {shape}" in text
    assert f"### {title}, a tiny shape" in text
    number = r"([0-9][0-9,]*\.[0-9]) \(([0-9.]+)x\)"
    cells = r" \| ".join([number] * 4)
    rows = re.findall(rf"^\| ([a-z0-9 ]+) \| {cells} \| [0-9,]+ \|", text, re.M)
    assert [row[0] for row in rows] == [
        "ours fp32",
        "ours int8",
        "ours int8 shortlist",
        "ctranslate2 int8",
        "ctranslate2 int8 vmap",
        "transformers fp32",
    ]
    for row in rows:
        speeds = [float(value.replace(",", "")) for value in row[1::2]]
        assert all(speed > 0 for speed in speeds)
    assert all(ratio == "1.00" for ratio in rows[-1][2::2])  # transformers: the reference
    # The int8 engines against each other, the shortlist's and the vocabulary map's speed-ups.
    ratios = r" \| ".join([r"[0-9.]+x"] * 4)
    pairs = re.findall(rf"^\| ([a-z0-9 ]+ / [a-z0-9 ]+)(?: \([^)]*\))? \| {ratios} \|$", text, re.M)
    assert pairs == [
        "ctranslate2 int8 / ours int8",
        "ours int8 shortlist / ours int8",
        "ctranslate2 int8 vmap / ctranslate2 int8",
        "ctranslate2 int8 vmap / ours int8 shortlist",
    ]
    # Every engine produced the same number of tokens for every sentence; the fp32 engines
    # the same tokens, from the same source ids.
    assert "Same work on every engine: yes: every translation, of every engine, is 12 " in text
    assert re.search(r"ours fp32 (\d+)/\1,", text)
    assert "Source ids: equal to the family tokenizer's" in text
    # The shortlist and the vocabulary map held both engines to the same candidate words.
    assert re.search(
        r"outside their batch's candidates, of [0-9,]+ each: ours int8 shortlist 0, "
        r"ctranslate2 int8 vmap 0\.",
        text,
    )
    assert re.search(r"Candidate words per timed batch, mean, of [0-9,]+: batch 1: ", text)
    assert re.search(r"export of the fp32 graphs [0-9.]+ s, their int8 quantization", text)
    assert re.search(r"CTranslate2's conversion \(int8, the vocabulary map in\) [0-9.]+ s", text)


def test_a_pass_is_cut_into_turns_across_directions_and_put_back_in_order() -> None:
    from bench.families import _pass_of, stretches

    job = {"directions": [{"texts": [f"a{i}" for i in range(30)]}, {"texts": ["b0", "b1"]}]}
    # batch 1: 20 sentences a turn; the second direction's sentences join the last turn
    turns = stretches(job, {"batch": 1, "count": 30})
    assert [len(t) for t in turns] == [20, 12]
    assert turns[1][-2:] == [(1, 0), (1, 1)]
    # batch 32: one batch a turn, each direction's own
    assert stretches(job, {"batch": 32, "count": 30}) == [[(0, 0)], [(1, 0)]]
    # `count` spreads a direction's passes over fewer of its sentences
    assert [len(t) for t in stretches(job, {"batch": 1, "count": 4})] == [6]

    found = {
        1: {"produced": [[3]], "sources": [[30]]},
        0: {"produced": [[1], [2]], "sources": [[10], [20]]},
    }
    timed = {0: [1.0, 5.0, 2.0], 1: [0.5, 0.25, 3.0]}
    together = _pass_of(timed, found)
    assert together["seconds"] == 2.0 + 0.5  # each stretch's median, summed
    assert together["produced"] == [[1], [2], [3]] and together["sources"] == [[10], [20], [30]]
