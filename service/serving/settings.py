"""Every knob of the service, read from the environment (prefix `NMT_`), with safe defaults.

One place, so that docs/service.md can list them all and an operator can see what a limit is
called. The field descriptions are that documentation: keep them short and exact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.runtime.search import SearchOptions
from service.serving.repository import VersionPolicy


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NMT_", extra="ignore")

    # Models and engine
    model_dir: Path = Field(
        Path("build/models"),
        description="the model repository: one folder per model, holding numbered version "
        "folders (<name>/<version>/bundle.json) or one bundle (<name>/bundle.json); a single "
        "bundle folder works too",
    )
    model_version_policy: str = Field(
        "latest",
        description="which versions of each model load: latest (the newest that loads), "
        "latest:N, all, or specific:1,3; requests go to the newest loaded",
    )
    model_poll_seconds: float = Field(
        0.0,
        ge=0,
        description="watch the repository every this many seconds and load what changed "
        "(0: off; prefer explicit POST /v1/models/{name}/load in production)",
    )
    int8: bool = Field(False, description="serve the int8 graphs (bundles exported with --int8)")
    shortlist: bool = Field(
        False,
        description="score only the candidate words of each batch's sentences (the vocabulary "
        "shortlist of bundles that have one; the others keep the full vocabulary): a smaller "
        "output projection, which pays in beam search (docs/performance.md); a translation "
        "can then depend on its batch",
    )
    threads: int = Field(
        0,
        ge=0,
        description="ONNX Runtime intra-op threads per model (0 = one per core, less one left "
        "to the HTTP side, at least 1)",
    )
    thread_spinning: bool = Field(
        False,
        description="ONNX Runtime threads spin between decoder steps (faster steps; off leaves "
        "CPU to the HTTP side under load)",
    )
    warmup: bool = Field(True, description="translate a few sentences per model before ready")
    language_id_model: str = Field(
        "",
        description="a fastText language-identification model file (NLLB's, GlotLID's or "
        "lid.176) that detects source languages instead of py3langid, for bundles whose "
        "languages py3langid cannot name; empty: py3langid",
    )

    # HTTP
    host: str = Field("127.0.0.1", description="address `nmt serve` listens on")
    port: int = Field(8000, ge=0, le=65535, description="port `nmt serve` listens on")
    max_body_bytes: int = Field(
        1_048_576, gt=0, description="largest request body; bigger ones get 413"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="log level of the JSON logs on stderr"
    )
    access_log: bool = Field(True, description="one JSON access log line per request")
    otlp_endpoint: str = Field(
        "",
        description="OpenTelemetry collector (OTLP/HTTP) that receives request traces, e.g. "
        "http://otel-collector:4318 (/v1/traces is added); empty: OTEL_EXPORTER_OTLP_ENDPOINT "
        "if set, else no tracing",
    )
    cors_origins: str = Field(
        "",
        description="comma-separated origins allowed to call the API from a browser "
        '(CORS), "*" for any; empty: same origin only',
    )
    max_requests_in_flight: int = Field(
        256,
        gt=0,
        description="requests being handled at once (health and metrics aside); past it, 429 "
        "at once, once the body is read",
    )
    max_connections: int = Field(
        1024,
        gt=0,
        description="open connections; past it, requests get 503 (uvicorn's limit), except "
        "/healthz, /readyz and /metrics, which are answered whatever the count",
    )
    max_connections_per_client: int = Field(
        0,
        ge=0,
        description="open connections per client address; a request on one past it gets 429 "
        "(health and metrics aside); 0: no cap (behind a proxy every client has its address)",
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="time a connection has to send a request's headers, from when it opens "
        "(or a keep-alive request's first byte); past it, the connection is closed (408 if a "
        "request had begun)",
    )
    max_header_bytes: int = Field(
        32768, gt=0, description="largest request line and headers; past it, 431"
    )
    body_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="time a client has to send its whole body, from the end of its headers; "
        "past it, 408",
    )
    keep_alive_seconds: float = Field(
        5.0, gt=0, description="how long an idle keep-alive connection is kept open"
    )

    # Access
    api_keys: SecretStr = Field(
        SecretStr(""),
        description="comma-separated API keys; when set, translation routes need one "
        "(`Authorization: Bearer KEY`, `X-API-Key`, or LibreTranslate's `api_key`); empty: open",
    )
    admin_keys: SecretStr = Field(
        SecretStr(""),
        description="comma-separated keys for model administration (/v1/models/{name}/load "
        "and /unload); empty: those routes are open only while NMT_API_KEYS is empty too",
    )
    metrics_require_key: bool = Field(
        False, description="/metrics needs an API key too (when NMT_API_KEYS is set)"
    )
    docs: bool = Field(True, description="serve the OpenAPI page at /docs (assets served locally)")

    # Durable state (service/store: glossaries)
    state_dir: Path = Field(
        Path("data"),
        description="folder of the files the server keeps: the SQLite database (nmt.db) when "
        "NMT_DATABASE_URL is empty; made at start if missing",
    )
    database_url: SecretStr = Field(
        SecretStr(""),
        description="SQLAlchemy URL of the database that keeps glossaries; empty: SQLite, "
        "sqlite:/// + NMT_STATE_DIR/nmt.db (one server); postgresql+psycopg://USER:PASSWORD@"
        "HOST:PORT/DATABASE for replicas that share it. Never logged with its password",
    )
    database_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="how long a request waits for the database (glossaries, documents); past "
        "it, 503 with Retry-After, and translations that need no database go on meanwhile",
    )
    database_migrate: bool = Field(
        True,
        description="bring the database's schema up to date at start; false: refuse to start "
        "on an older one (run `nmt db upgrade` first)",
    )

    # Request limits (422 past them)
    max_texts_per_request: int = Field(64, gt=0, description="texts in one request")
    max_sentences_per_request: int = Field(
        512,
        gt=0,
        description="sentences in one request after splitting; past it, 413 (one request may "
        "not hold the model for long)",
    )
    max_alignment_weights: int = Field(
        2_000_000,
        gt=0,
        description="attention weights one answer may carry with return_alignment, heads "
        "included (per sentence, target x source tokens: once for the mean, once more per head "
        "with alignment_heads 'all'); past it, 413, before the answer is built. 2 million (an "
        "answer of about 12 MB) lets through any one text of NMT_MAX_CHARS_PER_TEXT with every "
        "head, as the web page asks, even in sentences at NMT_MAX_TOKENS_PER_SENTENCE (5,000 "
        "characters of French: about 1.5 million)",
    )
    max_chars_per_text: int = Field(5000, gt=0, description="characters in one text")
    max_tokens_per_sentence: int = Field(
        256,
        gt=0,
        description="SentencePiece tokens in one sentence after splitting, </s> included "
        "(capped by each model's positions)",
    )
    max_beam_size: int = Field(8, gt=0, description="largest beam_size a client may ask for")
    default_beam_size: int = Field(4, gt=0, description="beam_size when a request has none")
    max_output_length: int = Field(
        256, gt=0, description="largest max_length a client may ask for, and its default"
    )
    default_length_penalty: float = Field(
        1.0, ge=0, description="length_penalty when a request has none"
    )
    character_limit: int = Field(
        0,
        ge=0,
        description="characters the server may translate from start to stop (DeepL's "
        "/v2/usage reports it; 456 or 429 past it); 0: no limit",
    )
    cache_entries: int = Field(
        10000, ge=0, description="sentence translations kept in the in-process cache; 0: off"
    )
    cache_bytes: int = Field(
        67_108_864, ge=0, description="memory the translation cache may use (bytes); 0: off"
    )
    max_repeats: int = Field(
        3,
        ge=0,
        description="a translation stops before it repeats an n-gram (up to 4 tokens) more "
        "than this many times in a row (0 = off)",
    )

    # Glossaries (DeepL's /v2/glossaries and /v3/glossaries)
    max_glossary_entries: int = Field(
        100_000,
        gt=0,
        description="entries in one glossary dictionary (a language pair), after a merge too; "
        "past it, 413",
    )
    max_glossary_bytes: int = Field(
        10_485_760,
        gt=0,
        description="UTF-8 bytes of the entries one glossary request sends, all its "
        "dictionaries together (DeepL's 10 MiB); past it, 413. A glossary request's body may "
        "be this much larger than NMT_MAX_BODY_BYTES",
    )
    max_glossary_term_bytes: int = Field(
        1024,
        gt=0,
        description="UTF-8 bytes of one glossary term, and of a glossary's name (DeepL's "
        "1024); past it, 400",
    )

    # Documents (DeepL's /v2/document, LibreTranslate's /translate_file)
    max_document_bytes: int = Field(
        20_971_520, gt=0, description="bytes of one uploaded document; past it, 413"
    )
    max_document_characters: int = Field(
        1_000_000, gt=0, description="characters of text to translate in one document; past it, 413"
    )
    max_document_uncompressed_bytes: int = Field(
        209_715_200,
        gt=0,
        description="bytes a zipped document (docx, pptx, xlsx, odt, epub) may inflate to, all "
        "members together; past it, 413 (a zip bomb)",
    )
    max_document_compression_ratio: int = Field(
        100,
        gt=0,
        description="how many times a zip member over 1 MiB may inflate; past it, 413 (a zip bomb)",
    )
    document_workers: int = Field(
        1,
        ge=0,
        description="documents this server translates at a time (0: it takes none, and only "
        "answers uploads, status polls and downloads; other replicas translate)",
    )
    document_chunk_sentences: int = Field(
        4,
        gt=0,
        description="sentences of a document queued at a time: each chunk is kept in the store "
        "(a job taken over resumes after it), and interactive requests join the batch between",
    )
    document_chunk_timeout_seconds: float = Field(
        600.0, gt=0, description="deadline of one chunk of a document; past it, the job fails"
    )
    document_lease_seconds: float = Field(
        60.0,
        gt=0,
        description="a worker holds a document for this long after each chunk; a job whose "
        "worker died is taken over once its lease runs out",
    )
    document_poll_seconds: float = Field(
        1.0, gt=0, description="how often an idle document worker looks for queued jobs"
    )
    document_turn_seconds: float = Field(
        30.0,
        ge=0,
        description="how long a worker translates one document while other uploads wait: "
        "past it, after its current chunk, the document goes to the back of the queue (its "
        "chunks kept) and the worker takes the one waiting longest (0: first come, first "
        "served, and one long file holds every upload behind it)",
    )
    document_result_ttl_seconds: float = Field(
        3600.0,
        gt=0,
        description="how long a document job, its file and its result are kept after upload "
        "(a result downloaded through DeepL's API is deleted at once)",
    )

    # Continuous batching and the queue
    max_batch_size: int = Field(
        32, gt=0, description="sentences in one engine batch (or the running batch)"
    )
    max_batch_total_tokens: int = Field(
        16384,
        gt=0,
        description="continuous batching: tokens the running batch may reserve, summed over "
        "its sentences (source + beam size x length limit); a sentence that would pass it "
        "waits",
    )
    join_ratio: float = Field(
        0.6,
        ge=0,
        description="continuous batching: waiting sentences join a running batch together, "
        "once those that can join (waiting, at most the free places) are this many times the "
        "sentences running (TGI's waiting_served_ratio) ...",
    )
    join_max_steps: int = Field(
        12,
        ge=0,
        description="... or once this many decoder steps have passed since the last join "
        "(TGI's max_waiting_tokens); an empty batch takes them at once; 0 and 0: every step",
    )
    decoding_workers: int = Field(
        1,
        ge=1,
        le=64,
        description="continuous batching: decoding threads per model, each with running "
        "batches of its own from the one queue, on one engine (its weights once in memory); "
        "ONNX Runtime lets go of the GIL while a graph runs, so N workers of NMT_THREADS=1 "
        "take up to N cores; keep NMT_DECODING_WORKERS x NMT_THREADS within the cores",
    )
    encode_ahead: Literal["auto", "true", "false"] = Field(
        "auto",
        description="continuous batching: a thread of its own, with one ONNX Runtime thread, "
        "encodes queued sentences while the running batch decodes (measured 1.05x-1.1x the "
        "requests/s with one engine thread, no gain with two on two cores); auto: on when "
        "the engine has one thread and one decoding worker; false: the decoding thread "
        "encodes them when they join",
    )
    max_queue_sentences: int = Field(
        1024,
        gt=0,
        description="sentences waiting per model; a request that would overflow it gets 429",
    )
    retry_after_seconds: int = Field(1, ge=0, description="Retry-After sent with a 429")
    request_timeout_seconds: float = Field(
        30.0, gt=0, description="deadline of one translation request; past it, 504"
    )
    shutdown_timeout_seconds: float = Field(
        30.0, gt=0, description="on SIGTERM, how long admitted requests may take to finish"
    )

    @model_validator(mode="after")
    def _defaults_within_limits(self) -> Settings:
        if self.default_beam_size > self.max_beam_size:
            raise ValueError(
                f"NMT_DEFAULT_BEAM_SIZE={self.default_beam_size} is above "
                f"NMT_MAX_BEAM_SIZE={self.max_beam_size}"
            )
        VersionPolicy.parse(self.model_version_policy)  # a bad one stops the start, named
        return self

    @property
    def language_id_model_file(self) -> Path | None:
        return Path(self.language_id_model) if self.language_id_model else None

    @property
    def engine_threads(self) -> int:
        """NMT_THREADS, or for 0 every core but one: under overload the event loop, which
        answers 429s and health checks, needs a core the engine does not take (measured in
        docs/reliability.md, "Server set-ups under overload")."""
        return self.threads or max(1, (os.cpu_count() or 1) - 1)

    @property
    def encodes_ahead(self) -> bool:
        """NMT_ENCODE_AHEAD, with auto resolved: on with one engine thread and one decoding
        worker, where a core is left that the decoder does not use (docs/service.md,
        "Encoding ahead")."""
        if self.encode_ahead == "auto":
            return self.engine_threads == 1 and self.decoding_workers == 1
        return self.encode_ahead == "true"

    def default_search(self, beam_size: int) -> SearchOptions:
        """A search as this server runs one that names nothing but its beam: the default
        length penalty and the repetition guard (what calibrations and benchmarks translate
        with, as clients get it)."""
        return SearchOptions(
            beam_size=beam_size,
            length_penalty=self.default_length_penalty,
            max_repeats=self.max_repeats,
        )

    @property
    def api_key_list(self) -> list[str]:
        return [key.strip() for key in self.api_keys.get_secret_value().split(",") if key.strip()]

    @property
    def admin_key_list(self) -> list[str]:
        return [k.strip() for k in self.admin_keys.get_secret_value().split(",") if k.strip()]
