"""Sentences too long for the model cut at spaces (service/documents/markup/fitting.py), with a
counter of words standing in for the tokenizer: every piece fits, the pieces hold every word
once and in order, they end at clause ends where they may, and the run's words (which the
inline tags' places are counted in) stay as the layout found them."""

from __future__ import annotations

from service.documents import markup
from service.documents.markup.fitting import fit_sentences

HTML = markup.MarkupOptions(kind="html", split="no_newlines")


def words_and_end(texts: list[str]) -> list[int]:
    """A model that reads a token a word, and its end-of-sentence token."""
    return [len(text.split()) + 1 for text in texts]


def pieces_of(run: markup.Run) -> list[str]:
    return [run.text[start:end] for start, end in run.sentences]


def test_a_sentence_too_long_is_cut_at_spaces_into_even_pieces_that_fit() -> None:
    paragraph = "Puis " + " ".join(f"mot{i}" for i in range(50)) + " <b>fin</b> du paragraphe"
    (document,) = markup.read([f"<p>Court. {paragraph}</p>"], HTML)
    (run,) = document.runs
    words_before = list(run.source_words)
    assert len(document.model_sentences) == 2
    assert fit_sentences([document], words_and_end, limit=11) == 1
    pieces = pieces_of(run)
    assert pieces[0] == "Court."
    # 54 words, at most 10 a piece (11 tokens with the end): the fewest pieces, 9 words each.
    assert [len(piece.split()) for piece in pieces[1:]] == [9] * 6
    plain = paragraph.replace("<b>", "").replace("</b>", "")
    assert " ".join(pieces[1:]) == plain
    assert run.source_words == words_before
    assert document.model_sentences == pieces  # what the pipeline is then given


def test_pieces_end_at_clause_ends_and_hold_at_most_piece_tokens() -> None:
    clauses = ["un homme marche dans la rue", "une femme lit", "deux enfants jouent au ballon"]
    paragraph = "Puis " + ", ".join(clauses * 4) + "."  # 55 words
    (document,) = markup.read([f"<p>{paragraph}</p>"], HTML)
    (run,) = document.runs
    # Under the sentence's limit: left whole, whatever the pieces' size.
    assert fit_sentences([document], words_and_end, limit=60, piece_tokens=8) == 0
    assert fit_sentences([document], words_and_end, limit=50, piece_tokens=8) == 1
    pieces = pieces_of(run)
    assert " ".join(pieces) == paragraph
    assert all(len(piece.split()) <= 7 for piece in pieces)
    # Ends at commas where a piece holds enough (30% of an even piece: 2 words) to end there.
    assert sum(piece.endswith(",") for piece in pieces) >= len(clauses * 4) - 2


def test_sentences_that_fit_and_a_word_longer_than_the_limit_are_left_whole() -> None:
    long_word = "a" * 40
    texts = ["<p>Un chat dort. Un chien court.</p>", f"<p>Un {long_word} x</p>"]
    documents = markup.read(texts, HTML)
    before = [list(run.sentences) for run in documents[0].runs]

    def characters(texts: list[str]) -> list[int]:
        return [len(text) + 1 for text in texts]

    assert fit_sentences(documents[:1], characters, limit=30) == 0
    assert [list(run.sentences) for run in documents[0].runs] == before
    # The long word is a piece of its own (and will fail as the whole sentence would have).
    assert fit_sentences(documents[1:], characters, limit=30) == 1
    assert pieces_of(documents[1].runs[0]) == ["Un", long_word, "x"]
