"""Our checkpoint as a CTranslate2 model, straight from its weights: for the shapes no Hugging
Face converter of CTranslate2's reads (a pre-norm student, issue 38), so that bench.compare
can still time CTranslate2 on the same weights.

A Marian-shaped checkpoint (the committed one) goes through `nmt export-hf` and the stock
`ct2-transformers-converter` instead (bench/compare/prepare.py); tests/bench/test_compare.py
checks that both conversions of it translate alike. This one subclasses CTranslate2's own
extension point (`ctranslate2.converters.Converter`: `_load` returns the model's spec) and
fills the spec from our config and our module names:

* vocabulary: our pieces in our id order (CTranslate2 looks words up by piece), <pad> kept:
  the decoder starts from `decoder_start_id`'s embedding, as ours does;
* per layer: self-attention's Q, K and V fused into one linear (CTranslate2's layout), the
  cross-attention's K and V into another; each sub-layer's LayerNorm beside it;
* positions: our own table, whatever the variant, so that CTranslate2 adds what we add;
* the output projection: the tied embedding and `final_logits_bias`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}


def array(tensor) -> np.ndarray:  # (a torch tensor)
    return tensor.detach().float().cpu().numpy()


def set_linear(spec, module) -> None:
    spec.weight = array(module.weight)  # [out, in], as torch stores it
    spec.bias = array(module.bias)


def set_layer_norm(spec, norm) -> None:
    spec.gamma, spec.beta = array(norm.weight), array(norm.bias)


def set_attention(spec, attention, fused: tuple[tuple[str, ...], ...]) -> None:
    """`fused`: which of q_proj, k_proj, v_proj each of the spec's input linears holds."""
    for linear, names in zip(spec.linear, fused, strict=False):
        projections = [getattr(attention, name) for name in names]
        linear.weight = np.concatenate([array(p.weight) for p in projections])
        linear.bias = np.concatenate([array(p.bias) for p in projections])
    set_linear(spec.linear[-1], attention.out_proj)


SELF = (("q_proj", "k_proj", "v_proj"),)  # queries, keys and values from the same input
CROSS = (("q_proj",), ("k_proj", "v_proj"))  # queries from the target, keys/values from source


def set_stack(spec, model, side: str) -> None:
    """Embeddings, positions, norms and layers of one side (encoder or decoder)."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = array(model.token_embeddings(side).weight)  # [V, D]
    spec.scale_embeddings = model.embed_scale
    spec.position_encodings.encodings = array(model.position_table(side))  # [P, D]
    if (norm := model.embedding_norm(side)) is not None:
        set_layer_norm(spec.layernorm_embedding, norm)
    if (norm := model.stack_norm(side)) is not None:
        set_layer_norm(spec.layer_norm, norm)
    for layer_spec, layer in zip(spec.layer, getattr(model, f"{side}_layers"), strict=True):
        set_attention(layer_spec.self_attention, layer.self_attn, SELF)
        set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        if side == "decoder":
            set_attention(layer_spec.attention, layer.cross_attn, CROSS)
            set_layer_norm(layer_spec.attention.layer_norm, layer.cross_attn_layer_norm)
        set_linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
        set_linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
        set_layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)


def converter(checkpoint: Path):  # (a ctranslate2 Converter)
    from ctranslate2.converters import Converter
    from ctranslate2.specs import common_spec, transformer_spec

    from export.checkpoint import load_model_dir
    from export.marian import pieces_of

    class CheckpointConverter(Converter):
        def _load(self) -> transformer_spec.TransformerSpec:
            model, tokenizer = load_model_dir(checkpoint)
            config = model.config
            if not config.share_encoder_decoder_embeddings:
                raise NotImplementedError("separate source and target vocabularies")
            spec = transformer_spec.TransformerSpec.from_config(
                (config.encoder_layers, config.decoder_layers),
                config.n_heads,
                pre_norm=config.pre_norm,
                no_final_norm=not config.final_layer_norm,
                activation=getattr(common_spec.Activation, ACTIVATIONS[config.activation]),
                layernorm_embedding=config.embedding_norm,
            )
            set_stack(spec.encoder, model, "encoder")
            set_stack(spec.decoder, model, "decoder")
            spec.decoder.projection.weight = array(model.output_projection())
            spec.decoder.projection.bias = array(model.final_logits_bias)
            pieces = pieces_of(tokenizer, config.vocab_size)
            spec.register_source_vocabulary(pieces)
            spec.register_target_vocabulary(pieces)
            spec.config.eos_token = pieces[config.eos_id]
            spec.config.unk_token = pieces[config.unk_id]
            spec.config.bos_token = pieces[config.decoder_start_id]
            spec.config.decoder_start_token = pieces[config.decoder_start_id]
            return spec

    return CheckpointConverter()


def convert(checkpoint: Path, out: Path, vmap: Path | None = None) -> None:
    """Write the CTranslate2 model of `checkpoint` (fp32 weights: compute_type picks int8 at
    load, as for the stock conversion) to `out`, replacing it."""
    converter(checkpoint).convert(str(out), vmap=str(vmap) if vmap else None, force=True)
