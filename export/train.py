"""`nmt train`: train the Transformer on a parallel corpus, resumably.

Everything a run needs to continue lives in its run directory:
* `train_config.json`: the settings (a resumed run must be started with the same ones);
* `sentencepiece.model`: the tokenizer, trained on the training split only;
* `state.pt`: weights, optimizer, schedule, RNG state and the position in the data order,
  written atomically every `checkpoint_every` steps and at the end of every epoch;
* `epochs/epoch-N.safetensors`: weights after each epoch (the last few, for averaging);
* `best/`: the model directory with the best validation BLEU so far;
* `history.jsonl`: one line per epoch (losses, BLEU, learning rate, time): the progress to read.

A run killed at any point and started again with the same command continues from `state.pt`
with the same data order and RNG state, and ends in the same weights as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from export.checkpoint import TOKENIZER_FILE, save_model_dir, weights_of
from export.data import bucket_batches, make_batch, read_parallel
from export.model.transformer import Transformer
from export.scoring import corpus_scores
from export.tokenizer import Tokenizer, train_sentencepiece
from export.train_config import TrainConfig
from export.translate import translate_texts

log = logging.getLogger("nmt.train")


def inverse_sqrt_schedule(warmup_steps: int):
    """Linear warmup to 1.0, then decay as 1/sqrt(step): the Transformer paper's schedule."""

    def factor(step: int) -> float:
        step = max(step, 1)
        return min(step / warmup_steps, math.sqrt(warmup_steps / step))

    return factor


def zero_pad_row(model: Transformer) -> None:
    """Keep the <pad> embedding at zero, as Marian does.

    nn.Embedding's padding_idx stops the *input* lookup from training it, but the tied output
    projection would still move it. A zero row matters for interop: Marian-format engines
    (CTranslate2's converter) start decoding from a zero vector rather than the <pad> row,
    and drop that row; with a zero row they decode exactly as we do.
    """
    with torch.no_grad():
        model.embed_tokens.weight[model.config.pad_id].zero_()


def atomic_torch_save(obj: object, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        device: str | None = None,
        show_progress: bool = True,
        tokenizer: Path | None = None,
        time_budget_minutes: float = 0.0,
    ) -> None:
        self.config = config
        # A budget of this process's wall time, not a setting of the model: a resumed run
        # may be given another. No epoch starts that would end past it.
        self.started = time.monotonic()
        self.time_budget_seconds = 60.0 * time_budget_minutes
        self.last_epoch_seconds = 0.0
        self.show_progress = show_progress
        self.run_dir = Path(run_dir)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if config.threads:
            torch.set_num_threads(config.threads)
        if self.device.type == "cuda":
            # TF32 products (fp32 accumulation) on a GPU: several times faster, and training
            # does not notice the shorter mantissa.
            torch.backends.cuda.matmul.allow_tf32 = True
        self._prepare_run_dir(tokenizer)
        self.tokenizer = Tokenizer(self.run_dir / TOKENIZER_FILE)
        self._load_data()
        torch.manual_seed(config.seed)
        self.model = Transformer(config.model_config(self.tokenizer.vocab_size)).to(self.device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=config.learning_rate, betas=(0.9, 0.98), eps=1e-9
        )
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, inverse_sqrt_schedule(config.warmup_steps)
        )
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        # Running sums for this epoch's training loss: saved too, so a resumed epoch reports
        # the same loss as an uninterrupted one.
        self.epoch_loss_sum = 0.0
        self.epoch_tokens = 0
        self.best_bleu = -1.0
        self.epochs_without_improvement = 0
        self.history: list[dict] = []
        if (self.run_dir / "state.pt").exists():
            self._load_state()
        zero_pad_row(self.model)

    # ----- run directory -------------------------------------------------------------------
    def _prepare_run_dir(self, tokenizer: Path | None) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.run_dir / "train_config.json"
        wanted = dataclasses.asdict(self.config)
        if config_path.exists():
            # (a setting added since the run started: it ran with that setting's default)
            saved = dataclasses.asdict(TrainConfig()) | json.loads(config_path.read_text())
            if saved != wanted:
                changed = sorted(k for k in wanted if saved.get(k) != wanted[k])
                raise ValueError(
                    f"{self.run_dir} holds a run with other settings ({', '.join(changed)}); "
                    "resume with the same settings or use a new --run-dir"
                )
        else:
            config_path.write_text(json.dumps(wanted, indent=2) + "\n")
        if tokenizer is not None:  # a given one: runs that share it can form an ensemble
            pieces = self.run_dir / TOKENIZER_FILE
            if pieces.exists() and pieces.read_bytes() != Path(tokenizer).read_bytes():
                raise ValueError(f"{self.run_dir} was started with another tokenizer")
            shutil.copyfile(tokenizer, pieces)
        if not (self.run_dir / TOKENIZER_FILE).exists():
            source, target = self.config.corpus(self.config.train_prefix)
            log.info(
                "training SentencePiece (%d pieces) on %s and %s",
                self.config.vocab_size,
                source,
                target,
            )
            model = train_sentencepiece(
                [source, target], self.run_dir / "sentencepiece", self.config.vocab_size
            )
            assert model == self.run_dir / TOKENIZER_FILE

    def _load_data(self) -> None:
        sources, targets = read_parallel(*self.config.corpus(self.config.train_prefix))
        source_ids = self.tokenizer.encode_batch(sources)
        target_ids = self.tokenizer.encode_batch(targets)
        keep = [
            i
            for i in range(len(source_ids))
            if len(source_ids[i]) <= self.config.max_sentence_tokens
            and len(target_ids[i]) <= self.config.max_sentence_tokens
        ]
        self.train_sources = [source_ids[i] for i in keep]
        self.train_targets = [target_ids[i] for i in keep]
        self.train_lengths = [
            (len(self.train_sources[i]), len(self.train_targets[i])) for i in range(len(keep))
        ]
        self.valid_sources, self.valid_references = read_parallel(
            *self.config.corpus(self.config.valid_prefix)
        )
        self.valid_source_ids = self.tokenizer.encode_batch(self.valid_sources)
        self.valid_target_ids = self.tokenizer.encode_batch(self.valid_references)

    # ----- state ---------------------------------------------------------------------------
    def _save_state(self) -> None:
        atomic_torch_save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(),
                "step": self.step,
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "epoch_loss_sum": self.epoch_loss_sum,
                "epoch_tokens": self.epoch_tokens,
                "best_bleu": self.best_bleu,
                "epochs_without_improvement": self.epochs_without_improvement,
                "history": self.history,
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
            self.run_dir / "state.pt",
        )

    def _load_state(self) -> None:
        state = torch.load(self.run_dir / "state.pt", map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.step = state["step"]
        self.epoch = state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
        self.epoch_loss_sum = state.get("epoch_loss_sum", 0.0)
        self.epoch_tokens = state.get("epoch_tokens", 0)
        self.best_bleu = state["best_bleu"]
        self.epochs_without_improvement = state["epochs_without_improvement"]
        self.history = state["history"]
        torch.set_rng_state(state["torch_rng"].cpu())
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        log.info(
            "resumed at epoch %d, batch %d, step %d", self.epoch, self.batch_in_epoch, self.step
        )

    # ----- training ------------------------------------------------------------------------
    def _loss(self, batch, label_smoothing: float) -> tuple[torch.Tensor, int]:
        # (validation runs in float32, as the exported model will)
        mixed = self.config.bf16 and self.model.training
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=mixed):
            logits = self.model(batch.source_ids, batch.source_mask, batch.target_in)  # [B, T, V]
        pad_id = self.model.config.pad_id
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            batch.target_out.reshape(-1),
            ignore_index=pad_id,
            label_smoothing=label_smoothing,
            reduction="sum",
        )
        return loss, int((batch.target_out != pad_id).sum())

    def _batch(self, indices: list[int], sources, targets):
        config = self.model.config
        return make_batch(
            [sources[i] for i in indices],
            [targets[i] for i in indices],
            config.pad_id,
            config.decoder_start_id,
        ).to(self.device)

    def _train_epoch(self) -> float:
        batches = bucket_batches(
            self.train_lengths, self.config.max_tokens, self.config.seed, self.epoch
        )
        self.model.train()
        progress = tqdm(
            total=len(batches),
            initial=self.batch_in_epoch,
            desc=f"epoch {self.epoch + 1}",
            unit="batch",
            mininterval=30,  # readable in a log file when run in the background
            disable=not self.show_progress,
        )
        while self.batch_in_epoch < len(batches):
            if self.config.max_steps and self.step >= self.config.max_steps:
                break
            batch = self._batch(
                batches[self.batch_in_epoch], self.train_sources, self.train_targets
            )
            loss, tokens = self._loss(batch, self.config.label_smoothing)
            self.optimizer.zero_grad(set_to_none=True)
            (loss / tokens).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm)
            self.optimizer.step()
            zero_pad_row(self.model)
            self.schedule.step()
            self.step += 1
            self.batch_in_epoch += 1
            self.epoch_loss_sum += loss.item()
            self.epoch_tokens += tokens
            progress.update(1)
            progress.set_postfix(
                loss=f"{loss.item() / tokens:.3f}", lr=f"{self.schedule.get_last_lr()[0]:.2e}"
            )
            if self.step % self.config.checkpoint_every == 0:
                self._save_state()
        progress.close()
        return self.epoch_loss_sum / max(self.epoch_tokens, 1)

    @torch.no_grad()
    def validation_loss(self) -> float:
        self.model.eval()
        lengths = [
            (len(s), len(t))
            for s, t in zip(self.valid_source_ids, self.valid_target_ids, strict=True)
        ]
        total_loss, total_tokens = 0.0, 0
        for indices in bucket_batches(lengths, self.config.max_tokens, seed=0, epoch=0):
            batch = self._batch(indices, self.valid_source_ids, self.valid_target_ids)
            loss, tokens = self._loss(batch, label_smoothing=0.0)
            total_loss += float(loss)
            total_tokens += tokens
        return total_loss / max(total_tokens, 1)

    def validation_bleu(self) -> dict[str, float]:
        count = self.config.valid_bleu_sentences or len(self.valid_sources)
        hypotheses = translate_texts(
            self.model, self.tokenizer, self.valid_sources[:count], beam_size=1, batch_size=64
        )
        return corpus_scores(hypotheses, self.valid_references[:count])

    def _end_epoch(self, train_loss: float, seconds: float) -> None:
        valid_loss = self.validation_loss()
        scores = self.validation_bleu()
        epochs_dir = self.run_dir / "epochs"
        epochs_dir.mkdir(exist_ok=True)
        save_file(weights_of(self.model), str(epochs_dir / f"epoch-{self.epoch + 1}.safetensors"))
        for old in sorted(epochs_dir.glob("epoch-*.safetensors"), key=_epoch_number)[
            : -self.config.average_last
        ]:
            old.unlink()
        improved = scores["bleu"] > self.best_bleu
        if improved:
            self.best_bleu = scores["bleu"]
            self.epochs_without_improvement = 0
            save_model_dir(self.model, self.run_dir / TOKENIZER_FILE, self.run_dir / "best")
        else:
            self.epochs_without_improvement += 1
        record = {
            "epoch": self.epoch + 1,
            "step": self.step,
            "train_loss": round(train_loss, 4),
            "valid_loss": round(valid_loss, 4),
            "valid_bleu": scores["bleu"],
            "valid_chrf": scores["chrf"],
            "lr": self.schedule.get_last_lr()[0],
            "seconds": round(seconds, 1),
            "best": improved,
        }
        self.history.append(record)
        with (self.run_dir / "history.jsonl").open("a") as out:
            out.write(json.dumps(record) + "\n")
        log.info("epoch %s", json.dumps(record))
        self.epoch += 1
        self.batch_in_epoch = 0
        self.epoch_loss_sum, self.epoch_tokens = 0.0, 0
        self._save_state()

    def out_of_time(self) -> bool:
        """Whether another epoch, as long as the last one, would end past the time budget.
        A process's first epoch always runs: its length is not known before."""
        if not self.time_budget_seconds or not self.last_epoch_seconds:
            return False
        elapsed = time.monotonic() - self.started
        return elapsed + self.last_epoch_seconds > self.time_budget_seconds

    def finished(self) -> bool:
        return (
            self.epoch >= self.config.max_epochs
            or self.epochs_without_improvement >= self.config.patience
            or bool(self.config.max_steps and self.step >= self.config.max_steps)
            or self.out_of_time()
        )

    def train(self) -> None:
        while not self.finished():
            started = time.monotonic()
            train_loss = self._train_epoch()
            if self.config.max_steps and self.step >= self.config.max_steps:
                self._save_state()
                break
            self._end_epoch(train_loss, time.monotonic() - started)
            self.last_epoch_seconds = time.monotonic() - started  # validation included

    # ----- the final model -----------------------------------------------------------------
    def average_epochs(self) -> Transformer | None:
        """Mean of the last `average_last` epochs' weights (smooths the end of training)."""
        files = sorted((self.run_dir / "epochs").glob("epoch-*.safetensors"), key=_epoch_number)
        files = files[-self.config.average_last :]
        if len(files) < 2:
            return None
        tensors = [load_file(str(f)) for f in files]
        averaged = {
            name: sum(t[name].float() for t in tensors) / len(tensors) for name in tensors[0]
        }
        model = Transformer(self.model.config).to(self.device)
        model.load_state_dict(averaged)
        zero_pad_row(model)  # epochs from before the pad row was held at zero may be averaged in
        return model

    def finalize(self, out_dir: Path) -> dict:
        """Write the better of (best epoch, average of last epochs) by validation BLEU."""
        candidates: dict[str, Transformer] = {}
        best_dir = self.run_dir / "best"
        if best_dir.exists():
            best = Transformer(self.model.config).to(self.device)
            best.load_state_dict(load_file(str(best_dir / "model.safetensors")))
            zero_pad_row(best)  # a best epoch from before the pad row was held at zero
            candidates["best"] = best
        averaged = self.average_epochs()
        if averaged is not None:
            candidates["average"] = averaged
        if not candidates:
            candidates["last"] = self.model
        results = {}
        for name, model in candidates.items():
            self.model, original = model, self.model
            results[name] = self.validation_bleu()["bleu"]
            self.model = original
        chosen = max(results, key=results.get)
        save_model_dir(candidates[chosen], self.run_dir / TOKENIZER_FILE, Path(out_dir))
        summary = {"chosen": chosen, "valid_bleu": results, "out": str(out_dir)}
        (self.run_dir / "final.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def _epoch_number(path: Path) -> int:
    return int(path.stem.split("-")[1])


def run_training(
    config: TrainConfig,
    run_dir: Path,
    out_dir: Path | None,
    device: str | None = None,
    show_progress: bool = True,
    tokenizer: Path | None = None,
    time_budget_minutes: float = 0.0,
) -> dict:
    trainer = Trainer(config, run_dir, device, show_progress, tokenizer, time_budget_minutes)
    trainer.train()
    if out_dir is None:
        return {"step": trainer.step, "epoch": trainer.epoch}
    summary = trainer.finalize(out_dir)
    history = Path(run_dir) / "history.jsonl"
    if history.exists():  # provenance: how the shipped model was trained
        shutil.copyfile(history, Path(out_dir) / "history.jsonl")
    return summary
