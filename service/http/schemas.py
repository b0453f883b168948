"""Request and response bodies of the native API (`/v1/...`), as pydantic models.

The request model is built from the settings, so that its bounds are the configured ones and
show in the OpenAPI schema (/docs): a value past one is a 422 in pydantic's wording. The texts'
limits are checked with every dialect's (limits.py), and the alignment layer against the
model's layers (dialect.search_options), each once; the schema only documents them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service.http.dialect import Decoding
from service.http.glossary_entries import clean_term
from service.serving.confidence import SentenceConfidence
from service.serving.requests import RequestResult, SentenceAlignment
from service.serving.settings import Settings

MAX_LANG_CODE = 16
LAYER_SCHEMA = {"type": "integer", "minimum": 0}
# Unknown fields named one error each, as pydantic does, up to this many; past it, one error
# for them all: pydantic's error objects cost microseconds each, on the event loop, and a
# 1 MiB body holds 80,000 keys (0.6 s and a 7 MB answer, before this bound).
MAX_UNKNOWN_FIELDS_NAMED = 10


def known_fields_only(model: type[BaseModel], data: Any) -> Any:
    """A `mode="before"` check: a body with more unknown fields than MAX_UNKNOWN_FIELDS_NAMED
    is refused in one error naming the first few, before pydantic makes one for each."""
    if isinstance(data, dict) and len(data) > len(model.model_fields) + MAX_UNKNOWN_FIELDS_NAMED:
        unknown = [key for key in data if key not in model.model_fields]
        if len(unknown) > MAX_UNKNOWN_FIELDS_NAMED:
            raise PydanticCustomError(
                "extra_forbidden",
                "{count} fields that are not in the schema, e.g. {names}; the fields are {known}",
                {
                    "count": len(unknown),
                    "names": ", ".join(unknown[:MAX_UNKNOWN_FIELDS_NAMED]),
                    "known": ", ".join(model.model_fields),
                },
            )
    return data


class GlossaryTerm(BaseModel):
    """One entry of an inline glossary: a source term and the target its translation uses,
    by the rules of a stored glossary's entries (glossary_entries.py): whitespace around a
    term dropped, then neither empty nor holding a control character, tab or line break."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, max_length=1024, examples=["chien"])
    target: str = Field(min_length=1, max_length=1024, examples=["hound"])

    @field_validator("source", "target")
    @classmethod
    def _a_term(cls, term: str) -> str:
        term, problem = clean_term(term)
        if problem is not None:
            raise PydanticCustomError("glossary_term", "the term {problem}", {"problem": problem})
        return term


# An inline glossary's terms, the first bad one ending the validation (one error, not one per
# item: a 1 MiB list of lists made 250,000 of them).
GLOSSARY_TERMS = TypeAdapter(Annotated[list[GlossaryTerm], Field(fail_fast=True)])


def glossary_terms(items: list[Any]) -> list[GlossaryTerm]:
    """A request's inline glossary, validated: RequestValidationError (a 422) naming the first
    bad term as FastAPI would. Not in the request model, which FastAPI validates on the event
    loop: a 1 MiB body holds 30,000 terms, whose rules (clean_term) take about 0.1 s."""
    try:
        return GLOSSARY_TERMS.validate_python(items)
    except ValidationError as error:
        problems = error.errors(include_url=False, include_input=False)
        for problem in problems:
            problem["loc"] = ("body", "glossary", *problem["loc"])
        raise RequestValidationError(problems) from None


class TranslateRequestBase(BaseModel):
    """Fields and behaviour shared by every configured variant of the request model."""

    model_config = ConfigDict(extra="forbid")

    text: str | list[str]
    source_lang: str
    target_lang: str
    beam_size: int
    max_length: int
    n_best: int
    length_penalty: float
    return_scores: bool
    return_alignment: bool
    alignment_layer: int | None
    alignment_heads: Literal["mean", "all"]
    return_confidence: bool
    glossary_id: str | None
    glossary: list[Any] | None  # unvalidated items: glossary_terms
    model_version: int | None

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        return known_fields_only(cls, data)

    @property
    def texts(self) -> list[str]:
        return [self.text] if isinstance(self.text, str) else list(self.text)

    def decoding(self) -> Decoding:
        """What this request asks of the decoder (every field has its default already)."""
        return Decoding(
            beam_size=self.beam_size,
            n_best=self.n_best,
            max_length=self.max_length,
            length_penalty=self.length_penalty,
            alignment=self.return_alignment,
            alignment_layer=self.alignment_layer,
            alignment_heads=self.alignment_heads == "all",
            confidence=self.return_confidence,
        )


def translate_request_model(settings: Settings) -> type[TranslateRequestBase]:
    """The request model with this server's limits and defaults."""
    max_texts, max_chars = settings.max_texts_per_request, settings.max_chars_per_text

    class TranslateRequest(TranslateRequestBase):
        model_config = ConfigDict(
            extra="forbid",
            json_schema_extra={
                "examples": [
                    {
                        "text": "Un homme fait du vélo. Il pleut.",
                        "source_lang": "fr",
                        "target_lang": "en",
                        "beam_size": settings.default_beam_size,
                        "return_scores": True,
                    }
                ]
            },
        )

        # fail_fast: the first item that is not a string ends the validation (one error,
        # not one per item: a 1 MiB list of lists made 250,000, 2.4 s on the event loop).
        text: str | Annotated[list[str], Field(fail_fast=True)] = Field(
            description=f"one text or a list of up to {max_texts} texts "
            f"(NMT_MAX_TEXTS_PER_REQUEST), each at most {max_chars} characters "
            "(NMT_MAX_CHARS_PER_TEXT); several sentences are split and rejoined",
        )
        source_lang: str = Field(min_length=1, max_length=MAX_LANG_CODE, examples=["fr"])
        target_lang: str = Field(min_length=1, max_length=MAX_LANG_CODE, examples=["en"])
        # Strict: JSON numbers only (not true, false or "4"), as the schema says.
        beam_size: int = Field(
            settings.default_beam_size,
            strict=True,
            ge=1,
            le=settings.max_beam_size,
            description="1 = greedy (NMT_MAX_BEAM_SIZE caps it)",
        )
        max_length: int = Field(
            settings.max_output_length,
            strict=True,
            ge=1,
            le=settings.max_output_length,
            description="most tokens per translated sentence (NMT_MAX_OUTPUT_LENGTH caps it)",
        )
        n_best: int = Field(
            1,
            strict=True,
            ge=1,
            le=settings.max_beam_size,
            description="alternatives per text, best first; at most beam_size",
        )
        length_penalty: float = Field(
            settings.default_length_penalty,
            strict=True,
            ge=0.0,
            le=10.0,
            description="hypotheses are ranked by log-prob / length ** length_penalty",
        )
        # Strict: JSON true or false only (not 0, 1 or "yes"), as the schema says.
        return_scores: bool = Field(False, strict=True, description="add each translation's score")
        return_alignment: bool = Field(
            False,
            strict=True,
            description="add per-sentence cross-attention (source x target weights)",
        )
        # Documented from 0, checked against the model's layers (dialect.search_options).
        alignment_layer: Annotated[int, WithJsonSchema(LAYER_SCHEMA)] | None = Field(
            None,
            strict=True,
            description="with return_alignment: the decoder layer whose cross-attention is "
            "returned, 0 = first, below the model's decoder_layers (GET /v1/models); default: "
            "the last, which aligns best (docs/attention.md)",
        )
        alignment_heads: Literal["mean", "all"] = Field(
            "mean",
            description="with return_alignment: 'mean' averages the layer's heads; 'all' also "
            "returns each head's weights (head_weights)",
        )
        return_confidence: bool = Field(
            False,
            strict=True,
            description="add each translation's confidence: a calibrated sentence confidence "
            "(the estimated probability that the translation is good; null for a model "
            "without a calibration), the raw score, and each word's probability "
            "(docs/confidence.md)",
        )
        glossary_id: str | None = Field(
            None,
            max_length=64,
            description="a glossary made with POST /v2/glossaries or /v3/glossaries (and, with "
            "API keys, by the same key): its dictionary for source_lang -> target_lang is "
            "applied; its terms found in a text are written in the translation",
        )
        # Its items are validated by the route (glossary_terms), on a worker thread: the
        # schema shows them, the request model only counts them.
        glossary: list[SkipValidation[GlossaryTerm]] | None = Field(
            None,
            max_length=settings.max_glossary_entries,
            description="an inline glossary instead of glossary_id: terms found in a text "
            "(case-insensitively, whole words, longest first) are written in the translation",
        )
        model_version: int | None = Field(
            None,
            strict=True,
            ge=0,
            description="a loaded version of the pair's model (GET /v1/models lists them); "
            "default: the version that serves",
        )

        @model_validator(mode="after")
        def _one_glossary(self) -> TranslateRequest:
            if self.glossary_id is not None and self.glossary is not None:
                raise PydanticCustomError(
                    "two_glossaries", "give glossary_id or glossary, not both", {}
                )
            return self

        @model_validator(mode="after")
        def _n_best_within_beam(self) -> TranslateRequest:
            if self.n_best > self.beam_size:
                raise PydanticCustomError(
                    "n_best_above_beam_size",
                    "n_best ({n_best}) must be at most beam_size ({beam_size})",
                    {"n_best": self.n_best, "beam_size": self.beam_size},
                )
            return self

    return TranslateRequest


class Alternative(BaseModel):
    text: str
    score: float


class Alignment(BaseModel):
    source_tokens: list[str] = Field(description="source pieces, </s> included")
    target_tokens: list[str] = Field(description="produced pieces (rows of weights)")
    weights: list[list[float]] = Field(
        description="weights[i][j]: attention of target token i on source token j"
    )
    source_words: list[str] = Field(default_factory=list, description="source words")
    target_words: list[str] = Field(default_factory=list, description="target words")
    word_weights: list[list[float]] = Field(
        default_factory=list,
        description="word_weights[i][j]: attention of target word i on source word j (summed "
        "over the source word's pieces, averaged over the target word's pieces)",
    )
    word_alignment: list[tuple[int, int]] = Field(
        default_factory=list,
        description="hard alignment: (source word, target word) pairs, each target word with "
        "the source word it attended to most",
    )
    moses: str = Field("", description='the hard alignment as Moses writes it: "0-0 1-2 ..."')
    layer: int | None = Field(None, description="the decoder layer of the weights (0 = first)")
    head_weights: list[list[list[float]]] | None = Field(
        None,
        description="with alignment_heads 'all': head_weights[h][i][j], head h's attention of "
        "target token i on source token j (weights is their mean)",
    )

    @classmethod
    def from_result(cls, alignment: SentenceAlignment) -> Alignment:
        found = cls(
            source_tokens=alignment.source_tokens,
            target_tokens=alignment.target_tokens,
            weights=alignment.weights,
            layer=alignment.layer,
            head_weights=alignment.head_weights,
        )
        if (words := alignment.words) is not None:
            found.source_words, found.target_words = words.source_words, words.target_words
            found.word_weights, found.word_alignment = words.weights, words.pairs
            found.moses = words.moses
        return found


class WordConfidence(BaseModel):
    word: str
    confidence: float = Field(description="the probability the decoder gave the word")
    doubtful: bool | None = Field(
        None, description="below the model's word threshold (null without a calibration)"
    )


class Confidence(BaseModel):
    sentence: float | None = Field(
        description="0..1: the estimated probability that the translation is good (for a "
        "text of several sentences, their mean); null when the model has no calibration"
    )
    raw: float = Field(description="the mean log-prob of the produced tokens (</s> included)")
    label: str | None = Field(None, description="what 'good' means for this model's calibration")
    truncated: bool = Field(
        False,
        description="the length limit (max_length, or 1.5x the source plus 10) cut a sentence "
        "before it ended: its confidence is 0",
    )
    words: list[WordConfidence]

    @classmethod
    def from_result(cls, found: SentenceConfidence, label: str | None) -> Confidence:
        return cls(
            sentence=found.sentence,
            raw=found.raw,
            label=label if found.sentence is not None else None,
            truncated=found.truncated,
            words=[WordConfidence(**vars(word)) for word in found.words],
        )


class Translation(BaseModel):
    text: str
    score: float | None = Field(
        None, description="log-prob / length ** length_penalty (mean over sentences)"
    )
    n_best: list[Alternative] | None = Field(None, description="when n_best > 1, best first")
    alignment: list[Alignment] | None = Field(None, description="one entry per sentence")
    confidence: Confidence | None = Field(None, description="with return_confidence")


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    glossary_terms: int | None = Field(
        None, description="with a glossary: its terms found in the texts' sentences"
    )
    glossary_terms_kept: int | None = Field(
        None, description="with a glossary: how many of them the translations contain"
    )


class TranslateResponse(BaseModel):
    model: str
    model_version: int | None = Field(
        None, description="the version that translated (absent for an unversioned bundle)"
    )
    pivot: str | None = Field(
        None,
        description="the language translated through, when no model translates the pair "
        "directly (model then names both models, as first+second)",
    )
    translations: list[Translation]
    usage: Usage

    @classmethod
    def from_result(cls, result: RequestResult, request: TranslateRequestBase) -> TranslateResponse:
        translations = []
        for item in result.texts:
            translation = Translation(text=item.text)
            if request.return_scores:
                translation.score = round(item.score, 6)
            if request.n_best > 1:
                translation.n_best = [
                    Alternative(text=a.text, score=round(a.score, 6)) for a in item.n_best
                ]
            if request.return_alignment:
                translation.alignment = [Alignment.from_result(a) for a in item.alignment]
            if request.return_confidence and item.confidence is not None:
                label = result.confidence_label
                translation.confidence = Confidence.from_result(item.confidence, label)
            translations.append(translation)
        return cls(
            model=result.model,
            model_version=result.model_version,
            pivot=result.pivot,
            translations=translations,
            usage=Usage(
                input_tokens=result.input_tokens,
                output_tokens=result.output_tokens,
                **(
                    {"glossary_terms": result.terms, "glossary_terms_kept": result.terms_kept}
                    if request.glossary_id is not None or request.glossary is not None
                    else {}
                ),
            ),
        )


# "unloaded" only in the answer to an unload that is already done.
ModelState = Literal["loading", "ready", "failed", "unloading", "unloaded"]


class ModelVersionInfo(BaseModel):
    version: int | None = Field(
        None, description="absent for an unversioned bundle (<name>/bundle.json)"
    )
    state: ModelState
    since: float = Field(description="when it entered this state (Unix time)")
    reason: str | None = Field(None, description="why it failed to load")


class ModelInfo(BaseModel):
    """A model: the version new requests go to (its details), and every version the server
    knows of. The details (languages, limits) are there while a version is ready."""

    model_config = ConfigDict(extra="allow")

    name: str
    version: int | None = Field(
        None, description="the version that serves (null: unversioned, or none ready)"
    )
    state: ModelState = Field(
        description="ready when a version serves; else loading, unloading or failed"
    )
    reason: str | None = Field(None, description="with state failed: why")
    source_lang: str | None = None
    target_lang: str | None = None
    pairs: list[str] = Field([], description="language pairs it translates, as source-target")
    precision: str | None = None
    max_tokens_per_sentence: int | None = None
    description: str = Field(
        "", description="what the model was trained on and is good for (bundle.json)"
    )
    versions: list[ModelVersionInfo] = []


class ModelsResponse(BaseModel):
    models: list[ModelInfo]


class ModelLoadRequest(BaseModel):
    """An explicit load. Without a version: what the version policy selects (the newest that
    loads, by default). With one: that version only, until the next load without one: a
    rollback is a load of an older version."""

    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(None, ge=0, strict=True, examples=[2])

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        return known_fields_only(cls, data)


class ModelReady(BaseModel):
    name: str
    version: int | None
    state: ModelState
    ready: bool


class Problem(BaseModel):
    """FastAPI's conventional error body."""

    detail: Any
