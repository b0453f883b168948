"""Shared fixtures. Torch-side fixtures import torch lazily so serving tests run without it."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMITTED_MODEL = ROOT / "models" / "fr-en"


@pytest.fixture(scope="session", autouse=True)
def _store_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every app and server the tests start keeps its store (glossaries) in one temporary
    SQLite file, not in the checkout's data/ (NMT_STATE_DIR's default) nor in a database the
    shell may name; tests of the store give their own URL."""
    before = os.environ.get("NMT_DATABASE_URL")
    os.environ["NMT_DATABASE_URL"] = f"sqlite:///{tmp_path_factory.mktemp('store') / 'nmt.db'}"
    yield
    if before is None:
        os.environ.pop("NMT_DATABASE_URL", None)
    else:
        os.environ["NMT_DATABASE_URL"] = before


def multi30k_path() -> Path:
    return Path(os.environ.get("NMT_DATA_DIR", ROOT.parent / "shared" / "data" / "multi30k"))


@pytest.fixture(scope="session")
def multi30k() -> Path:
    path = multi30k_path()
    if not (path / "test_2016_flickr.fr").is_file():
        pytest.skip(f"Multi30k not found at {path} (set NMT_DATA_DIR to its folder)")
    return path


@pytest.fixture(scope="session")
def committed_model() -> Path:
    if not (COMMITTED_MODEL / "model.safetensors").is_file():
        pytest.skip(f"no committed model at {COMMITTED_MODEL}")
    return COMMITTED_MODEL


# Caption-like French sentences written for the tests (never lines of the corpus).
FRENCH_SENTENCES = [
    "Un homme en chemise bleue marche dans la rue.",
    "Deux enfants jouent au ballon sur la plage.",
    "Une femme lit un livre dans un parc.",
    "Le chien court après la balle.",
    "Un groupe de personnes attend le bus.",
    "Une petite fille mange une glace.",
    "Un homme fait du vélo sur une route de montagne.",
    "Des gens sont assis à une table dans un restaurant.",
    "Un garçon saute dans une piscine.",
    "Une femme en robe rouge chante sur scène.",
    "Deux hommes travaillent sur un toit.",
    "Un chat dort sur un canapé.",
    "Des enfants courent dans un champ.",
    "Un homme âgé lit le journal.",
    "Une équipe de football joue sur un terrain.",
    "Un cuisinier prépare un repas.",
]

REVERSE_WORDS = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
]  # fmt: skip


def write_reverse_corpus(folder: Path, train_pairs: int = 3000, valid_pairs: int = 100) -> Path:
    """A toy translation task: the target is the source's words in reverse order.

    Written as text files shaped like Multi30k (`train.src`/`train.tgt`, `val.src`/`val.tgt`),
    so that the real training pipeline (tokenizer included) runs on it end to end.
    """
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for split, count in (("train", train_pairs), ("val", valid_pairs)):
        sources, targets = [], []
        while len(sources) < count:
            words = [rng.choice(REVERSE_WORDS) for _ in range(rng.randint(3, 7))]
            sentence = " ".join(words)
            if sentence in seen:  # held-out sentences never appear in training
                continue
            seen.add(sentence)
            sources.append(sentence)
            targets.append(" ".join(reversed(words)))
        (folder / f"{split}.src").write_text("\n".join(sources) + "\n")
        (folder / f"{split}.tgt").write_text("\n".join(targets) + "\n")
    return folder


@pytest.fixture(scope="session")
def reverse_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reverse_corpus(tmp_path_factory.mktemp("reverse"))


@pytest.fixture(scope="session")
def fr_en_bundle(committed_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed model exported (fp32 and int8) once per test session: a few seconds."""
    pytest.importorskip("torch", reason="exporting needs the export extra (torch)")
    from export.onnx_export import export_bundle

    out = tmp_path_factory.mktemp("bundles") / "fr-en"
    export_bundle(committed_model, out, int8=True)
    return out


@pytest.fixture(scope="session")
def tiny_checkpoint(reverse_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random model with a real tokenizer; it favours </s> a little so that
    hypotheses end at varied lengths (a random model otherwise never stops)."""
    pytest.importorskip("torch", reason="needs the export extra (torch)")
    import torch

    from export.checkpoint import save_model_dir
    from export.model.config import ModelConfig
    from export.model.transformer import Transformer
    from export.tokenizer import train_sentencepiece

    folder = tmp_path_factory.mktemp("tiny")
    spm_model = train_sentencepiece(
        [reverse_corpus / "train.src", reverse_corpus / "train.tgt"], folder / "spm", 400
    )
    torch.manual_seed(3)
    config = ModelConfig(vocab_size=400, d_model=64, n_heads=4, ffn_dim=128, dropout=0.0)
    model = Transformer(config).eval()
    model.final_logits_bias[config.eos_id] = 2.0
    save_model_dir(model, spm_model, folder / "model")
    return folder / "model"


@pytest.fixture(scope="session")
def tiny_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.onnx_export import export_bundle

    out = tmp_path_factory.mktemp("bundle") / "tiny"
    export_bundle(tiny_checkpoint, out, int8=True)
    return out


@pytest.fixture(scope="module")
def model_dir(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of bundles for `nmt serve` (NMT_MODEL_DIR): the committed fr-en one. A module
    that serves others defines its own."""
    folder = tmp_path_factory.mktemp("served")
    (folder / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    return folder


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the servers a module starts write their logs."""
    return tmp_path_factory.mktemp("server-logs")
