"""bench/time_split.py runs end to end on the committed model and writes its section (a
benchmark: its numbers are not checked, only that every cell was measured, that the parts
add up to the whole, that a replayed run translates as the real one, and that the engine's
sessions are given back unwrapped)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.time_split import TimedSession, split
from service.runtime.bundle import load_bundle
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator

ROOT = Path(__file__).resolve().parents[2]


def test_every_cell_is_split_and_written_between_the_markers(
    fr_en_bundle: Path, tmp_path: Path, multi30k: Path
) -> None:
    out = tmp_path / "performance.md"
    out.write_text(
        "# Before\n\n<!-- time-split:start -->\nold\n<!-- time-split:end -->\n\n# After\n"
    )
    command = [sys.executable, "-m", "bench.time_split", "--bundle", str(fr_en_bundle)]
    command += ["--sentences", "6", "--repeat", "1", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=300, capture_output=True)
    text = out.read_text()
    assert text.startswith("# Before") and text.rstrip().endswith("# After")
    assert "old" not in text
    number = r"([0-9]+) \(([0-9]+)%\)"
    row = rf"^\| ([^|]+) \| ([0-9]+) \| {number} \| {number} \| {number} \| ([0-9]+) \|$"
    rows = re.findall(row, text, re.M)
    assert [row[0] for row in rows] == [
        f"{search}, {batch}{shortlist}"
        for shortlist in ("", ", shortlist")
        for search, batch in (("greedy", 1), ("beam 4", 1), ("greedy", 32), ("beam 4", 32))
    ]
    for _, every, decoder, _, encoder, _, rest, _, replayed in rows:
        assert int(decoder) > 0 and int(encoder) > 0 and int(replayed) > 0
        assert abs(int(decoder) + int(encoder) + int(rest) - int(every)) <= 2  # rounding


def test_the_sessions_are_timed_only_while_split_runs(fr_en_bundle: Path) -> None:
    translator = Translator(load_bundle(fr_en_bundle), EngineOptions(int8=True))
    decoder, encoder = translator.engine.decoder, translator.engine.encoder
    sources = translator.tokenizer.encode(["Un chien court.", "Deux hommes parlent dans la rue."])
    every, decoder_us, encoder_us, rest, replayed = split(translator, sources, 4, 2, repeat=1)
    assert every == pytest.approx(decoder_us + encoder_us + rest)
    assert decoder_us > 0 and encoder_us > 0 and replayed > 0
    assert translator.engine.decoder is decoder and translator.engine.encoder is encoder
    assert not isinstance(translator.engine.decoder, TimedSession)


def test_a_replaying_session_writes_back_what_the_graph_wrote(fr_en_bundle: Path) -> None:
    """Replayed, the search runs without the graphs: the same translations come out, and
    they come out of the recorded arrays (a decoder that ran would need its cache)."""
    translator = Translator(load_bundle(fr_en_bundle), EngineOptions(int8=True))
    sources = translator.tokenizer.encode(["Un chien court.", "Deux hommes parlent dans la rue."])
    engine, options = translator.engine, SearchOptions(beam_size=4)
    expected = translator.translate_ids(sources, options, 2)
    spent = {"decoder": 0.0, "encoder": 0.0, "steps": 0}
    decoder = engine.decoder = TimedSession(engine.decoder, "decoder", spent)
    encoder = engine.encoder = TimedSession(engine.encoder, "encoder", spent)
    decoder.recording = encoder.recording = True
    translator.translate_ids(sources, options, 2)
    decoder.recording = encoder.recording = False
    decoder.replaying = encoder.replaying = True
    decoder.session, encoder.session = _NoRuns(decoder.session), _NoRuns(encoder.session)
    replayed = translator.translate_ids(sources, options, 2)

    def tokens(found: list) -> list:
        return [[hypothesis.tokens for hypothesis in hypotheses] for hypotheses in found]

    assert tokens(replayed) == tokens(expected)
    assert decoder.next == len(decoder.recorded) > 0 and encoder.next == len(encoder.recorded) == 1


class _NoRuns:
    """A session whose graph must not run (its bindings may still be made)."""

    def __init__(self, session: object) -> None:
        self.session = session

    def run(self, *args: object) -> None:
        raise AssertionError("the encoder ran while replaying")

    def run_with_iobinding(self, *args: object) -> None:
        raise AssertionError("the decoder ran while replaying")

    def __getattr__(self, name: str) -> object:
        return getattr(self.session, name)
