"""Training end to end on a toy task made by the test, and resuming after a kill."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from export.checkpoint import load_model_dir  # noqa: E402
from export.train import Trainer, run_training  # noqa: E402
from export.train_config import TrainConfig  # noqa: E402
from export.translate import translate_texts  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


def toy_config(corpus: Path, **overrides) -> TrainConfig:
    settings = dict(
        data_dir=str(corpus), source_lang="src", target_lang="tgt", vocab_size=400,
        d_model=64, n_heads=4, ffn_dim=128, encoder_layers=2, decoder_layers=2, dropout=0.0,
        max_tokens=1200, learning_rate=3e-3, warmup_steps=60, max_epochs=20, patience=20,
        average_last=2, checkpoint_every=10, threads=1,
    )  # fmt: skip
    settings.update(overrides)
    return TrainConfig(**settings)


def test_training_learns_to_reverse_word_order(reverse_corpus: Path, tmp_path: Path) -> None:
    config = toy_config(reverse_corpus)
    summary = run_training(config, tmp_path / "run", tmp_path / "model", show_progress=False)
    history = [line for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert len(history) >= 2
    trainer_history = Trainer(config, tmp_path / "run", show_progress=False).history
    first, last = trainer_history[0], trainer_history[-1]
    assert last["train_loss"] < 0.5 * first["train_loss"]
    model, tokenizer = load_model_dir(tmp_path / "model")
    sources = (reverse_corpus / "val.src").read_text().splitlines()
    references = (reverse_corpus / "val.tgt").read_text().splitlines()
    outputs = translate_texts(model, tokenizer, sources, beam_size=1)
    solved = sum(o == r for o, r in zip(outputs, references, strict=True)) / len(sources)
    # A correct trainer reverses 88% to 100% of them, depending on the CPU's float rounding
    # (the training path differs between CPU models); one that does not learn the task
    # reverses almost none. The bound sits far from both.
    assert solved >= 0.6, f"only {solved:.0%} of held-out sentences reversed ({summary})"


def train_command(config: TrainConfig, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "nmt_cli", "train", "--run-dir", str(run_dir)]
    for field in dataclasses.fields(config):
        flag, value = "--" + field.name.replace("_", "-"), getattr(config, field.name)
        if isinstance(value, bool):  # a switch: --pre-norm / --no-pre-norm
            command.append(flag if value else "--no-" + flag[2:])
        else:
            command += [flag, str(value)]
    return command


def test_a_killed_run_resumes_to_the_same_weights(reverse_corpus: Path, tmp_path: Path) -> None:
    # Long enough to cross an epoch boundary (validation, epoch files) and several checkpoints.
    config = toy_config(reverse_corpus, max_steps=70, dropout=0.1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    subprocess.run(train_command(config, tmp_path / "straight"), env=env, check=True, cwd=ROOT)

    killed_dir = tmp_path / "killed"
    process = subprocess.Popen(train_command(config, killed_dir), env=env, cwd=ROOT)
    deadline = time.monotonic() + 120
    while not (killed_dir / "state.pt").exists():
        assert process.poll() is None, "training ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # let it get some way past the first checkpoint
    process.send_signal(signal.SIGKILL)
    process.wait()
    interrupted_at = torch.load(killed_dir / "state.pt", weights_only=True)["step"]
    assert interrupted_at < config.max_steps
    subprocess.run(train_command(config, killed_dir), env=env, check=True, cwd=ROOT)

    straight = torch.load(tmp_path / "straight" / "state.pt", weights_only=True)
    resumed = torch.load(killed_dir / "state.pt", weights_only=True)
    assert straight["step"] == resumed["step"] == config.max_steps
    for name, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name

    def without_timing(history: list[dict]) -> list[dict]:
        return [{k: v for k, v in epoch.items() if k != "seconds"} for epoch in history]

    assert without_timing(straight["history"]) == without_timing(resumed["history"])
    assert len(straight["history"]) >= 2  # the runs crossed epoch boundaries


def test_a_time_budget_stops_between_epochs_and_the_model_is_still_written(
    reverse_corpus: Path, tmp_path: Path
) -> None:
    # A budget shorter than one epoch: the first epoch runs (nothing is known of its length
    # before it), then no other starts, and the final model is chosen and written as usual.
    config = toy_config(reverse_corpus, max_epochs=5)
    summary = run_training(
        config, tmp_path / "run", tmp_path / "model", show_progress=False,
        time_budget_minutes=0.001,
    )  # fmt: skip
    assert len((tmp_path / "run" / "history.jsonl").read_text().splitlines()) == 1
    assert summary["chosen"] == "best"
    assert (tmp_path / "model" / "model.safetensors").is_file()


def test_runs_given_one_tokenizer_share_it_and_a_resume_cannot_swap_it(
    reverse_corpus: Path, tmp_path: Path
) -> None:
    config = toy_config(reverse_corpus, max_steps=2)
    run_training(config, tmp_path / "first", None, show_progress=False)
    pieces = tmp_path / "first" / "sentencepiece.model"
    other = toy_config(reverse_corpus, max_steps=2, seed=99, vocab_size=300)
    run_training(other, tmp_path / "second", None, show_progress=False, tokenizer=pieces)
    assert (tmp_path / "second" / "sentencepiece.model").read_bytes() == pieces.read_bytes()
    different = tmp_path / "different.model"
    different.write_bytes(b"other pieces")
    with pytest.raises(ValueError, match="another tokenizer"):
        run_training(other, tmp_path / "second", None, show_progress=False, tokenizer=different)


@pytest.mark.parametrize("bf16", [False, True])
def test_bf16_trains_in_bfloat16_and_keeps_float32_weights(
    reverse_corpus: Path, tmp_path: Path, bf16: bool
) -> None:
    """--bf16: the training forward pass computes in bfloat16, validation in float32, and
    the weights stay float32; the toy task is still learned."""
    config = toy_config(reverse_corpus, bf16=bf16)
    trainer = Trainer(config, tmp_path / "run", show_progress=False)
    seen = []  # what the model's first linear layer computes in
    linear = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    batch = trainer._batch(list(range(8)), trainer.train_sources, trainer.train_targets)
    trainer.model.train()
    trainer._loss(batch, 0.1)
    trainer.validation_loss()  # puts the model in eval mode
    hook.remove()
    assert seen[0] == (torch.bfloat16 if bf16 else torch.float32)
    assert set(seen[1:]) == {torch.float32}
    run_training(config, tmp_path / "run", tmp_path / "model", show_progress=False)
    model, tokenizer = load_model_dir(tmp_path / "model")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    sources = (reverse_corpus / "val.src").read_text().splitlines()
    references = (reverse_corpus / "val.tgt").read_text().splitlines()
    outputs = translate_texts(model, tokenizer, sources, beam_size=1)
    solved = sum(o == r for o, r in zip(outputs, references, strict=True)) / len(sources)
    # 93-94% here in either precision after 20 epochs; a model that does not learn: almost none
    assert solved >= 0.5, f"only {solved:.0%} of held-out sentences reversed"


def test_the_m2m100_layout_trains_a_model_that_transformers_computes_alike(
    reverse_corpus: Path, tmp_path: Path
) -> None:
    """--pre-norm --positions sinusoidal_offset --decoder-start eos: a model M2M-100's class
    in transformers holds as it is (the same weights under its names give the same logits),
    so that a student trained so can leave for Hugging Face's tools."""
    transformers = pytest.importorskip("transformers")
    from export.hf.common import hf_layer_name

    config = toy_config(
        reverse_corpus, max_steps=30, pre_norm=True, positions="sinusoidal_offset",
        decoder_start="eos",
    )  # fmt: skip
    run_training(config, tmp_path / "run", tmp_path / "model", show_progress=False)
    ours, tokenizer = load_model_dir(tmp_path / "model")
    ours.eval()
    c = ours.config
    assert (c.pre_norm, c.final_layer_norm, c.positions) == (True, True, "sinusoidal_offset")
    assert c.decoder_start_id == c.eos_id
    assert not ours.final_logits_bias.any()  # (M2M-100 has none)
    hf_config = transformers.M2M100Config(
        vocab_size=c.vocab_size, d_model=c.d_model, encoder_layers=c.encoder_layers,
        decoder_layers=c.decoder_layers, encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.ffn_dim, decoder_ffn_dim=c.ffn_dim,
        activation_function=c.activation, max_position_embeddings=c.max_positions,
        scale_embedding=c.scale_embedding, pad_token_id=c.pad_id, eos_token_id=c.eos_id,
        decoder_start_token_id=c.decoder_start_id, dropout=0.0,
    )  # fmt: skip
    hf = transformers.M2M100ForConditionalGeneration(hf_config).eval()
    weights = {}
    for name, tensor in ours.state_dict().items():
        if name == "embed_tokens.weight":
            for tied in ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens",
                         "lm_head"):  # fmt: skip
                weights[f"{tied}.weight"] = tensor
        elif name.startswith(("encoder_layer_norm", "decoder_layer_norm")):
            side, parameter = name.split("_layer_norm.")
            weights[f"model.{side}.layer_norm.{parameter}"] = tensor
        elif name != "final_logits_bias":
            weights[hf_layer_name(name)] = tensor
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not unexpected and not [m for m in missing if "embed_positions" not in m]

    sources = (reverse_corpus / "val.src").read_text().splitlines()[:4]
    targets = (reverse_corpus / "val.tgt").read_text().splitlines()[:4]
    source_rows = tokenizer.encode_batch(sources)  # pieces, </s>
    target_rows = [[c.decoder_start_id, *t[:-1]] for t in tokenizer.encode_batch(targets)]

    def padded(rows: list[list[int]]) -> torch.Tensor:  # right-padded, as both expect
        width = max(map(len, rows))
        return torch.tensor([row + [c.pad_id] * (width - len(row)) for row in rows])

    source_ids, target_in = padded(source_rows), padded(target_rows)
    with torch.no_grad():
        expected = hf(
            input_ids=source_ids, attention_mask=source_ids != c.pad_id,
            decoder_input_ids=target_in,
        ).logits  # fmt: skip
        got = ours(source_ids, source_ids != c.pad_id, target_in)
    real = target_in != c.pad_id
    real[:, 0] = True  # (the start token, </s> here, is never the padding id)
    assert torch.allclose(got[real], expected[real], atol=1e-4), (got - expected).abs().max()


def test_a_run_started_before_a_setting_existed_resumes_with_its_default(
    reverse_corpus: Path, tmp_path: Path
) -> None:
    import json

    config = toy_config(reverse_corpus, max_steps=2)
    Trainer(config, tmp_path / "run", show_progress=False)
    saved_path = tmp_path / "run" / "train_config.json"
    saved = json.loads(saved_path.read_text())
    del saved["positions"], saved["decoder_start"]  # as written before they were settings
    saved_path.write_text(json.dumps(saved))
    Trainer(config, tmp_path / "run", show_progress=False)  # the defaults: the same run
    other = dataclasses.replace(config, positions="sinusoidal_offset")
    with pytest.raises(ValueError, match=r"other settings \(positions\)"):
        Trainer(other, tmp_path / "run", show_progress=False)


def test_an_unknown_decoder_start_is_refused() -> None:
    with pytest.raises(ValueError, match="decoder_start must be one of"):
        TrainConfig(decoder_start="bos")
