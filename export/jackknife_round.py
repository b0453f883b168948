"""A jackknife trained and labelled on one GPU machine, in one command. For a machine lent
for minutes (the device tool: at most 10 minutes a command, 8 files of 16 MiB back); on 2
CPU cores four folds take about four hours.

    here:   make gpu-round-inputs   # build/multi30k, build/distilled/fr-en (the served
                                    # model's translations: make distill), .whl (the wheels)
    there:  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site &&
            python3 -m export.jackknife_round run
            (carry build/multi30k, build/distilled/fr-en and .whl)
    here:   python -m export.jackknife_round unpack DIR --into build/jackknife-4
            (DIR: where the returned files lie; it prints what comes next)

Beside the distillation round in the same command (a lent machine's time is 15 minutes a
session: one command's worth), sharing the GPU, the cores and what comes back (the labels
take 2 files and about 9 MiB):

    there:  ... && export PYTHONPATH=/tmp/site && (python3 -m export.jackknife_round run &
            python3 -m export.distill_round run --leave-files 2 --leave-mib 12; wait)

What runs there: `nmt jackknife split`'s folds (4 by default: each model learns three
quarters of the training pairs, as the served model translated them, `--targets`), one
`nmt train` a fold, side by side on the one GPU, each under a time budget so that the round
ends in time whatever the GPU's speed (export/distill_round.py's runs); then, on the
machine's cores, `nmt export` of each fold's final model (the better of its best epoch and
the average of its last epochs, by val BLEU) and `nmt jackknife label`, a process a fold.
What comes back is the labels (a few MiB, whatever the number of folds). Should the
labelling fail there (the runtime needs pydantic, which that machine lacks: the wheels),
the fold models come back instead, in fp16 and without their tokenizer (the committed
model's, which the recipe names): 15 MiB each, as many as fit the 64 MiB (four).

`unpack` splits the same folds here (the same data, seed and targets; it checks the
returned folds' sentence ids) and puts the labels, or the models (fp32 again, with the
committed tokenizer, checked by its checksum), in the jackknife's folder, and prints the
commands that follow: `nmt calibrate --jackknife`, or first `nmt export` and `nmt jackknife
label`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from export import distill_round
from export.checkpoint import TOKENIZER_FILE
from export.distill_round import Run, pack_model, round_arguments, unpack_models, wait
from export.jackknife import FOLD_MODEL, FR_EN_RECIPE, fold_names, folds_of, labels_path, split

TOKENIZER = Path("models/fr-en/sentencepiece.model")  # the one FOLD_MODEL names
TARGETS = Path("build/distilled/fr-en/train.en")  # make gpu-round-inputs' (make distill's)
# A piece of what comes back (the device tool's limits: 16 MiB each, 8 files, 64 MiB in all),
# less a margin: a fold model's tar (15.0 MiB) in one piece; four of them and the logs fit
# 63 MiB.
PIECE_BYTES = 16 * 2**20 - 2**16
ALL_BYTES = 63 * 2**20
# What `nmt jackknife label` imports that the GPU machine's image lacks (docs: the device
# tool's KINDS.md), carried there as wheels for its Python 3.12.
WHEELS = (
    "pydantic",
    "pydantic-core",
    "pydantic-settings",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "python-dotenv",
)
SEARCHES = ("greedy", "beam")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_round(args: argparse.Namespace) -> None:
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    (work / "runs").mkdir(parents=True)
    os.environ["PYTHONUNBUFFERED"] = "1"
    jackknife = work / "jackknife"
    split(args.data, jackknife, targets=args.targets, folds=args.folds)
    folds = fold_names(args.folds)
    # the machine's cores shared out (each run's batching and validation), the GPU shared
    threads = ["--threads", str(max(1, (os.cpu_count() or 1) // args.folds))]
    runs = [
        Run(f"model-{fold}", jackknife / f"data-{fold}", [*threads, *args.recipe.split()])
        for fold in folds
    ]
    labelling_starts = args.deadline_seconds - args.pack_seconds - args.label_seconds
    for run in runs:
        run.start(work, distill_round.minutes_until(labelling_starts - 20))
    wait(work, runs, labelling_starts)
    trained = [run for run in runs if run.model_dir(work).is_dir()]
    labelled = label(work, jackknife, trained, args.deadline_seconds - args.pack_seconds)
    report = {
        "folds": folds,
        "targets": str(args.targets) if args.targets else None,
        "recipe": args.recipe,
        "tokenizer_sha256": sha256(TOKENIZER),
        "greedy_val_bleu": {run.name: run.valid_bleu(work) for run in runs},
        "labelled": labelled,
        "seconds": round(time.monotonic() - distill_round.started_at),
    }
    print(json.dumps(report, indent=2), flush=True)
    limits = distill_round.limits_left(args, PIECE_BYTES, ALL_BYTES)
    pack(work, jackknife, args.out, runs, report, limits)
    print(f"[{distill_round.clock()}] done", flush=True)


def label(work: Path, jackknife: Path, trained: list[Run], until: float) -> bool:
    """Each trained fold model exported into the jackknife (bundle-X), then its fold
    labelled, a process a fold and search, side by side on the machine's cores; whether
    every fold's labels were written by `until` seconds into the round."""
    models = {run.name.removeprefix("model-"): run.model_dir(work) for run in trained}
    exports = {
        f"export-{fold}": [
            *("export", "--checkpoint", str(model)),
            "--out",
            f"{jackknife}/bundle-{fold}",
        ]
        for fold, model in models.items()
    }
    labels = {
        f"label-{fold}-{search}": [
            *("jackknife", "label", "--dir", str(jackknife)),
            *("--fold", fold, "--search", search),
        ]
        for fold in models
        for search in SEARCHES
    }
    for step in (exports, labels):
        processes = [
            subprocess.Popen(
                [sys.executable, "nmt_cli.py", *arguments],
                stdout=(work / "runs" / f"{name}.log").open("w"),
                stderr=subprocess.STDOUT,
            )
            for name, arguments in step.items()
        ]
        ended = [distill_round.finish(process, until) for process in processes]
        print(f"[{distill_round.clock()}] {sum(ended)} of {len(ended)} ended well", flush=True)
    return all(
        labels_path(jackknife, search, fold).is_file()
        for search in SEARCHES
        for fold in folds_of(jackknife)
    )


def pack(
    work: Path,
    jackknife: Path,
    out: Path,
    runs: list[Run],
    report: dict,
    limits: tuple[int, int, int] = (PIECE_BYTES, distill_round.MAX_FILES_BACK, ALL_BYTES),
) -> None:
    """What comes back: the logs, histories and the folds' sentence ids; then the labels, or
    (where the labelling failed) each fold's model (fp16, no tokenizer) that fits the limits
    (pack_model's), in fold order."""
    out.mkdir(parents=True, exist_ok=True)
    (work / "round.json").write_text(json.dumps(report, indent=2) + "\n")
    with tarfile.open(out / "jackknife-logs.tar.gz", "w:gz") as logs:
        logs.add(work / "round.json", "round.json")
        for path in sorted((work / "runs").glob("*.log")):
            logs.add(path, f"runs/{path.name}")
        for name in ("history.jsonl", "final.json", "train_config.json"):
            for path in sorted((work / "runs").glob(f"*/{name}")):
                logs.add(path, f"runs/{path.parent.name}/{name}")
        for fold in report["folds"]:
            logs.add(jackknife / f"heldout-{fold}" / "ids", f"heldout-{fold}/ids")
    if report["labelled"]:
        with tarfile.open(out / "jackknife-labels.tar", "w") as labels:
            labels.add(jackknife / "labels", "labels")
        return
    for run in runs:
        if run.model_dir(work).is_dir():
            pack_model(run.model_dir(work), run.name, work, out, (TOKENIZER_FILE,), limits)


def unpack(folder: Path, into: Path, data: Path, targets: Path | None) -> list[str]:
    """What came back -> the jackknife `into`: its folds split here as they were there
    (checked), then the labels, or each model fp32 with the committed tokenizer; returns the
    commands that follow."""
    returned = folder / "jackknife-round"
    with tarfile.open(folder / "jackknife-logs.tar.gz") as logs:
        logs.extractall(returned, filter="data")
    report = json.loads((returned / "round.json").read_text())
    folds = report["folds"]
    split(data, into, FR_EN_RECIPE, targets=targets, folds=len(folds))
    for fold in folds:
        here = (into / f"heldout-{fold}" / "ids").read_text()
        if here != (returned / f"heldout-{fold}" / "ids").read_text():
            raise ValueError(
                f"fold {fold} here holds other sentences than the one its model was trained "
                f"outside: split {data} with the round's targets ({report['targets']})"
            )
    calibrate = f"nmt calibrate --model-dir build/models/fr-en --jackknife {into}"
    if (folder / "jackknife-labels.tar").is_file():
        with tarfile.open(folder / "jackknife-labels.tar") as labels:
            labels.extractall(into, filter="data")
        return [calibrate]
    if sha256(TOKENIZER) != report["tokenizer_sha256"]:
        raise ValueError(f"{TOKENIZER} is not the tokenizer the fold models were trained with")
    commands = []
    for model in unpack_models(folder, into):
        shutil.copyfile(TOKENIZER, model / TOKENIZER_FILE)
        fold = model.name.removeprefix("model-")
        commands.append(f"nmt export --checkpoint {model} --out {into}/bundle-{fold}")
    missing = [f for f in folds if not (into / f"model-{f}").is_dir()]
    if missing:
        raise ValueError(f"no model came back for the folds {missing}: see {returned}/runs")
    return [*commands, f"nmt jackknife label --dir {into}", calibrate]


def download_wheels(into: Path) -> None:
    """WHEELS at the versions installed here, for the GPU machine's Python 3.12 (pip's own
    download; the device tool's README says how they install there)."""
    for name in WHEELS:
        version = importlib.metadata.version(name)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
             *("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64"),
             *("--platform", "manylinux2014_x86_64", "--dest", str(into)),
             f"{name}=={version}"],
            check=True,
        )  # fmt: skip
    print("\n".join(sorted(p.name for p in into.glob("*.whl"))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train and label the folds (on the GPU machine)")
    round_arguments(run, "build/jackknife-round")
    run.add_argument(
        "--targets",
        type=Path,
        default=TARGETS,
        help="what the fold models learn (make distill's output); '' for the references",
    )
    run.add_argument("--folds", type=int, default=4)
    run.add_argument("--recipe", default=FOLD_MODEL, help="each fold model's `nmt train` flags")
    run.add_argument(
        "--label-seconds", type=float, default=180, help="the deadline's share for labelling"
    )
    # (a lent machine's command may run 600 s: the round's 540, the wheels' install, margin)
    run.set_defaults(deadline_seconds=540, pack_seconds=30)
    back = commands.add_parser("unpack", help="what came back -> a jackknife's folder")
    back.add_argument("folder", type=Path)
    back.add_argument("--into", type=Path, default=Path("build/jackknife-4"))
    back.add_argument("--data", type=Path, help="the training pairs (default: Multi30k)")
    back.add_argument(
        "--targets",
        type=Path,
        default=TARGETS,
        help="the round's targets ('' for the references)",
    )
    wheels = commands.add_parser("wheels", help="download what the GPU machine lacks")
    wheels.add_argument("--into", type=Path, default=Path(".whl"))
    args = parser.parse_args()
    if getattr(args, "targets", None) is not None and str(args.targets) in ("", "."):
        args.targets = None
    if args.command == "run":
        run_round(args)
    elif args.command == "wheels":
        download_wheels(args.into)
    else:
        from export.train_config import multi30k_dir

        try:
            printed = unpack(args.folder, args.into, args.data or multi30k_dir(), args.targets)
        except (OSError, ValueError) as error:
            raise SystemExit(f"jackknife_round unpack: {error}") from None
        print("\n".join(printed))


if __name__ == "__main__":
    main()
