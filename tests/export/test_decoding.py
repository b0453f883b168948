"""Torch reference decoding: greedy and beam search against the model's own log-probs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from export.decoding import beam_search, greedy_search, length_limit  # noqa: E402
from export.model.config import ModelConfig  # noqa: E402
from export.model.transformer import Transformer  # noqa: E402


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=40, d_model=32, n_heads=4, ffn_dim=64, dropout=0.0)
    model = Transformer(config).eval()
    # A random model rarely says </s>; favour it a little so hypotheses end at varied lengths.
    model.final_logits_bias[config.eos_id] = 1.0
    return model


def teacher_forced_log_prob(model: Transformer, source_ids, source_mask, tokens, ended: bool):
    """Sum of log p(token) along a given output, computed in one full (uncached) pass."""
    config = model.config
    output = [*tokens, config.eos_id] if ended else list(tokens)
    target_in = torch.tensor([[config.decoder_start_id, *output[:-1]]])
    with torch.no_grad():
        logits = model(source_ids[None], source_mask[None], target_in)
    log_probs = torch.log_softmax(logits[0], dim=-1)
    return float(log_probs[torch.arange(len(output)), torch.tensor(output)].sum())


def test_beam_of_one_is_greedy(model: Transformer, batch) -> None:
    greedy = greedy_search(model, *batch, max_length=20)
    beam = beam_search(model, *batch, beam_size=1, max_length=20)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam, strict=True):
        assert g.log_prob == pytest.approx(b[0].log_prob, abs=1e-4)


def test_greedy_scores_are_the_models_log_probs(model: Transformer, batch) -> None:
    source_ids, source_mask = batch
    for row, hypothesis in enumerate(greedy_search(model, *batch, max_length=20)):
        limit = length_limit(int(source_mask[row].sum()), 20, model.config.max_positions)
        ended = len(hypothesis.tokens) < limit
        expected = teacher_forced_log_prob(
            model, source_ids[row], source_mask[row], hypothesis.tokens, ended
        )
        assert hypothesis.log_prob == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_scores_are_the_models_log_probs(model: Transformer, batch, length_penalty) -> None:
    source_ids, source_mask = batch
    results = beam_search(
        model, *batch, beam_size=4, n_best=4, length_penalty=length_penalty, max_length=20
    )
    for row, hypotheses in enumerate(results):
        assert len(hypotheses) == 4
        assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
        assert len({tuple(h.tokens) for h in hypotheses}) == 4  # n-best are distinct
        limit = length_limit(int(source_mask[row].sum()), 20, model.config.max_positions)
        for h in hypotheses:
            ended = len(h.tokens) < limit
            expected = teacher_forced_log_prob(
                model, source_ids[row], source_mask[row], h.tokens, ended
            )
            assert h.log_prob == pytest.approx(expected, abs=1e-4)
            length = len(h.tokens) + ended
            assert h.score == pytest.approx(h.log_prob / length**length_penalty, abs=1e-5)


def test_beam_search_finds_at_least_as_likely_outputs_as_greedy(model: Transformer, batch) -> None:
    greedy = greedy_search(model, *batch, max_length=20, length_penalty=0.0)
    beam = beam_search(model, *batch, beam_size=5, length_penalty=0.0, max_length=20)
    for g, b in zip(greedy, beam, strict=True):
        assert b[0].score >= g.score - 1e-5


def test_batching_does_not_change_beam_results(model: Transformer, batch) -> None:
    source_ids, source_mask = batch
    together = beam_search(model, source_ids, source_mask, beam_size=3, max_length=20)
    for row in range(source_ids.shape[0]):
        width = int(source_mask[row].sum())
        alone = beam_search(
            model,
            source_ids[row : row + 1, :width],
            source_mask[row : row + 1, :width],
            beam_size=3,
            max_length=20,
        )
        assert alone[0][0].tokens == together[row][0].tokens
