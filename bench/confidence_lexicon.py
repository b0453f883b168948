"""Jackknifed quality labels: does a lexicon of hard words rank translations better than the
decoder's own features? (issue 37; measured, not yet in the product)

    python -m bench.confidence_lexicon split --out build/jackknife
    # then train and export a model on each half (the commands it prints: ~95 min a half,
    # one core each, side by side)
    python -m bench.confidence_lexicon judge --jackknife build/jackknife

Why jackknife: the calibration learns from translations whose quality is known, and the
committed model's own translations can be labelled only where it was not trained (val: 1,014
sentences). Its 29,000 training sources are no use: it learned them (docs/confidence.md).
Two models of the same recipe, each trained on one half of the training pairs, translate the
other half: 29,000 translations with real errors, labelled by their sentence chrF against the
reference.

What is learned from them: a lexicon, one weight per SentencePiece piece of the source and of
the translation (a ridge regression over which pieces a sentence holds), of what the decoder's
features leave unexplained (the residual of a ridge of chrF on the half-models' own features).
For the committed model's translations, the lexicon's score is a twelfth feature beside the
eleven of service/serving/confidence.py, and the calibration's ridge is refitted on val, as
`nmt calibrate` does. Judged on test_2016_flickr and test_2017_flickr (seen by no model and
no fit), Spearman with sentence chrF.

Writes the `confidence-lexicon` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import sentencepiece
from scipy import sparse
from sklearn.linear_model import Ridge

from bench.harness import served_options
from bench.report import opening, replace_section
from export import calibration as fit
from export.data import read_lines
from export.train_config import multi30k_dir
from service.runtime.bundle import load_bundle
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from service.serving.confidence import SEARCH_FEATURES, scored_sentences

HALVES = ("a", "b")
SEARCHES = (("greedy", 1), ("beam", 4))
# The recipe of each half: the committed student's shape on the references (the distilled
# targets come from teachers that saw every training pair), 23 epochs as measured.
RECIPE = (
    "--tokenizer models/fr-en/sentencepiece.model --encoder-layers 6 --decoder-layers 1 "
    "--pre-norm --positions sinusoidal_offset --decoder-start eos --warmup-steps 400 "
    "--dropout 0.1 --patience 6 --threads 1 --device cpu --max-epochs 23 "
    "--valid-bleu-sentences 400 --seed 1"
)
# Ridge penalties: the half-models' features (standardized) and the lexicon (piece
# indicators); 30 to 1,000 rank within 0.006.
FEATURE_ALPHA = 10.0
LEXICON_ALPHA = 100.0


def split(out: Path, seed: int = 0) -> None:
    """The training pairs shuffled (seeded) into two halves, each a data directory with the
    real val set, and train.ids: which training lines it holds."""
    data = multi30k_dir()
    french, english = read_lines(data / "train.fr"), read_lines(data / "train.en")
    order = list(range(len(french)))
    random.Random(seed).shuffle(order)
    middle = len(order) // 2
    for half, ids in zip(HALVES, (sorted(order[:middle]), sorted(order[middle:])), strict=True):
        folder = out / f"data-{half}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "train.fr").write_text("".join(french[i] + "\n" for i in ids))
        (folder / "train.en").write_text("".join(english[i] + "\n" for i in ids))
        (folder / "train.ids").write_text("".join(f"{i}\n" for i in ids))
        for lang in ("fr", "en"):
            link = folder / f"val.{lang}"
            if not link.exists():
                link.symlink_to((data / f"val.{lang}").resolve())
    for core, half in enumerate(HALVES):
        print(
            f"taskset -c {core} .venv/bin/nmt train --run-dir {out}/runs/half-{half} "
            f"--out {out}/half-{half} --data-dir {out}/data-{half} {RECIPE} && "
            f".venv/bin/nmt export --checkpoint {out}/half-{half} --out {out}/bundle-{half}"
        )


class Labelled:
    """Sentences translated by one model, with their features and sentence chrF."""

    def __init__(self, bundle: Path, sources: list[str], references: list[str], beam: int):
        translator = Translator(load_bundle(bundle), EngineOptions(intra_op_threads=1))
        scored = scored_sentences(translator, sources, served_options(beam))
        self.sources = sources
        self.translations = [s.translation for s in scored]
        self.features = [s.features for s in scored]
        self.chrf = np.array(
            [fit.sentence_chrf(s.translation, r) for s, r in zip(scored, references, strict=True)]
        )

    def rows(self, search: str) -> np.ndarray:
        return fit.feature_matrix(self.features, list(SEARCH_FEATURES[search]))


def other_half(jackknife: Path, half: str, other: str, beam: int) -> Labelled:
    """The half `other` of the training pairs, translated by the model trained on `half`."""
    folder = jackknife / f"data-{other}"
    return Labelled(
        jackknife / f"bundle-{half}",
        read_lines(folder / "train.fr"),
        read_lines(folder / "train.en"),
        beam,
    )


def piece_indicators(labelled: list[Labelled], tokenizer) -> sparse.csr_matrix:
    """[sentences, 2 * vocabulary]: which pieces each source (left) and translation (right)
    holds."""
    vocabulary = tokenizer.get_piece_size()
    rows, columns = [], []
    row = 0
    for part in labelled:
        for source, translation in zip(part.sources, part.translations, strict=True):
            target = tokenizer.encode(translation)
            held = {*tokenizer.encode(source)} | {vocabulary + piece for piece in target}
            rows += [row] * len(held)
            columns += sorted(held)
            row += 1
    values = np.ones(len(rows))
    return sparse.csr_matrix((values, (rows, columns)), shape=(row, 2 * vocabulary))


def standardized_ridge(train: np.ndarray, target: np.ndarray, alpha: float):
    mean, scale = train.mean(axis=0), train.std(axis=0)
    scale[scale == 0] = 1.0
    model = Ridge(alpha=alpha).fit((train - mean) / scale, target)
    return lambda rows: model.predict((rows - mean) / scale)


def judge(jackknife: Path, committed: Path) -> list[str]:
    tokenizer = sentencepiece.SentencePieceProcessor(
        model_file=str(committed / "sentencepiece.model")
    )
    data = multi30k_dir()
    splits = {
        name: (read_lines(data / f"{name}.fr"), read_lines(data / f"{name}.en"))
        for name in ("val", "test_2016_flickr", "test_2017_flickr")
    }
    lines = [
        "| search | split | raw score | eleven features | twelve (with the lexicon) | "
        "lexicon alone |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for search, beam in SEARCHES:
        # each half-model translates the half it was not trained on (both at once: ONNX
        # Runtime lets go of the interpreter while it runs)
        with ThreadPoolExecutor(len(HALVES)) as pool:
            held_out = list(
                pool.map(other_half, [jackknife] * 2, HALVES, reversed(HALVES), [beam] * 2)
            )
        features = np.vstack([part.rows(search) for part in held_out])
        chrf = np.concatenate([part.chrf for part in held_out])
        explained = standardized_ridge(features, chrf, FEATURE_ALPHA)(features)
        lexicon = Ridge(alpha=LEXICON_ALPHA).fit(
            piece_indicators(held_out, tokenizer), chrf - explained
        )
        served = {name: Labelled(committed, *pair, beam) for name, pair in splits.items()}
        val = served["val"]
        val_lexicon = lexicon.predict(piece_indicators([val], tokenizer))
        eleven = standardized_ridge(val.rows(search), val.chrf, fit.RIDGE_ALPHA)
        twelve = standardized_ridge(
            np.column_stack([val.rows(search), val_lexicon]), val.chrf, fit.RIDGE_ALPHA
        )
        for name in ("test_2016_flickr", "test_2017_flickr"):
            test = served[name]
            rows = test.rows(search)
            score = lexicon.predict(piece_indicators([test], tokenizer))
            raw = fit.spearman(rows[:, 0], test.chrf)
            with_eleven = fit.spearman(eleven(rows), test.chrf)
            with_twelve = fit.spearman(twelve(np.column_stack([rows, score])), test.chrf)
            lines.append(
                f"| {search}{'' if beam == 1 else f' {beam}'} | {name} | {raw:.3f} "
                f"| {with_eleven:.3f} (+{with_eleven - raw:.3f}) "
                f"| {with_twelve:.3f} (+{with_twelve - raw:.3f}) "
                f"| {fit.spearman(score, test.chrf):.3f} |"
            )
        notes.append(
            f"- {search}{'' if beam == 1 else f' {beam}'}: the half-models' {len(chrf):,} "
            f"translations of the halves they did not see score a mean chrF of "
            f"{chrf.mean():.1f} (the committed model on val: {val.chrf.mean():.1f})"
        )
    return [*lines, "", *notes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    split_command = commands.add_parser("split", help="write the two halves' data directories")
    split_command.add_argument("--out", type=Path, default=Path("build/jackknife"))
    judge_command = commands.add_parser("judge", help="label, fit and judge")
    judge_command.add_argument("--jackknife", type=Path, default=Path("build/jackknife"))
    judge_command.add_argument("--model-dir", type=Path, default=Path("build/models/fr-en"))
    args = parser.parse_args()
    if args.command == "split":
        split(args.out)
        return
    lines = opening(
        "Confidence: a lexicon learned from jackknifed labels",
        "bench.confidence_lexicon",
        "; ONNX Runtime fp32, 1 thread",
    )
    lines += [
        f"- half-models: `{args.jackknife}/bundle-a` and `-b`, each the committed student's "
        "shape trained on one half of the training pairs (`python -m bench.confidence_lexicon "
        "split` prints their commands), translating the other half",
        "- the lexicon: a ridge (alpha 100) over the pieces each source and translation holds, "
        "of the chrF the half-models' eleven features leave unexplained; a twelfth feature "
        f"for `{args.model_dir}`, its ridge refitted on val; Spearman with sentence chrF",
        "",
        *judge(args.jackknife, args.model_dir),
    ]
    report = "\n".join(lines)
    print(report)
    replace_section("confidence-lexicon", report)


if __name__ == "__main__":
    main()
