"""Model hyper-parameters and special token ids, stored as `config.json` beside the weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 8000
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

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}"
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
