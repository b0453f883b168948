"""Say what the model is for: a model directory's description travels into its bundle, and
`/v1/models` shows it, so that a user learns what a model is good at before typing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.runtime.bundle import Bundle
from service.serving.settings import Settings
from tests.conftest import ROOT
from tests.http.in_process import start


def test_the_committed_model_says_it_knows_image_captions(committed_model: Path):
    text = (committed_model / "description.txt").read_text(encoding="utf-8")
    assert "Multi30k" in text and "photos" in text
    assert len(text) < 800  # short: it is shown above the text box


def test_a_bundle_without_a_description_has_an_empty_one(tmp_path: Path):
    assert Bundle(tmp_path, {"name": "fr-en"}).description == ""
    assert Bundle(tmp_path, {"description": "Captions."}).description == "Captions."


def test_export_copies_the_model_directory_description(committed_model: Path, fr_en_bundle: Path):
    pytest.importorskip("torch")
    from export.checkpoint import read_description

    manifest = json.loads((fr_en_bundle / "bundle.json").read_text())
    assert manifest["description"] == read_description(committed_model)
    assert "Multi30k" in manifest["description"]


def test_nmt_export_description_replaces_the_model_directory_one(
    committed_model: Path, tmp_path: Path
):
    pytest.importorskip("torch")
    out = tmp_path / "fr-en"
    command = [sys.executable, "-m", "nmt_cli", "export", "--checkpoint", str(committed_model)]
    command += ["--out", str(out), "--description", "Recipes only."]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    assert json.loads((out / "bundle.json").read_text())["description"] == "Recipes only."


def test_saving_a_model_directory_keeps_its_description(tmp_path: Path):
    pytest.importorskip("torch")
    from export.checkpoint import read_description, save_model_dir
    from export.model.config import ModelConfig
    from export.model.transformer import Transformer

    config = ModelConfig(
        vocab_size=16, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1, decoder_layers=1
    )
    model = Transformer(config)
    tokenizer = tmp_path / "sentencepiece.model"
    tokenizer.write_bytes(b"not read here")
    out = tmp_path / "model"
    save_model_dir(model, tokenizer, out, description="Trained on\n  captions.")
    assert read_description(out) == "Trained on captions."
    save_model_dir(model, tokenizer, out)  # retrained into the same folder: kept
    assert read_description(out) == "Trained on captions."
    save_model_dir(model, tokenizer, out, description="Now news.")
    assert read_description(out) == "Now news."


def test_an_imported_marian_model_describes_itself_from_its_model_card(tmp_path: Path):
    pytest.importorskip("torch")
    from export.hf.marian import marian_description

    folder = tmp_path / "opus-mt-fr-en"
    folder.mkdir()
    assert marian_description(folder, "fr", "en") == (
        "opus-mt-fr-en: a Hugging Face Marian model (fr→en)."
    )
    (folder / "README.md").write_text(
        "### opus-mt-fr-en\n\n* source languages: fr\n* target languages: en\n"
        "*  dataset: opus\n* model: transformer-align\n"
    )
    found = marian_description(folder, "fr", "en")
    assert found.startswith("opus-mt-fr-en: a Hugging Face Marian model (fr→en); trained on opus")
    assert "general-domain" in found


@pytest.fixture(scope="module")
def client(fr_en_bundle: Path) -> Iterator[TestClient]:
    client = start(Settings(model_dir=fr_en_bundle, threads=1, warmup=False))
    yield client
    client.__exit__(None, None, None)


def test_v1_models_shows_each_models_description(client: TestClient, fr_en_bundle: Path):
    (model,) = client.get("/v1/models").json()["models"]
    manifest = json.loads((fr_en_bundle / "bundle.json").read_text())
    assert model["description"] == manifest["description"] != ""
