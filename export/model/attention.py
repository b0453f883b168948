"""Multi-head attention: the one place where queries, keys and values are made.

What the three roles mean
-------------------------
Attention lets each position of one sequence (the *queries*) gather information from the
positions of another sequence (the *keys* and *values*):

* a **query** is what a position is looking for: a projection of *its own* state;
* a **key** is what a position advertises, the thing queries are matched against;
* a **value** is what a position hands over once it has been matched.

Scores are dot products query·key, scaled by 1/sqrt(head_dim) and turned into weights by a
softmax over the keys; the output of a query is the weighted sum of the values.

* **Self-attention**: queries, keys and values all come from the same sequence. In the decoder
  a position may only look at itself and earlier positions (causal mask), so when decoding one
  token at a time the keys and values of earlier positions never change: they are kept in a
  *KV cache* and each step only projects the newest position.
* **Cross-attention**: the queries come from the decoder (the target words written so far);
  the keys and values come from the encoder output (the source sentence). Keys and values
  therefore depend on the source only: they are projected *once per request* and reused at
  every decoding step. The attention weights say which source positions each target word
  looked at, which is what the service returns as an alignment.

Shapes: B batch, T query length, S key length, D model width, H heads, Dh = D / H.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from export.model.packing import Packing

# Added to the scores of positions a query must not see. Large enough that exp() underflows to
# exactly 0 in float32, small enough that adding two of them stays finite.
MASKED_SCORE = -1e9


class MultiHeadAttention(nn.Module):
    # Parameter names follow Hugging Face's Marian (q_proj, k_proj, v_proj, out_proj) so that
    # weights map one to one between the two implementations.
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, D] -> [B, H, T, Dh]"""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)

    def project_queries(self, states: torch.Tensor) -> torch.Tensor:
        """What each position looks for. states [B, T, D] -> queries [B, H, T, Dh]"""
        return self.split_heads(self.q_proj(states))

    def project_keys_values(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What each position offers (keys) and hands over (values).

        states [B, S, D] -> keys [B, H, S, Dh], values [B, H, S, Dh]
        """
        return self.split_heads(self.k_proj(states)), self.split_heads(self.v_proj(states))

    def attend(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        score_bias: torch.Tensor | None,
        packing: Packing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled dot-product attention, then the output projection.

        queries [B, H, T, Dh], keys and values [B, H, S, Dh],
        score_bias broadcastable to [B, H, T, S]: 0 where allowed, MASKED_SCORE where not.
        Returns output [B, T, D] (with `packing`, the real queries' only, [N, D]: the output
        projection skips the padding, packing.py) and attention weights [B, H, T, S].
        """
        scores = queries @ keys.transpose(-1, -2) / math.sqrt(self.head_dim)  # [B, H, T, S]
        if score_bias is not None:
            scores = scores + score_bias
        weights = torch.softmax(scores, dim=-1)  # each query's weights over the S keys sum to 1
        mixed = self.dropout(weights) @ values  # [B, H, T, Dh]
        batch, _, length, _ = mixed.shape
        merged = mixed.transpose(1, 2).reshape(batch, length, self.n_heads * self.head_dim)
        if packing is not None:
            merged = packing.pack(merged)  # [N, D]
        return self.out_proj(merged), weights


def padding_bias(mask: torch.Tensor) -> torch.Tensor:
    """Key-padding mask [B, S] (True = real token) -> score bias [B, 1, 1, S]."""
    return ((~mask).to(torch.float32) * MASKED_SCORE)[:, None, None, :]


def causal_bias(query_length: int, past_length: int, device: torch.device) -> torch.Tensor:
    """Score bias [1, 1, T, P+T] that lets query i (absolute position P+i) see keys 0..P+i."""
    query_positions = torch.arange(query_length, device=device)[:, None] + past_length
    key_positions = torch.arange(past_length + query_length, device=device)[None, :]
    future = key_positions > query_positions  # [T, P+T]
    return (future.to(torch.float32) * MASKED_SCORE)[None, None]
