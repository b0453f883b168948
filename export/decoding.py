"""Reference decoding in torch: batched greedy and batched beam search.

This is the yardstick the ONNX Runtime engine is checked against, so it favours plain,
obviously-correct code over speed: every row stays in the batch until the end.

Conventions shared with the engine (service/runtime/search.py), from nmt_contract:
* a sentence may produce at most `length_limit(source_length)` tokens, </s> included;
* a hypothesis' raw score is the sum of its tokens' log-probs (</s> included when it ended);
* beam hypotheses are ranked by raw score / length ** length_penalty;
* a forced token (a multilingual model's target-language token, first; </s> at the length
  limit, for a model with force_eos_at_limit) is chosen with log-prob 0, as Hugging Face's
  forced_bos_token_id and forced_eos_token_id choose it, and counts as a produced token.
"""

from __future__ import annotations

import math

import torch

from export.model.transformer import Transformer
from nmt_contract import Hypothesis, length_limit


def source_lengths(source_mask: torch.Tensor) -> list[int]:
    return [int(n) for n in source_mask.sum(dim=1)]


def _forced(
    log_probs: torch.Tensor,
    step: int,
    limits: list[int],
    first_tokens: list[int] | None,
    eos_at_limit: int | None,
) -> torch.Tensor:
    """A step's log-probs [rows, V] with the forced words: a row's first token (step 0) is
    its first_tokens entry, and its last (at its limit) eos_at_limit, each with log-prob 0
    and every other word -inf. Rows are those of `limits` (a row's limit, one per row)."""
    forced = [None] * len(limits)
    if first_tokens is not None and step == 0:
        forced = list(first_tokens)
    if eos_at_limit is not None:
        at_limit = [step + 1 >= limit for limit in limits]
        forced = [eos_at_limit if end else f for f, end in zip(forced, at_limit, strict=True)]
    if all(f is None for f in forced):
        return log_probs
    log_probs = log_probs.clone()
    for row, token in enumerate(forced):
        if token is not None:
            log_probs[row] = -math.inf
            log_probs[row, token] = 0.0
    return log_probs


@torch.no_grad()
def greedy_search(
    model: Transformer,
    source_ids: torch.Tensor,
    source_mask: torch.Tensor,
    max_length: int = 256,
    length_penalty: float = 1.0,
    first_tokens: list[int] | None = None,
) -> list[Hypothesis]:
    """source_ids, source_mask [B, S] -> one hypothesis per row, in order. `first_tokens`:
    each row's forced first token (a multilingual model's target language), or None."""
    config = model.config
    eos_at_limit = config.eos_id if config.force_eos_at_limit else None
    batch = source_ids.shape[0]
    limits = [
        length_limit(n, max_length, config.max_positions) for n in source_lengths(source_mask)
    ]
    cross = model.cross_keys_values(model.encode(source_ids, source_mask))
    past = model.empty_cache(batch, source_ids.device)
    last = torch.full(
        (batch, 1), config.decoder_start_id, dtype=torch.long, device=source_ids.device
    )
    tokens: list[list[int]] = [[] for _ in range(batch)]
    log_probs = [0.0] * batch
    lengths = [0] * batch  # tokens produced, </s> included
    open_rows = set(range(batch))
    for step in range(max(limits)):
        logits, past, _ = model.decode(last, past, cross, source_mask)
        step_log_probs = torch.log_softmax(logits[:, -1].float(), dim=-1)  # [B, V]
        step_log_probs = _forced(step_log_probs, step, limits, first_tokens, eos_at_limit)
        best = step_log_probs.argmax(dim=-1)  # [B]
        # One copy to the host per step (on a GPU, reading elements one by one waits each time).
        best_tokens = best.tolist()
        best_log_probs = step_log_probs.gather(1, best[:, None])[:, 0].tolist()
        for row in list(open_rows):
            token = best_tokens[row]
            log_probs[row] += best_log_probs[row]
            lengths[row] += 1
            if token == config.eos_id or step + 1 >= limits[row]:
                open_rows.discard(row)
            if token != config.eos_id:
                tokens[row].append(token)
        if not open_rows:
            break
        last = best[:, None]
    return [
        Hypothesis(t, lp / n**length_penalty, lp)
        for t, lp, n in zip(tokens, log_probs, lengths, strict=True)
    ]


@torch.no_grad()
def beam_search(
    model: Transformer,
    source_ids: torch.Tensor,
    source_mask: torch.Tensor,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    n_best: int = 1,
    max_length: int = 256,
    first_tokens: list[int] | None = None,
) -> list[list[Hypothesis]]:
    """source_ids, source_mask [B, S] -> for each row, its n_best hypotheses, best first.
    `first_tokens`: each row's forced first token (a multilingual model's target language).

    Each step ranks the 2K best continuations of the K open beams of a sentence. A candidate
    ending in </s> among the first K is finished; the best K others stay open. A sentence is
    done when it has K finished hypotheses and its best open beam, scored at the current
    length, cannot beat the worst of them (Hugging Face's default stopping rule), or at its
    length limit.
    """
    config = model.config
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size={beam_size}, got {n_best}")
    batch, width = source_ids.shape[0], beam_size
    device = source_ids.device
    limits = [
        length_limit(n, max_length, config.max_positions) for n in source_lengths(source_mask)
    ]
    eos_at_limit = config.eos_id if config.force_eos_at_limit else None
    row_limits = [limit for limit in limits for _ in range(width)]  # [B*K]
    row_firsts = None if first_tokens is None else [t for t in first_tokens for _ in range(width)]

    # Every sentence gets K rows: row b*K + k is beam k of sentence b.
    source_mask_k = source_mask.repeat_interleave(width, dim=0)  # [B*K, S]
    cross = model.cross_keys_values(model.encode(source_ids, source_mask))
    cross = [(k.repeat_interleave(width, 0), v.repeat_interleave(width, 0)) for k, v in cross]
    past = model.empty_cache(batch * width, device)
    last = torch.full((batch * width,), config.decoder_start_id, dtype=torch.long, device=device)
    sequences = torch.zeros((batch * width, 0), dtype=torch.long, device=device)
    # Only beam 0 is live at the start, so the K beams do not all pick the same first token.
    scores = torch.full((batch, width), -math.inf, device=device)
    scores[:, 0] = 0.0
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    done = [False] * batch

    for step in range(max(limits)):
        length = step + 1
        logits, past, _ = model.decode(last[:, None], past, cross, source_mask_k)
        step_log_probs = torch.log_softmax(logits[:, -1].float(), dim=-1)  # [B*K, V]
        step_log_probs = _forced(step_log_probs, step, row_limits, row_firsts, eos_at_limit)
        vocab = step_log_probs.shape[-1]
        candidates = (scores[:, :, None] + step_log_probs.view(batch, width, vocab)).view(batch, -1)
        top_scores, top_index = candidates.topk(2 * width, dim=-1)  # [B, 2K]
        # The choice below is made on the host, from one copy per step (on a GPU, reading
        # elements one by one would wait for the device each time).
        top_scores_host = top_scores.tolist()
        top_origin_host = (top_index // vocab).tolist()
        top_token_host = (top_index % vocab).tolist()
        sequences_host = None  # copied when a hypothesis first finishes this step

        next_scores = [[-math.inf] * width for _ in range(batch)]
        next_rows = list(range(batch * width))  # default: keep own row
        next_tokens = [config.pad_id] * (batch * width)
        for b in range(batch):
            if done[b]:
                continue
            at_limit = length >= limits[b]
            kept = 0
            for rank in range(2 * width):
                token, score = top_token_host[b][rank], top_scores_host[b][rank]
                origin = b * width + top_origin_host[b][rank]
                if score == -math.inf:
                    break
                if token == config.eos_id or at_limit:
                    if rank < width:
                        if sequences_host is None:
                            sequences_host = sequences.tolist()
                        body = list(sequences_host[origin])
                        if token != config.eos_id:
                            body.append(token)
                        finished[b].append(Hypothesis(body, score / length**length_penalty, score))
                    continue
                next_scores[b][kept] = score
                next_rows[b * width + kept] = origin
                next_tokens[b * width + kept] = token
                kept += 1
                if kept == width:
                    break
            if at_limit:
                done[b] = True
            elif len(finished[b]) >= width:
                worst_kept = sorted(h.score for h in finished[b])[-width]
                best_open = max(next_scores[b]) / length**length_penalty
                done[b] = best_open <= worst_kept
        if all(done):
            break
        # Reorder everything that belongs to a beam by the beam it came from.
        rows = torch.tensor(next_rows, device=device)
        last = torch.tensor(next_tokens, dtype=torch.long, device=device)
        sequences = torch.cat([sequences[rows], last[:, None]], dim=1)
        past = [(k[rows], v[rows]) for k, v in past]
        scores = torch.tensor(next_scores, device=device)
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in finished]
