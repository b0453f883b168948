"""The speed report: tokens/s per engine and search, memory, and the targets of issue 39."""

from __future__ import annotations

from bench.compare.runners import REFERENCE, SEARCHES


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("onnxruntime", "ctranslate2", "transformers", "torch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found


def speed_rows(results: dict[str, dict]) -> list[dict]:
    """One row per engine: tokens/s and ratio to ours fp32 for every (beam, batch)."""
    reference = {(r["beam"], r["batch"]): r for r in results[REFERENCE]["runs"]}
    rows = []
    for name, result in results.items():
        cells = {}
        for run in result["runs"]:
            key = (run["beam"], run["batch"])
            tps = run["tokens"] / run["median"]
            base = reference[key]
            same = sum(a == b for a, b in zip(run["outputs"], base["outputs"], strict=True))
            cells[key] = {
                "tps": tps,
                "ratio": tps / (base["tokens"] / base["median"]),
                "same": same / len(run["outputs"]),
            }
        rows.append(
            {
                "name": name,
                "cells": cells,
                "peak_rss_mib": result["peak_rss_mib"],
                "rss_loaded_mib": result["rss_loaded_mib"],
                "load_seconds": result["load_seconds"],
            }
        )
    return rows


def columns(rows: list[dict]) -> list[tuple[int, int]]:
    """The searches that were run, in table order."""
    return [k for k in SEARCHES if k in rows[0]["cells"]]


def label(key: tuple[int, int]) -> str:
    beam, batch = key
    return f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {batch}"


# Issue 39: ours at least this many times the rival's tokens/s, in every cell.
TARGET = 1.2


def targets(rows: list[dict]) -> list[str]:
    """Issue 39's targets, for the engines that ran: ours int8 at least 1.2x CTranslate2 int8
    (both patience settings) in every cell, ours with the shortlist at least 1.2x CTranslate2
    with its vocabulary map; and what each engine's shortlist buys it, side by side."""
    by_name = {r["name"]: r["cells"] for r in rows}

    def ratios(mine: str, rival: str) -> dict[tuple[int, int], float] | None:
        if mine not in by_name or rival not in by_name:
            return None
        cells = by_name[mine]
        return {k: cells[k]["tps"] / by_name[rival][k]["tps"] for k in cells if k in by_name[rival]}

    def listed(found: dict[tuple[int, int], float]) -> str:
        return ", ".join(f"{label(k)} {r:.2f}x" for k, r in found.items())

    notes = []
    pairs = [
        ("ours int8", "ctranslate2 int8"),
        ("ours int8", "ctranslate2 int8 patience 1"),
        # Both with the same vocabulary shortlist (CTranslate2's vocabulary map).
        ("ours int8 shortlist", "ctranslate2 int8 vmap"),
    ]
    for mine, rival in pairs:
        found = ratios(mine, rival)
        if found is None:
            continue
        met = all(r >= TARGET for r in found.values())
        notes.append(
            f"- {mine} at least {TARGET}x {rival} in every cell: "
            f"**{'met' if met else 'not met'}** ({listed(found)})"
        )
    ours = ratios("ours int8 shortlist", "ours int8")
    theirs = ratios("ctranslate2 int8 vmap", "ctranslate2 int8")
    if ours is not None and theirs is not None:
        notes.append(
            f"- what the shortlist buys: ours int8 shortlist / ours int8: {listed(ours)}; "
            f"ctranslate2 int8 vmap / ctranslate2 int8: {listed(theirs)}"
        )
    return notes


def speed_markdown(rows: list[dict], setup: dict, command: str, svg_name: str) -> str:
    keys = columns(rows)
    versions = ", ".join(f"{k} {v}" for k, v in setup["versions"].items())
    lines = [
        "## Same weights: ours vs CTranslate2 vs transformers, "
        f"{setup['threads'] or 'all cores as'} thread(s) per engine",
        "",
        f"Reproduce: `{command}`",
        "",
        f"{setup['sentences']} lines of `{setup['data']}` (mean {setup['mean_source']:.1f} "
        f"source tokens), {setup['threads']} thread(s) for every engine, {setup['repeat']} "
        f"timed passes, {setup['cpu']}; {versions}. The engines take turns: each is loaded in "
        "its own process, and they translate each stretch of 20 sentences (one batch at batch "
        "32) one after the other, the first one rotating, so that the machine's drifts fall "
        "on all of them alike; a pass's time is the sum of its stretches' medians. Same "
        "weights: the checkpoint "
        f"`{setup['checkpoint']}` as our ONNX bundle, as a Hugging Face directory "
        "(`nmt export-hf`: Marian's, or M2M-100's for a pre-norm model) and as a CTranslate2 "
        "model (`ct2-transformers-converter` of the Marian directory, else "
        "`bench/compare/ct2_convert.py`). "
        "Sentences are sorted by length and cut into the same batches for every engine. "
        "Tokens/s = output tokens (</s> included) / decoding time (encoder included, "
        "tokenization not); in brackets, the ratio to ours fp32 with the KV cache.",
        "",
        "| engine | " + " | ".join(label(k) for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for row in rows:
        cells = [f"{row['cells'][k]['tps']:.0f} ({row['cells'][k]['ratio']:.2f}x)" for k in keys]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"![tokens per second by engine]({svg_name})",
        "",
        "Peak memory: each engine runs in its own process; peak RSS is that process's "
        "resident-set high-water mark (`VmHWM`) over loading and every configuration "
        "above (interpreter and libraries included: transformers brings torch). "
        "'Same output' is the share of sentences whose tokens equal ours fp32's in the same "
        "configuration (beam 4, batch 32): int8 engines differ by quantization; the others get "
        "one length limit per call (the largest of its batch), so sentences that reach their "
        "limit can differ (the parity section gives every sentence its own limit).",
        "",
        "| engine | peak RSS (MiB) | RSS after loading (MiB) | load (s) | same output |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        same = row["cells"].get((4, 32), {}).get("same")
        loaded = row["rss_loaded_mib"]
        lines.append(
            f"| {row['name']} | {row['peak_rss_mib']:.0f} | "
            f"{'?' if loaded is None else f'{loaded:.0f}'} | {row['load_seconds']:.1f} | "
            f"{'' if same is None else f'{same:.1%}'} |"
        )
    notes = targets(rows)
    if notes:
        lines += ["", "Targets (issue 39):", "", *notes]
    return "\n".join(lines)
