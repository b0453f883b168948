"""Where a translation's time goes: the decoder step, the encoder, and everything else.

    python -m bench.time_split [--bundle build/models/fr-en] [--sentences 200]

Translates the first `--sentences` lines of test_2016_flickr with the int8 engine on one
thread, as `Translator.translate_ids` does (sorted by length into batches, the server's
search settings), for greedy and beam 4 at batch 1 and 32, with and without the shortlist.
The engine's two ONNX Runtime sessions are wrapped to time their calls from outside; what
is left of the wall time is Python and numpy (search, cache moves, binding, the shortlist's
gathers). Each cell is translated once to warm up, then `--repeat` times; the median run is
reported per decoder step (a step of the whole batch).

Then the same translation once more with the sessions replayed: each call writes what the
real call returned at that point (recorded during the warm-up) instead of running the graph.
The search takes exactly the same path, so the rest's Python does the same work, but with
the caches it left warm: a step's graph streams megabytes of weights through the core's L2
and evicts the Python's code and data, which the real run's rest reads back at every step.
Writes the "time-split" section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.harness import served_options
from bench.report import cpu_model, replace_section, reproduce
from export.data import read_lines
from export.train_config import multi30k_dir
from service.runtime.bundle import load_bundle
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator

CELLS = [(1, 1), (4, 1), (1, 32), (4, 32)]  # (beam, batch)


class TimedSession:
    """An ONNX Runtime session whose run calls add their wall time to `spent[key]`. While
    `recording`, it keeps each call's outputs; while `replaying`, it writes them back in
    the same order instead of running the graph."""

    def __init__(self, session: object, key: str, spent: dict[str, float]) -> None:
        self.session, self.key, self.spent = session, key, spent
        self.recorded: list[list[np.ndarray]] = []
        self.recording = self.replaying = False
        self.next = 0

    def run(self, *args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            if self.replaying:
                self.next += 1
                return [array.copy() for array in self.recorded[self.next - 1]]
            outputs = self.session.run(*args, **kwargs)
            if self.recording:
                self.recorded.append([array.copy() for array in outputs])
            return outputs
        finally:
            self.spent[self.key] += time.perf_counter() - started

    def run_with_iobinding(self, binding: object) -> None:
        started = time.perf_counter()
        try:
            if self.replaying:
                self.next += 1
                outputs = searched_outputs(binding)
                for value, array in zip(outputs, self.recorded[self.next - 1], strict=True):
                    value.update_inplace(array)
            else:
                self.session.run_with_iobinding(binding)
                if self.recording:
                    outputs = searched_outputs(binding)
                    self.recorded.append([value.numpy().copy() for value in outputs])
        finally:
            self.spent[self.key] += time.perf_counter() - started
            self.spent["steps"] += 1

    def __getattr__(self, name: str) -> object:
        return getattr(self.session, name)


def searched_outputs(binding: ort.IOBinding) -> list[ort.OrtValue]:
    """A step's bound outputs that the search reads: all but the caches, the only 4-D ones
    (the graph writes them in place for its next run, and nothing else reads them)."""
    return [value for value in binding.get_outputs() if len(value.shape()) < 4]


def split(translator: Translator, sources: list[list[int]], beam: int, batch: int, repeat: int):
    """µs a step: (all, decoder, encoder, rest) of the median run, and the rest of one run
    with the sessions replayed."""
    options = served_options(beam)
    engine = translator.engine
    spent = {"decoder": 0.0, "encoder": 0.0, "steps": 0}
    decoder = engine.decoder = TimedSession(engine.decoder, "decoder", spent)
    encoder = engine.encoder = TimedSession(engine.encoder, "encoder", spent)
    runs = []
    try:
        for turn in range(repeat + 2):
            replay = turn == repeat + 1
            decoder.recording = encoder.recording = turn == 0
            decoder.replaying = encoder.replaying = replay
            decoder.next = encoder.next = 0
            spent.update(decoder=0.0, encoder=0.0, steps=0)
            started = time.perf_counter()
            translated = translator.translate_ids(sources, options, batch)
            wall = time.perf_counter() - started
            tokens = [[h.tokens for h in hypotheses] for hypotheses in translated]
            if turn == 0:
                expected = tokens
            elif tokens != expected:  # (then the replay would not be the same work)
                raise RuntimeError("a translation changed between runs of the same sentences")
            steps = spent["steps"]
            rest = wall - spent["decoder"] - spent["encoder"]
            if replay:
                replayed = rest / steps * 1e6
            elif turn:  # the first run warms up (and records)
                parts = (wall, spent["decoder"], spent["encoder"], rest)
                runs.append(tuple(part / steps * 1e6 for part in parts))
    finally:
        engine.decoder, engine.encoder = decoder.session, encoder.session
    return (*sorted(runs)[len(runs) // 2], replayed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundle", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("docs/performance.md"))
    args = parser.parse_args()
    lines = read_lines(multi30k_dir() / "test_2016_flickr.fr")[: args.sentences]
    rows = []
    for shortlist in (False, True):
        options = EngineOptions(int8=True, intra_op_threads=1, shortlist=shortlist)
        translator = Translator(load_bundle(args.bundle), options)
        sources = translator.tokenizer.encode(lines)
        for beam, batch in CELLS:
            every, decoder, encoder, rest, warm = split(
                translator, sources, beam, batch, args.repeat
            )
            search = "greedy" if beam == 1 else f"beam {beam}"
            name = f"{search}, {batch}{', shortlist' if shortlist else ''}"
            rows.append(
                f"| {name} | {every:.0f} | {decoder:.0f} ({decoder / every:.0%}) | "
                f"{encoder:.0f} ({encoder / every:.0%}) | {rest:.0f} ({rest / every:.0%}) | "
                f"{warm:.0f} |"
            )
            print(rows[-1], flush=True)
    table = "\n".join(
        [
            f"Reproduce: `{reproduce('bench.time_split')}` ({cpu_model()}, int8, one thread; "
            f"the first {args.sentences} lines of test_2016_flickr, sorted by length into "
            f"batches; median of {args.repeat} runs; the last column: one run with the "
            "sessions replayed, the rest's Python with warm caches)",
            "",
            "| search, batch | all, µs a step | decoder step | encoder | the rest | "
            "the rest, sessions replayed |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    replace_section("time-split", table, args.out)


if __name__ == "__main__":
    main()
