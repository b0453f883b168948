"""How well tags land on the right words: hand-written French markup against references.

    python -m bench.markup_quality

The cases are tests/data/markup/cases.jsonl: caption-like French sentences with inline tags,
each with the English markup a careful human translator would write. Every case goes through
the service's markup path (the LibreTranslate `format=html` route's, service/documents/markup/)
once; the same translations are then written a second time with the alignment withheld, so
that every tag falls back to its relative position in the sentence: what the cross-attention
buys over that baseline.

The measures:
* a *tag* is an element that wraps translated words (not a block, not a void element, not an
  element left untranslated); it is matched to the reference's by its start tag (byte for
  byte) and its rank among equal start tags. It *wraps the same words* when the words inside
  it (lower case, punctuation at word edges left out) are the reference's, in order.
* *comparable*: the tags whose reference words all occur in the model's translation; the model
  may word a sentence differently from the reference ("is walking" for "walks"), and then no
  placement can match. The share among them isolates placement from wording.
* word F1: per tag, the F1 of its words against the reference's (as multisets), averaged.
* a *point* (br, img, a comment, an element left untranslated) is in the same place when the
  words just before and just after it are the reference's; comparable when those two words
  stand side by side in the model's translation.

Cases are marked `dev` (seen while the placement rules were chosen) or `held-out` (written
once they were fixed, and never used to change them); each set is reported apart.

Writes the `markup-quality` section of docs/compatibility.md.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path

from fastapi.testclient import TestClient

from bench.report import replace_section
from service.documents import markup
from service.http.app import create_app
from service.runtime.search import SearchOptions
from service.serving.settings import Settings

CASES = Path("tests/data/markup/cases.jsonl")
REPORT = Path("docs/compatibility.md")
COMMAND = "python -m bench.markup_quality"


@dataclass(frozen=True)
class Tag:
    key: tuple[str, int]  # start tag as written, rank among equal start tags
    words: tuple[str, ...]


@dataclass(frozen=True)
class Point:
    key: tuple[str, int]
    before: str  # the word just before it ("" at the start)
    after: str  # the word just after it ("" at the end)


def normalized(text: str) -> list[str]:
    """Words, lower case, without the punctuation at their edges; empty ones dropped."""
    found = []
    for word in text.lower().split():
        stripped = word.strip("".join({c for c in word if not c.isalnum()}))
        if stripped:
            found.append(stripped)
    return found


def tags_and_points(text: str) -> tuple[list[Tag], list[Point]]:
    """The tags and points of an HTML document, read with the service's own parser."""
    words: list[str] = []  # the document's words, in order
    spans: list[tuple[tuple[str, int], int, int]] = []  # tag, its first word, its end
    places: list[tuple[tuple[str, int], int, int]] = []  # point, words before it, and after
    ranks: Counter[str] = Counter()

    def key(start: str) -> tuple[str, int]:
        ranks[start] += 1
        return (start, ranks[start])

    def walk(element: markup.Element) -> None:
        for node in element.children:
            if isinstance(node, markup.Text):
                words.extend(normalized(node.text))
            elif isinstance(node, markup.Opaque):
                places.append((key(node.raw), len(words), len(words)))
            elif _is_point(node):
                own, before = key(node.start), len(words)
                words.extend(normalized(_text(node)))  # an untranslated element's own words
                places.append((own, before, len(words)))
            elif node.name in markup.HTML_BLOCKS:
                walk(node)
            else:
                own, first = key(node.start), len(words)
                walk(node)
                spans.append((own, first, len(words)))

    walk(markup.parse(text, "html"))
    tags = [Tag(own, tuple(words[first:end])) for own, first, end in spans]
    points = [
        Point(own, words[before - 1] if before else "", words[after] if after < len(words) else "")
        for own, before, after in places
    ]
    return tags, points


def _is_point(element: markup.Element) -> bool:
    return (
        element.closed_by_start
        or element.attrs.get("translate") == "no"
        or element.name in markup.HTML_IGNORED
    )


def _text(element: markup.Element) -> str:
    return "".join(
        node.text if isinstance(node, markup.Text) else _text(node)
        for node in element.children
        if not isinstance(node, markup.Opaque)
    )


@dataclass
class Score:
    tags: int = 0
    same: int = 0
    comparable: int = 0
    same_comparable: int = 0
    f1: float = 0.0
    points: int = 0
    points_same: int = 0
    points_comparable: int = 0
    points_same_comparable: int = 0

    def add(self, output: str, reference: str) -> list[str]:
        """Count one case; the tags it misses, for the report."""
        got_tags, got_points = tags_and_points(output)
        want_tags, want_points = tags_and_points(reference)
        output_words = set(normalized(_text(markup.parse(output, "html"))))
        found = {tag.key: tag.words for tag in got_tags}
        missed = []
        for tag in want_tags:
            words = found.get(tag.key, ())
            same = words == tag.words
            comparable = set(tag.words) <= output_words
            self.tags += 1
            self.same += same
            self.comparable += comparable
            self.same_comparable += same and comparable
            self.f1 += _f1(words, tag.words)
            if not same:
                got, want = " ".join(words), " ".join(tag.words)
                missed.append(f"`{tag.key[0]}` wraps “{got}”, the reference “{want}”")
        placed = {point.key: point for point in got_points}
        output_pairs = set(pairwise(["", *normalized(_text(markup.parse(output, "html"))), ""]))
        for point in want_points:
            got = placed.get(point.key)
            neighbours = (point.before, point.after)
            same = got is not None and (got.before, got.after) == neighbours
            comparable = neighbours in output_pairs or same
            self.points += 1
            self.points_same += same
            self.points_comparable += comparable
            self.points_same_comparable += same and comparable
        return missed


def _f1(got: tuple[str, ...], want: tuple[str, ...]) -> float:
    common = sum((Counter(got) & Counter(want)).values())
    if not common:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


def cases() -> list[dict]:
    return [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]


def wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + 300
    while client.get("/readyz").status_code != 200:
        if client.get("/healthz").json().get("status") == "failed":
            raise SystemExit("the models did not load: see the log")
        if time.monotonic() > deadline:
            raise SystemExit("the models did not load in time")
        time.sleep(0.1)


def translate_both(settings: Settings, sources: list[str]) -> tuple[list[str], list[str]]:
    """The service's output, and the same translations placed with no alignment."""
    with TestClient(create_app(settings)) as client:
        wait_ready(client)
        served = client.post(
            "/translate", json={"q": sources, "source": "fr", "target": "en", "format": "html"}
        )
        served.raise_for_status()
        service = client.app.state.service  # type: ignore[attr-defined]
        model = service.model_for("fr", "en")
        documents = markup.read(sources, markup.MarkupOptions(kind="html"))
        sentences, _ = markup.model_sentences(documents)
        options = SearchOptions(
            beam_size=settings.default_beam_size,
            length_penalty=settings.default_length_penalty,
            max_length=settings.max_output_length,
            max_repeats=settings.max_repeats,
            alignment=True,
        )
        result = client.portal.call(service.translate, model, sentences, options, None, "none")
    found = markup.from_pipeline(result)
    aligned = markup.write(documents, found)
    if aligned != served.json()["translatedText"]:
        raise SystemExit(
            "the route and the module disagree: the measure would not be the service's"
        )
    diagonal = markup.write(documents, [replace(t, alignment=None) for t in found])
    return aligned, diagonal


def row(cases: str, placement: str, score: Score) -> str:
    def share(part: int, whole: int) -> str:
        return f"{part / whole:.0%} ({part}/{whole})" if whole else "-"

    return (
        f"| {cases} | {placement} | {share(score.same, score.tags)} | "
        f"{share(score.same_comparable, score.comparable)} | {score.f1 / score.tags:.2f} | "
        f"{share(score.points_same, score.points)} | "
        f"{share(score.points_same_comparable, score.points_comparable)} |"
    )


SETS = {
    "dev": "seen while the placement rules were chosen",
    "held-out": "written once the rules were fixed, never used to change them",
}


def report(all_cases: list[dict], aligned: list[str], diagonal: list[str]) -> str:
    scores = {(name, way): Score() for name in [*SETS, "all"] for way in ("ours", "baseline")}
    misses: list[str] = []
    for case, ours, theirs in zip(all_cases, aligned, diagonal, strict=True):
        for name in (case["set"], "all"):
            missed = scores[name, "ours"].add(ours, case["reference"])
            scores[name, "baseline"].add(theirs, case["reference"])
        misses += [f"* `{case['id']}` ({case['set']}): {miss}" for miss in missed]
    counts = Counter(case["set"] for case in all_cases)
    table = []
    for name in [*SETS, "all"]:
        label = (
            f"{name} ({counts[name]}: {SETS[name]})" if name in SETS else f"all ({len(all_cases)})"
        )
        table.append(row(label, "cross-attention alignment (the service)", scores[name, "ours"]))
        table.append(row(label, "relative position only (baseline)", scores[name, "baseline"]))
    everything = scores["all", "ours"]
    lines = [
        "## Markup: do tags land on the right words?",
        "",
        f"`{COMMAND}` ({len(all_cases)} hand-written cases in `{CASES}`, "
        f"{everything.tags} tags and {everything.points} points; the committed fr-en "
        "model, default settings). Each case is French markup and the English markup a careful "
        "translator writes; the service's output is compared with it tag by tag. A tag wraps "
        "the same words when the words inside it (lower case, edge punctuation left out) are "
        "the reference's; *comparable* tags are those whose reference words all occur in the "
        "model's translation (otherwise the model worded it differently and no placement can "
        "match). Points (br, img, comments, untranslated elements) are in the same place when "
        "the words just before and after them are the reference's; comparable when those two "
        "words stand side by side in the model's translation. The baseline writes the same "
        "translations with the alignment withheld: every tag at its relative position in the "
        "sentence.",
        "",
        "| cases | placement | tags on the reference's words | of comparable tags | "
        "tags' word F1 | points between the same words | of comparable points |",
        "|---|---|---|---|---|---|---|",
        *table,
        "",
        "Every output parses, with the same multiset of start tags as its input "
        "(tests/documents/test_markup.py checks this on every case). Where the service's tags "
        "differ from the reference:",
        "",
        *misses,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, default=Path("build/models"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    all_cases = cases()
    settings = Settings(
        model_dir=args.model_dir, threads=args.threads, max_texts_per_request=len(all_cases)
    )
    aligned, diagonal = translate_both(settings, [case["source"] for case in all_cases])
    text = report(all_cases, aligned, diagonal)
    print(text)
    if not args.no_write:
        replace_section("markup-quality", text, REPORT)


if __name__ == "__main__":
    main()
