"""One multilingual bundle (an M2M-100 of an unusual shape with random weights, imported and
exported as tests/export/hf_families.py builds it) served over HTTP: three pairs answered by
the one model, each as `transformers` `generate` decodes it with the target language forced
first; the pairs listed by /v1/models, LibreTranslate's /languages and DeepL's /v2/languages;
an unknown language a 404; the alignment without the language token."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="needs the bench extra")

from fastapi.testclient import TestClient  # noqa: E402

from nmt_contract import length_limit  # noqa: E402
from service.runtime.bundle import load_bundle  # noqa: E402
from service.runtime.tokenizer import BundleTokenizer  # noqa: E402
from service.serving.settings import Settings  # noqa: E402
from tests.export.hf_families import (  # noqa: E402
    DIRECTIONS,
    bundle_dir,
    family_dir,
    hf_generate,
    sentences,
)
from tests.http.in_process import start  # noqa: E402

FAMILY = "m2m100"
MAX_LENGTH = 20


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared with the export and runtime tests of the families: built once a session."""
    return tmp_path_factory.getbasetemp() / "hf-families"


@pytest.fixture(scope="module")
def bundle(root: Path) -> Path:
    return bundle_dir(FAMILY, root)


@pytest.fixture(scope="module")
def client(bundle: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("multilingual")
    (folder / "m2m").symlink_to(bundle, target_is_directory=True)
    settings = Settings(
        model_dir=folder, threads=1, warmup=False, max_repeats=0, max_output_length=MAX_LENGTH
    )
    client = start(settings)
    yield client
    client.__exit__(None, None, None)


@pytest.mark.parametrize("beam", [1, 4])
def test_three_pairs_are_answered_by_one_model_as_generate_decodes_them(
    client: TestClient, root: Path, bundle: Path, beam: int
):
    hf = family_dir(FAMILY, root)
    model = hf.model()
    served = load_bundle(bundle)
    tokenizer = BundleTokenizer(served)
    for source, target in DIRECTIONS:
        texts = sentences(source, 4, seed=21)
        answer = client.post(
            "/v1/translate",
            json={
                "text": texts,
                "source_lang": source,
                "target_lang": target,
                "beam_size": beam,
                "max_length": MAX_LENGTH,
            },
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "m2m"
        for text, translation in zip(texts, answer.json()["translations"], strict=True):
            ids = tokenizer.encode([text], source)[0]
            assert ids == hf.tokenizer(source)(text).input_ids  # the served tokenizer's
            limit = length_limit(len(ids), MAX_LENGTH, served.dims["max_positions"])
            produced = hf_generate(model, ids, beam, limit, hf.forced_bos(target))
            produced = produced.sequences[0, 1:].tolist()  # without the decoder start
            assert produced[0] == hf.forced_bos(target)
            if produced[-1] == tokenizer.eos_id:
                produced = produced[:-1]
            assert translation["text"] == tokenizer.decode(produced), (source, target, text)


def test_the_model_s_pairs_are_listed_in_every_dialect(client: TestClient, bundle: Path):
    codes = load_bundle(bundle).languages.codes
    (model,) = client.get("/v1/models").json()["models"]
    assert model["languages"] == codes and model["state"] == "ready"
    languages = {entry["code"]: entry["targets"] for entry in client.get("/languages").json()}
    assert set(languages) == set(codes)
    assert all(
        sorted(targets) == sorted(set(codes) - {code}) for code, targets in languages.items()
    )
    deepl = client.get("/v2/languages", params={"type": "target"}).json()
    assert {entry["language"].split("-")[0].lower() for entry in deepl} >= {"de", "fr"}


def test_an_unknown_language_or_a_pair_of_one_language_is_a_404(client: TestClient):
    for source, target in (("fr", "tlh"), ("fr", "fr")):
        answer = client.post(
            "/v1/translate", json={"text": "Un chat.", "source_lang": source, "target_lang": target}
        )
        assert answer.status_code == 404, answer.text


def test_the_alignment_leaves_the_language_token_out(client: TestClient):
    answer = client.post(
        "/v1/translate",
        json={
            "text": "Un homme marche.",
            "source_lang": "fr",
            "target_lang": "de",
            "beam_size": 1,
            "return_alignment": True,
        },
    ).json()
    (alignment,) = answer["translations"][0]["alignment"]
    assert not any(token.startswith("__") for token in alignment["target_tokens"])
    assert len(alignment["weights"]) == len(alignment["target_tokens"])


def test_nmt_translate_picks_the_pair(client: TestClient, bundle: Path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    texts = sentences("de", 3, seed=22)
    command = [sys.executable, "-m", "nmt_cli", "translate", "--model-dir", str(bundle)]
    command += ["--source-lang", "de", "--target-lang", "fr", "--max-length", str(MAX_LENGTH)]
    done = subprocess.run(
        command, input="\n".join(texts), capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    answer = client.post(
        "/v1/translate",
        json={"text": texts, "source_lang": "de", "target_lang": "fr", "beam_size": 1},
    ).json()
    assert done.stdout.splitlines() == [t["text"] for t in answer["translations"]]
    unknown = subprocess.run(
        [*command[:-4], "--target-lang", "tlh"], input="x", capture_output=True, text=True,
        cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert unknown.returncode != 0 and "tlh" in unknown.stderr


def test_the_page_offers_the_source_and_target_language(
    bundle: Path, tmp_path_factory: pytest.TempPathFactory
):
    """The page asks a multilingual model for a source and a target language, and sends
    them (Chromium, as tests/http/test_web_page.py drives it)."""
    from tests.http.test_web_page import expect, find_chromium, playwright_api
    from tests.servers import running_server

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium found: `apt-get install chromium` (or set NMT_CHROMIUM)")
    folder = tmp_path_factory.mktemp("page-multilingual")
    (folder / "m2m").symlink_to(bundle, target_is_directory=True)
    logs = tmp_path_factory.mktemp("page-multilingual-logs")
    with (
        running_server(folder, logs, threads=1, warmup=False) as server,
        playwright_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_page()
        page.goto(server.url + "/")
        expect(page.locator("#languages-box")).to_be_visible()
        page.select_option("#source-lang", "de")
        page.select_option("#target-lang", "fr")
        page.fill("#text", "Ein Hund.")
        with page.expect_response("**/v1/translate") as answer:
            page.click("#go")
        request = answer.value.request.post_data_json
        assert (request["source_lang"], request["target_lang"]) == ("de", "fr")
        assert answer.value.ok
        browser.close()
