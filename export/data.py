"""Parallel text and length-bucketed token batches.

Batches are built deterministically from (seed, epoch): a resumed run rebuilds the same batch
order for its epoch and skips the batches it has already trained on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch


def read_lines(path: Path) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def read_parallel(source: Path, target: Path) -> tuple[list[str], list[str]]:
    sources, targets = read_lines(source), read_lines(target)
    if len(sources) != len(targets):
        raise ValueError(f"{source} has {len(sources)} lines but {target} has {len(targets)}")
    return sources, targets


@dataclass
class Batch:
    source_ids: torch.Tensor  # [B, S], padded with pad_id
    source_mask: torch.Tensor  # [B, S], True = real token
    target_in: torch.Tensor  # [B, T]: decoder_start, y1, ..., y_{T-1}
    target_out: torch.Tensor  # [B, T]: y1, ..., y_{T-1}, </s> (pad where the sentence ended)

    def to(self, device: torch.device) -> Batch:
        return Batch(
            *(
                t.to(device)
                for t in (self.source_ids, self.source_mask, self.target_in, self.target_out)
            )
        )


def pad(sequences: list[list[int]], pad_id: int) -> torch.Tensor:
    width = max(len(s) for s in sequences)
    out = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def make_batch(
    sources: list[list[int]], targets: list[list[int]], pad_id: int, decoder_start_id: int
) -> Batch:
    """Targets come with a final </s>; the decoder input is shifted right by the start token."""
    source_ids = pad(sources, pad_id)
    target_out = pad(targets, pad_id)
    target_in = pad([[decoder_start_id, *t[:-1]] for t in targets], pad_id)
    return Batch(source_ids, source_ids != pad_id, target_in, target_out)


def bucket_batches(
    lengths: list[tuple[int, int]], max_tokens: int, seed: int, epoch: int
) -> list[list[int]]:
    """Group example indices into batches of similar length, at most max_tokens padded tokens.

    Sorting by length cuts padding; a little random noise in the sort key and a shuffled batch
    order (both from seed and epoch) keep batches different between epochs.
    """
    rng = random.Random(seed * 100_003 + epoch)
    order = sorted(range(len(lengths)), key=lambda i: (max(lengths[i]) + rng.random() * 2, i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order:
        longest_if_added = max(longest, *lengths[index])
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], max(lengths[index])
        current.append(index)
        longest = longest_if_added
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches
