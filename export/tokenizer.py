"""SentencePiece subwords: training the joint French/English model and using it.

One joint vocabulary for both languages (the embeddings are tied across encoder, decoder and
output, so source and target must share ids). Byte fallback means there are no unknown
characters: a character never seen in training is spelled as its UTF-8 bytes.

Models imported from Hugging Face (export/hf/) come instead with SentencePiece models (one per
side for Marian, one for both for M2M-100, NLLB and mBART-50) and a `vocab.json` that maps
pieces to model ids: their ids are not the SentencePiece ids. `VocabTokenizer` reads that
layout, the way `MarianTokenizer` and `M2M100Tokenizer` do; the importers write NLLB's and
mBART-50's fairseq ids out into such a vocabulary. Marian tc-big models with separate
vocabularies add `target_vocab.json`; multilingual models `languages.json` (their language
tokens: nmt_contract.Languages).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from nmt_contract import Languages, join_marian_pieces, split_language_code

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def train_sentencepiece(texts: Iterable[Path], model_prefix: Path, vocab_size: int = 8000) -> Path:
    """Train a unigram model on the given text files (one sentence a line). Returns the .model."""
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as joined:
        for path in texts:
            joined.write(Path(path).read_text(encoding="utf-8"))
    spm.SentencePieceTrainer.train(
        input=joined.name,
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=True,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        input_sentence_size=2_000_000,
        shuffle_input_sentence=True,
        seed_sentencepiece_size=1_000_000,
        num_threads=2,
        hard_vocab_limit=False,  # small corpora (tests) may not fill the vocabulary
        minloglevel=2,
    )
    Path(joined.name).unlink()
    return model_prefix.with_suffix(".model")


class Tokenizer:
    """Text <-> ids. Sources end with </s> (as Marian's); targets are returned without it."""

    def __init__(self, model_path: Path) -> None:
        self.processor = spm.SentencePieceProcessor(model_file=str(model_path))
        self.model_path = Path(model_path)

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return [*self.processor.encode(text), EOS_ID]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[*ids, EOS_ID] for ids in self.processor.encode(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        kept = [i for i in ids if i not in (PAD_ID, EOS_ID)]
        return self.processor.decode(kept)

    def pieces(self, text: str) -> list[str]:
        return self.processor.encode(text, out_type=str)

    @property
    def files(self) -> dict[str, Path]:
        """The files that make this tokenizer, by role (what bundle.json records)."""
        return {"source": self.model_path, "target": self.model_path}


# Marian's file names: they are the same in our model directories and in bundles.
SOURCE_SPM, TARGET_SPM, VOCAB_JSON = "source.spm", "target.spm", "vocab.json"
TARGET_VOCAB_JSON = "target_vocab.json"  # a target vocabulary of its own (Marian tc-big)
LANGUAGES_JSON = "languages.json"  # a multilingual model's language tokens


def read_vocab(path: Path) -> dict[str, int]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


class VocabTokenizer:
    """SentencePiece models cutting text into pieces, a piece -> id vocabulary (Marian, M2M-100,
    NLLB, mBART-50), one per side when the model has separate vocabularies.

    Source text is cut into pieces by the source model; each piece is looked up in the vocab
    (unknown pieces -> <unk>) and </s> is appended; a multilingual model's source-language
    token goes where the model wants it (`languages`). Target ids become pieces through the
    target vocab and are joined by the target model; language tokens are no text. Same
    behaviour as `MarianTokenizer` and `M2M100Tokenizer`.
    """

    def __init__(
        self,
        source_model: Path,
        target_model: Path,
        vocab_path: Path,
        target_vocab_path: Path | None = None,
        languages: Languages | None = None,
        source_lang: str | None = None,
    ) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(source_model))
        self.target = spm.SentencePieceProcessor(model_file=str(target_model))
        self.vocab = read_vocab(vocab_path)
        self.target_vocab = (
            self.vocab if target_vocab_path is None else read_vocab(target_vocab_path)
        )
        # (target ids -> pieces: with one vocabulary, the source's pieces are the target's)
        self.piece_of = {i: piece for piece, i in self.target_vocab.items()}
        for path, vocab in ((vocab_path, self.vocab), (target_vocab_path, self.target_vocab)):
            missing = [p for p in ("</s>", "<unk>", "<pad>") if p not in vocab]
            if missing:
                raise ValueError(f"{path} lacks the special pieces {missing}")
        self.eos_id, self.unk_id, self.pad_id = (self.vocab[p] for p in ("</s>", "<unk>", "<pad>"))
        self.languages = languages
        self.source_lang = source_lang  # a multilingual model's default source language
        self.skipped = {self.pad_id, self.eos_id} | (languages.token_ids if languages else set())
        self._files = {"source": Path(source_model), "target": Path(target_model)}
        self._files["vocab"] = Path(vocab_path)
        if target_vocab_path is not None:
            self._files["target_vocab"] = Path(target_vocab_path)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def pieces(self, text: str) -> list[str]:
        # (a multilingual Marian model's leading >>xx<< is a piece of its own; the families
        # with language tokens have none)
        code, text = split_language_code(text) if self.languages is None else ([], text)
        return code + self.source.encode(text, out_type=str)

    def encode(self, text: str, source_lang: str | None = None) -> list[int]:
        ids = [*(self.vocab.get(p, self.unk_id) for p in self.pieces(text)), self.eos_id]
        if self.languages is None:
            return ids
        return self.languages.source_ids(ids, source_lang or self.source_lang)

    def encode_batch(self, texts: list[str], source_lang: str | None = None) -> list[list[int]]:
        return [self.encode(text, source_lang) for text in texts]

    def encode_target(self, text: str) -> list[int]:
        """A target text's ids, </s> last (what training and shortlists read)."""
        pieces = self.target.encode(text, out_type=str)
        return [*(self.target_vocab.get(p, self.unk_id) for p in pieces), self.eos_id]

    def decode(self, ids: Iterable[int]) -> str:
        pieces = [self.piece_of.get(i, "<unk>") for i in ids if i not in self.skipped]
        return join_marian_pieces(self.target, pieces)

    @property
    def files(self) -> dict[str, Path]:
        return dict(self._files)
