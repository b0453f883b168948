"""Training settings: a plain dataclass, importable without torch (the CLI builds flags from it)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from export.model.config import ModelConfig

DECODER_STARTS = ("pad", "eos")

DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "multi30k"


def multi30k_dir() -> Path:
    """Where Multi30k lives: $NMT_DATA_DIR, else ../shared/data/multi30k beside the checkout."""
    return Path(os.environ.get("NMT_DATA_DIR", DEFAULT_DATA_DIR))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data_dir: str = ""  # "" = Multi30k at $NMT_DATA_DIR or ../shared/data/multi30k
    train_prefix: str = "train"
    valid_prefix: str = "val"
    source_lang: str = "fr"
    target_lang: str = "en"
    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    ffn_dim: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    activation: str = "relu"
    # Pre-norm layers (with a final LayerNorm after each stack): deeper stacks train without
    # the long warmup post-norm needs. The committed model is post-norm (Marian's layout).
    pre_norm: bool = False
    # How positions are signalled (export/model/config.py's POSITIONS): "sinusoidal" (Marian's)
    # or "sinusoidal_offset" (fairseq's, M2M-100's and NLLB's).
    positions: str = "sinusoidal"
    # The token decoding starts from: "pad" (Marian's) or "eos" (fairseq's: M2M-100, NLLB).
    # With --pre-norm and --positions sinusoidal_offset, "eos" gives M2M-100's layout.
    decoder_start: str = "pad"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_tokens: int = 4096  # padded tokens per batch (the longer of source and target)
    learning_rate: float = 1e-3  # peak, reached at the end of warmup
    warmup_steps: int = 1000
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    max_epochs: int = 40
    max_steps: int = 0  # 0 = no limit; a limit ends training once reached (smoke tests)
    patience: int = 6  # epochs without a better validation BLEU before stopping
    average_last: int = 5  # epochs whose weights are averaged at the end
    checkpoint_every: int = 200  # steps between resumable checkpoints
    max_sentence_tokens: int = 128  # longer training pairs are dropped
    valid_bleu_sentences: int = 0  # 0 = the whole validation set
    seed: int = 1234
    threads: int = 0  # 0 = torch's default
    # Mixed precision: the forward pass's matmuls in bfloat16 (torch.autocast), the weights,
    # optimizer and loss in float32. On a CPU with AMX a training step takes half the time
    # (docs/training.md); validation and the saved model stay float32.
    bf16: bool = False

    def __post_init__(self) -> None:
        if self.decoder_start not in DECODER_STARTS:
            raise ValueError(
                f"decoder_start must be one of {sorted(DECODER_STARTS)}, got {self.decoder_start!r}"
            )

    def model_config(self, vocab_size: int) -> ModelConfig:
        defaults = ModelConfig()
        return ModelConfig(
            vocab_size=vocab_size,
            d_model=self.d_model,
            n_heads=self.n_heads,
            ffn_dim=self.ffn_dim,
            encoder_layers=self.encoder_layers,
            decoder_layers=self.decoder_layers,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout,
            activation=self.activation,
            pre_norm=self.pre_norm,
            final_layer_norm=self.pre_norm,
            positions=self.positions,
            decoder_start_id={"pad": defaults.pad_id, "eos": defaults.eos_id}[self.decoder_start],
            source_lang=self.source_lang,
            target_lang=self.target_lang,
        )

    def corpus(self, prefix: str) -> tuple[Path, Path]:
        base = Path(self.data_dir) if self.data_dir else multi30k_dir()
        return base / f"{prefix}.{self.source_lang}", base / f"{prefix}.{self.target_lang}"
