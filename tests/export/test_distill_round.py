"""The distillation round's packing (export/distill_round.py): what comes back from the GPU
machine, within its limits, unpacks to the students' models."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from export import distill_round  # noqa: E402
from export.checkpoint import TOKENIZER_FILE, save_model_dir  # noqa: E402
from export.model.config import ModelConfig  # noqa: E402
from export.model.transformer import Transformer  # noqa: E402


def fake_run(work: Path, name: str, bleu: float, d_model: int) -> distill_round.Run:
    """A finished run as nmt train leaves it: its model directory and final.json."""
    torch.manual_seed(len(name))
    model = Transformer(ModelConfig(vocab_size=300, d_model=d_model, n_heads=4, ffn_dim=64))
    run = distill_round.Run(name, work, [])
    save_model_dir(
        model, Path("models/fr-en") / TOKENIZER_FILE, run.model_dir(work), description=""
    )
    run_dir = work / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / "history.jsonl").write_text(json.dumps({"epoch": 1, "valid_bleu": bleu}) + "\n")
    (run_dir / "final.json").write_text(
        json.dumps({"chosen": "best", "valid_bleu": {"best": bleu}})
    )
    return run


def test_the_best_students_come_back_within_the_limits_and_unpack_to_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (Path("models/fr-en") / TOKENIZER_FILE).is_file():
        pytest.skip("the committed model is not in this checkout")
    work, out = tmp_path / "work", tmp_path / "out"
    runs = [
        fake_run(work, "weak", 30.0, 64),
        fake_run(work, "best", 50.0, 64),
        fake_run(work, "second", 40.0, 64),
    ]
    # Limits scaled down to these models (about 0.85 MB each, with their tokenizer):
    # pieces of 300 kB, room for two students.
    monkeypatch.setattr(distill_round, "PIECE_BYTES", 300_000)
    monkeypatch.setattr(distill_round, "MAX_FILES_BACK", 2 + 2 * 3)
    monkeypatch.setattr(distill_round, "MAX_BYTES_BACK", 2_000_000)
    distill_round.pack(work, out, runs, {"note": "test"})

    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= distill_round.MAX_FILES_BACK
    assert all(p.stat().st_size <= 300_000 for p in out.iterdir())
    assert any(name.startswith("best.tar.part") for name in files)
    assert any(name.startswith("second.tar.part") for name in files)
    assert not any(name.startswith("weak") for name in files)  # the lowest BLEU did not fit
    with tarfile.open(out / "logs.tar.gz") as logs:
        assert "runs/best/history.jsonl" in logs.getnames()

    distill_round.unpack(out, tmp_path / "back")
    original = load_file(str(runs[1].model_dir(work) / "model.safetensors"))
    back = load_file(str(tmp_path / "back" / "best" / "model.safetensors"))
    assert back.keys() == original.keys()
    for name, weight in original.items():
        assert back[name].dtype == torch.float32
        assert torch.equal(back[name], weight.half().float()), name
