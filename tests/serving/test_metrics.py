"""Metrics that the decoding loop reports at every decoder step are buffered and put
into Prometheus when the registry is collected (service/serving/metrics.py)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from service.serving.metrics import STEP_BUFFER, Metrics


def scraped(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    """Every sample of a /metrics page, as a scraper parses it."""
    samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_buffered_steps_are_all_in_the_next_scrape():
    metrics = Metrics()
    steps = [(3, 0, 0.002), (3, 2, 0.004), (1, 5, 0.001)]
    for sentences, output_tokens, seconds in steps:
        metrics.observe_step(("fr-en", ""), sentences, sentences, output_tokens, seconds)
    metrics.observe_step(("de-en", ""), 7, 28, 1, 0.01)
    page = scraped(metrics)
    fr = (("model", "fr-en"), ("version", ""))
    assert page[("nmt_batch_step_sentences_count", fr)] == 3
    assert page[("nmt_batch_step_sentences_sum", fr)] == 3 + 3 + 1
    decode = (("method", "decode"), ("model", "fr-en"), ("version", ""))
    assert page[("nmt_batch_forward_duration_seconds_count", decode)] == 3
    assert abs(page[("nmt_batch_forward_duration_seconds_sum", decode)] - 0.007) < 1e-12
    assert page[("nmt_output_tokens_total", fr)] == 7
    assert page[("nmt_decode_steps_total", fr)] == 3
    # A second scrape counts nothing twice.
    metrics.observe_step(("fr-en", ""), 2, 2, 1, 0.003)
    page = scraped(metrics)
    assert page[("nmt_batch_step_sentences_count", fr)] == 4
    assert page[("nmt_decode_steps_total", fr)] == 4


def test_reading_one_sample_also_sees_the_buffered_steps():
    metrics = Metrics()
    metrics.observe_step(("fr-en", ""), 4, 4, 0, 0.002)
    count = metrics.registry.get_sample_value(
        "nmt_decode_steps_total", {"model": "fr-en", "version": ""}
    )
    assert count == 1


def test_without_scrapes_the_buffer_stays_bounded_and_no_step_is_lost():
    metrics = Metrics()
    total = 10 * STEP_BUFFER + 3
    for _ in range(total):
        metrics.observe_step(("fr-en", ""), 1, 1, 1, 0.001)
    assert len(metrics._steps) < STEP_BUFFER  # the worker put them in itself
    assert (
        scraped(metrics)[("nmt_decode_steps_total", (("model", "fr-en"), ("version", "")))] == total
    )
