"""SentencePiece on the serving side: source text -> ids (ending in </s>), ids -> target text.

Two layouts, recorded in bundle.json's "tokenizer" section:
* {"source", "target"}: ids are the SentencePiece ids (our joint model: one file for both);
* {"source", "target", "vocab"}: Marian's layout (imported Hugging Face models): separate
  source and target SentencePiece models cut text into pieces, and a shared `vocab.json` maps
  pieces to model ids (unknown pieces -> <unk>), as `MarianTokenizer` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import sentencepiece as spm

from nmt_contract import join_marian_pieces, split_language_code
from service.runtime.bundle import Bundle


class BundleTokenizer:
    def __init__(self, bundle: Bundle) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(bundle.tokenizer_file("source")))
        self.target = spm.SentencePieceProcessor(model_file=str(bundle.tokenizer_file("target")))
        ids = bundle.special_ids
        self.eos_id, self.pad_id, self.unk_id = ids["eos"], ids["pad"], ids["unk"]
        self.vocab: dict[str, int] | None = None
        if "vocab" in bundle.manifest["tokenizer"]:
            self.vocab = json.loads(bundle.tokenizer_file("vocab").read_text(encoding="utf-8"))
            self.piece_of = {i: piece for piece, i in self.vocab.items()}

    def encode(self, texts: list[str]) -> list[list[int]]:
        # One text a call: SentencePiece encodes a list on a thread pool of its own, which
        # costs ~110 µs a call against ~6 µs for one sentence, and competes for the cores the
        # engine decodes on.
        if self.vocab is None:
            return [[*self.source.encode(text), self.eos_id] for text in texts]
        encoded = []
        for text in texts:
            code, text = split_language_code(text)
            pieces = code + self.source.encode(text, out_type=str)
            encoded.append([*(self.vocab.get(p, self.unk_id) for p in pieces), self.eos_id])
        return encoded

    def decode(self, ids: Iterable[int]) -> str:
        kept = [i for i in ids if i not in (self.pad_id, self.eos_id)]
        if self.vocab is None:
            return self.target.decode(kept)
        return join_marian_pieces(self.target, [self.piece_of.get(i, "<unk>") for i in kept])

    def source_pieces(self, ids: Iterable[int]) -> list[str]:
        if self.vocab is not None:
            return [self.piece_of.get(i, "<unk>") for i in ids]
        return [self.source.id_to_piece(i) for i in ids]

    def target_pieces(self, ids: Iterable[int]) -> list[str]:
        if self.vocab is not None:
            return [self.piece_of.get(i, "<unk>") for i in ids]
        return [self.target.id_to_piece(i) for i in ids]
