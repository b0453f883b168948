"""SentencePiece subwords: training the joint French/English model and using it.

One joint vocabulary for both languages (the embeddings are tied across encoder, decoder and
output, so source and target must share ids). Byte fallback means there are no unknown
characters: a character never seen in training is spelled as its UTF-8 bytes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

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
