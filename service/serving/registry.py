"""The models this server translates with, and their versions: loaded from the model repository
(repository.py), each with its own engine sessions, tokenizer and decoding loop (so that one busy
model never stalls another).

Loading verifies a bundle's checksums, opens its ONNX Runtime sessions and translates a few
sentences (greedy and beam), so that the first client does not pay for lazy initialisation.

A model changes without downtime, as in Triton's explicit model control:
* `load(name)` reads the repository again, loads the version(s) its version policy selects
  beside the one serving and warms them up, then switches in one step under the lock: new
  requests go to the newest ready version. If a version fails to load or warm up, it is
  recorded as failed with its reason and what served before keeps serving.
* Versions no longer wanted are retired ("unloading"): requests already holding them (a
  `lease`, taken by TranslationService.translate for the whole request) finish on them, and
  their decoding loop is closed once the last lease is returned.
* `load(name, version)` pins one version (a rollback is that, with an older number);
  `load(name)` returns to the policy.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from service.runtime.bundle import Bundle, BundleError, load_bundle
from service.runtime.running_batch import RunningBatch, running_batch, step_together
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from service.serving import heap
from service.serving.confidence import CalibrationFile, load_calibration
from service.serving.errors import (
    ModelLoadFailed,
    ModelUnavailable,
    ModelUnknown,
    ModelVersionUnknown,
    UnknownPair,
)
from service.serving.loop import BatchLimits, DecodingLoop
from service.serving.metrics import Metrics
from service.serving.repository import MANIFEST, ModelEntry, ModelRepository, VersionPolicy
from service.serving.settings import Settings

log = logging.getLogger("nmt.registry")

WARMUP_SENTENCES = ["Bonjour.", "Un homme marche dans la rue avec son chien."]

ModelState = Literal["loading", "ready", "failed", "unloading"]


@dataclass
class LoadedModel:
    """One version of a model, loaded: what a request is translated with."""

    name: str  # the model's folder in the repository
    version: int | None  # None: an unversioned bundle
    bundle: Bundle
    translator: Translator
    loop: DecodingLoop
    max_tokens_per_sentence: int  # the setting, capped by the model's positions
    load_seconds: float
    # A multilingual model asked for one of its pairs (`directed`); None: its default pair
    direction: tuple[str, str] | None = None
    # What its sentence confidence is computed with (the bundle's confidence.json); None:
    # the raw score only
    calibration: CalibrationFile | None = None

    @property
    def source_lang(self) -> str:
        return self.direction[0] if self.direction else self.bundle.source_lang

    @property
    def target_lang(self) -> str:
        return self.direction[1] if self.direction else self.bundle.target_lang

    @property
    def pair(self) -> str:
        return f"{self.source_lang}-{self.target_lang}"

    @property
    def multilingual(self) -> bool:
        return self.bundle.languages is not None

    @property
    def languages(self) -> list[str]:
        """The languages it translates between (a bilingual model's two)."""
        languages = self.bundle.languages
        if languages is None:
            return [self.bundle.source_lang, self.bundle.target_lang]
        return languages.codes

    def translates(self, source_lang: str, target_lang: str) -> bool:
        if self.bundle.languages is None:
            return (source_lang, target_lang) == (self.bundle.source_lang, self.bundle.target_lang)
        codes = self.bundle.languages.tokens
        return source_lang != target_lang and source_lang in codes and target_lang in codes

    def pairs(self) -> list[tuple[str, str]]:
        """Every (source, target) it translates: a multilingual model's every ordered pair."""
        if self.bundle.languages is None:
            return [(self.bundle.source_lang, self.bundle.target_lang)]
        codes = self.bundle.languages.codes
        return [(a, b) for a in codes for b in codes if a != b]

    def directed(self, source_lang: str, target_lang: str) -> LoadedModel:
        """The same model (sessions, loop) asked for one of its pairs."""
        if self.bundle.languages is None:
            return self
        return replace(self, direction=(source_lang, target_lang))

    @property
    def first_token(self) -> int | None:
        """What its translations start with: a multilingual model's target-language token."""
        languages = self.bundle.languages
        return None if languages is None else languages.forced_target(self.target_lang)

    @property
    def decoder_layers(self) -> int:
        return self.bundle.dims["decoder_layers"]

    @property
    def labels(self) -> tuple[str, str]:
        """(model, version) as metric labels and cache keys ("" for an unversioned bundle)."""
        return self.name, version_label(self.version)

    def describe(self) -> dict:
        bundle = self.bundle
        return {
            "name": self.name,
            "version": self.version,
            "source_lang": self.source_lang,
            "target_lang": self.target_lang,
            "precision": "int8" if self.translator.engine.options.int8 else "fp32",
            "max_tokens_per_sentence": self.max_tokens_per_sentence,
            "dims": bundle.dims,
            "load_seconds": round(self.load_seconds, 3),
        }


def version_label(version: int | None) -> str:
    return "" if version is None else str(version)


@dataclass(eq=False)
class ModelVersion:
    """What the registry knows of one version it was asked to load: its state, why it failed,
    and, once loaded, the model and the requests holding it."""

    name: str
    version: int | None
    path: Path
    state: ModelState
    reason: str = ""
    model: LoadedModel | None = None
    manifest_mtime: float = 0.0  # bundle.json's when loaded: a re-export is a new load
    generation: int = 0  # order of loading: of two loads of one version, the later serves
    leases: int = 0
    closing: bool = False  # its loop is being closed: no new lease
    since: float = field(default_factory=time.time)  # when it entered its state (Unix time)

    def describe(self) -> dict:
        found = {
            "name": self.name,
            "version": self.version,
            "state": self.state,
            "since": round(self.since, 3),
        }
        if self.reason:
            found["reason"] = self.reason
        return found


def find_bundles(model_dir: Path) -> list[Path]:
    """The bundle folders the repository's models would serve today (each model's newest
    version): for tools that want paths, not a registry."""
    models = ModelRepository(model_dir).scan()
    return [
        entry.versions[max(entry.versions, key=lambda v: -1 if v is None else v)]
        for entry in models.values()
    ]


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.repository = ModelRepository(settings.model_dir)
        self.policy = VersionPolicy.parse(settings.model_version_policy)
        # `_lock` guards the records and their leases; it is held for bookkeeping only, never
        # while a model loads or a loop closes.
        self._lock = threading.Lock()
        self._records: dict[str, list[ModelVersion]] = {}
        self._pinned: dict[str, int] = {}  # models loaded at an explicit version
        self._loading: dict[str, threading.Lock] = {}  # one load or unload of a model at a time
        self._generations = itertools.count(1)
        self._closers: list[threading.Thread] = []
        # Whether the start's loads are done: a later load settles the heap (heap.py); the
        # start settles it once, when everything is loaded.
        self._started = False

    # ----- what serves ---------------------------------------------------------------------
    @property
    def models(self) -> list[LoadedModel]:
        """The version of each model that new requests go to."""
        with self._lock:
            return [
                record.model
                for name in sorted(self._records)
                if (record := self._serving(name)) is not None and record.model is not None
            ]

    @property
    def pairs(self) -> list[str]:
        return sorted({f"{a}-{b}" for model in self.models for a, b in model.pairs()})

    def get(self, source_lang: str, target_lang: str, version: int | None = None) -> LoadedModel:
        """The model that translates the pair (a bilingual one before a multilingual one): its
        serving version, or `version` if loaded."""
        found = [m for m in self.models if m.translates(source_lang, target_lang)]
        if not found:
            raise UnknownPair(source_lang, target_lang, self.pairs)
        model = min(found, key=lambda m: m.multilingual).directed(source_lang, target_lang)
        if version is None or version == model.version:
            return model
        with self._lock:
            for record in self._records.get(model.name, []):
                if record.version == version and record.state == "ready" and record.model:
                    return record.model.directed(source_lang, target_lang)
            loaded = sorted(
                r.version
                for r in self._records.get(model.name, [])
                if r.state == "ready" and r.version is not None
            )
        raise ModelVersionUnknown(model.name, version, loaded)

    def versions(self) -> list[ModelVersion]:
        """Every version the registry knows of (loading, ready, failed, unloading)."""
        with self._lock:
            return sorted(
                (r for records in self._records.values() for r in records),
                key=lambda r: (r.name, -1 if r.version is None else r.version, r.generation),
            )

    def describe(self) -> list[dict]:
        """Each model as /v1/models lists it: its serving version's details (pairs, limits,
        description), its state, and every version the registry knows with its state."""
        with self._lock:
            names = sorted(self._records)
            described = []
            for name in names:
                records = self._records[name]
                serving = self._serving(name)
                found: dict = {"name": name}
                if serving is not None and serving.model is not None:
                    model = serving.model
                    found.update(model.describe())
                    found.update(description=model.bundle.description)
                    if model.multilingual:  # every ordered pair of its languages
                        found["languages"] = model.languages
                    else:
                        found["pairs"] = [model.pair]
                    found["state"] = "ready"
                else:
                    states = {r.state for r in records}
                    state = next(s for s in ("loading", "unloading", "failed") if s in states)
                    found.update(version=None, state=state)
                    failed = [r.reason for r in records if r.state == "failed"]
                    if state == "failed" and failed:
                        found["reason"] = failed[-1]
                found["versions"] = [
                    r.describe()
                    for r in sorted(
                        records,
                        key=lambda r: (-1 if r.version is None else r.version, r.generation),
                    )
                ]
                described.append(found)
            return described

    def serving(self, name: str) -> ModelVersion | None:
        """The version of `name` that new requests go to; ModelUnknown if the registry and the
        repository know no such model."""
        with self._lock:
            if name in self._records:
                return self._serving(name)
        if self.repository.entry(name) is None:
            raise ModelUnknown(name, self.names())
        return None

    def pinned(self, name: str) -> int | None:
        """The version an explicit load pinned `name` to, if any."""
        with self._lock:
            return self._pinned.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    @property
    def ready(self) -> bool:
        """Some model can serve."""
        with self._lock:
            return any(self._serving(name) is not None for name in self._records)

    def _serving(self, name: str) -> ModelVersion | None:
        """Under the lock: the newest ready version (of two loads of one, the later)."""
        ready = [r for r in self._records.get(name, []) if r.state == "ready"]
        if not ready:
            return None
        return max(ready, key=lambda r: (-1 if r.version is None else r.version, r.generation))

    # ----- leases ----------------------------------------------------------------------------
    @contextmanager
    def lease(self, model: LoadedModel) -> Iterator[LoadedModel]:
        """Hold `model` for the length of a request, so that a retired version is not closed
        under it. If it was closed already (retired between the route's lookup and here), the
        request gets the version that replaced it."""
        with self._lock:
            record = self._record_of(model)
            if record is None or record.closing or record.state not in ("ready", "unloading"):
                record = self._successor(model)
            record.leases += 1
        try:
            assert record.model is not None
            held = record.model  # the successor, if `model` was closed
            yield held.directed(*model.direction) if model.direction else held
        finally:
            with self._lock:
                record.leases -= 1
                if record.state == "unloading" and record.leases == 0:
                    self._close_later(record)

    def _record_of(self, model: LoadedModel) -> ModelVersion | None:
        """Its record: by its loop, which a model asked for one of its pairs shares."""
        records = self._records.get(model.name, [])
        return next((r for r in records if r.model and r.model.loop is model.loop), None)

    def _successor(self, model: LoadedModel) -> ModelVersion:
        record = self._serving(model.name)
        if record is None or record.model is None:
            raise ModelUnavailable(model.name)
        if not record.model.translates(model.source_lang, model.target_lang):
            raise ModelUnavailable(model.name)
        return record

    # ----- loading and unloading -------------------------------------------------------------
    def load_all(self) -> None:
        """At start: every model of the repository, by the version policy. A model none of
        whose versions loads is logged and left out; BundleError only when no model loads."""
        failures = []
        for name in self.repository.scan():
            try:
                self.load(name, strict=False)
            except ModelLoadFailed as error:
                failures.append(str(error))
                log.error("%s", error)
        if not self.ready:
            raise BundleError("; ".join(failures) or "no model in the repository loaded")
        self._started = True

    def load(self, name: str, version: int | None = None, strict: bool = True) -> ModelVersion:
        """Load `name` again from the repository (at `version` if given, which pins it), switch
        new requests to it once warm, and retire the versions no longer wanted. Returns the
        version that serves. ModelLoadFailed if a version it tried failed (`strict`: an
        explicit load says so even when an older version took its place) or nothing serves;
        what served before then serves on."""
        with self._load_lock(name):
            entry = self.repository.entry(name)
            if entry is None:
                raise ModelUnknown(name, sorted(set(self.names()) | self._repository_names()))
            if version is not None and version not in entry.versions:
                known = sorted(v for v in entry.versions if v is not None)
                raise ModelVersionUnknown(name, version, known)
            candidates, wanted = self._candidates(entry, version)
            kept: list[ModelVersion] = []
            reasons: dict[int | None, str] = {}
            for candidate in candidates:
                if wanted is not None and len(kept) >= wanted:
                    break
                current = self._loaded(name, candidate, entry.versions[candidate])
                record = current or self._load_version(name, candidate, entry.versions[candidate])
                if record.state == "failed":
                    reasons[candidate] = record.reason
                else:
                    kept.append(record)
            with self._lock:
                if kept:
                    self._switch(name, kept)
                    if version is None:
                        self._pinned.pop(name, None)
                    else:
                        self._pinned[name] = version
                serving = self._serving(name)
            if serving is None and not reasons:  # the policy selects none of its versions
                versions = ", ".join(str(v) for v in sorted(entry.versions, key=lambda v: v or 0))
                policy = f"NMT_MODEL_VERSION_POLICY={self.policy}"
                note = f"{policy} selects none of its versions ({versions})"
                raise ModelLoadFailed(name, {}, "nothing", note)
            if reasons and (strict or serving is None):
                raise ModelLoadFailed(name, reasons, _in_words(serving))
            if reasons:  # at start: the newest failed, an older one serves, as the policy allows
                log.warning("%s", ModelLoadFailed(name, reasons, _in_words(serving)))
            assert serving is not None
        if self._started:  # a load while serving: its model's objects join the frozen ones
            heap.settle()
        return serving

    def unload(self, name: str) -> None:
        """Retire every version of `name`: requests holding one finish on it. A model of the
        repository that is not loaded is unloaded already: nothing to do."""
        with self._load_lock(name), self._lock:
            records = self._records.get(name)
            if not records:
                if self.repository.entry(name) is not None:
                    return
                raise ModelUnknown(name, sorted(self._records))
            for record in records:
                if record.state == "ready":
                    self._retire(record)
            # Failed versions have nothing to close: forget them.
            records[:] = [r for r in records if r.state != "failed"]
            if not records:
                del self._records[name]
            self._pinned.pop(name, None)

    def close(self, timeout: float | None = None) -> None:
        """Let every decoding loop finish its queue, then stop it."""
        with self._lock:
            loops = [r.model.loop for rs in self._records.values() for r in rs if r.model]
        for loop in loops:
            loop.close(timeout)
        for closer in list(self._closers):
            closer.join(timeout)

    def _candidates(
        self, entry: ModelEntry, version: int | None
    ) -> tuple[list[int | None], int | None]:
        """The versions to try, newest first, and how many of them should load."""
        if version is not None:
            return [version], 1
        if None in entry.versions:
            return [None], 1
        versions = [v for v in entry.versions if v is not None]
        return list(self.policy.candidates(versions)), self.policy.wanted

    def _loaded(self, name: str, version: int | None, path: Path) -> ModelVersion | None:
        """The ready record of that version, if its bundle has not changed on disk since."""
        mtime = _mtime(path / MANIFEST)
        with self._lock:
            for record in self._records.get(name, []):
                ready = record.state == "ready"
                if ready and record.version == version and record.manifest_mtime == mtime:
                    return record
        return None

    def _load_version(self, name: str, version: int | None, path: Path) -> ModelVersion:
        record = ModelVersion(name, version, path, "loading", generation=next(self._generations))
        record.manifest_mtime = _mtime(path / MANIFEST)
        with self._lock:
            records = self._records.setdefault(name, [])
            # A new attempt replaces the last one's failure.
            records[:] = [r for r in records if not (r.state == "failed" and r.version == version)]
            records.append(record)
        model = None
        try:
            model = self._open(name, version, path)
            self._check_pair(name, model)
        except Exception as error:  # a bad bundle, an ONNX Runtime failure, a warm-up failure
            reason = str(error) or type(error).__name__
            log.error("model %s version %s failed to load: %s", name, version, reason)
            with self._lock:
                record.state, record.reason, record.since = "failed", reason, time.time()
            if self.metrics:
                self.metrics.observe_model_load(name, version_label(version), "failed")
            if model is not None:
                model.loop.close()
            return record
        record.model = model
        if self.metrics:
            self.metrics.observe_model_load(name, version_label(version), "loaded")
        log.info(
            "model loaded",
            extra={
                "model": name,
                "model_version": version,
                "path": str(path),
                "load_seconds": model.load_seconds,
            },
        )
        return record  # still "loading": _switch makes it ready

    def _check_pair(self, name: str, model: LoadedModel) -> None:
        """Another bilingual model translating the same pair would make routing ambiguous (a
        multilingual model gives way to a bilingual one on its pairs)."""
        if model.multilingual:
            return
        with self._lock:
            for other in self._records:
                serving = self._serving(other)
                if other == name or serving is None or serving.model is None:
                    continue
                if not serving.model.multilingual and serving.model.pair == model.pair:
                    raise BundleError(
                        f"model {other!r} ({serving.path}) already translates {model.pair}; "
                        "one model per language pair: unload it first"
                    )

    def _switch(self, name: str, kept: list[ModelVersion]) -> None:
        """Under the lock: `kept` serve, every other loaded version of `name` retires."""
        now = time.time()
        for record in kept:
            if record.state == "loading":
                record.state, record.since = "ready", now
        for record in self._records.get(name, []):
            if record.state == "ready" and record not in kept:
                self._retire(record)
        serving = self._serving(name)
        if serving is not None:
            log.info(
                "model switched",
                extra={"model": name, "model_version": serving.version, "path": str(serving.path)},
            )

    def _retire(self, record: ModelVersion) -> None:
        """Under the lock: no new request gets it; closed once the last lease is returned."""
        record.state, record.since = "unloading", time.time()
        if record.leases == 0:
            self._close_later(record)

    def _close_later(self, record: ModelVersion) -> None:
        """Under the lock: close the record's loop on a thread of its own (it joins threads),
        then forget the record."""
        if record.closing:
            return
        record.closing = True

        def close() -> None:
            assert record.model is not None
            record.model.loop.close(self.settings.shutdown_timeout_seconds)
            if self.metrics:
                self.metrics.forget_model(record.model.labels)
            with self._lock:
                records = self._records.get(record.name, [])
                if record in records:
                    records.remove(record)
                if not records and record.name in self._records:
                    del self._records[record.name]
            log.info(
                "model unloaded", extra={"model": record.name, "model_version": record.version}
            )
            heap.settle()  # its objects can be collected now

        closer = threading.Thread(target=close, name=f"nmt-unload-{record.name}", daemon=True)
        self._closers = [c for c in self._closers if c.is_alive()] + [closer]
        closer.start()

    def _load_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._loading.setdefault(name, threading.Lock())

    def _repository_names(self) -> set[str]:
        try:
            return set(self.repository.scan())
        except BundleError:
            return set()

    def _open(self, name: str, version: int | None, path: Path) -> LoadedModel:
        settings = self.settings
        started = time.monotonic()
        bundle = load_bundle(path)
        # (a broken one fails the load, as a bundle's file)
        calibration = load_calibration(path, bundle.vocab_sizes)
        shortlist = settings.shortlist and bundle.has_shortlist
        if settings.shortlist and not shortlist:
            log.warning("%s has no vocabulary shortlist: it scores the full vocabulary", path)
        translator = Translator(
            bundle,
            EngineOptions(
                int8=settings.int8,
                intra_op_threads=settings.engine_threads,
                spinning=settings.thread_spinning,
                shortlist=shortlist,
            ),
        )
        if settings.warmup:
            _warm_up(translator, settings.default_beam_size)

        limits = BatchLimits(
            max_sentences=settings.max_batch_size,
            max_total_tokens=settings.max_batch_total_tokens,
            join_ratio=settings.join_ratio,
            join_max_steps=settings.join_max_steps,
            max_queued=settings.max_queue_sentences,
            retry_after=settings.retry_after_seconds,
        )

        words = translator.tokenizer.term_words()  # (what a glossary term's search reads)

        def new_batch(beam_size: int) -> RunningBatch:
            return running_batch(translator.engine, beam_size, words)

        labels = (name, version_label(version))
        loop = DecodingLoop(
            labels,
            new_batch,
            limits,
            self.metrics,
            encode_ahead=settings.encodes_ahead,
            step_together=step_together,
            workers=settings.decoding_workers,
        )
        loop.start()
        seconds = time.monotonic() - started
        if self.metrics:
            self.metrics.observe_model_loaded(labels, seconds, limits.max_queued)
            self.metrics.watch_batches(labels, lambda: loop.running, loop.reserved_tokens)
        # The encoder has max_positions positions; longer sentences cannot be encoded at all.
        token_limit = min(settings.max_tokens_per_sentence, bundle.dims["max_positions"])
        return LoadedModel(
            name, version, bundle, translator, loop, token_limit, seconds, calibration=calibration
        )


class RepositoryWatch:
    """NMT_MODEL_POLL_SECONDS: looks at the repository every `interval` seconds and does what an
    operator would ask for: a model whose versions or bundles changed is loaded again (at its
    pinned version, if a load pinned one), a new model is loaded, a model whose folder is gone
    is unloaded. Off by default: as Triton says of its poll mode, a half-copied version could
    be seen; in production, copy, then POST /v1/models/{name}/load."""

    def __init__(self, registry: ModelRegistry, interval: float) -> None:
        self.registry, self.interval = registry, interval
        self._stop = threading.Event()
        self._seen: dict[str, tuple] = {}
        self._thread = threading.Thread(target=self._run, name="nmt-model-watch", daemon=True)

    def start(self) -> None:
        """From the repository as it is now (what the registry has just loaded)."""
        self._seen = self.registry.repository.fingerprint()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()

    def check(self) -> None:
        """One look at the repository (the thread's turn; tests call it directly)."""
        registry = self.registry
        now = registry.repository.fingerprint()
        for name in sorted(set(now) | set(self._seen)):
            if now.get(name) == self._seen.get(name):
                continue
            try:
                if name not in now:
                    if name in registry.names():
                        registry.unload(name)
                else:
                    registry.load(name, registry.pinned(name))
            except (ModelLoadFailed, ModelUnknown, ModelVersionUnknown) as error:
                log.error("repository watch: %s", error)
        self._seen = now


def _in_words(record: ModelVersion | None) -> str:
    if record is None:
        return "nothing"
    return "the unversioned bundle" if record.version is None else f"version {record.version}"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _warm_up(translator: Translator, beam_size: int) -> None:
    """The first runs of an ONNX Runtime session allocate and plan; do them before ready.
    The sentences need not be in the model's source language: any ids exercise the graphs."""
    for beam in sorted({1, beam_size}):
        translator.translate(WARMUP_SENTENCES, SearchOptions(beam_size=beam, max_length=16))
