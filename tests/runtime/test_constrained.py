"""Constrained beam search on the committed model (fp32): the terms are written, where their
source is translated; sentences without terms in the same batch decode exactly as they do
alone; a batch stepped together with another keeps both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.runtime.bundle import load_bundle
from service.runtime.running_batch import running_batch, step_together
from service.runtime.search import SearchOptions, Sentence
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator, search

BEAM = SearchOptions(beam_size=4)
# (sentence, [(source word, target term)]): terms the model does not choose on its own
CASES = [
    ("Un chien court dans l'herbe verte.", [("chien", "hound")]),
    ("Une femme lit un livre sur un banc.", [("femme", "lady"), ("livre", "novel")]),
    ("Deux hommes jouent au football dans un parc.", []),
    ("Un enfant mange une glace.", [("enfant", "kid")]),
    ("Un homme fait du vélo dans la rue.", []),
]


@pytest.fixture(scope="module")
def translator(fr_en_bundle: Path) -> Translator:
    return Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))


def sentence(translator: Translator, text: str, terms: list, ticket: int) -> Sentence:
    tokenizer = translator.tokenizer
    [source] = tokenizer.encode([text])
    spans = [(text.index(word), text.index(word) + len(word)) for word, _ in terms]
    return Sentence(
        source,
        BEAM,
        ticket=ticket,
        constraints=tuple(tokenizer.encode_target(target) for _, target in terms),
        constraint_spans=tuple(tokenizer.source_spans(text, spans)),
    )


def decode(batches: list, together: bool = False) -> dict:
    found = {}
    while any(len(batch) for batch in batches):
        steps = step_together(batches) if together else [batch.step() for batch in batches]
        for ended in steps:
            for done in ended:
                found[done.sentence.ticket] = done.hypotheses
    return found


def contains(tokens: list[int], term: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i : i + len(term)]) == term for i in range(len(tokens)))


def test_every_term_is_written_and_free_sentences_decode_as_alone(translator) -> None:
    words = translator.tokenizer.term_words()
    batch = running_batch(translator.engine, 4, words)
    sentences = [sentence(translator, text, terms, i) for i, (text, terms) in enumerate(CASES)]
    batch.join(sentences)
    found = decode([batch])
    for s in sentences:
        best = found[s.ticket][0].tokens
        for term in s.constraints:
            assert contains(best, term), translator.tokenizer.decode(best)
        if not s.constraints:  # a free row of a mixed batch: as beam search alone
            [alone] = search(translator.engine, [s.source], BEAM)
            assert [h.tokens for h in found[s.ticket]] == [h.tokens for h in alone]
            assert found[s.ticket][0].score == pytest.approx(alone[0].score, abs=1e-5)


def test_a_term_is_written_where_its_source_is_translated(translator) -> None:
    """ "chien" is the sentence's second word: "hound" comes before the verb, not pasted at
    the end."""
    batch = running_batch(translator.engine, 4, translator.tokenizer.term_words())
    batch.join([sentence(translator, *CASES[0], ticket=0)])
    text = translator.tokenizer.decode(decode([batch])[0][0].tokens)
    assert text.split()[1].lower() == "hound", text


def test_a_term_the_attention_never_reaches_is_left_out_not_run_on(translator) -> None:
    """Its span names no source token the decoder looks at: no beam can write it, so each
    ends where the model ends it, and the sentence comes out as beam search has it, without
    the term: not run on to its length limit looking for a place to put it."""
    text, _ = CASES[2]
    [source] = translator.tokenizer.encode([text])
    term = translator.tokenizer.encode_target("zebra")
    options = SearchOptions(beam_size=4, max_length=40)
    stuck = Sentence(source, options, 0, constraints=(term,), constraint_spans=((99, 100),))
    batch = running_batch(translator.engine, 4, translator.tokenizer.term_words())
    batch.join([stuck])
    [best, *_] = decode([batch])[0]
    [plain, *_] = search(translator.engine, [source], options)[0]
    assert best.tokens == plain.tokens, translator.tokenizer.decode(best.tokens)


def test_a_beam_the_model_ends_before_its_term_does_not_run_on(translator) -> None:
    """A beam that wrote "A jockey on his horse." without the term ends there (ranked after
    those with it) instead of writing a second sentence to fit "steed" in ("A jockey on his
    horse. A steed jockey.")."""
    text = "Un jockey sur son cheval."
    batch = running_batch(translator.engine, 4, translator.tokenizer.term_words())
    batch.join([sentence(translator, text, [("cheval", "steed")], 0)])
    hypotheses = [translator.tokenizer.decode(h.tokens) for h in decode([batch])[0]]
    assert "steed" in hypotheses[0], hypotheses
    for found in hypotheses:
        assert len(re.findall(r"[.!?]", found)) <= 1, hypotheses


def test_a_term_that_goes_on_with_the_word_it_displaced_is_written_whole(translator) -> None:
    """Where "photographic camera" starts, the model wanted "camera": that word is not written
    again while the beam looks at "appareil photo", except as the term's own next token."""
    text = "La femme en bleu manipule un appareil photo devant deux autres femmes."
    batch = running_batch(translator.engine, 4, translator.tokenizer.term_words())
    batch.join([sentence(translator, text, [("appareil photo", "photographic camera")], 0)])
    best = translator.tokenizer.decode(decode([batch])[0][0].tokens)
    assert "photographic camera" in best, best


def test_stepped_together_with_a_greedy_batch_it_decodes_as_apart(translator) -> None:
    words = translator.tokenizer.term_words()

    def batches() -> list:
        greedy, beams = (
            running_batch(translator.engine, 1),
            running_batch(translator.engine, 4, words),
        )
        greedy.join([Sentence(translator.tokenizer.encode([CASES[2][0]])[0], SearchOptions(), 9)])
        beams.join([sentence(translator, text, terms, i) for i, (text, terms) in enumerate(CASES)])
        return [greedy, beams]

    apart, together = decode(batches()), decode(batches(), together=True)
    assert {k: [h.tokens for h in v] for k, v in apart.items()} == {
        k: [h.tokens for h in v] for k, v in together.items()
    }


def test_a_term_kept_as_it_is_comes_out_verbatim(translator) -> None:
    """A "do not translate" entry (target = source, a product name): written as given."""
    text = "Un homme fait du vélo dans la rue."
    batch = running_batch(translator.engine, 4, translator.tokenizer.term_words())
    batch.join([sentence(translator, text, [("vélo", "vélo")], 0)])
    found = translator.tokenizer.decode(decode([batch])[0][0].tokens)
    assert "vélo" in found, found


def test_a_sentence_may_hold_more_terms_than_an_int64_has_bits(translator) -> None:
    """80 terms in one sentence (each number kept as it is): every beam's set of written terms
    outgrows 64 bits. Before, writing term 63 or later overflowed (a 500 for the request)."""
    numbers = [str(n) for n in range(10, 90)]
    text = "Il y a " + " ".join(numbers) + " chiens."
    batch = running_batch(translator.engine, 4, translator.tokenizer.term_words())
    batch.join([sentence(translator, text, [(n, n) for n in numbers], 0)])
    hypotheses = decode([batch])[0]
    # (What the caption model makes of 80 numbers in a row is not the point: that it ends.)
    assert hypotheses and all(hypothesis.tokens for hypothesis in hypotheses)


@pytest.mark.parametrize(
    "text", ["Un chien court.", "Un chien court dans le parc.", "Le chien court dans la rue."]
)
def test_the_words_after_a_one_word_term_are_translated(translator, text: str) -> None:
    """After "hound" the decoder reads "dog", the word the model wanted there: it goes on with
    the verb. (Reading "hound", it wanted to translate "chien" again, and with that word
    banned it skipped the verb: "A hound." for "Un chien court.")"""
    batch = running_batch(translator.engine, 4, translator.tokenizer.term_words())
    batch.join([sentence(translator, text, [("chien", "hound")], 0)])
    found = translator.tokenizer.decode(decode([batch])[0][0].tokens)
    assert "hound" in found.lower().split(), found
    assert any("run" in word for word in found.lower().split()), found  # the verb is there
