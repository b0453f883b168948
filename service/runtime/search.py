"""What a search is asked to do and what it gives back, for one sentence.

The decoding itself is split by concept:
* running_batch.py: the rows being decoded, which sentences join and leave between steps;
* strategies.py: how a row's next token is chosen (greedy, beam), one class each;
* kv_cache.py: the keys and values those rows attend to;
* engine.py: the ONNX Runtime sessions that run the encoder and a decoder step.

Same conventions as the torch reference (export/decoding.py), written once in nmt_contract:
* a sentence may produce at most `length_limit(source_length)` tokens, </s> included;
* a hypothesis' raw score (log_prob) is the sum of its tokens' log-probs;
* hypotheses are ranked by log_prob / length ** length_penalty.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from nmt_contract import Hypothesis, length_limit


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int = 1
    length_penalty: float = 1.0
    n_best: int = 1
    max_length: int = 256
    alignment: bool = False
    # Stop a hypothesis before it repeats an n-gram (n <= MAX_REPEAT_NGRAM) more than this
    # many times in a row (a model fed garbage loops: "the man the man the man ..."); 0: off.
    max_repeats: int = 0
    # With alignment: which decoder layer's cross-attention (0 = first, -1 = last), and
    # whether to keep its heads apart (Hypothesis.head_alignment) besides their mean.
    alignment_layer: int = -1
    alignment_heads: bool = False
    # The token every translation starts with, whatever the model says: a multilingual model's
    # target-language token (nmt_contract.Languages.forced_target); None: none. Part of the
    # options, so it is part of a cached translation's key too.
    first_token: int | None = None
    # Keep, per produced token, how sure the decoder was (Hypothesis.token_confidence): what
    # a translation's confidence is computed from (service/serving/confidence.py).
    confidence: bool = False


@dataclass(eq=False)
class Sentence:
    """One source sentence to decode (ids ending in </s>), how, and the caller's handle."""

    source: list[int]
    options: SearchOptions
    ticket: Hashable = None
    # Terms its translation must contain, each a target token sequence (a glossary's; only a
    # beam search with more than one beam writes them: strategies.ConstrainedBeamSearch)
    constraints: tuple[tuple[int, ...], ...] = ()
    # Per constraint, the source positions [start, end) of the words it translates: it is
    # written where the decoder's attention is on them (empty: anywhere)
    constraint_spans: tuple[tuple[int, int], ...] = ()

    def limit(self, max_positions: int) -> int:
        """The most tokens this sentence may produce, </s> included (length_limit), in a
        model of `max_positions` positions."""
        return length_limit(len(self.source), self.options.max_length, max_positions)


@dataclass
class Finished:
    """A sentence that left the batch: its n-best hypotheses, best first ([] if dropped)."""

    sentence: Sentence
    hypotheses: list[Hypothesis]
    steps: int  # decoder steps it took part in


def batch_key(options: SearchOptions) -> int:
    """Sentences that may share a running batch: the same rows per source (beam size)."""
    return options.beam_size
