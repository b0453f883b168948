"""How a document's sentence too long for the model should be cut: pieces of which size, ending
at clause ends or not (service/documents/markup/fitting.py).

    python -m bench.long_sentences

A run-on paragraph is made of GROUP consecutive captions of a Multi30k test set, each without
its full stop, joined by commas, the first capitalized and the last ending in a full stop (192
tokens on average for test_2016_flickr: a paragraph with no sentence end inside); its
reference is the English captions joined the same way. Each paragraph is laid out as the
document worker lays out a text file, cut by `fit_sentences` with each setting (the limit it
is given stands for NMT_MAX_TOKENS_PER_SENTENCE, past which the product cuts), its pieces
translated by the committed model (greedy, int8, as `nmt eval` runs it) and joined by spaces;
chrF against the references, and the output's words over the references'. "Whole" translates
each paragraph as one sentence; "each caption alone" is what a perfect cut could reach.
test_2016_flickr is where PIECE_TOKENS and CLAUSE_SHARE were chosen; test_2017_flickr was not
looked at before.

Writes the "long-sentences" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import sacrebleu

from bench.report import BENCHMARKS, opening, replace_section
from export.data import read_lines
from export.train_config import multi30k_dir
from service.documents import markup
from service.documents.markup.fitting import CLAUSE_SHARE, PIECE_TOKENS, fit_sentences
from service.runtime.bundle import load_bundle
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator

GROUP = 12  # captions a paragraph
SPLITS = ("test_2016_flickr", "test_2017_flickr")
LAYOUT = markup.MarkupOptions(kind="xml", split="no_newlines", outline_detection=False)
# (limit, piece tokens, clause share): the limit stands for the product's; NO_CLAUSE never ends
# a piece early at a comma (only even pieces).
NO_CLAUSE = 2.0
SETTINGS = [
    (256, 256, NO_CLAUSE),
    (128, 128, NO_CLAUSE),
    (128, 128, 0.6),
    (64, 64, 0.6),
    (48, 48, NO_CLAUSE),
    (48, 48, 0.6),
    (48, 48, 0.3),
    (24, 24, 0.3),
]


def run_on(captions: list[str]) -> str:
    """Captions as one sentence: their full stops dropped, joined by commas."""
    parts = [caption.strip().rstrip(".").strip() for caption in captions]
    parts = [parts[0], *(part[:1].lower() + part[1:] for part in parts[1:])]
    return ", ".join(parts) + "."


def paragraphs(data: Path, split: str, count: int) -> list[tuple[str, str, list[str]]]:
    """(French paragraph, English reference, its French captions)."""
    french = read_lines(data / f"{split}.fr")
    english = read_lines(data / f"{split}.en")
    return [
        (run_on(french[i : i + GROUP]), run_on(english[i : i + GROUP]), french[i : i + GROUP])
        for i in range(0, min(count * GROUP, len(french) - GROUP + 1), GROUP)
    ]


def translate_cut(
    translator: Translator, texts: list[str], limit: int, piece_tokens: int, share: float
) -> tuple[list[str], float]:
    """Each text cut as the document worker cuts it, its pieces translated and joined; and
    the mean number of pieces."""

    def tokens_of(sentences: list[str]) -> list[int]:
        return [len(ids) for ids in translator.tokenizer.encode(sentences)]

    options = SearchOptions(beam_size=1, max_length=512)
    translations, pieces = [], 0
    for text in texts:
        documents = markup.read([text], LAYOUT)
        fit_sentences(documents, tokens_of, limit, piece_tokens, share)
        cut = documents[0].model_sentences
        pieces += len(cut)
        translations.append(" ".join(t.text for t in translator.translate(cut, options)))
    return translations, pieces / len(texts)


def cell(translations: list[str], pieces: float, references: list[list[str]]) -> str:
    """Pieces a paragraph, chrF, and the output's words over the reference's."""
    chrf = sacrebleu.corpus_chrf(translations, references).score
    words = sum(map(len, map(str.split, translations))) / sum(
        map(len, map(str.split, references[0]))
    )
    return f"{pieces:.1f}, {chrf:.1f}, {words:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--data", type=Path, default=None, help="Multi30k's folder")
    parser.add_argument("--paragraphs", type=int, default=40, help="per test set")
    parser.add_argument("--out", type=Path, default=BENCHMARKS)
    args = parser.parse_args(argv)
    data = args.data or multi30k_dir()
    translator = Translator(load_bundle(args.bundle), EngineOptions(int8=True, intra_op_threads=1))
    options = SearchOptions(beam_size=1, max_length=512)
    results: dict[str, list[str]] = {}
    header = ["| cut | " + " | ".join(f"{split}: pieces, chrF, words" for split in SPLITS) + " |"]
    header.append("|---|" + "---|" * len(SPLITS))
    rows: dict[str, list[str]] = {}
    for split in SPLITS:
        found = paragraphs(data, split, args.paragraphs)
        texts, references = [p for p, _, _ in found], [[r for _, r, _ in found]]

        tokens = [len(ids) for ids in translator.tokenizer.encode(texts)]
        results[split] = [f"{len(texts)} paragraphs of {sum(tokens) / len(tokens):.0f} tokens"]
        # One at a time, as the cut ones are (int8 activations are scaled per batch).
        whole = [translator.translate([text], options)[0].text for text in texts]
        rows.setdefault("whole", []).append(cell(whole, 1.0, references))
        alone = [
            run_on([t.text for t in translator.translate(captions, options)])
            for _, _, captions in found
        ]
        rows.setdefault("each caption alone", []).append(cell(alone, GROUP, references))
        for limit, piece_tokens, share in SETTINGS:
            name = f"pieces of at most {piece_tokens} tokens" + (
                "" if share == NO_CLAUSE else f", ending at a clause once at {share:.0%}"
            )
            if (piece_tokens, share) == (PIECE_TOKENS, CLAUSE_SHARE):
                name += " (the product's)"
            translations, pieces = translate_cut(translator, texts, limit, piece_tokens, share)
            rows.setdefault(name, []).append(cell(translations, pieces, references))
    lines = opening(
        "Sentences too long for the model: how a document's are cut",
        "bench.long_sentences",
        "; the committed model, greedy, int8, one thread",
    )
    lines += [
        f"- a paragraph: {GROUP} consecutive captions joined by commas, no sentence end "
        "inside; " + "; ".join(f"{split}: {results[split][0]}" for split in SPLITS),
        "- a cell: pieces a paragraph, chrF against the English captions joined alike, the "
        "output's words over the reference's; test_2016_flickr chose the product's setting",
        "",
        *header,
        *(f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows.items()),
    ]
    replace_section("long-sentences", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
