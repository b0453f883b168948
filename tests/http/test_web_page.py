"""The web page (`GET /`) in a real browser: headless Chromium (Debian's `chromium` package)
driven by Playwright, against a real `nmt serve` process.

What a person does with it: read what the model is for, type French, translate, read the
English, see how sure the model was of it and of each word, look at the heatmap and the
alignment lines, hover words, use the keyboard, switch layers and heads (when the API returns
them), meet an error, use it on a phone, translate a
file (DeepL's document API) and download the result. The page's numbers are checked against
the JSON the API sent, not against the page's own arithmetic; a translated file against what
the text API answers for the same sentences.
Screenshots go to reports/screenshots/ (a test artifact; docs/page.png is one of them).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.documents.word import paragraphs_of, word_file
from tests.servers import Server, running_server

playwright_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (dev extra)")
expect = playwright_api.expect

SCREENSHOTS = ROOT / "reports" / "screenshots"
MAX_CHARS = 300  # the server's NMT_MAX_CHARS_PER_TEXT here, to provoke a 422
SENTENCE = "Un chien noir court dans la neige."
# A sentence with words of both kinds: some near-certain, a few well below the doubtful
# threshold (the committed model gives "elderly" about 0.6 against a threshold near 0.86).
MIXED_CONFIDENCE = "Une dame âgée vend des légumes au marché."
FILE_SENTENCES = [
    "Un homme lit un journal sur un banc.",
    "Deux enfants jouent au ballon dans le parc.",
]
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def find_chromium() -> str | None:
    """$NMT_CHROMIUM, else Debian's chromium binary (not its shell wrapper), else on PATH."""
    candidates = [os.environ.get("NMT_CHROMIUM"), "/usr/lib/chromium/chromium"]
    candidates += [shutil.which(name) for name in ("chromium", "chromium-browser")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


@pytest.fixture(scope="module")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium found: `apt-get install chromium` (or set NMT_CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[object]:
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("page-models")
    (folder / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    logs = tmp_path_factory.mktemp("page-logs")
    state = tmp_path_factory.mktemp("page-state")  # the document jobs' database
    with running_server(
        folder,
        logs,
        threads=1,
        max_chars_per_text=MAX_CHARS,
        cache_entries=0,
        state_dir=state,
        document_poll_seconds=0.2,
    ) as server:
        yield server


@pytest.fixture
def page(browser, server: Server) -> Iterator[object]:
    """A fresh page on the served `/`, failing the test on any console error or uncaught
    exception (a Content-Security-Policy violation shows up as a console error)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(server.url + "/")
    expect(page.locator("#pair option").first).to_be_attached()
    yield page
    context.close()
    # The page's own 4xx answers are logged by Chromium as failed loads: those are expected.
    assert [p for p in problems if "status of 4" not in p] == [], problems


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def translate(page, text: str) -> dict:
    """Type `text`, press Translate, wait for the page to show the result; the API's JSON."""
    page.fill("#text", text)
    with page.expect_response("**/v1/translate") as answer:
        page.click("#go")
    body = answer.value.json()
    if answer.value.ok:  # (expect polls the DOM without eval, which the page's CSP forbids)
        expect(page.locator("#translation")).to_have_text(body["translations"][0]["text"])
    return body


def heatmap_shape(page, index: int = 0) -> tuple[int, int]:
    table = page.locator("table.heatmap").nth(index)
    return table.locator("tbody tr").count(), table.locator("thead th").count()


def cell_weights(page, index: int = 0) -> list[list[float]]:
    return (
        page.locator("table.heatmap")
        .nth(index)
        .evaluate(
            """table => [...table.tBodies[0].rows].map(row =>
            [...row.querySelectorAll('td')].map(cell => Number(cell.dataset.weight)))"""
        )
    )


def test_the_page_says_what_the_model_is_for_and_offers_in_domain_examples(page, fr_en_bundle):
    manifest = json.loads((fr_en_bundle / "bundle.json").read_text())
    assert page.locator("#description").inner_text() == manifest["description"]
    assert "Multi30k" in manifest["description"]
    example = page.locator("#examples button").first
    sentence = example.inner_text()
    example.click()
    assert page.input_value("#text") == sentence


def test_translating_shows_the_english_and_a_heatmap_of_the_returned_tokens(page):
    answer = translate(page, SENTENCE)
    translation = answer["translations"][0]
    shown = page.locator("#translation").inner_text()
    assert shown == translation["text"] and "dog" in shown.lower()
    (alignment,) = translation["alignment"]
    # Words (the default view): one row per target word, one column per source word.
    assert heatmap_shape(page) == (len(alignment["target_words"]), len(alignment["source_words"]))
    assert cell_weights(page) == alignment["word_weights"]
    # Pieces: exactly the tokens the API returned, </s> included.
    page.check("input[name=view][value=pieces]")
    assert heatmap_shape(page) == (len(alignment["target_tokens"]), len(alignment["source_tokens"]))
    assert cell_weights(page) == alignment["weights"]
    # One line per hard-alignment link, and the Moses pairs as the API wrote them.
    assert page.locator("svg.links line").count() == len(alignment["word_alignment"])
    assert alignment["moses"] in page.locator(".moses").inner_text()
    # The API says which layer the weights come from: the layer selector shows it; the head
    # selector shows their mean (each head is asked for when one is picked).
    assert page.locator("#layer-box").is_visible() and page.locator("#head-box").is_visible()
    assert page.locator("#head").input_value() == "mean"
    assert page.locator("#layer").input_value() == str(alignment["layer"])
    screenshot(page, "page-translation.png")


def test_hovering_a_word_highlights_what_it_attended_to(page):
    answer = translate(page, SENTENCE)
    (alignment,) = answer["translations"][0]["alignment"]
    weights, targets, sources = (
        alignment["word_weights"],
        alignment["target_words"],
        alignment["source_words"],
    )
    dog = next(t for t, word in enumerate(targets) if word.lower().startswith("dog"))
    page.hover(f".tgt[data-t='{dog}']")
    strongest = max(range(len(sources)), key=lambda s: weights[dog][s])
    best = page.locator(".src.best")
    assert best.count() == 1 and best.inner_text() == sources[strongest] == "chien"
    assert page.locator(f"line.active[data-t='{dog}']").count() == 1
    screenshot(page, "page-hover.png")
    # The reverse: a source word lights the target word that attended to it most.
    noir = sources.index("noir")
    page.hover(f".src[data-s='{noir}']")
    column = [row[noir] for row in weights]
    assert page.locator(".tgt.best").inner_text() == targets[column.index(max(column))]


def test_the_heatmap_and_words_work_from_the_keyboard(page):
    answer = translate(page, SENTENCE)
    (alignment,) = answer["translations"][0]["alignment"]
    page.mouse.move(20, 20)  # the mouse rests here, at the top left of the window
    page.locator("table.heatmap td[tabindex='0']").focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    focused = page.evaluate(
        """() => {
            const cell = document.activeElement;
            return {t: cell.dataset.t, s: cell.dataset.s, label: cell.getAttribute('aria-label')};
        }"""
    )
    assert (focused["t"], focused["s"]) == ("1", "1")
    target, source = alignment["target_words"][1], alignment["source_words"][1]
    assert focused["label"] == f"{target} ← {source}: {alignment['word_weights'][1][1]:.2f}"
    assert page.locator("thead th.active").inner_text() == source
    # Focus scrolled the page under the resting mouse: the browser then sends mouseenter and
    # mouseleave, at that same point of the window, to what the page brought under it (when,
    # depends on the machine). Those must not take the highlight from the keyboard's cell.
    for selector, kind in [
        ("table.heatmap tbody th[data-t='2']", "mouseenter"),
        ("table.heatmap td[data-t='0'][data-s='0']", "mouseenter"),
        ("section.sentence", "mouseleave"),
    ]:
        page.locator(selector).evaluate(
            "(node, kind) => node.dispatchEvent(new MouseEvent(kind, {clientX: 20, clientY: 20}))",
            kind,
        )
    assert page.locator("thead th.active").inner_text() == source
    assert page.locator("tbody th.active").inner_text() == target
    # A mouse that does move takes the highlight back.
    page.locator("table.heatmap tbody th[data-t='2']").hover()
    assert page.locator("tbody th.active").inner_text() == alignment["target_words"][2]
    # Tab reaches the words of the alignment lines; focusing one highlights like hovering.
    page.locator(".tgt[data-t='0']").focus()
    assert page.locator(".tgt.active").inner_text() == alignment["target_words"][0]
    assert page.locator(".src.best").count() == 1


def percent(probability: float) -> str:
    """As the page writes a probability: whole percent, half up (JavaScript's Math.round)."""
    return f"{math.floor(probability * 100 + 0.5)} %"


def shown_words(page, where: str = "#translation") -> list[dict]:
    """The tinted words under `where`: text, probability, tooltip, doubtful mark (class and
    the underline the browser draws) and the alpha of their background."""
    return page.locator(where).evaluate(
        """node => [...node.querySelectorAll('.conf-word')].map(word => {
            const style = getComputedStyle(word);
            const rgba = style.backgroundColor.match(/[\\d.]+/g).map(Number);
            return {
                text: word.textContent,
                confidence: Number(word.dataset.confidence),
                title: word.title,
                doubtful: word.classList.contains('doubtful'),
                underlined: style.textDecorationLine.includes('underline'),
                alpha: rgba.length === 4 ? rgba[3] : 1,
            };
        })"""
    )


def test_each_word_is_tinted_by_how_sure_the_model_was(page, fr_en_bundle: Path):
    """The page asks for confidence; the translation's words are tinted by the probability the
    decoder gave them (the less sure, the warmer), doubtful words underlined, each with its
    probability as a tooltip; the box's text stays the translation's; the calibrated sentence
    confidence shows as a percentage by the score, with what it means."""
    assert (fr_en_bundle / "confidence.json").is_file()  # the served model is calibrated
    with page.expect_request("**/v1/translate") as request:
        answer = translate(page, MIXED_CONFIDENCE)
    assert json.loads(request.value.post_data)["return_confidence"] is True
    translation = answer["translations"][0]
    confidence = translation["confidence"]
    words = confidence["words"]
    assert {word["doubtful"] for word in words} == {True, False}  # some of each, to look at

    shown = shown_words(page)
    assert [w["text"] for w in shown] == [w["word"] for w in words] == translation["text"].split()
    assert [w["confidence"] for w in shown] == [w["confidence"] for w in words]
    for on_page, word in zip(shown, words, strict=True):
        assert on_page["title"].startswith(
            f"{word['word']}: probability {percent(word['confidence'])}"
        )
        assert on_page["doubtful"] == on_page["underlined"] == word["doubtful"]
        assert ("doubtful" in on_page["title"]) == word["doubtful"]
    # The less sure a word, the stronger its tint; a near-certain word is barely tinted.
    by_confidence = sorted(shown, key=lambda w: w["confidence"])
    assert all(a["alpha"] >= b["alpha"] for a, b in itertools.pairwise(by_confidence))
    assert by_confidence[-1]["alpha"] < 0.05 < 0.2 < by_confidence[0]["alpha"]
    # What is selected and copied is the translation, as the API wrote it.
    assert page.locator("#translation").evaluate("n => n.textContent") == translation["text"]

    expect(page.locator("#sentence-confidence")).to_have_text(percent(confidence["sentence"]))
    score = page.locator("#score").inner_text()
    assert score == (
        f"score {translation['score']:.3f} (mean log-probability per token) · "
        f"confidence {percent(confidence['sentence'])}"
    )
    note = page.locator("#confidence-note").inner_text()
    assert "calibrated on held-out sentences" in note and confidence["label"] in note
    assert "not a guarantee" in note and "not necessarily a wrong one" in note
    doubtful = [w for w in words if w["doubtful"]]
    expect(page.locator("#doubtful-words")).to_have_text(
        "Doubtful words: "
        + ", ".join(f"“{w['word']}” ({percent(w['confidence'])})" for w in doubtful)
        + "."
    )
    page.hover("#translation .conf-word.doubtful")
    screenshot(page, "page-confidence.png")


def test_several_sentences_keep_their_layout_and_their_words_tints(page):
    answer = translate(page, "Un chien dort.\n\nDeux chats jouent dans le jardin.")
    translation = answer["translations"][0]
    assert "\n\n" in translation["text"]
    assert page.locator("#translation").evaluate("n => n.textContent") == translation["text"]
    shown = shown_words(page)
    assert [w["text"] for w in shown] == [w["word"] for w in translation["confidence"]["words"]]
    assert "for several sentences, their mean" in page.locator("#confidence-note").inner_text()


def test_words_that_do_not_line_up_with_the_text_are_shown_apart(page):
    """Should the API's words ever differ from the text's, the box keeps the plain text and
    the tinted words are shown on their own below it."""

    def joined(route) -> None:
        body = route.fetch().json()
        words = body["translations"][0]["confidence"]["words"]
        words[:2] = [{**words[0], "word": f"{words[0]['word']} {words[1]['word']}"}]
        route.fulfill(json=body)

    page.route("**/v1/translate", joined)
    answer = translate(page, SENTENCE)
    words = answer["translations"][0]["confidence"]["words"]
    assert page.locator("#translation .conf-word").count() == 0
    assert [w["text"] for w in shown_words(page, "#confidence-words")] == [w["word"] for w in words]


@pytest.fixture(scope="module")
def uncalibrated_server(
    fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The same model without its confidence.json."""
    bundle = tmp_path_factory.mktemp("uncalibrated") / "fr-en"
    bundle.mkdir()
    for file in fr_en_bundle.iterdir():
        if file.name != "confidence.json":
            (bundle / file.name).symlink_to(file)
    logs = tmp_path_factory.mktemp("uncalibrated-logs")
    with running_server(bundle.parent, logs, threads=1, cache_entries=0) as server:
        yield server


def test_without_a_calibration_the_page_shows_the_raw_score_only(browser, uncalibrated_server):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.goto(uncalibrated_server.url + "/")
    expect(page.locator("#pair option").first).to_be_attached()
    answer = translate(page, SENTENCE)
    translation = answer["translations"][0]
    confidence = translation["confidence"]
    assert "sentence" not in confidence and "label" not in confidence
    assert all("doubtful" not in word for word in confidence["words"])

    shown = shown_words(page)  # still tinted by the decoder's probabilities, none doubtful
    assert [w["confidence"] for w in shown] == [w["confidence"] for w in confidence["words"]]
    assert not any(w["doubtful"] or w["underlined"] for w in shown)
    assert page.locator("#sentence-confidence").count() == 0
    assert page.locator("#doubtful-words").count() == 0
    assert page.locator("#score").inner_text() == (
        f"score {translation['score']:.3f} (mean log-probability per token) · "
        "no calibrated confidence"
    )
    assert "no calibration" in page.locator("#confidence-note").inner_text()
    assert "doubtful" not in page.locator("#confidence-legend").inner_text()
    context.close()


def test_an_api_error_is_shown_in_plain_words(page):
    answer = translate(page, "Un chat dort. " * 30)  # 420 characters: past the limit of 300
    assert answer["detail"][0]["type"] == "text_too_long"
    error = page.locator("#error")
    error.wait_for(state="visible")
    text = error.inner_text()
    assert text.startswith("The server did not accept this request.")
    assert f"the limit is {MAX_CHARS} characters per text" in text
    assert page.locator("#results").is_hidden()
    screenshot(page, "page-error.png")


def test_n_best_alternatives_are_listed_with_scores(page):
    page.select_option("#search", "beam")
    page.fill("#beam", "3")
    page.fill("#nbest", "3")
    answer = translate(page, SENTENCE)
    alternatives = answer["translations"][0]["n_best"]
    items = page.locator("#alternatives li")
    assert items.count() == len(alternatives) == 3
    for item, alternative in zip(items.all(), alternatives, strict=True):
        assert item.inner_text() == f"{alternative['text']} ({alternative['score']:.3f})"


def test_greedy_sends_beam_size_1(page):
    page.select_option("#search", "greedy")
    page.fill("#text", SENTENCE)
    with page.expect_request("**/v1/translate") as request:
        page.click("#go")
    assert json.loads(request.value.post_data)["beam_size"] == 1
    assert page.locator("#nbest").is_disabled()


def test_picking_a_head_asks_for_each_heads_weights_and_shows_that_heads(page, fr_en_bundle):
    """The layer box lists the model's decoder layers; picking a head asks the API for every
    head's weights of the shown layer (alignment_layer, alignment_heads "all"), and the heatmap
    then shows that head's, or their mean again. (Another layer is asked for the same way.)"""
    requests: list[dict] = []
    page.on(
        "request",
        lambda r: (
            requests.append(json.loads(r.post_data)) if r.url.endswith("/v1/translate") else 0
        ),
    )
    answer = translate(page, SENTENCE)
    last = answer["translations"][0]["alignment"][0]
    assert "head_weights" not in last  # one request, the mean of the heads only
    assert page.locator("#layer-box").is_visible()
    assert page.locator("#layer").input_value() == str(last["layer"])
    assert page.locator("#layer option").count() == last["layer"] + 1  # the model's layers
    expect(page.locator("#head-box")).to_be_visible()
    heads = json.loads((fr_en_bundle / "bundle.json").read_text())["model"]["n_heads"]
    assert page.locator("#head option").count() == 1 + heads  # their mean, and each head
    page.check("input[name=view][value=pieces]")
    assert cell_weights(page) == last["weights"]

    with page.expect_response("**/v1/translate") as response:
        page.select_option("#head", "1")
    assert requests[-1]["alignment_layer"] == last["layer"]
    assert requests[-1]["alignment_heads"] == "all" and requests[-1]["text"] == SENTENCE
    each = response.value.json()["translations"][0]["alignment"][0]
    expect(page.locator("#head")).to_have_value("1")
    assert cell_weights(page) == each["head_weights"][1] != each["weights"]
    page.select_option("#head", "2")
    assert cell_weights(page) == each["head_weights"][2]
    page.select_option("#head", "mean")
    assert cell_weights(page) == each["weights"] == last["weights"]
    assert len(requests) == 2  # the heads were kept: no request for another head
    screenshot(page, "page-layers.png")


def test_the_page_fits_a_phone_screen(browser, server: Server):
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True)
    page = context.new_page()
    page.goto(server.url + "/")
    expect(page.locator("#pair option").first).to_be_attached()
    translate(page, "Une femme en robe blanche danse avec un homme en costume.")
    # Nothing wider than the screen: wide heatmaps and sentences scroll inside their boxes.
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    screenshot(page, "page-phone.png")
    context.close()


# --- files: DeepL's document API through the page -------------------------------------------


def text_api(url: str, texts: list[str]) -> list[str]:
    """What /v1/translate answers for `texts` (fr -> en, the server's default search)."""
    answer = httpx.post(
        f"{url}/v1/translate",
        json={"text": texts, "source_lang": "fr", "target_lang": "en"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return [item["text"] for item in answer.json()["translations"]]


def plain_text(paragraphs: list[str]) -> bytes:
    return ("\n\n".join(paragraphs) + "\n").encode()


def choose_file(page, name: str, data: bytes, mime: str) -> None:
    page.set_input_files("#file", files=[{"name": name, "mimeType": mime, "buffer": data}])


@pytest.mark.parametrize(
    ("name", "mime", "make"),
    [("notes.txt", "text/plain", plain_text), ("notes.docx", DOCX, word_file)],
    ids=["txt", "docx"],
)
def test_a_file_is_translated_and_downloaded(
    page,
    server: Server,
    tmp_path: Path,
    name: str,
    mime: str,
    make: Callable[[list[str]], bytes],
):
    """Upload through the file input, progress and seconds remaining while it translates, then
    a download link (a blob: URL, which the page's CSP lets an <a download> open) to the file
    whose text is what the text API gives for the same sentences."""
    uploads: list[dict] = []
    page.on(
        "request",
        lambda r: uploads.append(r) if r.url.endswith("/v2/document") else None,
    )
    # The first status polls answer "translating" from here, as a long document would, so that
    # the page's progress can be read; then the server's own answers go through.
    held = {"on": True}

    def status(route) -> None:
        if held["on"]:
            translating = {"status": "translating", "seconds_remaining": 7, "progress": 0.5}
            route.fulfill(json={"document_id": "x", **translating})
        else:
            route.fallback()

    page.route("**/v2/document/*", status)  # the status poll (not /result: * stops at /)
    choose_file(page, name, make(FILE_SENTENCES), mime)
    page.click("#file-go")
    expect(page.locator("#file-status")).to_have_text(f"Translating {name}: 50 %, about 7 s left.")
    expect(page.locator("#file-progress")).to_have_attribute("value", "0.5")
    expect(page.locator("#file-go")).to_be_disabled()
    held["on"] = False

    link = page.locator("#file-download")
    expect(link).to_be_visible(timeout=120_000)
    assert link.get_attribute("href").startswith("blob:" + server.url)
    expect(page.locator("#file-status")).to_have_text(f"{name} is translated (fr → en).")
    expect(page.locator("#file-progress")).to_have_attribute("value", "1")
    expect(page.locator("#error")).to_be_empty()
    # What the page sent: DeepL's fields, the file under its own name.
    (upload,) = uploads
    form = upload.post_data_buffer
    for field, value in (("source_lang", b"FR"), ("target_lang", b"EN-US")):
        assert f'name="{field}"'.encode() + b"\r\n\r\n" + value in form
    assert f'name="file"; filename="{name}"'.encode() in form
    screenshot(page, f"page-file-{name.rsplit('.', 1)[1]}.png")

    with page.expect_download() as started:
        link.click()
    download = started.value
    assert download.suggested_filename == link.get_attribute("download")
    assert download.suggested_filename.endswith(name.rsplit(".", 1)[1])
    target = tmp_path / download.suggested_filename
    download.save_as(target)
    translations = text_api(server.url, FILE_SENTENCES)
    if name.endswith(".txt"):
        assert target.read_bytes() == plain_text(translations)
    else:
        assert paragraphs_of(target.read_bytes()) == translations


def test_a_file_the_server_refuses_shows_its_message(page):
    page.click("#file-go")  # no file chosen yet
    expect(page.locator("#error")).to_have_text("Choose a file to translate first.")

    picture = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4  # a PNG, named as a Word file
    choose_file(page, "x.docx", picture, DOCX)
    with page.expect_response("**/v2/document") as answer:
        page.click("#file-go")
    assert answer.value.status == 400
    message = answer.value.json()["message"]
    assert "not in a format" in message
    shown = f"The file could not be translated. {message[0].upper()}{message[1:]}"
    expect(page.locator("#error")).to_have_text(shown)
    expect(page.locator("#file-status")).to_have_text(
        "The file was not translated: see the message above."
    )
    expect(page.locator("#file-result")).to_be_hidden()
    expect(page.locator("#file-go")).to_be_enabled()
    screenshot(page, "page-file-error.png")
