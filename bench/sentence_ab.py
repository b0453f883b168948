"""Two code trees' products side by side, one sentence at a time: what a change to the search
or the engine's Python buys at batch 1, to about 1%.

    git worktree add /tmp/before HEAD~1
    python -m bench.sentence_ab --before-tree /tmp/before [--after-tree .] \
        [--bundle build/models/fr-en] [--sentences 200] [--rounds 5] [--beams 1,4]

Each tree's product (`Translator.translate_ids`, int8 unless `--fp32`, one thread) runs in a
process of its own, importing that tree's code, and translates each of the first
`--sentences` lines of test_2016_flickr alone. The two processes take turns on every sentence
(which goes first alternating from round to round), and a sentence's time in each is its
fastest of `--rounds`: the machine's drifts (a fifth within a minute on this project's
machines) fall on both alike and a slow spell does not count. Reported per beam size: the
sum of the sentences' times in each tree, their ratio (after over before), and how many
sentences came out with the same tokens. bench.compare's turns of 20 sentences are too
coarse for this: its cells spread by about 10% from run to run.

A change to the exported graphs needs each tree's own bundle: `--before-bundle`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(tree: Path, bundle: Path, int8: bool, lines: Path, count: int) -> None:
    """A tree's product answering "SENTENCE BEAM" lines on stdin with "NANOSECONDS TOKENS"
    (tokens with </s>), after "ready". Imports the tree's code, not this checkout's."""
    import time

    sys.path.insert(0, str(tree))
    from service.runtime.bundle import load_bundle
    from service.runtime.search import SearchOptions
    from service.runtime.sessions import EngineOptions
    from service.runtime.translator import Translator

    translator = Translator(load_bundle(bundle), EngineOptions(int8=int8, intra_op_threads=1))
    texts = lines.read_text(encoding="utf-8").splitlines()[:count]
    sources = translator.tokenizer.encode(texts)
    options: dict[int, SearchOptions] = {}
    for line in sys.stdin:
        if line.startswith("warm"):
            beam = int(line.split()[1])
            options[beam] = SearchOptions(beam_size=beam)
            for source in sources[:20]:
                translator.translate_ids([source], options[beam], 1)
            print("ready", flush=True)
            continue
        index, beam = map(int, line.split())
        started = time.perf_counter_ns()
        found = translator.translate_ids([sources[index]], options[beam], 1)
        took = time.perf_counter_ns() - started
        print(took, " ".join(map(str, found[0][0].tokens)), flush=True)


class Contender:
    """One tree's worker process."""

    def __init__(self, tree: Path, bundle: Path, args: argparse.Namespace) -> None:
        command = [sys.executable, "-m", "bench.sentence_ab", "--worker", str(tree)]
        command += ["--bundle", str(bundle), "--sentences", str(args.sentences)]
        command += ["--lines", str(args.lines), *(["--fp32"] if args.fp32 else [])]
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, line: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"a worker stopped (exit status {self.process.wait()})")
        return answer.rstrip("\n")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def measure(contenders: list[Contender], beam: int, sentences: int, rounds: int) -> dict:
    """Each sentence's fastest time in each contender (ns), and their tokens."""
    for contender in contenders:
        if contender.ask(f"warm {beam}") != "ready":
            raise RuntimeError("a worker did not get ready")
    best = [[float("inf")] * sentences for _ in contenders]
    tokens: list[list[str]] = [[""] * sentences for _ in contenders]
    for round_ in range(rounds):
        order = list(range(len(contenders)))
        if round_ % 2:
            order.reverse()
        for index in range(sentences):
            for which in order:
                took, _, found = contenders[which].ask(f"{index} {beam}").partition(" ")
                best[which][index] = min(best[which][index], int(took))
                tokens[which][index] = found
    same = sum(a == b for a, b in zip(*tokens, strict=True))
    return {"sums": [sum(times) for times in best], "same": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sentence_ab", description=__doc__)
    parser.add_argument("--before-tree", type=Path, help="the checkout before the change")
    parser.add_argument("--after-tree", type=Path, default=ROOT)
    parser.add_argument("--bundle", type=Path, default=ROOT / "build" / "models" / "fr-en")
    parser.add_argument("--before-bundle", type=Path, help="the before tree's (default: --bundle)")
    parser.add_argument("--lines", type=Path, help="default: Multi30k's test_2016_flickr.fr")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beams", default="1,4", help="beam sizes, comma-separated")
    parser.add_argument("--fp32", action="store_true", help="the fp32 graphs (default: int8)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.bundle, not args.fp32, args.lines, args.sentences)
        return 0
    if args.before_tree is None:
        parser.error("--before-tree is required")
    # (Not at the top: a worker imports its own tree's code, nothing of this checkout's.)
    from bench.report import machine
    from export.train_config import multi30k_dir

    args.lines = args.lines or multi30k_dir() / "test_2016_flickr.fr"
    if not args.lines.is_file():
        where = "$NMT_DATA_DIR or ../shared/data/multi30k"
        parser.error(f"{args.lines} is missing (Multi30k: {where})")

    before_bundle = args.before_bundle or args.bundle
    contenders = [
        Contender(args.before_tree.resolve(), before_bundle.resolve(), args),
        Contender(args.after_tree.resolve(), args.bundle.resolve(), args),
    ]
    try:
        rows = []
        for beam in (int(b) for b in args.beams.split(",")):
            found = measure(contenders, beam, args.sentences, args.rounds)
            before, after = found["sums"]
            rows.append(
                f"| {'greedy' if beam == 1 else f'beam {beam}'} | {before / 1e6:.1f} "
                f"| {after / 1e6:.1f} | {after / before:.3f}x | "
                f"{found['same']} / {args.sentences} |"
            )
    finally:
        for contender in contenders:
            contender.close()
    print(
        f"{machine()}; {'fp32' if args.fp32 else 'int8'}, one thread; the first "
        f"{args.sentences} lines of {args.lines.name}, each alone, the trees taking turns on "
        f"every sentence; each sentence's fastest of {args.rounds} rounds\n"
        f"before: {args.before_tree} ({before_bundle}); after: {args.after_tree} "
        f"({args.bundle})\n"
    )
    print("| search | before (ms) | after (ms) | after / before | same tokens |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
