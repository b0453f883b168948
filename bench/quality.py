"""Translation quality of a checkpoint: BLEU and chrF on Multi30k's val and test sets.

    python -m bench.quality --checkpoint models/fr-en

Runs `nmt eval` (sacrebleu, default tokenizer, cased, detokenized) for greedy and beam 4 on
val, test_2016_flickr and test_2017_flickr, and writes docs/quality.md with one command per
number, so that each can be reproduced alone, and the table of README.md's "The committed
model" (between its quality-table markers; `--readme ''` leaves the README alone).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.report import replace_section
from export.train_config import multi30k_dir

SPLITS = ("val", "test_2016_flickr", "test_2017_flickr")


def evaluate(checkpoint: Path, data: Path, split: str, beam: int, source: str, target: str) -> dict:
    command = [
        "nmt", "eval", "--checkpoint", str(checkpoint), "--beam-size", str(beam),
        "--src", str(data / f"{split}.{source}"), "--ref", str(data / f"{split}.{target}"),
    ]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "nmt_cli", *command[1:]], check=True, capture_output=True, text=True
    )
    result = json.loads(run.stdout)
    result["command"] = " ".join(command).replace(str(data), "../shared/data/multi30k")
    return result


def readme_table(results: dict[tuple[str, int], dict]) -> str:
    """README's table: a row per split, greedy and beam 4 side by side."""
    lines = [
        "| split | greedy BLEU | beam 4 BLEU | greedy chrF | beam 4 chrF |",
        "|---|---|---|---|---|",
    ]
    for split in SPLITS:
        greedy, beam = results[split, 1], results[split, 4]
        lines.append(
            f"| {split} | {greedy['bleu']:.2f} | {beam['bleu']:.2f} "
            f"| {greedy['chrf']:.2f} | {beam['chrf']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("docs/quality.md"))
    parser.add_argument("--readme", default="README.md", help="'' = leave the README alone")
    args = parser.parse_args()
    data = args.data_dir or multi30k_dir()
    config = json.loads((args.checkpoint / "config.json").read_text())
    source, target = config["source_lang"], config["target_lang"]
    lines = [
        f"# Translation quality: {args.checkpoint} ({source}→{target})",
        "",
        "sacrebleu 2.x, default tokenizer (13a), cased, on detokenized output. "
        "Reproduce one number with the command in its row; all of them with "
        f"`python -m bench.quality --checkpoint {args.checkpoint}`.",
        "",
        "| split | search | BLEU | chrF | command |",
        "|---|---|---|---|---|",
    ]
    results = {}
    for split in SPLITS:
        for beam in (1, 4):
            r = results[split, beam] = evaluate(args.checkpoint, data, split, beam, source, target)
            search = "greedy" if beam == 1 else f"beam {beam}"
            lines.append(
                f"| {split} | {search} | {r['bleu']:.2f} | {r['chrf']:.2f} | `{r['command']}` |"
            )
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    if args.readme:
        replace_section("quality-table", readme_table(results), Path(args.readme))


if __name__ == "__main__":
    main()
