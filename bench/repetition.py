"""What the repetition guard (NMT_MAX_REPEATS) costs in BLEU, and what it saves on garbage.

    python -m bench.repetition --model-dir build/models/fr-en

Side by side in one process, on the same engine: BLEU (sacrebleu) on Multi30k's val and test
sets with the guard off and at 2 and 3 repeats, greedy and beam 4; and, on hostile input made
here from a fixed seed (symbol soup, word salad, repeated words, letters without words), the
share of translations that hold a loop (an n-gram of up to 4 tokens more than 3 times in a
row). Writes the `repetition` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from bench.report import replace_section
from export.scoring import corpus_scores
from export.train_config import multi30k_dir
from service.runtime.bundle import load_bundle
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.strategies import MAX_REPEAT_NGRAM
from service.runtime.translator import Translator

SPLITS = ("val", "test_2016_flickr", "test_2017_flickr")
SETTINGS = (0, 2, 3)
LOOP = 3  # "holds a loop": some n-gram more than this many times in a row


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def hostile_texts(count: int, seed: int = 11) -> list[str]:
    """Inputs a caption model was never trained on, made up here (no corpus lines)."""
    rng = random.Random(seed)
    symbols = "🙂🎉→★♥✓#@%&*+=<>[]{}|~^°§¶•…—–«»"
    letters = "abcdefghijklmnopqrstuvwxyzéèàçù"
    words = ["le", "la", "un", "chat", "de", "et", "bleu", "rouge", "homme", "femme", "eau"]
    makers = [
        lambda: "".join(rng.choice(symbols + letters) for _ in range(rng.randint(3, 40))),
        lambda: " ".join(rng.choice(words) for _ in range(rng.randint(5, 30))),
        lambda: " ".join([rng.choice(words)] * rng.randint(4, 20)),
        lambda: " ".join(
            "".join(rng.choice(letters) for _ in range(rng.randint(1, 12)))
            for _ in range(rng.randint(2, 12))
        ),
        lambda: "".join(rng.choice(letters).upper() for _ in range(rng.randint(10, 60))),
    ]
    return [makers[i % len(makers)]() for i in range(count)]


def holds_loop(tokens: list[int], repeats: int = LOOP) -> bool:
    for n in range(1, MAX_REPEAT_NGRAM + 1):
        for start in range(len(tokens) - n * (repeats + 1) + 1):
            gram = tokens[start : start + n]
            if all(tokens[start + k * n : start + (k + 1) * n] == gram for k in range(repeats + 1)):
                return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--hostile", type=int, default=500, help="hostile inputs to make")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    data = args.data_dir or multi30k_dir()
    translator = Translator(
        load_bundle(args.model_dir), EngineOptions(intra_op_threads=args.threads)
    )
    source, target = translator.bundle.source_lang, translator.bundle.target_lang

    header = " | ".join(f"repeats {k}" if k else "guard off" for k in SETTINGS)
    lines = [
        "## Repetition guard: BLEU cost and loops stopped",
        "",
        "`python -m bench.repetition --model-dir build/models/fr-en` (the committed model, fp32; "
        "sacrebleu BLEU, same engine, one run). `NMT_MAX_REPEATS=k` never lets an n-gram of up to "
        "4 tokens occur more than k times in a row (the search takes the next best token "
        "instead; a translation with nothing else ends before the loop); the server's default "
        "is 3.",
        "",
        f"| split | search | {header} |",
        "|---|---|" + "---|" * len(SETTINGS),
    ]
    for split in SPLITS:
        sources = read_lines(data / f"{split}.{source}")
        references = read_lines(data / f"{split}.{target}")
        for beam in (1, 4):
            cells = []
            for repeats in SETTINGS:
                options = SearchOptions(beam_size=beam, max_repeats=repeats)
                found = [t.text for t in translator.translate(sources, options)]
                cells.append(f"{corpus_scores(found, references)['bleu']:.2f}")
            search = "greedy" if beam == 1 else "beam 4"
            lines.append(f"| {split} | {search} | {' | '.join(cells)} |")
            print(lines[-1], flush=True)

    texts = hostile_texts(args.hostile)
    lines += [
        "",
        f"On {len(texts)} hostile inputs made by `bench.repetition.hostile_texts` (symbol "
        "soup, word salad, one word repeated, letter strings): the share of translations "
        f"holding a loop (an n-gram more than {LOOP} times in a row).",
        "",
        f"| search | {header} |",
        "|---|" + "---|" * len(SETTINGS),
    ]
    for beam in (1, 4):
        cells = []
        for repeats in SETTINGS:
            found = translator.translate(texts, SearchOptions(beam_size=beam, max_repeats=repeats))
            looping = sum(holds_loop(t.hypotheses[0].tokens) for t in found)
            cells.append(f"{looping / len(texts):.1%} ({looping})")
        lines.append(f"| {'greedy' if beam == 1 else 'beam 4'} | {' | '.join(cells)} |")
        print(lines[-1], flush=True)
    replace_section("repetition", "\n".join(lines))
    print("wrote the repetition section of docs/benchmarks.md", file=sys.stderr)


if __name__ == "__main__":
    main()
