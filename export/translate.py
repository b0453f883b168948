"""Translate sentences with the torch model (the reference path), batched by length."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from export.data import pad
from export.decoding import Hypothesis, beam_search, greedy_search
from export.model.transformer import Transformer
from export.tokenizer import Tokenizer, VocabTokenizer


def length_sorted_chunks(lengths: list[int], batch_size: int) -> Iterator[list[int]]:
    """Indices in chunks of similar length (less padding); callers restore the order."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def translate_ids(
    model: Transformer,
    sources: list[list[int]],
    beam_size: int = 1,
    batch_size: int = 32,
    max_length: int = 256,
    length_penalty: float = 1.0,
    n_best: int = 1,
    first_token: int | None = None,
) -> list[list[Hypothesis]]:
    """Source id lists -> n_best hypotheses each, in input order. `first_token`: the token
    every translation starts with, forced (a multilingual model's target language)."""
    results: list[list[Hypothesis]] = [[] for _ in sources]
    device = next(model.parameters()).device
    for chunk in length_sorted_chunks([len(s) for s in sources], batch_size):
        source_ids = pad([sources[i] for i in chunk], model.config.pad_id).to(device)
        lengths = torch.tensor([len(sources[i]) for i in chunk], device=device)
        source_mask = torch.arange(source_ids.shape[1], device=device)[None] < lengths[:, None]
        firsts = None if first_token is None else [first_token] * len(chunk)
        if beam_size == 1:
            found = [
                [h]
                for h in greedy_search(
                    model, source_ids, source_mask, max_length, length_penalty, firsts
                )
            ]
        else:
            found = beam_search(
                model,
                source_ids,
                source_mask,
                beam_size,
                length_penalty,
                n_best,
                max_length,
                first_tokens=firsts,
            )
        for index, hypotheses in zip(chunk, found, strict=True):
            results[index] = hypotheses
    return results


def translate_texts(
    model: Transformer,
    tokenizer: Tokenizer | VocabTokenizer,
    texts: list[str],
    beam_size: int = 1,
    batch_size: int = 32,
    max_length: int = 256,
    length_penalty: float = 1.0,
) -> list[str]:
    """Texts in the model's source language -> translations into its target language (a
    multilingual model's default pair, whose target language token is then forced first)."""
    languages = getattr(tokenizer, "languages", None)
    first = None if languages is None else languages.forced_target(model.config.target_lang)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            found = translate_ids(
                model,
                tokenizer.encode_batch(texts),
                beam_size,
                batch_size,
                max_length,
                length_penalty,
                first_token=first,
            )
    finally:
        model.train(was_training)
    return [tokenizer.decode(h[0].tokens) for h in found]
