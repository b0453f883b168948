"""How well cross-attention aligns words: alignment error rate on hand-aligned sentence pairs.

    python -m bench.alignment_quality --checkpoint models/fr-en

The gold standard is tests/data/alignment/gold.jsonl (format: tests/data/alignment/README.md):
French sentences of our own in several styles, their English translations, and word alignments
with sure (S) and possible (P) links. Each gold English sentence is forced through the torch
model (teacher forcing: the decoder reads the gold English, not its own output), which gives
every decoder layer's cross-attention for every head, independently of the ONNX graphs the
service runs. Pieces are merged into words and each target word is paired with its best
source word exactly as the service does it (service/serving/word_alignment.py), and the
alignment error rate of Och & Ney (2003) is taken over the whole set:

    AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|),  with S ⊆ P

(A: the links found; lower is better, 0 is perfect). Baselines: the diagonal, and lexical
co-occurrence models trained by EM on Multi30k's training pairs plus the gold sentences (an
unsupervised aligner always sees the text it aligns): IBM Model 1 and fast_align's
reparameterized IBM Model 2 (its diagonal prior). Writes the `alignment-quality` section of
docs/attention.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.report import replace_section
from service.serving.word_alignment import END, group_words, word_alignment

if TYPE_CHECKING:
    import torch

GOLD = Path("tests/data/alignment/gold.jsonl")
REPORT = Path("docs/attention.md")
COMMAND = "python -m bench.alignment_quality --checkpoint models/fr-en"

Link = tuple[int, int]  # (source word, target word), 0-based, as Moses writes "s-t"


@dataclass(frozen=True)
class GoldPair:
    id: str
    style: str
    source_words: list[str]
    target_words: list[str]
    sure: frozenset[Link]
    possible: frozenset[Link]  # P: every acceptable link, the sure ones included

    @property
    def source(self) -> str:
        return " ".join(self.source_words)

    @property
    def target(self) -> str:
        return " ".join(self.target_words)


def load_gold(path: Path = GOLD) -> list[GoldPair]:
    """Read the gold file; P in memory is the file's `sure` plus its `possible` (S ⊆ P)."""
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        sure = frozenset((s, t) for s, t in record["sure"])
        extra = frozenset((s, t) for s, t in record["possible"])
        pairs.append(
            GoldPair(
                id=record["id"],
                style=record["style"],
                source_words=record["source_words"],
                target_words=record["target_words"],
                sure=sure,
                possible=sure | extra,
            )
        )
        if not pairs[-1].source_words or not pairs[-1].target_words:
            raise ValueError(f"{path}:{number}: empty sentence")
    return pairs


# ----------------------------------------------------------------------------- the metric


@dataclass
class Counts:
    """What AER, precision and recall are made of, summed over sentences."""

    found: int = 0  # |A|
    sure: int = 0  # |S|
    found_sure: int = 0  # |A ∩ S|
    found_possible: int = 0  # |A ∩ P|

    def add(self, found: Iterable[Link], sure: Iterable[Link], possible: Iterable[Link]) -> None:
        found, sure, possible = set(found), set(sure), set(possible)
        self.found += len(found)
        self.sure += len(sure)
        self.found_sure += len(found & sure)
        self.found_possible += len(found & possible)

    @property
    def aer(self) -> float:
        return 1.0 - (self.found_sure + self.found_possible) / (self.found + self.sure)

    @property
    def precision(self) -> float:
        return self.found_possible / self.found if self.found else 0.0

    @property
    def recall(self) -> float:
        return self.found_sure / self.sure if self.sure else 0.0


def aer(found: Iterable[Link], sure: Iterable[Link], possible: Iterable[Link]) -> float:
    """AER of one alignment (Och & Ney 2003); `possible` must include the sure links."""
    counts = Counts()
    counts.add(found, sure, possible)
    return counts.aer


def corpus_aer(alignments: Sequence[Iterable[Link]], gold: Sequence[GoldPair]) -> Counts:
    """Counts summed over sentences (AER of the whole set, not a mean of sentence AERs)."""
    counts = Counts()
    for found, pair in zip(alignments, gold, strict=True):
        counts.add(found, pair.sure, pair.possible)
    return counts


# ----------------------------------------------------------------------------- baselines


def diagonal_alignment(source_length: int, target_length: int) -> set[Link]:
    """Target word t -> the source word at the same relative position."""
    return {
        (min(source_length - 1, int((t + 0.5) * source_length / target_length)), t)
        for t in range(target_length)
    }


def lexical_key(word: str) -> str:
    """Words as the lexical models count them: lower case, outer punctuation stripped."""
    stripped = word.lower().strip('.,;:!?«»"()')
    return stripped or word


class LexicalAligner:
    """IBM Model 1, or with `tension` > 0 fast_align's reparameterized IBM Model 2 (Dyer et
    al. 2013): p(source j | target i) ∝ exp(-tension * |i/m - j/n|), a null word with p0.
    Translation probabilities t(target word | source word) are learnt by EM, vectorized over
    every (source word, target word) pair of the corpus."""

    def __init__(self, tension: float = 0.0, null_probability: float = 0.08) -> None:
        self.tension = tension
        self.null_probability = null_probability
        self.source_ids: dict[str, int] = {"<null>": 0}
        self.target_ids: dict[str, int] = {}
        self.table: dict[tuple[int, int], float] = {}

    def _ids(self, words: list[str], ids: dict[str, int]) -> list[int]:
        return [ids.setdefault(lexical_key(w), len(ids)) for w in words]

    def prior(self, target: int, source_length: int, target_length: int) -> np.ndarray:
        """[1 + n]: the null word, then each source position, for target position `target`."""
        if self.tension == 0.0:
            weights = np.full(source_length, 1.0 / source_length)
        else:
            distance = np.abs(
                (target + 1) / target_length - (np.arange(source_length) + 1) / source_length
            )
            weights = np.exp(-self.tension * distance)
            weights /= weights.sum()
        return np.concatenate([[self.null_probability], (1 - self.null_probability) * weights])

    def train(self, pairs: Sequence[tuple[list[str], list[str]]], iterations: int = 5) -> None:
        rows_source, rows_target, rows_token, rows_prior = [], [], [], []
        token = 0
        for source_words, target_words in pairs:
            source = np.array([0, *self._ids(source_words, self.source_ids)])
            target = self._ids(target_words, self.target_ids)
            for position, word in enumerate(target):
                rows_source.append(source)
                rows_target.append(np.full(len(source), word))
                rows_token.append(np.full(len(source), token))
                rows_prior.append(self.prior(position, len(source) - 1, len(target)))
                token += 1
        source_of = np.concatenate(rows_source)
        target_of = np.concatenate(rows_target)
        token_of = np.concatenate(rows_token)
        prior = np.concatenate(rows_prior)
        # One parameter per (source word, target word) seen together: t(target | source).
        keys = source_of.astype(np.int64) * len(self.target_ids) + target_of
        unique, parameter_of = np.unique(keys, return_inverse=True)
        unique_source = unique // len(self.target_ids)
        table = np.ones(len(unique))
        for _ in range(iterations):
            score = prior * table[parameter_of]
            posterior = score / np.bincount(token_of, score)[token_of]
            counts = np.bincount(parameter_of, posterior, minlength=len(unique))
            totals = np.bincount(unique_source, counts)
            table = counts / totals[unique_source]
        unique_target = unique % len(self.target_ids)
        self.table = dict(
            zip(
                zip(unique_source.tolist(), unique_target.tolist(), strict=True),
                table.tolist(),
                strict=True,
            )
        )

    def align(self, source_words: list[str], target_words: list[str]) -> set[Link]:
        """Each target word -> its most probable source word (the null word: unaligned)."""
        source = [0, *(self.source_ids.get(lexical_key(w), -1) for w in source_words)]
        target = [self.target_ids.get(lexical_key(w), -1) for w in target_words]
        links = set()
        for position, word in enumerate(target):
            prior = self.prior(position, len(source_words), len(target_words))
            score = [
                p * self.table.get((s, word), 1e-9) for p, s in zip(prior, source, strict=True)
            ]
            best = int(np.argmax(score))
            if best > 0:
                links.add((best - 1, position))
        return links


# ----------------------------------------------------------------------------- attention


def attention_links(
    source_pieces: list[str], target_pieces: list[str], weights: np.ndarray
) -> set[Link]:
    """The service's rule: weights [target pieces, source pieces] -> word links."""
    return set(word_alignment(source_pieces, target_pieces, weights).pairs)


def shifted(weights: np.ndarray) -> np.ndarray:
    """Row i <- row i+1: the attention of the step that *reads* target token i rather than
    the step that writes it (Chen et al. 2020, "shift-att"). The </s> row takes the last."""
    return np.concatenate([weights[1:], weights[-1:]], axis=0)


def encode_target(tokenizer: object, text: str) -> tuple[list[int], list[str]]:
    """Target ids and pieces, without </s>, for our joint tokenizer or Marian's."""
    if hasattr(tokenizer, "processor"):  # export.tokenizer.Tokenizer: one joint model
        pieces = tokenizer.processor.encode(text, out_type=str)
        return [tokenizer.processor.piece_to_id(p) for p in pieces], pieces
    pieces = tokenizer.target.encode(text, out_type=str)  # VocabTokenizer
    return [tokenizer.vocab.get(p, tokenizer.unk_id) for p in pieces], pieces


def cross_attention(model: torch.nn.Module, source_ids: list[int], target_ids: list[int]):
    """Forced decoding: every decoder layer's cross-attention weights, [L, H, T+1, S].

    Row i is the step that writes target token i (the last row writes </s>), as in the
    service. The model's own decode(all_attention=True) returns them: the same weights its
    export hands the service, layer by layer.
    """
    import torch

    config = model.config
    source = torch.tensor([source_ids])
    source_mask = torch.ones_like(source, dtype=torch.bool)
    target_in = torch.tensor([[config.decoder_start_id, *target_ids]])
    with torch.no_grad():
        cross = model.cross_keys_values(model.encode(source, source_mask))
        past = model.empty_cache(1, source.device)
        _, _, layers = model.decode(target_in, past, cross, source_mask, all_attention=True)
    return torch.stack([w[0] for w in layers]).float().numpy()


@dataclass
class Forced:
    source_pieces: list[str]
    target_pieces: list[str]
    weights: np.ndarray  # [L, H, T+1, S]


def force_all(checkpoint: Path, gold: Sequence[GoldPair]) -> list[Forced]:
    from export.checkpoint import load_model_dir

    model, tokenizer = load_model_dir(checkpoint)
    forced = []
    for pair in gold:
        source_ids = tokenizer.encode(pair.source)
        source_pieces = [*tokenizer.pieces(pair.source), END]
        target_ids, target_pieces = encode_target(tokenizer, pair.target)
        target_pieces = [*target_pieces, END]
        for pieces, words, side in (
            (source_pieces, pair.source_words, "source"),
            (target_pieces, pair.target_words, "target"),
        ):
            if group_words(pieces)[0] != words:
                raise ValueError(
                    f"{pair.id}: the tokenizer's {side} words {group_words(pieces)[0]} are not "
                    f"the gold words {words}"
                )
        weights = cross_attention(model, source_ids, target_ids)
        forced.append(Forced(source_pieces, target_pieces, weights))
    return forced


# ----------------------------------------------------------------------------- report


@dataclass
class Row:
    name: str
    links: list[set[Link]]  # one alignment per gold pair
    counts: Counts


def scored(name: str, links: list[set[Link]], gold: Sequence[GoldPair]) -> Row:
    return Row(name, links, corpus_aer(links, gold))


def evaluate_attention(forced: Sequence[Forced], gold: Sequence[GoldPair]) -> list[Row]:
    layers, heads = forced[0].weights.shape[:2]

    def rows_for(name: str, pick) -> Row:
        links = [attention_links(f.source_pieces, f.target_pieces, pick(f)) for f in forced]
        return scored(name, links, gold)

    rows = []
    for layer in range(layers):
        rows.append(
            rows_for(f"layer {layer}, mean of heads", lambda f, L=layer: f.weights[L].mean(0))
        )
    rows.append(rows_for("all layers, mean of heads", lambda f: f.weights.mean((0, 1))))
    for layer in range(layers):
        rows.append(
            rows_for(
                f"layer {layer}, mean of heads, shifted",
                lambda f, L=layer: shifted(f.weights[L].mean(0)),
            )
        )
    for layer in range(layers):
        for head in range(heads):
            rows.append(
                rows_for(f"layer {layer}, head {head}", lambda f, L=layer, H=head: f.weights[L, H])
            )
    return rows


def baseline_rows(gold: Sequence[GoldPair], data_dir: Path | None) -> list[Row]:
    diagonal = [diagonal_alignment(len(p.source_words), len(p.target_words)) for p in gold]
    rows = [scored("diagonal", diagonal, gold)]
    if data_dir is None:
        return rows
    corpus = [
        (source.split(), target.split())
        for source, target in zip(
            (data_dir / "train.fr").read_text(encoding="utf-8").splitlines(),
            (data_dir / "train.en").read_text(encoding="utf-8").splitlines(),
            strict=True,
        )
    ]
    gold_text = [(p.source_words, p.target_words) for p in gold]
    fast_align = "fast_align-style (IBM 2, diagonal prior)"
    for name, tension, with_gold in (
        ("IBM Model 1, Multi30k train + gold text", 0.0, True),
        (f"{fast_align}, Multi30k train + gold text", 4.0, True),
        (f"{fast_align}, Multi30k train only", 4.0, False),
    ):
        aligner = LexicalAligner(tension=tension)
        aligner.train(corpus + gold_text if with_gold else corpus)
        links = [aligner.align(p.source_words, p.target_words) for p in gold]
        rows.append(scored(name, links, gold))
    return rows


def table(rows: Sequence[Row]) -> list[str]:
    lines = ["| alignment | AER | precision | recall |", "|---|---|---|---|"]
    for row in rows:
        c = row.counts
        lines.append(f"| {row.name} | {c.aer:.3f} | {c.precision:.3f} | {c.recall:.3f} |")
    return lines


def by_style(rows: Sequence[Row], gold: Sequence[GoldPair]) -> list[str]:
    styles = sorted({p.style for p in gold}, key=[p.style for p in gold].index)
    header = " | ".join(f"{s} ({sum(p.style == s for p in gold)})" for s in styles)
    lines = [f"| alignment | {header} |", "|---|" + "---|" * len(styles)]
    for row in rows:
        name, links = row.name, row.links
        cells = []
        for style in styles:
            chosen = [i for i, p in enumerate(gold) if p.style == style]
            counts = corpus_aer([links[i] for i in chosen], [gold[i] for i in chosen])
            cells.append(f"{counts.aer:.3f}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    parser.add_argument("--gold", type=Path, default=GOLD)
    parser.add_argument("--data-dir", type=Path, default=None, help="Multi30k (for baselines)")
    parser.add_argument("--out", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    from export.train_config import multi30k_dir

    data_dir = args.data_dir or multi30k_dir()
    if not (data_dir / "train.fr").is_file():
        print(f"no Multi30k at {data_dir}: lexical baselines left out", file=sys.stderr)
        data_dir = None
    gold = load_gold(args.gold)
    forced = force_all(args.checkpoint, gold)
    layers = forced[0].weights.shape[0]
    attention = evaluate_attention(forced, gold)
    baselines = baseline_rows(gold, data_dir)
    means = [r for r in attention if r.name.endswith("mean of heads") and "all" not in r.name]
    best = min(means, key=lambda r: r.counts.aer)
    service = next(r for r in attention if r.name == f"layer {layers - 1}, mean of heads")
    heads = [r for r in attention if "head " in r.name and "heads" not in r.name]
    best_head = min(heads, key=lambda r: r.counts.aer)
    sentences, styles = len(gold), len({p.style for p in gold})
    sure = sum(len(p.sure) for p in gold)
    possible = sum(len(p.possible - p.sure) for p in gold)

    best_layer = int(best.name.split()[1].rstrip(","))
    best_shifted = min(
        (r for r in attention if r.name.endswith("shifted")), key=lambda r: r.counts.aer
    )
    lines = [
        "## Alignment quality",
        "",
        f"`{COMMAND}` (model `{args.checkpoint}`, {layers} decoder "
        f"layer{'s' if layers > 1 else ''} "
        f"numbered from 0 as `alignment_layer` would number them, {forced[0].weights.shape[1]} "
        f"heads). Gold standard: `{args.gold}`, {sentences} French sentences of our own in "
        f"{styles} styles with English translations, {sure} sure and {possible} further "
        "possible links, written by hand (format and guidelines: "
        "`tests/data/alignment/README.md`). Each gold English sentence is forced through the "
        "torch model; each target word is paired with the source word its pieces attended to "
        "most (the service's rule, `service/serving/word_alignment.py`). "
        "AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|) over the whole set (lower is better); "
        "precision |A∩P| / |A|, recall |A∩S| / |S|.",
        "",
        f"* **Best layer: {best_layer}** (AER {best.counts.aer:.3f}, mean of heads)"
        + (
            ": the last layer, which `return_alignment` returns today."
            if best is service
            else f". `return_alignment` returns layer {layers - 1} today: AER "
            f"{service.counts.aer:.3f}."
        )
        + f" Best single head: {best_head.name} ({best_head.counts.aer:.3f}).",
        "* Baselines: " + "; ".join(f"{r.name} {r.counts.aer:.3f}" for r in baselines) + ".",
        "* *Shifted* reads, for target word i, the step that takes word i as its input rather "
        "than the step that writes it (Shift-Att, Chen et al. 2020, better on their 6-layer "
        "Transformers): "
        f"here it is {'worse' if best_shifted.counts.aer > best.counts.aer else 'better'} "
        f"(best {best_shifted.counts.aer:.3f}), so the service's rule reads the right step.",
        f"* With {sure} sure links, differences of a few hundredths between two rows are within "
        "what another set of sentences could change; the gaps between layers are not.",
        "",
        *table([*attention, *baselines]),
        "",
        "By style (AER):",
        "",
        *by_style(
            [service, best, *baselines] if best is not service else [service, *baselines], gold
        ),
    ]
    replace_section("alignment-quality", "\n".join(lines), args.out)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
