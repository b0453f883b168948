"""One translation request, from texts to results, through the model's decoding loop:

texts (checked and cleaned: input_text.py) -> sentences (kept with their separators) -> token
ids of the sentences that have letters (checked against the per-sentence limit) -> one
queued job -> hypotheses -> detokenized sentences (the others as they came) -> texts in
their layout.

Used by both the native API and the LibreTranslate-compatible one; knows nothing of HTTP.
Waiting is where cancellation happens: if the client goes away or the deadline passes first,
the job's queued sentences are dropped and the request ends with ClientGone/DeadlineExceeded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from nmt_contract import Hypothesis, length_limit
from service.runtime.search import SearchOptions
from service.runtime.tokenizer import BundleTokenizer
from service.serving.cache import TranslationCache
from service.serving.confidence import (
    SentenceConfidence,
    search_of,
    sentence_confidence,
    sentence_features,
    text_confidence,
    through_pivot,
    words_of,
)
from service.serving.errors import (
    AlignmentTooLarge,
    ClientGone,
    DeadlineExceeded,
    DetectedLanguageNotServed,
    InvalidInput,
    QuotaExceeded,
    RequestTooLarge,
    SentenceTooLong,
    ShuttingDown,
    TranslationFailed,
    UnknownPair,
)
from service.serving.input_text import clean_text, has_letters, model_input, model_offset
from service.serving.language_id import Detection, LanguageDetector
from service.serving.lifecycle import Lifecycle
from service.serving.loop import SentenceFailed
from service.serving.pivot import Pivot, compose_weights, pivot_for, pivot_pairs
from service.serving.registry import LoadedModel, ModelRegistry
from service.serving.sentences import SplitMode, SplitText, split_text
from service.serving.settings import Settings
from service.serving.terminology import SentenceTerms, Terminology, kept, sentence_terms
from service.serving.tracing import Tracing
from service.serving.word_alignment import WordAlignment, word_alignment

if TYPE_CHECKING:
    from service.serving.metrics import Metrics

WEIGHT_DECIMALS = 3
# Work on more than this many characters (an answer: characters plus attention weights) runs
# on a worker thread rather than on the event loop (off_loop); below it, inline.
PREPARE_INLINE_CHARS = 2000
# A detection (percent) below this is a guess: see TranslationService.detect_source.
SURE_DETECTION = 50.0
# Beams for a sentence with glossary terms when its request asks for greedy search: a term
# needs beams of its own next to those the model prefers (strategies.ConstrainedBeamSearch).
TERM_BEAMS = 4


T = TypeVar("T")


async def off_loop(
    size: int, work: Callable[..., T], *args: Any, executor: Executor | None = None
) -> T:
    """work(*args) on a worker thread (of `executor`, or asyncio's default pool) when `size`
    (characters, or values of an answer) passes PREPARE_INLINE_CHARS, so that the event loop
    keeps answering /healthz and other requests while it runs (the GIL is shared, but handed
    over every 5 ms); inline for small work, where the hand-off would cost more than the work
    itself."""
    if size > PREPARE_INLINE_CHARS:
        return await asyncio.get_running_loop().run_in_executor(executor, work, *args)
    return work(*args)


@dataclass
class Alternative:
    text: str
    score: float


@dataclass
class SentenceAlignment:
    """Cross-attention of one sentence: weights[i][j] is how much target token i attended to
    source token j (rows: produced tokens, </s> included when the sentence ended with it)."""

    source_tokens: list[str]
    target_tokens: list[str]
    weights: list[list[float]]
    words: WordAlignment | None = None  # the same, by word, with the hard alignment
    layer: int | None = None  # the decoder layer the weights come from (0 = first)
    head_weights: list[list[list[float]]] | None = None  # [head][target][source], if asked


@dataclass
class TextResult:
    text: str
    score: float  # mean of its sentences' scores (0.0 for an empty text)
    n_best: list[Alternative]  # best first; n_best[0] is `text`
    alignment: list[SentenceAlignment] = field(default_factory=list)
    # The text's sentences, each as its n-best translations (best first), and where they sat:
    # what a pivot's second model translates, and how it puts the text back together.
    sentences: list[list[Alternative]] = field(default_factory=list)
    layout: SplitText = field(default_factory=lambda: SplitText([], []))
    # With options.confidence: the text's (confidence.text_confidence), and each of its
    # sentences' (None for one without letters, returned as it was)
    confidence: SentenceConfidence | None = None
    sentence_confidences: list[SentenceConfidence | None] = field(default_factory=list)


@dataclass
class RequestResult:
    model: str
    model_version: int | None  # None: an unversioned bundle
    texts: list[TextResult]
    sentences: int
    input_tokens: int  # source tokens fed to the encoder, </s> included
    output_tokens: int  # tokens of the returned translations, </s> excluded
    alignment_weights: int = 0  # attention weights in `texts` (what rendering them costs)
    pivot: str | None = None  # the language translated through, when no model did it directly
    terms: int = 0  # glossary terms found in the sentences
    terms_kept: int = 0  # ... and found in their translations
    confidence_label: str | None = None  # what the model's calibration calls good


class TranslationService:
    """The door the routes go through: admission, model lookup and the request pipeline."""

    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        lifecycle: Lifecycle,
        cache: TranslationCache | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.tracing = tracing if tracing is not None else Tracing()  # default: off
        self.registry = registry
        self.lifecycle = lifecycle
        self.cache = cache if cache is not None else TranslationCache(0, 0)  # 0: off
        self.detector = LanguageDetector(settings.language_id_model_file)
        self.characters_translated = 0  # source characters of answered requests, since start

    def model_for(
        self,
        source_lang: str,
        target_lang: str,
        admitted_at: float | None = None,
        version: int | None = None,
    ) -> LoadedModel | Pivot:
        """The model of a pair (its serving version, or a loaded `version`), or two chained
        through English when no model translates it directly; for a request admitted at
        `admitted_at` (time.monotonic()): refused while loading, and while draining unless
        admitted before the signal."""
        self.lifecycle.check_accepting(admitted_at)
        try:
            return self.registry.get(source_lang, target_lang, version)
        except UnknownPair:
            models = self.registry.models
            pivot = pivot_for(models, source_lang, target_lang)
            if pivot is None or version is not None:
                raise UnknownPair(source_lang, target_lang, self.pairs) from None
            return pivot

    @property
    def pairs(self) -> list[str]:
        """Every pair served, directly or through the pivot language."""
        models = self.registry.models
        through = [f"{a}-{b}" for a, b in pivot_pairs(models)]
        return sorted({m.pair for m in models} | set(through))

    def sources_for(self, target_lang: str) -> list[str]:
        """The source languages some model translates into target_lang."""
        return sorted({a for m in self.registry.models for a, b in m.pairs() if b == target_lang})

    def undetectable_sources(self) -> list[str]:
        """The source languages served that language detection cannot name: a text in one,
        sent without its language, is detected as another (NMT_LANGUAGE_ID_MODEL)."""
        sources = {a for m in self.registry.models for a, _ in m.pairs()}
        return sorted(sources - self.detector.languages)

    async def detect(self, text: str, index: int = 0) -> list[Detection]:
        """The likely languages of a text, best first (off the event loop: it is CPU work).
        `index`: the text's place in the request, for the error a bad text gets."""
        return await self._detect_clean(clean_text(text, index))

    async def _detect_clean(self, text: str, candidates: int | None = 3) -> list[Detection]:
        return await off_loop(len(text), self.detector.detect, text, candidates)

    async def detect_source(self, texts: list[str], target_lang: str) -> Detection:
        """The source language of a request without one: detected on all its texts together.

        A short text often looks like some other language ("Un homme." reads as Northern Sotho,
        at 7%). So when detection is unsure (below SURE_DETECTION) of a language that no model
        translates into target_lang, and a single source language does, that one is the
        answer, with the detector's own confidence in it. Otherwise an unserved detection is
        DetectedLanguageNotServed: with several sources there is no honest guess, and a sure
        detection of another language (a German text for a French model) is not a guess."""
        cleaned = [clean_text(text, index) for index, text in enumerate(texts)]
        ranked = await self._detect_clean("\n".join(cleaned), candidates=None)
        best = ranked[0]
        sources = sorted(set(self.sources_for(target_lang)))
        if best.language in sources:
            return best
        if len(sources) == 1 and best.confidence < SURE_DETECTION:
            only = sources[0]
            return next((d for d in ranked if d.language == only), Detection(only, 0.0))
        raise DetectedLanguageNotServed(best.language, best.confidence, target_lang, sources)

    async def translate(
        self,
        model: LoadedModel | Pivot,
        texts: list[str],
        options: SearchOptions,
        client_gone: Callable[[], Awaitable[object]] | None = None,
        split: SplitMode = "sentences",
        alignment_weights: bool = True,
        terminology: Terminology | None = None,
        background: bool = False,
        untranslated: list[list[tuple[int, int]]] | None = None,
    ) -> RequestResult:
        """The texts translated. `background`: a document's chunk, decoded in the room that
        interactive requests leave (service/serving/queue.py), under the document deadline
        (NMT_DOCUMENT_CHUNK_TIMEOUT_SECONDS) instead of the request's.

        With options.alignment, each sentence's alignment: its
        weights (capped by NMT_MAX_ALIGNMENT_WEIGHTS, AlignmentTooLarge past it) unless
        `alignment_weights` is False, for callers that read only the word alignment. With a
        `terminology` (a glossary's entries), its terms found in a sentence are written in
        its translation (terminology.py, runtime/strategies.ConstrainedBeamSearch), except
        in a text's `untranslated` stretches [start, end) (with split "none": words that the
        client's markup leaves untranslated, read by the model and copied as they are).

        The model is held (ModelRegistry.lease) until the answer is assembled: a version
        retired meanwhile (a reload) finishes this request before it is unloaded. A Pivot's
        two models are held in turn, each for its leg."""
        if isinstance(model, Pivot):
            return await self._through(
                model,
                texts,
                options,
                client_gone,
                split,
                alignment_weights,
                terminology,
                background,
            )
        with self.registry.lease(model) as held:
            return await self._translate(
                held,
                texts,
                options,
                client_gone,
                split,
                alignment_weights,
                terminology,
                background,
                untranslated,
            )

    async def _through(
        self,
        pivot: Pivot,
        texts: list[str],
        options: SearchOptions,
        client_gone: Callable[[], Awaitable[object]] | None,
        split: SplitMode,
        alignment_weights: bool,
        terminology: Terminology | None,
        background: bool,
    ) -> RequestResult:
        """The texts through `pivot.first`, then each of its sentences through `pivot.second`
        (so the sentences of both legs line up), put back in the texts' layout; alignments
        composed (pivot.py)."""
        if terminology is not None:
            raise InvalidInput(
                "glossary_through_pivot",
                f"cannot be applied: no model translates {pivot.source_lang} to "
                f"{pivot.target_lang} directly (it goes through {pivot.via})",
                field="glossary_id",
            )
        # The first leg's weights are needed to compose, whatever the caller reads.
        first_options = replace(options, n_best=1, first_token=pivot.first.first_token)
        first = await self.translate(
            pivot.first, texts, first_options, client_gone, split, True, background=background
        )
        middle = [sentence[0].text for text in first.texts for sentence in text.sentences]
        second_options = replace(options, first_token=pivot.second.first_token)
        second = await self.translate(
            pivot.second, middle, second_options, client_gone, "none", True, background=background
        )
        return await off_loop(
            len(middle) + first.alignment_weights + second.alignment_weights,
            _join_legs,
            pivot,
            first,
            second,
            options,
            alignment_weights,
        )

    async def _translate(
        self,
        model: LoadedModel,
        texts: list[str],
        options: SearchOptions,
        client_gone: Callable[[], Awaitable[object]] | None,
        split: SplitMode,
        alignment_weights: bool,
        terminology: Terminology | None,
        background: bool,
        untranslated: list[list[tuple[int, int]]] | None = None,
    ) -> RequestResult:
        characters = sum(len(text) for text in texts)
        quota = self.settings.character_limit
        if quota and self.characters_translated + characters > quota:
            raise QuotaExceeded(self.characters_translated, quota)
        if background:
            timeout = self.settings.document_chunk_timeout_seconds
        else:
            timeout = self.settings.request_timeout_seconds
        deadline = time.monotonic() + timeout
        # A document's chunk is bounded by its worker (NMT_DOCUMENT_CHUNK_SENTENCES) and one
        # paragraph at least: a paragraph of many sentences is still one chunk.
        limit = self.settings.max_sentences_per_request if not background else 1 << 30
        with self.tracing.span("nmt.prepare", model):
            prepared = await off_loop(
                characters, _prepare, model, texts, limit, split, terminology, untranslated
            )
        decoding = decoding_options(options)
        hypotheses = await self._run(model, prepared, decoding, deadline, client_gone, background)
        weights = 0
        if options.alignment and alignment_weights:  # counted before any list is built
            weights = _alignment_weights(prepared, hypotheses)
            if weights > self.settings.max_alignment_weights:
                raise AlignmentTooLarge(weights, self.settings.max_alignment_weights)
        self.characters_translated += characters
        with self.tracing.span("nmt.assemble", model):
            result = await off_loop(
                characters + weights,
                _assemble,
                model,
                prepared,
                hypotheses,
                options,
                alignment_weights,
            )
        result.alignment_weights = weights
        if result.terms and self.metrics is not None:
            self.metrics.observe_terms_kept(model.labels, result.terms_kept / result.terms)
        if options.confidence and self.metrics is not None:
            confidences = [
                c.sentence
                for text in result.texts
                for c in text.sentence_confidences
                if c is not None and c.sentence is not None
            ]
            self.metrics.observe_confidence(model.labels, confidences)
        return result

    async def _run(
        self,
        model: LoadedModel,
        prepared: _Prepared,
        options: SearchOptions,
        deadline: float,
        client_gone: Callable[[], Awaitable[object]] | None,
        background: bool,
    ) -> list[list[Hypothesis]]:
        sources, terms = prepared.sources, prepared.terms
        # Sentences with glossary terms bypass the cache (their translation is the terms')
        cached = self.cache.lookup(model.labels, sources, options)
        cached = [None if terms[i] else found for i, found in enumerate(cached)]
        missing = [i for i, found in enumerate(cached) if found is None]
        if missing:  # only what the cache lacks goes through the queue and the engine
            # ... and each distinct sentence once: a text repeated 64 times in one request
            # costs the engine one sentence, whether the cache is on or not.
            first_of: dict[tuple, int] = {}
            for i in missing:
                first_of.setdefault((tuple(sources[i]), terms[i]), i)
            firsts = list(first_of.values())
            fresh: list[list[Hypothesis]] = [[] for _ in firsts]
            # A greedy request's sentences with terms are searched with beams, apart.
            groups = [[k for k, i in enumerate(firsts) if not terms[i]]]
            groups.append([k for k, i in enumerate(firsts) if terms[i]])
            for group in groups:
                if not group:
                    continue
                wanted = options
                if terms[firsts[group[0]]] and options.beam_size < 2:
                    wanted = replace(options, beam_size=max(TERM_BEAMS, options.n_best))
                found = await self._decode(
                    model,
                    [firsts[k] for k in group],
                    prepared,
                    wanted,
                    deadline,
                    client_gone,
                    background,
                )
                for k, hypotheses in zip(group, found, strict=True):
                    fresh[k] = hypotheses
            plain = [k for k, i in enumerate(firsts) if not terms[i]]
            self.cache.store(
                model.labels,
                [sources[firsts[k]] for k in plain],
                options,
                [fresh[k] for k in plain],
            )
            found_of = dict(zip(first_of, fresh, strict=True))
            for i in missing:
                cached[i] = found_of[tuple(sources[i]), terms[i]]
        return cached  # type: ignore[return-value]  # every slot is filled now

    async def _decode(
        self,
        model: LoadedModel,
        which: list[int],
        prepared: _Prepared,
        options: SearchOptions,
        deadline: float,
        client_gone: Callable[[], Awaitable[object]] | None,
        background: bool = False,
    ) -> list[list[Hypothesis]]:
        """Sentences `which` of the request through the model's decoding loop."""
        owners = [prepared.owners[i] for i in which]
        decoding = model.loop
        trace = self.tracing.job(model, len(which), options.beam_size)  # None: not traced
        job = decoding.submit(
            [prepared.sources[i] for i in which],
            options,
            deadline,
            terms=[prepared.terms[i] for i in which],
            background=background,
            trace=trace,
        )
        if trace is not None:  # its spans, from the times the loop wrote down, once it is over
            job.future.add_done_callback(trace.end)
        watcher = asyncio.ensure_future(client_gone()) if client_gone is not None else None
        grace_over = asyncio.ensure_future(self.lifecycle.grace_over.wait())
        try:
            waiting: set[asyncio.Future] = {job.future, grace_over}
            if watcher is not None:
                waiting.add(watcher)
            timeout = max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait(
                waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:  # the server cut this request off (past its own limit)
            decoding.cancel(job, "cancelled")
            raise
        finally:
            grace_over.cancel()
            if watcher is not None:
                watcher.cancel()
        if job.future in done:
            try:
                return job.future.result()
            except SentenceFailed as failure:
                raise TranslationFailed(owners[failure.index], failure.reason) from failure
            except DeadlineExceeded:  # the loop dropped it from the queue
                raise DeadlineExceeded(round(job.timeout, 1)) from None
        if watcher is not None and watcher in done:
            decoding.cancel(job, "client_gone")
            raise ClientGone("the client disconnected")
        if grace_over in done:
            decoding.cancel(job, "shutdown")
            self.lifecycle.abandoned += 1
            raise ShuttingDown(
                "the server is shutting down and this request did not finish within "
                f"{self.lifecycle.grace:g} s (NMT_SHUTDOWN_TIMEOUT_SECONDS): send it again"
            )
        decoding.cancel(job, "deadline")
        raise DeadlineExceeded(round(job.timeout, 1))


@dataclass
class _Prepared:
    """A request's texts, ready for the decoding loop.

    sources[i]: token ids of the i-th sentence that goes to the model, owners[i] its text;
    slots[t][k]: the index in `sources` of text t's k-th sentence, or None when that sentence
    has no letters and is returned as it is.
    """

    splits: list[SplitText]
    sources: list[list[int]]
    owners: list[int]
    slots: list[list[int | None]]
    terms: list[SentenceTerms | None]  # per source: the glossary terms found in it


def _prepare(
    model: LoadedModel,
    texts: list[str],
    max_sentences: int,
    split: SplitMode = "sentences",
    terminology: Terminology | None = None,
    untranslated: list[list[tuple[int, int]]] | None = None,
) -> _Prepared:
    if untranslated is not None and split != "none":
        raise ValueError("untranslated stretches are a text's one sentence's (split 'none')")
    splits: list[SplitText] = []
    count = 0
    for index, text in enumerate(texts):
        splits.append(split_text(clean_text(text, index), split))
        count += len(splits[-1].sentences)
        if count > max_sentences:  # before any tokenizing, and the texts after it unsplit
            raise RequestTooLarge(count, max_sentences, at_least=index + 1 < len(texts))
    sentences: list[str] = []
    owners: list[int] = []
    slots: list[list[int | None]] = []
    stretches: list[list[tuple[int, int]]] = []  # per sentence, untranslated, in model input
    for text_index, split in enumerate(splits):
        slots.append([])
        for sentence in split.sentences:
            if not has_letters(sentence):
                slots[-1].append(None)
                continue
            slots[-1].append(len(sentences))
            sentences.append(model_input(sentence))
            owners.append(text_index)
            if untranslated is not None:  # (the text less its leading whitespace: split_text)
                cleaned = clean_text(texts[text_index], text_index)
                shift = len(cleaned) - len(cleaned.lstrip())
                stretches.append(
                    [
                        (model_offset(sentence, a - shift), model_offset(sentence, b - shift))
                        for a, b in untranslated[text_index]
                    ]
                )
    tokenizer = model.translator.tokenizer
    sources = tokenizer.encode(sentences, model.source_lang) if sentences else []
    limit = model.max_tokens_per_sentence
    for position, ids in enumerate(sources):
        if len(ids) > limit:
            text = owners[position]
            number = slots[text].index(position)
            raise SentenceTooLong(text, len(ids), limit, sentence=number + 1)
    terms: list[SentenceTerms | None] = [None] * len(sources)
    if terminology is not None and len(terminology):
        tokenizer = model.translator.tokenizer
        terms = [
            sentence_terms(
                tokenizer,
                terminology,
                sentence,
                model.source_lang,
                stretches[position] if stretches else (),
            )
            for position, sentence in enumerate(sentences)
        ]
    return _Prepared(splits, sources, owners, slots, terms)


def decoding_options(options: SearchOptions) -> SearchOptions:
    """What the loop is asked for: with confidence, also the alignment (its attention
    features) and every hypothesis of a beam (their agreement); the answer then shows only
    what the client asked for."""
    if not options.confidence:
        return options
    alignment_layer = options.alignment_layer if options.alignment else -1
    n_best = max(options.n_best, options.beam_size)
    return replace(options, alignment=True, alignment_layer=alignment_layer, n_best=n_best)


def _confidence(
    model: LoadedModel,
    source: list[int],
    hypotheses: list[Hypothesis],
    options: SearchOptions,
    with_terms: bool,
) -> SentenceConfidence:
    """One sentence's confidence, from its hypotheses decoded with decoding_options."""
    best = hypotheses[0]
    tokens, log_probs, skip_first = words_of(best, options.first_token)
    features = sentence_features(best, hypotheses[1:], len(source), skip_first)
    beams = options.beam_size if not with_terms else max(options.beam_size, TERM_BEAMS)
    # No room was left for </s>: the limit, not the model, ended it.
    limit = length_limit(len(source), options.max_length, model.translator.engine.max_positions)
    return sentence_confidence(
        model.calibration,
        search_of(beams),
        features,
        model.translator.tokenizer.target_pieces(tokens),
        log_probs,
        source_ids=source,
        output_ids=tokens,
        truncated=len(best.tokens) >= limit,
    )


def _alignment_weights(prepared: _Prepared, hypotheses: list[list[Hypothesis]]) -> int:
    """The attention weights an answer would carry: for each sentence of each text (a
    repeated sentence, decoded once, is in the answer as often as it is in the request),
    target x source tokens, for the heads' mean and for each head kept apart."""
    count = 0
    for slots in prepared.slots:
        for slot in slots:
            if slot is None:
                continue
            best = hypotheses[slot][0]
            for weights in (best.alignment, best.head_alignment):
                count += 0 if weights is None else int(weights.size)
    return count


def _assemble(
    model: LoadedModel,
    prepared: _Prepared,
    hypotheses: list[list[Hypothesis]],
    options: SearchOptions,
    with_weights: bool = True,
) -> RequestResult:
    tokenizer = model.translator.tokenizer
    layers = model.bundle.dims["decoder_layers"]
    results: list[TextResult] = []
    for split, slots in zip(prepared.splits, prepared.slots, strict=True):
        # Each sentence's alternatives as (text, score), best first.
        choices = [
            [(sentence, 0.0)]
            if slot is None
            else [(tokenizer.decode(h.tokens), h.score) for h in hypotheses[slot]]
            for sentence, slot in zip(split.sentences, slots, strict=True)
        ]
        if not choices:  # an empty or blank text
            empty = [Alternative("", 0.0)] * options.n_best
            results.append(TextResult("", 0.0, empty, layout=split))
            continue
        n_best = []
        for rank in range(options.n_best):
            # The k-th alternative of a text joins the k-th alternative of each sentence.
            chosen = [c[min(rank, len(c) - 1)] for c in choices]
            text = split.join([sentence for sentence, _ in chosen])
            n_best.append(Alternative(text, sum(score for _, score in chosen) / len(chosen)))
        alignment = []
        if options.alignment:
            alignment = [
                SentenceAlignment([], [], [])
                if slot is None
                else _alignment(
                    tokenizer,
                    prepared.sources[slot],
                    hypotheses[slot][0],
                    options,
                    layers,
                    with_weights,
                )
                for slot in slots
            ]
        sentences = [[Alternative(text, score) for text, score in c] for c in choices]
        result = TextResult(n_best[0].text, n_best[0].score, n_best, alignment, sentences, split)
        if options.confidence:
            result.sentence_confidences = [
                None
                if slot is None
                else _confidence(
                    model,
                    prepared.sources[slot],
                    hypotheses[slot],
                    options,
                    prepared.terms[slot] is not None,
                )
                for slot in slots
            ]
            result.confidence = text_confidence(
                [c for c in result.sentence_confidences if c is not None]
            )
        results.append(result)
    found = [(terms, hypotheses[i][0]) for i, terms in enumerate(prepared.terms) if terms]
    return RequestResult(
        model=model.name,
        model_version=model.version,
        texts=results,
        sentences=len(prepared.sources),
        input_tokens=sum(len(s) for s in prepared.sources),
        output_tokens=sum(len(h[0].tokens) for h in hypotheses),
        terms=sum(len(terms.targets) for terms, _ in found),
        terms_kept=sum(kept(tokenizer.decode(best.tokens), terms.targets) for terms, best in found),
        confidence_label=None if model.calibration is None else model.calibration.label,
    )


def _join_legs(
    pivot: Pivot,
    first: RequestResult,
    second: RequestResult,
    options: SearchOptions,
    with_weights: bool,
) -> RequestResult:
    """The second leg's sentences back into the first leg's texts and layouts."""
    results: list[TextResult] = []
    legs = iter(second.texts)
    weights = 0
    for text in first.texts:
        sentences = [next(legs) for _ in text.sentences]
        n_best = [
            Alternative(
                text.layout.join([s.n_best[min(rank, len(s.n_best) - 1)].text for s in sentences]),
                sum(s.n_best[min(rank, len(s.n_best) - 1)].score for s in sentences)
                / max(len(sentences), 1),
            )
            for rank in range(options.n_best)
        ]
        alignment = []
        if options.alignment:
            # (A sentence the first leg translated to nothing gave the second leg an empty
            # text, which has no sentence and so no alignment: nothing to compose with.)
            alignment = [
                _composed(a, s.alignment[0] if s.alignment else _NOTHING, with_weights)
                for a, s in zip(text.alignment, sentences, strict=True)
            ]
            weights += sum(len(a.weights) * len(a.source_tokens) for a in alignment)
        joined = TextResult(
            n_best[0].text,
            n_best[0].score,
            n_best,
            alignment,
            [s.sentences[0] if s.sentences else s.n_best for s in sentences],
            text.layout,
        )
        if options.confidence:
            joined.sentence_confidences = [
                None if mine is None or s.confidence is None else through_pivot(mine, s.confidence)
                for mine, s in zip(text.sentence_confidences, sentences, strict=True)
            ]
            joined.confidence = text_confidence(
                [c for c in joined.sentence_confidences if c is not None]
            )
        results.append(joined)
    return RequestResult(
        model=pivot.name,
        model_version=None,
        texts=results,
        sentences=first.sentences,
        input_tokens=first.input_tokens,  # what the client sent
        output_tokens=second.output_tokens,  # and got back
        alignment_weights=weights,
        pivot=pivot.via,
        confidence_label=second.confidence_label,
    )


_NOTHING = SentenceAlignment([], [], [])  # the alignment of an empty text's translation


def _composed(
    first: SentenceAlignment, second: SentenceAlignment, with_weights: bool
) -> SentenceAlignment:
    """Source -> pivot and pivot -> target made source -> target (pivot.compose_weights)."""
    if not first.weights or not second.weights:  # a sentence without letters: no alignment
        return SentenceAlignment(first.source_tokens, second.target_tokens, [])
    weights = compose_weights(
        np.asarray(first.weights),
        first.target_tokens,
        np.asarray(second.weights),
        second.source_tokens,
    )
    return SentenceAlignment(
        source_tokens=first.source_tokens,
        target_tokens=second.target_tokens,
        weights=weights.round(WEIGHT_DECIMALS).tolist() if with_weights else [],
        words=word_alignment(first.source_tokens, second.target_tokens, weights, WEIGHT_DECIMALS),
        layer=second.layer,
    )


def _alignment(
    tokenizer: BundleTokenizer,
    source: list[int],
    best: Hypothesis,
    options: SearchOptions,
    layers: int,
    with_weights: bool = True,
) -> SentenceAlignment:
    """One sentence's alignment; with_weights False: the word alignment only (weights and
    head_weights left empty, no lists built)."""
    weights, heads, tokens = best.alignment, best.head_alignment, best.tokens
    if options.first_token is not None and tokens and tokens[0] == options.first_token:
        # A multilingual model's target-language token, forced first: no word of the text.
        tokens = tokens[1:]
        weights = None if weights is None else weights[1:]
        heads = None if heads is None else heads[1:]
    rows = 0 if weights is None else weights.shape[0]
    target_pieces = tokenizer.target_pieces(tokens)
    if rows > len(target_pieces):  # the last step produced </s>
        target_pieces = [*target_pieces, "</s>"]
    source_pieces = tokenizer.source_pieces(source)
    if weights is None:
        return SentenceAlignment(source_pieces, target_pieces[:rows], [])
    heads = heads if with_weights else None  # [target, heads, source] or None
    return SentenceAlignment(
        source_tokens=source_pieces,
        target_tokens=target_pieces[:rows],
        weights=weights.astype(float).round(WEIGHT_DECIMALS).tolist() if with_weights else [],
        words=word_alignment(source_pieces, target_pieces[:rows], weights, WEIGHT_DECIMALS),
        layer=options.alignment_layer % layers,
        head_weights=None
        if heads is None
        else heads.transpose(1, 0, 2).astype(float).round(WEIGHT_DECIMALS).tolist(),
    )
