"""bench/native_loop.py builds its C loop, checks that every loop (greedy and beam 4)
translates as the product
and writes its section (a benchmark: its numbers are not checked, only that every way was
timed and agreed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.native_loop import (
    BEAM,
    GREEDY,
    beam_loop,
    build_extension,
    c_loop,
    ctranslate2_int8,
    engine_step_loop,
    first_token_table,
    python_loop,
)
from service.runtime.bundle import load_bundle
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")


def test_each_loop_translates_as_the_product(fr_en_bundle: Path, tmp_path: Path) -> None:
    native = build_extension(tmp_path / "native")
    translator = Translator(load_bundle(fr_en_bundle), EngineOptions(int8=True))
    sources = translator.tokenizer.encode(
        ["Un homme fait du vélo.", "Deux chiens jouent dans la neige près d'une maison rouge."]
    )
    expected = [found[0].tokens for found in translator.translate_ids(sources, GREEDY, 1)]
    engine = translator.engine
    for loop in (engine_step_loop, python_loop):
        assert [loop(engine, source) for source in sources] == expected
    assert [c_loop(native, engine, source) for source in sources] == expected
    expected = [found[0].tokens for found in translator.translate_ids(sources, BEAM, 1)]
    assert [beam_loop(engine, source) for source in sources] == expected


def test_the_c_loop_stops_at_the_limit_and_passes_errors_on(tmp_path: Path) -> None:
    """A step that never writes </s> stops at the limit (</s> there when forced); an exception
    from the step comes back as itself."""
    native = build_extension(tmp_path / "native")
    target, positions = np.zeros((1, 1), dtype=np.int64), np.zeros(1, dtype=np.int64)
    ids, log_probs = np.zeros((1, 1), dtype=np.int64), np.zeros((1, 1), dtype=np.float32)

    def step() -> None:  # the next token is the fed one plus 1, log-prob -0.5
        ids[0, 0], log_probs[0, 0] = target[0, 0] + 1, -0.5

    args = (step, target, positions, ids, log_probs, 10, 2, 6)
    assert native.greedy(*args, 2, False) == ([11, 12, 13, 14], -2.0)
    assert native.greedy(*args, 2, True) == ([11, 12, 13, 2], -1.5)
    assert positions[0] == 5

    def failing() -> None:
        raise ValueError("the graph failed")

    try:
        native.greedy(failing, target, positions, ids, log_probs, 10, 2, 6, 2, False)
    except ValueError as error:
        assert str(error) == "the graph failed"
    else:
        raise AssertionError("the step's error was swallowed")


def test_every_way_is_timed_and_written_between_the_markers(
    fr_en_bundle: Path, tmp_path: Path, multi30k: Path
) -> None:
    out = tmp_path / "performance.md"
    out.write_text("# Before\n\n<!-- native-loop:start -->\nold\n<!-- native-loop:end -->\n")
    command = [sys.executable, "-m", "bench.native_loop", "--bundle", str(fr_en_bundle)]
    command += ["--sentences", "4", "--rounds", "1", "--no-ctranslate2", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=300, capture_output=True)
    text = out.read_text()
    assert text.startswith("# Before") and "old" not in text
    rows = re.findall(r"^\| ([^|]+) \| ([0-9]+) \| ([0-9]+) \| ([0-9.]+)x \| 4 / 4 \|$", text, re.M)
    assert [row[0] for row in rows] == [
        "product (Python search loop)",
        "Engine.step, minimal loop",
        "minimal Python loop",
        "loop in C",
        "product (Python search loop)",
        "minimal Python beam search",
    ]
    # The first token alone: the product's time, its encoder, its decoder step, the rest.
    number = r" \| (-?[0-9]+)"
    first = re.findall(rf"^\| (greedy|beam 4){number * 4} \|$", text, re.M)
    assert [row[0] for row in first] == ["greedy", "beam 4"]
    for _, every, encoder, decoder, _rest in first:
        assert 0 < int(encoder) < int(every) and 0 < int(decoder) < int(every)


def test_the_first_token_is_timed_against_ctranslate2_and_the_sessions_put_back(
    fr_en_bundle: Path,
) -> None:
    """With CTranslate2 on the same weights, both write every sentence's first token (the
    same one), and the engine keeps its own sessions afterwards."""
    ct2 = ctranslate2_int8(ROOT / "models" / "fr-en")
    if ct2 is None:
        pytest.skip("ctranslate2 is not installed")
    translator = Translator(load_bundle(fr_en_bundle), EngineOptions(int8=True))
    encoder, decoder = translator.engine.encoder, translator.engine.decoder
    sources = translator.tokenizer.encode(["Un homme fait du vélo.", "Deux chiens jouent."])
    table = first_token_table(translator, ct2, sources, rounds=1)
    assert translator.engine.encoder is encoder and translator.engine.decoder is decoder
    rows = table.splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| greedy", "| beam 4"]
    assert all(row.endswith("| 2 / 2 |") for row in rows)
