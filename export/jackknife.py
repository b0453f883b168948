"""Jackknifed quality labels: translations with real errors, for the confidence's lexicon.

    make distill DISTILLED=build/distilled/fr-en-committed   # what the halves learn to write
    nmt jackknife split --out build/jackknife \
        --targets build/distilled/fr-en-committed/train.en  # two halves of the training pairs,
                                                # and the commands that train and export each
    # (run them: about 80 minutes each on one core of an AMD EPYC Zen 3, side by side)
    nmt jackknife label --dir build/jackknife   # each half translated by the other's model
    nmt calibrate --model-dir build/models/fr-en --jackknife build/jackknife

Why: a calibration learns from translations whose quality is known, and the served model's
own translations can be labelled only where it was not trained (Multi30k val: 1,014
sentences); its training sources it has learned. Two models of the served model's shape,
each trained on one half of the training pairs, translate the other half: 29,000
translations with real errors, labelled by their sentence chrF against the reference. From
them `nmt calibrate` learns a lexicon: which pieces make translations go better or worse than
the decoder's own features foretell (export/calibration.py, fit_lexicon). The nearer the
half-models come to the served model, the better their labels teach it: they learn to write
what the served model writes (its own translations of their half's sources, `--targets`),
which made them better models than the references did (val BLEU 45.4 against 43.9).

This module splits, and writes and reads the labels; `nmt jackknife label` (nmt_cli, where
the offline side may meet the runtime) translates as the server does. The half-models share
the served model's tokenizer (the labels record its checksum, and
`nmt calibrate` refuses labels made with another), so that a piece means the same to both.
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

HALVES = ("a", "b")
LABELS_FORMAT = 1
# What labels must share to be learned from together: one search, one tokenizer.
AGREEING = ("beam_size", "tokenizer", "vocab_sizes")
# The recipe of each half for the committed fr-en model: its student's shape (6 + 1 layers,
# pre-norm), 20 epochs, one core each (docs/confidence.md).
FR_EN_RECIPE = (
    "--tokenizer models/fr-en/sentencepiece.model --encoder-layers 6 --decoder-layers 1 "
    "--pre-norm --positions sinusoidal_offset --decoder-start eos --warmup-steps 400 "
    "--dropout 0.1 --patience 6 --threads 1 --device cpu --max-epochs 20 "
    "--valid-bleu-sentences 400 --seed 1"
)


def other(half: str) -> str:
    return HALVES[1 - HALVES.index(half)]


def split(
    data: Path,
    out: Path,
    recipe: str = FR_EN_RECIPE,
    seed: int = 0,
    targets: Path | None = None,
) -> list[str]:
    """The training pairs of `data` (train.fr, train.en) shuffled (seeded) into two halves,
    each a data directory with the real val set, train.ids (which training lines it holds)
    and reference.en (their references, which the labels are scored against); returns the
    commands that train and export a model on each, one core each. With `targets` (one line
    per training source, e.g. a teacher's translations) the half-models learn those
    instead of the references (train.en)."""
    french, english = read_lines(data / "train.fr"), read_lines(data / "train.en")
    learned = read_lines(targets) if targets else english
    for name, lines in (("English", english), ("target", learned)):
        if len(lines) != len(french):
            raise ValueError(f"{data}: {len(french)} French and {len(lines)} {name} lines")
    order = list(range(len(french)))
    random.Random(seed).shuffle(order)  # (Multi30k's lines alternate in length: not by parity)
    middle = len(order) // 2
    for half, ids in zip(HALVES, (sorted(order[:middle]), sorted(order[middle:])), strict=True):
        folder = out / f"data-{half}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "train.fr").write_text("".join(french[i] + "\n" for i in ids))
        (folder / "train.en").write_text("".join(learned[i] + "\n" for i in ids))
        (folder / "reference.en").write_text("".join(english[i] + "\n" for i in ids))
        (folder / "train.ids").write_text("".join(f"{i}\n" for i in ids))
        for lang in ("fr", "en"):
            link = folder / f"val.{lang}"
            if not link.exists():
                link.symlink_to((data / f"val.{lang}").resolve())
    return [
        f"taskset -c {core} nmt train --run-dir {out}/runs/half-{half} --out {out}/half-{half} "
        f"--data-dir {out}/data-{half} {recipe} && "
        f"nmt export --checkpoint {out}/half-{half} --out {out}/bundle-{half}"
        for core, half in enumerate(HALVES)
    ]


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


def labels_path(jackknife: Path, search: str, half: str) -> Path:
    """The labels of half `half`, translated by the model trained on the other half."""
    return jackknife / "labels" / f"{search}-{half}.jsonl.gz"


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
    """Both halves' labels for one search, checked to come from one labelling."""
    headers, labels = [], None
    for half in HALVES:
        path = labels_path(jackknife, search, half)
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
        raise ValueError(f"{jackknife}: the halves' {search} labels differ in {AGREEING}")
    return labels


def pooled(jackknives: list[Path], search: str) -> Labels:
    """The labels of several jackknives for one search together: each training sentence
    labelled once by each (half-models of other recipes err differently, and the lexicon
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
