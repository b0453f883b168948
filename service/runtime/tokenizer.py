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
from service.runtime.strategies import TermWords


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

    def source_spans(self, text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Character spans [start, end) of `text` -> the spans of the source tokens that
        cover them in encode([text])'s ids, [first, last + 1)."""
        code, rest = ([], text) if self.vocab is None else split_language_code(text)
        shift = len(text) - len(rest)  # (a language code is one token of its own)
        pieces = self.source.encode(rest, return_type="proto").pieces
        found = []
        for start, end in spans:
            first = len(rest[: max(start - shift, 0)].encode())  # SentencePiece counts bytes
            last = len(rest[: max(end - shift, 0)].encode())
            covering = [i for i, p in enumerate(pieces) if p.begin < last and p.end > first]
            if covering:
                found.append((len(code) + covering[0], len(code) + covering[-1] + 1))
            else:
                found.append((0, 0))
        return found

    def encode_target(self, text: str) -> tuple[int, ...]:
        """Target-side ids of a piece of text (a glossary term a translation must contain),
        without </s>: cut as it is cut inside a sentence after a space."""
        if self.vocab is None:
            return tuple(self.target.encode(text))
        pieces = self.target.encode(text, out_type=str)
        return tuple(self.vocab.get(piece, self.unk_id) for piece in pieces)

    def term_words(self) -> TermWords:
        """The target vocabulary as a constrained search reads it (strategies.TermWords)."""
        if self.vocab is not None:
            pieces = [self.piece_of.get(i, "<unk>") for i in range(max(self.piece_of) + 1)]
        else:
            pieces = [self.target.id_to_piece(i) for i in range(self.target.get_piece_size())]
        return TermWords.from_pieces(pieces, {self.pad_id, self.eos_id, self.unk_id})

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
