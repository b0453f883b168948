"""Model hyper-parameters and special token ids, stored as `config.json` beside the weights.

The defaults are our own model's shape, Marian's: post-norm layers, sinusoidal positions,
scaled embeddings, one embedding matrix for encoder, decoder and output projection. The other
options make the same network the other families that `nmt import-hf` reads (export/hf/):

| option | Marian (ours) | M2M-100, NLLB | mBART-50 | Marian tc-big |
|---|---|---|---|---|
| pre_norm | False | True | True | False |
| final_layer_norm | False | True | True | False |
| embedding_norm | False | False | True | False |
| positions | "sinusoidal" | "sinusoidal_offset" | "learned" | "sinusoidal" |
| share_encoder_decoder_embeddings | True | True | True | False |
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 8000  # the source vocabulary (and the target's, when they are shared)
    d_model: int = 256
    n_heads: int = 4
    ffn_dim: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"  # "relu", "gelu" or "swish" (Marian's opus-mt models use swish)
    max_positions: int = 512
    scale_embedding: bool = True
    pad_id: int = 0
    eos_id: int = 1
    unk_id: int = 2
    # Marian starts decoding from the pad token; we do the same so that checkpoints interoperate.
    decoder_start_id: int = 0
    source_lang: str = "fr"
    target_lang: str = "en"
    # Write </s> as the last token a sentence may produce when it reaches its length limit,
    # instead of its best token (Hugging Face's forced_eos_token_id, on in opus-mt models).
    force_eos_at_limit: bool = False
    # Where each sub-layer's LayerNorm sits: False, after the residual sum (post-norm:
    # x = LayerNorm(x + f(x)), Marian); True, on the sub-layer's input (pre-norm:
    # x = x + f(LayerNorm(x)), M2M-100, NLLB, mBART).
    pre_norm: bool = False
    # One more LayerNorm after the last layer of each stack (pre-norm models have it: their
    # residual stream is never normalized otherwise).
    final_layer_norm: bool = False
    # A LayerNorm over token embeddings plus positions, on each side (mBART's
    # layernorm_embedding).
    embedding_norm: bool = False
    # How positions are signalled (see POSITIONS).
    positions: str = "sinusoidal"
    # One embedding matrix for the source and the target words. False (Marian tc-big models
    # with separate vocabularies): the decoder has its own, of decoder_vocab_size words, and
    # the output projection is tied to it.
    share_encoder_decoder_embeddings: bool = True
    decoder_vocab_size: int = 0  # 0: vocab_size (the only value when shared)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def target_vocab_size(self) -> int:
        """The words the decoder reads and writes: the output projection's size."""
        return self.decoder_vocab_size or self.vocab_size

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.positions not in POSITIONS:
            raise ValueError(
                f"positions must be one of {sorted(POSITIONS)}, got {self.positions!r}"
            )
        if self.share_encoder_decoder_embeddings and self.target_vocab_size != self.vocab_size:
            raise ValueError(
                f"decoder_vocab_size={self.decoder_vocab_size} differs from vocab_size="
                f"{self.vocab_size}, but the embeddings are shared"
            )

    def to_json(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_json(cls, path: Path) -> ModelConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        raw = json.loads(Path(path).read_text())
        unknown = set(raw) - fields
        if unknown:
            raise ValueError(f"{path}: unknown model config keys {sorted(unknown)}")
        return cls(**raw)


ACTIVATIONS = ("relu", "gelu", "swish")

# How a position is signalled, added to the token embeddings:
# * "sinusoidal": Marian's computed table, sines then cosines with frequencies
#   10000^(-2i/D); position p is row p.
# * "sinusoidal_offset": fairseq's computed table (M2M-100, NLLB), frequencies
#   10000^(-i/(D/2 - 1)), whose rows start after the padding id: position p is row
#   pad_id + 1 + p.
# * "learned": a trained table per side (mBART); import keeps the rows from its offset (2) on,
#   so that position p is row p here.
POSITIONS = ("sinusoidal", "sinusoidal_offset", "learned")
