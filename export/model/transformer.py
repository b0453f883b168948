"""The encoder-decoder Transformer, shaped like Marian (and Hugging Face's MarianMTModel) by
default:

* post-norm: every sub-layer is `x = LayerNorm(x + Dropout(sublayer(x)))`;
* sinusoidal positions, added to embeddings scaled by sqrt(d_model);
* one embedding matrix shared by the encoder input, the decoder input and the output projection.

The same network takes the shapes of the other families `nmt import-hf` reads, by options of
its ModelConfig (see config.py for which family sets which): pre-norm sub-layers
(`x = x + Dropout(sublayer(LayerNorm(x)))`) with a final LayerNorm after each stack, a
LayerNorm over the embeddings, fairseq's offset sinusoidal or learned positions, and a decoder
vocabulary of its own.

Decoding one token at a time uses two caches (see attention.py for why they are valid):
* `cross`: for every decoder layer, the cross-attention keys/values of the source, computed once
  by `cross_keys_values` right after encoding;
* `past`: for every decoder layer, the self-attention keys/values of the target positions
  written so far; `decode` returns them grown by the new positions.

Shapes: B batch, S source length, T target (query) length, P past length, D model width,
H heads, Dh head width, V vocabulary (the target's, for the logits).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from export.model.attention import MultiHeadAttention, causal_bias, padding_bias
from export.model.config import ModelConfig
from export.model.packing import Packing

# One (keys, values) pair per decoder layer, each [B, H, length, Dh].
DecoderCache = list[tuple[torch.Tensor, torch.Tensor]]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}

SIDES = ("encoder", "decoder")


def sinusoidal_table(max_positions: int, dim: int) -> torch.Tensor:
    """[max_positions, dim]: sines in the first half of the dimensions, cosines in the second.

    This is Marian's layout (not interleaved), so that imported Marian weights see the same
    position signal they were trained with.
    """
    positions = torch.arange(max_positions, dtype=torch.float64)[:, None]
    frequencies = torch.pow(10000.0, -2.0 * torch.arange(dim // 2, dtype=torch.float64) / dim)
    angles = positions * frequencies[None, :]  # [max_positions, dim/2]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).to(torch.float32)


def fairseq_sinusoidal_table(max_positions: int, dim: int, first_row: int) -> torch.Tensor:
    """[max_positions, dim]: fairseq's table (M2M-100, NLLB) from row `first_row` on.

    Sines then cosines as Marian's, but with frequencies 10000^(-i/(dim/2 - 1)), a zero column
    for an odd dim, and rows counted from 0 at the padding id: the first real position is
    row pad_id + 1 (`first_row`). Computed in float32, step by step as fairseq and
    transformers compute it, so that imported models see exactly the signal they were
    trained with.
    """
    half = dim // 2
    rate = math.log(10000) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.int64).float() * -rate)
    rows = torch.arange(first_row + max_positions, dtype=torch.int64).float()
    angles = rows[:, None] * frequencies[None, :]  # [first_row + max_positions, dim/2]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(len(table), 1)], dim=1)
    return table[first_row:].contiguous()


def computed_positions(config: ModelConfig) -> torch.Tensor:
    """The position table [max_positions, D] of a model whose positions are computed."""
    if config.positions == "sinusoidal":
        return sinusoidal_table(config.max_positions, config.d_model)
    return fairseq_sinusoidal_table(config.max_positions, config.d_model, config.pad_id + 1)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, config.d_model)
        self.activation = _ACTIVATIONS[config.activation]
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(x))))


class _Layer(nn.Module):
    """Where a layer's LayerNorms sit around its sub-layers: after the residual sum
    (post-norm, Marian) or on each sub-layer's input (pre-norm)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.dropout = nn.Dropout(config.dropout)

    def sublayer_input(self, norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        """What a sub-layer reads: x itself (post-norm) or x normalized (pre-norm)."""
        return norm(x) if self.pre_norm else x

    def residual(self, norm: nn.LayerNorm, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x plus a sub-layer's output, normalized (post-norm) or not (pre-norm)."""
        x = x + self.dropout(out)
        return x if self.pre_norm else norm(x)


class EncoderLayer(_Layer):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.self_attn = MultiHeadAttention(
            config.d_model, config.n_heads, config.attention_dropout
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def forward(
        self, x: torch.Tensor, source_bias: torch.Tensor, packing: Packing | None = None
    ) -> torch.Tensor:
        """x [B, S, D], source_bias [B, 1, 1, S] -> [B, S, D]; with `packing`, x is the real
        tokens only, [N, D] -> [N, D] (packing.py): only attention sees the padded layout."""
        # Self-attention over the source: every source word looks at every other one.
        h = self.sublayer_input(self.self_attn_layer_norm, x)
        if packing is not None:
            h = packing.unpack(h)  # [B, S, D]
        queries = self.self_attn.project_queries(h)
        keys, values = self.self_attn.project_keys_values(h)
        attended, _ = self.self_attn.attend(queries, keys, values, source_bias, packing)
        x = self.residual(self.self_attn_layer_norm, x, attended)
        h = self.sublayer_input(self.final_layer_norm, x)
        return self.residual(self.final_layer_norm, x, self.ffn(h))


class DecoderLayer(_Layer):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.self_attn = MultiHeadAttention(
            config.d_model, config.n_heads, config.attention_dropout
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.cross_attn = MultiHeadAttention(
            config.d_model, config.n_heads, config.attention_dropout
        )
        self.cross_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def forward(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor],
        self_bias: torch.Tensor | None,
        cross: tuple[torch.Tensor, torch.Tensor],
        source_bias: torch.Tensor,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """One decoder layer over T new target positions.

        x [B, T, D]; past keys/values [B, H, P, Dh];
        self_bias broadcastable to [B, 1, T, P+T] (causal and/or cache padding), or None
        when nothing is masked (T = 1, no padding);
        cross keys/values [B/K, H, S, Dh] and source_bias [B/K, 1, 1, S], one per source
        (K rows per source: K = 1 unless beams share it).
        Returns x [B, T, D], present keys/values [B, H, P+T, Dh], cross weights [B, H, T, S].
        """
        # Self-attention: the new positions look at the target written so far (and themselves).
        # Only the new positions are projected; earlier keys/values come from the cache.
        h = self.sublayer_input(self.self_attn_layer_norm, x)
        queries = self.self_attn.project_queries(h)
        new_keys, new_values = self.self_attn.project_keys_values(h)
        keys = torch.cat([past[0], new_keys], dim=2)  # [B, H, P+T, Dh]
        values = torch.cat([past[1], new_values], dim=2)
        attended, _ = self.self_attn.attend(queries, keys, values, self_bias)
        x = self.residual(self.self_attn_layer_norm, x, attended)

        # Cross-attention: queries from the target side, keys/values from the source (cached).
        # The source may be shared by several rows (the K beams of a sentence in beam search):
        # then cross keys/values hold one copy per source, [B/K, H, S, Dh], and the K rows of
        # a source are simply K * T queries against it. Without sharing, K = 1.
        sources = cross[0].shape[0]
        h = self.sublayer_input(self.cross_attn_layer_norm, x)
        queries = self.cross_attn.project_queries(h.reshape(sources, -1, h.shape[-1]))
        attended, cross_weights = self.cross_attn.attend(queries, cross[0], cross[1], source_bias)
        x = self.residual(self.cross_attn_layer_norm, x, attended.reshape(x.shape))
        # [B/K, H, K*T, S] -> [B, H, T, S]: each row's own weights again
        batch, length = x.shape[0], x.shape[1]
        heads, source_length = cross_weights.shape[1], cross_weights.shape[3]
        cross_weights = (
            cross_weights.reshape(sources, heads, -1, length, source_length)
            .transpose(1, 2)
            .reshape(batch, heads, length, source_length)
        )

        h = self.sublayer_input(self.final_layer_norm, x)
        x = self.residual(self.final_layer_norm, x, self.ffn(h))
        return x, (keys, values), cross_weights


class Transformer(nn.Module):
    """Parameter names (those an option adds in brackets): embed_tokens [decoder_embed_tokens],
    [encoder_positions, decoder_positions], [encoder_embedding_norm, decoder_embedding_norm],
    final_logits_bias, encoder_layers.N, decoder_layers.N, [encoder_layer_norm,
    decoder_layer_norm]."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_id)
        if not config.share_encoder_decoder_embeddings:
            # The target words' own embeddings, tied to the output projection.
            self.decoder_embed_tokens = nn.Embedding(
                config.target_vocab_size, config.d_model, config.pad_id
            )
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        if config.positions == "learned":  # one table per side, trained with the model
            self.encoder_positions = nn.Embedding(config.max_positions, config.d_model)
            self.decoder_positions = nn.Embedding(config.max_positions, config.d_model)
        else:  # computed, the same for both sides
            self.register_buffer("positions", computed_positions(config), persistent=False)
        if config.embedding_norm:
            self.encoder_embedding_norm = nn.LayerNorm(config.d_model)
            self.decoder_embedding_norm = nn.LayerNorm(config.d_model)
        # Marian adds a (frozen, usually zero) bias to the output logits; kept for imports.
        self.register_buffer("final_logits_bias", torch.zeros(config.target_vocab_size))
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(config) for _ in range(config.encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(config) for _ in range(config.decoder_layers)
        )
        if config.final_layer_norm:
            self.encoder_layer_norm = nn.LayerNorm(config.d_model)
            self.decoder_layer_norm = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        # Scaled by sqrt(D) on input, so start embeddings at ~1/sqrt(D) to keep inputs ~unit size.
        shared = self.config.share_encoder_decoder_embeddings
        for side in SIDES[:1] if shared else SIDES:
            embeddings = self.token_embeddings(side).weight
            nn.init.normal_(embeddings, mean=0.0, std=self.config.d_model**-0.5)
            with torch.no_grad():
                embeddings[self.config.pad_id].zero_()
        if self.config.positions == "learned":
            for side in SIDES:
                nn.init.normal_(self.position_table(side), mean=0.0, std=0.02)

    # The parts each side has of its own, or shares with the other.

    def token_embeddings(self, side: str) -> nn.Embedding:
        """[V, D] of the side's words (the target's are the output projection too)."""
        if side == "decoder" and not self.config.share_encoder_decoder_embeddings:
            return self.decoder_embed_tokens
        return self.embed_tokens

    def position_table(self, side: str) -> torch.Tensor:
        """[max_positions, D]: row p is added to the token at position p."""
        if self.config.positions == "learned":
            return getattr(self, f"{side}_positions").weight
        return self.positions

    def embedding_norm(self, side: str) -> nn.LayerNorm | None:
        return getattr(self, f"{side}_embedding_norm") if self.config.embedding_norm else None

    def stack_norm(self, side: str) -> nn.LayerNorm | None:
        """The LayerNorm after the side's last layer (final_layer_norm), or None."""
        return getattr(self, f"{side}_layer_norm") if self.config.final_layer_norm else None

    def output_projection(self) -> torch.Tensor:
        """[V, D]: the target words' embeddings, tied to the output projection."""
        return self.token_embeddings("decoder").weight

    def embed(
        self,
        ids: torch.Tensor,
        side: str,
        first_position: int | torch.Tensor = 0,
        row_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids [B, T] -> scaled token embeddings plus positions [B, T, D] (normalized, with
        embedding_norm), on the encoder's or the decoder's side.

        ids[:, 0] is at first_position in every row, or, for one decoder step (T = 1), at
        row_positions [B] (int64), one per row: rows that joined a running batch later are at
        earlier positions.
        """
        length = ids.shape[1]
        table = self.position_table(side)  # [max_positions, D]
        if row_positions is not None:  # one decoder step: T = 1
            positions = table[row_positions].unsqueeze(1)  # [B, 1, D]
        else:
            positions = table[first_position : first_position + length][None]
        x = self.token_embeddings(side)(ids) * self.embed_scale + positions
        norm = self.embedding_norm(side)
        return self.dropout(x if norm is None else norm(x))

    def encode(
        self,
        source_ids: torch.Tensor,
        source_mask: torch.Tensor,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """source_ids [B, S], source_mask [B, S] (True = real token) -> encoder output [B, S, D].
        With `packing` (of source_mask), the layers run on the real tokens only, [N, D], and
        skip the padding in most of their work (packing.py)."""
        bias = padding_bias(source_mask)
        x = self.embed(source_ids, "encoder")
        if packing is not None:
            x = packing.pack(x)  # [N, D]
        for layer in self.encoder_layers:
            x = layer(x, bias, packing)
        norm = self.stack_norm("encoder")
        x = x if norm is None else norm(x)
        return x if packing is None else packing.unpack(x)

    def cross_keys_values(self, encoder_output: torch.Tensor) -> DecoderCache:
        """The source's keys/values for every decoder layer: computed once, reused every step."""
        return [
            layer.cross_attn.project_keys_values(encoder_output) for layer in self.decoder_layers
        ]

    def empty_cache(self, batch_size: int, device: torch.device | None = None) -> DecoderCache:
        shape = (batch_size, self.config.n_heads, 0, self.config.head_dim)
        return [
            (torch.zeros(shape, device=device), torch.zeros(shape, device=device))
            for _ in self.decoder_layers
        ]

    def decode(
        self,
        target_ids: torch.Tensor,
        past: DecoderCache,
        cross: DecoderCache,
        source_mask: torch.Tensor,
        past_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        all_attention: bool = False,
    ) -> tuple[torch.Tensor, DecoderCache, torch.Tensor]:
        """Run the decoder over T new target positions that follow P cached ones.

        target_ids [B, T]; past: per layer [B, H, P, Dh]; cross: per layer [B/K, H, S, Dh];
        source_mask [B/K, S]. K rows share each source (rows b*K .. b*K+K-1: the beams of
        sentence b); K = 1 when every row has its own.

        Rows that joined a running batch at different steps (continuous batching) have caches
        of different real lengths, left-padded to the same P: past_mask [B, P] (True = a real
        cached position) hides the padding from self-attention, and positions [B] is each
        row's position of target_ids[:, 0] (its real cache length). Both None: every row has
        P real cached positions.

        Returns logits [B, T, V], present cache (per layer [B, H, P+T, Dh]) and the cross-
        attention weights: the last layer's averaged over heads [B, T, S] (the alignment), or
        with all_attention every layer's, a list of [B, H, T, S].
        """
        past_length = past[0][0].shape[2]
        batch, length = target_ids.shape
        # One new position may look at every earlier one and itself: nothing to mask then.
        self_bias = causal_bias(length, past_length, target_ids.device) if length > 1 else None
        if past_mask is not None:
            # The new positions are real; the padding in front of a late row's cache is not.
            new = torch.ones((batch, length), dtype=torch.bool, device=target_ids.device)
            padding = padding_bias(torch.cat([past_mask, new], dim=1))  # [B, 1, 1, P+T]
            self_bias = padding if self_bias is None else self_bias + padding
        source_bias = padding_bias(source_mask)
        x = self.embed(target_ids, "decoder", past_length, positions)
        present: DecoderCache = []
        layer_weights: list[torch.Tensor] = []  # per layer [B, H, T, S]
        for layer, layer_past, layer_cross in zip(self.decoder_layers, past, cross, strict=True):
            x, layer_present, cross_weights = layer(
                x, layer_past, self_bias, layer_cross, source_bias
            )
            present.append(layer_present)
            layer_weights.append(cross_weights)
        norm = self.stack_norm("decoder")
        if norm is not None:
            x = norm(x)
        logits = x @ self.output_projection().T + self.final_logits_bias  # [B, T, V]
        if all_attention:
            return logits, present, layer_weights  # per layer [B, H, T, S]
        return logits, present, layer_weights[-1].mean(dim=1)

    def forward(
        self, source_ids: torch.Tensor, source_mask: torch.Tensor, target_in_ids: torch.Tensor
    ) -> torch.Tensor:
        """Teacher forcing for training: logits [B, T, V] for every target position at once."""
        cross = self.cross_keys_values(self.encode(source_ids, source_mask))
        past = self.empty_cache(source_ids.shape[0], source_ids.device)
        logits, _, _ = self.decode(target_in_ids, past, cross, source_mask)
        return logits
