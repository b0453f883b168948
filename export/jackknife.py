"""Jackknifed quality labels: translations with real errors, for the confidence's lexicon.

    make distill DISTILLED=build/distilled/fr-en   # what the fold models learn
    nmt jackknife split --out build/jackknife --folds 2 \
        --targets build/distilled/fr-en/train.en  # the folds of the training
                                                # pairs, and the commands that train and
                                                # export a model outside each fold
    # (run them: about 80 minutes each on one core of an AMD EPYC Zen 3 for 2 folds, side by
    #  side; on a lent GPU, `python -m export.jackknife_round`)
    nmt jackknife label --dir build/jackknife   # each fold translated by its model
    nmt calibrate --model-dir build/models/fr-en --jackknife build/jackknife

Why: a calibration learns from translations whose quality is known, and the served model's
own translations can be labelled only where it was not trained (Multi30k val: 1,014
sentences); its training sources it has learned. K models of the served model's shape, each
trained on the training pairs outside one fold of K, translate their fold: 29,000
translations with real errors, labelled by their sentence chrF against the reference. From
them `nmt calibrate` learns a lexicon: which pieces make translations go better or worse than
the decoder's own features foretell (export/calibration.py, fit_lexicon). The nearer the
fold models come to the served model, the better their labels teach it: they learn to write
what the served model writes (its own translations of their sources, `--targets`), which made
half-models better models than the references did (val BLEU 45.4 against 43.9), and more
folds give each model more of the data (2 folds: half of it; 4: three quarters).

This module splits, and writes and reads the labels; `nmt jackknife label` (nmt_cli, where
the offline side may meet the runtime) translates as the server does. The fold models share
the served model's tokenizer (the labels record its checksum, and
`nmt calibrate` refuses labels made with another), so that a piece means the same to all.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from export.data import read_lines

LABELS_FORMAT = 1
# The jackknife's description, written by split: its folds, seed and what the models learn.
MANIFEST = "jackknife.json"
# What labels must share to be learned from together: one search, one tokenizer.
AGREEING = ("beam_size", "tokenizer", "vocab_sizes")
# Each fold model for the committed fr-en model: its student's shape (6 + 1 layers,
# pre-norm) and tokenizer (docs/confidence.md).
FOLD_MODEL = (
    "--tokenizer models/fr-en/sentencepiece.model --encoder-layers 6 --decoder-layers 1 "
    "--pre-norm --positions sinusoidal_offset --decoder-start eos --warmup-steps 400 "
    "--dropout 0.1 --patience 6 --valid-bleu-sentences 400 --seed 1"
)
# ... trained on CPU cores: 20 epochs, one core each.
FR_EN_RECIPE = f"{FOLD_MODEL} --threads 1 --device cpu --max-epochs 20"


def fold_names(count: int) -> list[str]:
    """The folds' names: a, b, c, ..."""
    if not 2 <= count <= 26:
        raise ValueError(f"a jackknife has 2 to 26 folds, not {count}")
    return [chr(ord("a") + index) for index in range(count)]


def folds_of(jackknife: Path) -> list[str]:
    """The folds of the jackknife in `jackknife`, as split wrote them."""
    manifest = jackknife / MANIFEST
    if not manifest.is_file():
        raise FileNotFoundError(
            f"{manifest} is missing: make the jackknife with `nmt jackknife split --out "
            f"{jackknife}`"
        )
    return json.loads(manifest.read_text())["folds"]


def split(
    data: Path,
    out: Path,
    recipe: str = FR_EN_RECIPE,
    seed: int = 0,
    targets: Path | None = None,
    folds: int = 2,
    cores: int = 2,
) -> list[str]:
    """The training pairs of `data` (train.fr, train.en) shuffled (seeded) into `folds`
    folds. For each fold X, two folders: heldout-X, the fold itself (source.fr, reference.en,
    ids: which training lines it holds), which model X translates for its labels; and
    data-X, what model X learns from: every pair outside fold X (train.fr, train.en,
    train.ids) and the real val set. With `targets` (one line per training source, e.g. a
    teacher's translations) the models learn those instead of the references (train.en);
    the labels stay scored against the references. Returns the commands that train and
    export the models: one line per core, each training its share of the folds in turn."""
    french, english = read_lines(data / "train.fr"), read_lines(data / "train.en")
    learned = read_lines(targets) if targets else english
    if len(english) != len(french):
        raise ValueError(f"{data}: {len(french)} French and {len(english)} English lines")
    if len(learned) != len(french):
        raise ValueError(f"{targets}: {len(learned)} target lines for {len(french)} sources")
    names = fold_names(folds)
    order = list(range(len(french)))
    random.Random(seed).shuffle(order)  # (Multi30k's lines alternate in length: not by parity)
    for index, fold in enumerate(names):
        held = sorted(order[index::folds])
        outside = sorted(set(order) - set(held))
        heldout = out / f"heldout-{fold}"
        heldout.mkdir(parents=True, exist_ok=True)
        _write(heldout / "source.fr", (french[i] for i in held))
        _write(heldout / "reference.en", (english[i] for i in held))
        _write(heldout / "ids", map(str, held))
        trained = out / f"data-{fold}"
        trained.mkdir(parents=True, exist_ok=True)
        _write(trained / "train.fr", (french[i] for i in outside))
        _write(trained / "train.en", (learned[i] for i in outside))
        _write(trained / "train.ids", map(str, outside))
        for lang in ("fr", "en"):
            link = trained / f"val.{lang}"
            if not link.exists():
                link.symlink_to((data / f"val.{lang}").resolve())
    manifest = {"folds": names, "seed": seed, "targets": str(targets) if targets else None}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return [
        f"taskset -c {core} "
        + " && ".join(
            f"nmt train --run-dir {out}/runs/model-{fold} --out {out}/model-{fold} "
            f"--data-dir {out}/data-{fold} {recipe} && "
            f"nmt export --checkpoint {out}/model-{fold} --out {out}/bundle-{fold}"
            for fold in names[core::cores]
        )
        for core in range(min(cores, folds))
    ]


def _write(path: Path, lines: Iterable[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def tokenizer_checksum(files: dict[str, Path]) -> str:
    """One checksum of a bundle's tokenizer files (side -> path: Bundle.tokenizer_files):
    equal when ids mean the same pieces."""
    digest = hashlib.sha256()
    for side in sorted(files):
        digest.update(side.encode())
        digest.update(Path(files[side]).read_bytes())
    return digest.hexdigest()


@dataclass
class Labels:
    """Translations of held-out sentences by one search, with what their confidence is made
    of and their sentence chrF against the reference."""

    search: str
    beam_size: int
    tokenizer: str  # tokenizer_checksum of the models that made them
    vocab_sizes: tuple[int, int]  # (source, target)
    features: list[dict[str, float]]
    source_ids: list[list[int]]
    output_ids: list[list[int]]
    chrf: list[float]


def labels_path(jackknife: Path, search: str, fold: str) -> Path:
    """The labels of fold `fold`, translated by the model trained outside it."""
    return jackknife / "labels" / f"{search}-{fold}.jsonl.gz"


def write_labels(path: Path, header: dict, rows: Iterable[dict]) -> None:
    """A labels file: a header line (LABELS_FORMAT, the search, its beam, the tokenizer's
    checksum, the vocabularies) and a line per translation (features, source_ids,
    output_ids, chrf); written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with gzip.open(partial, "wt", encoding="utf-8") as out:
        out.write(json.dumps({"format": LABELS_FORMAT, **header}) + "\n")
        for row in rows:
            out.write(json.dumps(row) + "\n")
    partial.rename(path)


def read_labels(jackknife: Path, search: str) -> Labels:
    """Every fold's labels for one search, checked to come from one labelling."""
    headers, labels = [], None
    for fold in folds_of(jackknife):
        path = labels_path(jackknife, search, fold)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: run `nmt jackknife label --dir {jackknife}`"
            )
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            header = json.loads(next(lines))
            if header.get("format") != LABELS_FORMAT:
                raise ValueError(f"{path}: format {header.get('format')}, not {LABELS_FORMAT}")
            headers.append(header)
            if labels is None:
                labels = Labels(
                    search=search,
                    beam_size=header["beam_size"],
                    tokenizer=header["tokenizer"],
                    vocab_sizes=tuple(header["vocab_sizes"]),
                    features=[],
                    source_ids=[],
                    output_ids=[],
                    chrf=[],
                )
            for line in lines:
                row = json.loads(line)
                labels.features.append(row["features"])
                labels.source_ids.append(row["source_ids"])
                labels.output_ids.append(row["output_ids"])
                labels.chrf.append(row["chrf"])
    if any(headers[0][key] != h[key] for h in headers[1:] for key in AGREEING):
        raise ValueError(f"{jackknife}: the folds' {search} labels differ in {AGREEING}")
    return labels


def pooled(jackknives: list[Path], search: str) -> Labels:
    """The labels of several jackknives for one search together: each training sentence
    labelled once by each (fold models of other recipes err differently, and the lexicon
    learns from every label). They must have one tokenizer and one beam."""
    first, *rest = (read_labels(folder, search) for folder in jackknives)
    for folder, labels in zip(jackknives[1:], rest, strict=True):
        for field in AGREEING:
            if getattr(labels, field) != getattr(first, field):
                raise ValueError(
                    f"{folder}'s {search} labels differ from {jackknives[0]}'s in {field}"
                )
        first.features += labels.features
        first.source_ids += labels.source_ids
        first.output_ids += labels.output_ids
        first.chrf += labels.chrf
    return first
