"""The jackknife (export/jackknife.py) and the lexicon learned from its labels
(export/calibration.py): folds that split the pairs, piece indicators, a planted effect
found again, and `nmt jackknife label` then `nmt calibrate --jackknife` on the committed model."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="needs the export extra (scikit-learn)")

from export import calibration as fit
from export.jackknife import (
    MANIFEST,
    fold_names,
    labels_path,
    pooled,
    read_labels,
    split,
    write_labels,
)
from export.train_config import multi30k_dir
from nmt_contract import CONFIDENCE_FILE
from service.runtime.bundle import load_bundle
from service.serving.confidence import load_calibration
from tests.conftest import ROOT
from tests.export.tiny_corpus import write_corpus


@pytest.mark.parametrize("folds", [2, 4])
def test_the_folds_split_the_training_pairs_and_each_model_learns_outside_its_fold(
    tmp_path: Path, folds: int
):
    data = write_corpus(tmp_path / "multi30k", 11)

    commands = split(data, tmp_path / "jackknife", recipe="--max-epochs 1", folds=folds)

    names = fold_names(folds)
    manifest = json.loads((tmp_path / "jackknife" / MANIFEST).read_text())
    assert manifest["folds"] == names
    held = {}
    for fold in names:
        heldout = tmp_path / "jackknife" / f"heldout-{fold}"
        ids = [int(line) for line in (heldout / "ids").read_text().split()]
        # each pair stays a pair, in the order of the original lines
        assert (heldout / "source.fr").read_text().splitlines() == [f"phrase {i}" for i in ids]
        assert (heldout / "reference.en").read_text().splitlines() == [f"sentence {i}" for i in ids]
        assert ids == sorted(ids)
        trained = tmp_path / "jackknife" / f"data-{fold}"
        learned = [int(line) for line in (trained / "train.ids").read_text().split()]
        # the fold's model learns every pair but the fold's
        assert learned == sorted(set(range(11)) - set(ids))
        assert (trained / "train.fr").read_text().splitlines() == [f"phrase {i}" for i in learned]
        assert (trained / "train.en").read_text().splitlines() == [f"sentence {i}" for i in learned]
        assert (trained / "val.fr").read_text() == "val\n"
        held[fold] = set(ids)
    # the folds do not overlap, cover every pair and are as even as can be
    assert sum(len(ids) for ids in held.values()) == 11
    assert set().union(*held.values()) == set(range(11))
    assert max(map(len, held.values())) - min(map(len, held.values())) <= 1
    # a line per core, each training its share of the folds' models in turn, then exporting
    assert [c.split()[:3] for c in commands] == [["taskset", "-c", "0"], ["taskset", "-c", "1"]]
    for core, command in enumerate(commands):
        for fold in names[core::2]:
            assert f"data-{fold} --max-epochs 1" in command
            assert f"--out {tmp_path}/jackknife/bundle-{fold}" in command


def test_fold_models_can_learn_a_teachers_targets_and_are_labelled_against_the_references(
    tmp_path: Path,
):
    write_corpus(tmp_path, 6)
    teacher = tmp_path / "teacher.en"
    teacher.write_text("".join(f"translation {i}\n" for i in range(6)))

    split(tmp_path, tmp_path / "out", targets=teacher)

    for fold in fold_names(2):
        trained = tmp_path / "out" / f"data-{fold}"
        ids = [int(line) for line in (trained / "train.ids").read_text().split()]
        assert (trained / "train.en").read_text().splitlines() == [f"translation {i}" for i in ids]
        heldout = tmp_path / "out" / f"heldout-{fold}"
        ids = [int(line) for line in (heldout / "ids").read_text().split()]
        assert (heldout / "reference.en").read_text().splitlines() == [f"sentence {i}" for i in ids]


def test_a_jackknife_needs_two_folds_or_more(tmp_path: Path):
    write_corpus(tmp_path, 6)
    with pytest.raises(ValueError, match="2 to 26 folds, not 1"):
        split(tmp_path, tmp_path / "out", folds=1)


def test_mismatched_training_files_are_refused(tmp_path: Path):
    (tmp_path / "train.fr").write_text("un\ndeux\n")
    (tmp_path / "train.en").write_text("one\n")
    with pytest.raises(ValueError, match="2 French and 1 English lines"):
        split(tmp_path, tmp_path / "out")
    (tmp_path / "train.en").write_text("one\ntwo\n")
    (tmp_path / "teacher.en").write_text("one\n")
    with pytest.raises(ValueError, match=r"teacher\.en: 1 target lines for 2 sources"):
        split(tmp_path, tmp_path / "out", targets=tmp_path / "teacher.en")


def _write_jackknife(folder: Path, beam_size: int, chrf: float) -> None:
    """A jackknife of two folds with beam labels: one translation per fold, each scored
    `chrf`."""
    header = {"search": "beam", "beam_size": beam_size, "tokenizer": "t", "vocab_sizes": [9, 9]}
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps({"folds": fold_names(2)}))
    for fold in fold_names(2):
        row = {"features": {"mean_log_prob": -0.5}, "source_ids": [3], "output_ids": [4]}
        write_labels(labels_path(folder, "beam", fold), header, [{**row, "chrf": chrf}])


def test_jackknives_are_pooled_and_must_agree_on_the_beam(tmp_path: Path):
    _write_jackknife(tmp_path / "on-references", beam_size=4, chrf=40.0)
    _write_jackknife(tmp_path / "on-translations", beam_size=4, chrf=60.0)
    _write_jackknife(tmp_path / "beam-5", beam_size=5, chrf=50.0)

    labels = pooled([tmp_path / "on-references", tmp_path / "on-translations"], "beam")

    assert labels.chrf == [40.0, 40.0, 60.0, 60.0]  # each sentence once by each jackknife
    assert len(labels.features) == len(labels.source_ids) == len(labels.output_ids) == 4
    with pytest.raises(ValueError, match=r"beam-5's beam labels differ .* in beam_size"):
        pooled([tmp_path / "on-references", tmp_path / "beam-5"], "beam")


def test_labelling_without_the_split_or_the_models_says_what_is_missing(tmp_path: Path):
    def label() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "nmt_cli.py", "jackknife", "label", "--dir", str(tmp_path / "j")],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    done = label()
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.startswith("nmt jackknife label:") and MANIFEST in done.stderr
    split(write_corpus(tmp_path / "data", 6), tmp_path / "j")
    done = label()
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.startswith("nmt jackknife label:") and "bundle-a" in done.stderr


def test_piece_indicators_mark_source_and_output_pieces_apart():
    matrix = fit.piece_indicators([[3, 1, 3], [0]], [[2], [2, 2, 0]], (4, 3)).toarray()
    assert matrix.shape == (2, 7)
    assert matrix.tolist() == [
        [0, 1, 0, 1, 0, 0, 1],  # source 1 and 3 (3 twice: held once), output 2
        [1, 0, 0, 0, 1, 0, 1],  # source 0, output 0 and 2
    ]


def test_the_lexicon_finds_planted_pieces_beyond_what_the_features_explain():
    """chrF made of a feature, a hard source piece (-15), a good output piece (+8) and
    noise: the lexicon weighs those two pieces and not the others; the feature's share it
    leaves to the feature."""
    rng = np.random.default_rng(0)
    count, vocab_sizes = 6000, (30, 20)
    source_ids = [list(rng.choice(30, 5, replace=False)) for _ in range(count)]
    output_ids = [list(rng.choice(20, 4, replace=False)) for _ in range(count)]
    feature = rng.normal(0, 1, count)
    hard = np.array([7 in s for s in source_ids])
    good = np.array([3 in o for o in output_ids])
    chrf = 60 + 10 * feature - 15 * hard + 8 * good + rng.normal(0, 5, count)

    lexicon = fit.fit_lexicon(feature[:, None], chrf, source_ids, output_ids, vocab_sizes)

    source, target = np.array(lexicon["source"]), np.array(lexicon["target"])
    assert (len(source), len(target)) == vocab_sizes
    assert source[7] < -10 and target[3] > 5
    assert np.abs(np.delete(source, 7)).max() < 2 and np.abs(np.delete(target, 3)).max() < 2


@pytest.mark.slow
def test_labels_then_a_calibration_with_lexicons_the_server_reads(
    fr_en_bundle: Path, tmp_path: Path
):
    """`nmt jackknife label` (the committed model standing in for both fold models, on 300
    training pairs) then `nmt calibrate --jackknife` (on 300 val sentences), through the
    command line, read back as the server reads it."""
    data = multi30k_dir()
    if not (data / "val.fr").exists():
        pytest.skip(f"Multi30k is not at {data}")
    small = tmp_path / "data"
    small.mkdir()
    for prefix in ("train", "val"):
        for language in ("fr", "en"):
            lines = (data / f"{prefix}.{language}").read_text().splitlines()[:300]
            (small / f"{prefix}.{language}").write_text("\n".join(lines) + "\n")
    jackknife = tmp_path / "jackknife"
    split(small, jackknife)
    for fold in fold_names(2):
        (jackknife / f"bundle-{fold}").symlink_to(fr_en_bundle, target_is_directory=True)

    def nmt(*arguments: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "nmt_cli.py", *arguments],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done

    nmt("jackknife", "label", "--dir", str(jackknife))
    labels = read_labels(jackknife, "beam")
    assert len(labels.chrf) == 300 and labels.beam_size == 4
    assert labels.vocab_sizes == load_bundle(fr_en_bundle).vocab_sizes
    assert all(0 <= c <= 100 for c in labels.chrf)

    out = tmp_path / CONFIDENCE_FILE  # (not into the shared bundle)
    done = nmt(
        "calibrate", "--model-dir", str(fr_en_bundle), "--jackknife", str(jackknife),
        "--source", str(small / "val.fr"), "--reference", str(small / "val.en"),
        "--out", str(out), "--threads", "1",
    )  # fmt: skip
    calibration = load_calibration(tmp_path, load_bundle(fr_en_bundle).vocab_sizes)
    for search in ("greedy", "beam"):
        fitted = calibration.searches[search]
        assert "lexicon" in fitted.features and fitted.lexicon is not None
        assert any(w != 0 for w in fitted.lexicon.source)
    summary = json.loads(done.stdout)
    assert summary["beam_ece"] < 0.1

    # labels made by models with another tokenizer are refused, saying why
    for fold in fold_names(2):
        path = labels_path(jackknife, "greedy", fold)
        with gzip.open(path, "rt") as lines:
            header, *rows = lines.read().splitlines()
        header = json.dumps({**json.loads(header), "tokenizer": "0" * 64})
        with gzip.open(path, "wt") as out:
            out.write("\n".join([header, *rows]) + "\n")
    refused = subprocess.run(
        [sys.executable, "nmt_cli.py", "calibrate", "--model-dir", str(fr_en_bundle),
         "--jackknife", str(jackknife), "--source", str(small / "val.fr"),
         "--reference", str(small / "val.en"), "--out", str(tmp_path / "x.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "another tokenizer" in refused.stderr
    assert not (tmp_path / "x.json").exists()
