"""Markup (LibreTranslate `format=html`, DeepL `tag_handling`): parsing, tag placement with
fake alignments (no model), and the real model through the app on the hand-written cases of
tests/data/markup/cases.jsonl and on request bodies shaped as Mastodon, Discourse, Weblate and
Nextcloud send them.

What must always hold, whatever the alignment: the output parses, holds the same multiset of
start tags as the input (attribute values byte for byte), and copies untranslated elements
and comments byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import NoReturn
from xml.etree import ElementTree

import pytest
from fastapi.testclient import TestClient

from service.documents import markup
from service.documents.markup import MarkupError, MarkupOptions, SentenceTranslation
from service.runtime.search import SearchOptions
from service.serving.errors import SentenceTooLong, ServiceError, TranslationFailed
from service.serving.settings import Settings
from service.serving.word_alignment import WordAlignment
from tests.conftest import ROOT
from tests.http.in_process import start

CASES = [
    json.loads(line)
    for line in (ROOT / "tests/data/markup/cases.jsonl").read_text().splitlines()
    if line.strip()
]
HTML = MarkupOptions(kind="html")
XML = MarkupOptions(kind="xml", split="sentences")


# --- Checks that do not use the module under test ------------------------------------------


class _Balance(HTMLParser):
    """Reads HTML with the standard library's parser: the start tags as written, and whether
    every element that needs an end tag gets its own, properly nested."""

    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.starts: list[str] = []
        self.parents: list[tuple[str, str]] = []  # (start tag, its parent's start tag or "")
        self.comments: list[str] = []
        self.stack: list[str] = []
        self.open: list[str] = []  # the start tags of self.stack
        self.balanced = True

    def handle_starttag(self, tag: str, attrs: object) -> None:
        start = self.get_starttag_text() or ""
        self.starts.append(start)
        self.parents.append((start, self.open[-1] if self.open else ""))
        if tag not in self.VOID:
            self.stack.append(tag)
            self.open.append(start)

    def handle_startendtag(self, tag: str, attrs: object) -> None:
        start = self.get_starttag_text() or ""
        self.starts.append(start)
        self.parents.append((start, self.open[-1] if self.open else ""))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.balanced = False
        elif self.open:
            self.open.pop()

    def handle_comment(self, data: str) -> None:
        self.comments.append(data)


def read_html(text: str) -> _Balance:
    checker = _Balance()
    checker.feed(text)
    checker.close()
    return checker


def assert_same_markup(source: str, output: str) -> None:
    """Well-formed, the same start tags (byte for byte, as a multiset), each inside the same
    parent, and the same comments."""
    got, want = read_html(output), read_html(source)
    assert got.balanced and not got.stack, output
    assert Counter(got.starts) == Counter(want.starts), output
    assert Counter(got.parents) == Counter(want.parents), output
    assert Counter(got.comments) == Counter(want.comments), output


def untranslated(text: str) -> list[str]:
    """The source text of the elements a translation must copy as they are (translate="no",
    class="notranslate", code), as they stand in `text`."""
    found = []

    def walk(element: markup.Element) -> None:
        for node in element.children:
            if not isinstance(node, markup.Element):
                continue
            attrs = node.attrs
            if (
                attrs.get("translate") == "no"
                or node.name == "code"
                or ("notranslate" in attrs.get("class", "").split())
            ):
                found.append(markup.verbatim(node))
            else:
                walk(node)

    walk(markup.parse(text, "html"))
    return found


def assert_copied(source: str, output: str) -> None:
    for raw in untranslated(source):
        assert output.count(raw) == source.count(raw), (raw, output)


# --- Fake translations: a target sentence and which source word each target word is from ----


def fake(source: str, target: str, links: list[int], weights: list[list[float]] | None = None):
    """A translation whose hard alignment is `links` (target word -> source word), with all
    of each target word's attention on that word unless `weights` says otherwise."""
    source_words, target_words = source.split(), target.split()
    assert len(links) == len(target_words)
    if weights is None:
        weights = [[float(s == link) for s in range(len(source_words))] for link in links]
    pairs = [(link, t) for t, link in enumerate(links)]
    return SentenceTranslation(target, WordAlignment(source_words, target_words, weights, pairs))


def write(text: str, *translations: SentenceTranslation, options: MarkupOptions = HTML) -> str:
    documents = markup.read([text], options)
    sentences, _ = markup.model_sentences(documents)
    assert len(sentences) == len(translations), sentences
    return markup.write(documents, list(translations))[0]


def test_a_tag_goes_around_the_words_aligned_to_what_it_wrapped():
    source = "Un homme en chemise bleue marche."
    links = [0, 1, 2, 4, 4, 3, 5]
    weights = [[float(s == link) for s in range(6)] for link in links]
    weights[3] = [0.1, 0, 0.3, 0, 0.6, 0]  # "a" looks at "bleue" most, but less than "blue"
    output = write(
        "Un homme en chemise <b>bleue</b> marche.",
        fake(source, "A man in a blue shirt walks.", links, weights),
    )
    # "a" is aligned to "bleue" too, but "bleue" attends most to "blue": "a" stays outside.
    assert output == "A man in a <b>blue</b> shirt walks."


def test_a_target_word_another_source_word_claims_stays_outside():
    # "the" attends to "rue" most, but "la" attends to "the" most: it is la's.
    weights = [[0, 0, 0.4, 0.6], [0, 0, 0, 1.0]]
    weights = [[1.0, 0, 0, 0], [0, 1.0, 0, 0], *weights]
    output = write(
        "Il marche dans la <b>rue</b>.",
        fake("Il marche dans la rue.", "He walks the street.", [0, 1, 3, 3], weights),
    )
    assert output == "He walks the <b>street</b>."


def test_at_the_sentence_end_unclaimed_words_stay_with_the_tag():
    # "glace" attends most to "ice"; "cream" is aligned to it and no word claims it.
    output = write(
        "Elle mange une <i>glace</i>.",
        fake("Elle mange une glace.", "She eats an ice cream.", [0, 1, 2, 3, 3]),
    )
    assert output == "She eats an <i>ice cream</i>."


def test_reordered_neighbours_and_nested_tags_follow_their_words():
    source = "Un chapeau noir et une cuisine moderne."
    output = write(
        "Un <b>chapeau <i>noir</i></b> et une <u>cuisine</u> <s>moderne</s>.",
        fake(source, "A black hat and a modern kitchen.", [0, 2, 1, 3, 4, 6, 5]),
    )
    assert output == "A <b><i>black</i> hat</b> and a <s>modern</s> <u>kitchen</u>."


def test_punctuation_is_inside_a_tag_only_where_the_source_had_it_inside():
    output = write(
        "<b>Un chat dort.</b> Un <i>chien</i> <em>court</em> !",
        fake("Un chat dort.", "A cat sleeps.", [0, 1, 2]),
        fake("Un chien court !", "A dog runs!", [0, 1, 2]),
    )
    assert output == "<b>A cat sleeps.</b> A <i>dog</i> <em>runs</em>!"


def test_without_an_alignment_tags_keep_their_relative_place():
    sentence = SentenceTranslation("A man is walking in the street.", None)
    output = write("Un homme marche dans la <b>rue</b>.", sentence)
    assert_same_markup("<b>x</b>", output)
    assert output.endswith("<b>street</b>.")  # the last word for the last word


def test_crossing_alignments_still_nest_and_keep_every_tag_once():
    # b wraps the first two source words, i the last two; the alignment interleaves them.
    source = "un deux trois quatre"
    output = write(
        "<b>un deux</b> <i>trois quatre</i>",
        fake(source, "ONE THREE TWO FOUR", [0, 2, 1, 3]),
    )
    assert_same_markup("<b>x</b><i>y</i>", output)
    assert output.replace("<b>", "").replace("</b>", "").replace("<i>", "").replace("</i>", "") == (
        "ONE THREE TWO FOUR"
    )


def test_side_by_side_tags_stay_side_by_side_whatever_the_alignment():
    """Two links whose words the alignment mixes: each keeps its own words it can, neither goes
    inside the other (a link inside a link is not HTML, and the second would change parent)."""
    source = "Un homme marche."
    output = write(
        '<a href="/1">Un homme</a><a href="/2">marche.</a>',
        fake(source, "A man is walking.", [0, 2, 1, 2]),
    )
    assert_same_markup('<a href="/1">x</a><a href="/2">y</a>', output)
    assert "</a></a>" not in output


def test_points_keep_their_place_and_their_spacing():
    output = write(
        "Un homme <img src='a.png'> marche.<br>Il pleut.",
        fake("Un homme marche.", "A man walks.", [0, 1, 2]),
        fake("Il pleut.", "It rains.", [0, 1]),
    )
    assert output == "A man <img src='a.png'> walks.<br>It rains."
    glued = write(
        "Un homme<br/> marche.", fake("Un homme", "A man", [0, 1]), fake("marche.", "walks.", [0])
    )
    assert glued == "A man<br/> walks."


def test_untranslated_elements_comments_and_attributes_are_copied_byte_for_byte():
    text = (
        '<p title="Un &amp; deux">Un <a href="/x?a=1&amp;b=2" class=\'l\'>chat</a> '
        '<span translate="no">Félix &lt;3</span> <!-- note --> dort '
        '<code>x &amp;&amp; y</code> <span class="notranslate">ici</span>.</p>'
    )
    source = "Un chat dort ."
    output = write(text, fake(source, "A cat sleeps .", [0, 1, 2, 3]))
    for kept in (
        '<p title="Un &amp; deux">',
        "<a href=\"/x?a=1&amp;b=2\" class='l'>",
        '<span translate="no">Félix &lt;3</span>',
        "<!-- note -->",
        "<code>x &amp;&amp; y</code>",
        '<span class="notranslate">ici</span>',
    ):
        assert kept in output
    assert_same_markup(text, output)


def test_an_untranslated_element_in_a_sentence_is_read_by_the_model_and_copied():
    # The model reads "Adidas" (a sentence without it reads wrong), and the element takes the
    # place of the words aligned to it.
    kept = '<p translate="no">Un chat.</p>'
    output = write(
        kept + '<p>Un homme en veste <span translate="no">Adidas</span>.</p>',
        fake("Un homme en veste Adidas.", "A man in an Odidos jacket.", [0, 1, 2, 3, 4, 3]),
    )
    assert output == kept + '<p>A man in an <span translate="no">Adidas</span> jacket.</p>'


def test_a_block_left_untranslated_stays_apart_from_the_text_around_it():
    text = '<div>Un chat dort. <p translate="no">Non traduit.</p> Un chien court.</div>'
    documents = markup.read([text], HTML)
    assert markup.model_sentences(documents)[0] == ["Un chat dort.", "Un chien court."]
    output = markup.write(
        documents,
        [
            fake("Un chat dort.", "A cat sleeps.", [0, 1, 2]),
            fake("Un chien court.", "A dog runs.", [0, 1, 2]),
        ],
    )[0]
    assert output == '<div>A cat sleeps. <p translate="no">Non traduit.</p> A dog runs.</div>'


def test_entities_are_read_as_text_and_written_escaped():
    documents = markup.read(["Un chat &amp; un chien &lt;3 &eacute;t&#233;."], HTML)
    assert markup.model_sentences(documents)[0] == ["Un chat & un chien <3 été."]
    output = markup.write(
        documents,
        [fake("Un chat & un chien <3 été.", "A cat & a dog <3 summer.", [0, 1, 2, 3, 4, 5, 6])],
    )[0]
    assert output == "A cat &amp; a dog &lt;3 summer."


def test_blocks_stay_in_place_and_are_translated_apart():
    documents = markup.read(
        ["<div><h1>Un titre</h1><p>Un chat <b>dort</b>.</p><ul><li>Un<li>Deux</ul></div>"], HTML
    )
    assert markup.model_sentences(documents)[0] == ["Un titre", "Un chat dort.", "Un", "Deux"]
    output = markup.write(
        documents,
        [
            fake("Un titre", "A title", [0, 1]),
            fake("Un chat dort.", "A cat sleeps.", [0, 1, 2]),
            fake("Un", "One", [0]),
            fake("Deux", "Two", [0]),
        ],
    )[0]
    assert output == (
        "<div><h1>A title</h1><p>A cat <b>sleeps</b>.</p><ul><li>One</li><li>Two</li></ul></div>"
    )


def test_html_is_read_as_browsers_read_it():
    documents = markup.read(["<p>Un <b>chat</i> dort</p></div>"], HTML)
    output = markup.write(documents, [fake("Un chat dort", "A cat sleeps", [0, 1, 2])])[0]
    assert output == "<p>A <b>cat sleeps</b></p>"  # the stray ends dropped, b closed with p


def test_source_text_round_trips_through_the_parser():
    for text in [case["source"] for case in CASES] + [
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><p>a</p></body></html>',
        "<p>a &amp; b &nbsp; <br/> <?php x ?> <![CDATA[y]]></p>",
        "<script>if (a < b && c) { x = '</p>'; }</script>text",
    ]:
        assert markup.verbatim(markup.parse(text, "html")) == text
    xml = '<doc a="&lt;1&gt;"><x id="1"/> é &amp; <![CDATA[<raw>]]><!-- c --><?pi x?></doc>'
    assert markup.verbatim(markup.parse(xml, "xml")) == xml


@pytest.mark.parametrize(
    "text",
    ["Un <b>chat", "<a></b>", "Un &nbsp; chat", "<a x='1' x='2'/>", '<?xml version="1.0"?><a/>'],
)
def test_xml_that_cannot_be_read_is_a_markup_error(text: str):
    with pytest.raises(MarkupError):
        markup.read([text], XML)


def test_markup_nested_too_deep_is_refused():
    deep = "<b>" * (markup.MAX_DEPTH + 1) + "x"
    for options in (HTML, XML):
        with pytest.raises(MarkupError, match="nested"):
            markup.read([deep + "</b>" * (markup.MAX_DEPTH + 1)], options)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("Bonjour <script>alert(1) le monde", "<script> at line 1, column 9"),
        ("<p>Un chat</p>\n<p>Un <style>b { color: red } chien.</p>", "<style> at line 2, column 7"),
    ],
)
def test_a_script_or_style_never_closed_is_refused_not_half_read(text: str, where: str):
    """A browser reads everything after an unclosed <script> as script; html.parser drops it.
    Either way no text after it would be translated: refused, naming the tag and its place."""
    with pytest.raises(MarkupError, match="is never closed") as raised:
        markup.read([text], HTML)
    assert str(raised.value).startswith(where)
    closed = text.replace("alert(1)", "alert(1)</script>").replace("} ", "}</style> ")
    assert markup.verbatim(markup.parse(closed, "html")) == closed  # closed: read in full


def test_xml_structure_ignore_and_splitting_tags():
    text = (
        "<doc><meta><title>Un titre</title></meta><body><par>Un chat. Un <x>chien</x>.</par>"
        "<par>Un <ph id='1'/> oiseau.</par></body></doc>"
    )
    # Outline detection: title and par hold text inside elements that hold none. The model
    # reads what x holds, but x is copied as it is.
    documents = markup.read([text], MarkupOptions(kind="xml", ignore_tags=frozenset({"x"})))
    assert markup.model_sentences(documents)[0] == [
        "Un titre",
        "Un chat.",
        "Un chien.",
        "Un  oiseau.",
    ]
    # Without it, only splitting_tags split: everything is one run.
    flat = MarkupOptions(kind="xml", outline_detection=False)
    assert markup.model_sentences(markup.read([text], flat))[0] == [
        "Un titreUn chat.",
        "Un chien.Un  oiseau.",
    ]
    some = MarkupOptions(kind="xml", outline_detection=False, splitting_tags=frozenset({"par"}))
    assert markup.model_sentences(markup.read([text], some))[0] == [
        "Un titre",
        "Un chat.",
        "Un chien.",
        "Un  oiseau.",
    ]


def test_sentence_offsets_cut_as_the_pipeline_cuts():
    text = "  Un chat dort. Il pleut !\nDeux chiens…  Trois."
    for mode in ("sentences", "no_newlines", "none"):
        found = markup.sentences(text, mode)
        assert all(text[a:b] == text[a:b].strip() for a, b in found)
        assert " ".join(text[a:b] for a, b in found).split() == text.split()
    assert len(markup.sentences(text, "sentences")) == 4
    assert len(markup.sentences(text, "none")) == 1


def random_markup(rng: random.Random) -> str:
    """A sentence of caption words with random inline tags, nested, void, ignored."""
    words = ["un", "homme", "en", "chemise", "bleue", "marche", "dans", "la", "rue", "avec"]
    parts: list[str] = []
    open_tags: list[str] = []
    for word in rng.sample(words, rng.randint(2, len(words))):
        roll = rng.random()
        if roll < 0.25:
            tag = rng.choice(["b", "i", "em", "a", "span"])
            parts.append(f'<{tag} data-n="{rng.randint(0, 9)}&amp;x">')
            open_tags.append(tag)
        elif roll < 0.35 and open_tags:
            parts.append(f"</{open_tags.pop()}>")
        elif roll < 0.42:
            parts.append(rng.choice(["<br>", "<img src='i.png'>", "<!-- c -->"]))
        elif roll < 0.47:
            parts.append('<span translate="no">X &amp; Y</span>')
        parts.append(word + rng.choice([" ", " ", "", ". "]))
    parts.extend(f"</{tag}>" for tag in reversed(open_tags))
    return "".join(parts)


def test_random_markup_and_random_alignments_always_give_well_formed_output():
    rng = random.Random(12)
    for _ in range(300):
        text = random_markup(rng)
        documents = markup.read([text], HTML)
        sentences, _ = markup.model_sentences(documents)
        translations = []
        for sentence in sentences:
            count = len(sentence.split())
            target = [w.upper() for w in sentence.split()]
            rng.shuffle(target)
            target = target[: rng.randint(1, count)] + ["EXTRA"] * rng.randint(0, 2)
            links = [rng.randrange(count) for _ in target]
            translations.append(
                fake(sentence, " ".join(target), links) if rng.random() < 0.9 else
                SentenceTranslation(" ".join(target), None)
            )  # fmt: skip
        output = markup.write(documents, translations)[0]
        assert_same_markup(text, output)
        assert_copied(text, output)


JUNK = [
    "<", ">", "&", ";", "</", "/>", "<b>", "</b>", "<i>", "</i>", "<br>", "<p>", "</p>", "<!--",
    "-->", "<![CDATA[", "]]>", "<?", "&amp;", "&#", "x", "chat", " ", "\n", ".", "<a href='",
    '"', "<script>", "</script>", "<span translate=no>", "</span>", "<li>", "<td>", "é", "<b",
    "<x/>", "<!DOCTYPE html>", "\r\n", "=", "Un homme", " marche. ", "<svg><path d='x'/></svg>",
]  # fmt: skip


def test_junk_never_breaks_the_reader_nor_the_writer():
    """Any text at all: HTML is read (as browsers would, or refused only for a script left
    open), XML read or refused; what is written is well-formed and holds the start tags the
    reader found."""
    rng = random.Random(5)
    for _ in range(1000):
        text = "".join(rng.choice(JUNK) for _ in range(rng.randint(0, 25)))
        with contextlib.suppress(MarkupError):
            markup.read([text], XML)
        try:
            documents = markup.read([text], HTML)
        except MarkupError as error:
            assert "<script> at line" in str(error) and "is never closed" in str(error)
            continue
        translations = []
        for sentence in markup.model_sentences(documents)[0]:
            words = sentence.split()
            links = [rng.randrange(len(words)) for _ in words]
            translations.append(fake(sentence, sentence.upper(), links))
        output = markup.write(documents, translations)[0]
        assert_same_markup(markup.verbatim(markup.parse(text, "html")), output)


class _Refusing:
    """A pipeline that refuses the texts it is sent with the given error."""

    def __init__(self, error: ServiceError) -> None:
        self.error = error
        self.texts: list[str] = []

    async def translate(
        self, model: object, texts: list[str], *_: object, **__: object
    ) -> NoReturn:
        self.texts = texts
        raise self.error


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            SentenceTooLong(2, 300, 256, sentence=1),
            "text[1] holds a sentence of 300 tokens; the limit is 256 tokens per sentence "
            "(NMT_MAX_TOKENS_PER_SENTENCE): split it into shorter sentences",
        ),
        (
            TranslationFailed(2, "onnxruntime failed"),
            "the engine could not translate text[1]: onnxruntime failed",
        ),
    ],
    ids=["sentence-too-long", "translation-failed"],
)
def test_an_error_of_the_pipeline_names_the_clients_text(error: ServiceError, message: str):
    """Markup sends the pipeline one text per sentence: the error it gets back names the
    pipeline's text 2, which is the client's text 1; the answer must name text 1."""
    texts = ["<p>Un chat.</p>", "<p>Un chien.</p><p>Un <b>grand</b> chat.</p>"]
    service, documents = _Refusing(error), markup.read(texts, HTML)
    with pytest.raises(type(error)) as raised:
        asyncio.run(markup.translate(service, None, documents, SearchOptions()))
    assert service.texts == ["Un chat.", "Un chien.", "Un grand chat."]
    assert str(raised.value) == message and raised.value.__cause__ is error
    assert raised.value.text_index == 1
    if isinstance(raised.value, SentenceTooLong):
        assert raised.value.location == ("body", "text", 1)


# --- The real model, through the app --------------------------------------------------------


@pytest.fixture(scope="module")
def client(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("models")
    (folder / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    settings = {"threads": 1, "default_beam_size": 2, "max_texts_per_request": 200}
    client = start(Settings(model_dir=folder, **settings))
    yield client
    client.__exit__(None, None, None)


def libre(client: TestClient, q: str | list[str], **fields: object) -> dict:
    body = {"q": q, "source": "fr", "target": "en", "format": "html", **fields}
    answer = client.post("/translate", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_every_hand_written_case_keeps_its_markup(client: TestClient):
    sources = [case["source"] for case in CASES]
    translated = libre(client, sources)["translatedText"]
    for source, output in zip(sources, translated, strict=True):
        assert_same_markup(source, output)
        assert_copied(source, output)
        assert read_html(output).starts  # every case has tags
        assert output != source  # and was translated


def test_the_placement_finds_the_reference_words_more_often_than_position_alone(
    client: TestClient,
):
    """The measure bench/markup_quality.py reports, with a margin: the alignment puts more
    than half of the tags on the reference's words, and beats the relative position."""
    from bench.markup_quality import Score

    sources = [case["source"] for case in CASES]
    translated = libre(client, sources)["translatedText"]
    documents = markup.read(sources, HTML)
    sentences, _ = markup.model_sentences(documents)
    plain = client.post(
        "/v1/translate",
        json={"text": sentences, "source_lang": "fr", "target_lang": "en", "beam_size": 2},
    ).json()["translations"]
    diagonal = markup.write(documents, [SentenceTranslation(t["text"], None) for t in plain])
    ours, baseline = Score(), Score()
    for case, output, positional in zip(CASES, translated, diagonal, strict=True):
        ours.add(output, case["reference"])
        baseline.add(positional, case["reference"])
    assert ours.same > ours.tags / 2
    assert ours.same > baseline.same + ours.tags / 10


def test_markup_and_plain_text_get_the_same_translation(client: TestClient):
    plain = client.post(
        "/translate", json={"q": "Un chat dort sur un canapé.", "source": "fr", "target": "en"}
    ).json()["translatedText"]
    tagged = libre(client, "Un <b>chat</b> dort sur un canapé.")["translatedText"]
    assert tagged.replace("<b>", "").replace("</b>", "") == plain


def test_text_with_nothing_to_translate_comes_back_as_it_was(client: TestClient):
    for text in ["<p>42</p> <br> <!-- x -->", "<b>  </b>", "<img src=a.png>", "<i>:-)</i>"]:
        assert libre(client, text)["translatedText"] == text


def test_alternatives_with_html_are_empty_and_detection_reads_the_text(client: TestClient):
    text = '<a href="/the/english/page" title="Read this">Un homme</a> fait du vélo dans la rue.'
    body = libre(client, [text], alternatives=2, source="auto")
    assert body["alternatives"] == [[]]
    assert body["detectedLanguage"][0]["language"] == "fr"


@pytest.mark.parametrize(
    "text",
    [
        "<p>Un homme <b>marche <i>dans</b> la rue.",  # unclosed and misnested
        "</div></p>Un chat dort.<p>",  # stray end tags
        "<p>Un chien court <a href='https://exemple.fr/a?b=1",  # cut inside a tag
        "<<>>Un chat & un chien <3 <b>",
        "<table><tr><td>Un chat<td>Un chien</table>",
    ],
)
def test_bad_html_gets_a_well_formed_answer(client: TestClient, text: str):
    output = libre(client, text)["translatedText"]
    assert read_html(output).balanced and not read_html(output).stack


def test_a_sentence_too_long_is_a_400_naming_the_text(client: TestClient):
    texts = ["<p>Un chat.</p>", "<p>Un chien.</p><p>Un " + "très " * 300 + "<b>grand</b> chat.</p>"]
    answer = client.post(
        "/translate", json={"q": texts, "source": "fr", "target": "en", "format": "html"}
    )
    assert answer.status_code == 400  # the pipeline's text[2] is the client's text[1]
    error = answer.json()["error"]
    assert error.startswith("Invalid request: text[1] holds a sentence of "), error
    assert "tokens per sentence (NMT_MAX_TOKENS_PER_SENTENCE)" in error
    assert "sentence 1" not in error  # the pipeline's numbering, not the client's
    answer = client.post(
        "/v2/translate", json={"text": texts, "target_lang": "EN-GB", "tag_handling": "html"}
    )
    assert answer.status_code == 400
    assert answer.json()["message"].startswith("text[1] holds a sentence of ")


def test_markup_nested_too_deep_is_a_400_in_each_dialect(client: TestClient):
    deep = "<b>" * 150 + "Un chat." + "</b>" * 150
    answer = client.post(
        "/translate", json={"q": deep, "source": "fr", "target": "en", "format": "html"}
    )
    assert answer.status_code == 400
    assert "nested" in answer.json()["error"]
    answer = client.post(
        "/v2/translate", json={"text": [deep], "target_lang": "EN-GB", "tag_handling": "html"}
    )
    assert answer.status_code == 400
    assert answer.json()["message"].startswith("Tag handling parsing failed")


def test_an_unclosed_script_is_a_400_naming_it_in_each_dialect(client: TestClient):
    """The text after `<script>` was silently dropped ("Bonjour <script>alert(1) le monde"
    came back as "Hello <script></script>"): now each dialect says why it cannot translate."""
    text = "Bonjour <script>alert(1) le monde"
    answer = client.post(
        "/translate", json={"q": text, "source": "fr", "target": "en", "format": "html"}
    )
    assert answer.status_code == 400
    assert answer.json() == {
        "error": "Invalid request: <script> at line 1, column 9 is never closed: everything "
        "after it would be script content, not text; close it with </script>"
    }
    answer = client.post(
        "/v2/translate", data={"text": text, "target_lang": "EN-GB", "tag_handling": "html"}
    )
    assert answer.status_code == 400
    message = answer.json()["message"]
    assert message.startswith("Tag handling parsing failed") and "<script>" in message
    assert "never closed" in message
    closed = libre(client, "Bonjour <script>alert(1)</script> le monde")["translatedText"]
    assert closed.count("<script>alert(1)</script>") == 1 and not closed.endswith("</script>")


# --- Request bodies as the connectors send them ---------------------------------------------

MASTODON_STATUS = (
    '<p>Un chien <a href="https://masto.exemple/tags/chien" class="mention hashtag" '
    'rel="tag">#<span>chien</span></a> court dans la neige avec '
    '<span class="h-card" translate="no"><a href="https://masto.exemple/@alice" '
    'class="u-url mention">@<span>alice</span></a></span>.</p>'
    "<p>Il fait très <strong>froid</strong>.</p>"
)


def test_mastodon_libretranslate_json_with_format_html(client: TestClient):
    """Mastodon's LibreTranslate service: JSON, q the status HTML, source or "auto"."""
    body = {"q": MASTODON_STATUS, "source": "auto", "target": "en", "format": "html", "api_key": ""}
    answer = client.post("/translate", json=body)
    assert answer.status_code == 200, answer.text
    output = answer.json()["translatedText"]
    assert_same_markup(MASTODON_STATUS, output)
    assert_copied(MASTODON_STATUS, output)  # the mention, as it was
    assert output.startswith("<p>") and "</p><p>" in output and "cold" in output


def test_mastodon_deepl_form_with_tag_handling_html(client: TestClient):
    """Mastodon's DeepL service: a form, `text` repeated, tag_handling=html."""
    form = {
        "text": [MASTODON_STATUS, "<p>Un chat dort.</p>"],
        "source_lang": "FR",
        "target_lang": "en",
        "tag_handling": "html",
    }
    answer = client.post("/v2/translate", data=form)
    assert answer.status_code == 200, answer.text
    first, second = (t["text"] for t in answer.json()["translations"])
    assert_same_markup(MASTODON_STATUS, first)
    assert second.startswith("<p>") and second.endswith("</p>") and "cat" in second


def test_discourse_form_with_format_html(client: TestClient):
    """discourse-translator's LibreTranslate provider: a urlencoded form with q (the cooked
    post, cut at 5000 characters), source, target, format=html and api_key."""
    cooked = (
        '<p>Un homme fait du vélo dans la rue.</p>\n<aside class="quote"><blockquote><p>Une '
        "femme lit un livre.</p></blockquote></aside>\n"
        "<pre><code class=\"lang-python\">print('bonjour')\n</code></pre>\n"
        "<p>Deux enfants jouent <em>au ballon</em> sur la plage.</p>"
    )
    form = {"q": cooked, "source": "fr", "target": "en", "format": "html", "api_key": ""}
    answer = client.post("/translate", data=form)
    assert answer.status_code == 200, answer.text
    output = answer.json()["translatedText"]
    assert_same_markup(cooked, output)
    assert "<code class=\"lang-python\">print('bonjour')\n</code>" in output
    assert "bicycle" in output or "bike" in output
    cut = client.post("/translate", data={**form, "q": cooked[:90]})  # cut inside a tag
    assert cut.status_code == 200 and read_html(cut.json()["translatedText"]).balanced


def test_nextcloud_multipart_with_format_html(client: TestClient):
    """Nextcloud's integration_libretranslate (through the jefs42/libretranslate PHP client):
    curl with an array of fields, that is a multipart body, format=html."""
    fields = {"q": "Un chat <b>noir</b> dort.", "format": "html", "source": "fr", "target": "en"}
    answer = client.post("/translate", data=fields, files={"unused": ("a.txt", b"ignored")})
    assert answer.status_code == 200, answer.text
    assert "<b>black</b>" in answer.json()["translatedText"]


def test_weblate_deepl_json_with_xml_placeholders(client: TestClient):
    """Weblate's DeepL machinery: JSON, tag_handling=xml, ignore_tags=["x"], its placeables
    as empty <x id="..."></x> elements."""
    texts = ['Un homme <x id="9"></x> marche dans la rue.', 'Deux chiens <x id="12"></x>.']
    body = {
        "text": texts,
        "source_lang": "FR",
        "target_lang": "EN-US",
        "formality": "default",
        "tag_handling": "xml",
        "ignore_tags": ["x"],
    }
    answer = client.post("/v2/translate", json=body)
    assert answer.status_code == 200, answer.text
    for source, result in zip(texts, answer.json()["translations"], strict=True):
        output = result["text"]
        ElementTree.fromstring(f"<r>{output}</r>")  # well-formed XML
        placeholder = source[source.index("<x") : source.index("</x>") + 4]
        assert output.count(placeholder) == 1
    assert answer.json()["translations"][0]["text"].startswith("A man")


def test_deepl_xml_it_cannot_read_is_its_400(client: TestClient):
    body = {"text": ["Un <b>chat dort."], "target_lang": "EN-GB", "tag_handling": "xml"}
    answer = client.post("/v2/translate", json=body)
    assert answer.status_code == 400
    assert answer.json()["message"].startswith("Tag handling parsing failed, please check input.")
    for field, value in [("tag_handling", "json"), ("outline_detection", "maybe")]:
        answer = client.post("/v2/translate", json={**body, field: value})
        assert answer.status_code == 400
        assert field in answer.json()["message"]


def test_deepl_xml_document_keeps_its_structure(client: TestClient):
    document = (
        "<document>\n  <meta><title>Un chat</title></meta>\n  <content>\n"
        "    <par>Un chien court. Une femme <b>marche</b>.</par>\n    <par>Il pleut.</par>\n"
        "  </content>\n</document>"
    )
    body = {
        "text": [document],
        "target_lang": "EN-GB",
        "tag_handling": "xml",
        "split_sentences": "nonewlines",
    }
    output = client.post("/v2/translate", json=body).json()["translations"][0]["text"]
    tree = ElementTree.fromstring(output)
    assert [e.tag for e in tree.iter()] == [
        "document",
        "meta",
        "title",
        "content",
        "par",
        "b",
        "par",
    ]
    assert output.startswith("<document>\n  <meta><title>") and output.endswith("</document>")
    assert "cat" in tree.find("meta/title").text.lower()  # type: ignore[union-attr]
