"""SentencePiece subwords: training the joint French/English model and using it.

One joint vocabulary for both languages (the embeddings are tied across encoder, decoder and
output, so source and target must share ids). Byte fallback means there are no unknown
characters: a character never seen in training is spelled as its UTF-8 bytes.

Imported Hugging Face Marian models (export/marian.py) come instead with two SentencePiece
models, one per language, and a shared `vocab.json` that maps pieces to model ids: their ids
are not the SentencePiece ids. `VocabTokenizer` reads that layout, the way `MarianTokenizer`
does.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from nmt_contract import join_marian_pieces, split_language_code

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


class VocabTokenizer:
    """Separate source and target SentencePiece models, one piece -> id vocabulary (Marian).

    Source text is cut into pieces by the source model; each piece is looked up in the vocab
    (unknown pieces -> <unk>) and </s> is appended. Target ids become pieces through the same
    vocab and are joined by the target model. Same behaviour as `MarianTokenizer`.
    """

    def __init__(self, source_model: Path, target_model: Path, vocab_path: Path) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(source_model))
        self.target = spm.SentencePieceProcessor(model_file=str(target_model))
        self.vocab: dict[str, int] = json.loads(Path(vocab_path).read_text(encoding="utf-8"))
        self.piece_of = {i: piece for piece, i in self.vocab.items()}
        missing = [p for p in ("</s>", "<unk>", "<pad>") if p not in self.vocab]
        if missing:
            raise ValueError(f"{vocab_path} lacks the special pieces {missing}")
        self.eos_id, self.unk_id, self.pad_id = (self.vocab[p] for p in ("</s>", "<unk>", "<pad>"))
        self._files = {"source": Path(source_model), "target": Path(target_model)}
        self._files["vocab"] = Path(vocab_path)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def pieces(self, text: str) -> list[str]:
        code, text = split_language_code(text)
        return code + self.source.encode(text, out_type=str)

    def encode(self, text: str) -> list[int]:
        return [*(self.vocab.get(p, self.unk_id) for p in self.pieces(text)), self.eos_id]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        pieces = [self.piece_of.get(i, "<unk>") for i in ids if i not in (self.pad_id, self.eos_id)]
        return join_marian_pieces(self.target, pieces)

    @property
    def files(self) -> dict[str, Path]:
        return dict(self._files)
