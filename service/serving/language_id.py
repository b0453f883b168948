"""Which language a text is in, for `source: "auto"` (LibreTranslate), `POST /detect`, and a
DeepL request without `source_lang`.

py3langid (a maintained fork of langid.py; its model ships in its small wheel and works
offline) was chosen over lingua-language-detector on accuracy, time per call and size, measured
side by side (docs/compatibility.md: the table and the command). It picks among all ~97 languages it
knows, not only the served ones, so that a German text sent to a French model is named German,
not guessed French.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from py3langid.langid import MODEL_FILE, LanguageIdentifier


@dataclass(frozen=True)
class Detection:
    language: str  # ISO 639-1 code
    confidence: float  # 0 to 100, as LibreTranslate reports it


class LanguageDetector:
    """Loaded on first use (unpickling the model takes seconds), then shared; thread-safe."""

    def __init__(self) -> None:
        self._identifier: LanguageIdentifier | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        with self._lock:
            if self._identifier is None:
                self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)

    def detect(self, text: str, candidates: int | None = 3) -> list[Detection]:
        """The most likely languages of `text`, best first (None: every language it knows)."""
        self.load()
        assert self._identifier is not None
        ranked = self._identifier.rank(text)[:candidates]
        return [Detection(code, round(100.0 * probability, 1)) for code, probability in ranked]
