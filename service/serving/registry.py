"""The models this server translates with: one bundle per language pair, each with its own
engine sessions, tokenizer and decoding loop (so that one busy pair never stalls another).

Loading verifies each bundle's checksums, opens its ONNX Runtime sessions and translates a few
sentences (greedy and beam) so that the first client does not pay for lazy initialisation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from service.runtime.bundle import Bundle, BundleError, load_bundle
from service.runtime.running_batch import RunningBatch, running_batch, step_together
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from service.serving.errors import UnknownPair
from service.serving.loop import BatchLimits, DecodingLoop
from service.serving.metrics import Metrics
from service.serving.settings import Settings

log = logging.getLogger("nmt.registry")

WARMUP_SENTENCES = ["Bonjour.", "Un homme marche dans la rue avec son chien."]


@dataclass
class LoadedModel:
    bundle: Bundle
    translator: Translator
    loop: DecodingLoop
    max_tokens_per_sentence: int  # the setting, capped by the model's positions
    load_seconds: float

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def pair(self) -> str:
        return f"{self.bundle.source_lang}-{self.bundle.target_lang}"

    def describe(self) -> dict:
        bundle = self.bundle
        return {
            "name": bundle.name,
            "source_lang": bundle.source_lang,
            "target_lang": bundle.target_lang,
            "precision": "int8" if self.translator.engine.options.int8 else "fp32",
            "max_tokens_per_sentence": self.max_tokens_per_sentence,
            "dims": bundle.dims,
            "load_seconds": round(self.load_seconds, 3),
        }


def find_bundles(model_dir: Path) -> list[Path]:
    """`model_dir` itself when it is a bundle, else its subfolders that are bundles."""
    model_dir = Path(model_dir)
    if (model_dir / "bundle.json").is_file():
        return [model_dir]
    if not model_dir.is_dir():
        raise BundleError(
            f"NMT_MODEL_DIR={model_dir} does not exist: export a model there first, e.g. "
            f"`nmt export --checkpoint models/fr-en --out {model_dir}/fr-en`"
        )
    found = sorted(p for p in model_dir.iterdir() if (p / "bundle.json").is_file())
    if not found:
        raise BundleError(
            f"no bundle under NMT_MODEL_DIR={model_dir} (no subfolder with a bundle.json): "
            f"export one with `nmt export --checkpoint models/fr-en --out {model_dir}/fr-en`"
        )
    return found


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._models: dict[tuple[str, str], LoadedModel] = {}

    @property
    def models(self) -> list[LoadedModel]:
        return list(self._models.values())

    @property
    def pairs(self) -> list[str]:
        return sorted(model.pair for model in self._models.values())

    def get(self, source_lang: str, target_lang: str) -> LoadedModel:
        model = self._models.get((source_lang, target_lang))
        if model is None:
            raise UnknownPair(source_lang, target_lang, self.pairs)
        return model

    def load_all(self) -> None:
        """Load every bundle under settings.model_dir; raises BundleError on the first problem."""
        for path in find_bundles(self.settings.model_dir):
            model = self._load(path)
            key = (model.bundle.source_lang, model.bundle.target_lang)
            if key in self._models:
                model.loop.close()
                raise BundleError(
                    f"two bundles translate {key[0]} to {key[1]}: "
                    f"{self._models[key].bundle.path} and {path}; keep one"
                )
            self._models[key] = model
            log.info(
                "model ready",
                extra={"model": model.name, "path": str(path), "load_seconds": model.load_seconds},
            )

    def close(self, timeout: float | None = None) -> None:
        """Let every decoding loop finish its queue, then stop it."""
        for model in self._models.values():
            model.loop.close(timeout)

    def _load(self, path: Path) -> LoadedModel:
        settings = self.settings
        started = time.monotonic()
        bundle = load_bundle(path)
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

        loop = DecodingLoop(
            bundle.name,
            new_batch,
            limits,
            self.metrics,
            encode_ahead=settings.encodes_ahead,
            step_together=step_together,
        )
        loop.start()
        seconds = time.monotonic() - started
        if self.metrics:
            self.metrics.observe_model_loaded(bundle.name, seconds, limits.max_queued)
        # The encoder has max_positions positions; longer sentences cannot be encoded at all.
        token_limit = min(settings.max_tokens_per_sentence, bundle.dims["max_positions"])
        return LoadedModel(bundle, translator, loop, token_limit, seconds)


def _warm_up(translator: Translator, beam_size: int) -> None:
    """The first runs of an ONNX Runtime session allocate and plan; do them before ready.
    The sentences need not be in the model's source language: any ids exercise the graphs."""
    for beam in sorted({1, beam_size}):
        translator.translate(WARMUP_SENTENCES, SearchOptions(beam_size=beam, max_length=16))
