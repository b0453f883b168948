"""Glossary terms enforced in decoding (issue 33): are they kept, what else changes, what it
costs, against the obvious alternative.

    python -m bench.terminology                # fp32 and int8, writes docs/benchmarks.md
    python -m bench.terminology --build-set    # (re)makes the test set from candidates.tsv

The test set is tests/data/terminology/ (README.md there): our glossary (terms.tsv) and the
Multi30k lines it is measured on (sentences.tsv: split, line number, term or control; the
corpus text is read from Multi30k, never copied). Everything is decoded with beam 4 through
the runtime's running batches, as the server's decoding loop does (`running_batch` with the
vocabulary's `term_words`): sentences sorted by length into batches of 32, term and control
sentences mixed in the same batches, once with the glossary's constraints and once without.
Measured, per precision:

* terms kept: the share of (sentence, term) pairs whose target term is in the translation
  (case-insensitively: service.serving.terminology.kept);
* controls unchanged: the share of control sentences whose translation with the glossary is
  byte-identical to the one without (they share batches with constrained sentences);
* chrF of the rest (`rest_chrf`): how much of the rest of a term sentence is unchanged:
  sacrebleu chrF of the output with its target terms cut out, against the plain output with
  the words that the word alignment (service/serving/word_alignment.py) links to the terms'
  source words cut out;
* speed: tokens/s of batches of 32 sentences in which 8 rows are constrained, against the same
  sentences with none, one ONNX Runtime thread, alternating, median of several runs;
* the alternative: the plain translation with the words that the alignment links to a term's
  source words replaced by the target term (`replace_linked`), measured the same way.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sacrebleu

from bench.report import BENCHMARKS, opening, replace_section
from export.train_config import multi30k_dir
from nmt_contract import Hypothesis
from service.runtime.bundle import load_bundle
from service.runtime.engine import Engine
from service.runtime.running_batch import running_batch
from service.runtime.search import SearchOptions, Sentence
from service.runtime.sessions import EngineOptions
from service.runtime.strategies import TermWords
from service.runtime.tokenizer import BundleTokenizer
from service.runtime.translator import Translator
from service.serving.input_text import model_input
from service.serving.terminology import SentenceTerms, Terminology, kept, sentence_terms
from service.serving.word_alignment import WordAlignment, group_words, word_alignment

SET_DIR = Path("tests/data/terminology")
SPLITS = ("test_2016_flickr", "test_2017_flickr")
BEAM = 4
BATCH = 32
CONSTRAINED_ROWS = 8  # of BATCH, in the speed runs: a quarter
MIN_CONTROLS = 100
CONTROL_SEED = 33
EXAMPLES = 6
OPTIONS = SearchOptions(beam_size=BEAM, alignment=True)


# The test set.


@dataclass(frozen=True)
class SetLine:
    """One sentence of the test set: a Multi30k line (1-based) and what it is there for."""

    split: str
    line: int
    kind: str  # "term" or "control"
    text: str = ""

    @property
    def id(self) -> str:
        return f"{self.split}:{self.line}"


def read_terms(path: Path) -> list[tuple[str, str]]:
    """A TSV of source<TAB>target, one entry a line ('#' lines and blank lines skipped)."""
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            source, target = line.split("\t")
            entries.append((source.strip(), target.strip()))
    return entries


def write_terms(path: Path, entries: Iterable[tuple[str, str]]) -> None:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in entries), encoding="utf-8")


def read_set(path: Path, data: Path) -> list[SetLine]:
    """sentences.tsv (split<TAB>line<TAB>kind, a header first) with the lines' text."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    corpus = {split: _lines(data, split) for split in {row[0] for row in rows}}
    return [SetLine(s, int(n), kind, corpus[s][int(n) - 1]) for s, n, kind in rows]


def write_set(path: Path, lines: Iterable[SetLine]) -> None:
    rows = "".join(f"{line.split}\t{line.line}\t{line.kind}\n" for line in lines)
    path.write_text("split\tline\tkind\n" + rows, encoding="utf-8")


def _lines(data: Path, split: str, lang: str = "fr") -> list[str]:
    return (data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()


# What a sentence's terms ask of the decoder, and the decoding.


def decode(
    engine: Engine,
    words: TermWords,
    sources: Sequence[list[int]],
    terms: Sequence[SentenceTerms | None],
    options: SearchOptions = OPTIONS,
    batch_size: int = BATCH,
) -> list[Hypothesis]:
    """Each source's best hypothesis: sorted by length into running batches of batch_size
    (as Translator.translate_ids; a sentence's terms, if any, as the server's loop gives
    them), so that sentences with and without terms share batches."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    best: list[Hypothesis | None] = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        batch = running_batch(engine, options.beam_size, words)
        batch.join(
            [_sentence(i, sources[i], terms[i], options) for i in order[start:][:batch_size]]
        )
        while len(batch):
            for finished in batch.step():
                best[finished.sentence.ticket] = finished.hypotheses[0]
    return best  # type: ignore[return-value]  # every sentence finished


def _sentence(
    ticket: int, source: list[int], terms: SentenceTerms | None, options: SearchOptions
) -> Sentence:
    if terms is None:
        return Sentence(source, options, ticket=ticket)
    return Sentence(
        source, options, ticket=ticket, constraints=terms.constraints, constraint_spans=terms.spans
    )


# Words: what the alignment links to a term, the rest of a sentence, the replacement baseline.


def alignment_of(
    tokenizer: BundleTokenizer, source: list[int], hypothesis: Hypothesis
) -> WordAlignment:
    """The hypothesis' word alignment, made as the service makes it (requests._alignment)."""
    target_pieces = tokenizer.target_pieces(hypothesis.tokens)
    weights = hypothesis.alignment
    if weights.shape[0] > len(target_pieces):  # the last step produced </s>
        target_pieces = [*target_pieces, "</s>"]
    return word_alignment(tokenizer.source_pieces(source), target_pieces, weights)


def source_words_of(source_pieces: list[str], span: tuple[int, int]) -> set[int]:
    """The source words (word_alignment's) that the tokens [start, end) belong to."""
    _, word_of = group_words(source_pieces)
    return {word_of[k] for k in range(*span) if word_of[k] >= 0}


def linked_words(alignment: WordAlignment, source_words: set[int]) -> list[int]:
    """The target words whose hard alignment is on one of `source_words`, in order."""
    return sorted(target for source, target in alignment.pairs if source in source_words)


_EDGES = re.compile(r"^(\W*)(.*?)(\W*)$", re.S)


def replace_linked(words: list[str], replacements: Sequence[tuple[list[int], str]]) -> str:
    """The replacement baseline on one sentence. words: the plain translation's words (as
    word_alignment cuts them: punctuation stays on its word); per term, the words linked to
    its source words and its target. The first linked word becomes the target term (keeping
    the punctuation around the word, capitalized when the word was), the other linked words
    go (their punctuation stays); no linked word: the term is missing."""
    out = list(words)
    for linked, target in replacements:
        for place, index in enumerate(linked):
            lead, core, trail = _EDGES.match(words[index]).groups()
            if place:
                out[index] = lead + trail
                continue
            term = target
            if core[:1].isupper() and target[:1].islower():
                term = target[:1].upper() + target[1:]
            out[index] = lead + term + trail
    text = ""
    for word in out:  # a word reduced to punctuation sticks to the one before it
        if word and not text:
            text = word
        elif word:
            text += word if not any(c.isalnum() for c in word) else " " + word
    return text


def without_terms(text: str, targets: Iterable[str]) -> str:
    """The text with every occurrence of each target term cut out (case-insensitively), spaces
    closed up."""
    for target in targets:
        text = re.sub(re.escape(target), " ", text, flags=re.I)
    return " ".join(text.split())


def without_words(words: list[str], cut: Iterable[int]) -> str:
    gone = set(cut)
    return " ".join(word for i, word in enumerate(words) if i not in gone)


def rest_chrf(
    outputs: Sequence[str], targets: Sequence[Sequence[str]], plain_rest: Sequence[str]
) -> float:
    """chrF of the outputs with their target terms cut out, against the plain translations
    with the words linked to the terms' source words cut out (corpus-level, sacrebleu)."""
    hypotheses = [without_terms(o, t) for o, t in zip(outputs, targets, strict=True)]
    return sacrebleu.corpus_chrf(hypotheses, [list(plain_rest)]).score


# Building the test set.


@dataclass
class BuiltSet:
    terms: list[tuple[str, str]]
    lines: list[SetLine]
    dropped: list[tuple[str, str, str]]  # (source, target, why)


def build_set(
    candidates: list[tuple[str, str]],
    data: Path,
    bundle: Path,
    threads: int = 0,
    min_controls: int = MIN_CONTROLS,
) -> BuiltSet:
    """The glossary and its sentences. A candidate stays if it is in some test sentence and
    the model never writes its target there on its own (beam 4, fp32 and int8, as
    terminology.kept reads it); a dropped one gives way to the next candidate for the same
    source term, if any. Then the lines of the test sets that hold a term, and as many
    lines that hold none (at least min_controls), drawn with a fixed seed."""
    corpus = [(split, n, text) for split in SPLITS for n, text in enumerate(_lines(data, split), 1)]
    texts = [model_input(text) for _, _, text in corpus]
    plains = []
    for int8 in (False, True):
        translator = Translator(
            load_bundle(bundle), EngineOptions(int8=int8, intra_op_threads=threads)
        )
        words = translator.tokenizer.term_words()
        sources = translator.tokenizer.encode(texts)
        options = SearchOptions(beam_size=BEAM)
        found = decode(translator.engine, words, sources, [None] * len(texts), options)
        plains.append([translator.tokenizer.decode(h.tokens) for h in found])
    alternatives: dict[str, list[str]] = {}
    for source, target in candidates:
        alternatives.setdefault(source, []).append(target)
    chosen = {source: targets[0] for source, targets in alternatives.items()}
    dropped: list[tuple[str, str, str]] = []
    while True:
        terminology = Terminology(chosen.items())
        where: dict[str, list[int]] = {source: [] for source in chosen}
        for i, text in enumerate(texts):
            for match in terminology.find(text):
                where[match.source].append(i)
        failing = []
        for source, target in chosen.items():
            why = _why_not(target, where[source], corpus, plains)
            if why:
                failing.append((source, target, why))
        if not failing:
            break
        for source, target, why in failing:
            dropped.append((source, target, why))
            later = alternatives[source][alternatives[source].index(target) + 1 :]
            if later:
                chosen[source] = later[0]
            else:
                del chosen[source]
    terms = [(source, chosen[source]) for source in alternatives if source in chosen]
    with_terms = sorted({i for found in where.values() for i in found})
    others = [i for i in range(len(corpus)) if i not in set(with_terms)]
    count = max(len(with_terms), min_controls)
    controls = sorted(random.Random(CONTROL_SEED).sample(others, count))
    kinds = {i: "term" for i in with_terms} | {i: "control" for i in controls}
    lines = [SetLine(corpus[i][0], corpus[i][1], kinds[i], corpus[i][2]) for i in sorted(kinds)]
    return BuiltSet(terms, lines, dropped)


def _why_not(
    target: str, found: list[int], corpus: list[tuple[str, int, str]], plains: list[list[str]]
) -> str:
    """Why a candidate term cannot measure enforcement ("" when it can)."""
    if not found:
        return "in no test sentence"
    for precision, plain in zip(("fp32", "int8"), plains, strict=True):
        for i in found:
            if target.casefold() in plain[i].casefold():
                word = next(w for w in plain[i].split() if target.casefold() in w.casefold())
                split, line, _ = corpus[i]
                return f'the model writes it on its own: "{word}" ({split}:{line}, {precision})'
    return ""


# Measuring.


METHODS = ("constrained", "replaced")  # TermSentence's outputs
LABELS = {"constrained": "constrained decoding", "replaced": "replacement by alignment"}
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


@dataclass
class TermSentence:
    """One term sentence's translations: plain (no glossary), by constrained decoding, and
    the plain one with the aligned words replaced."""

    line: SetLine
    sources: tuple[str, ...]  # the glossary's source terms found in it, in order
    terms: SentenceTerms
    plain: str
    constrained: str
    replaced: str
    plain_rest: str  # the plain translation without the words linked to the terms
    plain_words: tuple[str, ...]  # per term, the plain translation's word for it ("": none)
    linked: tuple[tuple[str, ...], ...] = ()  # per term, the plain words linked to it

    def kept(self, method: str) -> int:
        return kept(getattr(self, method), self.terms.targets)

    def left(self, method: str) -> int:
        """Terms written next to the plain translation's word for them, not instead."""
        rest = without_terms(getattr(self, method), self.terms.targets)
        return sum(still_there(word, self.plain, rest) for word in self.plain_words)

    def run_on(self, method: str) -> bool:
        """More sentence ends than the plain translation: the output went on after it."""
        ends = _SENTENCE_END.findall
        return len(ends(getattr(self, method))) > len(ends(self.plain))


@dataclass
class Quality:
    precision: str
    sentences: list[TermSentence]
    controls: int
    controls_same: int  # identical with and without the glossary, in the same batches
    controls_alone_same: int  # identical, no glossary, when batched with controls only
    batches: int
    mixed_batches: int  # batches holding term and control lines

    @property
    def pairs(self) -> int:
        return sum(len(s.terms.targets) for s in self.sentences)

    def kept(self, method: str) -> int:
        return sum(s.kept(method) for s in self.sentences)

    def left(self, method: str) -> int:
        return sum(s.left(method) for s in self.sentences)

    def run_on(self, method: str) -> int:
        return sum(s.run_on(method) for s in self.sentences)

    def rest_chrf(self, method: str) -> float:
        return rest_chrf(
            [getattr(s, method) for s in self.sentences],
            [s.terms.targets for s in self.sentences],
            [s.plain_rest for s in self.sentences],
        )

    def whole_chrf(self, method: str) -> float:
        outputs = [getattr(s, method) for s in self.sentences]
        return sacrebleu.corpus_chrf(outputs, [[s.plain for s in self.sentences]]).score


def batches_of(sources: Sequence[list[int]], batch_size: int = BATCH) -> list[list[int]]:
    """The batches `decode` makes: positions sorted by length, batch_size at a time."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def prepare(
    translator: Translator, terminology: Terminology, lines: Sequence[SetLine]
) -> tuple[list[list[int]], list[SentenceTerms | None]]:
    """Source ids and terms of the set's lines. A term line without a term, or a control
    line with one, means the glossary and the set have drifted apart."""
    texts = [model_input(line.text) for line in lines]
    sources = translator.tokenizer.encode(texts)
    terms = [sentence_terms(translator.tokenizer, terminology, text) for text in texts]
    for line, found in zip(lines, terms, strict=True):
        if (found is not None) != (line.kind == "term"):
            raise SystemExit(f"{line.id} is a {line.kind} line with terms {found}: rebuild the set")
    return sources, terms


def measure_quality(
    translator: Translator, terminology: Terminology, lines: Sequence[SetLine], precision: str
) -> Quality:
    """The set decoded once with the glossary and once without, in the same batches; and
    its controls once more, without, in batches of their own (what batch mates change)."""
    tokenizer, engine = translator.tokenizer, translator.engine
    words = tokenizer.term_words()
    sources, terms = prepare(translator, terminology, lines)
    plain = decode(engine, words, sources, [None] * len(sources))
    constrained = decode(engine, words, sources, terms)
    controls = [i for i, line in enumerate(lines) if line.kind == "control"]
    alone = decode(engine, words, [sources[i] for i in controls], [None] * len(controls))
    plain_texts = [tokenizer.decode(h.tokens) for h in plain]
    constrained_texts = [tokenizer.decode(h.tokens) for h in constrained]
    kinds = [{lines[i].kind for i in batch} for batch in batches_of(sources)]
    sentences = []
    for i, found in enumerate(terms):
        if found is None:
            continue
        alignment = alignment_of(tokenizer, sources[i], plain[i])
        pieces = tokenizer.source_pieces(sources[i])
        term_words = [source_words_of(pieces, span) for span in found.spans]
        linked = [linked_words(alignment, source) for source in term_words]
        sentences.append(
            TermSentence(
                line=lines[i],
                sources=tuple(m.source for m in terminology.find(model_input(lines[i].text))),
                terms=found,
                plain=plain_texts[i],
                constrained=constrained_texts[i],
                replaced=replace_linked(
                    alignment.target_words, list(zip(linked, found.targets, strict=True))
                ),
                plain_rest=without_words(alignment.target_words, [w for ws in linked for w in ws]),
                plain_words=tuple(
                    plain_word(alignment, source, ws)
                    for source, ws in zip(term_words, linked, strict=True)
                ),
                linked=tuple(tuple(alignment.target_words[w] for w in ws) for ws in linked),
            )
        )
    return Quality(
        precision=precision,
        sentences=sentences,
        controls=len(controls),
        controls_same=sum(plain_texts[i] == constrained_texts[i] for i in controls),
        controls_alone_same=sum(
            plain[i].tokens == h.tokens for i, h in zip(controls, alone, strict=True)
        ),
        batches=len(kinds),
        mixed_batches=sum(len(k) == 2 for k in kinds),
    )


def plain_word(alignment: WordAlignment, source_words: set[int], linked: list[int]) -> str:
    """The plain translation's word for a term: of the words linked to its source words, the
    one that attends to them most, casefolded, punctuation off ("": none linked)."""
    if not linked:
        return ""
    best = max(linked, key=lambda t: sum(alignment.weights[t][s] for s in source_words))
    return _core(alignment.target_words[best])


def _core(word: str) -> str:
    return _EDGES.match(word).group(2).casefold()


def still_there(word: str, plain: str, output: str) -> bool:
    """Whether `word` is in `output` as often as in `plain` (the term did not take its
    place); never for "" (no word)."""
    if not word:
        return False

    def count(text: str) -> int:
        return sum(_core(w) == word for w in text.split())

    return count(output) >= count(plain)


@dataclass
class Speed:
    precision: str
    batches: int
    repeats: int
    plain: list[float] = field(default_factory=list)  # tokens/s, one per repetition
    constrained: list[float] = field(default_factory=list)
    plain_seconds: list[float] = field(default_factory=list)  # all batches, one repetition
    constrained_seconds: list[float] = field(default_factory=list)


def speed_batches(
    lines: Sequence[SetLine], count: int, seed: int = CONTROL_SEED
) -> list[list[int]]:
    """`count` batches of BATCH positions: CONSTRAINED_ROWS term lines and the rest controls
    each, drawn with a fixed seed (as many as the set holds)."""
    rng = random.Random(seed)
    term = [i for i, line in enumerate(lines) if line.kind == "term"]
    control = [i for i, line in enumerate(lines) if line.kind == "control"]
    rng.shuffle(term)
    rng.shuffle(control)
    others = BATCH - CONSTRAINED_ROWS
    count = min(count, len(term) // CONSTRAINED_ROWS, len(control) // others)
    return [
        term[k * CONSTRAINED_ROWS : (k + 1) * CONSTRAINED_ROWS]
        + control[k * others : (k + 1) * others]
        for k in range(count)
    ]


def measure_speed(
    translator: Translator,
    terminology: Terminology,
    lines: Sequence[SetLine],
    precision: str,
    batches: int = 4,
    repeats: int = 5,
) -> Speed:
    """Tokens/s of batches of 32 with a quarter of the rows constrained, against the same
    batches with no constraints, alternating which goes first; the engine should have one
    intra-op thread (the caller's EngineOptions)."""
    engine, words = translator.engine, translator.tokenizer.term_words()
    sources, terms = prepare(translator, terminology, lines)
    groups = speed_batches(lines, batches)
    options = SearchOptions(beam_size=BEAM)
    speed = Speed(precision, len(groups), repeats)

    def run(constrained: bool) -> tuple[float, int]:
        seconds, tokens = 0.0, 0
        for group in groups:
            chosen = [terms[i] if constrained else None for i in group]
            start = time.perf_counter()
            found = decode(engine, words, [sources[i] for i in group], chosen, options)
            seconds += time.perf_counter() - start
            tokens += sum(len(h.tokens) for h in found)
        return seconds, tokens

    run(False), run(True)  # warm-up
    for repeat in range(repeats):
        for constrained in (False, True) if repeat % 2 == 0 else (True, False):
            seconds, tokens = run(constrained)
            getattr(speed, "constrained" if constrained else "plain").append(tokens / seconds)
            name = "constrained_seconds" if constrained else "plain_seconds"
            getattr(speed, name).append(seconds)
    return speed


# The report.


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%} ({part}/{whole})" if whole else "-"


def examples(quality: Quality, count: int = EXAMPLES) -> list[TermSentence]:
    """Term lines that show the two methods apart, the first of each kind in the set's order
    among those where they differ: constrained decoding misses a term; the replacement
    misses one; constrained decoding writes a term next to the plain word; it goes on after
    the sentence; the replacement replaces more words than the term has; constrained decoding
    places a multi-word term cleanly. Then others, to `count`."""

    def all_kept(method: str) -> Callable[[TermSentence], bool]:
        return lambda s: s.kept(method) == len(s.terms.targets)

    def clean(s: TermSentence) -> bool:
        return (
            all_kept("constrained")(s) and not s.left("constrained") and not s.run_on("constrained")
        )

    kinds = [
        lambda s: not all_kept("constrained")(s),
        lambda s: not all_kept("replaced")(s),
        lambda s: s.left("constrained") > 0,
        lambda s: s.run_on("constrained") and all_kept("constrained")(s),
        lambda s: any(
            len(words) > len(target.split())
            for words, target in zip(s.linked, s.terms.targets, strict=True)
        ),
        lambda s: clean(s) and any(" " in target for target in s.terms.targets),
    ]
    differ = [s for s in quality.sentences if s.constrained != s.replaced]
    picks: list[TermSentence] = []
    for kind in kinds:
        found = next((s for s in differ if kind(s) and s not in picks), None)
        if found is not None:
            picks.append(found)
    picks += [s for s in differ if s not in picks]
    return picks[:count]


def markdown(
    qualities: list[Quality],
    speeds: list[Speed],
    terms: list[tuple[str, str]],
    pieces: dict[str, list[str]],
    shown: list[TermSentence],
) -> str:
    """The report: the setup and definitions, one column per precision, per term, examples.
    `pieces`: each target term's tokens, as the constraints hold them."""
    first = qualities[0]
    names = [q.precision for q in qualities]
    lines = opening(
        "Terminology: glossary terms enforced in decoding",
        "bench.terminology",
        f"; beam 4; running batches of {BATCH} lines sorted by length, made as the server's "
        "loop makes them (`running_batch` with the vocabulary's `term_words`)",
    )
    lines += [
        f"- test set: tests/data/terminology/ (how it is built: its README.md): {len(terms)} "
        f"glossary terms; {len(first.sentences)} lines of Multi30k's test_2016_flickr and "
        f"test_2017_flickr holding {first.pairs} (line, term) pairs, and "
        f"{first.controls} control lines holding none. Term and control lines shared "
        f"{first.mixed_batches} of the {first.batches} batches",
        "- **terms kept**: (line, term) pairs whose target term is in the translation, "
        "case-insensitively (`service.serving.terminology.kept`); target 98%",
        "- **controls identical**: control lines translated byte for byte as without the "
        "glossary (the same batches, the constrained lines decoded with their terms or "
        "without); target 100%. Next to it, for reference: the controls translated without "
        "any glossary in batches of controls only, against the same in the mixed batches "
        "(what a change of batch mates alone does)",
        "- **chrF of the rest**: sacrebleu chrF (corpus-level) of each term line's output with "
        "its target terms cut out, against its plain (no glossary) translation with the "
        "words cut out that the plain translation's word alignment (the service's: "
        "`service/serving/word_alignment.py`, last decoder layer, heads' mean, each target "
        "word to its best source word) links to the terms' source words. 100: nothing but the "
        "term changed. The replacement is made from those same links, so wherever it places a "
        "term its rest is the plain rest by construction: its number says only how often it "
        "placed none. The whole output against the whole plain translation is given too",
        "- **plain word left**: pairs where the plain translation's word for the term (of the "
        "words linked to the term's source words, the one attending to them most) is still in "
        "the output, with the target term cut out, as often as in the plain translation: the "
        'term was written next to it ("turf grass"), not instead',
        "- **gone on after the sentence**: term lines whose output has more sentence ends "
        "(`.`, `!`, `?`) than the plain translation",
        "- **replacement by alignment**, the alternative: the plain translation (beam 4), "
        "in which the words linked to a term's source words are replaced by the target term "
        "(the first of them; the others deleted, their punctuation kept; capitalized like the "
        "word it replaces); a term whose source words no target word is linked to is missing",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]

    def row(name: str, cells: Iterable[str]) -> None:
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    for method in METHODS:
        row(f"terms kept, {LABELS[method]}", (_share(q.kept(method), q.pairs) for q in qualities))
    row("controls identical", (_share(q.controls_same, q.controls) for q in qualities))
    row(
        "(controls identical, no glossary, batched with controls only)",
        (_share(q.controls_alone_same, q.controls) for q in qualities),
    )
    for method in METHODS:
        row(
            f"chrF of the rest, {LABELS[method]}", (f"{q.rest_chrf(method):.1f}" for q in qualities)
        )
    for method in METHODS:
        row(
            f"chrF of the whole output vs plain, {LABELS[method]}",
            (f"{q.whole_chrf(method):.1f}" for q in qualities),
        )
    for method in METHODS:
        row(
            f"plain word left, {LABELS[method]}",
            (_share(q.left(method), q.pairs) for q in qualities),
        )
    for method in METHODS:
        row(
            f"gone on after the sentence, {LABELS[method]}",
            (_share(q.run_on(method), len(q.sentences)) for q in qualities),
        )
    if speeds:
        lines += _speed_rows(speeds, names)
    lines += [
        "",
        "Per term: its tokens (as the constraint holds them), pairs, and pairs kept by "
        "constrained decoding / by the replacement; plain word left, constrained decoding:",
        "",
        "| source | target | tokens | pairs | "
        + " | ".join(f"kept, {n}" for n in names)
        + f" | left, {names[0]} |",
        "|---|---|---|---|" + "---|" * (len(names) + 1),
    ]
    tables = [per_term(q) for q in qualities]
    for source, target in terms:
        counts = [table.get((source, target), (0, 0, 0, 0)) for table in tables]
        cells = [f"{c[1]} / {c[2]}" for c in counts] + [str(counts[0][3])]
        tokens = " ".join(f"`{piece}`" for piece in pieces[target])
        lines.append(
            f"| {source} | {target} | {tokens} | {counts[0][0]} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        f"Examples ({first.precision}; each line is named, not quoted: Multi30k is not ours "
        "to copy):",
        "",
        "| line | terms | plain | constrained decoding | replacement by alignment |",
        "|---|---|---|---|---|",
    ]
    for s in shown:
        named = ", ".join(f"{a} → {b}" for a, b in zip(s.sources, s.terms.targets, strict=True))
        cells = [s.line.id, named, s.plain, s.constrained, s.replaced]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _speed_rows(speeds: list[Speed], names: list[str]) -> list[str]:
    by = {s.precision: s for s in speeds}

    def cells(value: Callable[[Speed], str]) -> str:
        return " | ".join("-" if by.get(n) is None else value(by[n]) for n in names)

    median = statistics.median
    some = speeds[0]
    return [
        f"| tokens/s, {CONSTRAINED_ROWS} of {BATCH} rows constrained | "
        + cells(lambda s: f"{median(s.constrained):,.0f}")
        + " |",
        "| tokens/s, the same batches, none constrained | "
        + cells(lambda s: f"{median(s.plain):,.0f}")
        + " |",
        "| time of the batches, constrained / none | "
        + cells(lambda s: f"{median(s.constrained_seconds) / median(s.plain_seconds):.2f}x")
        + " |",
        "",
        f"Speed: {some.batches} batches of {BATCH} lines of the set ({CONSTRAINED_ROWS} term "
        f"lines and {BATCH - CONSTRAINED_ROWS} controls each, drawn with a fixed seed), each "
        "decoded with its terms and without, in turn, which goes first alternating; one ONNX "
        "Runtime thread (`EngineOptions(intra_op_threads=1)`); median of "
        f"{some.repeats} runs; tokens: the best hypotheses' tokens, </s> not counted.",
    ]


def per_term(quality: Quality) -> dict[tuple[str, str], tuple[int, int, int, int]]:
    """(source, target) -> (pairs, kept by constrained decoding, kept by the replacement,
    plain word left by constrained decoding)."""
    counts: dict[tuple[str, str], list[int]] = {}
    for s in quality.sentences:
        rest = without_terms(s.constrained, s.terms.targets)
        for source, target, word in zip(s.sources, s.terms.targets, s.plain_words, strict=True):
            count = counts.setdefault((source, target), [0, 0, 0, 0])
            count[0] += 1
            count[1] += kept(s.constrained, [target])
            count[2] += kept(s.replaced, [target])
            count[3] += still_there(word, s.plain, rest)
    return {key: (a, b, c, d) for key, (a, b, c, d) in counts.items()}


def summary(qualities: list[Quality], speeds: list[Speed]) -> str:
    out = []
    for q in qualities:
        out.append(
            f"{q.precision}: terms kept {_share(q.kept('constrained'), q.pairs)} constrained, "
            f"{_share(q.kept('replaced'), q.pairs)} replaced; controls identical "
            f"{_share(q.controls_same, q.controls)}; chrF of the rest "
            f"{q.rest_chrf('constrained'):.1f} constrained, {q.rest_chrf('replaced'):.1f} replaced"
        )
    for s in speeds:
        out.append(
            f"{s.precision}: {statistics.median(s.constrained):,.0f} tokens/s with "
            f"{CONSTRAINED_ROWS} of {BATCH} rows constrained, {statistics.median(s.plain):,.0f} "
            "with none"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument(
        "--int8",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="int8 only (--int8) or fp32 only (--no-int8); default: both, side by side",
    )
    parser.add_argument("--data", type=Path, default=None, help="Multi30k's folder")
    parser.add_argument("--set-dir", type=Path, default=SET_DIR)
    parser.add_argument("--out", type=Path, default=BENCHMARKS, help="markdown page to update")
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads of the quality runs (0: all)"
    )
    parser.add_argument("--speed-batches", type=int, default=6, help="batches timed (0: none)")
    parser.add_argument("--speed-repeats", type=int, default=7, help="timed runs of each")
    parser.add_argument(
        "--lines", type=int, default=0, help="only the first N term and N control lines (0: all)"
    )
    parser.add_argument(
        "--build-set",
        action="store_true",
        help="make terms.tsv and sentences.tsv in --set-dir from its candidates.tsv, and stop",
    )
    args = parser.parse_args(argv)
    data = args.data or multi30k_dir()
    if not (data / f"{SPLITS[0]}.fr").is_file():
        raise SystemExit(f"Multi30k not found at {data} (set NMT_DATA_DIR, or --data)")
    if args.build_set:
        candidates = read_terms(args.set_dir / "candidates.tsv")
        built = build_set(candidates, data, args.bundle, args.threads)
        write_terms(args.set_dir / "terms.tsv", built.terms)
        write_set(args.set_dir / "sentences.tsv", built.lines)
        count = sum(line.kind == "term" for line in built.lines)
        print(f"{len(built.terms)} terms, {count} term lines, {len(built.lines) - count} controls")
        for source, target, why in built.dropped:
            print(f"dropped {source} -> {target}: {why}")
        return
    terms = read_terms(args.set_dir / "terms.tsv")
    terminology = Terminology(terms)
    lines = read_set(args.set_dir / "sentences.tsv", data)
    if args.lines:
        lines = [x for x in lines if x.kind == "term"][: args.lines] + [
            x for x in lines if x.kind == "control"
        ][: args.lines]
    bundle = load_bundle(args.bundle)
    qualities, speeds = [], []
    for int8 in [False, True] if args.int8 is None else [args.int8]:
        precision = "int8" if int8 else "fp32"
        translator = Translator(bundle, EngineOptions(int8=int8, intra_op_threads=args.threads))
        qualities.append(measure_quality(translator, terminology, lines, precision))
        print(summary(qualities[-1:], []), flush=True)
        if args.speed_batches:
            single = Translator(bundle, EngineOptions(int8=int8, intra_op_threads=1))
            speed = measure_speed(
                single, terminology, lines, precision, args.speed_batches, args.speed_repeats
            )
            speeds.append(speed)
            print(summary([], [speed]), flush=True)
    tokenizer = translator.tokenizer  # (any precision's: they share the bundle)
    pieces = {t: tokenizer.target_pieces(tokenizer.encode_target(t)) for _, t in terms}
    report = markdown(qualities, speeds, terms, pieces, examples(qualities[0]))
    replace_section("terminology", report, args.out)
    print(f"wrote the terminology section of {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
