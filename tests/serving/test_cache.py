"""The translation cache: bounded in entries and bytes, least recently used out first, and
answers identical to the engine's, with hits skipping the queue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from nmt_contract import Hypothesis
from service.runtime.search import SearchOptions
from service.serving.cache import TranslationCache
from service.serving.settings import Settings
from tests.http.in_process import start

GREEDY, BEAM = SearchOptions(), SearchOptions(beam_size=2)


class Recorder:
    def __init__(self) -> None:
        self.hits = self.misses = self.evictions = 0

    def observe_cache(self, model: str, hits: int, misses: int, evictions: int) -> None:
        self.hits += hits
        self.misses += misses
        self.evictions += evictions


def hypotheses(n: int, alignment_bytes: int = 0) -> list[Hypothesis]:
    alignment = np.zeros(alignment_bytes // 4, np.float32) if alignment_bytes else None
    return [Hypothesis([n, n + 1], -1.0, -2.0, alignment)]


def test_hits_misses_and_the_least_recently_used_leaves_first():
    recorder = Recorder()
    cache = TranslationCache(max_entries=2, max_bytes=10**6, observer=recorder)
    cache.store(("m", ""), [[1], [2]], GREEDY, [hypotheses(1), hypotheses(2)])
    assert cache.lookup(("m", ""), [[1], [3]], GREEDY) == [hypotheses(1), None]  # [1] is now recent
    cache.store(("m", ""), [[3]], GREEDY, [hypotheses(3)])  # evicts [2], the least recently used
    assert cache.lookup(("m", ""), [[1], [2], [3]], GREEDY) == [hypotheses(1), None, hypotheses(3)]
    assert (recorder.hits, recorder.misses, recorder.evictions) == (3, 2, 1)


def test_the_key_holds_the_model_and_the_decoding_options():
    cache = TranslationCache(max_entries=10, max_bytes=10**6)
    cache.store(("m", ""), [[1]], GREEDY, [hypotheses(1)])
    assert cache.lookup(("m", ""), [[1]], BEAM) == [None]
    assert cache.lookup("other", [[1]], GREEDY) == [None]


def test_a_new_version_of_a_model_does_not_answer_from_the_old_one_s_entries():
    cache = TranslationCache(max_entries=10, max_bytes=10**6)
    cache.store(("fr-en", "1"), [[1]], GREEDY, [hypotheses(1)])
    assert cache.lookup(("fr-en", "2"), [[1]], GREEDY) == [None]
    assert cache.lookup(("fr-en", "1"), [[1]], GREEDY) == [hypotheses(1)]


def test_the_byte_bound_holds_and_an_entry_larger_than_the_cache_is_not_kept():
    cache = TranslationCache(max_entries=100, max_bytes=20_000)
    for n in range(10):
        cache.store(("m", ""), [[n]], GREEDY, [hypotheses(n, alignment_bytes=4000)])
        assert cache.bytes <= 20_000
    assert 0 < len(cache) < 10
    cache.store(("m", ""), [[99]], GREEDY, [hypotheses(99, alignment_bytes=40_000)])
    assert cache.lookup(("m", ""), [[99]], GREEDY) == [None]


@pytest.mark.parametrize("entries, size", [(0, 10**6), (10, 0)])
def test_zero_turns_it_off(entries: int, size: int):
    cache = TranslationCache(entries, size)
    cache.store(("m", ""), [[1]], GREEDY, [hypotheses(1)])
    assert cache.lookup(("m", ""), [[1]], GREEDY) == [None] and len(cache) == 0


@pytest.fixture(scope="module")
def clients(fr_en_bundle: Path) -> Iterator[tuple[TestClient, TestClient]]:
    common = {"model_dir": fr_en_bundle, "threads": 1, "max_output_length": 60}
    cached = start(Settings(**common))
    uncached = start(Settings(**common, cache_entries=0))
    yield cached, uncached
    cached.__exit__(None, None, None)
    uncached.__exit__(None, None, None)


def sample(client: TestClient, name: str, labels: dict[str, str]) -> float:
    metrics = client.app.state.metrics
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_answers_with_the_cache_equal_answers_without_it(clients):
    cached, uncached = clients
    body = {
        "text": ["Un homme fait du vélo. Il pleut.", "Deux chiens jouent.", "Il pleut."],
        "source_lang": "fr",
        "target_lang": "en",
        "beam_size": 3,
        "n_best": 2,
        "return_scores": True,
        "return_alignment": True,
    }
    reference = uncached.post("/v1/translate", json=body).json()
    first = cached.post("/v1/translate", json=body).json()  # "Il pleut." twice: one miss
    again = cached.post("/v1/translate", json=body).json()  # all hits
    assert first == again == reference
    hits = sample(
        cached, "nmt_cache_lookups_total", {"model": "fr-en", "version": "", "result": "hit"}
    )
    assert hits == 4  # the second request's 4 sentences
    assert (
        sample(
            uncached, "nmt_cache_lookups_total", {"model": "fr-en", "version": "", "result": "hit"}
        )
        == 0
    )


def test_hits_skip_the_queue_and_the_engine(clients):
    cached, _ = clients
    body = {
        "text": "Une femme lit un livre dans le parc.",
        "source_lang": "fr",
        "target_lang": "en",
    }
    model = {"model": "fr-en", "version": ""}
    cached.post("/v1/translate", json=body)
    before = sample(cached, "nmt_batch_joined_sentences_total", model)
    assert before > 0  # the first request reached the engine
    for _ in range(3):
        assert cached.post("/v1/translate", json=body).status_code == 200
    assert sample(cached, "nmt_batch_joined_sentences_total", model) == before


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache on", "cache off"])
def test_a_sentence_repeated_in_one_request_is_decoded_once(clients, use_cache: bool):
    """64 copies of one sentence cost the engine one sentence, whether the cache is on or not
    (the hostile-input run's slowest requests were such lists)."""
    client = clients[0 if use_cache else 1]
    model = {"model": "fr-en", "version": ""}
    text = "Un garçon saute dans une piscine bleue."
    before = sample(client, "nmt_batch_joined_sentences_total", model)
    body = {"text": [text] * 64, "source_lang": "fr", "target_lang": "en", "beam_size": 2}
    answer = client.post("/v1/translate", json=body).json()
    assert sample(client, "nmt_batch_joined_sentences_total", model) - before == 1
    alone = client.post("/v1/translate", json={**body, "text": text}).json()
    assert [t["text"] for t in answer["translations"]] == [alone["translations"][0]["text"]] * 64
