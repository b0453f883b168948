"""The jackknife's round for a lent GPU (export/jackknife_round.py): its labels, or where the
labelling failed there the fold models (within the device's limits), unpack into a
jackknife here, split as it was there, each model fp32 with the committed tokenizer; a
round run whole on the CPU with a tiny recipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from export import jackknife_round  # noqa: E402
from export.checkpoint import TOKENIZER_FILE, save_model_dir  # noqa: E402
from export.distill_round import Run  # noqa: E402
from export.jackknife import (  # noqa: E402
    fold_names,
    labels_path,
    read_labels,
    split,
    write_labels,
)
from export.model.config import ModelConfig  # noqa: E402
from export.model.transformer import Transformer  # noqa: E402
from export.train_config import multi30k_dir  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.export.tiny_corpus import write_corpus  # noqa: E402

COMMITTED_TOKENIZER = ROOT / "models/fr-en" / TOKENIZER_FILE


def _trained_folds(work: Path, data: Path, folds: int) -> list[Run]:
    """The fold models as the round leaves them: split, and a model directory a fold."""
    split(data, work / "jackknife", folds=folds)
    runs = []
    for index, fold in enumerate(fold_names(folds)):
        torch.manual_seed(index)
        run = Run(f"model-{fold}", work / "jackknife" / f"data-{fold}", [])
        model = Transformer(ModelConfig(vocab_size=300, d_model=32, n_heads=4, ffn_dim=64))
        save_model_dir(model, COMMITTED_TOKENIZER, run.model_dir(work), description="")
        runs.append(run)
    return runs


def _report(folds: int, labelled: bool = False) -> dict:
    return {
        "folds": fold_names(folds),
        "targets": None,
        "tokenizer_sha256": jackknife_round.sha256(jackknife_round.TOKENIZER),
        "labelled": labelled,
    }


def test_without_labels_the_fold_models_come_back_and_unpack_into_the_same_folds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(ROOT)  # (the recipe names the committed tokenizer from the checkout)
    data = write_corpus(tmp_path / "data", 13)
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "runs").mkdir(parents=True)
    runs = _trained_folds(work, data, 4)

    jackknife_round.pack(work, work / "jackknife", out, runs, _report(4))

    files = sorted(p.name for p in out.iterdir())
    assert files == ["jackknife-logs.tar.gz", *(f"model-{f}.tar.part0" for f in "abcd")]
    commands = jackknife_round.unpack(out, tmp_path / "back", data, None)

    back = tmp_path / "back"
    for run, fold, command in zip(runs, fold_names(4), commands, strict=False):
        model = back / f"model-{fold}"
        original = load_file(str(run.model_dir(work) / "model.safetensors"))
        weights = load_file(str(model / "model.safetensors"))
        assert weights.keys() == original.keys()
        for name, weight in original.items():
            assert weights[name].dtype == torch.float32
            assert torch.equal(weights[name], weight.half().float()), name
        # the tokenizer left behind there is the committed one here
        assert (model / TOKENIZER_FILE).read_bytes() == COMMITTED_TOKENIZER.read_bytes()
        assert (back / f"heldout-{fold}" / "ids").read_text() == (
            work / "jackknife" / f"heldout-{fold}" / "ids"
        ).read_text()
        assert command == f"nmt export --checkpoint {model} --out {back}/bundle-{fold}"
    assert commands[-2:] == [
        f"nmt jackknife label --dir {back}",
        f"nmt calibrate --model-dir build/models/fr-en --jackknife {back}",
    ]


def test_labels_made_there_come_back_alone_and_unpack_beside_the_folds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(ROOT)
    data = write_corpus(tmp_path / "data", 13)
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "runs").mkdir(parents=True)
    runs = _trained_folds(work, data, 2)
    header = {"search": "beam", "beam_size": 4, "tokenizer": "t", "vocab_sizes": [9, 9]}
    for search in ("greedy", "beam"):
        for fold in fold_names(2):
            row = {"features": {}, "source_ids": [3], "output_ids": [4], "chrf": 50.0}
            write_labels(labels_path(work / "jackknife", search, fold), header, [row])

    jackknife_round.pack(work, work / "jackknife", out, runs, _report(2, labelled=True))

    assert sorted(p.name for p in out.iterdir()) == [
        "jackknife-labels.tar",
        "jackknife-logs.tar.gz",
    ]
    commands = jackknife_round.unpack(out, tmp_path / "back", data, None)
    calibrate = "nmt calibrate --model-dir build/models/fr-en --jackknife"
    assert commands == [f"{calibrate} {tmp_path / 'back'}"]
    assert len(read_labels(tmp_path / "back", "beam").chrf) == 2
    assert not (tmp_path / "back" / "model-a").exists()


def test_unpacking_refuses_folds_split_otherwise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)
    data = write_corpus(tmp_path / "data", 13)
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "runs").mkdir(parents=True)
    runs = _trained_folds(work, data, 2)
    jackknife_round.pack(work, work / "jackknife", out, runs, _report(2))

    other = write_corpus(tmp_path / "other", 14)  # another corpus: other folds
    with pytest.raises(ValueError, match=r"fold [ab] here holds other sentences"):
        jackknife_round.unpack(out, tmp_path / "back", other, None)


@pytest.mark.slow
def test_a_round_on_the_cpu_trains_a_model_outside_each_fold(tmp_path: Path):
    """The whole round, as the GPU machine runs it, on 60 Multi30k pairs with a tiny model:
    a model for each fold comes back and unpacks."""
    source = multi30k_dir()
    if not (source / "train.fr").exists():
        pytest.skip(f"Multi30k is not at {source}")
    data = tmp_path / "data"
    data.mkdir()
    for prefix, count in (("train", 60), ("val", 8)):
        for lang in ("fr", "en"):
            lines = (source / f"{prefix}.{lang}").read_text().splitlines()[:count]
            (data / f"{prefix}.{lang}").write_text("\n".join(lines) + "\n")
    tiny = (
        "--tokenizer models/fr-en/sentencepiece.model --encoder-layers 1 --decoder-layers 1 "
        "--d-model 32 --n-heads 2 --ffn-dim 64 --max-epochs 1 --valid-bleu-sentences 8 "
        "--device cpu"
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "export.jackknife_round", "run", "--data", str(data),
         "--targets", "", "--folds", "2", "--recipe", tiny, "--work", str(tmp_path / "work"),
         "--out", str(out), "--deadline-seconds", "840", "--pack-seconds", "30",
         "--label-seconds", "400"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # labelled there (the runtime is installed here), so the labels come back
    assert sorted(p.name for p in out.iterdir()) == [
        "jackknife-labels.tar",
        "jackknife-logs.tar.gz",
    ]
    back = subprocess.run(
        [sys.executable, "-m", "export.jackknife_round", "unpack", str(out),
         "--into", str(tmp_path / "jackknife"), "--data", str(data), "--targets", ""],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert back.returncode == 0, back.stderr[-3000:]
    jackknife = tmp_path / "jackknife"
    assert back.stdout.splitlines()[-1].endswith(f"--jackknife {jackknife}")
    for search, beam_size in (("greedy", 1), ("beam", 4)):
        labels = read_labels(jackknife, search)
        assert len(labels.chrf) == 60 and labels.beam_size == beam_size  # every pair, once
    report = json.loads((out / "jackknife-round" / "round.json").read_text())
    assert report["labelled"] and set(report["greedy_val_bleu"]) == {"model-a", "model-b"}
