"""How well the sentence confidence ranks and predicts translation quality, what carries it,
and what it costs.

    python -m bench.confidence [--model-dir build/models/fr-en]

The bundle's confidence.json (fitted by `nmt calibrate` on Multi30k val, its lexicons on a
jackknife's labels) is judged on test_2017_flickr, which neither training nor calibration
saw, against sentence chrF:

* Spearman correlation of the calibrated sentence confidence and of the raw score (the mean
  token log-prob) with sentence chrF, greedy and beam (and on test_2016_flickr, also unseen);
* calibration: a reliability table and the expected calibration error against the label the
  file names (chrF >= its threshold);
* the share of the worst 10% of sentences (by chrF) among the lowest-confidence 20%;
* a feature ablation: the regression refitted on val without each group of features;
* doubtful words against words missing from the reference;
* the cost: tokens per second with and without confidence, side by side, medians.

Writes the `confidence` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import numpy as np

from bench.harness import served_options
from bench.report import opening, replace_section
from export import calibration as fit
from export.data import read_lines
from export.train_config import multi30k_dir
from service.runtime.bundle import load_bundle
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from service.serving.confidence import (
    LEXICON,
    SearchCalibration,
    load_calibration,
    scored_sentences,
)

# Feature groups left out one at a time in the ablation.
GROUPS = {
    "token log-probs (mean, min)": ("mean_log_prob", "min_log_prob"),
    "entropy (mean, max)": ("mean_entropy", "max_entropy"),
    "margin (mean, min)": ("mean_margin", "min_margin"),
    "length ratio": ("length_ratio",),
    "attention (coverage, spread, on </s>)": ("coverage", "attention_entropy", "eos_attention"),
    "beam agreement": ("agreement",),
    "lexicon (jackknifed)": (LEXICON,),
}


def judged(translator: Translator, split: str, beam_size: int) -> dict:
    data = multi30k_dir()
    sources = read_lines(data / f"{split}.fr")
    references = read_lines(data / f"{split}.en")
    scored = scored_sentences(translator, sources, served_options(beam_size))
    chrf = np.array(
        [fit.sentence_chrf(s.translation, r) for s, r in zip(scored, references, strict=True)]
    )
    return {"scored": scored, "chrf": chrf, "references": references}


def good_chrf(label: str) -> float:
    found = re.search(r"chrF >= ([0-9.]+)", label)
    if found is None:
        raise SystemExit(f"cannot read the chrF threshold from the label {label!r}")
    return float(found.group(1))


def lowest_share(scores: np.ndarray, chrf: np.ndarray) -> float:
    """The share of the worst 10% by chrF that are among the lowest-scored 20%."""
    worst = chrf <= np.quantile(chrf, 0.10)
    lowest = scores <= np.quantile(scores, 0.20)
    return float((worst & lowest).sum() / worst.sum())


def reliability(confidence: np.ndarray, good: np.ndarray) -> list[str]:
    rows = ["| confidence | sentences | mean confidence | share good |", "|---|---|---|---|"]
    edges = np.linspace(0, 1, 11)
    which = np.clip(np.digitize(confidence, edges[1:-1]), 0, 9)
    for b in range(10):
        inside = which == b
        if inside.any():
            rows.append(
                f"| {edges[b]:.1f}-{edges[b + 1]:.1f} | {inside.sum()} | "
                f"{confidence[inside].mean():.3f} | {good[inside].mean():.3f} |"
            )
    return rows


def tokens_per_second(
    translator: Translator, sentences: list[str], beam_size: int, repeats: int
) -> tuple[float, float]:
    """Median tokens/s without and with confidence (and what the server asks with it:
    alignment, every beam hypothesis, and the features), alternating, side by side; both
    from text to text."""
    plain = served_options(beam_size)
    tokenizer = translator.tokenizer
    runs: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(repeats):
        started = time.perf_counter()
        found = translator.translate_ids(tokenizer.encode(sentences, "fr"), plain, 32)
        [tokenizer.decode(h[0].tokens) for h in found]
        tokens = sum(len(h[0].tokens) + 1 for h in found)
        runs["without"].append(tokens / (time.perf_counter() - started))
        started = time.perf_counter()
        scored_sentences(translator, sentences, plain, 32)
        runs["with"].append(tokens / (time.perf_counter() - started))
    return statistics.median(runs["without"]), statistics.median(runs["with"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--repeats", type=int, default=5, help="timing repetitions")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads")
    args = parser.parse_args()
    calibration = load_calibration(args.model_dir)
    if calibration is None:
        raise SystemExit(f"{args.model_dir} has no confidence.json: run nmt calibrate first")
    threshold = good_chrf(calibration.label)
    translator = Translator(
        load_bundle(args.model_dir), EngineOptions(intra_op_threads=args.threads)
    )

    lines = opening(
        "Confidence: how well it ranks and predicts quality",
        "bench.confidence",
        f"; ONNX Runtime fp32, {args.threads} thread(s)",
    )
    lines += [
        f"- calibration: `{args.model_dir}/confidence.json` ({calibration.trained_on}; "
        f"`{calibration.command}`); label: {calibration.label}",
        "- judged on test_2017_flickr (1,000 sentences, seen by neither training nor "
        "calibration), against sentence chrF (sacrebleu); test_2016_flickr (1,000, as unseen) "
        "beside it",
        "",
        "| search | split | Spearman: raw score | Spearman: confidence | ECE | share good | "
        "worst 10% in lowest 20%: raw | ... : confidence |",
        "|---|---|---|---|---|---|---|---|",
    ]
    results = {}
    for search, beam_size in (("greedy", 1), ("beam", 4)):
        served = calibration.searches[search]
        for split in ("test_2017_flickr", "test_2016_flickr"):
            test = judged(translator, split, beam_size)
            confidence = np.array(
                [served.confidence(s.features, s.source_ids, s.output_ids) for s in test["scored"]],
                dtype=np.float64,
            )
            raw = np.array([s.features["mean_log_prob"] for s in test["scored"]])
            good = test["chrf"] >= threshold
            if split == "test_2017_flickr":
                val = judged(translator, "val", beam_size)
                results[search] = (test, val, confidence, good, served)
            spearman_raw = fit.spearman(raw, test["chrf"])
            spearman = fit.spearman(confidence, test["chrf"])
            lines.append(
                f"| {search}{'' if beam_size == 1 else f' {beam_size}'} | {split} "
                f"| {spearman_raw:.3f} | {spearman:.3f} (+{spearman - spearman_raw:.3f}) "
                f"| {fit.expected_calibration_error(confidence, good):.3f} | {good.mean():.3f} "
                f"| {lowest_share(raw, test['chrf']):.2f} "
                f"| {lowest_share(confidence, test['chrf']):.2f} |"
            )

    test, val, confidence, good, served = results["beam"]
    names = served.features
    lines += ["", "Reliability (beam 4, test_2017_flickr):", "", *reliability(confidence, good)]

    lines += [
        "",
        "Ablation (beam 4): the regression refitted on val without each group, judged on "
        "test_2017_flickr.",
        "",
        "| features | Spearman | ECE |",
        "|---|---|---|",
    ]

    def refit(kept: list[str]) -> tuple[float, float]:
        """The served calibration refitted on val with the features `kept` (its lexicon as
        it is, when kept), judged on test."""
        features = [served.row(s.features, s.source_ids, s.output_ids) for s in val["scored"]]
        fitted = fit.fit_search(
            fit.feature_matrix(features, kept),
            val["chrf"],
            threshold,
            kept,
            served.lexicon.model_dump() if LEXICON in kept else None,
        )
        chance = SearchCalibration(**vars(fitted))
        found = np.array(
            [chance.confidence(s.features, s.source_ids, s.output_ids) for s in test["scored"]]
        )
        return fit.spearman(found, test["chrf"]), fit.expected_calibration_error(found, good)

    spearman, ece = refit(names)
    lines.append(f"| all {len(names)} | {spearman:.3f} | {ece:.3f} |")
    for group, members in GROUPS.items():
        if not set(members) & set(names):
            continue
        spearman, ece = refit([n for n in names if n not in members])
        lines.append(f"| without {group} | {spearman:.3f} | {ece:.3f} |")
    spearman, ece = refit(["mean_log_prob"])
    lines.append(f"| the raw score alone | {spearman:.3f} | {ece:.3f} |")

    flagged, wrong = [], []
    for s, reference in zip(test["scored"], test["references"], strict=True):
        flagged += [bool(w.confidence < calibration.word_threshold) for w in s.words]
        wrong += fit.word_labels([w.word for w in s.words], reference)
    flagged_a, wrong_a = np.array(flagged), np.array(wrong)
    precision = (flagged_a & wrong_a).sum() / max(flagged_a.sum(), 1)
    recall = (flagged_a & wrong_a).sum() / max(wrong_a.sum(), 1)
    lines += [
        "",
        f"Words (beam 4, test_2017_flickr): doubtful below {calibration.word_threshold:g}; "
        f"{flagged_a.mean():.1%} of {len(flagged_a)} words flagged; of the flagged, "
        f"{precision:.1%} are not in the reference (of all words: {wrong_a.mean():.1%}); "
        f"{recall:.1%} of the words not in the reference are flagged.",
        "",
        "Cost: tokens per second without and with confidence (alignment, every beam "
        f"hypothesis and the features included), test_2017_flickr, batches of 32, median of "
        f"{args.repeats}, alternating:",
        "",
        "| search | without | with | with / without |",
        "|---|---|---|---|",
    ]
    sentences = read_lines(multi30k_dir() / "test_2017_flickr.fr")
    for search, beam_size in (("greedy", 1), ("beam 4", 4)):
        without, with_ = tokens_per_second(translator, sentences, beam_size, args.repeats)
        lines.append(f"| {search} | {without:.0f} | {with_:.0f} | {with_ / without:.2f} |")
    report = "\n".join(lines)
    print(report)
    replace_section("confidence", report)


if __name__ == "__main__":
    main()
