"""SentencePiece on the serving side: source text -> ids (ending in </s>), ids -> target text.

The layouts, recorded in bundle.json's "tokenizer" section:
* {"source", "target"}: ids are the SentencePiece ids (our joint model: one file for both);
* {"source", "target", "vocab"}: a piece -> id vocabulary (imported Hugging Face models):
  SentencePiece models cut text into pieces, and `vocab.json` maps pieces to model ids
  (unknown pieces -> <unk>), as `MarianTokenizer` and `M2M100Tokenizer` do. NLLB's and
  mBART-50's fairseq ids (SentencePiece's shifted by one, four specials first) are written
  out into such a vocabulary at import, so they read the same way;
* plus "target_vocab" (Marian tc-big models with separate vocabularies): the target side's
  own vocabulary; without it both sides share "vocab".

A multilingual bundle (bundle.json's "languages", nmt_contract.Languages) also names the
source language by a token of its own, placed by `encode`; the target language's token, forced
as the first one written, is never text (`decode` leaves it out).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from nmt_contract import join_marian_pieces, split_language_code
from service.runtime.bundle import Bundle
from service.runtime.strategies import TermWords


def _read_vocab(path: Path) -> tuple[dict[str, int], dict[int, str]]:
    vocab = json.loads(path.read_text(encoding="utf-8"))
    return vocab, {i: piece for piece, i in vocab.items()}


class BundleTokenizer:
    def __init__(self, bundle: Bundle) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(bundle.tokenizer_file("source")))
        self.target = spm.SentencePieceProcessor(model_file=str(bundle.tokenizer_file("target")))
        ids = bundle.special_ids
        self.eos_id, self.pad_id, self.unk_id = ids["eos"], ids["pad"], ids["unk"]
        self.vocab: dict[str, int] | None = None  # source pieces -> ids
        self.target_vocab: dict[str, int] | None = None  # target pieces -> ids
        roles = bundle.manifest["tokenizer"]
        if "vocab" in roles:
            self.vocab, self.piece_of = _read_vocab(bundle.tokenizer_file("vocab"))
            self.target_vocab, self.target_piece_of = self.vocab, self.piece_of
        if "target_vocab" in roles:
            self.target_vocab, self.target_piece_of = _read_vocab(
                bundle.tokenizer_file("target_vocab")
            )
        self.languages = bundle.languages
        self.default_source_lang = bundle.source_lang
        self.skipped = {self.pad_id, self.eos_id}  # ids that are never text
        if self.languages is not None:
            self.skipped |= self.languages.token_ids

    def _marian_code(self, text: str) -> tuple[list[str], str]:
        """A multilingual Marian model's leading `>>xx<<` as a piece of its own; the
        multilingual families with language tokens (self.languages) have none."""
        return split_language_code(text) if self.languages is None else ([], text)

    def _with_language(self, ids: list[int], source_lang: str | None) -> list[int]:
        if self.languages is None:
            return ids
        return self.languages.source_ids(ids, source_lang or self.default_source_lang)

    def encode(self, texts: list[str], source_lang: str | None = None) -> list[list[int]]:
        """Source texts -> the ids the encoder reads. `source_lang`: a multilingual bundle's
        source language (nmt_contract.UnknownLanguage if it has not that one; None: its
        default, bundle.json's source_lang); a bilingual bundle ignores it."""
        # One text a call: SentencePiece encodes a list on a thread pool of its own, which
        # costs ~110 µs a call against ~6 µs for one sentence, and competes for the cores the
        # engine decodes on.
        if self.vocab is None:
            return [[*self.source.encode(text), self.eos_id] for text in texts]
        encoded = []
        for text in texts:
            code, text = self._marian_code(text)
            pieces = code + self.source.encode(text, out_type=str)
            ids = [*(self.vocab.get(p, self.unk_id) for p in pieces), self.eos_id]
            encoded.append(self._with_language(ids, source_lang))
        return encoded

    def source_spans(
        self, text: str, spans: list[tuple[int, int]], source_lang: str | None = None
    ) -> list[tuple[int, int]]:
        """Character spans [start, end) of `text` -> the spans of the source tokens that
        cover them in encode([text], source_lang)'s ids, [first, last + 1)."""
        code, rest = ([], text) if self.vocab is None else self._marian_code(text)
        shift = len(text) - len(rest)  # (a language code is one token of its own)
        before = len(code)  # tokens before the text's own pieces
        if self.languages is not None and self.languages.source_token == "prefix":
            self.languages.token_of(source_lang or self.default_source_lang)
            before += 1
        pieces = self.source.encode(rest, return_type="proto").pieces
        found = []
        for start, end in spans:
            first = len(rest[: max(start - shift, 0)].encode())  # SentencePiece counts bytes
            last = len(rest[: max(end - shift, 0)].encode())
            covering = [i for i, p in enumerate(pieces) if p.begin < last and p.end > first]
            if covering:
                found.append((before + covering[0], before + covering[-1] + 1))
            else:
                found.append((0, 0))
        return found

    def encode_target(self, text: str) -> tuple[int, ...]:
        """Target-side ids of a piece of text (a glossary term a translation must contain),
        without </s>: cut as it is cut inside a sentence after a space."""
        if self.target_vocab is None:
            return tuple(self.target.encode(text))
        pieces = self.target.encode(text, out_type=str)
        return tuple(self.target_vocab.get(piece, self.unk_id) for piece in pieces)

    def term_words(self) -> TermWords:
        """The target vocabulary as a constrained search reads it (strategies.TermWords)."""
        if self.target_vocab is not None:
            size = max(self.target_piece_of) + 1
            pieces = [self.target_piece_of.get(i, "<unk>") for i in range(size)]
        else:
            pieces = [self.target.id_to_piece(i) for i in range(self.target.get_piece_size())]
        return TermWords.from_pieces(pieces, self.skipped | {self.unk_id})

    def decode(self, ids: Iterable[int]) -> str:
        kept = [i for i in ids if i not in self.skipped]
        if self.target_vocab is None:
            return self.target.decode(kept)
        pieces = [self.target_piece_of.get(i, "<unk>") for i in kept]
        return join_marian_pieces(self.target, pieces)

    def source_pieces(self, ids: Iterable[int]) -> list[str]:
        if self.vocab is not None:
            return [self.piece_of.get(i, "<unk>") for i in ids]
        return [self.source.id_to_piece(i) for i in ids]

    def target_pieces(self, ids: Iterable[int]) -> list[str]:
        if self.target_vocab is not None:
            return [self.target_piece_of.get(i, "<unk>") for i in ids]
        return [self.target.id_to_piece(i) for i in ids]
