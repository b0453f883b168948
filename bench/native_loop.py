"""What the decoding loop out of Python would buy at batch 1: the product's greedy search
against the same steps driven by minimal Python loops and by a loop in C.

    python -m bench.native_loop [--bundle build/models/fr-en] [--sentences 200] [--rounds 5]

Every sentence of the first `--sentences` lines of test_2016_flickr is translated alone
(batch 1, greedy, int8, one thread), five ways, taking turns on every 20 sentences:

* the product: `Translator.translate_ids` with one sentence, as bench.compare's "ours int8"
  runs it (the running batch, its strategy and bookkeeping, the engine's step);
* the product's `Engine.step` in a minimal loop: the best token of each step fed back, no
  running batch or strategy (what the search's bookkeeping costs);
* a minimal Python loop over the same encoder output and IO binding: per step, write the
  token and its position into the bound arrays, run the session, read the best token (what
  the engine's step costs around the graph);
* the same loop in C (bench/native_loop.c, built here with the system's C compiler): per
  step, one call of the session's run_with_iobinding through the CPython API and nothing
  else, so that no interpreter or numpy code has to be read back into the core's caches after
  each graph run (bench.cache_refill, bench.time_split);
* CTranslate2 int8 on the same weights (bench.compare's conversion), one sentence a call.

Then a sentence's fixed cost: each sentence translated to its first token only (max
length 1: the encoder, one decoder step, and the running batch's join, binding and finish),
by the product and by CTranslate2 int8 (max_decoding_length 1), greedy and beam 4, taking
turns; the product's time split into its encoder's and decoder's session calls (timed from
outside, as bench.time_split does) and the rest. What the whole sentence loses beyond this is
the per-step part.

And beam 4, three ways: the product; a minimal beam search in Python over the same binding
(per step: rank the beams' K+1 best words by score, keep the K best that do not end, move
the caches of the beams that changed places, finish the hypotheses that end; the product's
stopping rule and length penalty 1); CTranslate2 int8 beam 4 (patience 2, as bench.compare's
"ctranslate2 int8"). What the product's beam search costs beyond the minimal one is what a
leaner design of its bookkeeping could win at batch 1.

The two loops start from the product's own engine: `Engine.start` encodes, the first
`Engine.step` binds and feeds the start token; from the second step on each loop drives the
binding itself. All four must write the same translation of every sentence (the product's
greedy search without the repetition guard, as bench.compare runs it). Reported: tokens per
second (</s> included) of each, from each stretch's median time over the rounds, and the
ratios. Writes the "native-loop" section of docs/performance.md (`--section`: another one,
e.g. one per CPU).
"""

from __future__ import annotations

import argparse
import functools
import importlib.machinery
import importlib.util
import statistics
import subprocess
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from bench.report import cpu_model, replace_section, reproduce
from bench.time_split import TimedSession
from export.data import read_lines
from export.train_config import multi30k_dir
from nmt_contract import length_limit
from service.runtime.bundle import load_bundle
from service.runtime.engine import Engine
from service.runtime.running_batch import pad_sources
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path(__file__).with_name("native_loop.c")
GREEDY = SearchOptions(beam_size=1)  # as bench.compare translates: no repetition guard
BEAM = SearchOptions(beam_size=4)


def build_extension(out_dir: Path) -> ModuleType:
    """bench/native_loop.c compiled into `out_dir` (again when the source is newer) and
    imported."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    library = out_dir / f"native_loop{suffix}"
    if not library.is_file() or library.stat().st_mtime < SOURCE.stat().st_mtime:
        out_dir.mkdir(parents=True, exist_ok=True)
        include = sysconfig.get_paths()["include"]
        command = ["cc", "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", str(library)]
        subprocess.run(command, check=True)
    loader = importlib.machinery.ExtensionFileLoader("native_loop", str(library))
    spec = importlib.util.spec_from_file_location("native_loop", library, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class FirstStep:
    """One sentence encoded and its first step taken by the product's engine: the binding the
    loops drive from the second step on, and what the first step chose."""

    def __init__(self, engine: Engine, source: list[int]) -> None:
        ids, mask = pad_sources([source], engine.pad_id)
        cache = engine.start(ids, mask)
        self.limit = length_limit(len(source), GREEDY.max_length, engine.max_positions)
        cache.reserve(1, self.limit)  # room for every position: the binding never changes
        start = np.array([engine.start_id], dtype=np.int64)
        result = engine.step(cache, start, top_k=1)
        self.token = int(result.top_ids[0, 0])
        self.io = cache.io
        self.run = functools.partial(engine.decoder.run_with_iobinding, cache.binding)


def engine_step_loop(engine: Engine, source: list[int]) -> list[int]:
    """Greedy search of one sentence by the product's Engine.step, each step's best token fed
    back: tokens without </s>."""
    ids, mask = pad_sources([source], engine.pad_id)
    cache = engine.start(ids, mask)
    limit = length_limit(len(source), GREEDY.max_length, engine.max_positions)
    eos, feed, tokens = engine.eos_id, np.array([engine.start_id], dtype=np.int64), []
    while len(tokens) < limit and (not tokens or tokens[-1] != eos):
        result = engine.step(cache, feed, top_k=1)
        feed = result.top_ids[:, 0]
        tokens.append(int(feed[0]))
    if engine.force_eos_at_limit and tokens[-1] != eos:
        tokens[-1] = eos
    return tokens[:-1] if tokens[-1] == eos else tokens


def python_loop(engine: Engine, source: list[int]) -> list[int]:
    """Greedy search of one sentence, the loop in Python: tokens without </s>."""
    first = FirstStep(engine, source)
    eos, limit, force = engine.eos_id, first.limit, engine.force_eos_at_limit
    target, positions = first.io["target_ids"], first.io["positions"]
    best_ids = first.io["top_ids"]
    token, tokens = first.token, [first.token]
    position = 1
    while token != eos and position < limit:
        target[0, 0], positions[0] = token, position
        first.run()
        token = eos if force and position + 1 >= limit else int(best_ids[0, 0])
        tokens.append(token)
        position += 1
    return tokens[:-1] if tokens[-1] == eos else tokens


def c_loop(native: ModuleType, engine: Engine, source: list[int]) -> list[int]:
    """Greedy search of one sentence, the loop in C: tokens without </s>."""
    first = FirstStep(engine, source)
    eos, io = engine.eos_id, first.io
    tokens = [first.token]
    if first.token != eos:
        rest, _ = native.greedy(
            first.run,
            io["target_ids"],
            io["positions"],
            io["top_ids"],
            io["top_log_probs"],
            first.token,
            1,
            first.limit,
            eos,
            engine.force_eos_at_limit,
        )
        tokens += rest
    return tokens[:-1] if tokens[-1] == eos else tokens


def beam_loop(engine: Engine, source: list[int], beams: int = 4) -> list[int]:
    """Beam search of one sentence, minimal (length penalty 1, n-best 1, the product's
    stopping rule: K hypotheses finished and no open beam, scored at its length, can beat
    the K-th best of them; at the limit every candidate ends): tokens without </s>."""
    ids, mask = pad_sources([source], engine.pad_id)
    cache = engine.start(ids, mask, beams)
    limit = length_limit(len(source), BEAM.max_length, engine.max_positions)
    cache.reserve(beams, limit)  # room for every position: the binding never changes
    feed = np.full(beams, engine.start_id, dtype=np.int64)
    engine.step(cache, feed, top_k=beams + 1)  # binds, and takes the first step
    io, eos, per_beam = cache.io, engine.eos_id, beams + 1
    target, positions = io["target_ids"], io["positions"]
    top_ids, top_log_probs = io["top_ids"], io["top_log_probs"]  # [K, K+1]
    run = functools.partial(engine.decoder.run_with_iobinding, cache.binding)
    scores = np.full(beams, -np.inf)
    scores[0] = 0.0  # the other beams start as copies that cannot be ranked
    sequences = np.zeros((beams, 0), dtype=np.int64)
    identity = np.arange(beams)
    finished: list[tuple[float, list[int]]] = []  # (score / length, tokens)
    kth_best, length = -np.inf, 1
    while True:
        candidates = (scores[:, None] + top_log_probs).ravel()  # [K * (K+1)]
        order = np.argsort(-candidates, kind="stable")[: 2 * beams]
        ranked, words, rows = candidates[order], top_ids.ravel()[order], order // per_beam
        ends = words[:beams] == eos
        if length >= limit:
            ends[:] = True
        if ends.any():
            for rank in np.flatnonzero(ends & (ranked[:beams] > -np.inf)):
                word = int(words[rank])
                tokens = sequences[rows[rank]].tolist() + ([] if word == eos else [word])
                finished.append((float(ranked[rank]) / length, tokens))
            if len(finished) >= beams:
                kth_best = sorted(score for score, _ in finished)[-beams]
            if length >= limit:
                break
            keep = np.flatnonzero(words != eos)[:beams]
        else:
            keep = slice(0, beams)
        rows, feed, scores = rows[keep], words[keep], ranked[keep]
        if len(finished) >= beams and scores.max() / length <= kth_best:
            break
        moved = np.flatnonzero(rows != identity)
        if len(moved):  # the beams' caches follow them (all beams are `length` long)
            for buffer in cache.past:
                buffer[moved, :, :length] = buffer[rows[moved], :, :length]
        sequences = np.concatenate([sequences[rows], feed[:, None]], axis=1)
        target[:, 0], positions[:] = feed, length
        run()
        length += 1
    return max(finished, key=lambda found: found[0])[1]


def ctranslate2_int8(checkpoint: Path) -> Callable[..., list[int]] | None:
    """CTranslate2 int8 on the same weights, one sentence a call: (source, limit, beam size)
    -> tokens (None without ctranslate2)."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return None
    from bench.compare.prepare import pieces_by_our_id, prepare
    from bench.compare.runners import CTranslate2Runner

    paths = prepare(checkpoint, ROOT / "build" / "compare" / checkpoint.name)
    job = {
        "paths": {"ct2": str(paths["ct2"])},
        "spec": {"compute_type": "int8"},
        "threads": 1,
        "maps": {"pieces": pieces_by_our_id(checkpoint)},
    }
    runner = CTranslate2Runner(job)
    return lambda source, limit, beam=1: runner.translate([source], beam, limit)[0]


def table_of(
    ways: dict[str, Callable[[list[int], int], list[int]]],
    sources: list[list[int]],
    limits: list[int],
    rounds: int,
    with_ct2: bool,
) -> str:
    """Every way translates every sentence (the loops over our engine must agree with the
    product exactly: they are the same search), then the ways take turns, `rounds` times
    (in_turns); the table of their tokens/s (</s> included)."""
    outputs = {
        name: [way(s, n) for s, n in zip(sources, limits, strict=True)]
        for name, way in ways.items()
    }
    reference = outputs["product (Python search loop)"]
    for name in ways:
        if name != "CTranslate2 int8" and outputs[name] != reference:
            raise RuntimeError(f"{name} translated differently from the product")
    agree = {
        name: sum(a == b for a, b in zip(out, reference, strict=True))
        for name, out in outputs.items()
    }
    tokens = {name: sum(len(t) + 1 for t in out) for name, out in outputs.items()}  # + </s>

    seconds = in_turns(
        {
            name: [functools.partial(way, s, n) for s, n in zip(sources, limits, strict=True)]
            for name, way in ways.items()
        },
        rounds,
    )
    speed = {name: tokens[name] / seconds[name].sum() for name in ways}
    product = speed["product (Python search loop)"]
    rows = [
        f"| {name} | {speed[name]:.0f} | {1e6 / speed[name]:.0f} | {speed[name] / product:.2f}x"
        + (f" | {speed[name] / speed['CTranslate2 int8']:.2f}x" if with_ct2 else "")
        + f" | {agree[name]} / {len(sources)} |"
        for name in ways
    ]
    against_ct2 = " | against CTranslate2 int8" if with_ct2 else ""
    header = [
        f"| way | tokens/s | µs a token | against the product{against_ct2} | "
        "same translation as the product |",
        "|---|---:|---:|---:|" + ("---:|" if with_ct2 else "") + "---:|",
    ]
    return "\n".join([*header, *rows])


TURN_SENTENCES = 20  # a way's turn: this many sentences in a row


def in_turns(calls: dict[str, list[Callable[[], object]]], rounds: int) -> dict[str, np.ndarray]:
    """Time each way's calls (one per sentence, the same count for every way) with the ways
    taking turns on each stretch of TURN_SENTENCES sentences, the first one rotating, `rounds`
    times: each stretch's median time over the rounds, [stretches] seconds per way.

    Why stretches: this machine's speed drifts within a minute, so whole passes taken in
    turns (a second or two each) spread by as much as the gaps being measured (the product
    against the Engine.step loop: 1.11x-1.41x, round by round, in one run of seven on an AMD
    EPYC); stretches of about 100 ms see the same machine. Not single sentences: a way's
    first call after another's turn finds its own memory out of the caches, and the ways that
    drive our engine share its weights, CTranslate2 does not (bench.compare's worker, the same
    choice). What still moves between runs is the machine itself: compare within a run."""
    names = list(calls)
    count = len(calls[names[0]])
    stretches = [
        range(start, min(start + TURN_SENTENCES, count))
        for start in range(0, count, TURN_SENTENCES)
    ]
    seconds = {name: np.zeros((rounds, len(stretches))) for name in names}
    for turn in range(rounds):
        started = time.perf_counter()
        for place, stretch in enumerate(stretches):
            first = (turn + place) % len(names)
            for name in names[first:] + names[:first]:
                began = time.perf_counter()
                for index in stretch:
                    calls[name][index]()
                seconds[name][turn, place] = time.perf_counter() - began
        print(f"round {turn + 1}: {time.perf_counter() - started:.1f} s", flush=True)
    return {name: np.median(times, axis=0) for name, times in seconds.items()}


FIRST_TOKEN = 1  # max_length: the first token only


def first_token_table(
    translator: Translator,
    ct2: Callable[..., list[int]] | None,
    sources: list[list[int]],
    rounds: int,
) -> str:
    """Each sentence translated alone to its first token, greedy and beam 4, by the product
    (its encoder's and decoder's session calls timed from outside) and CTranslate2 int8,
    taking turns `rounds` times (in_turns): µs a sentence."""
    engine = translator.engine
    spent = {"decoder": 0.0, "encoder": 0.0, "steps": 0}
    engine.encoder = TimedSession(engine.encoder, "encoder", spent)
    engine.decoder = TimedSession(engine.decoder, "decoder", spent)
    try:
        rows = [first_token_row(translator, ct2, sources, rounds, beam, spent) for beam in (1, 4)]
    finally:
        engine.encoder, engine.decoder = engine.encoder.session, engine.decoder.session
    header = "| search | product | its encoder | its decoder step | the rest"
    rule = "|---|---:|---:|---:|---:|"
    if ct2 is not None:
        header += " | CTranslate2 int8 | product / CTranslate2 (time) | same first token"
        rule += "---:|---:|---:|"
    return "\n".join([header + " |", rule, *rows])


def first_token_row(
    translator: Translator,
    ct2: Callable[..., list[int]] | None,
    sources: list[list[int]],
    rounds: int,
    beam: int,
    spent: dict[str, float],
) -> str:
    """One row of first_token_table; `spent`: what the engine's timed sessions add to."""
    options = SearchOptions(beam_size=beam, max_length=FIRST_TOKEN)
    # Per sentence: each timed call's time in the encoder's and the decoder's session calls,
    # and the first token each way wrote
    inside = {part: [[] for _ in sources] for part in ("encoder", "decoder")}
    firsts = {way: [[] for _ in sources] for way in ("product", "ct2")}

    def product(index: int) -> None:
        spent.update(decoder=0.0, encoder=0.0, steps=0)
        found = translator.translate_ids([sources[index]], options, 1)
        firsts["product"][index] = found[0][0].tokens
        for part, times in inside.items():
            times[index].append(spent[part])

    def ctranslate2(index: int) -> None:
        assert ct2 is not None
        firsts["ct2"][index] = ct2(sources[index], FIRST_TOKEN, beam)

    ways = {"product": product} if ct2 is None else {"product": product, "ct2": ctranslate2}
    for way in ways.values():  # warm-up
        for index in range(len(sources)):
            way(index)
    for times in inside.values():
        for each in times:
            each.clear()
    calls = {
        name: [functools.partial(way, index) for index in range(len(sources))]
        for name, way in ways.items()
    }
    seconds = in_turns(calls, rounds)
    mean = {name: 1e6 * float(times.sum()) / len(sources) for name, times in seconds.items()}
    part = {
        name: 1e6 * float(np.mean([statistics.median(each) for each in times]))
        for name, times in inside.items()
    }
    rest = mean["product"] - part["encoder"] - part["decoder"]
    row = (
        f"| {'greedy' if beam == 1 else f'beam {beam}'} | {mean['product']:.0f} | "
        f"{part['encoder']:.0f} | {part['decoder']:.0f} | {rest:.0f}"
    )
    if ct2 is not None:
        same = sum(a == b for a, b in zip(firsts["product"], firsts["ct2"], strict=True))
        ratio = mean["product"] / mean["ct2"]
        row += f" | {mean['ct2']:.0f} | {ratio:.2f}x | {same} / {len(sources)}"
    return row + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundle", type=Path, default=ROOT / "build/models/fr-en")
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "models/fr-en")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-ctranslate2", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/performance.md")
    parser.add_argument("--section", default="native-loop", help="the section of --out to write")
    args = parser.parse_args()

    native = build_extension(ROOT / "build" / "native_loop")
    options = EngineOptions(int8=True, intra_op_threads=1)
    translator = Translator(load_bundle(args.bundle), options)
    engine = translator.engine
    lines = read_lines(multi30k_dir() / "test_2016_flickr.fr")[: args.sentences]
    sources = translator.tokenizer.encode(lines)
    limits = [length_limit(len(s), GREEDY.max_length, engine.max_positions) for s in sources]

    ways: dict[str, Callable[[list[int], int], list[int]]] = {
        "product (Python search loop)": lambda source, limit: (
            translator.translate_ids([source], GREEDY, 1)[0][0].tokens
        ),
        "Engine.step, minimal loop": lambda source, limit: engine_step_loop(engine, source),
        "minimal Python loop": lambda source, limit: python_loop(engine, source),
        "loop in C": lambda source, limit: c_loop(native, engine, source),
    }
    ct2 = None if args.no_ctranslate2 else ctranslate2_int8(args.checkpoint)
    if ct2 is not None:
        ways["CTranslate2 int8"] = ct2

    greedy = table_of(ways, sources, limits, args.rounds, "CTranslate2 int8" in ways)
    beam_ways: dict[str, Callable[[list[int], int], list[int]]] = {
        "product (Python search loop)": lambda source, limit: (
            translator.translate_ids([source], BEAM, 1)[0][0].tokens
        ),
        "minimal Python beam search": lambda source, limit: beam_loop(engine, source, 4),
    }
    if ct2 is not None:
        beam_ways["CTranslate2 int8"] = lambda source, limit: ct2(source, limit, 4)
    beam = table_of(beam_ways, sources, limits, args.rounds, ct2 is not None)
    first_token = first_token_table(translator, ct2, sources, args.rounds)
    table = "\n".join(
        [
            f"Reproduce: `{reproduce('bench.native_loop')}` ({cpu_model()}; int8, one thread, "
            f"batch 1: each of the first {len(sources)} lines of test_2016_flickr alone; "
            f"the ways taking turns on every {TURN_SENTENCES} sentences, {args.rounds} rounds; "
            "each stretch's median time)",
            "",
            "Greedy:",
            "",
            greedy,
            "",
            "Beam 4:",
            "",
            beam,
            "",
            "The first token alone, µs a sentence (the encoder, one decoder step, and the "
            "running batch's join, binding and finish):",
            "",
            first_token,
        ]
    )
    print(table)
    replace_section(args.section, table, args.out)


if __name__ == "__main__":
    main()
