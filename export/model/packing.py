"""A padded batch's real tokens, packed: position-wise work need not touch the padding.

A batch of sources is padded to its longest: [B, S] positions of which only N are real
tokens. Most of the encoder works on each position alone: the output projection of
attention, the feed-forward network, the LayerNorms and residual sums (three quarters of a
layer's multiply-adds). Run on the packed [N, D] tokens, none of it spends time on padding.
Attention mixes positions and needs the batch's [B, S] layout: its input is unpacked into
it, and what it gives back is packed again before the output projection. (So the query,
key and value projections run on the padding too: unpacking their three outputs instead of
their one input cost 1.5% of a lone sentence's translation, for 0.56x instead of 0.65x the
padded encoder's time on a batch of 32 sentences as they come; AMD EPYC Zen 3, int8:
docs/performance.md.)

In a batch of 32 Multi30k sentences in their given order, half of the [B, S] positions are
padding; CTranslate2's encoder skips it too (its `Padder`). Unpacked, a padded position
holds a copy of the batch's first token: every key there is masked, and what a padded query
gets back is never packed, so its value never matters.

Shapes: B batch, S padded length, N real tokens (N <= B * S), X any width.
"""

from __future__ import annotations

import torch


class Packing:
    def __init__(self, mask: torch.Tensor) -> None:
        """mask [B, S] bool, True at real tokens."""
        self.batch, self.length = mask.shape
        flat = mask.reshape(-1)  # [B * S]
        # where each real token sits in the padded batch, in order: [N]
        self.real_positions = flat.nonzero().squeeze(1)
        # which packed row each padded position reads back: its own token's, or row 0
        self.packed_rows = torch.where(flat, torch.cumsum(flat.to(torch.int64), 0) - 1, 0)

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, S, X] -> [N, X], the real tokens only"""
        return padded.reshape(self.batch * self.length, -1)[self.real_positions]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[N, X] -> [B, S, X], the batch's layout again (what padding holds: see above)"""
        return packed[self.packed_rows].reshape(self.batch, self.length, -1)
