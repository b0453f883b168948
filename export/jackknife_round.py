"""A jackknife's fold models trained on one GPU, in one command. For a machine lent for
minutes (the device tool: at most 10 minutes a command, 8 files of 16 MiB back); on 2 CPU
cores four folds take about four hours.

    here:   make distill DISTILLED=build/distilled/fr-en-committed
            cp -r ../shared/data/multi30k build/
    there:  python3 -m export.jackknife_round run
            (carry build/multi30k and build/distilled/fr-en-committed)
    here:   python -m export.jackknife_round unpack DIR --into build/jackknife-4
            (DIR: where the returned files lie; then the commands it prints: `nmt export`
            of each fold model, `nmt jackknife label`)

What runs there: `nmt jackknife split`'s folds (4 by default: each model learns three
quarters of the training pairs, as the served model translated them, `--targets`), one
`nmt train` a fold, side by side on the one GPU, each under a time budget so that the round
ends in time whatever the GPU's speed (export/distill_round.py's runs). Each fold's final
model (the better of its best epoch and the average of its last epochs, by val BLEU) comes
back in fp16 and without its tokenizer, the committed model's that the recipe names: four
fold models (15 MiB each) fit the 64 MiB that may come back. `unpack` splits the same folds
here (the same data, seed and targets; it checks the returned folds' sentence ids), makes
the models fp32 again in the jackknife's folder, with the committed tokenizer (checked by
its checksum), and prints what exports and labels them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

from export import distill_round
from export.checkpoint import TOKENIZER_FILE
from export.distill_round import Run, pack_model, round_arguments, unpack_models, wait
from export.jackknife import FOLD_MODEL, FR_EN_RECIPE, fold_names, split

TOKENIZER = Path("models/fr-en/sentencepiece.model")  # the one FOLD_MODEL names
# What may come back (the device tool's limits: 8 files, 16 MiB each, 64 MiB in all), less a
# margin: a fold model's tar (15.0 MiB) in one piece, four of them and the logs.
LIMITS = (16 * 2**20 - 2**16, 8, 63 * 2**20)


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
    training_ends = args.deadline_seconds - args.pack_seconds
    for run in runs:
        run.start(work, distill_round.minutes_until(training_ends))
    wait(work, runs, training_ends + 10)
    report = {
        "folds": folds,
        "targets": str(args.targets) if args.targets else None,
        "recipe": args.recipe,
        "tokenizer_sha256": sha256(TOKENIZER),
        "greedy_val_bleu": {run.name: run.valid_bleu(work) for run in runs},
        "seconds": round(time.monotonic() - distill_round.started_at),
    }
    print(json.dumps(report, indent=2), flush=True)
    pack(work, jackknife, args.out, runs, report)
    print(f"[{distill_round.clock()}] done", flush=True)


def pack(work: Path, jackknife: Path, out: Path, runs: list[Run], report: dict) -> None:
    """What comes back: the logs, histories and the folds' sentence ids, then each fold's
    model (fp16, no tokenizer), in fold order."""
    out.mkdir(parents=True, exist_ok=True)
    (work / "round.json").write_text(json.dumps(report, indent=2) + "\n")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as logs:
        logs.add(work / "round.json", "round.json")
        for path in sorted((work / "runs").glob("*.log")):
            logs.add(path, f"runs/{path.name}")
        for name in ("history.jsonl", "final.json", "train_config.json"):
            for path in sorted((work / "runs").glob(f"*/{name}")):
                logs.add(path, f"runs/{path.parent.name}/{name}")
        for fold in report["folds"]:
            logs.add(jackknife / f"heldout-{fold}" / "ids", f"heldout-{fold}/ids")
    for run in runs:
        if run.model_dir(work).is_dir():
            pack_model(run.model_dir(work), run.name, work, out, (TOKENIZER_FILE,), LIMITS)


def unpack(folder: Path, into: Path, data: Path, targets: Path | None) -> list[str]:
    """The returned fold models -> the jackknife `into`: its folds split here as they were
    there (checked), each model fp32 with the committed tokenizer; returns the commands that
    export and label them."""
    returned = folder / "round"
    with tarfile.open(folder / "logs.tar.gz") as logs:
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
    return [*commands, f"nmt jackknife label --dir {into}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the folds' models (on the GPU machine)")
    round_arguments(run, "build/jackknife-round")
    run.add_argument(
        "--targets",
        type=Path,
        default=Path("build/distilled/fr-en-committed/train.en"),
        help="what the fold models learn (make distill's output); '' for the references",
    )
    run.add_argument("--folds", type=int, default=4)
    run.add_argument("--recipe", default=FOLD_MODEL, help="each fold model's `nmt train` flags")
    back = commands.add_parser("unpack", help="the returned files -> a jackknife's folder")
    back.add_argument("folder", type=Path)
    back.add_argument("--into", type=Path, default=Path("build/jackknife-4"))
    back.add_argument("--data", type=Path, help="the training pairs (default: Multi30k)")
    back.add_argument(
        "--targets",
        type=Path,
        default=Path("build/distilled/fr-en-committed/train.en"),
        help="the round's targets ('' for the references)",
    )
    args = parser.parse_args()
    if args.targets is not None and str(args.targets) in ("", "."):
        args.targets = None
    if args.command == "run":
        run_round(args)
    else:
        from export.train_config import multi30k_dir

        try:
            printed = unpack(args.folder, args.into, args.data or multi30k_dir(), args.targets)
        except (OSError, ValueError) as error:
            raise SystemExit(f"jackknife_round unpack: {error}") from None
        print("\n".join(printed))


if __name__ == "__main__":
    main()
