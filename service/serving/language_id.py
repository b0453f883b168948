"""Which language a text is in, for `source: "auto"` (LibreTranslate), `POST /detect`, and a
DeepL request without `source_lang`.

By default py3langid (a maintained fork of langid.py; its model ships in its small wheel and
works offline), chosen over lingua-language-detector and fastText's lid.176 on accuracy, time
per call, size, and how many of the multilingual families' languages it can name, measured side
by side (docs/compatibility.md: the table, the command, and the languages of M2M-100, NLLB-200
and mBART-50 each cannot name). It names 139 languages: all of mBART-50's, 90 of M2M-100's and
120 of NLLB-200's. For a bundle whose languages it does not cover, NMT_LANGUAGE_ID_MODEL names a
fastText language-identification model file instead, read with fasttext-predict: NLLB's own
(218 languages, labelled as NLLB's tokens are, `__label__fra_Latn`), GlotLID's (over 2,000, the
same labels) or fastText's lid.176 (`__label__fr`). The service logs at start which source
languages of its bundles the detector cannot name.

Either detector picks among all the languages it knows, not only the served ones, so that a
German text sent to a French model is named German, not guessed French.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import fasttext
from py3langid.langid import MODEL_FILE, LanguageIdentifier

from nmt_contract import code_of_language_and_script

# A detector's codes -> the service's, where they differ. The service names a language as
# bundles do (nmt_contract, export/hf/languages.py): ISO 639-1 where the language has such a
# code, else ISO 639-3, an individual language standing for its macrolanguage where that is
# what the two-letter code usually means.
SERVICE_CODES = {
    "kik": "ki",  # Gikuyu (py3langid; NLLB's kik_Latn)
    "gug": "gn",  # Paraguayan Guarani (py3langid; NLLB's grn_Latn)
    "no": "nb",  # Bokmål (py3langid and lid.176 call it "no"), Nynorsk is "nn"; NLLB's nob_Latn
    # lid.176's labels are Wikipedia's language codes; these are not ISO 639's
    "als": "gsw",  # Alemannic German (ISO 639-3 "als" is Tosk Albanian, NLLB's als_Latn)
    "bh": "bho",  # Bihari: Bhojpuri is what Wikipedia's bh edition is written in
    "sh": "hbs",  # Serbo-Croatian
}
FASTTEXT_LABEL = "__label__"
SHOWN_PROBABILITY = 0.0006  # 0.06%: a Detection.confidence of 0.1; 0.05% or less rounds to 0.0
# ISO 639 (lid.176), or ISO 639-3 and an ISO 15924 script (NLLB's and GlotLID's models)
LANGUAGE_LABEL = re.compile(r"__label__[a-z]{2,3}(_[A-Z][a-z]{3})?")


@dataclass(frozen=True)
class Detection:
    language: str  # ISO 639-1 code where the language has one, else ISO 639-3
    confidence: float  # 0 to 100, as LibreTranslate reports it


def service_code(code: str) -> str:
    """A code or label a detector gives -> the code bundles and clients use for that language:
    `fr` -> "fr", `no` -> "nb", `__label__fra_Latn` -> "fr", `__label__zho_Hant` -> "zh-Hant"."""
    code = code.removeprefix(FASTTEXT_LABEL)
    if "_" in code:  # ISO 639-3 and a script, as NLLB names languages
        return code_of_language_and_script(code)
    return SERVICE_CODES.get(code, code)


class Identifier(Protocol):
    def rank(self, text: str) -> list[tuple[str, float]]:
        """Every language it knows, the service's codes, most likely first: (code, 0 to 1)."""

    @property
    def languages(self) -> frozenset[str]: ...


class Py3langidIdentifier:
    """py3langid's model, inside its wheel (unpickling it takes seconds)."""

    def __init__(self) -> None:
        self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)

    def rank(self, text: str) -> list[tuple[str, float]]:
        return [(service_code(code), p) for code, p in self._identifier.rank(text)]

    @property
    def languages(self) -> frozenset[str]:
        return frozenset(service_code(code) for code in self._identifier.nb_classes)


class FastTextIdentifier:
    """A fastText supervised model file whose labels are languages (NMT_LANGUAGE_ID_MODEL)."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ValueError(f"NMT_LANGUAGE_ID_MODEL: no file {path}")
        _probe_in_a_child(path)
        self._model = fasttext.load_model(str(path))
        # Every label: k=-1 asks for all, and a threshold below 0 keeps even those that a
        # hierarchical softmax (lid.176) would prune as improbable.
        labels, _ = self._model.predict("", k=-1, threshold=-1.0)
        if others := [label for label in labels if not LANGUAGE_LABEL.fullmatch(label)]:
            raise ValueError(
                f"NMT_LANGUAGE_ID_MODEL: {path} classifies into {others[0]!r}, not a language "
                "(labels such as __label__fr or __label__fra_Latn)"
            )
        self._languages = frozenset(service_code(label) for label in labels)

    def rank(self, text: str) -> list[tuple[str, float]]:
        line = " ".join(text.split())  # fastText reads one line; it splits on whitespace anyway
        # The long tail (a confidence that rounds to 0.0 percent) costs time and says nothing:
        # GlotLID has over 2,000 labels. The best one always comes.
        labels, probabilities = self._model.predict(line, k=-1, threshold=SHOWN_PROBABILITY)
        if not labels:
            labels, probabilities = self._model.predict(line, k=1)
        # Labels that are one language to the service (NLLB's zho_Hans and a GlotLID cmn_Hans,
        # say) share it: their probabilities add up.
        by_code: dict[str, float] = defaultdict(float)
        for label, probability in zip(labels, probabilities, strict=True):
            by_code[service_code(label)] += float(probability)
        ranked = sorted(by_code.items(), key=lambda item: item[1], reverse=True)
        return [(code, min(probability, 1.0)) for code, probability in ranked]

    @property
    def languages(self) -> frozenset[str]:
        return self._languages


# fastText's loader trusts the file: a truncated or damaged one can crash the process (a
# division by zero, SIGFPE), or read a huge size and allocate without end, instead of
# raising. So a child reads it first, within a memory cap and a time limit.
PROBE = """
import resource, sys, fasttext
cap = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
fasttext.load_model(sys.argv[1]).predict("", k=-1, threshold=-1.0)
"""
PROBE_SECONDS = 120.0


def _probe_in_a_child(path: Path) -> None:
    # A model takes about its file's size in memory; the interpreter and its imports, less
    # than a GiB.
    cap = 4 * path.stat().st_size + 2**31
    refused = f"NMT_LANGUAGE_ID_MODEL: {path} is no fastText classifier"
    try:
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, str(path), str(cap)],
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"{refused} (fastText was still reading it after {PROBE_SECONDS:.0f} s: a "
            "truncated or damaged file?)"
        ) from None
    if probe.returncode < 0:
        raise ValueError(
            f"{refused} (reading it crashed fastText with signal {-probe.returncode}: a "
            "truncated or damaged file?)"
        )
    if "MemoryError" in probe.stderr or "bad_alloc" in probe.stderr:
        raise ValueError(
            f"{refused} (reading it asked for more than {cap / 2**30:.1f} GiB: a truncated or "
            "damaged file?)"
        )
    if probe.returncode != 0:  # fastText's own checks: not a model, not a supervised one
        reason = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        raise ValueError(f"{refused} ({reason})")


class LanguageDetector:
    """py3langid, or the fastText model of `model_file` (NMT_LANGUAGE_ID_MODEL); loaded on
    first use or at start (`load`), then shared; thread-safe."""

    def __init__(self, model_file: Path | None = None) -> None:
        self.model_file = model_file
        self._identifier: Identifier | None = None
        self._lock = threading.Lock()

    def load(self) -> Identifier:
        with self._lock:
            if self._identifier is None:
                if self.model_file is None:
                    self._identifier = Py3langidIdentifier()
                else:
                    self._identifier = FastTextIdentifier(self.model_file)
            return self._identifier

    @property
    def name(self) -> str:
        return "py3langid" if self.model_file is None else str(self.model_file)

    @property
    def languages(self) -> frozenset[str]:
        """Every code `detect` can answer (py3langid's "zxx": no linguistic content, such as
        digits)."""
        return self.load().languages

    def detect(self, text: str, candidates: int | None = 3) -> list[Detection]:
        """The most likely languages of `text`, best first (None: every language it knows;
        a fastText model's, every one above 0.0 percent)."""
        ranked = self.load().rank(text)[:candidates]
        return [Detection(code, round(100.0 * probability, 1)) for code, probability in ranked]
