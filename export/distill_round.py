"""A distillation round on one GPU, in one command: teachers, their ensemble, distilled targets,
students. For a machine lent for minutes (the device tool: at most 10 minutes a command, 8 files
of 16 MiB back); on 2 CPU cores the same round takes a day.

    here:   make distill DISTILLED=build/distilled/fr-en && cp -r ../shared/data/multi30k build/
    there:  python3 -m export.distill_round run        (carry build/distilled and build/multi30k)
    here:   python -m export.distill_round unpack DIR  (DIR: where the returned files lie)

What runs, side by side on the one GPU (every run is `nmt train`, each under a time budget,
so that the round ends in time whatever the GPU's speed turns out to be):
1. Teachers, trained on the references with the committed model's SentencePiece model (so
   that they and the committed model can decode as one ensemble). At the same time, two
   6 + 2 students: one on the references, one on the committed model's beam-4 translations
   (make distill): the rows "distillation" and "teacher" of docs/quality.md.
2. The teacher: of the committed model, the best new teacher, the new teachers together and
   all of them together, the ensemble with the best beam-4 BLEU on val. Its beam-4
   translations of the 29,000 training sources are the students' targets.
3. Students on those targets, each with its own SentencePiece model trained on them: shapes
   (encoder x decoder layers) and vocabulary sizes.
Each run's final model is the better of its best epoch and the average of its last epochs, by
val BLEU (nmt train --out). The students with the best val BLEU come back as tar pieces, their
weights in fp16 to fit (unpack makes them fp32 again: fp16 rounding moves a weight by at most
2^-11 of itself); every run's history, and the distilled targets, come back as well.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMITTED = Path("models/fr-en")
# Pre-norm, in M2M-100's layout so that a student that is kept exports to Hugging Face
# (export/m2m100.py); the rest as the students of docs/training.md.
STUDENT_RECIPE = [
    *("--pre-norm", "--positions", "sinusoidal_offset", "--decoder-start", "eos"),
    *("--warmup-steps", "400", "--dropout", "0.1", "--patience", "6"),
]
# The committed model's own recipe (post-norm 3 + 3, d 256), another seed: a known-good member.
COMMITTED_RECIPE = ["--no-pre-norm", "--warmup-steps", "400", "--dropout", "0.2"]
WIDE_TEACHER = [
    *("--d-model", "512", "--n-heads", "8", "--ffn-dim", "2048"),
    *("--encoder-layers", "6", "--decoder-layers", "6", "--pre-norm"),
    *("--dropout", "0.3", "--learning-rate", "0.0007", "--warmup-steps", "400"),
]
MAX_BYTES_BACK = 60 * 2**20
MAX_FILES_BACK = 8
PIECE_BYTES = 15 * 2**20


@dataclass
class Run:
    """One `nmt train` process."""

    name: str
    data_dir: Path
    args: list[str]
    tokenizer: Path | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, work: Path, minutes: float) -> None:
        command = [
            sys.executable, "nmt_cli.py", "train", "--run-dir", str(work / "runs" / self.name),
            "--out", str(self.model_dir(work)), "--data-dir", str(self.data_dir),
            "--time-budget-minutes", f"{minutes:.2f}", "--max-epochs", "60", *self.args,
        ]  # fmt: skip
        if self.tokenizer is not None:
            command += ["--tokenizer", str(self.tokenizer)]
        log = (work / "runs" / f"{self.name}.log").open("w")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        print(f"[{clock()}] started {self.name}: {minutes:.1f} min", flush=True)

    def model_dir(self, work: Path) -> Path:
        return work / "models" / self.name

    def valid_bleu(self, work: Path) -> float:
        """The final model's greedy val BLEU (nmt train's final.json; for a run stopped before
        its end, its best epoch's), -1 if it has none."""
        run_dir = work / "runs" / self.name
        final = run_dir / "final.json"
        if final.is_file():
            summary = json.loads(final.read_text())
            return summary["valid_bleu"][summary["chosen"]]
        history = run_dir / "history.jsonl"
        if not self.model_dir(work).is_dir() or not history.is_file():
            return -1.0
        return max(json.loads(line)["valid_bleu"] for line in history.read_text().splitlines())

    def stop(self, work: Path) -> None:
        """End a run that outlasted the round's plan: its best epoch becomes its model."""
        self.process.terminate()
        self.process.wait()
        best = work / "runs" / self.name / "best"
        if not self.model_dir(work).is_dir() and best.is_dir():
            shutil.copytree(best, self.model_dir(work))
        print(f"[{clock()}] stopped {self.name}", flush=True)


started_at = time.monotonic()


def clock() -> str:
    return f"{time.monotonic() - started_at:5.0f}s"


def minutes_until(deadline: float) -> float:
    return max(0.2, (deadline - (time.monotonic() - started_at)) / 60)


def wait(work: Path, runs: list[Run], until: float) -> None:
    """Wait for the runs; those still going `until` seconds into the round are stopped."""
    for run in runs:
        try:
            code = run.process.wait(timeout=max(1.0, until - (time.monotonic() - started_at)))
            print(f"[{clock()}] {run.name} ended ({code})", flush=True)
        except subprocess.TimeoutExpired:
            run.stop(work)


def finish(process: subprocess.Popen, until: float) -> bool:
    """Whether the process ended well by `until` seconds into the round (else it is killed)."""
    try:
        return process.wait(timeout=max(1.0, until - (time.monotonic() - started_at))) == 0
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False


def translate(models: list[Path], source: Path, out: Path, log: Path) -> subprocess.Popen:
    command = [
        sys.executable, "nmt_cli.py", "translate", "--checkpoint", *map(str, models),
        "--beam-size", "4", "--batch-size", "500",
    ]  # fmt: skip
    with source.open() as lines, out.open("w") as sink, log.open("w") as errors:
        return subprocess.Popen(command, stdin=lines, stdout=sink, stderr=errors)


def bleu(hypotheses: Path, references: Path) -> float:
    import sacrebleu

    hyps = hypotheses.read_text(encoding="utf-8").splitlines()
    refs = references.read_text(encoding="utf-8").splitlines()
    if len(hyps) != len(refs):
        return -1.0
    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def choose_teacher(
    work: Path, data: Path, teachers: list[Run], until: float
) -> tuple[list[Path], dict]:
    """The ensemble with the best beam-4 val BLEU, among a few; all evaluated side by side."""
    trained = sorted(
        (t for t in teachers if t.valid_bleu(work) >= 0), key=lambda t: -t.valid_bleu(work)
    )
    new = [t.model_dir(work) for t in trained]
    candidates = {"committed": [COMMITTED]}
    if new:
        candidates["best new teacher"] = new[:1]
    if len(new) > 1:
        candidates["new teachers"] = new
    if new:
        candidates["new teachers and committed"] = [*new, COMMITTED]
    folder = work / "teacher"
    folder.mkdir(exist_ok=True)
    processes = {
        name: translate(models, data / "val.fr", folder / f"{index}.en", folder / f"{index}.log")
        for index, (name, models) in enumerate(candidates.items())
    }
    scores = {}
    for index, (name, process) in enumerate(processes.items()):
        ended = finish(process, until)
        scores[name] = bleu(folder / f"{index}.en", data / "val.en") if ended else -1.0
    best = max(scores, key=scores.get)
    report = {
        "val_beam4_bleu": scores,
        "chosen": best,
        "members": [str(m) for m in candidates[best]],
        "teachers_greedy_val_bleu": {t.name: t.valid_bleu(work) for t in teachers},
    }
    print(f"[{clock()}] teacher: {json.dumps(report)}", flush=True)
    return candidates[best], report


def distill(work: Path, data: Path, teacher: list[Path], shards: int, until: float) -> Path | None:
    """The teacher's beam-4 translations of the training sources, in `shards` processes; None
    if they are not done `until` seconds into the round."""
    out = work / "distilled"
    pieces = work / "distill-shards"
    pieces.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    sources = (data / "train.fr").read_text(encoding="utf-8").splitlines(keepends=True)
    size = -(-len(sources) // shards)
    processes = []
    for index in range(shards):
        shard = pieces / f"{index}.fr"
        shard.write_text("".join(sources[index * size : (index + 1) * size]), encoding="utf-8")
        processes.append(translate(teacher, shard, pieces / f"{index}.en", pieces / f"{index}.log"))
    ended = [finish(process, until) for process in processes]
    if not all(ended):
        print(f"[{clock()}] distillation not done in time (see {pieces})", flush=True)
        return None
    with (out / "train.en").open("w", encoding="utf-8") as sink:
        for index in range(shards):
            sink.write((pieces / f"{index}.en").read_text(encoding="utf-8"))
    for name in ("train.fr", "val.fr", "val.en"):
        shutil.copyfile(data / name, out / name)
    lines = len((out / "train.en").read_text(encoding="utf-8").splitlines())
    if lines != len(sources):
        print(f"[{clock()}] distillation gave {lines} lines for {len(sources)}", flush=True)
        return None
    print(f"[{clock()}] distilled {lines} sentences", flush=True)
    return out


def student(name: str, data_dir: Path, shape: str, vocab: int) -> Run:
    encoder, decoder = shape.split("x")
    return Run(
        name,
        data_dir,
        [
            *("--encoder-layers", encoder, "--decoder-layers", decoder),
            *("--vocab-size", str(vocab), *STUDENT_RECIPE),
        ],
    )


def pack(
    work: Path,
    out: Path,
    students: list[Run],
    report: dict,
    limits: tuple[int, int, int] | None = None,
) -> None:
    """What comes back: the logs and histories, the distilled targets, then the students with
    the best val BLEU, as many as the limits on files and bytes allow (pack_model's)."""
    out.mkdir(parents=True, exist_ok=True)
    (work / "round.json").write_text(json.dumps(report, indent=2) + "\n")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as logs:
        logs.add(work / "round.json", "round.json")
        for path in sorted((work / "runs").glob("*.log")):
            logs.add(path, f"runs/{path.name}")
        for name in ("history.jsonl", "final.json", "train_config.json"):
            for path in sorted((work / "runs").glob(f"*/{name}")):
                logs.add(path, f"runs/{path.parent.name}/{name}")
        for path in sorted((work / "teacher").glob("*")):
            logs.add(path, f"teacher/{path.name}")
    if (work / "distilled" / "train.en").is_file():
        with tarfile.open(out / "distilled.tar.gz", "w:gz") as distilled:
            distilled.add(work / "distilled" / "train.en", "train.en")
    ranked = sorted(
        (s for s in students if s.valid_bleu(work) >= 0), key=lambda s: -s.valid_bleu(work)
    )
    for run in ranked:
        pack_model(run.model_dir(work), run.name, work, out, limits=limits)


def pack_model(
    model_dir: Path,
    name: str,
    work: Path,
    out: Path,
    leave_out: tuple[str, ...] = (),
    limits: tuple[int, int, int] | None = None,
) -> bool:
    """A model directory, its weights in fp16 and without the files `leave_out`, as tar
    pieces `name`.tar.partN in `out`, if they fit beside what is there within the limits
    (pieces' bytes, files, bytes in all: by default PIECE_BYTES, MAX_FILES_BACK,
    MAX_BYTES_BACK); whether it was packed."""
    piece_bytes, max_files, max_bytes = limits or (PIECE_BYTES, MAX_FILES_BACK, MAX_BYTES_BACK)
    files = len(list(out.iterdir()))
    used = sum(p.stat().st_size for p in out.iterdir())
    archive = work / f"{name}.tar"
    half = work / "fp16" / name
    to_fp16(model_dir, half)
    for left in leave_out:
        (half / left).unlink()
    with tarfile.open(archive, "w") as tar:
        tar.add(half, name)
    size = archive.stat().st_size
    count = -(-size // piece_bytes)
    if files + count > max_files or used + size > max_bytes:
        print(f"[{clock()}] no room for {name} ({size / 2**20:.1f} MiB)", flush=True)
        return False
    with archive.open("rb") as whole:
        for index in range(count):
            (out / f"{name}.tar.part{index}").write_bytes(whole.read(piece_bytes))
    print(f"[{clock()}] packed {name} ({size / 2**20:.1f} MiB)", flush=True)
    return True


def to_fp16(model_dir: Path, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model_dir, out)
    weights = out / "model.safetensors"
    save_file({n: w.half() for n, w in load_file(str(weights)).items()}, str(weights))


def unpack(folder: Path, into: Path) -> None:
    """The returned pieces -> fp32 model directories under `into`, and the logs beside them."""
    into.mkdir(parents=True, exist_ok=True)
    for name in ("logs.tar.gz", "distilled.tar.gz"):
        if (folder / name).is_file():
            target = into / name.split(".")[0]
            with tarfile.open(folder / name) as archive:
                archive.extractall(target, filter="data")
    unpack_models(folder, into)


def unpack_models(folder: Path, into: Path) -> list[Path]:
    """The models packed in `folder` (pack_model's pieces) -> fp32 model directories under
    `into`."""
    from safetensors.torch import load_file, save_file

    into.mkdir(parents=True, exist_ok=True)
    unpacked = []
    names = sorted({p.name.split(".tar.part")[0] for p in folder.glob("*.tar.part*")})
    for name in names:
        parts = sorted(
            folder.glob(f"{name}.tar.part*"), key=lambda p: int(p.name.rsplit("t", 1)[1])
        )
        whole = into / f"{name}.tar"
        with whole.open("wb") as sink:
            for part in parts:
                sink.write(part.read_bytes())
        with tarfile.open(whole) as archive:
            archive.extractall(into, filter="data")
        whole.unlink()
        weights = into / name / "model.safetensors"
        save_file({n: w.float() for n, w in load_file(str(weights)).items()}, str(weights))
        print(into / name)
        unpacked.append(into / name)
    return unpacked


def run_round(args: argparse.Namespace) -> None:
    work, data, deadline = args.work, args.data, args.deadline_seconds
    shutil.rmtree(work, ignore_errors=True)
    (work / "runs").mkdir(parents=True)
    os.environ["PYTHONUNBUFFERED"] = "1"
    tokenizer = COMMITTED / "sentencepiece.model"
    teachers = [
        Run("teacher-wide-1", data, [*WIDE_TEACHER, "--seed", "1"], tokenizer),
        Run("teacher-wide-2", data, [*WIDE_TEACHER, "--seed", "2"], tokenizer),
        Run("teacher-small-2", data, [*COMMITTED_RECIPE, "--seed", "2"], tokenizer),
    ]
    # The plan, in seconds into the round: no phase may eat the packing's time.
    students_end = deadline - args.pack_seconds
    teachers_end = 60 * args.teacher_minutes + 30
    choice_end = teachers_end + 50
    distill_end = choice_end + 70
    early = [student("student-6x2-references", data, "6x2", 8000)]
    if args.committed_distilled:
        early.append(
            student("student-6x2-committed-teacher", args.committed_distilled, "6x2", 8000)
        )
    for run in teachers:
        run.start(work, args.teacher_minutes)
    for run in early:
        run.start(work, minutes_until(students_end))
    wait(work, teachers, teachers_end)
    members, teacher_report = choose_teacher(work, data, teachers, choice_end)
    distilled = distill(work, data, members, args.shards, distill_end)
    if distilled is None:  # the committed model's translations (make distill) instead
        distilled = args.committed_distilled or data
        teacher_report["students_trained_on"] = str(distilled)
    late = [
        student(f"student-{shape}-v{vocab // 1000}k", distilled, shape, vocab)
        for shape, vocab in (("6x1", 8000), ("6x2", 8000), ("6x2", 4000), ("8x2", 4000))
    ]
    for run in late:
        run.start(work, minutes_until(students_end))
    wait(work, early + late, students_end + 10)
    report = {
        "teacher": teacher_report,
        "students_greedy_val_bleu": {s.name: s.valid_bleu(work) for s in early + late},
        "seconds": round(time.monotonic() - started_at),
    }
    print(json.dumps(report, indent=2), flush=True)
    pack(work, args.out, late + early, report, limits_left(args, PIECE_BYTES, MAX_BYTES_BACK))
    print(f"[{clock()}] done", flush=True)


def round_arguments(run: argparse.ArgumentParser, work: str) -> None:
    """What every round's `run` takes: the data carried there, its work folder, where what
    comes back goes ($OUT there) and how much of it to leave to another round run beside it
    in the same command, and its time: the deadline, the packing's share of it."""
    run.add_argument("--data", type=Path, default=Path("build/multi30k"))
    run.add_argument("--work", type=Path, default=Path(work))
    run.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "build/round-out")))
    run.add_argument(
        "--leave-files", type=int, default=0, help="files of the 8 to leave to another round"
    )
    run.add_argument(
        "--leave-mib", type=float, default=0.0, help="MiB of the 64 to leave to another round"
    )
    run.add_argument("--deadline-seconds", type=float, default=500)
    run.add_argument("--pack-seconds", type=float, default=40)


def limits_left(args: argparse.Namespace, piece_bytes: int, all_bytes: int) -> tuple[int, int, int]:
    """pack_model's limits for a round: its pieces, and what may come back (all_bytes, in
    MAX_FILES_BACK files) less what it leaves to another round."""
    left = int(args.leave_mib * 2**20)
    return piece_bytes, MAX_FILES_BACK - args.leave_files, all_bytes - left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="the round (on the GPU machine)")
    round_arguments(run, "build/distill-round")
    run.add_argument(
        "--committed-distilled",
        type=Path,
        default=Path("build/distilled/fr-en"),
        help="make distill's output (the committed model as teacher); '' to skip that student",
    )
    run.add_argument("--teacher-minutes", type=float, default=2.8)
    run.add_argument("--shards", type=int, default=4, help="distillation processes")
    unpack_parser = commands.add_parser("unpack", help="the returned files -> model directories")
    unpack_parser.add_argument("folder", type=Path)
    unpack_parser.add_argument("--into", type=Path, default=Path("build/distill-round-back"))
    args = parser.parse_args()
    if args.command == "run":
        if args.committed_distilled and not (args.committed_distilled / "train.en").is_file():
            args.committed_distilled = None
        run_round(args)
    else:
        unpack(args.folder, args.into)


if __name__ == "__main__":
    main()
