"""SentencePiece on the serving side: source text -> ids (ending in </s>), ids -> target text."""

from __future__ import annotations

from collections.abc import Iterable

import sentencepiece as spm

from service.bundle import Bundle


class BundleTokenizer:
    def __init__(self, bundle: Bundle) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(bundle.tokenizer_file("source")))
        self.target = spm.SentencePieceProcessor(model_file=str(bundle.tokenizer_file("target")))
        ids = bundle.special_ids
        self.eos_id, self.pad_id = ids["eos"], ids["pad"]

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[*ids, self.eos_id] for ids in self.source.encode(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.target.decode([i for i in ids if i not in (self.pad_id, self.eos_id)])

    def source_pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.source.id_to_piece(i) for i in ids]

    def target_pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.target.id_to_piece(i) for i in ids]
