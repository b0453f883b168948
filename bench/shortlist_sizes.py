"""What the shortlist's size does to its translations: candidates, same output as the full
vocabulary, BLEU, and speed, for shortlists of several sizes.

    python -m bench.shortlist_sizes --sizes 20:200 50:300 100:500

Each size PER_SOURCE:ALWAYS is built as `nmt shortlist --per-source PER_SOURCE --always
ALWAYS` builds it (from Multi30k's training corpus; 20:200 is the committed one) and put into
a copy of the bundle (its other files linked, bundle.json given the new checksum). Then
test_2016_flickr and test_2017_flickr are translated as `nmt eval` does (batches of 32 sorted
by length, the server's search settings), greedy and beam 4, fp32 and int8 on one thread,
with the full vocabulary and with each shortlist. Reported per shortlist: the median number
of candidates for one sentence and for a batch of 32, the share of sentences translated
exactly as with the full vocabulary (same engine precision), BLEU, and the time of all those
translations against the full vocabulary's (int8; the sizes take turns, one process).

Writes the "shortlist-sizes" section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import sacrebleu

from bench.harness import served_options
from bench.report import opening, replace_section
from export.data import read_lines
from export.shortlist import shortlist_from_corpus
from export.train_config import multi30k_dir
from nmt_contract import SHORTLIST_FILE, sha256_of
from service.runtime.bundle import load_bundle
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator

SPLITS = ("test_2016_flickr", "test_2017_flickr")
SEARCHES = (1, 4)  # beam sizes
BATCH = 32


def sized_bundle(bundle: Path, checkpoint: Path, per_source: int, always: int, out: Path) -> Path:
    """A copy of `bundle` (files linked) with a shortlist of this size."""
    out.mkdir(parents=True, exist_ok=True)
    for file in bundle.iterdir():
        if file.name not in (SHORTLIST_FILE, "bundle.json"):
            (out / file.name).symlink_to(file.resolve())
    shortlist = shortlist_from_corpus(
        checkpoint, multi30k_dir(), per_source=per_source, always=always
    )
    shortlist.save(out / SHORTLIST_FILE)
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["files"][SHORTLIST_FILE] = sha256_of(out / SHORTLIST_FILE)
    (out / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def translated(translator: Translator, sources: dict[str, list[str]]) -> tuple[dict, float]:
    """Every split and search translated: ({(split, beam): texts}, seconds in all), after a
    batch of each split translated once (not timed) to warm up the engine's memory."""
    texts, seconds = {}, 0.0
    warm_up = SearchOptions(beam_size=max(SEARCHES))
    translator.translate([line for lines in sources.values() for line in lines[:BATCH]], warm_up)
    for split, lines in sources.items():
        for beam in SEARCHES:
            started = time.perf_counter()
            found = translator.translate(lines, served_options(beam), BATCH)
            seconds += time.perf_counter() - started
            texts[(split, beam)] = [translation.text for translation in found]
    return texts, seconds


def candidates(translator: Translator, lines: list[str]) -> tuple[int, int]:
    """Median candidates of one sentence, and of a batch of BATCH length-sorted sentences, in
    the shortlist of a translator that has one."""
    shortlist = translator.engine.shortlist
    sources = sorted(translator.tokenizer.encode(lines), key=len)
    one = [len(shortlist.vocabulary_for(np.array(source))) for source in sources]
    batches = [
        len(shortlist.vocabulary_for(np.concatenate(sources[i : i + BATCH])))
        for i in range(0, len(sources), BATCH)
    ]
    return int(np.median(one)), int(np.median(batches))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundle", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    parser.add_argument("--sizes", nargs="+", default=["20:200", "50:300", "100:500"])
    parser.add_argument("--sentences", type=int, default=0, help="per split (0: all)")
    parser.add_argument("--out", type=Path, default=Path("docs/performance.md"))
    args = parser.parse_args()
    data = multi30k_dir()
    sources, references = {}, {}
    for split in SPLITS:
        count = args.sentences or None
        sources[split] = read_lines(data / f"{split}.fr")[:count]
        references[split] = read_lines(data / f"{split}.en")[:count]

    def bleu(texts: list[str], split: str) -> float:
        return sacrebleu.corpus_bleu(texts, [references[split]]).score

    rows = []
    with tempfile.TemporaryDirectory() as work:
        bundles = {}
        for size in args.sizes:
            per_source, always = (int(part) for part in size.split(":"))
            folder = Path(work) / size.replace(":", "-")
            bundles[size] = sized_bundle(args.bundle, args.checkpoint, per_source, always, folder)
        full = {}
        for int8 in (False, True):
            engine = Translator(
                load_bundle(args.bundle), EngineOptions(int8=int8, intra_op_threads=1)
            )
            full[int8] = translated(engine, sources)
        for size, bundle in bundles.items():
            cells = []
            for int8 in (False, True):
                options = EngineOptions(int8=int8, intra_op_threads=1, shortlist=True)
                translator = Translator(load_bundle(bundle), options)
                texts, seconds = translated(translator, sources)
                for split in SPLITS:
                    for beam in SEARCHES:
                        mine, theirs = texts[(split, beam)], full[int8][0][(split, beam)]
                        same = np.mean([a == b for a, b in zip(mine, theirs, strict=True)])
                        cells.append(f"{same:.1%} / {bleu(mine, split):.2f}")
                if int8:
                    speed = full[int8][1] / seconds
                    one, batch = candidates(translator, sources["test_2016_flickr"])
            print(size, one, batch, cells, f"{speed:.2f}x", flush=True)
            rows.append(f"| {size} | {one} / {batch} | {' | '.join(cells)} | {speed:.2f}x |")
    header = [
        f"{split[5:9]} {'greedy' if beam == 1 else f'beam {beam}'}"
        for split in SPLITS
        for beam in SEARCHES
    ]
    full_cells = [
        f"{bleu(full[int8][0][(split, beam)], split):.2f}"
        for int8 in (False, True)
        for split in SPLITS
        for beam in SEARCHES
    ]
    lines = opening(
        "The shortlist's size: same output, BLEU and speed",
        "bench.shortlist_sizes",
        "; ONNX Runtime, one thread",
    )[2:]  # (performance.md has its own heading for it)
    lines += [
        "- a size is PER_SOURCE:ALWAYS (`nmt shortlist --per-source --always`); candidates: "
        f"the median for one sentence / a length-sorted batch of {BATCH} (test_2016_flickr)",
        "- a cell: the share of sentences translated exactly as with the full vocabulary by the "
        "same engine precision / BLEU; speed: the time of all the int8 translations of the full "
        f"vocabulary over the shortlist's (batches of {BATCH})",
        "",
        "| size | candidates | "
        + " | ".join(f"fp32 {h}" for h in header)
        + " | "
        + " | ".join(f"int8 {h}" for h in header)
        + " | int8 speed |",
        "|---|---|" + "---|" * (2 * len(header)) + "---:|",
        "| full vocabulary | 8000 | "
        + " | ".join(f"100% / {cell}" for cell in full_cells)
        + " | 1.00x |",
        *rows,
    ]
    replace_section("shortlist-sizes", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()
