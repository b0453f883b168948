"""Language detection on real text: what it names, in the codes bundles use, and the languages
of the multilingual families it cannot name, as docs/compatibility.md lists them."""

from __future__ import annotations

import re
from pathlib import Path

import polib
import pytest

from export.hf.languages import M2M100_CODES, MBART50_CODES, NLLB_CODES, our_codes
from service.serving.language_id import SERVICE_CODES, LanguageDetector
from tests.conftest import ROOT

LOCALES = Path("/usr/share/locale")


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector()


def catalog_messages(locale: str, count: int) -> list[str]:
    """Translated messages (40 characters or more, placeholders cut) of the gettext catalogs
    this machine's Debian packages install: real text in many languages."""
    found: set[str] = set()
    for path in sorted((LOCALES / locale / "LC_MESSAGES").glob("*.mo")):
        if path.name.startswith(("iso_", "xkeyboard-config")):  # names and codes, no sentences
            continue
        try:
            catalog = polib.mofile(str(path))
        except (OSError, LookupError, ValueError):
            continue
        for translated in (entry.msgstr for entry in catalog.translated_entries()):
            text = " ".join(
                re.sub(r"%[-+#0-9.*]*[a-zA-Z]|\{[^}]*\}|<[^>]*>|[_&]", "", translated).split()
            )
            if len(text) >= 40:
                found.add(text)
    if len(found) < count:
        pytest.skip(f"fewer than {count} {locale} messages under {LOCALES / locale}")
    return sorted(found)[:count]


@pytest.mark.parametrize("language", ["fr", "de", "en"])
def test_multi30k_lines_are_named_among_every_language_it_knows(
    detector: LanguageDetector, multi30k: Path, language: str
):
    lines = (multi30k / f"test_2017_flickr.{language}").read_text().splitlines()[:50]
    named = [detector.detect(line, 1)[0].language for line in lines]
    assert named.count(language) >= 48, named  # the bench measures 100% on 200 of each


def test_candidates_are_ranked_with_percent_confidences(detector: LanguageDetector, multi30k: Path):
    line = (multi30k / "test_2017_flickr.de").read_text().splitlines()[0]
    found = detector.detect(line)
    assert len(found) == 3 and found[0].language == "de"
    assert 100 >= found[0].confidence >= found[1].confidence >= found[2].confidence >= 0
    every = detector.detect(line, None)
    assert len(every) == len(detector.languages)  # one entry per language, none twice
    assert sum(d.confidence for d in every) == pytest.approx(100, abs=1)


def test_codes_are_those_bundles_use(detector: LanguageDetector):
    """py3langid's kik, gug and no are ki, gn and nb in bundles (NLLB's kik_Latn, grn_Latn,
    nob_Latn) and in the DeepL and LibreTranslate dialects."""
    assert {"ki", "gn", "nb", "nn"} <= detector.languages
    assert not set(SERVICE_CODES) & detector.languages
    nllb = set(our_codes(NLLB_CODES, "nllb"))
    assert {"ki", "gn", "nb", "nn"} <= nllb
    assert all(len(code) in (2, 3) for code in detector.languages)  # no script or region


@pytest.mark.parametrize("language", ["nb", "nn"])
def test_norwegian_is_named_bokmal_or_nynorsk(detector: LanguageDetector, language: str):
    messages = catalog_messages(language, 30)
    named = [detector.detect(text, 1)[0].language for text in messages]
    assert named.count(language) >= 0.7 * len(messages), named  # the bench: 90% nb, 96% nn
    assert "no" not in named


def test_the_families_languages_it_cannot_name_are_those_the_docs_list(
    detector: LanguageDetector,
):
    """docs/compatibility.md (written by `python -m bench.language_id`) says which languages
    of M2M-100, NLLB-200 and mBART-50 detection never answers; it must say it of this model."""
    families = [
        [c for c in our_codes(M2M100_CODES, "m2m100") if c not in detector.languages],
        [c for c in our_codes(NLLB_CODES, "nllb") if c not in detector.languages],
        [c for c in our_codes(MBART50_CODES, "mbart50") if c not in detector.languages],
    ]
    docs = (ROOT / "docs" / "compatibility.md").read_text()
    table = docs.split("| library | M2M-100 | NLLB-200 | mBART-50 |", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("| py3langid |"))
    listed = [cell.strip() for cell in row.strip("|").split("|")[1:]]
    assert listed == [" ".join(codes) or "none" for codes in families]
    assert "yi" in families[0] and "ha" not in families[0]  # Yiddish no, Hausa yes
