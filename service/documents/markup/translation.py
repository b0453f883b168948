"""Through the pipeline: the sentences the model reads, one pipeline request for them all,
and the documents written with the answer."""

from __future__ import annotations

import html
from bisect import bisect_right
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from service.documents.markup.fitting import TokenCounter, fit_sentences
from service.documents.markup.layout import MARKUP_THREAD, Document
from service.documents.markup.target import SentenceTranslation, assemble
from service.documents.markup.tree import LINE_BREAKS
from service.documents.markup.writing import render, render_run
from service.runtime.search import SearchOptions
from service.serving.errors import SentenceTooLong, TranslationFailed
from service.serving.input_text import has_letters, model_input
from service.serving.registry import LoadedModel
from service.serving.requests import (
    RequestResult,
    SentenceAlignment,
    TranslationService,
    off_loop,
)
from service.serving.terminology import Terminology
from service.serving.word_alignment import WordAlignment


@dataclass
class MarkupResult:
    texts: list[str]
    sentences: int
    input_tokens: int
    output_tokens: int


async def translate(
    service: TranslationService,
    model: LoadedModel,
    documents: list[Document],
    options: SearchOptions,
    client_gone: Callable[[], Awaitable[object]] | None = None,
    terminology: Terminology | None = None,
    background: bool = False,
) -> MarkupResult:
    """Every sentence of every document in one pipeline request, with alignment on; then each
    run written with its tags placed. Long documents are walked and written on a worker
    thread (off_loop), as they were read. `background`: a document file's chunk (see
    TranslationService.translate), whose sentences too long for the model are cut to fit
    (fitting.py) rather than refused."""
    size = sum(document.chars for document in documents)
    if background:
        await off_loop(
            size,
            fit_sentences,
            documents,
            _token_counter(model),
            model.max_tokens_per_sentence,
            executor=MARKUP_THREAD,
        )
    sources, owners = await off_loop(size, model_sentences, documents, executor=MARKUP_THREAD)
    if not sources:  # nothing but markup, numbers and symbols: the documents as they came
        texts = await off_loop(size, write, documents, [], executor=MARKUP_THREAD)
        return MarkupResult(texts, 0, 0, 0)
    options = replace(options, alignment=True, n_best=1)
    untranslated = None
    if terminology is not None:
        untranslated = await off_loop(
            size, untranslated_stretches, documents, executor=MARKUP_THREAD
        )
    result = await _translate_sentences(
        service, model, sources, owners, options, client_gone, terminology, background, untranslated
    )
    found = from_pipeline(result)
    texts = await off_loop(size, write, documents, found, executor=MARKUP_THREAD)
    return MarkupResult(texts, result.sentences, result.input_tokens, result.output_tokens)


def _token_counter(model: LoadedModel) -> TokenCounter:
    """How many tokens the model reads for each sentence, as the pipeline will give it."""
    tokenizer = model.translator.tokenizer

    def tokens_of(sentences: list[str]) -> list[int]:
        texts = [model_input(sentence.translate(LINE_BREAKS)) for sentence in sentences]
        return [len(ids) for ids in tokenizer.encode(texts, model.source_lang)]

    return tokens_of


def model_sentences(documents: list[Document]) -> tuple[list[str], list[int]]:
    """What the model reads: each sentence that has letters, on one line; and the index of the
    document it belongs to."""
    sources: list[str] = []
    owners: list[int] = []
    for owner, document in enumerate(documents):
        sources += document.model_sentences
        owners += [owner] * len(document.model_sentences)
    return sources, owners


def untranslated_stretches(documents: list[Document]) -> list[list[tuple[int, int]]]:
    """For each of model_sentences()'s sentences, the stretches [start, end) of it that the
    elements the client left untranslated hold: the model reads their words, but a glossary
    term there would be written beside them as they are copied ("The hound <span
    translate="no">chien</span> is running")."""
    found = []
    for document in documents:
        for run in document.runs:
            if not run.needs_model:
                continue
            # In source order, apart from each other (an untranslated element's own
            # elements are not spans): their starts and ends both ascend.
            opaque = [(span.start, span.end) for span in run.spans if span.opaque]
            ends = [end for _, end in opaque]
            for start, end in run.sentences:
                if not has_letters(run.text[start:end]):
                    continue
                stretches = []
                for a, b in opaque[bisect_right(ends, start) :]:
                    if a >= end:
                        break
                    stretches.append((max(a, start) - start, min(b, end) - start))
                found.append(stretches)
    return found


def write(documents: list[Document], translations: list[SentenceTranslation]) -> list[str]:
    """The documents written with the translations of their model_sentences(), in order."""
    found = iter(translations)
    for document in documents:
        for run in document.runs:
            if not run.needs_model:
                continue
            sentences = [
                next(found) if has_letters(sentence) else SentenceTranslation(sentence, None)
                for sentence in (run.text[start:end] for start, end in run.sentences)
            ]  # a sentence without letters comes back as it was, as the pipeline does
            run.translated = render_run(run, assemble(run, sentences))
    return [render(document) for document in documents]


def from_pipeline(result: RequestResult) -> list[SentenceTranslation]:
    """The pipeline's answer to model_sentences() (one text per sentence), as write() takes it."""
    return [
        SentenceTranslation(_model_text(item.text), _word_view(item.alignment))
        for item in result.texts
    ]


def _word_view(alignment: list[SentenceAlignment]) -> WordAlignment | None:
    return alignment[0].words if alignment else None


def _model_text(text: str) -> str:
    """The model learned English with "&" written "&amp;" (Multi30k's references): read as
    text, the markup gets "&amp;" again when written, not "&amp;amp;"."""
    return html.unescape(text) if "&" in text else text


async def _translate_sentences(
    service: TranslationService,
    model: LoadedModel,
    sources: list[str],
    owners: list[int],
    options: SearchOptions,
    client_gone: Callable[[], Awaitable[object]] | None,
    terminology: Terminology | None = None,
    background: bool = False,
    untranslated: list[list[tuple[int, int]]] | None = None,
) -> RequestResult:
    """The pipeline sees one text per sentence; its errors name the client's text instead,
    rebuilt from their fields (`owners` maps the pipeline's text to the client's). Only the
    word alignment is read: no weights are built, and none count against
    NMT_MAX_ALIGNMENT_WEIGHTS (the answer carries none)."""
    try:
        return await service.translate(
            model,
            sources,
            options,
            client_gone,
            split="none",
            alignment_weights=False,
            terminology=terminology,
            background=background,
            untranslated=untranslated,
        )
    except SentenceTooLong as error:  # the pipeline's "sentence 1" is not the client's
        owner = owners[error.text_index]
        raise SentenceTooLong(owner, error.tokens, error.limit, sentence=None) from error
    except TranslationFailed as error:
        raise TranslationFailed(owners[error.text_index], error.reason) from error
