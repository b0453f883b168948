"""Several trained models decoding as one: at each step, the mean of their probabilities.

A teacher for sequence-level distillation (Kim & Rush, 2016): its beam-search translations of
the training sources become a student's targets, and an ensemble of models trained with
different seeds makes better targets than any one of them. Only the offline side decodes with
it (`nmt translate --checkpoint A B C`); the service serves single models.

The ensemble looks to greedy_search and beam_search like one Transformer: its caches are the
members' per-layer caches one after the other (member 0's decoder layers, then member 1's...),
so the searches reorder them by beam as they reorder a single model's.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from export.checkpoint import TOKENIZER_FILE, load_model_dir
from export.model.transformer import DecoderCache, Transformer
from export.tokenizer import Tokenizer

# What the searches read from model.config: the members must agree on all of it.
_SHARED_SETTINGS = (
    "vocab_size",
    "pad_id",
    "eos_id",
    "decoder_start_id",
    "max_positions",
    "force_eos_at_limit",
    "source_lang",
    "target_lang",
)


class Ensemble(nn.Module):
    def __init__(self, members: list[Transformer]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        first = members[0].config
        for index, member in enumerate(members[1:], start=1):
            differ = [s for s in _SHARED_SETTINGS if getattr(member.config, s) != getattr(first, s)]
            if differ:
                raise ValueError(f"ensemble member {index} differs from member 0 in {differ}")
        self.members = nn.ModuleList(members)
        self.config = first
        self._layers = [len(m.decoder_layers) for m in members]

    def _split(self, caches: DecoderCache) -> list[DecoderCache]:
        """The flat per-layer list -> one list per member."""
        parts, start = [], 0
        for count in self._layers:
            parts.append(caches[start : start + count])
            start += count
        return parts

    def encode(self, source_ids: torch.Tensor, source_mask: torch.Tensor) -> list[torch.Tensor]:
        """-> each member's encoder output [B, S, D_member]"""
        return [m.encode(source_ids, source_mask) for m in self.members]

    def cross_keys_values(self, encoder_outputs: list[torch.Tensor]) -> DecoderCache:
        return [
            pair
            for member, output in zip(self.members, encoder_outputs, strict=True)
            for pair in member.cross_keys_values(output)
        ]

    def empty_cache(self, batch_size: int, device: torch.device | None = None) -> DecoderCache:
        return [pair for m in self.members for pair in m.empty_cache(batch_size, device)]

    def decode(
        self,
        target_ids: torch.Tensor,
        past: DecoderCache,
        cross: DecoderCache,
        source_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, DecoderCache, torch.Tensor]:
        """As Transformer.decode, but the "logits" [B, T, V] are the log of the members' mean
        probability (already normalized: log_softmax leaves them as they are), and the
        alignment [B, T, S] is the members' mean."""
        log_probs, present, alignments = [], [], []
        for member, member_past, member_cross in zip(
            self.members, self._split(past), self._split(cross), strict=True
        ):
            logits, member_present, alignment = member.decode(
                target_ids, member_past, member_cross, source_mask
            )
            log_probs.append(torch.log_softmax(logits.float(), dim=-1))
            present.extend(member_present)
            alignments.append(alignment)
        mean_log_prob = torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))
        return mean_log_prob, present, torch.stack(alignments).mean(dim=0)


def load_ensemble(model_dirs: list[Path], device: str = "cpu") -> tuple[Ensemble, Tokenizer]:
    """Model directories that share one SentencePiece model (byte for byte: the same ids mean
    the same pieces) -> the ensemble and that tokenizer."""
    models, tokenizer = [], None
    first_pieces = Path(model_dirs[0]) / TOKENIZER_FILE
    for model_dir in model_dirs:
        pieces = Path(model_dir) / TOKENIZER_FILE
        if not pieces.is_file() or pieces.read_bytes() != first_pieces.read_bytes():
            raise ValueError(
                f"{model_dir} does not share {first_pieces}: an ensemble's members need one "
                f"vocabulary (train them with the same {TOKENIZER_FILE} in their run directories)"
            )
        model, member_tokenizer = load_model_dir(model_dir, device)
        models.append(model)
        tokenizer = tokenizer or member_tokenizer
    return Ensemble(models).to(device).eval(), tokenizer
