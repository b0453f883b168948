"""A lexical vocabulary shortlist: which target words a source sentence can lead to.

At every decoder step the output projection scores all V words ([rows, D] x [D, V]) and the
log-softmax and top-k run over all of them: at 8000 words that is 43% of a step's
multiply-adds. Most words are never plausible for a given sentence. A shortlist, as Marian
and CTranslate2 offer, scores only the candidates of the sentences in the batch:

* the `always` most frequent target words (function words, punctuation, </s>): they can
  follow any source;
* for every source word, the `per_source` target words most associated with it in the
  training corpus.

Association is the Dice coefficient of sentence-level co-occurrence,
2 * pairs(s, t) / (sentences with s + sentences with t): high when s and t appear in the same
sentence pairs and rarely apart, which favours translations over words that are merely
frequent (those are in the `always` set anyway).

The shortlist changes results: log-probs are normalized over the candidates only, and a word
outside them cannot be written. It is therefore opt-in (`NMT_SHORTLIST`, `--shortlist`), with
its BLEU and speed reported next to the full vocabulary's (docs/performance.md).

File: `shortlist.npz` in the model directory (`nmt shortlist` writes it; `nmt export` copies
it into the bundle); its layout and how a batch's candidates are read from it are in
nmt_contract.Shortlist, which the runtime shares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nmt_contract import Shortlist


def build_shortlist(
    source_ids: list[list[int]],
    target_ids: list[list[int]],
    vocab_size: int,
    special_ids: list[int],
    per_source: int = 20,
    always: int = 200,
) -> Shortlist:
    """From a tokenized parallel corpus (ids without padding): the `always` most frequent
    target ids (plus `special_ids`), and each source id's `per_source` best target ids by
    Dice coefficient of sentence co-occurrence."""
    if len(source_ids) != len(target_ids):
        raise ValueError(f"{len(source_ids)} source sentences but {len(target_ids)} targets")
    pairs = np.zeros(vocab_size * vocab_size, dtype=np.int64)  # [V * V]: pairs[s * V + t]
    in_source = np.zeros(vocab_size, dtype=np.int64)  # sentences holding each source id
    in_target = np.zeros(vocab_size, dtype=np.int64)
    target_count = np.zeros(vocab_size, dtype=np.int64)  # occurrences of each target id
    chunk: list[np.ndarray] = []
    for source, target in zip(source_ids, target_ids, strict=True):
        s, t = np.unique(source), np.unique(target)
        in_source[s] += 1
        in_target[t] += 1
        np.add.at(target_count, np.asarray(target, dtype=np.int64), 1)
        chunk.append((s[:, None] * vocab_size + t[None, :]).ravel())
        if len(chunk) == 4096:  # bincount a few thousand sentences at a time
            pairs += np.bincount(np.concatenate(chunk), minlength=vocab_size * vocab_size)
            chunk = []
    if chunk:
        pairs += np.bincount(np.concatenate(chunk), minlength=vocab_size * vocab_size)
    pairs = pairs.reshape(vocab_size, vocab_size)

    # Dice [V, V]; a source id never seen gets no candidates (the `always` set remains).
    denominator = in_source[:, None] + in_target[None, :]
    dice = np.where(pairs > 0, 2.0 * pairs / np.maximum(denominator, 1), 0.0)
    width = min(per_source, vocab_size)
    best = np.argpartition(-dice, width - 1, axis=1)[:, :width]  # [V, width], unordered
    best_scores = np.take_along_axis(dice, best, axis=1)
    order = np.argsort(-best_scores, axis=1, kind="stable")
    best, best_scores = (
        np.take_along_axis(best, order, 1),
        np.take_along_axis(best_scores, order, 1),
    )
    candidates = np.where(best_scores > 0, best, -1).astype(np.int32)

    frequent = np.argsort(-target_count, kind="stable")[:always]
    frequent = frequent[target_count[frequent] > 0]
    fixed = np.union1d(frequent, np.asarray(special_ids, dtype=np.int64)).astype(np.int32)
    return Shortlist(always=fixed, candidates=candidates)


def quantize_columns(projection: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The output projection [D, V] float -> int8 [D, V] and a scale per column [V]
    (symmetric: column c is scale[c] * int8[:, c]), for the int8 shortlisted step, which
    gathers a batch's candidate columns with their scales. A scale per word rather than one
    for the matrix: a rare word's small column keeps its precision.

    Seven bits (-63..63), as ONNX Runtime's `reduce_range`: on a CPU with AVX2 but no VNNI
    (AMD Zen 3), MLAS multiplies u8 activations by s8 weights given as an input with
    `vpmaddubsw`, which adds two products into 16 bits and saturates: full-range weights
    put 11-15% errors into the logits there, seven bits 2% (docs/performance.md)."""
    largest = np.abs(projection).max(axis=0)  # [V]
    scale = np.where(largest > 0, largest / SEVEN_BITS, 1.0).astype(np.float32)
    quantized = np.clip(np.rint(projection / scale), -SEVEN_BITS, SEVEN_BITS).astype(np.int8)
    return quantized, scale


SEVEN_BITS = 63  # the largest int8 weight whose pair of products with u8 fits in int16


def write_ctranslate2_vmap(shortlist: Shortlist, piece_of: list[str], path: Path) -> None:
    """The same shortlist as CTranslate2's vocabulary map (`--vocab_mapping`): a line with an
    empty source for the words always allowed, then `source piece<TAB>target pieces`."""
    lines = ["\t" + " ".join(piece_of[i] for i in shortlist.always)]
    for source, row in enumerate(shortlist.candidates):
        targets = [piece_of[i] for i in row if i >= 0]
        if targets:
            lines.append(piece_of[source] + "\t" + " ".join(targets))
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def shortlist_from_corpus(
    model_dir: Path, data_dir: Path, prefix: str = "train", per_source: int = 20, always: int = 200
) -> Shortlist:
    """The shortlist of a model directory's tokenizer over `{prefix}.{source,target lang}`."""
    from export.checkpoint import load_tokenizer
    from export.data import read_parallel
    from export.model.config import ModelConfig
    from export.tokenizer import VocabTokenizer

    config = ModelConfig.from_json(Path(model_dir) / "config.json")
    if not config.share_encoder_decoder_embeddings:
        # (nmt_contract.Shortlist has a row per source id and the runtime checks it against
        # the one vocabulary size a bundle has had so far)
        raise ValueError(
            f"{model_dir} has separate source and target vocabularies: shortlists are built "
            "for models with one shared vocabulary"
        )
    tokenizer = load_tokenizer(Path(model_dir))
    sources, targets = read_parallel(
        Path(data_dir) / f"{prefix}.{config.source_lang}",
        Path(data_dir) / f"{prefix}.{config.target_lang}",
    )
    source_ids = tokenizer.encode_batch(sources)
    if isinstance(tokenizer, VocabTokenizer):  # the target side has its own pieces
        target_ids = [tokenizer.encode_target(t) for t in targets]
    else:
        target_ids = tokenizer.encode_batch(targets)
    specials = [config.pad_id, config.eos_id, config.unk_id, config.decoder_start_id]
    return build_shortlist(
        source_ids, target_ids, config.vocab_size, specials, per_source=per_source, always=always
    )
